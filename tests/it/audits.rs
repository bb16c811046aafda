//! Audit cases: run an exhaustive audit in-process and compare its report with the case's
//! expectations (only the fields a case names are compared).

use libtest_mimic::Trial;
use serde::Deserialize;
use serde_json::Value;

use kvaudit::base::domain::Domain;
use kvaudit::engines::explore::{run_exhaustive, ExhaustiveConfig};
use kvaudit::records::report::{merge, Report, Shard};
use kvaudit::targets::registry::TargetSpec;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuditCase {
    #[allow(dead_code)]
    about: String,
    target: String,
    #[serde(default)]
    inject: Vec<String>,
    vs: Option<String>,
    #[serde(default)]
    inject_b: Vec<String>,
    /// The second target is the first one under this configuration (`--vs-config`).
    #[serde(default)]
    vs_config: Option<String>,
    domain: String,
    /// Fields of the preset to override, as in a domain file.
    #[serde(default)]
    overrides: Option<Value>,
    depth: u32,
    #[serde(default)]
    shards: Option<usize>,
    /// Only these oracles (as `--oracles`), observing what they read: an oracle whose
    /// observation is costly is asked only when named.
    #[serde(default)]
    oracles: Option<Vec<String>>,
    /// `states`: the state-space search (`--strategy states`) instead of the enumeration.
    #[serde(default)]
    strategy: Option<String>,
    /// For `states`: which parts of the state the key covers (`complete`, the default, or
    /// `without_index`, the unsound key that shows completeness matters).
    #[serde(default)]
    key: Option<String>,
    expect: Expect,
    /// Run the audit this many times more: each report must equal the first apart from its
    /// timings (trials independent of each other whatever the target does to its heap).
    #[serde(default)]
    repeats: usize,
    /// What the same audit without any injected fault must report: a positive control fails
    /// with its fault and passes without.
    #[serde(default)]
    clean: Option<Expect>,
    /// For a control whose fault is a pin's own bug (a memory class native does not model): the
    /// build without it, which the `clean` run audits instead of `target`.
    #[serde(default)]
    clean_target: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    trials: Option<u64>,
    #[serde(default)]
    oracles: serde_json::Map<String, Value>,
    #[serde(default)]
    findings: Vec<serde_json::Map<String, Value>>,
    /// Findings that must not be reported (as `findings`, matched the same way).
    #[serde(default)]
    absent: Vec<serde_json::Map<String, Value>>,
    /// For `states`: the report's `state_space` fields.
    #[serde(default)]
    state_space: Option<Value>,
    /// The op kinds the report lists as left out (a target declares it lacks them), by name,
    /// in order: compared whole.
    #[serde(default)]
    left_out: Option<Vec<String>>,
}

pub fn trials() -> Vec<Trial> {
    let root = super::root().join("tests/data");
    ["audits", "oracles"]
        .into_iter()
        .flat_map(|dir| {
            super::data_files(&root.join(dir), "json")
                .into_iter()
                .map(move |(name, path)| {
                    Trial::test(format!("{dir}::{name}"), move || {
                        super::outcome(check(&path))
                    })
                })
        })
        .collect()
}

fn run(case: &AuditCase, shard: Shard) -> Result<Report, String> {
    let mut domain = Domain::preset(&case.domain).ok_or(format!("no preset {}", case.domain))?;
    if let Some(o) = &case.overrides {
        let o: kvaudit::base::domain::DomainOverrides =
            serde_json::from_value(o.clone()).map_err(|e| format!("overrides: {e}"))?;
        o.apply(&mut domain);
        domain.validate().map_err(|e| e.to_string())?;
    }
    let mut oracles = kvaudit::oracles::Registry::for_run(case.vs_config.is_some());
    if let Some(names) = &case.oracles {
        for n in names {
            oracles.find(n).ok_or(format!("unknown oracle {n}"))?;
        }
        oracles = oracles.only(|o| names.iter().any(|n| o.id().name() == n));
    }
    let observe = kvaudit::base::cache::Observe::ALL.union(oracles.observe());
    let spec = |name: &str, faults: &[String]| TargetSpec::new(name, faults).with_observe(observe);
    let a = spec(&case.target, &case.inject).factory()?;
    let b = match (&case.vs, &case.vs_config) {
        (Some(v), _) => Some(spec(v, &case.inject_b).factory()?),
        (None, Some(_)) => Some(spec(&case.target, &case.inject_b).factory()?),
        (None, None) => None,
    };
    let b = match (b, &case.vs_config) {
        (Some(f), Some(config)) => {
            let config = config.clone();
            let wrapped: Box<kvaudit::running::runner::RunnerFactory<'static>> =
                Box::new(move || {
                    let r = kvaudit::running::runner::Reconfigured::new(f()?, &config)?;
                    Ok(Box::new(r) as Box<dyn kvaudit::running::runner::TrialRunner>)
                });
            Some(wrapped)
        }
        (b, _) => b,
    };
    if let Some(strategy) = &case.strategy {
        return run_states(case, strategy, domain, oracles, observe);
    }
    let cfg = ExhaustiveConfig {
        domain,
        depth: case.depth,
        shard,
        threads: 2,
        batch: 1024,
        oracles,
    };
    run_exhaustive(&cfg, a.as_ref(), b.as_deref(), &mut |_| {}).map_err(|e| e.to_string())
}

