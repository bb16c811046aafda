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
    domain: String,
    depth: u32,
    #[serde(default)]
    shards: Option<usize>,
    expect: Expect,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    trials: Option<u64>,
    #[serde(default)]
    oracles: serde_json::Map<String, Value>,
    #[serde(default)]
    findings: Vec<serde_json::Map<String, Value>>,
}

pub fn trials() -> Vec<Trial> {
    super::data_files(&super::root().join("tests/data/audits"), "json")
        .into_iter()
        .map(|(name, path)| {
            Trial::test(format!("audit::{name}"), move || {
                super::outcome(check(&path))
            })
        })
        .collect()
}

fn run(case: &AuditCase, shard: Shard) -> Result<Report, String> {
    let domain = Domain::preset(&case.domain).ok_or(format!("no preset {}", case.domain))?;
    let a = TargetSpec::new(&case.target, &case.inject).factory()?;
    let b = case
        .vs
        .as_ref()
        .map(|v| TargetSpec::new(v, &case.inject_b).factory())
        .transpose()?;
    let cfg = ExhaustiveConfig {
        domain,
        depth: case.depth,
        shard,
        threads: 2,
        batch: 1024,
        oracles: kvaudit::oracles::Registry::builtin(),
    };
    run_exhaustive(&cfg, a.as_ref(), b.as_deref(), &mut |_| {}).map_err(|e| e.to_string())
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
    if let Some(m) = case.shards {
        let parts = (0..m)
            .map(|k| run(&case, Shard::new(k, m).unwrap()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut merged = merge(parts)?;
        let mut whole = report.clone();
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
    if let Some(t) = case.expect.trials {
        if report.trials != t {
            return Err(format!("trials: {} expected {t}", report.trials));
        }
    }
    for (oracle, want) in &case.expect.oracles {
        let got = &json["oracles"][oracle];
        if !contains(got, want) {
            return Err(format!(
                "oracle {oracle}: got {got}, expected {want}\n{}",
                report.to_terminal()
            ));
        }
    }
    for want in &case.expect.findings {
        let want_ops = want.get("ops").cloned();
        let found = report.findings.iter().any(|f| {
            let fj = serde_json::json!({
                "oracle": f.oracle, "ops": f.trace.ops, "setup": f.trace.setup.ops, "seq": f.seq,
                "observed": f.observed, "expected": f.expected, "kind": f.kind,
            });
            want_ops.as_ref().is_none_or(|o| &fj["ops"] == o)
                && contains(&fj, &Value::Object(want.clone()))
        });
        if !found {
            return Err(format!(
                "no finding matches {}\n{}",
                Value::Object(want.clone()),
                report.to_terminal()
            ));
        }
    }
    Ok(())
}
