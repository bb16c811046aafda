//! **failed-restore**: a state load that returns 0 leaves the memory as llama.h allows (issue
//! 24 item 4; upstream #27530 and #27068: a failed restore leaves data behind).
//!
//! llama.h says of `llama_state_seq_set_data` only "Copy the sequence data ... into the
//! specified sequence. Returns: Positive: Ok, Zero: Failed to load" (include/llama.h:893-900 in
//! 0.1.161), and of `llama_state_set_data` "Set the state reading from the specified address.
//! Returns the number of bytes read". The contract kvaudit reads from those words: a load that
//! failed loaded nothing, so
//!
//! - after a sequence load that returned 0, no sequence but the destination changed (the call
//!   names one sequence), and the destination is as it was or empty (llama.cpp removes the
//!   destination's cells before it reads the new ones, src/llama-kv-cache.cpp `state_read_meta`,
//!   so "as it was" cannot be promised; anything else is part of the bytes left behind);
//! - after a whole load that returned 0, the memory is as it was or empty: every observed
//!   sequence unchanged, or every one empty (a whole load empties the memory first, `clear(true)`
//!   in `llama_kv_cache::state_read`), never some of the bytes.
//!
//! "Changed" and "empty" are judged on everything a sequence's observation holds, for every
//! memory type: the accessors (`seq_pos_min`/`seq_pos_max`, -1 when empty) and the cells of both
//! parts of its dump (an iSWA memory's windowed cache, a hybrid's recurrent states). The next
//! decode's logits of the sequences a failed sequence load must leave alone are judged by
//! cache-invisible (the token model keeps them, `base/tokens`); the destination's and, after a
//! failed whole load, every sequence's are not: the token model cannot tell which of the two
//! allowed outcomes llama.cpp took until this oracle has read the observation.

use serde_json::json;

use super::{Oracle, OracleId, PositiveControl, Reads, Seen, Violation};
use crate::base::cache::{Observe, OpOutcome, SeqObservation, StepObservation};
use crate::base::op::{Op, SeqId};

/// Its id.
pub const ID: OracleId = OracleId::builtin(18, "failed-restore");

/// The kind: another sequence changed in a failed sequence load.
pub const OTHER_CHANGED: &str = "failed seq load changed another sequence";
/// The kind: the destination of a failed sequence load holds something new.
pub const DEST_LEFT_BEHIND: &str =
    "failed seq load left the destination neither as it was nor empty";
/// The kind: a failed whole load left part of the memory.
pub const WHOLE_LEFT_BEHIND: &str = "failed whole load left the memory neither as it was nor empty";

/// Whether a sequence's observation is of an empty sequence: no cells in any part, and the
/// accessors' -1.
pub fn is_empty(s: &SeqObservation) -> bool {
    s.pos_min == -1
        && s.pos_max == -1
        && s.cells.is_empty()
        && s.second_cells.as_ref().is_none_or(Vec::is_empty)
        && s.third_cells.as_ref().is_none_or(Vec::is_empty)
}

fn summary(s: &SeqObservation) -> serde_json::Value {
    let mut v = json!({
        "pos_min": s.pos_min,
        "pos_max": s.pos_max,
        "cells": s.cells,
        "second_cells": s.second_cells,
    });
    // Only the hybrid-iSWA's memory has a third part (its recurrent states).
    if let Some(third) = &s.third_cells {
        v["third_cells"] = json!(third);
    }
    v
}

/// The first breach of the failed-load contract in `after` (against `after.before`) after
/// `op`, if any: `None` also when the op is no load, the load did not return 0, or the
/// sequences before it were not observed.
pub fn check_failed_restore(op: &Op, after: &StepObservation) -> Option<Violation> {
    if after.outcome
        != (OpOutcome::Done {
            returned: Some(false),
        })
    {
        return None;
    }
    let before = after.before.as_ref()?;
    let pairs = || {
        before
            .iter()
            .filter_map(|b| Some((b, after.seqs.iter().find(|a| a.seq == b.seq)?)))
    };
    let violation = |kind: &str, seq: SeqId, b: &SeqObservation, a: &SeqObservation| Violation {
        oracle: ID,
        kind: kind.into(),
        seq: Some(seq),
        observed: summary(a),
        expected: json!({ "as it was": summary(b), "or empty": kind != OTHER_CHANGED }),
    };
    if let Op::StateSeqLoad { seq: dest, .. } = op {
        if let Some((b, a)) = pairs().find(|(b, a)| b.seq != *dest && b != a) {
            return Some(violation(OTHER_CHANGED, b.seq, b, a));
        }
        return pairs()
            .find(|(b, a)| b.seq == *dest && b != a && !is_empty(a))
            .map(|(b, a)| violation(DEST_LEFT_BEHIND, b.seq, b, a));
    }
    if op.kind() == crate::base::op::OpKind::StateLoad {
        let unchanged = pairs().all(|(b, a)| b == a);
        let emptied = pairs().all(|(_, a)| is_empty(a));
        if !unchanged && !emptied {
            // The first sequence that is neither as it was nor empty, or else the first that
            // changed (each alone is allowed; together they are part of the bytes).
            let (b, a) = pairs()
                .find(|(b, a)| b != a && !is_empty(a))
                .or_else(|| pairs().find(|(b, a)| b != a))?;
            return Some(violation(WHOLE_LEFT_BEHIND, b.seq, b, a));
        }
    }
    None
}

