//! **Differential**: two targets given the same trace give the same observation after every op:
//! the same op outcome (decode return code, `seq_rm`'s boolean), the same accessor answers and
//! the same resident positions as multisets per sequence (cell order is an implementation detail
//! and is not compared).

use serde_json::{json, Value};

use super::{Oracle, OracleId, PositiveControl, Reads, Seen, Violation};
use crate::base::cache::{OpOutcome, SeqObservation, StepObservation};

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
            oracle: OracleId::DIFFERENTIAL,
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
            oracle: OracleId::DIFFERENTIAL,
            kind: kind.into(),
            seq: Some(sa.seq),
            observed: view(sa),
            expected: view(sb),
        });
    }
    None
}

/// The oracle, as a value ([`Oracle`]).
pub static DIFFERENTIAL: Oracle = Oracle {
    id: OracleId::DIFFERENTIAL,
    summary: "two targets given the same trace agree after every op: outcome, accessors, resident positions",
    reads: Reads::Pair,
    kinds: &[
        "op outcome differs",
        "resident positions differ",
        "accessors differ",
    ],
    positive_controls: &[
        PositiveControl {
            fault: "seq_rm_off_by_one",
            target: "native vs native[seq_rm_off_by_one]",
            seed_depth: Some(1),
            evidence: "audits/native_vs_off_by_one_d1.json",
        },
        PositiveControl {
            fault: "refcount",
            target: "native vs native[refcount]",
            seed_depth: Some(3),
            evidence: "audits/native_vs_refcount_d3.json",
        },
        PositiveControl {
            fault: "seq_rm_off_by_one",
            target: "native vs native[seq_rm_off_by_one] (arch=lfm2_swa)",
            seed_depth: None,
            evidence: "oracles/differential_seq_rm_off_by_one_hybrid_iswa.json",
        },
        PositiveControl {
            fault: "seq_rm_off_by_one",
            target: "native vs native[seq_rm_off_by_one] (arch=minimax-m3)",
            seed_depth: None,
            evidence: "oracles/differential_seq_rm_off_by_one_msa.json",
        },
        PositiveControl {
            fault: "seq_rm_off_by_one",
            target: "native vs native[seq_rm_off_by_one] (arch=qwen4exp)",
            seed_depth: None,
            evidence: "oracles/differential_seq_rm_off_by_one_hybrid_idx.json",
        },
        PositiveControl {
            fault: "seq_rm_off_by_one",
            target: "native vs native[seq_rm_off_by_one] (domain dsa_iswa)",
            seed_depth: None,
            evidence: "oracles/differential_seq_rm_off_by_one_dsa_iswa.json",
        },
        PositiveControl {
            fault: "seq_rm_off_by_one",
            target: "native vs native[seq_rm_off_by_one] (arch=glm-dsa)",
            seed_depth: None,
            evidence: "oracles/differential_seq_rm_off_by_one_dsa.json",
        },
        PositiveControl {
            fault: "0.1.156's whole load loses sequence 0 (its own bug, fixed by 0.1.157)",
            target: "llama.cpp@0.1.156 vs llama.cpp@0.1.161 (arch=deepseek4)",
            seed_depth: None,
            evidence: "oracles/differential_dsv4_0156_vs_0161.json",
        },
        PositiveControl {
            fault: "trim_keeps_last",
            target: "llama.cpp@0.1.161 vs mlx-lm@0.32.2[trim_keeps_last]",
            seed_depth: None,
            evidence: "audits/cross_trim_keeps_last_d1.json",
        },
    ],
    holds: Some(holds_on),
    check: violation_on,
    judges: Some(judges_unless_damaged_apart),
    ..Oracle::DEFAULTS
};

fn holds_on(seen: &Seen<'_>) -> bool {
    match seen {
        Seen::Pair { a, b, .. } => differential_holds(a, b),
        _ => true,
    }
}

fn violation_on(seen: &Seen<'_>) -> Option<Violation> {
    match seen {
        Seen::Pair { a, b, .. } => check_differential(a, b),
        _ => None,
    }
}

/// Judges every pair but those after a damaged load of two layouts (`Seen::Pair`'s
/// `damaged_apart`: two different loads, nothing to compare); the config-differential's too.
pub(super) fn judges_unless_damaged_apart(seen: &Seen<'_>) -> bool {
    !matches!(
        seen,
        Seen::Pair {
            damaged_apart: true,
            ..
        }
    )
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
            second_cells: None,
            third_cells: None,
        }
    }

    #[test]
    fn differential_compares_multisets_not_order() {
        let step = |cells: &[i32], rc: i32| {
            StepObservation::basic(OpOutcome::Decoded { rc }, vec![seq(0, 2, cells)])
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
