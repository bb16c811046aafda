//! **Contracts**: what llama.h promises for each op, judged on the sequences' cells right before
//! and right after it ([`crate::base::cache::StepObservation::before`]).
//!
//! The promises are one table, [`CLAUSES`]: the op, llama.h's words (or, where llama.h is
//! silent, the behaviour of llama.cpp's unified single-stream cache that stands in for them) and
//! whether llama.h states it. A documented clause that does not hold is a `contract` finding; an
//! undocumented one is a `contract?` finding ([`ContractQuestion`], advisory: for a person to
//! judge, never a failure). Only ops that took effect are judged (a refused or unsupported op,
//! a crash, have their own oracles), and only sequences that were observed.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;

use super::{Oracle, OracleId, PositiveControl, Reads, Seen, Violation};
use crate::base::cache::{Observe, OpOutcome, SeqObservation, StepObservation};
use crate::base::op::{MemoryType, Op, Pos, SeqId};

/// `contract`'s id.
pub const ID: OracleId = OracleId::builtin(9, "contract");
/// `contract?`'s id.
pub const QUESTION_ID: OracleId = OracleId::builtin(10, "contract?");

/// One promise about one op.
#[derive(Clone, Copy, Debug)]
pub struct Clause {
    /// The violation kind when it does not hold (also its key in this table).
    pub kind: &'static str,
    /// The op it governs, as in JSON.
    pub op: &'static str,
    /// What is promised: llama.h's words where it has them.
    pub promise: &'static str,
    /// llama.h states it (`contract`); otherwise it is the reference behaviour (`contract?`).
    pub documented: bool,
}

