//! `kvaudit shrink FILE`: shrinks a failing trace (a repro file or a bare trace file) to a
//! minimal one and writes it as a repro file.

use std::path::PathBuf;

use clap::Args;

use super::args::{factories, record_on_specs};
use super::CliError;
use kvaudit::base::cache::Observe;
use kvaudit::base::exit;
use kvaudit::engines::shrink::{shrink, FailureMode, ShrinkConfig};
use kvaudit::oracles::{Reads, Registry};
use kvaudit::outputs::repro::{
    check_date, load_trace_or_repro, measure, targets_of, today_utc, write_output, Expect, Found,
    Repro, TargetExpectation,
};
use kvaudit::records::report::Finding;
use kvaudit::running::judge::Judge;
use kvaudit::targets::registry::TargetSpec;

/// Arguments of `kvaudit shrink`.
#[derive(Debug, Args)]
pub struct ShrinkArgs {
    /// A repro file, or a trace file (`{"setup": {..}, "ops": [..]}`).
    file: PathBuf,
    /// Target to shrink on (default: the repro file's first target where it fails, else native).
    #[arg(long)]
    target: Option<String>,
    /// Inject faults into the target (native only).
    #[arg(long = "inject", value_delimiter = ',')]
    inject: Vec<String>,
    /// Second target, for a differential failure.
    #[arg(long)]
    vs: Option<String>,
    /// Inject faults into the second target.
    #[arg(long = "inject-b", value_delimiter = ',', requires = "vs")]
    inject_b: Vec<String>,
    /// The oracle whose failure to keep (default: the repro file's; for a bare trace, the first
    /// oracle that fails, in the order I1, I2, differential, crash).
    #[arg(long)]
    oracle: Option<String>,
    /// Write the shrunk repro file here (default: stdout).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also record whether the shrunk trace fails or holds on these targets.
    #[arg(long = "record-on", value_delimiter = ',')]
    record_on: Vec<String>,
    /// The repro's `since` date, YYYY-MM-DD (default: the input repro's, else today, UTC).
    #[arg(long, env = "KVAUDIT_DATE")]
    date: Option<String>,
    /// Most target executions the shrink may spend.
    #[arg(long, default_value_t = 100_000)]
    budget: u64,
    /// Print nothing but the repro (and errors).
    #[arg(long, short)]
    quiet: bool,
}

