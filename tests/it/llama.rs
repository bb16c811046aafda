//! llama.cpp cases (`tests/data/llama/*.json`): crash isolation, `+assert` aborts, honest fast
//! resets and generated C reproducers, on real builds of the pins. A pin that is not built yet
//! is built by the test (minutes); a pin that cannot be built fails the test, saying why.

use std::process::Command;

use libtest_mimic::Trial;
use serde::Deserialize;
use serde_json::Value;

use kvaudit::base::domain::Domain;
use kvaudit::base::op::{Op, Setup, Trace};
use kvaudit::running::runner::{TrialEnd, TrialRunner};
use kvaudit::targets::llama::target::ResetMode;
use kvaudit::targets::llama::worker::WorkerRunner;
use kvaudit::targets::registry::llama_worker_spec;

#[derive(Deserialize)]
#[serde(tag = "check", rename_all = "snake_case", deny_unknown_fields)]
enum Case {
    Batch {
        #[allow(dead_code)]
        about: String,
        target: String,
        setup: Setup,
        traces: Vec<BatchTrace>,
    },
    ResetEquivalence {
        #[allow(dead_code)]
        about: String,
        target: String,
        domain: String,
        depth: u32,
        /// Compare the logits probe after each trace's last op too (what a reset that restores
        /// the cells but not what the memory derives from them would change).
        #[serde(default)]
        logits: bool,
        /// The setup the domain's ops run from, instead of the preset's.
        #[serde(default)]
        setup: Option<kvaudit::base::op::Setup>,
    },
    ReproC {
        #[allow(dead_code)]
        about: String,
        finding: Value,
        reproduces: std::collections::BTreeMap<String, bool>,
    },
    /// The C reproducer of a corpus file, checked with `kvaudit repro --check` on each release
    /// pin the file names, reproducing where the file expects the finding (`fails`) and not
    /// where it expects `holds`; `stdout`: lines the program prints on every pin.
    ReproCCorpus {
        #[allow(dead_code)]
        about: String,
        corpus: String,
        #[serde(default)]
        stdout: Vec<String>,
    },
    /// A C reproducer checked by an oracle named here (the state oracles' C checks are keyed by
    /// oracle: see `Oracle::c_check`), compiled against each pin and run.
    ReproCNamed {
        #[allow(dead_code)]
        about: String,
        oracle: String,
        finding: Value,
        reproduces: std::collections::BTreeMap<String, bool>,
    },
    /// Every setting of a setup, each not at its default, reaches the context (read back through
    /// llama.h where it can tell, else through the shim), the C reproducer and the bug report.
    Settings {
        #[allow(dead_code)]
        about: String,
        target: String,
        setup: Setup,
        /// Each setting's value in the context, in the shim's encoding (the architecture: the
        /// model's `general.architecture`).
        applied: std::collections::BTreeMap<String, Value>,
        /// Lines the C program must hold.
        c: Vec<String>,
        /// Lines the bug report must hold.
        report: Vec<String>,
        /// Settings this pin cannot take at another value than their default with any model
        /// kvaudit writes, each with why (a non-default value there is an unsupported setup,
        /// checked by its own case): they must still be read back at their default.
        #[serde(default)]
        at_default: std::collections::BTreeMap<String, String>,
    },
    Hang {
        #[allow(dead_code)]
        about: String,
        target: String,
        setup: Setup,
        ops: Vec<Op>,
        copies: usize,
        /// A trace run before and after the hangs (none of its prefixes may hang: answered
        /// without running, they would prove nothing).
        control: Vec<Op>,
    },
    /// The positive control of a sanitizer variant: with the shim's test hook (`env`,
    /// `KVAUDIT_TEST_SHIM_OVERFLOW`: each decode writes one byte past an 8-byte heap block),
    /// the trace crashes on `target` at `step` with a kind that starts with `kind` (the
    /// sanitizer's class and site), then a trace without a decode completes in the same runner
    /// (the worker lives on); on `release` the same trace completes (glibc's block has room).
    SanitizerControl {
        #[allow(dead_code)]
        about: String,
        target: String,
        release: String,
        env: std::collections::BTreeMap<String, String>,
        setup: Setup,
        ops: Vec<Op>,
        step: usize,
        kind: String,
        control: Vec<Op>,
    },
    /// `KVAUDIT_TRACE_STARTUP`: `kvaudit audit ARGS` with it set writes each of `phases`
    /// (docs/usage.md) to the trace file, every line `PID MICROSECONDS PHASE`.
    StartupTrace {
        #[allow(dead_code)]
        about: String,
        args: Vec<String>,
        phases: Vec<String>,
    },
    /// The worker hook `crash_observing` makes every such observation die of SIGSEGV: an
    /// exhaustive audit with it against one without, and one trace judged step by step.
    ObservationCrash {
        #[allow(dead_code)]
        about: String,
        target: String,
        /// The observation that crashes (`whole`, `round-trip`, `before`).
        crash_observing: String,
        domain: String,
        /// Fields of the preset to override, as in a domain file (an audit case's `overrides`):
        /// what leaves out the preset's own crashes, so that the hook's are the only ones.
        #[serde(default)]
        overrides: Option<Value>,
        depth: u32,
        /// A trace judged by `judge_run` (every step observed) under the hook.
        trace: Vec<Op>,
    },
    /// A `+cov` build: each trace's run carries the points its ops reached, every point is a
    /// coverage point of the build's shared object, mapped to a line of the files named (and of
    /// no file named in `files_never`), the same points each time the trace runs again; a trace
    /// without ops reaches none (resets and observations are recorded apart). The points
    /// outside the ops: the worker's first trial carries the context's construction and setup
    /// (lines of each file of `outside_first`, of which `outside_lines` given as
    /// `FILE:LINE`), and a batch that runs the same traces again reaches nothing new outside
    /// them.
    Coverage {
        #[allow(dead_code)]
        about: String,
        target: String,
        setup: Setup,
        traces: Vec<CoverageTrace>,
        outside_first: Vec<String>,
        outside_lines: Vec<String>,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CoverageTrace {
    ops: Vec<Op>,
    /// Files with a reached line (empty: the trace reaches no point at all).
    files: Vec<String>,
    /// Files with no reached line.
    #[serde(default)]
    files_never: Vec<String>,
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchTrace {
    ops: Vec<Op>,
    expect: Value,
    /// The trace this many times in a row in the batch, each with the same expectation.
    #[serde(default = "one")]
    repeat: usize,
}

fn one() -> usize {
    1
}

pub fn trials() -> Vec<Trial> {
    super::data_files(&super::root().join("tests/data/llama"), "json")
        .into_iter()
        .map(|(name, path)| {
            Trial::test(format!("llama::{name}"), move || {
                super::outcome(check(&path))
            })
        })
        .collect()
}

fn check(path: &std::path::Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let case: Case = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    match case {
        Case::Batch {
            target,
            setup,
            traces,
            ..
        } => check_batch(&target, setup, traces),
        Case::Coverage {
            target,
            setup,
            traces,
            outside_first,
            outside_lines,
            ..
        } => check_coverage(&target, setup, traces, (&outside_first, &outside_lines)),
        Case::ResetEquivalence {
            target,
            domain,
            depth,
            logits,
            setup,
            ..
        } => check_resets(&target, &domain, depth, logits, setup),
        Case::ReproC {
            finding,
            reproduces,
            ..
        } => {
            // A folder of its own: the repro_c cases run in parallel, and a folder per process
            // would let one case's finding overwrite another's before `kvaudit repro` reads it.
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let file = dir.path().join("finding.json");
            std::fs::write(&file, finding.to_string()).map_err(|e| e.to_string())?;
            check_repro_c(&file, &reproduces, &[])
        }
        Case::ReproCCorpus { corpus, stdout, .. } => {
            let file = super::root().join(&corpus);
            let repro = kvaudit::outputs::repro::Repro::load(&file).map_err(|e| e.to_string())?;
            let reproduces: std::collections::BTreeMap<String, bool> = repro
                .targets
                .iter()
                .filter(|t| {
                    t.target.starts_with("llama.cpp@")
                        && !t.target.ends_with("+assert")
                        && t.vs.is_none()
                })
                .map(|t| {
                    (
                        t.target.clone(),
                        t.expect == kvaudit::outputs::repro::Expect::Fails,
                    )
                })
                .collect();
            if reproduces.is_empty() {
                return Err(format!("{corpus} names no llama.cpp release pin"));
            }
            check_repro_c(&file, &reproduces, &stdout)
        }
        Case::ReproCNamed {
            oracle,
            finding,
            reproduces,
            ..
        } => check_repro_c_named(&oracle, finding, &reproduces),
        Case::Hang {
            target,
            setup,
            ops,
            copies,
            control,
            ..
        } => check_hang(&target, setup, ops, copies, control),
        Case::StartupTrace { args, phases, .. } => check_startup_trace(&args, &phases),
        Case::ObservationCrash {
            target,
            crash_observing,
            domain,
            overrides,
            depth,
            trace,
            ..
        } => check_observation_crash(
            &target,
            &crash_observing,
            (&domain, overrides.as_ref()),
            depth,
            trace,
        ),
        Case::SanitizerControl {
            about: _,
            target,
            release,
            env,
            setup,
            ops,
            step,
            kind,
            control,
        } => check_sanitizer_control(&target, &release, &env, setup, ops, step, &kind, control),
        Case::Settings {
            target,
            setup,
            applied,
            c,
            report,
            at_default,
            ..
        } => check_settings(&target, &setup, &applied, &c, &report, &at_default),
    }
}

/// The settings case: the setup must leave no setting at its default (so that a setting that
/// does not arrive shows), `applied` must name every key, and each key's value is read back from
/// a context the llama.cpp target made for the setup, from the C program and from the bug report.
fn check_settings(
    target: &str,
    setup: &Setup,
    applied: &std::collections::BTreeMap<String, Value>,
    c_lines: &[String],
    report_lines: &[String],
    at_default: &std::collections::BTreeMap<String, String>,
) -> Result<(), String> {
    use kvaudit::base::cache::CacheUnderTest;
    use kvaudit::base::setting::Key;
    use kvaudit::outputs::bug_report::bug_report;
    use kvaudit::outputs::c_repro::{emit_c, parse_input};
    use kvaudit::outputs::repro::Repro;
    use kvaudit::targets::llama::ffi::LlamaShim;
    use kvaudit::targets::llama::target::LlamaTarget;
    let mut failures = Vec::new();
    let changed: Vec<Key> = setup.non_default_settings().iter().map(|s| s.key).collect();
    for key in Key::ALL {
        if key.configurable() && !changed.contains(&key) && !at_default.contains_key(key.name()) {
            failures.push(format!(
                "{key}: the setup leaves it at its default, or it is not in the setup's settings"
            ));
        }
        if !applied.contains_key(key.name()) {
            failures.push(format!("{key}: not in \"applied\""));
        }
    }
    // The context, made as an audit makes it.
    let spec = llama_worker_spec(target, None)?;
    let shim = LlamaShim::load(&spec.shim).map_err(|e| format!("{e:#}"))?;
    let mut t = LlamaTarget::new(
        shim,
        &spec.model,
        &spec.label,
        spec.format,
        ResetMode::Rebuild,
    );
    t.reset(setup)
        .map_err(|e| format!("{target}: reset: {e}"))?;
    let ctx = t.context().ok_or("no context after a reset")?;
    for (name, want) in applied {
        let got = if name == Key::Arch.name() {
            Value::from(ctx.model_arch().map_err(|e| format!("{e:#}"))?)
        } else {
            let key = Key::ALL
                .into_iter()
                .find(|k| k.name() == name)
                .ok_or(format!("\"applied\" names {name}, which is no setting"))?;
            match ctx
                .setting_value(key.name())
                .map_err(|e| format!("{e:#}"))?
            {
                Some(v) => Value::from(v),
                None => Value::Null,
            }
        };
        if got != *want {
            failures.push(format!(
                "{target}: {name} is {got} in the context, the setup asked for {want}"
            ));
        }
    }
    // The C program and the bug report of a finding on this setup.
    let finding = serde_json::json!({
        "repro": "every setting not at its default",
        "postmortem": "",
        "since": "2026-12-01",
        "oracle": "I1",
        "kind": "pos_max disagree with the cells",
        "trace": { "setup": setup, "ops": [{ "op": "decode", "seq": 0, "n": 1 }] },
        "step": 1,
        "observed": {},
        "expected": {},
        "targets": [{ "target": target, "expect": "holds" }]
    });
    let program = emit_c(&parse_input(&finding.to_string()).map_err(|e| e.to_string())?);
    for line in c_lines {
        if !program.contains(line.as_str()) {
            failures.push(format!("the C program lacks {line:?}"));
        }
    }
    let repro = Repro::parse(&finding.to_string()).map_err(|e| e.to_string())?;
    let report = bug_report(&repro, &program, None);
    for line in report_lines {
        if !report.contains(line.as_str()) {
            failures.push(format!("the bug report lacks {line:?}"));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

/// An observation crash is its own class and takes no other oracle's judgement with it: with
/// the hook, every trial is a crash finding of the kind `observation crash (WHAT): SIGSEGV` at
/// its last step; the oracles that read the crashing observation judge no trial ("not judged");
/// every other oracle judges exactly the trials, and finds exactly the violations, that it does
/// without the hook. Through `judge_run`, a trace observed at every step gives the same.
fn check_observation_crash(
    target: &str,
    crash_observing: &str,
    (domain, overrides): (&str, Option<&Value>),
    depth: u32,
    trace: Vec<Op>,
) -> Result<(), String> {
    use kvaudit::base::cache::Observation;
    use kvaudit::engines::explore::{run_exhaustive, ExhaustiveConfig};
    use kvaudit::oracles::{OracleId, Registry};
    use kvaudit::records::report::Shard;
    use kvaudit::running::judge::Judge;
    let what = Observation::from_name(crash_observing)
        .ok_or(format!("no observation {crash_observing}"))?;
    let mut d = Domain::preset(domain).ok_or(format!("no preset {domain}"))?;
    if let Some(o) = overrides {
        let o: kvaudit::base::domain::DomainOverrides =
            serde_json::from_value(o.clone()).map_err(|e| format!("overrides: {e}"))?;
        o.apply(&mut d);
        d.validate().map_err(|e| e.to_string())?;
    }
    let oracles = Registry::for_run(false);
    let spec = llama_worker_spec(target, None)?;
    let hooked = kvaudit::targets::llama::worker::WorkerSpec {
        crash_observing: Some(what),
        ..spec.clone()
    };
    let audit = |spec: kvaudit::targets::llama::worker::WorkerSpec| {
        let factory =
            move || -> Result<Box<dyn TrialRunner>, kvaudit::base::cache::HarnessError> {
                Ok(Box::new(WorkerRunner::new(spec.clone())?))
            };
        let cfg = ExhaustiveConfig {
            domain: d.clone(),
            depth,
            shard: Shard::WHOLE,
            threads: 1,
            batch: 1024,
            oracles: oracles.clone(),
        };
        run_exhaustive(&cfg, &factory, None, &mut |_| {}).map_err(|e| e.to_string())
    };
    let plain = audit(spec)?;
    let crashed = audit(hooked.clone())?;
    let needs = |id: OracleId| {
        let o = oracles.get(id).expect("registered").observes();
        // Reads it: leaving the observation out changes what the oracle is given.
        o.without(what) != Some(o)
    };
    let crash = OracleId::CRASH;
    let mut lost = 0;
    for (id, without) in &plain.oracles {
        let with = crashed
            .oracles
            .get(id)
            .ok_or(format!("{id} missing under the hook"))?;
        if *id == crash {
            if without.violations != 0 || with.violations != crashed.trials {
                return Err(format!(
                    "crash: {} violations without the hook, {} of {} trials with it",
                    without.violations, with.violations, crashed.trials
                ));
            }
        } else if needs(*id) {
            if without.checked == 0 || with.checked != 0 {
                return Err(format!(
                    "{id} reads the crashing observation: judged {} trials without the hook, {} with it",
                    without.checked, with.checked
                ));
            }
            lost += 1;
        } else if (with.checked, with.violations) != (without.checked, without.violations) {
            return Err(format!(
                "{id}: judged {} with {} violations without the hook, {} with {} with it",
                without.checked, without.violations, with.checked, with.violations
            ));
        }
    }
    if lost == 0 {
        return Err(format!(
            "no oracle reads {crash_observing}: the case proves nothing"
        ));
    }
    let prefix = format!("observation crash ({}): SIGSEGV", what.describe());
    let crash_findings: Vec<_> = crashed
        .findings
        .iter()
        .filter(|f| f.oracle == crash)
        .collect();
    if crash_findings.is_empty() || crash_findings.iter().any(|f| f.kind != prefix) {
        let kinds: Vec<&str> = crash_findings.iter().map(|f| f.kind.as_str()).collect();
        return Err(format!(
            "crash findings {kinds:?}, expected each {prefix:?}"
        ));
    }
    // Every step observed: the crash is at step 1, and the oracles that do not read the
    // observation judge every step.
    let runner = WorkerRunner::new(hooked).map_err(|e| e.to_string())?;
    let mut judge = Judge::from_runners(Box::new(runner), None).with_oracles(oracles.clone());
    let trace = Trace {
        setup: d.setup.clone(),
        ops: trace,
    };
    let j = judge.run(&trace).map_err(|e| e.to_string())?;
    let first = j.first(crash).ok_or("judge_run: no crash violation")?;
    if first.step != 1 || first.violation.kind != prefix || j.steps != trace.ops.len() {
        return Err(format!(
            "judge_run: crash at step {} ({}), {} of {} steps judged",
            first.step,
            first.violation.kind,
            j.steps,
            trace.ops.len()
        ));
    }
    for o in oracles
        .iter()
        .filter(|o| o.reads() == kvaudit::oracles::Reads::Step)
    {
        let unjudged = j.unjudged.contains(&o.id());
        if needs(o.id()) != unjudged && plain.oracles.get(&o.id()).is_some_and(|s| s.checked > 0) {
            return Err(format!(
                "judge_run: {} is {}judged",
                o.id(),
                if unjudged { "not " } else { "" }
            ));
        }
    }
    Ok(())
}

/// A trial past the hang timeout is a crash finding, and the fork server survives it: the
/// timeout is made zero for one batch, so that the parent gives up on trials that are running.
#[allow(clippy::too_many_arguments)]
fn check_sanitizer_control(
    target: &str,
    release: &str,
    env: &std::collections::BTreeMap<String, String>,
    setup: Setup,
    ops: Vec<Op>,
    step: usize,
    kind: &str,
    control: Vec<Op>,
) -> Result<(), String> {
    use kvaudit::oracles::crash::crash_kind;
    let runner = |label: &str| -> Result<WorkerRunner, String> {
        let mut spec = llama_worker_spec(label, None)?;
        spec.env
            .extend(env.iter().map(|(k, v)| (k.clone(), v.clone())));
        WorkerRunner::new(spec).map_err(|e| e.to_string())
    };
    let trace = Trace {
        setup: setup.clone(),
        ops,
    };
    let control = Trace {
        setup,
        ops: control,
    };
    let mut sanitized = runner(target)?;
    let runs = sanitized
        .run_batch_last(&[trace.clone(), control])
        .map_err(|e| e.to_string())?;
    match &runs[0].end {
        TrialEnd::Crashed { step: s, message } if *s == step && crash_kind(message).starts_with(kind) => {}
        other => return Err(format!("{target}: expected a crash at step {step} of kind {kind}..., the trace ended {other:?}")),
    }
    if !matches!(runs[1].end, TrialEnd::Completed) {
        return Err(format!(
            "{target}: the control trace ended {:?}",
            runs[1].end
        ));
    }
    let runs = runner(release)?
        .run_batch_last(std::slice::from_ref(&trace))
        .map_err(|e| e.to_string())?;
    match &runs[0].end {
        TrialEnd::Completed => Ok(()),
        other => Err(format!(
            "{release}: the hooked trace ended {other:?}, expected it to complete"
        )),
    }
}

fn check_hang(
    target: &str,
    setup: Setup,
    ops: Vec<Op>,
    copies: usize,
    control: Vec<Op>,
) -> Result<(), String> {
    let spec = llama_worker_spec(target, None)?;
    let normal = spec.timeout;
    let mut runner = WorkerRunner::new(spec).map_err(|e| e.to_string())?;
    let control = Trace {
        setup: setup.clone(),
        ops: control,
    };
    let trace = Trace { setup, ops };
    if control.ops.first() == trace.ops.first() {
        return Err("the control trace must start with another op than the hanging one".into());
    }
    let completes = |runner: &mut WorkerRunner, when: &str| -> Result<(), String> {
        let runs = runner
            .run_batch_last(std::slice::from_ref(&control))
            .map_err(|e| e.to_string())?;
        match &runs[0].end {
            TrialEnd::Completed => Ok(()),
            other => Err(format!("{when}: the trace ended {other:?}")),
        }
    };
    completes(&mut runner, "before")?;
    runner.set_timeout(std::time::Duration::ZERO);
    let runs = runner
        .run_batch_last(&vec![trace.clone(); copies])
        .map_err(|e| e.to_string())?;
    // A trial stopped while it was observing is an observation crash of the hang (the run is
    // completed without that observation, or ends crashed when the retry hangs too).
    let hang = |r: &kvaudit::running::runner::TrialRun| {
        r.crash()
            .is_some_and(|(_, message, _)| message.starts_with("hang: "))
    };
    let hangs = runs.iter().filter(|r| hang(r)).count();
    if let Some(odd) = runs
        .iter()
        .find(|r| !hang(r) && !matches!(&r.end, TrialEnd::Completed))
    {
        return Err(format!(
            "a trace ended {:?}, neither completed nor a hang",
            odd.end
        ));
    }
    if hangs == 0 || runner.deaths == 0 {
        return Err(format!(
            "a zero timeout gave {hangs} hangs and {} deaths in {copies} traces",
            runner.deaths
        ));
    }
    runner.set_timeout(normal);
    completes(&mut runner, "after the hangs")?;
    if runner.starts != 1 {
        return Err(format!(
            "the worker was started {} times: a hang took the fork server down",
            runner.starts
        ));
    }
    Ok(())
}

fn check_coverage(
    target: &str,
    setup: Setup,
    traces: Vec<CoverageTrace>,
    (outside_first, outside_lines): (&[String], &[String]),
) -> Result<(), String> {
    use kvaudit::outputs::coverage::lines_reached;
    use kvaudit::targets::llama::build::cov::CodeMap;
    use kvaudit::targets::llama::build::{ensure_built, BuildSpec};
    use kvaudit::targets::llama::pins::Pin;
    let pin = Pin::parse(target).map_err(|e| e.to_string())?;
    let built = ensure_built(&BuildSpec::new(pin), false).map_err(|e| e.to_string())?;
    let map = CodeMap::of_build(&built).map_err(|e| e.to_string())?;
    let spec = llama_worker_spec(target, None)?;
    let mut runner = WorkerRunner::new(spec).map_err(|e| e.to_string())?;
    let batch: Vec<Trace> = traces
        .iter()
        .map(|t| Trace {
            setup: setup.clone(),
            ops: t.ops.clone(),
        })
        .collect();
    // Three times, the last two compared: a trace's points are the same from its second run on.
    // Not from its first: a decode of a new batch shape builds and reserves a graph that later
    // decodes of the shape reuse (`llama_context::process_ubatch`, graph reuse), 1,345 points
    // then 1,262 for the decode below.
    let thrice: Vec<Trace> = batch.iter().chain(&batch).chain(&batch).cloned().collect();
    let runs = runner.run_batch(&thrice).map_err(|e| e.to_string())?;
    let (first, again) = runs[batch.len()..].split_at(batch.len());
    let outside: std::collections::BTreeSet<u32> = runs[0]
        .code
        .iter()
        .flat_map(|c| c.outside.iter().copied())
        .collect();
    let outside_files = lines_reached(&map, &outside).map_err(|e| format!("outside: {e}"))?;
    for f in outside_first {
        if outside_files.get(f).is_none_or(|l| l.reached.is_empty()) {
            return Err(format!(
                "the first trial's points outside the ops ({}) reach no line of {f}",
                outside.len()
            ));
        }
    }
    for at in outside_lines {
        let (f, line) = at.rsplit_once(':').ok_or(format!("{at}: not FILE:LINE"))?;
        let line: u32 = line.parse().map_err(|_| format!("{at}: not FILE:LINE"))?;
        if !outside_files
            .get(f)
            .is_some_and(|l| l.reached.contains(&line))
        {
            return Err(format!(
                "{at} is not among the first trial's points outside the ops"
            ));
        }
    }
    let new_again: usize = again
        .iter()
        .flat_map(|r| &r.code)
        .map(|c| c.outside.len())
        .sum();
    if new_again != 0 {
        return Err(format!(
            "the same traces run a third time reached {new_again} new points outside the ops"
        ));
    }
    for (i, (t, (run, run2))) in traces.iter().zip(first.iter().zip(again)).enumerate() {
        let code = run
            .code
            .as_ref()
            .ok_or(format!("trace {i}: no points in its run"))?;
        let pcs: std::collections::BTreeSet<u32> = code.pcs.iter().copied().collect();
        let pcs2: std::collections::BTreeSet<u32> = run2
            .code
            .iter()
            .flat_map(|c| c.pcs.iter().copied())
            .collect();
        if pcs != pcs2 {
            return Err(format!(
                "trace {i}: {} points, then {} on its second run",
                pcs.len(),
                pcs2.len()
            ));
        }
        let files = lines_reached(&map, &pcs).map_err(|e| format!("trace {i}: {e}"))?;
        let reached: Vec<&String> = files
            .iter()
            .filter(|(_, l)| !l.reached.is_empty())
            .map(|(f, _)| f)
            .collect();
        if t.files.is_empty() && !pcs.is_empty() {
            return Err(format!(
                "trace {i}: expected no points, got {} in {reached:?}",
                pcs.len()
            ));
        }
        for f in &t.files {
            if !reached.contains(&f) {
                return Err(format!(
                    "trace {i}: no line of {f} reached; reached {reached:?}"
                ));
            }
        }
        for f in &t.files_never {
            if reached.contains(&f) {
                return Err(format!("trace {i}: a line of {f} reached"));
            }
        }
    }
    Ok(())
}

fn check_batch(target: &str, setup: Setup, traces: Vec<BatchTrace>) -> Result<(), String> {
    let traces: Vec<BatchTrace> = traces
        .into_iter()
        .flat_map(|t| {
            let n = t.repeat;
            std::iter::repeat_n(t, n)
        })
        .collect();
    let spec = llama_worker_spec(target, None)?;
    let mut runner = WorkerRunner::new(spec).map_err(|e| e.to_string())?;
    let batch: Vec<Trace> = traces
        .iter()
        .map(|t| Trace {
            setup: setup.clone(),
            ops: t.ops.clone(),
        })
        .collect();
    let runs = runner.run_batch(&batch).map_err(|e| e.to_string())?;
    for (i, (t, run)) in traces.iter().zip(&runs).enumerate() {
        let e = &t.expect;
        match (e["end"].as_str(), &run.end) {
            (Some("crashed"), TrialEnd::Crashed { step, message }) => {
                if e["step"].as_u64() != Some(*step as u64) {
                    return Err(format!(
                        "trace {i}: crashed at step {step}, expected {}",
                        e["step"]
                    ));
                }
                let want = e["message_contains"].as_str().unwrap_or("");
                if !message.contains(want) {
                    return Err(format!(
                        "trace {i}: crash message {message:?} lacks {want:?}"
                    ));
                }
            }
            (Some("unsupported"), TrialEnd::Unsupported { step, reason }) => {
                if e["step"].as_u64() != Some(*step as u64) {
                    return Err(format!(
                        "trace {i}: unsupported at step {step}, expected {}",
                        e["step"]
                    ));
                }
                let want = e["reason_contains"].as_str().unwrap_or("");
                if !reason.contains(want) {
                    return Err(format!("trace {i}: reason {reason:?} lacks {want:?}"));
                }
            }
            (Some("completed"), TrialEnd::Completed) => {
                let last = run.steps.last().ok_or(format!("trace {i}: no steps"))?;
                if !e["outcome"].is_null() {
                    let got = serde_json::to_value(&last.outcome).map_err(|e| e.to_string())?;
                    if got != e["outcome"] {
                        return Err(format!(
                            "trace {i}: last outcome {got}, expected {}",
                            e["outcome"]
                        ));
                    }
                }
                if let Some(want) = e["round_trip_loaded"].as_bool() {
                    let rt = last
                        .round_trip
                        .as_ref()
                        .ok_or(format!("trace {i}: no round trip observed"))?;
                    let got = rt.whole_loaded && rt.seqs.iter().all(|s| s.loaded);
                    if got != want {
                        return Err(format!("trace {i}: round trip loaded {got}: {rt:?}"));
                    }
                }
                let want = &e["last"];
                let seq = want["seq"].as_i64().unwrap_or(0) as i32;
                let got = last
                    .seqs
                    .iter()
                    .find(|s| s.seq == seq)
                    .ok_or(format!("trace {i}: seq {seq} not observed"))?;
                let mut got = serde_json::json!({ "seq": seq, "pos_min": got.pos_min, "pos_max": got.pos_max, "cells": got.cells, "second_cells": got.second_cells, "third_cells": got.third_cells });
                for part in ["second_cells", "third_cells"] {
                    if want.get(part).is_none() && got[part].is_null() {
                        got.as_object_mut().expect("an object").remove(part);
                    }
                }
                if &got != want {
                    return Err(format!("trace {i}: observed {got}, expected {want}"));
                }
            }
            (want, got) => return Err(format!("trace {i}: ended {got:?}, expected {want:?}")),
        }
    }
    if runner.deaths == 0
        && runs
            .iter()
            .any(|r| matches!(r.end, TrialEnd::Crashed { .. }))
    {
        return Err("a crash was not seen as the death of a worker process".into());
    }
    Ok(())
}

fn check_resets(
    target: &str,
    domain: &str,
    depth: u32,
    logits: bool,
    setup: Option<kvaudit::base::op::Setup>,
) -> Result<(), String> {
    let mut d = Domain::preset(domain).ok_or(format!("no preset {domain}"))?;
    if let Some(setup) = setup {
        d.setup = setup;
    }
    let ops = d.ops();
    let mut traces: Vec<Trace> = ops
        .iter()
        .map(|o| Trace {
            setup: d.setup.clone(),
            ops: vec![o.clone()],
        })
        .collect();
    for _ in 1..depth {
        traces = traces
            .iter()
            .flat_map(|t| {
                ops.iter().map(move |o| {
                    let mut t = t.clone();
                    t.ops.push(o.clone());
                    t
                })
            })
            .collect();
    }
    let mut spec = llama_worker_spec(target, None)?;
    spec.observe.logits |= logits;
    let mut slow_spec = spec.clone();
    slow_spec.reset = ResetMode::Rebuild;
    let fast = WorkerRunner::new(spec)
        .map_err(|e| e.to_string())?
        .run_batch(&traces)
        .map_err(|e| e.to_string())?;
    let slow = WorkerRunner::new(slow_spec)
        .map_err(|e| e.to_string())?
        .run_batch(&traces)
        .map_err(|e| e.to_string())?;
    for (i, (f, s)) in fast.iter().zip(&slow).enumerate() {
        if f != s {
            return Err(format!(
                "trace {:?}: restore reset observed {f:?}, rebuild reset {s:?}",
                traces[i].ops
            ));
        }
    }
    if fast.len() != traces.len() {
        return Err(format!("{} runs for {} traces", fast.len(), traces.len()));
    }
    Ok(())
}

fn check_repro_c_named(
    oracle: &str,
    mut finding: Value,
    reproduces: &std::collections::BTreeMap<String, bool>,
) -> Result<(), String> {
    use kvaudit::oracles::OracleId;
    use kvaudit::outputs::c_repro::{emit_c, parse_input};
    use kvaudit::targets::llama::build::{ensure_built, BuildSpec};
    use kvaudit::targets::llama::pins::Pin;
    let id = match oracle {
        "round-trip" | "conservation" | "contract" => {
            OracleId::known(oracle).ok_or("a built-in oracle")?
        }
        other => return Err(format!("no named C check {other}")),
    };
    // Parsed as an I1 finding (the named oracles may have no id on this branch), then renamed.
    finding["oracle"] = Value::from("I1");
    let mut input = parse_input(&finding.to_string()).map_err(|e| e.to_string())?;
    input.oracle = id;
    let model = kvaudit::model::tiny::try_audit_model_path().map_err(|e| format!("{e:#}"))?;
    let program = emit_c(&input);
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let src = dir.path().join("repro.c");
    std::fs::write(&src, &program).map_err(|e| e.to_string())?;
    for (target, want) in reproduces {
        let pin = Pin::parse(target).map_err(|e| format!("{e:#}"))?;
        let built = ensure_built(&BuildSpec::new(pin), true).map_err(|e| format!("{e:#}"))?;
        let bin = dir.path().join("repro");
        built
            .compile_c_program(&src, &bin)
            .map_err(|e| format!("{target}: compiling: {e:#}"))?;
        let out = Command::new(&bin)
            .arg(&model)
            .env("GGML_NO_BACKTRACE", "1")
            .output()
            .map_err(|e| e.to_string())?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let got = match out.status.code() {
            Some(1) => true,
            Some(0) => false,
            other => {
                return Err(format!(
                    "{target}: the reproducer exited {other:?}: {}\n{stdout}",
                    String::from_utf8_lossy(&out.stderr)
                ))
            }
        };
        if got != *want {
            return Err(format!(
                "{target}: reproduces = {got}, expected {want}\n{stdout}"
            ));
        }
    }
    Ok(())
}

fn check_startup_trace(args: &[String], phases: &[String]) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let trace = dir.path().join("startup.txt");
    let out = Command::new(env!("CARGO_BIN_EXE_kvaudit"))
        .arg("audit")
        .args(args)
        .arg("--out")
        .arg(dir.path().join("report.json"))
        .env("KVAUDIT_TRACE_STARTUP", &trace)
        .output()
        .map_err(|e| e.to_string())?;
    if !matches!(out.status.code(), Some(0 | 1)) {
        return Err(format!(
            "kvaudit audit exited {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = std::fs::read_to_string(&trace).map_err(|e| format!("no trace: {e}"))?;
    let mut seen = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ' ');
        let (pid, micros, phase) = (parts.next(), parts.next(), parts.next());
        match (
            pid.map(str::parse::<u32>),
            micros.map(str::parse::<u64>),
            phase,
        ) {
            (Some(Ok(_)), Some(Ok(_)), Some(phase)) => seen.push(phase.to_string()),
            _ => return Err(format!("not a trace line: {line:?}")),
        }
    }
    let missing: Vec<&String> = phases.iter().filter(|p| !seen.contains(p)).collect();
    if !missing.is_empty() {
        return Err(format!(
            "phases missing from the trace: {missing:?}\n{text}"
        ));
    }
    Ok(())
}

fn check_repro_c(
    file: &std::path::Path,
    reproduces: &std::collections::BTreeMap<String, bool>,
    stdout_lines: &[String],
) -> Result<(), String> {
    for (target, want) in reproduces {
        let out = Command::new(env!("CARGO_BIN_EXE_kvaudit"))
            .args(["repro", "--check", "--target", target])
            .arg(&file)
            .output()
            .map_err(|e| e.to_string())?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let got = match out.status.code() {
            Some(1) => true,
            Some(0) => false,
            other => {
                return Err(format!(
                    "{target}: kvaudit repro --check exited {other:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                ))
            }
        };
        if got != *want {
            return Err(format!(
                "{target}: reproduces = {got}, expected {want}\n{stdout}"
            ));
        }
        let line = format!(
            "reproduces outside kvaudit on {target}: {}",
            if got { "yes" } else { "no" }
        );
        if !stdout.contains(&line) {
            return Err(format!("{target}: output lacks {line:?}\n{stdout}"));
        }
        for line in stdout_lines {
            if !stdout.contains(line.as_str()) {
                return Err(format!("{target}: output lacks {line:?}\n{stdout}"));
            }
        }
    }
    Ok(())
}
