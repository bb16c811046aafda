//! Oracles: judge observations. They never drive a target; they read observations only.
//!
//! - **I1**, accessor exactness (shared/seeds/004, "Result" 1): `seq_pos_min`/`seq_pos_max` equal
//!   the smallest/largest position among the sequence's cells *in its own serialized state*,
//!   -1/-1 when it has none. llama.h: "return -1 if the sequence is empty".
//! - **I2**, contiguity (shared/seeds/004, "Result" 2; llama.h on `llama_memory_seq_pos_max`:
//!   "all positions in the range [pos_min, pos_max] are guaranteed to be present in the memory").
//!   Checked on the serialized cells' own extremes, so that I2 speaks of the resident set and a
//!   stale accessor is I1's finding alone.
//! - **Differential**: two targets given the same trace give the same observation after every
//!   op: the same decode return code, the same accessor answers and the same resident positions
//!   as multisets per sequence (cell order is an implementation detail and is not compared).
//! - **Crash**: the target aborted, was killed by a signal or hung (see the runner).

pub mod theorems;

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::base::op::SeqId;
use crate::base::target::{OpOutcome, SeqObservation, StepObservation};

/// Which oracle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum OracleId {
    /// Accessor exactness.
    I1,
    /// Contiguity of the resident positions.
    I2,
    /// Two targets agree.
    #[serde(rename = "differential")]
    Differential,
    /// The target crashed.
    #[serde(rename = "crash")]
    Crash,
}

impl OracleId {
    /// Every oracle, in report order.
    pub const ALL: [OracleId; 4] = [
        OracleId::I1,
        OracleId::I2,
        OracleId::Differential,
        OracleId::Crash,
    ];

    /// The name used in reports and files.
    pub fn name(self) -> &'static str {
        match self {
            OracleId::I1 => "I1",
            OracleId::I2 => "I2",
            OracleId::Differential => "differential",
            OracleId::Crash => "crash",
        }
    }

    /// Looks an oracle up by name.
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|o| o.name().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for OracleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One violated property at one step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Violation {
    /// Which oracle.
    pub oracle: OracleId,
    /// A short class of the violation, used to tell findings apart (e.g. `pos_max stale`).
    pub kind: String,
    /// The sequence concerned, where there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<SeqId>,
    /// What the target said.
    pub observed: Value,
    /// What the oracle expected.
    pub expected: Value,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.oracle, self.kind)?;
        if let Some(s) = self.seq {
            write!(f, " (seq {s})")?;
        }
        write!(f, ": observed {} expected {}", self.observed, self.expected)
    }
}

fn true_extremes(s: &SeqObservation) -> (i32, i32) {
    (
        s.cells.first().copied().unwrap_or(-1),
        s.cells.last().copied().unwrap_or(-1),
    )
}

/// I1 holds on one sequence (no allocation: the explorer's hot path).
pub fn i1_holds(s: &SeqObservation) -> bool {
    (s.pos_min, s.pos_max) == true_extremes(s)
}

/// I2 holds on one sequence: sorted cells never skip a position.
pub fn i2_holds(s: &SeqObservation) -> bool {
    s.cells.windows(2).all(|w| w[1] - w[0] <= 1)
}

/// The differential oracle holds on one step.
pub fn differential_holds(a: &StepObservation, b: &StepObservation) -> bool {
    same_outcome(&a.outcome, &b.outcome)
        && a.seqs.len() == b.seqs.len()
        && a.seqs
            .iter()
            .zip(&b.seqs)
            .all(|(x, y)| x.cells == y.cells && x.pos_min == y.pos_min && x.pos_max == y.pos_max)
}

fn same_outcome(a: &OpOutcome, b: &OpOutcome) -> bool {
    match (a, b) {
        (OpOutcome::Done { returned: x }, OpOutcome::Done { returned: y }) => x == y,
        (OpOutcome::Decoded { rc: x }, OpOutcome::Decoded { rc: y }) => x == y,
        (OpOutcome::Refused { .. }, OpOutcome::Refused { .. }) => true,
        (OpOutcome::Unsupported { .. }, OpOutcome::Unsupported { .. }) => true,
        _ => false,
    }
}

/// Whether each oracle holds on a step: (I1, I2), over every observed sequence.
pub fn invariants_hold(step: &StepObservation) -> (bool, bool) {
    (
        step.seqs.iter().all(i1_holds),
        step.seqs.iter().all(i2_holds),
    )
}

/// I1 on one sequence.
pub fn check_i1(s: &SeqObservation) -> Option<Violation> {
    if i1_holds(s) {
        return None;
    }
    let (min, max) = true_extremes(s);
    let which = match (s.pos_min != min, s.pos_max != max) {
        (true, true) => "pos_min and pos_max",
        (true, false) => "pos_min",
        _ => "pos_max",
    };
    let kind = if s.cells.is_empty() {
        format!("{which} stale on an empty sequence")
    } else {
        format!("{which} disagree with the cells")
    };
    Some(Violation {
        oracle: OracleId::I1,
        kind,
        seq: Some(s.seq),
        observed: json!({ "pos_min": s.pos_min, "pos_max": s.pos_max }),
        expected: json!({ "pos_min": min, "pos_max": max, "cells": s.cells }),
    })
}

