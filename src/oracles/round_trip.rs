//! **Round trip**: what is saved comes back. After every op the runner saves the whole context
//! (`llama_state_get_data`) and each observed sequence (`llama_state_seq_get_data`), loads them
//! into an empty twin context of the same configuration (`llama_state_set_data`, and
//! `llama_state_seq_set_data` each sequence alone into the emptied twin), and observes the twin
//! ([`crate::base::cache::RoundTrip`]). The twin must answer the accessors and hold the cells
//! the original does, and a second dump must give the same bytes. A load that fails (returns 0)
//! on bytes the target itself wrote is a finding too: llama.h offers no other way to restore.
//!
//! Per memory type: the cells of both parts must come back (an iSWA memory's windowed dump, a
//! hybrid memory's recurrent states). One exception: an iSWA memory's per-sequence dump leaves
//! out the windowed cells masked for the next token (src/llama-kv-cache.cpp:2098-2102), which
//! the original may still hold and count in `seq_pos_min` (docs/memory-types.md), so after a
//! per-sequence load the twin's `pos_min` may rise from the original's to the dump's smallest
//! position ([`super::memory::reloaded`]). The twin is judged against the original's own
//! answers, which come from its windowed cache (src/llama-kv-cache-iswa.cpp:141-148), never
//! against its base cells: whether those answers are right is I1's question.

use serde_json::json;

use super::memory::{reloaded, Allowed};
use super::{Oracle, OracleId, PositiveControl, Reads, Seen, Violation};
use crate::base::cache::{Observe, SeqObservation, StepObservation};
use crate::base::op::MemoryType;

/// Its id.
pub const ID: OracleId = OracleId::builtin(8, "round-trip");

/// llama.h's words on saving and loading state, which the round trip and conservation check
/// (quoted by bug reports).
pub const LLAMA_H: [&str; 3] = [
    "Copies the state to the specified destination address. (llama_state_get_data)",
    "Set the state reading from the specified address (llama_state_set_data)",
    "Copy the sequence data (originally copied with `llama_state_seq_get_data`) into the specified sequence (llama_state_seq_set_data)",
];

fn seq_view(s: &SeqObservation) -> serde_json::Value {
    let mut v = json!({ "pos_min": s.pos_min, "pos_max": s.pos_max, "cells": s.cells });
    if let Some(second) = &s.second_cells {
        v["second_cells"] = json!(second);
    }
    if let Some(third) = &s.third_cells {
        v["third_cells"] = json!(third);
    }
    v
}

/// Whether the twin `b` gives back the original `a`; `accessors`: the answers `b` may give
/// (exactly `a`'s after a whole load, [`reloaded`] after a per-sequence one).
fn same(a: &SeqObservation, b: &SeqObservation, accessors: Allowed) -> bool {
    accessors.admits(b)
        && a.cells == b.cells
        && a.second_cells == b.second_cells
        && a.third_cells == b.third_cells
}

fn violation(
    kind: &str,
    seq: Option<i32>,
    observed: serde_json::Value,
    expected: serde_json::Value,
) -> Violation {
    Violation {
        oracle: ID,
        kind: kind.into(),
        seq,
        observed,
        expected,
    }
}

/// The first way the round trip in `after` (of a `memory`) differs from `after` itself, if any
/// (`None` also when the target made no round trip).
pub fn check_round_trip(after: &StepObservation, memory: MemoryType) -> Option<Violation> {
    let rt = after.round_trip.as_ref()?;
    if !rt.whole_loaded {
        return Some(violation(
            "whole load failed",
            None,
            json!("llama_state_set_data returned 0"),
            json!("the bytes llama_state_get_data wrote load"),
        ));
    }
    for (orig, twin) in after.seqs.iter().zip(&rt.whole_twin) {
        if !same(orig, twin, Allowed::answered(orig)) {
            return Some(violation(
                "whole load differs",
                Some(orig.seq),
                seq_view(twin),
                seq_view(orig),
            ));
        }
    }
    for (orig, s) in after.seqs.iter().zip(&rt.seqs) {
        if !s.loaded {
            return Some(violation(
                "seq load failed",
                Some(orig.seq),
                json!("llama_state_seq_set_data returned 0"),
                json!("the bytes llama_state_seq_get_data wrote load"),
            ));
        }
        if !same(orig, &s.twin, reloaded(memory, orig)) {
            return Some(violation(
                "seq load differs",
                Some(orig.seq),
                seq_view(&s.twin),
                seq_view(orig),
            ));
        }
    }
    if !rt.whole_same_bytes {
        return Some(violation(
            "whole redump differs",
            None,
            json!("the twin's llama_state_get_data bytes differ"),
            json!("the bytes it was loaded from"),
        ));
    }
    if let Some((orig, _)) = after.seqs.iter().zip(&rt.seqs).find(|(_, s)| !s.same_bytes) {
        return Some(violation(
            "seq redump differs",
            Some(orig.seq),
            json!("the twin's llama_state_seq_get_data bytes differ"),
            json!("the bytes it was loaded from"),
        ));
    }
    None
}

