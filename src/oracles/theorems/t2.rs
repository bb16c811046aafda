//! T2, eviction == a context that never saw the span (shared/seeds/000, Theorem T2; witness
//! `TestKVQuarantineEqualsNeverSaw`).
//!
//! Removing a span with `seq_rm` and shifting the survivors down with `seq_add` must leave the
//! sequence equal, K/V rows, logits and greedy continuation, max |Δ| = 0, to a fresh cache that
//! decoded only the survivors at their new positions, provided no survivor attended the span.
//! That proviso is the theorem's "span-exact, not retroactive": a span evicted after later tokens
//! attended it cannot be un-seen (negative control 1), and a span left in changes the output
//! (negative control 2). Equality needs each moved key to be *one* rotation of its pre-RoPE row
//! at the new position; a rotation composed onto the rotated key by the delta (llama.cpp's
//! K-shift) drifts in the last bits. That each survivor's K is one rotation of its pre-RoPE K
//! holds for any span, too late or not: [`check_reposition`] checks it against the reference replay
//! after every op.
//!
//! [`never_saw_partner`] derives the partner from a trace; it is the fuzz seam.

use crate::base::cache::{CacheUnderTest, HarnessError};
use crate::base::op::{Op, SeqId, Trace};
use crate::model::forward::Model;

use super::pair::{Continuation, Pair};
use super::reference::fresh_prefill_partner;
use super::t1::judge_placement;
use super::{Theorem, TheoremJudgement, Tolerance};

/// The token a derived pair's continuation starts with when the two sides' last logits are not
/// comparable (the trace's last decode went elsewhere).
pub const PROBE_TOKEN: u32 = 1;

/// Greedy tokens a derived pair's continuation decodes after its first.
pub const CONTINUATION: usize = 8;

/// T2's reposition invariant over `trace`: after every op, every moved key is one rotation of its
/// pre-RoPE row at its new position (and everything else is in place): T1 placement against the
/// reference replay, which re-derives moved keys that way, judged as T2's witness.
pub fn check_reposition(
    target: &mut dyn CacheUnderTest,
    trace: &Trace,
    model: &Model,
    tolerance: Tolerance,
) -> Result<TheoremJudgement, HarnessError> {
    judge_placement(Theorem::T2, "reposition", target, trace, model, tolerance)
}

/// The partner of `trace` that never saw the span its last `seq_rm(s, ..)` evicted: a fresh
/// cache that decodes `s`'s survivors at their final positions. `None` when the trace evicts
/// nothing from a single sequence, or when the relation need not hold (a survivor attended the
/// span, transitively; the survivors are not contiguous; see
/// [`super::reference::fresh_prefill_partner`]).
pub fn never_saw_partner(trace: &Trace) -> Option<Trace> {
    fresh_prefill_partner(trace, evicted_seq(trace)?)
}

fn evicted_seq(trace: &Trace) -> Option<SeqId> {
    trace.ops.iter().rev().find_map(|op| {
        let Op::SeqRm { seq, .. } = *op else {
            return None;
        };
        (seq >= 0).then_some(seq)
    })
}

/// The T2 pair of `trace` and its [`never_saw_partner`].
pub fn never_saw_pair(trace: &Trace) -> Option<Pair> {
    let seq = evicted_seq(trace)?;
    let partner = fresh_prefill_partner(trace, seq)?;
    Some(recompute_pair(Theorem::T2, trace, partner, seq))
}

/// A pair of `trace` and a fresh prefill of `seq`: rows of `seq` compared; the logits after the
/// trace compared when the trace ends with a decode into `seq` alone (then both sides' last token
/// is `seq`'s last); a greedy continuation in `seq`.
pub(crate) fn recompute_pair(theorem: Theorem, trace: &Trace, partner: Trace, seq: SeqId) -> Pair {
    let ends_in_seq = trace
        .ops
        .last()
        .and_then(Op::as_decode)
        .is_some_and(|d| d.seqs == [seq]);
    Pair {
        theorem,
        left: trace.clone(),
        right: partner,
        rows: vec![(seq, seq)],
        last_logits: ends_in_seq,
        continuation: Some(Continuation {
            seqs: (seq, seq),
            first: (!ends_in_seq).then_some(PROBE_TOKEN),
            n: CONTINUATION,
        }),
    }
}

/// The seed's never-saw witness: `prefill` puts 7 tokens into seq 0 (A at 0..4, B at 4..7); B is
/// shifted up by 3, A copied to seq 1, `span` (3 tokens) decoded there after it and copied into
/// seq 0 at 4..7, then evicted, and B shifted back. B never attended the span.
#[cfg(test)]
pub(crate) fn never_saw_witness(
    setup: crate::base::op::Setup,
    prefill: Vec<Op>,
    span: Op,
) -> Trace {
    let mut ops = prefill;
    ops.extend([
        Op::SeqAdd {
            seq: 0,
            p0: 4,
            p1: -1,
            delta: 3,
        },
        Op::SeqCp {
            src: 0,
            dst: 1,
            p0: 0,
            p1: 4,
        },
        span,
        Op::SeqCp {
            src: 1,
            dst: 0,
            p0: 4,
            p1: 7,
        },
        Op::SeqRm {
            seq: 0,
            p0: 4,
            p1: 7,
        },
        Op::SeqAdd {
            seq: 0,
            p0: 7,
            p1: -1,
            delta: -3,
        },
    ]);
    Trace { setup, ops }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::op::{Decode, Setup};

    fn decode(seq: SeqId, tokens: &[i32]) -> Op {
        Op::Decode(Decode::tokens(seq, tokens))
    }

    #[test]
    fn span_from_a_sibling_is_never_seen_by_the_survivors() {
        // The survivors B were decoded before the span S existed; S came from seq 1.
        let trace = never_saw_witness(
            Setup::default(),
            vec![decode(0, &[1, 17, 42, 5]), decode(0, &[63, 8, 30])],
            decode(1, &[9, 21, 33]),
        );
        let pair = never_saw_pair(&trace).unwrap();
        assert_eq!(pair.right.ops, vec![decode(0, &[1, 17, 42, 5, 63, 8, 30])]);
        assert!(!pair.last_logits);
        assert_eq!(pair.continuation.unwrap().first, Some(PROBE_TOKEN));
        // Had B been decoded after S was in seq 0, it saw S: no partner.
        let mut late = trace.clone();
        late.ops = vec![
            decode(0, &[1, 17, 42, 5]),
            decode(0, &[9, 21, 33]),
            decode(0, &[63, 8, 30]),
            Op::SeqRm {
                seq: 0,
                p0: 4,
                p1: 7,
            },
            Op::SeqAdd {
                seq: 0,
                p0: 7,
                p1: -1,
                delta: -3,
            },
        ];
        assert_eq!(never_saw_partner(&late), None);
        // No eviction, no partner.
        late.ops.truncate(3);
        assert_eq!(never_saw_partner(&late), None);
    }
}