/// The clause `seq_rm: whole-sequence removal failed`.
pub static SEQ_RM_WHOLE_SEQUENCE_REMOVAL_FAILED: Clause = Clause {
    kind: "seq_rm: whole-sequence removal failed",
    op: "seq_rm",
    promise: "Removing a whole sequence never fails",
    documented: true,
};
/// The clause `seq_rm: range not removed`.
pub static SEQ_RM_RANGE_NOT_REMOVED: Clause = Clause {
    kind: "seq_rm: range not removed",
    op: "seq_rm",
    promise:
        "Removes all tokens that belong to the specified sequence and have positions in [p0, p1)",
    documented: true,
};
/// The clause `seq_rm: failed removal changed the cache`.
pub static SEQ_RM_FAILED_REMOVAL_CHANGED_THE_CACHE: Clause = Clause {
    kind: "seq_rm: failed removal changed the cache",
    op: "seq_rm",
    promise: "(llama.h silent) a seq_rm that returns false leaves the cache as it was",
    documented: false,
};
/// The clause `seq_cp: copy differs from the source range`.
pub static SEQ_CP_COPY_DIFFERS_FROM_THE_SOURCE_RANGE: Clause = Clause {
    kind: "seq_cp: copy differs from the source range",
    op: "seq_cp",
    promise: "Copy all tokens that belong to the specified sequence to another sequence",
    documented: true,
};
/// The clause `seq_cp: into a non-empty destination`.
pub static SEQ_CP_INTO_A_NON_EMPTY_DESTINATION: Clause = Clause {
    kind: "seq_cp: into a non-empty destination",
    op: "seq_cp",
    promise: "(llama.h silent) the destination keeps its cells and gains the source's range",
    documented: false,
};
/// The clause `seq_keep: other sequence kept`.
pub static SEQ_KEEP_OTHER_SEQUENCE_KEPT: Clause = Clause {
    kind: "seq_keep: other sequence kept",
    op: "seq_keep",
    promise: "Removes all tokens that do not belong to the specified sequence",
    documented: true,
};
/// The clause `seq_add: positions not shifted`.
pub static SEQ_ADD_POSITIONS_NOT_SHIFTED: Clause = Clause { kind: "seq_add: positions not shifted", op: "seq_add", promise: "Adds relative position delta to all tokens that belong to the specified sequence and have positions in [p0, p1)", documented: true };
/// The clause `seq_add: shared cells moved another sequence`.
pub static SEQ_ADD_SHARED_CELLS_MOVED_ANOTHER_SEQUENCE: Clause = Clause {
    kind: "seq_add: shared cells moved another sequence",
    op: "seq_add",
    promise: "(llama.h silent) tokens of other sequences keep their positions",
    documented: false,
};
/// The clause `seq_div: positions not divided`.
pub static SEQ_DIV_POSITIONS_NOT_DIVIDED: Clause = Clause {
    kind: "seq_div: positions not divided",
    op: "seq_div",
    promise: "Integer division of the positions by factor of d > 1",
    documented: true,
};
/// The clause `seq_div: shared cells moved another sequence`.
pub static SEQ_DIV_SHARED_CELLS_MOVED_ANOTHER_SEQUENCE: Clause = Clause {
    kind: "seq_div: shared cells moved another sequence",
    op: "seq_div",
    promise: "(llama.h silent) tokens of other sequences keep their positions",
    documented: false,
};
/// The clause `clear: cells left`.
pub static CLEAR_CELLS_LEFT: Clause = Clause {
    kind: "clear: cells left",
    op: "clear",
    promise: "Clear the memory contents",
    documented: true,
};
/// The clause `decode: tokens not added`.
pub static DECODE_TOKENS_NOT_ADDED: Clause = Clause {
    kind: "decode: tokens not added",
    op: "decode",
    promise: "0 - success: the batch's tokens are in the memory at their positions",
    documented: true,
};
/// The clause `decode: failed decode changed the cache`.
pub static DECODE_FAILED_DECODE_CHANGED_THE_CACHE: Clause = Clause { kind: "decode: failed decode changed the cache", op: "decode", promise: "Upon other return values [1, -1], the memory state is restored to the state before this call", documented: true };
/// The clause `decode: recurrent state not at the last token`.
pub static DECODE_RECURRENT_STATE_NOT_AT_THE_LAST_TOKEN: Clause = Clause { kind: "decode: recurrent state not at the last token", op: "decode", promise: "0 - success: the batch's tokens are in the memory (a recurrent state absorbs them and takes the last one's position)", documented: true };
/// The clause `seq_cp: recurrent state not copied`.
pub static SEQ_CP_RECURRENT_STATE_NOT_COPIED: Clause = Clause { kind: "seq_cp: recurrent state not copied", op: "seq_cp", promise: "Copy all tokens that belong to the specified sequence to another sequence (a recurrent memory copies the whole state whatever the range: src/llama-memory-recurrent.cpp seq_cp)", documented: true };
/// The clause `state save: cache changed`.
pub static STATE_SAVE_CACHE_CHANGED: Clause = Clause {
    kind: "state save: cache changed",
    op: "state_seq_save",
    promise: "Copy the state ... into the specified buffer (a read: the cache is unchanged)",
    documented: true,
};
/// The clause `state_seq_load: other sequence changed`.
pub static STATE_SEQ_LOAD_OTHER_SEQUENCE_CHANGED: Clause = Clause {
    kind: "state_seq_load: other sequence changed",
    op: "state_seq_load",
    promise: "Copy the sequence data ... into the specified sequence (only that sequence changes)",
    documented: true,
};
/// The clause `state load failed: cache changed`.
pub static STATE_LOAD_FAILED_CACHE_CHANGED: Clause = Clause { kind: "state load failed: cache changed", op: "state_seq_load", promise: "(llama.h silent: \"Zero: Failed to load\") a failed load leaves the destination as it was or empty, and the rest untouched", documented: false };

/// Every clause, in the order they are checked within an op.
pub static CLAUSES: [&Clause; 18] = [
    &SEQ_RM_WHOLE_SEQUENCE_REMOVAL_FAILED,
    &SEQ_RM_RANGE_NOT_REMOVED,
    &SEQ_RM_FAILED_REMOVAL_CHANGED_THE_CACHE,
    &SEQ_CP_COPY_DIFFERS_FROM_THE_SOURCE_RANGE,
    &SEQ_CP_INTO_A_NON_EMPTY_DESTINATION,
    &SEQ_KEEP_OTHER_SEQUENCE_KEPT,
    &SEQ_ADD_POSITIONS_NOT_SHIFTED,
    &SEQ_ADD_SHARED_CELLS_MOVED_ANOTHER_SEQUENCE,
    &SEQ_DIV_POSITIONS_NOT_DIVIDED,
    &SEQ_DIV_SHARED_CELLS_MOVED_ANOTHER_SEQUENCE,
    &CLEAR_CELLS_LEFT,
    &DECODE_TOKENS_NOT_ADDED,
    &DECODE_FAILED_DECODE_CHANGED_THE_CACHE,
    &DECODE_RECURRENT_STATE_NOT_AT_THE_LAST_TOKEN,
    &SEQ_CP_RECURRENT_STATE_NOT_COPIED,
    &STATE_SAVE_CACHE_CHANGED,
    &STATE_SEQ_LOAD_OTHER_SEQUENCE_CHANGED,
    &STATE_LOAD_FAILED_CACHE_CHANGED,
];

