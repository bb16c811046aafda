//! **I1**, accessor exactness (shared/seeds/004, "Result" 1): `seq_pos_min`/`seq_pos_max` equal
//! the smallest/largest position present for the sequence *in its own serialized state*, -1/-1
//! when it has none. llama.h on `llama_memory_seq_pos_min`/`_max`: "return -1 if the sequence is
//! empty". Checked on every observed sequence. What "present" means for each memory type (and
//! why an iSWA memory's `pos_min` is bounded rather than pinned by its dumps) is
//! [`super::memory`]'s.

use serde_json::json;

use super::memory::allowed;
use super::{Oracle, OracleId, PositiveControl, Reads, Seen, Violation};
use crate::base::cache::SeqObservation;
use crate::base::op::MemoryType;

/// llama.h's words that I1 checks (the comments of `llama_memory_seq_pos_min` and
/// `llama_memory_seq_pos_max`, the same in every pin kvaudit builds), quoted by bug reports.
pub const LLAMA_H: [&str; 4] = [
    "Returns the smallest position present in the memory for the specified sequence",
    "Returns the largest position present in the memory for the specified sequence",
    "Return -1 if the sequence is empty",
    "(llama.h, comments of llama_memory_seq_pos_min and llama_memory_seq_pos_max)",
];

/// Every kind I1 reports, one table that [`check_i1`] picks from: which accessors are wrong
/// (pos_min, pos_max, both), on an empty sequence, then on one with cells.
const KINDS: [&str; 6] = [
    "pos_min stale on an empty sequence",
    "pos_max stale on an empty sequence",
    "pos_min and pos_max stale on an empty sequence",
    "pos_min disagree with the cells",
    "pos_max disagree with the cells",
    "pos_min and pos_max disagree with the cells",
];

/// I1 holds on one sequence of a `memory` (no allocation: the explorer's hot path).
pub fn i1_holds(memory: MemoryType, s: &SeqObservation) -> bool {
    allowed(memory, s).admits(s)
}

/// I1 on one sequence of a `memory`.
pub fn check_i1(memory: MemoryType, s: &SeqObservation) -> Option<Violation> {
    let allowed = allowed(memory, s);
    if allowed.admits(s) {
        return None;
    }
    let min_ok = (allowed.min.0..=allowed.min.1).contains(&s.pos_min);
    // Which accessors are wrong (0: pos_min, 1: pos_max, 2: both).
    let which = match (!min_ok, s.pos_max != allowed.max) {
        (true, true) => 2,
        (true, false) => 0,
        _ => 1,
    };
    let min = if allowed.min.0 == allowed.min.1 {
        json!(allowed.min.0)
    } else {
        json!([allowed.min.0, allowed.min.1])
    };
    let mut expected = json!({ "pos_min": min, "pos_max": allowed.max, "cells": s.cells });
    if let Some(second) = &s.second_cells {
        expected["second_cells"] = json!(second);
    }
    if let Some(third) = &s.third_cells {
        expected["third_cells"] = json!(third);
    }
    if memory != MemoryType::Kv {
        expected["memory"] = json!(memory);
    }
    let empty = super::memory::present(memory, s).next().is_none();
    let kind = KINDS[which + if empty { 0 } else { 3 }];
    Some(Violation {
        oracle: OracleId::I1,
        kind: kind.to_string(),
        seq: Some(s.seq),
        observed: json!({ "pos_min": s.pos_min, "pos_max": s.pos_max }),
        expected,
    })
}

