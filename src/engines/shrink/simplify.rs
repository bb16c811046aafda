//! The per-op moves of the shrinker's stage 3: each op's strictly smaller variants
//! ([`simplifications`]), the size that orders them ([`op_size`]), and sequence-id swaps across a
//! trace. Every move here returns candidates only; whether one still fails is the shrinker's
//! question (`super`).

use crate::base::op::{Decode, Op, Pos, SeqId};

/// `op` with sequence ids `a` and `b` swapped.
pub fn swap_seqs(op: &Op, a: SeqId, b: SeqId) -> Op {
    let sw = |s: SeqId| {
        if s == a {
            b
        } else if s == b {
            a
        } else {
            s
        }
    };
    let mut op = op.clone();
    match &mut op {
        Op::SeqRm { seq, .. }
        | Op::SeqKeep { seq }
        | Op::SeqAdd { seq, .. }
        | Op::SeqDiv { seq, .. }
        | Op::StateSeqSave { seq, .. }
        | Op::StateSeqLoad { seq, .. } => *seq = sw(*seq),
        Op::SeqCp { src, dst, .. } => {
            *src = sw(*src);
            *dst = sw(*dst);
        }
        Op::Clear | Op::StateSave { .. } | Op::StateLoad { .. } => {}
        Op::Decode(d) => d.seqs.iter_mut().for_each(|s| *s = sw(*s)),
    }
    op
}

const OPEN: u64 = 1 << 20;

fn seq_size(s: SeqId) -> u64 {
    match s {
        s if s >= 0 => s as u64,
        -1 => 64,
        _ => 128,
    }
}

fn pos_size(p: Pos) -> u64 {
    if p < 0 {
        OPEN
    } else {
        p as u64
    }
}

fn delta_size(d: Pos) -> u64 {
    2 * d.unsigned_abs() as u64 + u64::from(d < 0)
}

/// The size of an op's arguments: every simplification makes it strictly smaller, which is
/// why shrinking ends. Open range ends, explicit decode positions and explicit tokens count
/// as large.
pub fn op_size(op: &Op) -> u64 {
    match op {
        Op::SeqRm { seq, p0, p1 } => seq_size(*seq) + pos_size(*p0) + pos_size(*p1),
        Op::SeqCp { src, dst, p0, p1 } => {
            seq_size(*src) + seq_size(*dst) + pos_size(*p0) + pos_size(*p1)
        }
        Op::SeqKeep { seq } => seq_size(*seq),
        Op::SeqAdd { seq, p0, p1, delta } => {
            seq_size(*seq) + pos_size(*p0) + pos_size(*p1) + delta_size(*delta)
        }
        Op::SeqDiv { seq, p0, p1, d } => {
            seq_size(*seq) + pos_size(*p0) + pos_size(*p1) + d.unsigned_abs() as u64
        }
        Op::Clear => 0,
        Op::StateSeqSave { seq, flags, .. } => seq_size(*seq) + u64::from(*flags),
        Op::StateSeqLoad {
            seq,
            flags,
            truncate,
            flip,
            ..
        } => {
            seq_size(*seq)
                + u64::from(*flags)
                + truncate.map_or(0, |t| OPEN + u64::from(t))
                + flip.map_or(0, |f| OPEN + u64::from(f))
        }
        Op::StateSave { .. } => 0,
        Op::StateLoad { truncate, flip, .. } => {
            truncate.map_or(0, |t| OPEN + u64::from(t)) + flip.map_or(0, |f| OPEN + u64::from(f))
        }
        Op::Decode(d) => {
            d.n as u64
                + d.seqs.iter().map(|&s| 1 + seq_size(s)).sum::<u64>()
                + d.pos.map_or(0, |p| OPEN + pos_size(p))
                + d.tokens.as_ref().map_or(0, |_| OPEN)
        }
    }
}

/// The total size of an op list: its length first, then the sum of [`op_size`].
pub(super) fn trace_size(ops: &[Op]) -> (usize, u64) {
    (ops.len(), ops.iter().map(op_size).sum())
}

/// Smaller sequence ids than `s` (in a context of `n_seqs` sequences), smallest first; `-1`
/// (every sequence) gives every concrete id.
fn smaller_seqs(s: SeqId, n_seqs: SeqId) -> Vec<SeqId> {
    if s < 0 {
        (0..n_seqs).collect()
    } else {
        (0..s.min(n_seqs)).collect()
    }
}

/// Simpler ranges than `[p0, p1)`.
fn smaller_ranges(p0: Pos, p1: Pos) -> Vec<(Pos, Pos)> {
    let mut out = Vec::new();
    let lo = p0.max(0);
    if p1 < 0 {
        // Open end made closed: the narrowest first, then doubling widths.
        let mut w = 1;
        while w <= 1024 {
            out.push((p0, lo + w));
            w *= 2;
        }
    } else if p1 > lo + 1 {
        for q in [lo + 1, lo + (p1 - lo) / 2, p1 - 1] {
            out.push((p0, q));
        }
    }
    if p0 < 0 {
        out.push((0, p1));
    } else if p0 > 0 {
        for q in [0, p0 / 2, p0 - 1] {
            out.push((q, p1));
        }
    }
    out
}

fn smaller_deltas(d: Pos) -> Vec<Pos> {
    [1, -1, 2, -2, d / 2, d - d.signum()]
        .into_iter()
        .filter(|&x| x != 0 && delta_size(x) < delta_size(d))
        .collect()
}