/// The promises llama.h states for the op `op` (its JSON name), in [`CLAUSES`] order.
pub fn documented_clauses(op: &str) -> Vec<String> {
    CLAUSES
        .iter()
        .filter(|c| c.op == op && c.documented)
        .map(|c| c.promise.to_string())
        .collect()
}

type Cells = BTreeMap<SeqId, Vec<Pos>>;

fn cells(seqs: &[SeqObservation]) -> Cells {
    seqs.iter().map(|s| (s.seq, s.cells.clone())).collect()
}

/// The indexer key cache's cells (`SeqObservation::indexer_cells`), empty where a sequence has
/// none.
fn indexer_cells(seqs: &[SeqObservation], memory: MemoryType) -> Cells {
    seqs.iter()
        .map(|s| {
            let cells = s.indexer_cells(memory).unwrap_or_default();
            (s.seq, cells.to_vec())
        })
        .collect()
}

/// The recurrent states' cells of a hybrid memory's sequences (`SeqObservation::recurrent_cells`).
fn recurrent_cells(seqs: &[SeqObservation], memory: MemoryType) -> Cells {
    seqs.iter()
        .map(|s| {
            let cells = s.recurrent_cells(memory).unwrap_or_default();
            (s.seq, cells.to_vec())
        })
        .collect()
}

fn in_range(p: Pos, p0: Pos, p1: Pos) -> bool {
    p >= p0.max(0) && (p1 < 0 || p < p1)
}

fn sorted(mut v: Vec<Pos>) -> Vec<Pos> {
    v.sort_unstable();
    v
}

fn set(v: &[Pos]) -> BTreeSet<Pos> {
    v.iter().copied().collect()
}

/// A breach: the clause and the sequence, with what was seen and what was promised.
struct Breach {
    kind: &'static Clause,
    seq: Option<SeqId>,
    observed: serde_json::Value,
    expected: serde_json::Value,
}

fn breach(kind: &'static Clause, seq: SeqId, observed: &[Pos], expected: &[Pos]) -> Breach {
    Breach {
        kind,
        seq: Some(seq),
        observed: json!({ "cells": observed }),
        expected: json!({ "cells": expected }),
    }
}

/// Sequences other than `except` must be as they were.
fn others_unchanged(
    kind: &'static Clause,
    b: &Cells,
    a: &Cells,
    except: &[SeqId],
) -> Option<Breach> {
    b.iter()
        .filter(|(s, _)| !except.contains(s))
        .find(|(s, cells)| a.get(s) != Some(cells))
        .map(|(s, cells)| breach(kind, *s, a.get(s).map_or(&[][..], |v| v), cells))
}

/// `seq`'s cells after moving those in range with `f` (dropping any moved below 0).
fn moved(cells: &[Pos], p0: Pos, p1: Pos, f: impl Fn(Pos) -> Pos) -> Vec<Pos> {
    sorted(
        cells
            .iter()
            .map(|&p| if in_range(p, p0, p1) { f(p) } else { p })
            .filter(|&p| p >= 0)
            .collect(),
    )
}

/// Which kind of part of a memory the cells are of: an attention cache's cells (a kv memory, an
/// iSWA memory's base cache, a hybrid memory's attention part) or recurrent states (a recurrent
/// memory, a hybrid memory's second part), whose decode and copy rules differ.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Cells,
    States,
}