/// The oracle, as a value ([`Oracle`]).
pub static I1: Oracle = Oracle {
    id: OracleId::I1,
    summary: "seq_pos_min/seq_pos_max equal the extremes of the sequence's cells in its serialized state (-1 when empty)",
    reads: Reads::Step,
    kinds: &KINDS,
    positive_controls: &[
        PositiveControl {
            fault: "refcount",
            target: "native[refcount]",
            seed_depth: Some(3),
            evidence: "audits/native_refcount_d3.json",
        },
        PositiveControl {
            fault: "hybrid_rm_one_side",
            target: "native[hybrid_rm_one_side]",
            seed_depth: None,
            evidence: "oracles/i1_hybrid_rm_one_side.json",
        },
        PositiveControl {
            fault: "seq_add_stale_index",
            target: "native[seq_add_stale_index]",
            seed_depth: Some(1),
            evidence: "audits/native_seq_add_stale_index_d2.json",
        },
        PositiveControl {
            fault: "hybrid_rm_one_side",
            target: "native[hybrid_rm_one_side] (arch=lfm2_swa)",
            seed_depth: None,
            evidence: "oracles/i1_hybrid_rm_one_side_hybrid_iswa.json",
        },
        PositiveControl {
            fault: "seq_add_stale_index",
            target: "native[seq_add_stale_index] (arch=minimax-m3)",
            seed_depth: None,
            evidence: "oracles/i1_seq_add_stale_index_msa.json",
        },
        PositiveControl {
            fault: "hybrid_rm_one_side",
            target: "native[hybrid_rm_one_side] (arch=qwen4exp)",
            seed_depth: None,
            evidence: "oracles/i1_hybrid_rm_one_side_hybrid_idx.json",
        },
        PositiveControl {
            fault: "seq_add_stale_index",
            target: "native[seq_add_stale_index] (domain dsa_iswa)",
            seed_depth: None,
            evidence: "oracles/i1_seq_add_stale_index_dsa_iswa.json",
        },
        PositiveControl {
            fault: "seq_add_stale_index",
            target: "native[seq_add_stale_index] (arch=glm-dsa)",
            seed_depth: None,
            evidence: "oracles/i1_seq_add_stale_index_dsa.json",
        },
        PositiveControl {
            fault: "llama.cpp's own: a load cut inside the raw pair's base cache keeps the windowed cache",
            target: "llama.cpp@0.1.161 (arch=deepseek4)",
            seed_depth: None,
            evidence: "oracles/failed_restore_dsv4_cut_load_keeps_the_windowed_cache.json",
        },
    PositiveControl { fault: "stale_offset", target: "mlx-lm@0.32.2[stale_offset]", seed_depth: None, evidence: "audits/mlx_stale_offset_d1.json" },
    PositiveControl { fault: "stale_offset", target: "mlx-lm@0.32.2[stale_offset] (llama4)", seed_depth: None, evidence: "audits/mlx_llama4_stale_offset_d1.json" },
    ],
    holds: Some(holds_on),
    check: violation_on,
    ..Oracle::DEFAULTS
};

fn holds_on(seen: &Seen<'_>) -> bool {
    match seen {
        Seen::Step { after, arch, .. } => after.seqs.iter().all(|s| i1_holds(arch.memory(), s)),
        _ => true,
    }
}

fn violation_on(seen: &Seen<'_>) -> Option<Violation> {
    match seen {
        Seen::Step { after, arch, .. } => {
            after.seqs.iter().find_map(|s| check_i1(arch.memory(), s))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn seq(pos_min: i32, pos_max: i32, cells: &[i32]) -> SeqObservation {
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
    fn i1_accepts_exact_accessors_and_the_empty_answer() {
        assert!(check_i1(MemoryType::Kv, &seq(0, 6, &[0, 1, 5, 6])).is_none());
        assert!(check_i1(MemoryType::Kv, &seq(-1, -1, &[])).is_none());
        assert!(check_i1(MemoryType::Kv, &seq(0, 0, &[0, 0])).is_none());
    }

    #[test]
    fn i1_positive_control_stale_on_empty() {
        let v = check_i1(MemoryType::Kv, &seq(0, 2, &[])).expect("stale extremum must be caught");
        assert_eq!(v.kind, "pos_min and pos_max stale on an empty sequence");
        assert_eq!(v.expected["pos_max"], -1);
        assert!(I1.kinds().contains(&v.kind.as_str()));
    }

    #[test]
    fn i1_positive_control_forced_mismatch() {
        let v = check_i1(MemoryType::Kv, &seq(0, 6, &[0, 1, 2, 3, 6, 7, 8])).unwrap();
        assert_eq!(v.kind, "pos_max disagree with the cells");
    }
}