/// I2 on one sequence: the positions missing from [min, max] of the resident cells.
pub fn check_i2(s: &SeqObservation) -> Option<Violation> {
    if i2_holds(s) {
        return None;
    }
    let (min, max) = true_extremes(s);
    let mut missing = Vec::new();
    let mut next = min;
    for &p in &s.cells {
        while next < p {
            missing.push(next);
            next += 1;
        }
        next = p + 1;
    }
    if missing.is_empty() {
        return None;
    }
    Some(Violation {
        oracle: OracleId::I2,
        kind: "hole in [pos_min, pos_max]".into(),
        seq: Some(s.seq),
        observed: json!({ "cells": s.cells, "missing": missing }),
        expected: json!({ "cells": (min..=max).collect::<Vec<_>>() }),
    })
}

/// I1 and I2 on every observed sequence of one step; the first violation of each oracle.
pub fn check_invariants(step: &StepObservation) -> (Option<Violation>, Option<Violation>) {
    let i1 = step.seqs.iter().find_map(check_i1);
    let i2 = step.seqs.iter().find_map(check_i2);
    (i1, i2)
}

fn outcome_class(o: &OpOutcome) -> Value {
    match o {
        OpOutcome::Done { returned } => json!({ "outcome": "done", "returned": returned }),
        OpOutcome::Decoded { rc } => json!({ "outcome": "decoded", "rc": rc }),
        OpOutcome::Refused { .. } => json!({ "outcome": "refused" }),
        OpOutcome::Unsupported { .. } => json!({ "outcome": "unsupported" }),
    }
}

/// The differential oracle on one step: target A's observation against target B's.
pub fn check_differential(a: &StepObservation, b: &StepObservation) -> Option<Violation> {
    if differential_holds(a, b) {
        return None;
    }
    let (oa, ob) = (outcome_class(&a.outcome), outcome_class(&b.outcome));
    if oa != ob {
        return Some(Violation {
            oracle: OracleId::Differential,
            kind: "op outcome differs".into(),
            seq: None,
            observed: oa,
            expected: ob,
        });
    }
    for (sa, sb) in a.seqs.iter().zip(&b.seqs) {
        let kind = if sa.cells != sb.cells {
            "resident positions differ"
        } else if sa.pos_min != sb.pos_min || sa.pos_max != sb.pos_max {
            "accessors differ"
        } else {
            continue;
        };
        let view = |s: &SeqObservation| json!({ "pos_min": s.pos_min, "pos_max": s.pos_max, "cells": s.cells });
        return Some(Violation {
            oracle: OracleId::Differential,
            kind: kind.into(),
            seq: Some(sa.seq),
            observed: view(sa),
            expected: view(sb),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(pos_min: i32, pos_max: i32, cells: &[i32]) -> SeqObservation {
        SeqObservation {
            seq: 1,
            pos_min,
            pos_max,
            cells: cells.to_vec(),
        }
    }

    #[test]
    fn i1_accepts_exact_accessors_and_the_empty_answer() {
        assert!(check_i1(&seq(0, 6, &[0, 1, 5, 6])).is_none());
        assert!(check_i1(&seq(-1, -1, &[])).is_none());
        assert!(check_i1(&seq(0, 0, &[0, 0])).is_none());
    }

    #[test]
    fn i1_positive_control_stale_on_empty() {
        let v = check_i1(&seq(0, 2, &[])).expect("stale extremum must be caught");
        assert_eq!(v.kind, "pos_min and pos_max stale on an empty sequence");
        assert_eq!(v.expected["pos_max"], -1);
    }

    #[test]
    fn i1_positive_control_forced_mismatch() {
        let v = check_i1(&seq(0, 6, &[0, 1, 2, 3, 6, 7, 8])).unwrap();
        assert_eq!(v.kind, "pos_max disagree with the cells");
    }

    #[test]
    fn i2_finds_the_injected_hole() {
        let v = check_i2(&seq(0, 6, &[0, 1, 5, 6])).expect("hole must be caught");
        assert_eq!(v.observed["missing"], json!([2, 3, 4]));
        assert!(check_i2(&seq(0, 6, &[0, 1, 2, 3, 4, 5, 6])).is_none());
        assert!(check_i2(&seq(0, 1, &[0, 0, 1, 1])).is_none());
    }

    #[test]
    fn differential_compares_multisets_not_order() {
        let step = |cells: &[i32], rc: i32| StepObservation {
            outcome: OpOutcome::Decoded { rc },
            seqs: vec![seq(0, 2, cells)],
        };
        assert!(check_differential(&step(&[0, 1, 2], 0), &step(&[0, 1, 2], 0)).is_none());
        assert_eq!(
            check_differential(&step(&[0, 1, 2], 0), &step(&[0, 1, 2], -1))
                .unwrap()
                .kind,
            "op outcome differs"
        );
        assert_eq!(
            check_differential(&step(&[0, 1, 2], 0), &step(&[0, 1, 1, 2], 0))
                .unwrap()
                .kind,
            "resident positions differ"
        );
    }
}