fn smaller_decodes(d: &Decode, n_seqs: SeqId) -> Vec<Decode> {
    let mut out = Vec::new();
    if d.tokens.is_some() {
        out.push(Decode {
            tokens: None,
            ..d.clone()
        });
    }
    if d.pos.is_some() {
        out.push(Decode {
            pos: None,
            ..d.clone()
        });
    }
    for n in [1, d.n / 2, d.n.saturating_sub(1)] {
        if n >= 1 && n < d.n {
            out.push(Decode {
                n,
                tokens: d.tokens.as_ref().map(|t| t[..n as usize].to_vec()),
                ..d.clone()
            });
        }
    }
    if d.seqs.len() > 1 {
        for j in 0..d.seqs.len() {
            let mut seqs = d.seqs.clone();
            seqs.remove(j);
            out.push(Decode { seqs, ..d.clone() });
        }
    }
    for j in 0..d.seqs.len() {
        for s in smaller_seqs(d.seqs[j], n_seqs) {
            if !d.seqs.contains(&s) {
                let mut seqs = d.seqs.clone();
                seqs[j] = s;
                out.push(Decode { seqs, ..d.clone() });
            }
        }
    }
    out
}

/// The simplifications of one op that stage 3 tries, simplest first: each is strictly smaller
/// in [`op_size`] and keeps the op's kind. `n_seqs` is the context's `n_seq_max`.
pub fn simplifications(op: &Op, n_seqs: SeqId) -> Vec<Op> {
    let mut out: Vec<Op> = Vec::new();
    match op {
        &Op::SeqRm { seq, p0, p1 } => {
            out.extend(
                smaller_seqs(seq, n_seqs)
                    .into_iter()
                    .map(|seq| Op::SeqRm { seq, p0, p1 }),
            );
            out.extend(
                smaller_ranges(p0, p1)
                    .into_iter()
                    .map(|(p0, p1)| Op::SeqRm { seq, p0, p1 }),
            );
        }
        &Op::SeqCp { src, dst, p0, p1 } => {
            for s in smaller_seqs(src, n_seqs) {
                out.push(Op::SeqCp {
                    src: s,
                    dst,
                    p0,
                    p1,
                });
            }
            for s in smaller_seqs(dst, n_seqs) {
                out.push(Op::SeqCp {
                    src,
                    dst: s,
                    p0,
                    p1,
                });
            }
            for (p0, p1) in smaller_ranges(p0, p1) {
                out.push(Op::SeqCp { src, dst, p0, p1 });
            }
        }
        &Op::SeqKeep { seq } => {
            out.extend(
                smaller_seqs(seq, n_seqs)
                    .into_iter()
                    .map(|seq| Op::SeqKeep { seq }),
            );
        }
        &Op::SeqAdd { seq, p0, p1, delta } => {
            for s in smaller_seqs(seq, n_seqs) {
                out.push(Op::SeqAdd {
                    seq: s,
                    p0,
                    p1,
                    delta,
                });
            }
            for (p0, p1) in smaller_ranges(p0, p1) {
                out.push(Op::SeqAdd { seq, p0, p1, delta });
            }
            for delta in smaller_deltas(delta) {
                out.push(Op::SeqAdd { seq, p0, p1, delta });
            }
        }
        &Op::SeqDiv { seq, p0, p1, d } => {
            for s in smaller_seqs(seq, n_seqs) {
                out.push(Op::SeqDiv { seq: s, p0, p1, d });
            }
            for (p0, p1) in smaller_ranges(p0, p1) {
                out.push(Op::SeqDiv { seq, p0, p1, d });
            }
            for d in [2, d / 2, d - 1] {
                if d >= 2 {
                    out.push(Op::SeqDiv { seq, p0, p1, d });
                }
            }
        }
        Op::Clear | Op::StateSave { .. } => {}
        Op::StateSeqSave { seq, slot, flags } => {
            for s in smaller_seqs(*seq, n_seqs) {
                out.push(Op::StateSeqSave {
                    seq: s,
                    slot: slot.clone(),
                    flags: *flags,
                });
            }
            if *flags != 0 {
                out.push(Op::StateSeqSave {
                    seq: *seq,
                    slot: slot.clone(),
                    flags: 0,
                });
            }
        }
        Op::StateSeqLoad {
            seq,
            slot,
            flags,
            truncate,
            flip,
        } => {
            let at = |seq, flags, truncate, flip| Op::StateSeqLoad {
                seq,
                slot: slot.clone(),
                flags,
                truncate,
                flip,
            };
            for s in smaller_seqs(*seq, n_seqs) {
                out.push(at(s, *flags, *truncate, *flip));
            }
            if *flags != 0 {
                out.push(at(*seq, 0, *truncate, *flip));
            }
            if truncate.is_some() {
                out.push(at(*seq, *flags, None, *flip));
            }
            if flip.is_some() {
                out.push(at(*seq, *flags, *truncate, None));
            }
        }
        Op::StateLoad {
            slot,
            truncate,
            flip,
        } => {
            if truncate.is_some() {
                out.push(Op::StateLoad {
                    slot: slot.clone(),
                    truncate: None,
                    flip: *flip,
                });
            }
            if flip.is_some() {
                out.push(Op::StateLoad {
                    slot: slot.clone(),
                    truncate: *truncate,
                    flip: None,
                });
            }
        }
        Op::Decode(d) => out.extend(smaller_decodes(d, n_seqs).into_iter().map(Op::Decode)),
    }
    let size = op_size(op);
    out.retain(|c| op_size(c) < size);
    // Simplest first; among equals, generation order (stable sort).
    out.sort_by_key(op_size);
    let mut seen = Vec::with_capacity(out.len());
    out.retain(|c| {
        if seen.contains(c) {
            false
        } else {
            seen.push(c.clone());
            true
        }
    });
    out
}
