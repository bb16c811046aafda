//! Findings: one violated property with its smallest representative trace, the key that tells
//! findings apart, and per-oracle counts. Plain data.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::base::op::{SeqId, Trace};
use crate::oracles::OracleId;

/// Per-oracle figures.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OracleStats {
    /// Trials on which the oracle was evaluated.
    pub checked: u64,
    /// Trials whose last step violated it.
    pub violations: u64,
    /// Shortest violating trial length.
    pub first_depth: Option<u32>,
}

impl OracleStats {
    /// Adds `o` into `self`.
    pub fn merge(&mut self, o: &OracleStats) {
        self.checked += o.checked;
        self.violations += o.violations;
        self.first_depth = match (self.first_depth, o.first_depth) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// One distinct finding with its smallest representative trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// Which oracle.
    pub oracle: OracleId,
    /// The class of violation.
    pub kind: String,
    /// The target (or `A vs B`) it was seen on.
    pub target: String,
    /// Length of the representative trace.
    pub depth: u32,
    /// Global index of the representative trial in the enumeration order.
    pub trial_index: u64,
    /// 1-based step at which the violation is observed.
    pub step: usize,
    /// The sequence concerned, where there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<SeqId>,
    /// The representative trace (setup + ops, as op JSON).
    pub trace: Trace,
    /// What the target said at that step.
    pub observed: Value,
    /// What the oracle expected.
    pub expected: Value,
}

/// What makes two findings the same finding: oracle, target, kind of violation and the op at
/// the violating step (and, for a fuzz run, the shape of the minimal trace). Each key keeps one
/// representative.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FindingKey {
    /// The oracle.
    pub oracle: OracleId,
    /// The target (or `A vs B`).
    pub target: String,
    /// The kind of violation.
    pub kind: String,
    /// The name of the op at the violating step.
    pub op: &'static str,
    /// The shape of the shrunk trace, for fuzz findings (empty for exhaustive runs, whose
    /// representative is the smallest trial).
    pub shape: String,
}

impl FindingKey {
    /// The key of a finding not yet built.
    pub fn new(oracle: OracleId, target: &str, kind: &str, op: &'static str) -> FindingKey {
        FindingKey {
            oracle,
            target: target.into(),
            kind: kind.into(),
            op,
            shape: String::new(),
        }
    }
}

impl Finding {
    /// This finding's key.
    pub fn key(&self) -> FindingKey {
        FindingKey::new(self.oracle, &self.target, &self.kind, self.failing_op())
    }

    /// The name of the op at the failing step, `setup` when the violation happened in the
    /// setup: step 0, or a step past the trace's ops (a worker reports a crash of the reset at
    /// step 1, and a shrink may leave no op after it).
    pub fn failing_op(&self) -> &'static str {
        match self.step {
            0 => "setup",
            s => self.trace.ops.get(s - 1).map_or("setup", |op| op.name()),
        }
    }
}
