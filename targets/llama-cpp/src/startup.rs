//! Where a run's start goes: with `KVAUDIT_TRACE_STARTUP=FILE` in the environment, every process
//! of a run (the parent and each worker it starts, which inherit the variable) appends one line
//! per phase it reaches to `FILE`: its pid, the wall clock in microseconds since the epoch, and
//! the phase (`kvaudit: build lookup done`). Sorted by the clock, the lines are a timeline of
//! everything between `kvaudit audit` starting and the first trial (docs/performance.md).
//! Unset, [`mark`] reads one cached flag and does nothing else.

use std::io::Write as _;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// The environment variable that names the trace file.
pub const TRACE_STARTUP_VAR: &str = "KVAUDIT_TRACE_STARTUP";

/// Appends `phase` with this process's pid and the time to the trace file, if one is named.
/// Failing to write it loses the line, never the run.
pub fn mark(phase: &str) {
    static FILE: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
    let Some(path) = FILE.get_or_init(|| std::env::var_os(TRACE_STARTUP_VAR).map(Into::into))
    else {
        return;
    };
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    // One write per line with O_APPEND: lines of several processes do not interleave.
    let line = format!("{} {micros} {phase}\n", std::process::id());
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}
