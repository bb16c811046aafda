//! Crash isolation: llama.cpp runs in a worker process, so an abort is a finding, not the end.
//!
//! The parent ([`WorkerRunner`], a [`TrialRunner`]) starts `kvaudit-llama-worker` with the shim and the
//! model, sends batches of traces as JSON lines on its stdin (in a compact form, see [`wire`])
//! and reads one [`TrialRun`] per trace back, flushed in groups. The worker ([`worker_main`]) is
//! a fork server: it loads everything once, warms a context up, and forks a child that runs the
//! traces with a [`LocalRunner`] over a [`LlamaTarget`]. Before every op the child records
//! (trial, step); a signal handler for SIGABRT, SIGSEGV, SIGFPE, SIGBUS and SIGILL writes them to
//! stderr and lets the signal kill the child. The server then reports the death and forks a new
//! child from its warm state; the parent turns the missing result into [`TrialEnd::Crashed`] with
//! the signal, the step and the last lines llama.cpp printed (the failed `GGML_ASSERT` or
//! `assert`) and goes on with the rest of the batch. A trial that gives no answer within the
//! timeout is a hang: SIGABRT to the worker, which the server forwards to the child, and the
//! trial is a crash finding too. Should the server itself die, the parent starts a new worker.
//!
//! The target is deterministic, so a trace whose first `step` ops crashed once crashes again: the
//! parent remembers crashing prefixes and answers later traces that start with one without
//! running them (this keeps `+assert` audits, where thousands of traces share a crashing prefix,
//! from crashing thousands of times).
//!
//! - [`wire`]: the line protocol, bounded and typed on both sides;
//! - `parent`: [`WorkerRunner`] and how a death reads back;
//! - `server`: [`worker_main`], the fork server and its children.
//!
//! The signal handlers, `fork`, `waitpid` and every other libc call live in
//! [`super::sys`].
//!
//! A sanitizer build (`+asan`, `+ubsan`) runs in a worker started with the runtime it needs
//! ([`runtime_env`]): ASan (and libstdc++) preloaded (the shim is dlopen'ed by a Rust binary that is not linked
//! with it, and ASan must come first), and each sanitizer told to abort at its first report, so
//! that the signal report names the trial and step and the parent reads the report as the
//! crash ([`crate::oracles::crash::sanitizer_report`]).

pub mod entry;
mod last_words;
mod parent;
mod process;
mod server;
pub mod wire;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

pub use self::last_words::crash_detail;
pub use self::parent::WorkerRunner;
pub use self::server::worker_main;
use super::build::flag_build;
use super::error::LlamaError;
use super::faults::LlamaFaults;
use super::pins::Variant;
use super::target::ResetMode;
use crate::base::cache::{Observation, Observe};
use crate::base::state::StateFormat;

#[cfg(doc)]
use {
    super::target::LlamaTarget,
    crate::running::runner::{LocalRunner, TrialEnd, TrialRun, TrialRunner},
};

/// What a worker is started with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSpec {
    /// The `kvaudit` executable (normally `std::env::current_exe()`).
    pub exe: PathBuf,
    /// The built shim.
    pub shim: PathBuf,
    /// The model file.
    pub model: PathBuf,
    /// Target label for reports (`llama.cpp@0.1.156+assert`).
    pub label: String,
    /// The pin's state format.
    pub format: StateFormat,
    /// No answer for one trial within this long is a hang.
    pub timeout: Duration,
    /// How the worker resets between trials.
    pub reset: ResetMode,
    /// What the worker observes after each op beyond the accessors and per-sequence dumps
    /// (passed at spawn: `--observe`, see [`observe_arg`]).
    pub observe: Observe,
    /// Environment variables the worker starts with: the runtime its build's variant needs
    /// ([`runtime_env`]).
    pub env: Vec<(String, String)>,
    /// A test hook: the worker dies of SIGSEGV whenever it makes this observation
    /// (`--crash-observing`; `KVAUDIT_TEST_CRASH_OBSERVING`, docs/usage.md), the positive
    /// control of observation crashes.
    pub crash_observing: Option<Observation>,
    /// Test hooks injected around llama.cpp's calls (`--inject`, docs/usage.md): the faults of
    /// the llama.cpp target's positive controls.
    pub faults: LlamaFaults,
}

