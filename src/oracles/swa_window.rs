//! **swa-window**: an iSWA memory's windowed cache follows positions (shared/seeds/000, T3: the
//! sliding window is keyed off the absolute position, never off a cell's index or the order
//! tokens arrived in). Judged on every sequence of an iSWA memory (`gemma2`), from its two dumps
//! and its accessors: the base (full) cache's cells `B`, the windowed cache's dump `W`, and `M`
//! the windowed cache's own largest position of the sequence, with `n` the window
//! ([`crate::base::op::Arch::swa_window`]). `M` is the key llama.cpp masks by
//! (`cells.seq_pos_max(seq_id)` of the windowed cache) and what the memory answers for
//! `seq_pos_max` (`llama_kv_cache_iswa::seq_pos_max` asks the windowed cache alone,
//! src/llama-kv-cache-iswa.cpp:146-148). It is not the base cache's largest position: once the
//! windowed cache has overwritten masked cells, a `seq_cp` of a range below its window, a
//! removal of its tail or a shift of a position it dropped leaves the base cache holding larger
//! positions than the windowed one (that disagreement is I1's finding, not this oracle's).
//!
//! 1. `W` holds no position that `B` does not: llama.cpp sends every op to both caches
//!    (src/llama-kv-cache-iswa.cpp:111-140), and only the windowed one forgets.
//! 2. `W` holds no position outside the window of the sequence's next token: `M - p < n`. The
//!    windowed dump leaves out the cells that are masked for it (`is_masked_swa(n_swa, swa_type,
//!    pos, seq_pos_max)`, src/llama-kv-cache.cpp:1996 / :2100), so a position beyond the window
//!    in `W` is a mask keyed off something else.
//! 3. An op that moves no position (decode, `seq_rm`, `seq_cp`, `seq_keep`, `clear`) never takes
//!    from `W` a position that is still in `B` and that the sequence's next token attends
//!    (`M + 1 - p < n`): the windowed cache overwrites a cell only when it is masked for its
//!    sequence's next token (src/llama-kv-cache.cpp:1075, `seq_pos_max + 1` of the windowed
//!    cache), so the dump's oldest position (`M - p = n - 1`) may go. This is what catches an
//!    eviction one position early.
//!
//! Not judged on other memory types (`judges` is false: counted as not judged, never passed).
//! After a purge, a removal at the tail can leave `W` without positions that are back inside
//! the window; llama.h allows it (`seq_pos_min` "is typically non-zero only for SWA caches") and
//! rule 3 does not ask for them, since they were not in `W` before the op.

use std::collections::BTreeSet;

use serde_json::json;

use super::{Oracle, OracleId, PositiveControl, Reads, Seen, Violation};
use crate::base::cache::{Observe, SeqObservation, StepObservation};
use crate::base::op::{Arch, Op, Pos, Setup};

/// Its id.
pub const ID: OracleId = OracleId::builtin(13, "swa-window");

const OUTSIDE_BASE: &str = "windowed cache holds a position the base cache lacks";
const OUTSIDE_WINDOW: &str = "windowed cache holds a position outside the window";
const EVICTED: &str = "windowed cache lost a position inside the window";

fn violation(kind: &str, s: &SeqObservation, observed: serde_json::Value, n: u32) -> Violation {
    Violation {
        oracle: ID,
        kind: kind.into(),
        seq: Some(s.seq),
        observed,
        expected: json!({ "cells": s.cells, "window": n }),
    }
}

/// Whether an op leaves every position where it was (rule 3 applies).
pub fn keeps_positions(op: &Op) -> bool {
    match op {
        Op::Decode(_) | Op::SeqRm { .. } | Op::SeqCp { .. } | Op::SeqKeep { .. } | Op::Clear => {
            true
        }
        // Shifts move positions and loads replace them; rule 3 is not asked of saves either.
        Op::SeqAdd { .. }
        | Op::SeqDiv { .. }
        | Op::StateSeqSave { .. }
        | Op::StateSeqLoad { .. }
        | Op::StateSave { .. }
        | Op::StateLoad { .. } => false,
    }
}

