//! Root-cause grouping: gathers the evidence that decides which findings are the same bug
//! ([`crate::records::group::Cause`]) by running each finding's trace on the native model, and
//! groups a report's findings by it.
//!
//! For a finding of an observation oracle (or of the differential oracle against a native
//! target), the trace runs on the native model without faults and with each known fault alone
//! (native-kv `Faults::NAMES`), judged by the finding's oracle (a differential finding keeps its
//! reference, the native side, and replaces the target under audit). The native run *reproduces*
//! the finding if the oracle's first violation has the same step, kind, sequence, observed and
//! expected values: the model then did exactly what the target did. Reproduced without faults:
//! the behaviour is the design as modelled, and the trace shrunk on the model (canonicalised)
//! tells such findings apart. Reproduced only with faults: those faults are the cause. A crash is
//! grouped by its site. Anything else by its trace, shrunk where its target runs in process,
//! canonicalised.

use native_kv::Faults;

use crate::oracles::{OracleId, Reads, Registry};
use crate::records::finding::Finding;
use crate::records::group::{build_groups, canonical_trace, crash_site, Cause, FindingGroup};
use crate::records::report::Report;
use crate::running::judge::{Judge, RunJudgement};
use crate::targets::registry::{TargetKind, TargetSpec};

use super::shrink::{shrink, FailureMode, ShrinkConfig};

/// Most target executions the shrink of one finding may spend while grouping.
const SHRINK_EXECUTIONS: u64 = 2_000;

/// A native target named by a report label (`native`, `native[refcount]`); `None` for any
/// other target (llama.cpp, another configuration).
fn native_spec(label: &str) -> Option<TargetSpec> {
    let (name, rest) = label.split_once('[').unwrap_or((label, ""));
    match TargetKind::parse(name) {
        Ok(TargetKind::Native) => {}
        Ok(
            TargetKind::NativeTensors | TargetKind::Llama | TargetKind::PythonRef | TargetKind::Mlx,
        )
        | Err(_) => return None,
    }
    let faults: Vec<String> = rest
        .split('[')
        .map(|f| f.trim_end_matches(']').to_string())
        .filter(|f| !f.is_empty())
        .collect();
    Some(TargetSpec::new(name, &faults))
}

/// A judge of `oracle` alone on the native model with `faults`, against `vs` for a pair oracle.
fn native_judge(faults: &[String], vs: Option<&TargetSpec>, oracle: OracleId) -> Option<Judge> {
    let registry = Registry::builtin().only(|o| o.id() == oracle);
    registry.get(oracle)?;
    let a = TargetSpec::new("native", faults).factory().ok()?;
    let b = match vs {
        Some(spec) => Some(spec.factory().ok()?),
        None => None,
    };
    let judge = Judge::new(a.as_ref(), b.as_deref()).ok()?;
    Some(judge.with_oracles(registry))
}

/// True if `j` shows `f`'s violation exactly.
fn reproduces(j: &RunJudgement, f: &Finding) -> bool {
    j.first(f.oracle).is_some_and(|v| {
        v.step == f.step
            && v.violation.kind == f.kind
            && v.violation.seq == f.seq
            && v.violation.observed == f.observed
            && v.violation.expected == f.expected
    })
}

/// The trace of `f` shrunk by `judge` (its own if the shrink fails), canonicalised.
fn minimal_shape(f: &Finding, judge: Option<&mut Judge>) -> String {
    let mode = FailureMode {
        oracle: f.oracle,
        kind: f.kind.clone(),
    };
    let cfg = ShrinkConfig {
        tree_iters: 0,
        max_executions: SHRINK_EXECUTIONS,
    };
    let shrunk = judge
        .and_then(|j| shrink(&f.trace, &mode, j, &cfg).ok().flatten())
        .map(|s| s.trace);
    canonical_trace(shrunk.as_ref().unwrap_or(&f.trace))
}

/// The evidence of what caused `f` (see the module docs).
pub fn cause_of(f: &Finding) -> Cause {
    if f.oracle == OracleId::CRASH {
        return Cause::CrashSite {
            site: crash_site(&f.observed),
        };
    }
    let (label_a, label_b) = match f.target.split_once(" vs ") {
        Some((a, b)) => (a, Some(b)),
        None => (f.target.as_str(), None),
    };
    // A pair oracle needs its reference to run in process; a one-target oracle has none.
    let is_pair = Registry::builtin()
        .get(f.oracle)
        .is_some_and(|o| o.reads() == Reads::Pair);
    let vs = match (is_pair, label_b.and_then(native_spec)) {
        (false, _) => None,
        (true, Some(spec)) => Some(spec),
        (true, None) => return own_trace(f, label_a),
    };
    // A native model that panics on a trace under a fault (its invariants are llama.cpp's
    // without that fault) gives no evidence: the finding keeps its other causes, and the run
    // (a hunt's regrouping, a report) goes on; the panic is said, as the kvaudit bug it is.
    let run = |faults: &[String]| -> Option<(bool, Judge)> {
        let replay = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut judge = native_judge(faults, vs.as_ref(), f.oracle)?;
            let j = judge.run(&f.trace).ok()?;
            Some((reproduces(&j, f), judge))
        }));
        replay.unwrap_or_else(|_| {
            eprintln!(
                "kvaudit: the native model panicked replaying a {} finding with faults {faults:?}: no root-cause evidence from it (a kvaudit bug: please report it)",
                f.oracle
            );
            None
        })
    };
    if let Some((true, mut judge)) = run(&[]) {
        return Cause::NativeModel {
            shape: minimal_shape(f, Some(&mut judge)),
        };
    }
    let faults: Vec<String> = Faults::NAMES
        .iter()
        .filter(|name| matches!(run(&[name.to_string()]), Some((true, _))))
        .map(|name| name.to_string())
        .collect();
    if !faults.is_empty() {
        return Cause::NativeFault { faults };
    }
    own_trace(f, label_a)
}

/// No native run explains `f`: its trace, shrunk on its own target where that is a native one.
fn own_trace(f: &Finding, label_a: &str) -> Cause {
    let mut judge = (!f.target.contains(" vs "))
        .then(|| native_spec(label_a))
        .flatten()
        .and_then(|spec| native_judge(&spec.faults, None, f.oracle));
    Cause::MinimalTrace {
        shape: minimal_shape(f, judge.as_mut()),
    }
}

/// The root-cause groups of `findings`. A finding that several faults explain each alone goes
/// to the fault that explains the most findings of the run (then the first by name): one known
/// bug that accounts for a set of findings is the simplest explanation of each.
pub fn group_findings(findings: &[Finding]) -> Vec<FindingGroup> {
    let mut causes: Vec<Cause> = findings.iter().map(cause_of).collect();
    let mut explains: std::collections::BTreeMap<String, usize> = Default::default();
    for c in &causes {
        if let Cause::NativeFault { faults } = c {
            for fault in faults {
                *explains.entry(fault.clone()).or_default() += 1;
            }
        }
    }
    for c in &mut causes {
        if let Cause::NativeFault { faults } = c {
            let best = faults
                .iter()
                .max_by_key(|f| (explains[*f], std::cmp::Reverse(*f)))
                .expect("a fault cause names a fault")
                .clone();
            *faults = vec![best];
        }
    }
    build_groups(findings, causes)
}

/// Fills `report.groups` from its findings.
pub fn group_report(report: &mut Report) {
    report.groups = group_findings(&report.findings);
}
