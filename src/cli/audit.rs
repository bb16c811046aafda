//! `kvaudit audit`: the exhaustive audit.

use clap::Args;

use super::args::{factories, DomainArgs, OutputArgs, TargetArgs};
use super::progress::Display;
use super::CliError;
use kvaudit::base::exit;
use kvaudit::engines::explore::{run_exhaustive, ExhaustiveConfig};
use kvaudit::engines::states::{run_states, StatesConfig};
use kvaudit::records::report::Shard;
use kvaudit::running::states::KeyScope;

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
    #[command(flatten)]
    out: OutputArgs,
}

/// How `kvaudit audit` walks the domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Strategy {
    /// Every op sequence of length 1..=depth.
    Exhaustive,
    /// Every distinct state, breadth first (`engines::states`).
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

/// Runs the audit.
pub fn run(a: AuditArgs) -> Result<i32, CliError> {
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
    let shard = shard_from(a.shard.as_deref(), &|k| std::env::var(k).ok())?;
    let predictions = match &a.prereg {
        Some(p) => kvaudit::records::prereg::read(p).map_err(CliError::usage)?,
        None if std::path::Path::new("PREREG.md").exists() => {
            kvaudit::records::prereg::read("PREREG.md".as_ref()).unwrap_or_default()
        }
        None => Vec::new(),
    };
    let mut registry = a.target.registry();
    if !a.oracles.is_empty() {
        let mut keep = Vec::new();
        for name in &a.oracles {
            let o = registry.find(name).ok_or_else(|| {
                CliError::usage(format!(
                    "--oracles: unknown oracle '{name}' for this run (known: {})",
                    registry.names().join(", ")
                ))
            })?;
            keep.push(o.id());
        }
        registry = registry.only(move |o| keep.contains(&o.id()));
    } else {
        // An oracle whose observation costs decodes per trial is asked only when named.
        registry = registry.only(|o| !o.costly());
    }
    let (mut spec_a, mut spec_b) = a.target.specs();
    // Observe only what the run's oracles read: a round trip per op costs.
    spec_a = spec_a.with_observe(registry.observe());
    spec_a.model = a.model.clone();
    spec_b = spec_b.map(|b| b.with_observe(registry.observe()));
    if let Some(b) = spec_b.as_mut() {
        b.model = a.model.clone();
    }
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if a.strategy == Strategy::States {
        if spec_b.is_some() || shard != Shard::WHOLE {
            return Err(CliError::usage(
                "--strategy states searches one target's states, whole: no --vs, --vs-config or --shard",
            ));
        }
        if spec_a.observe.logits {
            return Err(CliError::usage(
                "--strategy states cannot ask an oracle that reads the logits probe: the probe \
                 reads the token model, which has no canonical state key",
            ));
        }
        let factory = spec_a.state_factory(KeyScope::Complete)?;
        let cfg = StatesConfig {
            domain,
            depth: a.depth,
            threads,
            oracles: registry,
        };
        let mut display = Display::new(&a.out);
        let report = run_states(&cfg, factory.as_ref(), &mut |e| display.show(e))?;
        return finish(report, &predictions, &a.out);
    }
    let (fa, fb) = factories(&spec_a, spec_b.as_ref(), a.target.vs_config.as_deref())?;
    let cfg = ExhaustiveConfig {
        domain,
        depth: a.depth,
        shard,
        threads,
        batch: a.batch,
        oracles: registry,
    };
    let mut display = Display::new(&a.out);
    let report = run_exhaustive(&cfg, fa.as_ref(), fb.as_deref(), &mut |e| display.show(e))?;
    finish(report, &predictions, &a.out)
}

/// Checks the predictions, groups the findings, emits the report and picks the exit code.
fn finish(
    mut report: kvaudit::records::report::Report,
    predictions: &[kvaudit::records::prereg::Prediction],
    out: &OutputArgs,
) -> Result<i32, CliError> {
    report.prediction = report.check_predictions(predictions);
    kvaudit::engines::group::group_report(&mut report);
    out.emit(&report)?;
    Ok(if report.has_findings() {
        exit::FINDINGS
    } else {
        exit::CLEAN
    })
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