/// The oracle, as a value ([`Oracle`]).
pub static FAILED_RESTORE: Oracle = Oracle {
    id: ID,
    summary: "a state load that returns 0 leaves the other sequences as they were and the destination as it was or empty",
    reads: Reads::Step,
    kinds: &[OTHER_CHANGED, DEST_LEFT_BEHIND, WHOLE_LEFT_BEHIND],
    positive_controls: &[
        PositiveControl {
            fault: "failed_seq_load_clears_all",
            target: "native[failed_seq_load_clears_all] (domain state)",
            seed_depth: None,
            evidence: "oracles/failed_restore_clears_all.json",
        },
        PositiveControl {
            fault: "dsa_failed_read_keeps_mla",
            target: "native[dsa_failed_read_keeps_mla] (domain dsa)",
            seed_depth: None,
            evidence: "oracles/failed_restore_dsa_failed_read_keeps_mla.json",
        },
        PositiveControl {
            fault: "failed_seq_load_clears_all",
            target: "native[failed_seq_load_clears_all] (arch=lfm2_swa)",
            seed_depth: None,
            evidence: "oracles/failed_restore_clears_all_hybrid_iswa.json",
        },
        PositiveControl {
            fault: "failed_seq_load_clears_all",
            target: "native[failed_seq_load_clears_all] (arch=minimax-m3)",
            seed_depth: None,
            evidence: "oracles/failed_restore_clears_all_msa.json",
        },
        PositiveControl {
            fault: "failed_seq_load_clears_all",
            target: "native[failed_seq_load_clears_all] (arch=qwen4exp)",
            seed_depth: None,
            evidence: "oracles/failed_restore_clears_all_hybrid_idx.json",
        },
        PositiveControl {
            fault: "none: the windowed part fails after the DSA part loaded",
            target: "native (domain dsa_iswa, loads cut at 200)",
            seed_depth: None,
            evidence: "oracles/failed_restore_dsa_iswa_windowed_part_keeps_the_dsa_part.json",
        },
        PositiveControl {
            fault: "llama.cpp's own: a load cut inside the raw pair's base cache keeps the windowed cache",
            target: "llama.cpp@0.1.161 (arch=deepseek4)",
            seed_depth: None,
            evidence: "oracles/failed_restore_dsv4_cut_load_keeps_the_windowed_cache.json",
        },
    PositiveControl { fault: "load_trims_first", target: "mlx-lm@0.32.2[load_trims_first]", seed_depth: None, evidence: "audits/mlx_load_trims_first_d2.json" },
    ],
    observes: Observe {
        before: true,
        ..Observe::BASIC
    },
    check: violation_on,
    ..Oracle::DEFAULTS
};

fn violation_on(seen: &Seen<'_>) -> Option<Violation> {
    match seen {
        Seen::Step { op, after, .. } => check_failed_restore(op, after),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::op::Slot;

    fn seq(seq: SeqId, cells: &[i32]) -> SeqObservation {
        SeqObservation {
            seq,
            pos_min: cells.first().copied().unwrap_or(-1),
            pos_max: cells.last().copied().unwrap_or(-1),
            cells: cells.to_vec(),
            second_cells: None,
            third_cells: None,
        }
    }

    fn step(before: Vec<SeqObservation>, after: Vec<SeqObservation>) -> StepObservation {
        let mut s = StepObservation::basic(
            OpOutcome::Done {
                returned: Some(false),
            },
            after,
        );
        s.before = Some(before);
        s
    }

    fn seq_load(dest: SeqId) -> Op {
        Op::StateSeqLoad {
            seq: dest,
            slot: Slot::new("a").unwrap(),
            flags: 0,
            truncate: Some(12),
            flip: None,
        }
    }

    #[test]
    fn a_failed_seq_load_may_empty_its_destination_only() {
        let b = vec![seq(0, &[0, 1]), seq(1, &[0])];
        let ok = step(b.clone(), vec![seq(0, &[]), seq(1, &[0])]);
        assert!(check_failed_restore(&seq_load(0), &ok).is_none());
        let other = step(b.clone(), vec![seq(0, &[0, 1]), seq(1, &[])]);
        assert_eq!(
            check_failed_restore(&seq_load(0), &other).unwrap().kind,
            OTHER_CHANGED
        );
        let part = step(b, vec![seq(0, &[0]), seq(1, &[0])]);
        assert_eq!(
            check_failed_restore(&seq_load(0), &part).unwrap().kind,
            DEST_LEFT_BEHIND
        );
    }

    #[test]
    fn a_failed_whole_load_is_all_or_nothing() {
        let load = Op::StateLoad {
            slot: Slot::new("s").unwrap(),
            truncate: Some(12),
            flip: None,
        };
        let b = vec![seq(0, &[0, 1]), seq(1, &[0])];
        let emptied = step(b.clone(), vec![seq(0, &[]), seq(1, &[])]);
        assert!(check_failed_restore(&load, &emptied).is_none());
        let half = step(b, vec![seq(0, &[0, 1]), seq(1, &[])]);
        let v = check_failed_restore(&load, &half).unwrap();
        assert_eq!((v.kind.as_str(), v.seq), (WHOLE_LEFT_BEHIND, Some(1)));
    }
}