/// Shrinks the file's trace.
pub fn run(a: ShrinkArgs) -> Result<i32, CliError> {
    let (trace, input) = load_trace_or_repro(&a.file).map_err(CliError::usage)?;
    let wanted_oracle = a
        .oracle
        .as_deref()
        .map(|o| {
            let observing = Registry::builtin().only(|o| o.reads() != Reads::Runs);
            observing.find(o).map(|o| o.id()).ok_or_else(|| {
                CliError::usage(format!(
                    "--oracle '{o}': one of {}",
                    observing.names().join(", ")
                ))
            })
        })
        .transpose()?;
    let from_flags = a.target.is_some() || !a.inject.is_empty() || a.vs.is_some();
    let recorded = input
        .as_ref()
        .and_then(|r| r.targets.iter().find(|e| e.expect == Expect::Fails));
    let (spec_a, spec_b) = match recorded {
        Some(e) if !from_flags => e.specs(),
        _ => (
            TargetSpec::new(a.target.as_deref().unwrap_or("native"), &a.inject)
                .with_observe(Observe::ALL_WITH_PROBE),
            a.vs.as_ref()
                .map(|v| TargetSpec::new(v, &a.inject_b).with_observe(Observe::ALL_WITH_PROBE)),
        ),
    };
    // What the oracle to keep reads beyond the default (the reload probe is in no default set),
    // as a replay widens its specs.
    let asked = wanted_oracle
        .or(input.as_ref().map(|r| r.oracle))
        .and_then(|id| Registry::builtin().get(id).map(|o| o.observes()))
        .unwrap_or(Observe::BASIC);
    let widen = |s: TargetSpec| {
        let observe = s.observe.union(asked);
        s.with_observe(observe)
    };
    let (spec_a, spec_b) = (widen(spec_a), spec_b.map(widen));
    let (fa, fb) = factories(&spec_a, spec_b.as_ref(), None)?;
    let record_on = record_on_specs(&a.record_on)?;
    let date = match (&a.date, &input) {
        (Some(d), _) => check_date(d).map_err(|e| CliError::usage(format!("--date: {e}")))?,
        (None, Some(r)) => r.since.clone(),
        (None, None) => today_utc(),
    };
    let mut judge = Judge::new(fa.as_ref(), fb.as_deref())?;
    let label = judge.label();
    let first = judge.run(&trace)?;
    let oracle = wanted_oracle.or(input.as_ref().map(|r| r.oracle));
    let violation = match oracle {
        Some(o) => first.first(o),
        None => first.violations.first(),
    };
    let Some(v) = violation.filter(|v| v.step > 0) else {
        let what = oracle.map_or("any oracle".to_string(), |o| o.to_string());
        eprintln!(
            "kvaudit shrink: {}: the trace does not fail {what} on {label}: nothing to shrink",
            a.file.display()
        );
        return Ok(exit::CLEAN);
    };
    let mode = FailureMode::of(&v.violation);
    let (length, step) = (trace.ops.len(), v.step);
    let cfg = ShrinkConfig {
        max_executions: a.budget,
        ..ShrinkConfig::default()
    };
    let s = shrink(&trace, &mode, &mut judge, &cfg)?.expect("it failed this way a moment ago");
    if !a.quiet {
        eprintln!(
            "kvaudit shrink: {}: {mode}: {length} ops (first fails at step {step}) shrunk to {} ops in {} executions, {:.3} s{}",
            judge.label_of(&s.failure),
            s.trace.ops.len(),
            s.executions,
            s.elapsed.as_secs_f64(),
            if s.minimal {
                "; minimal: no op can be dropped or simplified"
            } else {
                "; the budget ran out before a fixed point"
            }
        );
    }
    let f = &s.failure.violation;
    let finding = Finding {
        oracle: f.oracle,
        kind: f.kind.clone(),
        target: judge.label_of(&s.failure),
        depth: s.trace.ops.len() as u32,
        trial_index: 0,
        step: s.failure.step,
        seq: f.seq,
        trace: s.trace.clone(),
        observed: f.observed.clone(),
        expected: f.expected.clone(),
    };
    let (x, y) = targets_of(f.oracle, s.failure.on_vs, &spec_a, spec_b.as_ref());
    let fails = TargetExpectation::new(&x, y.as_ref(), Expect::Fails);
    let earlier = input.as_ref().and_then(|r| r.found.as_ref());
    let found = Found {
        seed: earlier.and_then(|f| f.seed),
        case: earlier.and_then(|f| f.case),
        length: earlier.map_or(length, |f| f.length),
        step: earlier.map_or(step, |f| f.step),
        shrink_executions: earlier.map_or(0, |f| f.shrink_executions) + s.executions,
    };
    let mut repro = Repro::from_finding(&finding, &date, vec![fails.clone()], Some(found));
    if let Some(r) = &input {
        repro.postmortem = r.postmortem.clone();
    }
    // The input's other targets, measured again on the shrunk trace, then --record-on.
    let others: Vec<(TargetSpec, Option<TargetSpec>)> = input
        .iter()
        .flat_map(|r| r.targets.iter())
        .filter(|e| e.label() != fails.label())
        .map(|e| e.specs())
        .chain(record_on.into_iter().map(|r| (r, y.clone())))
        .collect();
    for (x, y) in others {
        match measure(&repro, &x, y.as_ref()) {
            Ok(e) if !repro.targets.iter().any(|t| t.label() == e.label()) => repro.targets.push(e),
            Ok(_) => {}
            Err(e) => eprintln!("kvaudit shrink: {} left out of the repro: {e}", x.name),
        }
    }
    let text = repro.to_text();
    match &a.out {
        Some(p) => {
            write_output(p, &text).map_err(CliError::harness)?;
            if !a.quiet {
                eprintln!("repro written to {}", p.display());
            }
        }
        None => print!("{text}"),
    }
    Ok(exit::FINDINGS)
}
