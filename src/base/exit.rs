//! Exit codes of the `kvaudit` binary, named and documented in one place.
//!
//! | code | name | meaning |
//! |---:|---|---|
//! | 0 | `CLEAN` | the run finished and no oracle was violated (replay: every expectation held) |
//! | 1 | `FINDINGS` | the run finished and found violations (replay: an expectation no longer holds) |
//! | 2 | `USAGE` | bad command line or input file (malformed domain, trace, report) |
//! | 3 | `HARNESS` | the harness itself broke (target failed to load, worker died, I/O error) |
//! | 4 | `INCOMPLETE` | the audit or hunt was stopped (Ctrl-C, SIGTERM) and wrote a partial report (summary) marked incomplete; `--resume` continues it |

/// The run finished; nothing was violated.
pub const CLEAN: i32 = 0;
/// The run finished and has findings.
pub const FINDINGS: i32 = 1;
/// Bad command line or input file.
pub const USAGE: i32 = 2;
/// The harness broke.
pub const HARNESS: i32 = 3;
/// The run was stopped before it finished; its partial report says where.
pub const INCOMPLETE: i32 = 4;