/// The environment a process that loads a build of `variant` needs: `LD_PRELOAD` of each
/// runtime the variant's flags must load first (found with `gcc -print-file-name`, before any
/// `LD_PRELOAD` the user set), and each sanitizer's options (the user's, if set, after ours, so
/// that they win). Empty for release and `+assert`.
pub fn runtime_env(variant: Variant) -> Result<Vec<(String, String)>, LlamaError> {
    let mut preload = Vec::new();
    let mut env = Vec::new();
    for flag in variant.flags() {
        let row = flag_build(flag);
        for name in row.preload {
            preload.push(runtime_path(name)?);
        }
        if let Some((var, options)) = row.options {
            let value = match std::env::var(var) {
                Ok(user) if !user.is_empty() => format!("{options}:{user}"),
                _ => options.to_string(),
            };
            env.push((var.to_string(), value));
        }
    }
    if !preload.is_empty() {
        if let Ok(user) = std::env::var("LD_PRELOAD") {
            preload.push(user);
        }
        env.push(("LD_PRELOAD".to_string(), preload.join(":")));
    }
    Ok(env)
}

/// The path of gcc's runtime library `name` (`libasan.so`).
fn runtime_path(name: &str) -> Result<String, LlamaError> {
    let what = format!("finding the sanitizer runtime {name} (`gcc -print-file-name={name}`)");
    let out = Command::new("gcc")
        .arg(format!("-print-file-name={name}"))
        .output()
        .map_err(|e| LlamaError::io(what.clone(), e))?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // gcc prints the name itself when it has no such file.
    if !out.status.success() || !std::path::Path::new(&path).is_absolute() {
        return Err(LlamaError::Command {
            what,
            status: out.status.to_string(),
            output: format!(
                "gcc printed {path:?}: is gcc's {name} installed (libasan8 on Debian)?"
            ),
        });
    }
    Ok(path)
}

/// `--observe`'s value for `what`: `basic`, or a comma-separated list of `whole`,
/// `round-trip`, `before`, `logits`, `next-logits`, `reload`, `sizes` and `partial`.
pub fn observe_arg(what: Observe) -> String {
    let parts: Vec<&str> = [
        (what.whole, "whole"),
        (what.round_trip, "round-trip"),
        (what.before, "before"),
        (what.logits, "logits"),
        (what.next_logits, "next-logits"),
        (what.reload, "reload"),
        (what.sizes, "sizes"),
        (what.partial, "partial"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect();
    if parts.is_empty() {
        "basic".into()
    } else {
        parts.join(",")
    }
}

/// The [`Observe`] an `--observe` value names (the inverse of [`observe_arg`]).
pub fn parse_observe_arg(arg: &str) -> Option<Observe> {
    let mut o = Observe::BASIC;
    if arg == "basic" {
        return Some(o);
    }
    for part in arg.split(',') {
        match part {
            "whole" => o.whole = true,
            "round-trip" => o.round_trip = true,
            "before" => o.before = true,
            "logits" => o.logits = true,
            "next-logits" => o.next_logits = true,
            "reload" => o.reload = true,
            "sizes" => o.sizes = true,
            "partial" => o.partial = true,
            "all" => o = o.union(Observe::ALL),
            _ => return None,
        }
    }
    Some(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observe_args_round_trip() {
        for whole in [false, true] {
            for round_trip in [false, true] {
                for before in [false, true] {
                    for logits in [false, true] {
                        for reload in [false, true] {
                            for sizes in [false, true] {
                                for partial in [false, true] {
                                    for next_logits in [false, true] {
                                        let what = Observe {
                                            whole,
                                            round_trip,
                                            before,
                                            logits,
                                            next_logits,
                                            reload,
                                            sizes,
                                            partial,
                                        };
                                        let arg = observe_arg(what);
                                        assert_eq!(parse_observe_arg(&arg), Some(what));
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(parse_observe_arg("everything"), None);
    }
}
