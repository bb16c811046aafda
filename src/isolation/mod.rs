//! Layer 5, crash isolation: targets that run in a worker process of their own, so that an
//! abort, a signal, an exception or a hang of the engine ends a trial as a `crash` finding and
//! never the audit (proptest's and libFuzzer's fork modes; AFL's fork server).
//!
//! [`jsonl`] is the runner of the JSON-lines worker protocol (docs/worker-protocol.md): a
//! worker in any language that reads trials and writes observations, one JSON object a line.
//! It knows no engine: a target is a command to start and the capabilities the worker declares.
//!
//! Nothing here names an engine, an oracle or an explorer; the targets that need a worker
//! (`targets::python`) say which command to start.

pub mod jsonl;

/// A fatal signal's name as crash findings write it (`SIGABRT`: its class is the first line).
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGABRT => "SIGABRT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGFPE => "SIGFPE",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGKILL => "SIGKILL",
        _ => "signal",
    }
}
