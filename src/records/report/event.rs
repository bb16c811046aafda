//! The event stream a run tells its displays as it goes ([`Event`]): the progress display and,
//! with `--message-format json`, JSON lines. Re-exported by [`super`].

use serde::Serialize;

use super::{Finding, Report, Shard};
use crate::base::cache::TargetInfo;
use crate::oracles::OracleId;

/// What a run tells its displays as it goes.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The run starts.
    Start {
        /// Target A.
        target: TargetInfo,
        /// Target B.
        vs: Option<TargetInfo>,
        /// Domain name.
        domain: String,
        /// Depth.
        depth: u32,
        /// Ops in the domain.
        ops: usize,
        /// Trials this run will do.
        trials: u64,
        /// Shard.
        shard: Shard,
    },
    /// Trials done so far.
    Progress {
        /// Done.
        done: u64,
        /// Of.
        total: u64,
        /// Seconds since start.
        elapsed_s: f64,
    },
    /// A distinct finding.
    Finding(Finding),
    /// The run is over.
    Done(Box<Report>),
    /// The chunks finished so far, as a report marked incomplete: where a stopped run resumes.
    Checkpoint(Box<Report>),
    /// A fuzz run starts.
    FuzzStart {
        /// Target A.
        target: TargetInfo,
        /// Target B.
        vs: Option<TargetInfo>,
        /// The seed.
        seed: u64,
        /// Cases to run (`None`: until the time limit).
        cases: Option<u64>,
        /// Shortest generated trace.
        min_len: usize,
        /// Longest generated trace.
        max_len: usize,
        /// Time limit in seconds.
        time_s: Option<f64>,
    },
    /// A fuzz failure was shrunk.
    Shrunk {
        /// Oracle.
        oracle: OracleId,
        /// Kind of violation.
        kind: String,
        /// The case that failed.
        case: u64,
        /// Its length.
        length: usize,
        /// Its first failing step.
        step: usize,
        /// Length after shrinking.
        shrunk_len: usize,
        /// Target executions the shrink took.
        executions: u64,
        /// Seconds the shrink took.
        elapsed_s: f64,
        /// False if it came to a finding already made.
        new: bool,
    },
    /// A fuzz failure did not happen again when its case was replayed to shrink it.
    NotReproduced {
        /// Oracle.
        oracle: OracleId,
        /// Kind of violation.
        kind: String,
        /// The case that failed.
        case: u64,
        /// Its failing step.
        step: usize,
    },
}