/// The first breach on one sequence (`before`: the same sequence right before the op, when
/// rule 3 applies).
fn check_seq(s: &SeqObservation, before: Option<&SeqObservation>, n: u32) -> Option<Violation> {
    let windowed = s.second_cells.as_deref()?;
    let base: BTreeSet<Pos> = s.cells.iter().copied().collect();
    if let Some(&p) = windowed.iter().find(|p| !base.contains(p)) {
        return Some(violation(
            OUTSIDE_BASE,
            s,
            json!({ "windowed": windowed, "position": p }),
            n,
        ));
    }
    // The windowed cache's own seq_pos_max (-1: it holds nothing): the dump's largest position,
    // which its mask never leaves out (`max - max < n`). An iSWA memory answers it as
    // `seq_pos_max` (src/llama-kv-cache-iswa.cpp:146-148); a hybrid-iSWA memory answers the
    // smaller of it and the states' maximum, so the dump is the one place that shows it.
    let max = windowed.last().copied().unwrap_or(-1);
    let inside = |p: Pos| i64::from(max) - i64::from(p) < i64::from(n);
    if let Some(&p) = windowed.iter().find(|&&p| !inside(p)) {
        return Some(violation(
            OUTSIDE_WINDOW,
            s,
            json!({ "windowed": windowed, "position": p }),
            n,
        ));
    }
    // The slot search keys off the windowed cache's next token (`seq_pos_max + 1`), the dump
    // off its `seq_pos_max`: the oldest position of the dump may be overwritten legitimately.
    let attended = |p: Pos| i64::from(max) + 1 - i64::from(p) < i64::from(n);
    let had = before.and_then(|b| b.second_cells.as_deref())?;
    let now: BTreeSet<Pos> = windowed.iter().copied().collect();
    had.iter()
        .find(|&&p| base.contains(&p) && attended(p) && !now.contains(&p))
        .map(|&p| {
            violation(
                EVICTED,
                s,
                json!({ "windowed_before": had, "windowed": windowed, "position": p }),
                n,
            )
        })
}

/// The first breach in `after`, for an iSWA memory with window `n`.
pub fn check_swa_window(op: &Op, after: &StepObservation, n: u32) -> Option<Violation> {
    let before = after.before.as_deref().filter(|_| keeps_positions(op));
    after.seqs.iter().find_map(|s| {
        let b = before.and_then(|b| b.iter().find(|b| b.seq == s.seq));
        check_seq(s, b, n)
    })
}

/// The window when `arch` has a memory with a windowed cache (iswa, hybrid_iswa).
fn window(arch: Arch) -> Option<u32> {
    arch.memory()
        .has_window()
        .then(|| arch.swa_window())
        .flatten()
}

/// The oracle, as a value ([`Oracle`]).
pub static SWA_WINDOW: Oracle = Oracle {
    id: ID,
    summary: "iSWA: the windowed cache holds only base positions inside the window, and loses none of them but by a position-keyed eviction",
    reads: Reads::Step,
    kinds: &[OUTSIDE_BASE, OUTSIDE_WINDOW, EVICTED],
    positive_controls: &[
        PositiveControl {
            fault: "swa_window_off_by_one",
            target: "native[swa_window_off_by_one]",
            seed_depth: None,
            evidence: "oracles/swa_window_off_by_one.json",
        },
        PositiveControl {
            fault: "swa_window_off_by_one",
            target: "native[swa_window_off_by_one] (arch=lfm2_swa)",
            seed_depth: None,
            evidence: "oracles/swa_window_off_by_one_hybrid_iswa.json",
        },
        PositiveControl {
            fault: "swa_window_off_by_one",
            target: "native[swa_window_off_by_one] (arch=dots3note)",
            seed_depth: None,
            evidence: "oracles/swa_window_off_by_one_dsa_iswa.json",
        },
        PositiveControl {
            fault: "ring_two_short",
            target: "mlx-lm@0.32.2[ring_two_short] (gemma2)",
            seed_depth: None,
            evidence: "audits/mlx_ring_two_short_swa_d1.json",
        },
    ],
    observes: Observe {
        before: true,
        ..Observe::BASIC
    },
    check: violation_on,
    judges: Some(judges_on),
    judges_setup: judges_setup_of,
    ..Oracle::DEFAULTS
};

fn violation_on(seen: &Seen<'_>) -> Option<Violation> {
    match seen {
        Seen::Step { op, after, arch } => check_swa_window(op, after, window(*arch)?),
        _ => None,
    }
}

fn judges_on(seen: &Seen<'_>) -> bool {
    matches!(seen, Seen::Step { arch, .. } if window(*arch).is_some())
        && super::seen_has(
            seen,
            Observe {
                before: true,
                ..Observe::BASIC
            },
        )
}

