//! T3, the sliding window and prefix reuse (shared/seeds/000, Theorem T3; witnesses
//! `TestSWAWindowMasksOldKeys`, `TestSWAWindowUnsetIsNoOp`, `TestKVPrefixReuseMatchesRecompute`).
//!
//! - The visible-key bound: a query at absolute position `p` under window `W` attends the keys
//!   from the first whose position is `>= p - W + 1` ([`check_window_bounds`], a table run
//!   through the native cache itself, so an injected index-keyed bound fails it).
//! - Masking by position survives eviction: evicting keys no later query can see is a no-op
//!   ([`out_of_window_pair`]); a bound read by index instead of position breaks that as soon as an
//!   eviction leaves a gap.
//! - No window is full causal, a window at least as long as the sequence is full causal, and a
//!   real window changes the output: pairs of one trace on two configurations
//!   ([`super::check_pair_on`]); a windowed forward equals the `-inf`-masked cacheless reference
//!   ([`super::t1::check_paths`] with a windowed model).
//! - Prefix reuse: `seq_cp` a prefix to a new sequence and decode a suffix there equals decoding
//!   prefix and suffix fresh: last logits, greedy continuation and cache length
//!   ([`prefix_partner`], the fuzz seam).

use serde::{Deserialize, Serialize};

use native_kv::tensors::TensorShape;
use native_kv::{BatchToken, CacheConfig, CellCache, Faults};

use crate::base::op::{Op, OpKind, Pos, SeqId, Trace};

use super::pair::{Continuation, Pair};
use super::reference::{fresh_prefill_partner, Reference};
use super::t2::{recompute_pair, CONTINUATION, PROBE_TOKEN};
use super::{Measurement, Theorem, Tolerance, Verdict};

/// One row of the visible-key bound table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoundRow {
    /// Positions of the resident keys of one sequence (ascending, distinct).
    pub positions: Vec<Pos>,
    /// The query position.
    pub query: Pos,
    /// The window (`None`: unset).
    pub window: Option<u32>,
    /// Index (into `positions`) of the first visible key.
    pub lo: usize,
}

/// The bound the native cache applies: a cache with keys at `positions` (decoded from 0, the
/// missing positions evicted, rows written), asked which keys a query at `query` attends.
pub fn window_bound_on_native(
    faults: Faults,
    positions: &[Pos],
    query: Pos,
    window: Option<u32>,
) -> usize {
    let end = positions.iter().copied().max().map_or(0, |m| m + 1);
    let mut cache = CellCache::with_tensors(
        CacheConfig {
            n_ctx: (end as u32).max(1).next_multiple_of(256),
            faults,
            ..CacheConfig::default()
        },
        TensorShape::new(1, 1, 2, 10000.0).with_window(window),
    );
    if end > 0 {
        let batch: Vec<BatchToken> = (0..end)
            .map(|_| BatchToken {
                token: 0,
                pos: None,
                seqs: vec![0],
            })
            .collect();
        let cells = cache.decode(&batch).expect("positions fit the cache");
        for cell in cells {
            cache.write_rows(cell, 0, &[0.0; 2], &[0.0; 2], &[0.0; 2]);
        }
        for p in (0..end).filter(|p| !positions.contains(p)) {
            cache.seq_rm(0, p, p + 1).expect("seq 0");
        }
    }
    let visible = cache
        .attention_cells(0, query, 0, None)
        .expect("seq 0")
        .len();
    let causal = positions.iter().filter(|&&p| p <= query).count();
    causal - visible
}

/// T3's bound table on the native cache with `faults`: every row's bound as expected.
pub fn check_window_bounds(faults: Faults, rows: &[BoundRow]) -> Verdict {
    let mut m = Measurement::default();
    for (i, r) in rows.iter().enumerate() {
        let lo = window_bound_on_native(faults, &r.positions, r.query, r.window);
        if lo != r.lo {
            m.mismatch(|| {
                format!(
                    "row {i}: positions {:?}, query {}, window {:?}: first visible key {lo}, expected {}",
                    r.positions, r.query, r.window, r.lo
                )
            });
        }
    }
    Verdict::judge(Theorem::T3, "window bound", Tolerance::EXACT, m)
}

fn copied_seq(trace: &Trace) -> Option<SeqId> {
    trace.ops.iter().rev().find_map(|op| {
        let Op::SeqCp { dst, .. } = *op else {
            return None;
        };
        (dst >= 0).then_some(dst)
    })
}

/// The recompute partner of `trace`'s last prefix copy: a fresh cache that decodes what the
/// copy's destination holds at the end, in one batch. `None` without a `seq_cp`, or when the
/// destination is not what a fresh prefill would hold.
pub fn prefix_partner(trace: &Trace) -> Option<Trace> {
    fresh_prefill_partner(trace, copied_seq(trace)?)
}

/// The T3 pair of `trace` and its [`prefix_partner`].
pub fn prefix_pair(trace: &Trace) -> Option<Pair> {
    let seq = copied_seq(trace)?;
    let partner = fresh_prefill_partner(trace, seq)?;
    Some(recompute_pair(Theorem::T3, trace, partner, seq))
}

/// Entries (sequence, position) that `op` takes out of the reference `r`.
fn evicted_by(r: &Reference<'_>, op: &Op) -> Option<Vec<(SeqId, Pos)>> {
    let mut after = r.clone();
    after.apply(op).ok()?;
    let mut out = Vec::new();
    for e in r.entries() {
        let left = after
            .entries()
            .iter()
            .find(|a| a.id == e.id)
            .map_or(0, |a| a.seqs);
        let gone = e.seqs & !left;
        for s in 0..64 {
            if gone & (1u64 << s) != 0 {
                out.push((s, e.pos));
            }
        }
    }
    Some(out)
}