/// The oracle, as a value ([`Oracle`]).
pub static ROUND_TRIP: Oracle = Oracle {
    id: ID,
    summary: "whole and per-sequence state saved after any op loads into a fresh twin and reads back the same",
    reads: Reads::Step,
    kinds: &[
        "whole load failed",
        "whole load differs",
        "seq load failed",
        "seq load differs",
        "whole redump differs",
        "seq redump differs",
    ],
    positive_controls: &[
        PositiveControl {
            fault: "restore_drops_last_cell",
            target: "native[restore_drops_last_cell]",
            seed_depth: Some(1),
            evidence: "oracles/round_trip_restore_drops_last_cell.json",
        },
        PositiveControl {
            fault: "restore_drops_last_cell",
            target: "native[restore_drops_last_cell] (arch=lfm2_swa)",
            seed_depth: None,
            evidence: "oracles/round_trip_restore_drops_last_cell_hybrid_iswa.json",
        },
        PositiveControl {
            fault: "restore_drops_last_cell",
            target: "native[restore_drops_last_cell] (arch=minimax-m3)",
            seed_depth: None,
            evidence: "oracles/round_trip_restore_drops_last_cell_msa.json",
        },
        PositiveControl {
            fault: "restore_drops_last_cell",
            target: "native[restore_drops_last_cell] (arch=qwen4exp)",
            seed_depth: None,
            evidence: "oracles/round_trip_restore_drops_last_cell_hybrid_idx.json",
        },
        PositiveControl {
            fault: "restore_drops_last_cell",
            target: "native[restore_drops_last_cell] (domain dsa_iswa)",
            seed_depth: None,
            evidence: "oracles/round_trip_restore_drops_last_cell_dsa_iswa.json",
        },
        PositiveControl {
            fault: "restore_drops_last_cell",
            target: "native[restore_drops_last_cell] (arch=glm-dsa)",
            seed_depth: None,
            evidence: "oracles/round_trip_restore_drops_last_cell_dsa.json",
        },
        PositiveControl {
            fault: "0.1.156's whole load loses sequence 0 (its own bug, fixed by 0.1.157)",
            target: "llama.cpp@0.1.156 (arch=deepseek4)",
            seed_depth: None,
            evidence: "oracles/round_trip_dsv4_whole_load_loses_seq_0.json",
        },
        PositiveControl {
            fault: "load_drops_row",
            target: "mlx-lm@0.32.2[load_drops_row]",
            seed_depth: None,
            evidence: "audits/mlx_load_drops_row_d1.json",
        },
    ],
    observes: Observe {
        round_trip: true,
        ..Observe::BASIC
    },
    holds: Some(holds_on),
    check: violation_on,
    ..Oracle::DEFAULTS
};

fn holds_on(seen: &Seen<'_>) -> bool {
    match seen {
        Seen::Step { after, arch, .. } => check_round_trip(after, arch.memory()).is_none(),
        _ => true,
    }
}

fn violation_on(seen: &Seen<'_>) -> Option<Violation> {
    match seen {
        Seen::Step { after, arch, .. } => check_round_trip(after, arch.memory()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::cache::{OpOutcome, RoundTrip, SeqRoundTrip};

    fn seq(seq: i32, cells: &[i32]) -> SeqObservation {
        SeqObservation {
            seq,
            pos_min: cells.first().copied().unwrap_or(-1),
            pos_max: cells.last().copied().unwrap_or(-1),
            cells: cells.to_vec(),
            second_cells: None,
            third_cells: None,
        }
    }

    fn step(orig: &[i32], twin: &[i32]) -> StepObservation {
        let mut s = StepObservation::basic(OpOutcome::Done { returned: None }, vec![seq(0, orig)]);
        s.round_trip = Some(RoundTrip {
            whole_loaded: true,
            whole_twin: vec![seq(0, twin)],
            whole_same_bytes: true,
            seqs: vec![SeqRoundTrip {
                loaded: true,
                twin: seq(0, orig),
                same_bytes: true,
            }],
        });
        s
    }

    #[test]
    fn an_exact_round_trip_holds() {
        assert!(check_round_trip(&step(&[0, 1, 2], &[0, 1, 2]), MemoryType::Kv).is_none());
    }

    #[test]
    fn forced_mismatches_are_caught() {
        let v = check_round_trip(&step(&[0, 1, 2], &[0, 1]), MemoryType::Kv).unwrap();
        assert_eq!(v.kind, "whole load differs");
        let mut s = step(&[0, 1], &[0, 1]);
        s.round_trip.as_mut().unwrap().seqs[0].loaded = false;
        assert_eq!(
            check_round_trip(&s, MemoryType::Kv).unwrap().kind,
            "seq load failed"
        );
        let mut s = step(&[0, 1], &[0, 1]);
        s.round_trip.as_mut().unwrap().seqs[0].same_bytes = false;
        assert_eq!(
            check_round_trip(&s, MemoryType::Kv).unwrap().kind,
            "seq redump differs"
        );
        let mut s = step(&[0, 1], &[0, 1]);
        s.round_trip.as_mut().unwrap().whole_loaded = false;
        assert_eq!(
            check_round_trip(&s, MemoryType::Kv).unwrap().kind,
            "whole load failed"
        );
    }
}