fn judges_setup_of(setup: &Setup) -> bool {
    window(setup.arch).is_some()
}

// ---- the check in C, for reproducers (`outputs::llama_h` names it; `super::c_check` has the others) ----

use super::c_check::{nothing, CCheck};
use std::fmt::Write as _;

/// swa-window: the windowed dump within the base cells and the window, and no attended position
/// lost by an op that moves none.
pub const C_CHECK: CCheck = CCheck {
    before_last_op: |s, input| {
        // Each checked sequence's windowed dump before the op (rule 3 compares it with after).
        let n = input.seqs.len().max(1);
        let _ = writeln!(s, "    int swa_before[{n}][256]; int swa_nbefore[{n}];");
        for (k, seq) in input.seqs.iter().enumerate() {
            let _ = writeln!(s, "    {{ int b[4096]; int nb; swa_nbefore[{k}] = resident_iswa(ctx, {seq}, b, &nb, swa_before[{k}], 256); }}");
        }
    },
    before_seqs: nothing,
    seq: |s, input| {
        let t = input.trace;
        let rule3 = input
            .step
            .checked_sub(1)
            .and_then(|i| t.ops.get(i))
            .is_some_and(keeps_positions);
        emit_swa_window_check(s, t.setup.arch.swa_window().unwrap_or(0), rule3);
    },
    after_seqs: nothing,
};