/// The partner of `trace` without its last `seq_rm`, when everything that `seq_rm` evicts is out
/// of the window `window` of every later query (each later op a decode, at the same positions on
/// both sides) and of the continuation's first query. Then the two must agree on logits and
/// continuation; their resident sets differ by design, so rows are not compared.
pub fn out_of_window_partner(trace: &Trace, window: u32) -> Option<Trace> {
    let r_at = trace
        .ops
        .iter()
        .rposition(|op| op.kind() == OpKind::SeqRm)?;
    let mut x = Reference::new(&trace.setup, None);
    for op in trace.setup.ops.iter().chain(&trace.ops[..r_at]) {
        x.apply(op).ok()?;
    }
    let mut y = x.clone();
    let evicted = evicted_by(&x, &trace.ops[r_at])?;
    if evicted.is_empty() {
        return None;
    }
    x.apply(&trace.ops[r_at]).ok()?;
    let far = |s: SeqId, q: Pos| {
        evicted
            .iter()
            .all(|&(es, ep)| es != s || i64::from(q) - i64::from(ep) >= i64::from(window))
    };
    for op in &trace.ops[r_at + 1..] {
        let Op::Decode(d) = op else { return None };
        let (px, py) = (x.resolve(d).ok()?, y.resolve(d).ok()?);
        if px != py || !py.iter().all(|&q| far(d.seqs[0], q)) {
            return None;
        }
        x.apply(op).ok()?;
        y.apply(op).ok()?;
    }
    let cont = continuation_seq(trace, r_at)?;
    let next = y.resolve(&crate::base::op::Decode::next(cont, 1)).ok()?[0];
    if !far(cont, next) {
        return None;
    }
    let mut partner = trace.clone();
    partner.ops.remove(r_at);
    Some(partner)
}

/// The sequence a derived window pair continues: that of the last decode after the eviction,
/// else the evicted one.
fn continuation_seq(trace: &Trace, r_at: usize) -> Option<SeqId> {
    trace.ops[r_at + 1..]
        .iter()
        .rev()
        .find_map(|op| op.as_decode().map(|d| d.seqs[0]))
        .or_else(|| {
            // trace.ops[r_at] is the eviction, a seq_rm.
            let Op::SeqRm { seq, .. } = trace.ops[r_at] else {
                return None;
            };
            (seq >= 0).then_some(seq)
        })
}

/// The T3 pair of `trace` and its [`out_of_window_partner`].
pub fn out_of_window_pair(trace: &Trace, window: u32) -> Option<Pair> {
    let partner = out_of_window_partner(trace, window)?;
    let r_at = trace
        .ops
        .iter()
        .rposition(|op| op.kind() == OpKind::SeqRm)?;
    let seq = continuation_seq(trace, r_at)?;
    let ends_in_decode =
        r_at + 1 < trace.ops.len() && trace.ops.last().and_then(Op::as_decode).is_some();
    Some(Pair {
        theorem: Theorem::T3,
        left: trace.clone(),
        right: partner,
        rows: Vec::new(),
        last_logits: ends_in_decode,
        continuation: Some(Continuation {
            seqs: (seq, seq),
            first: (!ends_in_decode).then_some(PROBE_TOKEN),
            n: CONTINUATION,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::op::{Decode, Setup};

    fn decode(seq: SeqId, tokens: &[i32]) -> Op {
        Op::Decode(Decode::tokens(seq, tokens))
    }

    #[test]
    fn the_native_bound_follows_positions() {
        let rows = [
            BoundRow {
                positions: vec![0, 1, 2, 7, 8],
                query: 8,
                window: Some(3),
                lo: 3,
            },
            BoundRow {
                positions: vec![0, 1, 2, 3],
                query: 3,
                window: Some(1),
                lo: 3,
            },
            BoundRow {
                positions: vec![0, 1, 2, 3],
                query: 3,
                window: None,
                lo: 0,
            },
        ];
        assert!(check_window_bounds(Faults::default(), &rows).holds);
        let faulty = Faults {
            window_index_keyed: true,
            ..Faults::default()
        };
        let v = check_window_bounds(faulty, &rows);
        assert!(!v.holds);
        assert!(v.measurement.first_difference.unwrap().contains("row 0"));
    }

    #[test]
    fn out_of_window_eviction_has_a_partner_and_a_near_one_has_none() {
        let trace = |rm: (Pos, Pos)| Trace {
            setup: Setup::default(),
            ops: vec![
                decode(0, &[1, 2, 3, 4, 5, 6, 7, 8, 9]),
                Op::SeqRm {
                    seq: 0,
                    p0: rm.0,
                    p1: rm.1,
                },
                decode(0, &[10]),
            ],
        };
        let far = out_of_window_pair(&trace((3, 7)), 3).unwrap();
        assert_eq!(far.right.ops.len(), 2);
        assert!(far.last_logits);
        // Position 7 is inside the window of the query at 9.
        assert_eq!(out_of_window_partner(&trace((3, 8)), 3), None);
        // A prefix copy has a recompute partner.
        let t = Trace {
            setup: Setup::default(),
            ops: vec![
                decode(0, &[1, 2, 3]),
                Op::SeqCp {
                    src: 0,
                    dst: 1,
                    p0: 0,
                    p1: -1,
                },
                decode(1, &[4, 5]),
            ],
        };
        let p = prefix_pair(&t).unwrap();
        assert_eq!(p.right.ops, vec![decode(1, &[1, 2, 3, 4, 5])]);
        assert!(p.last_logits);
    }
}