/// The first clause of the op that does not hold on one part, documented or not.
///
/// `next`: the first part's cells before the op, whose last position + 1 is where a decode
/// without positions goes (the targets ask `seq_pos_max + 1`, which for a hybrid memory follows
/// the attention part).
fn first_breach(
    op: &Op,
    outcome: &OpOutcome,
    b: &Cells,
    a: &Cells,
    part: Part,
    next: &Cells,
) -> Option<Breach> {
    let returned = match outcome {
        OpOutcome::Done { returned } => *returned,
        OpOutcome::Decoded { .. } => None,
        OpOutcome::Refused { .. } | OpOutcome::Unsupported { .. } => return None,
    };
    let get = |m: &Cells, s: SeqId| m.get(&s).cloned().unwrap_or_default();
    match *op {
        Op::SeqRm { seq, p0, p1 } => {
            let whole = p0 <= 0 && p1 < 0;
            if returned == Some(false) {
                if whole {
                    return Some(Breach {
                        kind: &SEQ_RM_WHOLE_SEQUENCE_REMOVAL_FAILED,
                        seq: Some(seq),
                        observed: json!({ "returned": false }),
                        expected: json!({ "returned": true }),
                    });
                }
                return others_unchanged(&SEQ_RM_FAILED_REMOVAL_CHANGED_THE_CACHE, b, a, &[]);
            }
            for (&s, before) in b {
                // A recurrent state that a removal from after 0 cut and that llama.cpp kept
                // (true) rolled back: the state of the tokens before p0, at p0 - 1
                // (`cell.pos = p0 - 1`, src/llama-memory-recurrent.cpp:200-214 in 0.1.161).
                let rolled_back = part == Part::States
                    && s == seq
                    && p0 > 0
                    && before.iter().any(|&p| in_range(p, p0, p1));
                let want = if rolled_back {
                    vec![p0 - 1]
                } else if seq < 0 || s == seq {
                    sorted(
                        before
                            .iter()
                            .copied()
                            .filter(|&p| !in_range(p, p0, p1))
                            .collect(),
                    )
                } else {
                    before.clone()
                };
                if get(a, s) != want {
                    return Some(breach(&SEQ_RM_RANGE_NOT_REMOVED, s, &get(a, s), &want));
                }
            }
            None
        }
        Op::SeqCp { src, dst, .. } if part == Part::States => {
            if src == dst || !b.contains_key(&src) || !b.contains_key(&dst) {
                return None;
            }
            others_unchanged(&SEQ_CP_RECURRENT_STATE_NOT_COPIED, b, a, &[dst]).or_else(|| {
                let want = get(b, src);
                (get(a, dst) != want)
                    .then(|| breach(&SEQ_CP_RECURRENT_STATE_NOT_COPIED, dst, &get(a, dst), &want))
            })
        }
        Op::SeqCp { src, dst, p0, p1 } => {
            if src == dst || !b.contains_key(&src) || !b.contains_key(&dst) {
                return None;
            }
            if let Some(x) =
                others_unchanged(&SEQ_CP_COPY_DIFFERS_FROM_THE_SOURCE_RANGE, b, a, &[dst])
            {
                return Some(x);
            }
            let copied: Vec<Pos> = get(b, src)
                .into_iter()
                .filter(|&p| in_range(p, p0, p1))
                .collect();
            let had = get(b, dst);
            let after = get(a, dst);
            if had.is_empty() {
                if after != copied {
                    return Some(breach(
                        &SEQ_CP_COPY_DIFFERS_FROM_THE_SOURCE_RANGE,
                        dst,
                        &after,
                        &copied,
                    ));
                }
            } else {
                let want: BTreeSet<Pos> = set(&had).union(&set(&copied)).copied().collect();
                if set(&after) != want {
                    let want: Vec<Pos> = want.into_iter().collect();
                    return Some(breach(
                        &SEQ_CP_INTO_A_NON_EMPTY_DESTINATION,
                        dst,
                        &after,
                        &want,
                    ));
                }
            }
            None
        }
        Op::SeqKeep { seq } => {
            for (&s, before) in b {
                let want = if s == seq { before.clone() } else { Vec::new() };
                if get(a, s) != want {
                    return Some(breach(&SEQ_KEEP_OTHER_SEQUENCE_KEPT, s, &get(a, s), &want));
                }
            }
            None
        }
        Op::SeqAdd { seq, p0, p1, delta } => shift_breach(
            b,
            a,
            seq,
            moved(&get(b, seq), p0, p1, |p| p + delta),
            &SEQ_ADD_POSITIONS_NOT_SHIFTED,
            &SEQ_ADD_SHARED_CELLS_MOVED_ANOTHER_SEQUENCE,
        ),
        Op::SeqDiv { seq, p0, p1, d } if d > 0 => shift_breach(
            b,
            a,
            seq,
            moved(&get(b, seq), p0, p1, |p| p / d),
            &SEQ_DIV_POSITIONS_NOT_DIVIDED,
            &SEQ_DIV_SHARED_CELLS_MOVED_ANOTHER_SEQUENCE,
        ),
        Op::SeqDiv { .. } => None,
        Op::Clear => a
            .iter()
            .find(|(_, c)| !c.is_empty())
            .map(|(s, c)| breach(&CLEAR_CELLS_LEFT, *s, c, &[])),
        Op::Decode(ref d) => match outcome {
            OpOutcome::Decoded { rc: 0 } => {
                let start = match d.pos {
                    Some(p) => p,
                    None => get(next, d.seqs[0]).last().map_or(0, |m| m + 1),
                };
                let new: Vec<Pos> = (0..d.n as Pos).map(|i| start + i).collect();
                let kind = match part {
                    Part::Cells => &DECODE_TOKENS_NOT_ADDED,
                    Part::States => &DECODE_RECURRENT_STATE_NOT_AT_THE_LAST_TOKEN,
                };
                for (&s, before) in b {
                    let want = match (part, d.seqs.contains(&s)) {
                        (_, false) => before.clone(),
                        (Part::Cells, true) => sorted(before.iter().chain(&new).copied().collect()),
                        (Part::States, true) => new.last().copied().into_iter().collect(),
                    };
                    if get(a, s) != want {
                        return Some(breach(kind, s, &get(a, s), &want));
                    }
                }
                None
            }
            OpOutcome::Decoded { rc: 1 | -1 } => {
                others_unchanged(&DECODE_FAILED_DECODE_CHANGED_THE_CACHE, b, a, &[])
            }
            _ => None,
        },
        Op::StateSeqSave { .. } | Op::StateSave { .. } => {
            others_unchanged(&STATE_SAVE_CACHE_CHANGED, b, a, &[])
        }
        Op::StateSeqLoad { seq, .. } => {
            if returned == Some(true) {
                return others_unchanged(&STATE_SEQ_LOAD_OTHER_SEQUENCE_CHANGED, b, a, &[seq]);
            }
            if let Some(x) = others_unchanged(&STATE_LOAD_FAILED_CACHE_CHANGED, b, a, &[seq]) {
                return Some(x);
            }
            let after = get(a, seq);
            (after != get(b, seq) && !after.is_empty())
                .then(|| breach(&STATE_LOAD_FAILED_CACHE_CHANGED, seq, &after, &get(b, seq)))
        }
        Op::StateLoad { .. } => None,
    }
}

