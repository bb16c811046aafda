//! The audit as a job: [`run_audit`] takes an [`AuditConfig`] (targets, domain, depth,
//! strategy, oracles by name, a partial report to resume) and does everything between the
//! command line and the report: picks the oracles, makes what the targets observe and their
//! runners, runs the exhaustive explorer (estimate first, checkpoints as it goes) or the
//! state-space search, then checks the predictions and groups the findings.
//!
//! `kvaudit audit` is a struct and this call (cargo-fuzz's shape); tests and benches that want
//! the bare loop call `explore::run_exhaustive` instead.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::base::domain::Domain;
use crate::base::error::Error;
use crate::engines::explore::{check_resumes, Estimate, ExhaustiveConfig, Explorer, RunControl};
use crate::engines::state_space::{run_states, StatesConfig};
use crate::oracles::Registry;
use crate::records::prereg::Prediction;
use crate::records::report::{Event, Report, Shard};
use crate::running::runner::RunnerFactory;
use crate::running::state_runner::KeyScope;
use crate::targets::llama::startup::mark;
use crate::targets::registry::TargetSpec;

/// How an audit walks the domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Every op sequence of length 1..=depth ([`crate::engines::explore`]).
    Exhaustive,
    /// Every distinct state, breadth first ([`crate::engines::state_space`]).
    States,
}

/// A partial report to continue, and the file it came from (named in errors).
pub struct Resume {
    /// The file.
    pub path: PathBuf,
    /// The report read from it, marked incomplete (a finished one is given back as it is).
    pub report: Report,
}

/// One audit.
pub struct AuditConfig {
    /// Target A (its observations are set from the oracles).
    pub target: TargetSpec,
    /// Target B, for the differential oracles.
    pub vs: Option<TargetSpec>,
    /// B runs every trace under this configuration of the setup (`--vs-config`).
    pub vs_config: Option<String>,
    /// A model file for llama.cpp targets (default: the generated tiny model).
    pub model: Option<PathBuf>,
    /// The domain.
    pub domain: Domain,
    /// Longest op sequence.
    pub depth: u32,
    /// How the domain is walked.
    pub strategy: Strategy,
    /// This run's share of the work.
    pub shard: Shard,
    /// Worker threads (`None`: every core).
    pub threads: Option<usize>,
    /// Traces per batch sent to a runner.
    pub batch: usize,
    /// Only these oracles, by name (empty: every oracle but the costly ones).
    pub oracles: Vec<String>,
    /// A partial report of this run to continue.
    pub resume: Option<Resume>,
    /// The predictions the outcome is compared with (PREREG.md).
    pub predictions: Vec<Prediction>,
    /// Where the checkpoints of an exhaustive run go (a JSON report marked incomplete).
    pub checkpoint: Option<PathBuf>,
    /// Stop on the first SIGINT or SIGTERM (and end the process on a second one), once the
    /// runners are made.
    pub stop_on_signals: bool,
    /// The test hook `KVAUDIT_TEST_HOLD_AT_DEPTH` ([`RunControl::hold_at_depth`]).
    pub hold_at_depth: Option<u32>,
    /// Run nothing when the estimate is above this many seconds (`None`: whatever it says).
    pub confirm_above_s: Option<f64>,
}

/// What an audit tells its displays as it goes.
pub enum AuditEvent<'a> {
    /// The trials ahead and how long they should take, before the first of them runs.
    Estimate(&'a Estimate),
    /// What the explorer or the state-space search says.
    Run(&'a Event),
    /// A checkpoint could not be written (said once; the run goes on).
    CheckpointFailed {
        /// The file.
        path: &'a Path,
        /// Why.
        error: String,
    },
}

/// How an audit ended.
pub enum AuditOutcome {
    /// It ran to the end: the predictions checked, the findings grouped.
    Finished(Report),
    /// It was stopped: the report is partial ([`Report::incomplete`]), to be resumed.
    Stopped(Report),
    /// The estimate is above [`AuditConfig::confirm_above_s`]: nothing ran.
    TooLong(Estimate),
}

/// Stops a run (the flag set) on the first SIGINT or SIGTERM and ends the process at once on
/// a second one (exit code 130).
pub fn stop_on_signals() -> Result<Arc<AtomicBool>, Error> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    use signal_hook::flag;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [SIGINT, SIGTERM] {
        // The shutdown goes first: it sees the flag the first signal set.
        flag::register_conditional_shutdown(sig, 130, Arc::clone(&stop))
            .and_then(|_| flag::register(sig, Arc::clone(&stop)))
            .map_err(|e| Error::harness(format!("cannot handle signal {sig}: {e}")))?;
    }
    Ok(stop)
}

/// The runner factories of target A and, if any, B, B under `vs_config` if given.
pub fn factories(
    a: &TargetSpec,
    b: Option<&TargetSpec>,
    vs_config: Option<&str>,
) -> Result<
    (
        Box<RunnerFactory<'static>>,
        Option<Box<RunnerFactory<'static>>>,
    ),
    Error,
