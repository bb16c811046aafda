//! `kvaudit audit`: the exhaustive audit.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::Args;

use super::args::{DomainArgs, Format, MessageFormat, OutputArgs, TargetArgs};
use super::progress::{duration, thousands, Display};
use super::CliError;
use kvaudit::base::exit;
use kvaudit::engines::audit::{run_audit, AuditConfig, AuditEvent, AuditOutcome, Resume};
use kvaudit::engines::explore::Estimate;
use kvaudit::records::report::{Report, Shard};
use kvaudit::targets::llama::startup::mark;

/// An audit estimated to take longer than this (seconds) runs only with `--yes`.
const ASK_ABOVE_S: f64 = 86_400.0;

/// Arguments of `kvaudit audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    domain: DomainArgs,
    /// Longest op sequence (every length 1..=depth is enumerated).
    #[arg(long, default_value_t = 3)]
    depth: u32,
    /// Run shard K of M (`K/M`, K from 0). Also read from SLURM_ARRAY_TASK_ID and
    /// SLURM_ARRAY_TASK_COUNT, or from JOB_COMPLETION_INDEX with KVAUDIT_SHARD_COUNT.
    #[arg(long)]
    shard: Option<String>,
    /// Worker threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Predictions to compare the outcome with (default: ./PREREG.md if present).
    #[arg(long)]
    prereg: Option<std::path::PathBuf>,
    /// Model file for llama.cpp targets (default: the generated tiny model).
    #[arg(long)]
    model: Option<std::path::PathBuf>,
    /// Only these oracles (comma-separated names, `kvaudit oracles` lists them; default: every
    /// oracle that judges observations). Fewer oracles observe less: the round trip and the
    /// before-op cells cost most of a llama.cpp trial.
    #[arg(long, value_delimiter = ',')]
    oracles: Vec<String>,
    /// Traces per batch sent to a runner.
    #[arg(long, default_value_t = 2048)]
    batch: usize,
    /// `exhaustive`: every op sequence up to --depth. `states`: breadth-first over distinct
    /// states until the space closes or --depth is reached (native target only: its complete
    /// state can be keyed; docs/usage.md).
    #[arg(long, value_enum, default_value_t = Strategy::Exhaustive)]
    strategy: Strategy,
    /// Continue the audit of this partial report (JSON, marked incomplete: an interrupted run's
    /// report or checkpoint) with the same target, domain, depth and oracles; the report goes
    /// back to this file unless --out says otherwise. A finished report is given back as it is.
    #[arg(long, value_name = "REPORT")]
    resume: Option<PathBuf>,
    /// Run even if the estimate says the audit takes more than a day.
    #[arg(long)]
    yes: bool,
    #[command(flatten)]
    out: OutputArgs,
}

/// How `kvaudit audit` walks the domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Strategy {
    /// Every op sequence of length 1..=depth.
    Exhaustive,
    /// Every distinct state, breadth first (`engines::state_space`).
    States,
}