/// The moved sequence must hold `want`; another sequence that changed is a documented breach
/// unless it shared a moved cell's position with `seq` before (llama.cpp moves shared cells
/// for every sequence in them; llama.h does not say).
fn shift_breach(
    b: &Cells,
    a: &Cells,
    seq: SeqId,
    want: Vec<Pos>,
    kind: &'static Clause,
    shared_kind: &'static Clause,
) -> Option<Breach> {
    if !b.contains_key(&seq) {
        return None;
    }
    let after = a.get(&seq).cloned().unwrap_or_default();
    if after != want {
        return Some(breach(kind, seq, &after, &want));
    }
    let mine = set(&b[&seq]);
    for (&s, before) in b.iter().filter(|(s, _)| **s != seq) {
        let now = a.get(&s).cloned().unwrap_or_default();
        if now != *before {
            let shared = before.iter().any(|p| mine.contains(p));
            let k = if shared { shared_kind } else { kind };
            return Some(breach(k, s, &now, before));
        }
    }
    None
}

/// A `seq_rm` that returned false must leave the accessors as they were too, not only the cells:
/// a recurrent memory refuses a partial removal (src/llama-memory-recurrent.cpp:201-216) and a
/// hybrid one refuses before touching its attention cache (src/llama-memory-hybrid.cpp:143-150),
/// while a state can change with no cell position changing (`seq_pos_min`/`max` answer from the
/// recurrent state's position, the dump lists one cell per sequence).
fn failed_rm_moved_accessors(
    op: &Op,
    outcome: &OpOutcome,
    before: &[SeqObservation],
    after: &[SeqObservation],
) -> Option<Breach> {
    let (
        Op::SeqRm { .. },
        OpOutcome::Done {
            returned: Some(false),
        },
    ) = (op, outcome)
    else {
        return None;
    };
    let accessors = |o: &SeqObservation| (o.pos_min, o.pos_max);
    before.iter().find_map(|b| {
        let a = after.iter().find(|a| a.seq == b.seq)?;
        (accessors(a) != accessors(b)).then(|| Breach {
            kind: &SEQ_RM_FAILED_REMOVAL_CHANGED_THE_CACHE,
            seq: Some(b.seq),
            observed: json!({ "pos_min": a.pos_min, "pos_max": a.pos_max }),
            expected: json!({ "pos_min": b.pos_min, "pos_max": b.pos_max }),
        })
    })
}

