//! The worker's own program: `kvaudit-llama-worker`, the small binary (`src/bin/`) that a
//! [`super::WorkerRunner`] starts, one per runner. Its arguments are what the parent's
//! [`super::WorkerSpec`] says (the shim, the model, the state format, the reset mode, what to
//! observe, the test hooks); it reads requests on stdin and writes replies on stdout
//! ([`super::wire`]) until stdin closes. It is not the CLI entered again: nothing of
//! `kvaudit`'s subcommands is parsed, and a user never runs it by hand.

use std::path::PathBuf;

use clap::Parser;

use super::{parse_observe_arg, worker_main};
use crate::base::cache::{Observation, Observe};
use crate::base::exit;
use crate::base::state::StateFormat;
use crate::targets::llama::faults::LlamaFaults;
use crate::targets::llama::target::ResetMode;

/// The worker binary's name: [`crate::targets::registry`] looks for it beside `kvaudit`.
pub const WORKER_BINARY: &str = "kvaudit-llama-worker";

/// The arguments a parent passes (`parent.rs` writes them).
#[derive(Debug, Parser)]
#[command(
    name = "kvaudit-llama-worker",
    about = "Serves a llama.cpp target to a parent kvaudit over stdin/stdout (not run by hand)"
)]
struct WorkerArgs {
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
    /// What to observe beyond the accessors and per-sequence dumps: basic, or a comma-separated
    /// list of whole, round-trip, before, logits, next-logits, reload, sizes, partial, all.
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

/// The worker program: parses this process's arguments and serves until stdin closes. Returns
/// the exit code ([`worker_main`]'s; [`exit::USAGE`] for arguments it cannot take,
/// [`exit::HARNESS`] when it cannot start).
pub fn main() -> i32 {
    let args = match WorkerArgs::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { exit::USAGE } else { 0 };
        }
    };
    // A Ctrl-C reaches the whole foreground process group, and a batch system's SIGTERM every
    // process of the job: a worker (and the fork server's children, which inherit this) that
    // died of it would read as a crash of the trial it ran. The parent decides: it stops the
    // run and ends its workers; a worker whose parent is gone sees stdin close and exits.
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, &INTERRUPTED) {
            eprintln!("{WORKER_BINARY}: error: cannot handle signal {sig}: {e}");
            return exit::HARNESS;
        }
    }
    let faults = match LlamaFaults::parse(&args.inject) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{WORKER_BINARY}: error: {}", e.message);
            return exit::USAGE;
        }
    };
    let reset = if args.rebuild_resets {
        ResetMode::Rebuild
    } else {
        ResetMode::Restore
    };
    worker_main(
        &args.shim,
        &args.model,
        &args.label,
        StateFormat {
            rot_fields: args.rot_fields,
            no_stream_count: args.no_stream_count,
            no_seq_header: args.no_seq_header,
            whole_has_outputs: args.whole_has_outputs,
            ..Default::default()
        },
        reset,
        args.observe,
        args.crash_observing,
        faults,
    )
}