> {
    let fa = a.factory()?;
    let fb = b.map(|s| s.factory()).transpose()?;
    let fb = match (fb, vs_config) {
        (Some(f), Some(config)) => {
            let config = config.to_string();
            crate::base::op::Setup::default()
                .with_config(&config)
                .map_err(|e| Error::input(format!("--vs-config: {e}")))?;
            Some(crate::running::runner::reconfigured_factory(f, config))
        }
        (fb, _) => fb,
    };
    Ok((fa, fb))
}

/// The oracles of the run: the ones named, else every one that is not costly (an oracle
/// whose observation costs decodes per trial is asked only when named).
fn oracles(cfg: &AuditConfig) -> Result<Registry, Error> {
    let registry = Registry::for_run(cfg.vs_config.is_some());
    if cfg.oracles.is_empty() {
        return Ok(registry.only(|o| !o.costly()));
    }
    let mut keep = Vec::new();
    for name in &cfg.oracles {
        let o = registry.find(name).ok_or_else(|| {
            Error::input(format!(
                "--oracles: unknown oracle '{name}' for this run (known: {})",
                registry.names().join(", ")
            ))
        })?;
        keep.push(o.id());
    }
    Ok(registry.only(move |o| keep.contains(&o.id())))
}

/// Runs the audit `cfg` describes, telling `sink` what happens.
pub fn run_audit(
    cfg: &AuditConfig,
    sink: &mut dyn FnMut(&AuditEvent<'_>),
) -> Result<AuditOutcome, Error> {
    let registry = oracles(cfg)?;
    // Observe only what the run's oracles read: a round trip per op costs.
    let mut spec_a = cfg.target.clone().with_observe(registry.observe());
    spec_a.model.clone_from(&cfg.model);
    let spec_b = cfg.vs.clone().map(|b| TargetSpec {
        model: cfg.model.clone(),
        ..b.with_observe(registry.observe())
    });
    let threads = cfg
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if cfg.strategy == Strategy::States {
        if spec_b.is_some() || cfg.shard != Shard::WHOLE || cfg.resume.is_some() {
            return Err(Error::input(
                "--strategy states searches one target's states, whole: no --vs, --vs-config, --shard or --resume",
            ));
        }
        if spec_a.observe.logits {
            return Err(Error::input(
                "--strategy states cannot ask an oracle that reads the logits probe: the probe \
                 reads the token model, which has no canonical state key",
            ));
        }
        let factory = spec_a.state_factory(KeyScope::Complete)?;
        let states = StatesConfig {
            domain: cfg.domain.clone(),
            depth: cfg.depth,
            threads,
            oracles: registry,
        };
        let report = run_states(&states, factory.as_ref(), &mut |e| {
            sink(&AuditEvent::Run(e))
        })?;
        return Ok(AuditOutcome::Finished(finish(report, &cfg.predictions)));
    }
    let (fa, fb) = factories(&spec_a, spec_b.as_ref(), cfg.vs_config.as_deref())?;
    let exhaustive = ExhaustiveConfig {
        domain: cfg.domain.clone(),
        depth: cfg.depth,
        shard: cfg.shard,
        threads,
        batch: cfg.batch,
        oracles: registry,
    };
    let stop = match cfg.stop_on_signals {
        true => stop_on_signals()?,
        false => Arc::new(AtomicBool::new(false)),
    };
    let mut explorer = Explorer::new(&exhaustive, fa.as_ref(), fb.as_deref())?;
    mark("kvaudit: runners started");
    let resume = cfg.resume.as_ref().map(|r| &r.report);
    if let Some(r) = &cfg.resume {
        check_resumes(&r.report, &explorer.blank_report())
            .map_err(|e| Error::input(format!("--resume {}: {e}", r.path.display())))?;
    }
    let incomplete = resume.and_then(|r| r.incomplete.as_ref());
    let estimate = explorer.estimate(incomplete, &stop)?;
    mark("kvaudit: estimated");
    if estimate
        .seconds
        .is_some_and(|s| cfg.confirm_above_s.is_some_and(|above| s > above))
    {
        return Ok(AuditOutcome::TooLong(estimate));
    }
    sink(&AuditEvent::Estimate(&estimate));
    let mut checkpoint_failed = false;
    let ctl = RunControl {
        resume,
        hold_at_depth: cfg.hold_at_depth,
        ..RunControl::new(&stop)
    };
    let report = explorer.run(&ctl, &mut |e| {
        if let (Event::Checkpoint(r), Some(path)) = (e, cfg.checkpoint.as_deref()) {
            if let Err(err) = crate::base::files::write_atomically(path, r.to_json()) {
                if !std::mem::replace(&mut checkpoint_failed, true) {
                    sink(&AuditEvent::CheckpointFailed {
                        path,
                        error: err.to_string(),
                    });
                }
            }
        }
        sink(&AuditEvent::Run(e))
    })?;
    mark("kvaudit: trials done");
    Ok(match report.incomplete {
        Some(_) => AuditOutcome::Stopped(report),
        None => AuditOutcome::Finished(finish(report, &cfg.predictions)),
    })
}

/// Checks the predictions and groups the findings.
fn finish(mut report: Report, predictions: &[Prediction]) -> Report {
    report.prediction = report.check_predictions(predictions);
    crate::engines::root_cause::group_report(&mut report);
    report
}