/// The first breach in `after` (against `after.before`) of a clause with `documented`, if any,
/// on a memory of type `memory`: the first part's cells by its rules, then a hybrid memory's
/// recurrent states by theirs, or an MSA memory's indexer key cache by the cell rules, then a
/// hybrid_idx memory's indexer key cache by the cell rules.
pub fn check_contract(
    op: &Op,
    after: &StepObservation,
    documented: bool,
    memory: MemoryType,
) -> Option<Violation> {
    let before = after.before.as_ref()?;
    let first = match memory {
        MemoryType::Recurrent => Part::States,
        _ => Part::Cells,
    };
    let b = cells(before);
    let x = first_breach(op, &after.outcome, &b, &cells(&after.seqs), first, &b)
        .or_else(|| {
            // The second part: a hybrid memory's recurrent states by their rules; an MSA
            // memory's indexer key cache by the cell rules, since it takes every op and every
            // ubatch the K/V cache takes (llama-kv-cache-msa.cpp:52-84, `init_batch` :102-144).
            let second = match memory {
                MemoryType::Hybrid | MemoryType::HybridIswa | MemoryType::HybridIdx => Part::States,
                MemoryType::Msa => Part::Cells,
                // DSA: the indexer key cache likewise (llama-kv-cache-dsa.cpp:59-90, `init_batch`
                // :104-145 prepares both caches for every ubatch).
                MemoryType::Dsa => Part::Cells,
                // DSA-iSWA: the DSA part's indexer key cache (its third part), whose ops and
                // ubatches are the MLA cache's (llama-kv-cache-dsa-iswa.cpp:78-110, `init_batch`
                // :129-220 prepares MLA, indexer and windowed caches); the windowed cache is not
                // judged, as an iSWA memory's.
                MemoryType::DsaIswa => Part::Cells,
                MemoryType::Kv | MemoryType::Iswa | MemoryType::Recurrent | MemoryType::Dsv4 => {
                    return None
                }
            };
            let (b2, a2) = if memory.is_hybrid() {
                (
                    recurrent_cells(before, memory),
                    recurrent_cells(&after.seqs, memory),
                )
            } else {
                (
                    indexer_cells(before, memory),
                    indexer_cells(&after.seqs, memory),
                )
            };
            let mut breach = first_breach(op, &after.outcome, &b2, &a2, second, &b)?;
            // The accessors are the K/V cache's: say which cache broke the clause.
            if let (MemoryType::Msa | MemoryType::Dsa | MemoryType::DsaIswa, Some(o)) =
                (memory, breach.observed.as_object_mut())
            {
                o.insert("part".into(), json!("indexer cache"));
            }
            Some(breach)
        })
        .or_else(|| {
            // A hybrid_idx memory's indexer key cache by the cell rules: it takes every op the
            // attention cache takes and adopts its slots (llama-memory-hybrid-idx.cpp:185-245,
            // `init_batch` :127-131, `state_read` :272-307).
            if memory != MemoryType::HybridIdx {
                return None;
            }
            let (b2, a2) = (
                indexer_cells(before, memory),
                indexer_cells(&after.seqs, memory),
            );
            let mut breach = first_breach(op, &after.outcome, &b2, &a2, Part::Cells, &b)?;
            if let Some(o) = breach.observed.as_object_mut() {
                o.insert("part".into(), json!("indexer cache"));
            }
            Some(breach)
        })
        .or_else(|| failed_rm_moved_accessors(op, &after.outcome, before, &after.seqs))?;
    let c = x.kind;
    (c.documented == documented).then(|| Violation {
        oracle: if documented { ID } else { QUESTION_ID },
        kind: c.kind.into(),
        seq: x.seq,
        observed: x.observed,
        expected: merge(x.expected, c.promise),
    })
}

