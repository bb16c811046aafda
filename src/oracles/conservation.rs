//! **Conservation**: the whole-context dump (`llama_state_get_data`) and the per-sequence dumps
//! (`llama_state_seq_get_data`) describe the same cells. Every used cell of the whole dump
//! belongs to some sequence, and for every observed sequence the positions the whole dump lists
//! for it are exactly the positions of its own dump (as multisets). A cell that no sequence owns
//! is memory that can never be freed by a sequence op; a sequence cell missing from the whole
//! dump is state that a whole-context save silently drops.

use std::collections::BTreeMap;

use serde_json::json;

use super::{Oracle, OracleId, PositiveControl, Reads, Seen, Violation};
use crate::base::cache::{Observe, StepObservation};
use crate::base::op::{Pos, SeqId};

/// Its id.
pub const ID: OracleId = OracleId::builtin(7, "conservation");

/// The first breach of conservation in `after`, if any (`None` also when the target has no
/// whole-context dump).
pub fn check_conservation(after: &StepObservation) -> Option<Violation> {
    let whole = after.whole.as_ref()?;
    if let Some(c) = whole.iter().find(|c| c.seqs.is_empty()) {
        return Some(Violation {
            oracle: ID,
            kind: "cell without a sequence".into(),
            seq: None,
            observed: json!({ "whole_dump_cell": { "pos": c.pos, "seqs": [] } }),
            expected: json!("every used cell belongs to at least one sequence"),
        });
    }
    let mut by_seq: BTreeMap<SeqId, Vec<Pos>> = BTreeMap::new();
    for c in whole {
        for &s in &c.seqs {
            by_seq.entry(s).or_default().push(c.pos);
        }
    }
    for s in &after.seqs {
        let mut in_whole = by_seq.remove(&s.seq).unwrap_or_default();
        in_whole.sort_unstable();
        if in_whole != s.cells {
            let kind = if in_whole.len() < s.cells.len() {
                "sequence cell missing from the whole dump"
            } else {
                "whole dump cell missing from the sequence dump"
            };
            return Some(Violation {
                oracle: ID,
                kind: kind.into(),
                seq: Some(s.seq),
                observed: json!({ "whole_dump": in_whole }),
                expected: json!({ "cells": s.cells }),
            });
        }
    }
    None
}

/// The oracle, as a value ([`Oracle`]).
pub static CONSERVATION: Oracle = Oracle {
    id: ID,
    summary: "the whole-context dump's used cells are exactly the union of the sequences' cells",
    reads: Reads::Step,
    kinds: &[
        "cell without a sequence",
        "sequence cell missing from the whole dump",
        "whole dump cell missing from the sequence dump",
    ],
    positive_controls: &[
        PositiveControl {
            fault: "orphan_cell",
            target: "native[orphan_cell]",
            seed_depth: Some(1),
            evidence: "oracles/conservation_orphan_cell.json",
        },
        PositiveControl {
            fault: "orphan_cell",
            target: "native[orphan_cell] (arch=lfm2_swa)",
            seed_depth: None,
            evidence: "oracles/conservation_orphan_cell_hybrid_iswa.json",
        },
        PositiveControl {
            fault: "orphan_cell",
            target: "native[orphan_cell] (arch=minimax-m3)",
            seed_depth: None,
            evidence: "oracles/conservation_orphan_cell_msa.json",
        },
        PositiveControl {
            fault: "orphan_cell",
            target: "native[orphan_cell] (arch=qwen4exp)",
            seed_depth: None,
            evidence: "oracles/conservation_orphan_cell_hybrid_idx.json",
        },
        PositiveControl {
            fault: "orphan_cell",
            target: "native[orphan_cell] (domain dsa_iswa)",
            seed_depth: None,
            evidence: "oracles/conservation_orphan_cell_dsa_iswa.json",
        },
        PositiveControl {
            fault: "orphan_cell",
            target: "native[orphan_cell] (arch=glm-dsa)",
            seed_depth: None,
            evidence: "oracles/conservation_orphan_cell_dsa.json",
        },
        PositiveControl {
            fault: "llama.cpp's own: a whole load cut inside a cell's sequence ids leaves a cell of no sequence",
            target: "llama.cpp@0.1.161 (arch=deepseek4)",
            seed_depth: None,
            evidence: "oracles/failed_restore_dsv4_cut_load_keeps_the_windowed_cache.json",
        },
    ],
    observes: Observe {
        whole: true,
        ..Observe::BASIC
    },
    holds: Some(holds_on),
    check: violation_on,
    ..Oracle::DEFAULTS
};

fn holds_on(seen: &Seen<'_>) -> bool {
    match seen {
        Seen::Step { after, .. } => check_conservation(after).is_none(),
        _ => true,
    }
}

fn violation_on(seen: &Seen<'_>) -> Option<Violation> {
    match seen {
        Seen::Step { after, .. } => check_conservation(after),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::cache::{OpOutcome, SeqObservation};
    use crate::base::state::WholeCell;

    fn step(seqs: &[(SeqId, &[Pos])], whole: &[(Pos, &[SeqId])]) -> StepObservation {
        let mut s = StepObservation::basic(
            OpOutcome::Done { returned: None },
            seqs.iter()
                .map(|&(seq, cells)| SeqObservation {
                    seq,
                    pos_min: cells.first().copied().unwrap_or(-1),
                    pos_max: cells.last().copied().unwrap_or(-1),
                    cells: cells.to_vec(),
                    second_cells: None,
                    third_cells: None,
                })
                .collect(),
        );
        s.whole = Some(
            whole
                .iter()
                .map(|&(pos, seqs)| WholeCell {
                    pos,
                    seqs: seqs.to_vec(),
                })
                .collect(),
        );
        s
    }

    #[test]
    fn shared_cells_count_once_per_sequence_and_hold() {
        let s = step(&[(0, &[0, 1]), (1, &[0])], &[(0, &[0, 1]), (1, &[0])]);
        assert!(check_conservation(&s).is_none());
    }

    #[test]
    fn forced_mismatches_are_caught() {
        let orphan = step(&[(0, &[0])], &[(0, &[0]), (1, &[])]);
        assert_eq!(
            check_conservation(&orphan).unwrap().kind,
            "cell without a sequence"
        );
        let dropped = step(&[(0, &[0]), (1, &[])], &[(0, &[0]), (1, &[0])]);
        let v = check_conservation(&dropped).unwrap();
        assert_eq!(v.kind, "whole dump cell missing from the sequence dump");
        let missing = step(&[(0, &[0, 1])], &[(0, &[0])]);
        let v = check_conservation(&missing).unwrap();
        assert_eq!(v.kind, "sequence cell missing from the whole dump");
        assert_eq!(v.seq, Some(0));
    }

    #[test]
    fn no_whole_dump_means_nothing_to_judge() {
        let mut s = step(&[(0, &[0])], &[]);
        s.whole = None;
        assert!(check_conservation(&s).is_none());
    }
}
