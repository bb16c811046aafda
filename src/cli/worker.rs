//! `kvaudit worker` (hidden): the child side of crash isolation; see `llama::worker`.

use std::path::PathBuf;

use clap::Args;

use super::CliError;
use kvaudit::base::cache::{Observation, Observe};
use kvaudit::base::state::StateFormat;
use kvaudit::targets::llama::faults::LlamaFaults;
use kvaudit::targets::llama::target::ResetMode;
use kvaudit::targets::llama::worker::{parse_observe_arg, worker_main};

/// Arguments of `kvaudit worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The built shim to load.
    #[arg(long)]
    shim: PathBuf,
    /// The model file.
    #[arg(long)]
    model: PathBuf,
    /// Target label for reports.
    #[arg(long)]
    label: String,
    /// The pin's state format has n_rot fields.
    #[arg(long)]
    rot_fields: bool,
    /// The pin's cache state has no n_stream word (crate versions before 0.1.113).
    #[arg(long)]
    no_stream_count: bool,
    /// The pin's per-sequence dumps have no magic and seq id (before 0.1.147).
    #[arg(long)]
    no_seq_header: bool,
    /// The pin's whole dumps hold the last batch's outputs (before 0.1.137).
    #[arg(long)]
    whole_has_outputs: bool,
    /// Reset by re-running the setup instead of restoring the saved state.
    #[arg(long)]
    rebuild_resets: bool,
    /// What to observe beyond the accessors and per-sequence dumps: basic, whole, round-trip
    /// or all.
    #[arg(long, default_value = "all", value_parser = parse_observe)]
    observe: Observe,
    /// A test hook: die of SIGSEGV whenever this observation is made (sequences, before,
    /// whole, round-trip or probe).
    #[arg(long, value_parser = parse_observation)]
    crash_observing: Option<Observation>,
    /// A test hook: a fault of the llama.cpp target (keep_noop, streams_rm_whole,
    /// seq_size_scales_with_n_seq_max, save_drops_rows); repeatable.
    #[arg(long)]
    inject: Vec<String>,
}

fn parse_observation(arg: &str) -> Result<Observation, String> {
    Observation::from_name(arg).ok_or_else(|| {
        format!("--crash-observing {arg:?}: expected sequences, before, whole, round-trip or probe")
    })
}

fn parse_observe(arg: &str) -> Result<Observe, String> {
    parse_observe_arg(arg)
        .ok_or_else(|| format!("--observe {arg:?}: expected basic, whole, round-trip or all"))
}

/// Set by the SIGINT and SIGTERM that the worker outlives (read by nobody).
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Serves until stdin closes.
pub fn run(a: WorkerArgs) -> Result<i32, CliError> {
    // A Ctrl-C reaches the whole foreground process group, and a batch system's SIGTERM every
    // process of the job: a worker (and the fork server's children, which inherit this) that
    // died of it would read as a crash of the trial it ran. The parent decides: it stops the
    // run and ends its workers; a worker whose parent is gone sees stdin close and exits.
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, &INTERRUPTED)
            .map_err(|e| CliError::harness(format!("cannot handle signal {sig}: {e}")))?;
    }
    let reset = if a.rebuild_resets {
        ResetMode::Rebuild
    } else {
        ResetMode::Restore
    };
    Ok(worker_main(
        &a.shim,
        &a.model,
        &a.label,
        StateFormat {
            rot_fields: a.rot_fields,
            no_stream_count: a.no_stream_count,
            no_seq_header: a.no_seq_header,
            whole_has_outputs: a.whole_has_outputs,
            ..Default::default()
        },
        reset,
        a.observe,
        a.crash_observing,
        LlamaFaults::parse(&a.inject)?,
    ))
}