fn merge(mut expected: serde_json::Value, promise: &str) -> serde_json::Value {
    if let Some(o) = expected.as_object_mut() {
        o.insert("llama.h".into(), json!(promise));
    }
    expected
}

/// The violation kinds of the documented clauses, in [`CLAUSES`] order (a test keeps the two
/// lists equal to the table's).
static DOCUMENTED_KINDS: [&str; 13] = [
    SEQ_RM_WHOLE_SEQUENCE_REMOVAL_FAILED.kind,
    SEQ_RM_RANGE_NOT_REMOVED.kind,
    SEQ_CP_COPY_DIFFERS_FROM_THE_SOURCE_RANGE.kind,
    SEQ_KEEP_OTHER_SEQUENCE_KEPT.kind,
    SEQ_ADD_POSITIONS_NOT_SHIFTED.kind,
    SEQ_DIV_POSITIONS_NOT_DIVIDED.kind,
    CLEAR_CELLS_LEFT.kind,
    DECODE_TOKENS_NOT_ADDED.kind,
    DECODE_FAILED_DECODE_CHANGED_THE_CACHE.kind,
    DECODE_RECURRENT_STATE_NOT_AT_THE_LAST_TOKEN.kind,
    SEQ_CP_RECURRENT_STATE_NOT_COPIED.kind,
    STATE_SAVE_CACHE_CHANGED.kind,
    STATE_SEQ_LOAD_OTHER_SEQUENCE_CHANGED.kind,
];

/// The violation kinds of the clauses llama.h is silent on, in [`CLAUSES`] order.
static QUESTION_KINDS: [&str; 5] = [
    SEQ_RM_FAILED_REMOVAL_CHANGED_THE_CACHE.kind,
    SEQ_CP_INTO_A_NON_EMPTY_DESTINATION.kind,
    SEQ_ADD_SHARED_CELLS_MOVED_ANOTHER_SEQUENCE.kind,
    SEQ_DIV_SHARED_CELLS_MOVED_ANOTHER_SEQUENCE.kind,
    STATE_LOAD_FAILED_CACHE_CHANGED.kind,
];

fn judge(seen: &Seen<'_>, documented: bool) -> Option<Violation> {
    match seen {
        Seen::Step { op, after, arch } => check_contract(op, after, documented, arch.memory()),
        _ => None,
    }
}

const OBSERVES: Observe = Observe {
    before: true,
    ..Observe::BASIC
};