/// The C check on one sequence of an iSWA memory with window `n`:
/// the windowed dump within the base cells and the window, and (`rule3`: the last op moves no
/// position) no position lost that the next token attends.
fn emit_swa_window_check(s: &mut String, n: u32, rule3: bool) {
    let _ = writeln!(s, "        {{ int b[4096]; int nb; int w[4096]; int nw = resident_iswa(ctx, sq, b, &nb, w, 4096);");
    let _ = writeln!(s, "          printf(\"  windowed cache (seq %d): %d cells:\", sq, nw); for (int i = 0; i < nw; i++) printf(\" %d\", w[i]); printf(\"\\n\");");
    // The window is keyed off the windowed cache's own seq_pos_max (the windowed dump's largest
    // position, which an iSWA memory answers as `mx`, src/llama-kv-cache-iswa.cpp:146-148), not
    // the base cache's largest position.
    let _ = writeln!(s, "          int mx_w = nw ? w[nw - 1] : -1;");
    let _ = writeln!(s, "          for (int i = 0; i < nw; i++) {{");
    let _ = writeln!(s, "            if (!has_pos(b, nb, w[i])) {{ printf(\"swa-window violated: the windowed cache holds %d, the base cache does not\\n\", w[i]); reproduced = 1; }}");
    let _ = writeln!(s, "            else if (mx_w - w[i] >= {n}) {{ printf(\"swa-window violated: the windowed cache holds %d, outside the window of %d\\n\", w[i], mx_w); reproduced = 1; }}");
    let _ = writeln!(s, "          }}");
    if rule3 {
        let _ = writeln!(
            s,
            "          for (int i = 0; i < swa_nbefore[k]; i++) {{ int p = swa_before[k][i];"
        );
        let _ = writeln!(s, "            if (has_pos(b, nb, p) && mx_w + 1 - p < {n} && !has_pos(w, nw, p)) {{ printf(\"swa-window violated: the windowed cache lost %d, which the next token (%d) attends\\n\", p, mx_w + 1); reproduced = 1; }}");
        let _ = writeln!(s, "          }}");
    }
    let _ = writeln!(s, "        }}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::cache::OpOutcome;
    use crate::base::op::Decode;

    /// A sequence whose accessors answer what its windowed cache holds (`pos_max`: the dump's
    /// largest position, which the dump never masks).
    fn seq(cells: &[Pos], windowed: &[Pos]) -> SeqObservation {
        SeqObservation {
            seq: 0,
            pos_min: windowed.first().copied().unwrap_or(-1),
            pos_max: windowed.last().copied().unwrap_or(-1),
            cells: cells.to_vec(),
            second_cells: Some(windowed.to_vec()),
            third_cells: None,
        }
    }

    fn step(before: SeqObservation, after: SeqObservation) -> StepObservation {
        let mut s = StepObservation::basic(OpOutcome::Decoded { rc: 0 }, vec![after]);
        s.before = Some(vec![before]);
        s
    }

    const DECODE: Op = Op::Decode(Decode {
        seqs: Vec::new(),
        n: 1,
        pos: None,
        tokens: None,
    });

    #[test]
    fn a_window_that_follows_positions_holds() {
        // Window 4, positions 0..6 then one more: 3..6 in the window, then 4..7.
        let s = step(
            seq(&[0, 1, 2, 3, 4, 5], &[2, 3, 4, 5]),
            seq(&[0, 1, 2, 3, 4, 5], &[3, 4, 5]),
        );
        assert!(
            check_swa_window(&DECODE, &s, 4).is_none(),
            "2 is masked for the next token 6"
        );
        let s = step(
            seq(&[0, 1, 2, 3, 4, 5, 6], &[3, 4, 5, 6]),
            seq(&[0, 1, 2, 3, 4, 5, 6, 7], &[4, 5, 6, 7]),
        );
        assert!(check_swa_window(&DECODE, &s, 4).is_none());
        // A tail removal after a purge: 3 is back inside the window but was not in W before.
        let s = step(
            seq(&[0, 1, 2, 3, 4, 5, 6, 7], &[5, 6, 7]),
            seq(&[0, 1, 2, 3, 4, 5], &[5]),
        );
        let rm = Op::SeqRm {
            seq: 0,
            p0: 6,
            p1: -1,
        };
        assert!(check_swa_window(&rm, &s, 4).is_none());
    }

    #[test]
    fn the_window_is_keyed_off_the_windowed_caches_own_maximum() {
        // Measured on both pins (fuzz-gemma2, case 186): the windowed cache overwrote seq 0's
        // masked cells up to position 4, then seq_cp(0, 1, 0, 5) gave seq 1 the base cache's
        // positions 2..4 while the windowed cache had none of them left: seq 1's windowed
        // cache holds position 0 alone and the memory answers pos_max 0. The dump keeps 0
        // (masked against the windowed cache's own maximum, 0); measured from the base cache's
        // maximum (4) it would be outside the window.
        let copied = seq(&[0, 2, 3, 3, 4, 4], &[0]);
        let cp = Op::SeqCp {
            src: 0,
            dst: 1,
            p0: 0,
            p1: 5,
        };
        let s = step(seq(&[0], &[0]), copied.clone());
        assert!(check_swa_window(&cp, &s, 4).is_none());
        // The key is the dump's own largest position whatever the accessors answer (a
        // hybrid-iSWA memory answers the smaller of it and its states' maximum): an answer of 4
        // changes nothing, while a dump whose own maximum is 4 breaches rule 2.
        let other_answer = SeqObservation {
            pos_max: 4,
            ..copied.clone()
        };
        assert!(check_swa_window(&cp, &step(seq(&[0], &[0]), other_answer), 4).is_none());
        let base_keyed = seq(&[0, 2, 3, 3, 4, 4], &[0, 4]);
        let v = check_swa_window(&cp, &step(seq(&[0], &[0]), base_keyed), 4).unwrap();
        assert_eq!(v.kind, OUTSIDE_WINDOW);
    }

    #[test]
    fn each_rule_catches_its_forced_mismatch() {
        let v =
            check_swa_window(&DECODE, &step(seq(&[], &[]), seq(&[0, 1], &[0, 1, 2])), 4).unwrap();
        assert_eq!(v.kind, OUTSIDE_BASE);
        let v = check_swa_window(
            &DECODE,
            &step(seq(&[], &[]), seq(&[0, 1, 2, 3, 4], &[0, 1, 2, 3, 4])),
            4,
        )
        .unwrap();
        assert_eq!(v.kind, OUTSIDE_WINDOW);
        // An eviction one position early: 5 is still attended by the next token 8.
        let s = step(
            seq(&[0, 1, 2, 3, 4, 5, 6], &[3, 4, 5, 6]),
            seq(&[0, 1, 2, 3, 4, 5, 6, 7], &[6, 7]),
        );
        let v = check_swa_window(&DECODE, &s, 4).unwrap();
        assert_eq!(
            (v.kind.as_str(), v.observed["position"].as_i64()),
            (EVICTED, Some(5))
        );
        // A shift moves positions: rule 3 does not apply.
        let add = Op::SeqAdd {
            seq: 0,
            p0: 0,
            p1: -1,
            delta: 1,
        };
        assert!(check_swa_window(&add, &s, 4).is_none());
        assert!(SWA_WINDOW.kinds().contains(&v.kind.as_str()));
    }
}
