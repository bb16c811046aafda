//! **I2**, contiguity (shared/seeds/004, "Result" 2; llama.h on `llama_memory_seq_pos_max`: "all
//! positions in the range [pos_min, pos_max] are guaranteed to be present in the memory").
//! Checked on the serialized cells' own extremes, so that I2 speaks of the resident set and a
//! stale accessor is I1's finding alone. The positions judged are those present for the memory
//! type ([`super::memory::present`]: an iSWA memory's base cache, a hybrid memory's attention
//! cells within its recurrent range).

use serde_json::json;

use super::memory::present;
use super::{Oracle, OracleId, PositiveControl, Reads, Seen, Violation};
use crate::base::cache::SeqObservation;
use crate::base::op::{MemoryType, Pos};

/// llama.h's words that I2 checks, quoted by bug reports.
pub const LLAMA_H: [&str; 2] = [
    "Note that all positions in the range [pos_min, pos_max] are guaranteed to be present in the memory",
    "(llama.h, comments of llama_memory_seq_pos_min and llama_memory_seq_pos_max)",
];

/// I2 holds on one sequence of a `memory`: its sorted present positions never skip one.
pub fn i2_holds(memory: MemoryType, s: &SeqObservation) -> bool {
    let mut prev: Option<Pos> = None;
    present(memory, s).all(|p| {
        let ok = prev.map_or(true, |q| p - q <= 1);
        prev = Some(p);
        ok
    })
}

/// I2 on one sequence of a `memory`: the positions missing from [min, max] of the present ones.
pub fn check_i2(memory: MemoryType, s: &SeqObservation) -> Option<Violation> {
    if i2_holds(memory, s) {
        return None;
    }
    let cells: Vec<Pos> = present(memory, s).collect();
    let (min, max) = (cells[0], cells[cells.len() - 1]);
    let mut missing = Vec::new();
    let mut next = min;
    for &p in &cells {
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
        observed: json!({ "cells": cells, "missing": missing }),
        expected: json!({ "cells": (min..=max).collect::<Vec<_>>() }),
    })
}

/// The oracle, as a value ([`Oracle`]).
pub static I2: Oracle = Oracle {
    id: OracleId::I2,
    summary: "every position in [pos_min, pos_max] of a sequence's serialized cells is resident",
    reads: Reads::Step,
    kinds: &["hole in [pos_min, pos_max]"],
    // No fault is needed: an interior `seq_rm` leaves a hole in every cache that honours
    // it, llama.cpp's and the native one alike (a documented difference with llama.h).
    positive_controls: &[
        PositiveControl {
            fault: "none: interior seq_rm",
            target: "native",
            seed_depth: Some(1),
            evidence: "audits/native_seed_d3.json",
        },
        PositiveControl {
            fault: "none: interior seq_rm",
            target: "native (arch=minimax-m3)",
            seed_depth: None,
            evidence: "oracles/i2_interior_seq_rm_msa.json",
        },
        PositiveControl {
            fault: "none: interior seq_rm",
            target: "native (domain dsa_iswa)",
            seed_depth: None,
            evidence: "oracles/i2_interior_seq_rm_dsa_iswa.json",
        },
        PositiveControl {
            fault: "none: interior seq_rm",
            target: "native (arch=glm-dsa)",
            seed_depth: None,
            evidence: "oracles/i2_interior_seq_rm_dsa.json",
        },
        PositiveControl {
            fault: "none: seq_add on the memory that cannot shift still moves the raw cells",
            target: "llama.cpp@0.1.161 (arch=deepseek4)",
            seed_depth: None,
            evidence: "oracles/i2_dsv4_seq_add_hole.json",
        },
        // A hybrid's present positions are its attention cells within the states' range,
        // one position while a sequence is in one state cell: a hole needs a sequence in
        // two (`recurrent_seq_cp_keeps_old_state`).
        PositiveControl {
            fault: "recurrent_seq_cp_keeps_old_state",
            target: "native[recurrent_seq_cp_keeps_old_state] (arch=qwen4exp)",
            seed_depth: None,
            evidence: "oracles/i2_recurrent_seq_cp_keeps_old_state_hybrid_idx.json",
        },
        PositiveControl {
            fault: "recurrent_seq_cp_keeps_old_state",
            target: "native[recurrent_seq_cp_keeps_old_state] (arch=lfm2_swa)",
            seed_depth: None,
            evidence: "oracles/i2_recurrent_seq_cp_keeps_old_state_hybrid_iswa.json",
        },
        PositiveControl {
            fault: "recurrent_seq_cp_keeps_old_state",
            target: "native[recurrent_seq_cp_keeps_old_state] (arch=jamba)",
            seed_depth: None,
            evidence: "oracles/i2_recurrent_seq_cp_keeps_old_state_hybrid.json",
        },
        PositiveControl {
            fault: "ring_two_short",
            target: "mlx-lm@0.32.2[ring_two_short]",
            seed_depth: None,
            evidence: "audits/mlx_ring_two_short_d1.json",
        },
    ],
    holds: Some(holds_on),
    check: violation_on,
    ..Oracle::DEFAULTS
};

fn holds_on(seen: &Seen<'_>) -> bool {
    match seen {
        Seen::Step { after, arch, .. } => after.seqs.iter().all(|s| i2_holds(arch.memory(), s)),
        _ => true,
    }
}

fn violation_on(seen: &Seen<'_>) -> Option<Violation> {
    match seen {
        Seen::Step { after, arch, .. } => {
            after.seqs.iter().find_map(|s| check_i2(arch.memory(), s))
        }
        _ => None,
    }
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
    fn i2_finds_the_injected_hole() {
        let v = check_i2(MemoryType::Kv, &seq(0, 6, &[0, 1, 5, 6])).expect("hole must be caught");
        assert_eq!(v.observed["missing"], json!([2, 3, 4]));
        assert!(check_i2(MemoryType::Kv, &seq(0, 6, &[0, 1, 2, 3, 4, 5, 6])).is_none());
        assert!(check_i2(MemoryType::Kv, &seq(0, 1, &[0, 0, 1, 1])).is_none());
    }
}
