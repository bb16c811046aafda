//! The summary's memory type x oracle table: one row per pair, counted by `HuntSummary::table`.

use crate::base::config::MemoryType;
use crate::oracles::OracleId;

/// One row of the memory type x oracle table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableRow {
    /// The memory type.
    pub memory: MemoryType,
    /// The oracle.
    pub oracle: OracleId,
    /// Trials judged.
    pub judged: u64,
    /// Trials violated.
    pub violations: u64,
    /// Groups by class.
    pub new: u64,
    /// Known groups.
    pub known: u64,
    /// Regressed groups.
    pub regressed: u64,
    /// Groups a decision covers.
    pub decided: u64,
    /// Corpus findings fixed.
    pub fixed: u64,
    pub(super) counted: Vec<usize>,
}

/// The columns of the memory type x oracle table.
pub(super) const COLUMNS: [&str; 9] = [
    "memory",
    "oracle",
    "judged",
    "violations",
    "new",
    "known",
    "regressed",
    "decided",
    "fixed",
];

impl TableRow {
    /// The row's cells, in [`COLUMNS`] order.
    pub(super) fn cells(&self) -> [String; 9] {
        [
            self.memory.name().to_string(),
            self.oracle.name().to_string(),
            self.judged.to_string(),
            self.violations.to_string(),
            self.new.to_string(),
            self.known.to_string(),
            self.regressed.to_string(),
            self.decided.to_string(),
            self.fixed.to_string(),
        ]
    }

    pub(super) fn new(memory: MemoryType, oracle: OracleId) -> TableRow {
        TableRow {
            memory,
            oracle,
            judged: 0,
            violations: 0,
            new: 0,
            known: 0,
            regressed: 0,
            decided: 0,
            fixed: 0,
            counted: Vec::new(),
        }
    }
}