/// A state-space search (`strategy: "states"`) of one target.
fn run_states(
    case: &AuditCase,
    strategy: &str,
    domain: Domain,
    oracles: kvaudit::oracles::Registry,
    observe: kvaudit::base::cache::Observe,
) -> Result<Report, String> {
    use kvaudit::engines::state_space::{run_states, StatesConfig};
    use kvaudit::running::state_runner::KeyScope;
    if strategy != "states" {
        return Err(format!("unknown strategy {strategy}"));
    }
    let scope = match case.key.as_deref() {
        None | Some("complete") => KeyScope::Complete,
        Some("without_index") => KeyScope::WithoutIndex,
        Some(other) => return Err(format!("unknown key {other}")),
    };
    // The logits probe cannot be keyed: a state search asks the oracles that do without it.
    let oracles = oracles.only(|o| !o.observes().logits);
    let observe = kvaudit::base::cache::Observe {
        logits: false,
        ..observe
    };
    let factory = TargetSpec::new(&case.target, &case.inject)
        .with_observe(observe)
        .state_factory(scope)?;
    let cfg = StatesConfig {
        domain,
        depth: case.depth,
        threads: 2,
        oracles,
    };
    run_states(&cfg, factory.as_ref(), &mut |_| {}).map_err(|e| e.to_string())
}

/// `actual` contains every field of `want`, recursively (arrays compared whole).
fn contains(actual: &Value, want: &Value) -> bool {
    match (actual, want) {
        (Value::Object(a), Value::Object(w)) => w.iter().all(|(k, wv)| {
            a.get(k).is_some_and(|av| contains(av, wv)) || (wv.is_null() && a.get(k).is_none())
        }),
        _ => actual == want,
    }
}

fn check(path: &std::path::Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let case: AuditCase =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let report = run(&case, Shard::WHOLE)?;
    expect(&case, &case.expect, &report)?;
    for k in 0..case.repeats {
        let again = run(&case, Shard::WHOLE)?;
        let (mut a, mut b) = (report.clone(), again);
        a.timing = Default::default();
        b.timing = Default::default();
        if a != b {
            let counts = |r: &Report| {
                r.oracles
                    .iter()
                    .map(|(id, s)| format!("{}: {}", id.name(), s.violations))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(format!(
                "run {} differs from the first apart from timings:
first: {}
then:  {}",
                k + 2,
                counts(&a),
                counts(&b)
            ));
        }
    }
    if let Some(clean) = &case.clean {
        let without = AuditCase {
            inject: Vec::new(),
            inject_b: Vec::new(),
            clean: None,
            clean_target: None,
            repeats: 0,
            shards: None,
            strategy: case.strategy.clone(),
            key: case.key.clone(),
            oracles: case.oracles.clone(),
            expect: Expect {
                trials: None,
                oracles: Default::default(),
                findings: Vec::new(),
                absent: Vec::new(),
                state_space: None,
                left_out: None,
            },
            about: String::new(),
            target: case
                .clean_target
                .clone()
                .unwrap_or_else(|| case.target.clone()),
            vs: case.vs.clone(),
            vs_config: case.vs_config.clone(),
            domain: case.domain.clone(),
            overrides: case.overrides.clone(),
            depth: case.depth,
        };
        let report = run(&without, Shard::WHOLE)?;
        expect(&without, clean, &report).map_err(|e| format!("without the fault: {e}"))?;
    }
    Ok(())
}

fn expect(case: &AuditCase, want: &Expect, report: &Report) -> Result<(), String> {
    if let Some(m) = case.shards {
        let parts = (0..m)
            .map(|k| run(&case, Shard::new(k, m).unwrap()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut merged = merge(parts)?;
        let mut whole = (*report).clone();
        merged.timing = Default::default();
        whole.timing = Default::default();
        if merged != whole {
            return Err(format!(
                "merged shards differ from the unsharded run:\nmerged: {}\nwhole: {}",
                merged.to_json(),
                whole.to_json()
            ));
        }
    }
    let json = serde_json::to_value(&report).map_err(|e| e.to_string())?;
    if let Some(t) = want.trials {
        if report.trials != t {
            return Err(format!("trials: {} expected {t}", report.trials));
        }
    }
    if let Some(w) = &want.left_out {
        let got: Vec<&str> = report.left_out.iter().map(|l| l.op.as_str()).collect();
        if got != *w {
            return Err(format!("left out: {got:?}, expected {w:?}"));
        }
    }
    if let Some(w) = &want.state_space {
        if !contains(&json["state_space"], w) {
            return Err(format!(
                "state_space: got {}, expected {w}",
                json["state_space"]
            ));
        }
    }
    for (oracle, w) in &want.oracles {
        let got = &json["oracles"][oracle];
        if !contains(got, w) {
            return Err(format!(
                "oracle {oracle}: got {got}, expected {w}\n{}",
                report.to_terminal()
            ));
        }
    }
    let reported = |want: &serde_json::Map<String, Value>| {
        let want_ops = want.get("ops").cloned();
        report.findings.iter().any(|f| {
            let fj = serde_json::json!({
                "oracle": f.oracle, "ops": f.trace.ops, "setup": f.trace.setup.ops, "seq": f.seq,
                "observed": f.observed, "expected": f.expected, "kind": f.kind,
            });
            want_ops.as_ref().is_none_or(|o| &fj["ops"] == o)
                && contains(&fj, &Value::Object(want.clone()))
        })
    };
    for not in &want.absent {
        if reported(not) {
            return Err(format!(
                "a finding matches {}, which must be absent\n{}",
                Value::Object(not.clone()),
                report.to_terminal()
            ));
        }
    }
    for want in &want.findings {
        if !reported(want) {
            return Err(format!(
                "no finding matches {}\n{}",
                Value::Object(want.clone()),
                report.to_terminal()
            ));
        }
    }
    Ok(())
}