/// The shard from the flag, else from the batch system's environment, else the whole run.
pub fn shard_from(
    flag: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Shard, CliError> {
    if let Some(s) = flag {
        return Shard::parse(s).map_err(|e| CliError::usage(format!("--shard: {e}")));
    }
    let num = |name: &str| -> Result<Option<usize>, CliError> {
        env(name)
            .map(|v| {
                v.trim()
                    .parse::<usize>()
                    .map_err(|_| CliError::usage(format!("${name} = '{v}' is not a number")))
            })
            .transpose()
    };
    if let (Some(id), Some(count)) = (num("SLURM_ARRAY_TASK_ID")?, num("SLURM_ARRAY_TASK_COUNT")?) {
        let min = num("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
        return Shard::new(id.saturating_sub(min), count)
            .map_err(|e| CliError::usage(format!("SLURM array: {e}")));
    }
    if let Some(id) = num("JOB_COMPLETION_INDEX")? {
        let count = num("KVAUDIT_SHARD_COUNT")?.ok_or_else(|| {
            CliError::usage(
                "JOB_COMPLETION_INDEX is set: set KVAUDIT_SHARD_COUNT to the number of completions",
            )
        })?;
        return Shard::new(id, count)
            .map_err(|e| CliError::usage(format!("JOB_COMPLETION_INDEX: {e}")));
    }
    Ok(Shard::WHOLE)
}

/// Stops the run (`stop` set) on the first SIGINT or SIGTERM and ends the process at once on a
/// second one (exit code 130).
pub fn stop_on_signals() -> Result<Arc<AtomicBool>, CliError> {
    Ok(kvaudit::engines::audit::stop_on_signals()?)
}

/// The file a run's checkpoints go to: `--out`, when the report there is JSON.
fn checkpoint_file(out: &OutputArgs) -> Option<&Path> {
    let path = out.out.as_deref()?;
    let json = match out.format {
        Format::Json => true,
        Format::Terminal => path.extension().and_then(|e| e.to_str()) != Some("md"),
        Format::Markdown => false,
    };
    json.then_some(path)
}

/// "5,884,900 trials, about 11 s (calibrated on 12,288 trials)".
fn estimate_line(e: &Estimate) -> String {
    match e.seconds {
        Some(s) => format!(
            "{} trials, about {} (calibrated on {} trials)",
            thousands(e.trials),
            duration(s),
            thousands(e.calibrated_on)
        ),
        None => format!("{} trials", thousands(e.trials)),
    }
}

/// Runs the audit.
pub fn run(mut a: AuditArgs) -> Result<i32, CliError> {
    if a.depth == 0 {
        return Err(CliError::usage("--depth must be at least 1"));
    }
    if a.batch == 0 {
        return Err(CliError::usage("--batch must be at least 1"));
    }
    a.target.check()?;
    let domain = a.domain.resolve()?;
    if a.model.is_some() && domain.setup.arch != kvaudit::base::op::Arch::Llama {
        // --model replaces the llama model only; other architectures run their generated model.
        return Err(CliError::usage(format!(
            "--model names a llama model; the {} setup runs the generated tiny {} model",
            domain.setup.arch, domain.setup.arch
        )));
    }
    let resume = match &a.resume {
        Some(p) => Some(Resume {
            path: p.clone(),
            report: Report::load(p).map_err(|e| CliError::usage(format!("--resume: {e}")))?,
        }),
        None => None,
    };
    let mut shard = shard_from(a.shard.as_deref(), &|k| std::env::var(k).ok())?;
    if let Some(r) = resume.as_ref().filter(|_| shard == Shard::WHOLE) {
        shard = r.report.shard;
    }
    if a.out.out.is_none() {
        a.out.out.clone_from(&a.resume);
    }
    a.out.check_writable()?;
    let predictions = match &a.prereg {
        Some(p) => kvaudit::records::prereg::read(p).map_err(CliError::usage)?,
        None if std::path::Path::new("PREREG.md").exists() => {
            kvaudit::records::prereg::read("PREREG.md".as_ref()).unwrap_or_default()
        }
        None => Vec::new(),
    };
    let (target, vs) = a.target.specs();
    let cfg = AuditConfig {
        target,
        vs,
        vs_config: a.target.vs_config.clone(),
        model: a.model.clone(),
        domain,
        depth: a.depth,
        strategy: match a.strategy {
            Strategy::Exhaustive => kvaudit::engines::audit::Strategy::Exhaustive,
            Strategy::States => kvaudit::engines::audit::Strategy::States,
        },
        shard,
        threads: a.threads,
        batch: a.batch,
        oracles: a.oracles.clone(),
        resume,
        predictions,
        checkpoint: checkpoint_file(&a.out).map(Path::to_path_buf),
        stop_on_signals: true,
        hold_at_depth: hold_at_depth()?,
        confirm_above_s: (!a.yes).then_some(ASK_ABOVE_S),
    };
    let mut display = Display::new(&a.out);
    let (quiet, messages) = (a.out.quiet, a.out.message_format);
    let outcome = run_audit(&cfg, &mut |e| match e {
        AuditEvent::Estimate(estimate) if !quiet => match messages {
            MessageFormat::Human => eprintln!("kvaudit: {}", estimate_line(estimate)),
            MessageFormat::Json => eprintln!(
                "{}",
                serde_json::json!({"event": "estimate", "trials": estimate.trials,
                    "seconds": estimate.seconds, "calibrated_on": estimate.calibrated_on})
            ),
        },
        AuditEvent::Estimate(_) => {}
        AuditEvent::Run(e) => display.show(e),
        AuditEvent::CheckpointFailed { path, error } => eprintln!(
            "kvaudit: {}: cannot write a checkpoint: {error}",
            path.display()
        ),
    })?;
    match outcome {
        AuditOutcome::Finished(report) => {
            a.out.emit(&report)?;
            mark("kvaudit: report written");
            Ok(if report.has_findings() {
                exit::FINDINGS
            } else {
                exit::CLEAN
            })
        }
        AuditOutcome::Stopped(report) => {
            a.out.emit(&report)?;
            let i = report
                .incomplete
                .as_ref()
                .expect("a stopped run's report is partial");
            let how = match &cfg.checkpoint {
                Some(p) => format!("continue with --resume {}", p.display()),
                None => "a JSON report (--out FILE.json) can be resumed".into(),
            };
            eprintln!(
                "kvaudit: stopped in depth {} ({} of its chunks done): the report is partial; {how}",
                i.depth,
                i.chunks_done.len()
            );
            Ok(exit::INCOMPLETE)
        }
        AuditOutcome::TooLong(estimate) => Err(CliError::usage(format!(
            "depth {} of {}: {}: more than a day; shard it (--shard K/M) or pass --yes to run it",
            cfg.depth,
            cfg.domain.name,
            estimate_line(&estimate)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_sources() {
        let none = |_: &str| None;
        assert_eq!(
            shard_from(Some("1/3"), &none).unwrap(),
            Shard { index: 1, count: 3 }
        );
        assert_eq!(shard_from(None, &none).unwrap(), Shard::WHOLE);
        let slurm = |k: &str| match k {
            "SLURM_ARRAY_TASK_ID" => Some("2".to_string()),
            "SLURM_ARRAY_TASK_COUNT" => Some("3".to_string()),
            _ => None,
        };
        assert_eq!(
            shard_from(None, &slurm).unwrap(),
            Shard { index: 2, count: 3 }
        );
        let k8s = |k: &str| (k == "JOB_COMPLETION_INDEX").then(|| "0".to_string());
        assert_eq!(shard_from(None, &k8s).unwrap_err().code, exit::USAGE);
        assert!(shard_from(Some("3/3"), &none).is_err());
    }
}

/// The test hook `KVAUDIT_TEST_HOLD_AT_DEPTH=D` (docs/usage.md): the run writes a checkpoint
/// once the first chunk of depth D is done and then waits for Ctrl-C or SIGTERM, so that a test
/// stops it in that depth whatever the machine's speed.
fn hold_at_depth() -> Result<Option<u32>, CliError> {
    let Some(v) = std::env::var_os("KVAUDIT_TEST_HOLD_AT_DEPTH") else {
        return Ok(None);
    };
    let v = v.to_string_lossy();
    v.parse::<u32>().map(Some).map_err(|_| {
        CliError::usage(format!(
            "KVAUDIT_TEST_HOLD_AT_DEPTH={v}: expected a depth (a whole number)"
        ))
    })
}