/// The oracle, as a value ([`Oracle`]).
pub static CONTRACT: Oracle = Oracle {
    id: ID,
    summary: "each op does to the sequences' cells what llama.h says it does (table: oracles::contract::CLAUSES)",
    reads: Reads::Step,
    kinds: &DOCUMENTED_KINDS,
    positive_controls: &[
        PositiveControl {
            fault: "keep_noop",
            target: "native[keep_noop]",
            seed_depth: Some(1),
            evidence: "oracles/contract_keep_noop.json",
        },
        PositiveControl {
            fault: "msa_idx_skips_seq_cp",
            target: "native[msa_idx_skips_seq_cp] (arch=minimax-m3)",
            seed_depth: None,
            evidence: "oracles/contract_msa_idx_skips_seq_cp.json",
        },
        PositiveControl {
            fault: "dsa_lid_skips_seq_cp",
            target: "native[dsa_lid_skips_seq_cp] (domain dsa)",
            seed_depth: None,
            evidence: "oracles/contract_dsa_lid_skips_seq_cp.json",
        },
        PositiveControl {
            fault: "dsa_lid_skips_seq_cp",
            target: "native[dsa_lid_skips_seq_cp] (domain dsa_iswa)",
            seed_depth: None,
            evidence: "oracles/contract_dsa_lid_skips_seq_cp_dsa_iswa.json",
        },
        PositiveControl {
            fault: "keep_noop",
            target: "native[keep_noop] (arch=lfm2_swa)",
            seed_depth: None,
            evidence: "oracles/contract_keep_noop_hybrid_iswa.json",
        },
        PositiveControl {
            fault: "hybrid_idx_skips_seq_cp",
            target: "native[hybrid_idx_skips_seq_cp] (domain hybrid_idx)",
            seed_depth: None,
            evidence: "oracles/contract_hybrid_idx_skips_seq_cp.json",
        },
        PositiveControl {
            fault: "hybrid_idx_state_drops_indexer",
            target: "native[hybrid_idx_state_drops_indexer] (domain hybrid_idx)",
            seed_depth: None,
            evidence: "oracles/contract_hybrid_idx_state_drops_indexer.json",
        },
        PositiveControl {
            fault: "keep_noop: the llama.cpp target's test hook (seq_keep not sent)",
            target: "llama.cpp@0.1.161[keep_noop] (domain dsv4)",
            seed_depth: None,
            evidence: "oracles/contract_keep_noop_dsv4.json",
        },
        PositiveControl {
            fault: "trim_one_more",
            target: "mlx-lm@0.32.2[trim_one_more]",
            seed_depth: None,
            evidence: "audits/mlx_trim_one_more_d1.json",
        },
    ],
    observes: OBSERVES,
    check: violation_on_contract,
    ..Oracle::DEFAULTS
};

fn violation_on_contract(seen: &Seen<'_>) -> Option<Violation> {
    judge(seen, true)
}

/// The oracle, as a value ([`Oracle`]).
pub static CONTRACT_QUESTION: Oracle = Oracle {
    id: QUESTION_ID,
    summary: "advisory: where llama.h is silent, each op does what llama.cpp's unified single-stream cache does",
    reads: Reads::Step,
    kinds: &QUESTION_KINDS,
    // llama.cpp's own shared-cell seq_add is the control: a copied prefix shifted in one
    // sequence moves in the other (reachable in the seed domain at depth 2).
    positive_controls: &[
        PositiveControl {
            fault: "none: seq_add of a copied prefix",
            target: "native",
            seed_depth: Some(2),
            evidence: "oracles/contract_question_shared_shift.json",
        },
        PositiveControl {
            fault: "recurrent_rm_false_changes",
            target: "native[recurrent_rm_false_changes] (arch=lfm2_swa)",
            seed_depth: None,
            evidence: "oracles/contract_question_recurrent_rm_false_changes_hybrid_iswa.json",
        },
        PositiveControl {
            fault: "none: seq_cp into a non-empty destination",
            target: "native (arch=minimax-m3)",
            seed_depth: None,
            evidence: "oracles/contract_question_seq_cp_into_non_empty_msa.json",
        },
        PositiveControl {
            fault: "recurrent_rm_false_changes",
            target: "native[recurrent_rm_false_changes] (arch=qwen4exp)",
            seed_depth: None,
            evidence: "oracles/contract_question_recurrent_rm_false_changes_hybrid_idx.json",
        },
        PositiveControl {
            fault: "none: llama.cpp's unspecified behaviours",
            target: "native (domain dsa_iswa)",
            seed_depth: None,
            evidence: "oracles/contract_question_dsa_iswa.json",
        },
        PositiveControl {
            fault: "none: seq_add of a cell shared by a copy",
            target: "native (arch=glm-dsa)",
            seed_depth: None,
            evidence: "oracles/contract_question_shared_shift_dsa.json",
        },
        PositiveControl {
            fault: "none: a whole seq_cp into a non-empty destination replaces it",
            target: "llama.cpp@0.1.161 (arch=deepseek4)",
            seed_depth: None,
            evidence: "oracles/contract_question_dsv4.json",
        },
        PositiveControl {
            fault: "trim_returns_less",
            target: "mlx-lm@0.32.2[trim_returns_less]",
            seed_depth: None,
            evidence: "audits/mlx_trim_returns_less_d1.json",
        },
    ],
    observes: OBSERVES,
    check: violation_on_contract_question,
    ..Oracle::DEFAULTS
};

fn violation_on_contract_question(seen: &Seen<'_>) -> Option<Violation> {
    judge(seen, false)
}

#[cfg(test)]
mod tests;
