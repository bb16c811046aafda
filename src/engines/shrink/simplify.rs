//! The per-op moves of the shrinker's stage 3: each op's strictly smaller variants
//! ([`simplifications`]), the size that orders them ([`op_size`]), and sequence-id swaps across a
//! trace. Every move here returns candidates only; whether one still fails is the shrinker's
//! question (`super`).

use crate::base::op::{Decode, Op, Pos, SeqId, Trace};

/// `op` with each sequence id `s` it names (-1 included) replaced by `f(s)`; `f` sees them in
/// the op's argument order (a copy's source before its destination).
pub fn map_seqs(op: &Op, mut f: impl FnMut(SeqId) -> SeqId) -> Op {
    let mut op = op.clone();
    match &mut op {
        Op::SeqRm { seq, .. }
        | Op::SeqKeep { seq }
        | Op::SeqAdd { seq, .. }
        | Op::SeqDiv { seq, .. }
        | Op::StateSeqSave { seq, .. }
        | Op::StateSeqLoad { seq, .. } => *seq = f(*seq),
        Op::SeqCp { src, dst, .. } => {
            *src = f(*src);
            *dst = f(*dst);
        }
        Op::Clear | Op::StateSave { .. } | Op::StateLoad { .. } => {}
        Op::Decode(d) => d.seqs.iter_mut().for_each(|s| *s = f(*s)),
    }
    op
}

/// `op` with sequence ids `a` and `b` swapped.
pub fn swap_seqs(op: &Op, a: SeqId, b: SeqId) -> Op {
    map_seqs(op, |s| {
        if s == a {
            b
        } else if s == b {
            a
        } else {
            s
        }
    })
}

/// `op` with every explicit position at or above 0 (range ends, a decode's first position)
/// moved `by` down; `None` if one of them is below `by` (the move would open a range end).
pub fn shift_positions(op: &Op, by: Pos) -> Option<Op> {
    let shift = |p: &mut Pos| -> Option<()> {
        if *p >= 0 {
            *p = p.checked_sub(by).filter(|q| *q >= 0)?;
        }
        Some(())
    };
    let mut op = op.clone();
    match &mut op {
        Op::SeqRm { p0, p1, .. }
        | Op::SeqCp { p0, p1, .. }
        | Op::SeqAdd { p0, p1, .. }
        | Op::SeqDiv { p0, p1, .. } => {
            shift(p0)?;
            shift(p1)?;
        }
        Op::Decode(Decode { pos: Some(p), .. }) => shift(p)?,
        Op::Decode(Decode { pos: None, .. })
        | Op::SeqKeep { .. }
        | Op::Clear
        | Op::StateSeqSave { .. }
        | Op::StateSeqLoad { .. }
        | Op::StateSave { .. }
        | Op::StateLoad { .. } => {}
    }
    Some(op)
}

/// The smallest explicit position at or above 0 that `op` names, if any.
pub(super) fn lowest_position(op: &Op) -> Option<Pos> {
    let at_or_above_0 = |ps: &[Pos]| ps.iter().copied().filter(|p| *p >= 0).min();
    match op {
        Op::SeqRm { p0, p1, .. }
        | Op::SeqCp { p0, p1, .. }
        | Op::SeqAdd { p0, p1, .. }
        | Op::SeqDiv { p0, p1, .. } => at_or_above_0(&[*p0, *p1]),
        Op::Decode(d) => d.pos.filter(|p| *p >= 0),
        Op::SeqKeep { .. }
        | Op::Clear
        | Op::StateSeqSave { .. }
        | Op::StateSeqLoad { .. }
        | Op::StateSave { .. }
        | Op::StateLoad { .. } => None,
    }
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

/// An integer argument of an op that the shrinker searches down by bisection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Number {
    /// A range's start, where it is not open.
    P0,
    /// A range's end, where it is not open.
    P1,
    /// A decode's token count.
    Tokens,
    /// A decode's explicit first position.
    Pos,
    /// A damaged load's cut.
    Truncate,
    /// A damaged load's flipped byte.
    Flip,
}

/// The integer arguments of `op` that can go down, each with its value and the least it may
/// take: a range's end stays past its start, a decode keeps a token.
pub(super) fn numbers(op: &Op) -> Vec<(Number, i64, i64)> {
    let mut out = Vec::new();
    let mut range = |p0: Pos, p1: Pos| {
        if p0 > 0 {
            out.push((Number::P0, i64::from(p0), 0));
        }
        if p1 > 0 {
            out.push((Number::P1, i64::from(p1), i64::from(p0.max(0)) + 1));
        }
    };
    match op {
        Op::SeqRm { p0, p1, .. }
        | Op::SeqCp { p0, p1, .. }
        | Op::SeqAdd { p0, p1, .. }
        | Op::SeqDiv { p0, p1, .. } => range(*p0, *p1),
        Op::Decode(d) => {
            out.push((Number::Tokens, i64::from(d.n), 1));
            if let Some(p) = d.pos.filter(|p| *p > 0) {
                out.push((Number::Pos, i64::from(p), 0));
            }
        }
        Op::StateSeqLoad { truncate, flip, .. } | Op::StateLoad { truncate, flip, .. } => {
            for (which, at) in [(Number::Truncate, truncate), (Number::Flip, flip)] {
                if let Some(at) = at.filter(|a| *a > 0) {
                    out.push((which, i64::from(at), 0));
                }
            }
        }
        Op::SeqKeep { .. } | Op::Clear | Op::StateSeqSave { .. } | Op::StateSave { .. } => {}
    }
    out
}

/// `op` with its argument `which` set to `value` (a decode's tokens, if it names them, cut to
/// the count); `op` as it is if it has no such argument.
pub(super) fn with_number(op: &Op, which: Number, value: i64) -> Op {
    let pos = |v: i64| Pos::try_from(v).unwrap_or(Pos::MAX);
    let count = |v: i64| u32::try_from(v).unwrap_or(u32::MAX);
    let mut op = op.clone();
    match &mut op {
        Op::SeqRm { p0, p1, .. }
        | Op::SeqCp { p0, p1, .. }
        | Op::SeqAdd { p0, p1, .. }
        | Op::SeqDiv { p0, p1, .. } => match which {
            Number::P0 => *p0 = pos(value),
            Number::P1 => *p1 = pos(value),
            Number::Tokens | Number::Pos | Number::Truncate | Number::Flip => {}
        },
        Op::Decode(d) => match which {
            Number::Tokens => {
                d.n = count(value);
                if let Some(t) = &mut d.tokens {
                    t.truncate(d.n as usize);
                }
            }
            Number::Pos => d.pos = Some(pos(value)),
            Number::P0 | Number::P1 | Number::Truncate | Number::Flip => {}
        },
        Op::StateSeqLoad { truncate, flip, .. } | Op::StateLoad { truncate, flip, .. } => {
            match which {
                Number::Truncate => *truncate = Some(count(value)),
                Number::Flip => *flip = Some(count(value)),
                Number::P0 | Number::P1 | Number::Tokens | Number::Pos => {}
            }
        }
        Op::SeqKeep { .. } | Op::Clear | Op::StateSeqSave { .. } | Op::StateSave { .. } => {}
    }
    op
}

/// How the shrinker orders traces, smaller first: fewer ops (the setup's included), then smaller
/// arguments apart from sequence ids (summed [`op_size`] with every id read as 0), then the
/// sequence ids in order of appearance compared as a list (each as [`op_size`] counts it: -1
/// above every concrete id). The last part is why renumbering the ids in order of first use is
/// progress even where it leaves their sum as it was: that numbering is the smallest list of all
/// the renumberings. Every move of the shrinker is strictly smaller in it, which is why the
/// fixed-point loop ends.
pub(super) type TraceRank = (usize, u64, Vec<u64>);

/// The [`TraceRank`] of `trace`.
pub(super) fn trace_rank(trace: &Trace) -> TraceRank {
    let all = || trace.setup.ops.iter().chain(&trace.ops);
    let apart_from_seqs = all().map(|op| op_size(&map_seqs(op, |_| 0))).sum();
    let mut seqs = Vec::new();
    for op in all() {
        map_seqs(op, |s| {
            seqs.push(seq_size(s));
            s
        });
    }
    (
        trace.setup.ops.len() + trace.ops.len(),
        apart_from_seqs,
        seqs,
    )
}

/// Smaller sequence ids than `s` (in a context of `n_seqs` sequences), smallest first; `-1`
/// (every sequence) gives every concrete id, and an id past the context's also the first id past
/// it (`n_seqs`), which fails the way a larger one does where a bound is checked.
fn smaller_seqs(s: SeqId, n_seqs: SeqId) -> Vec<SeqId> {
    if s < 0 {
        (0..n_seqs).collect()
    } else if s > n_seqs {
        (0..=n_seqs).collect()
    } else {
        (0..s).collect()
    }
}

/// Smaller byte offsets than `at` (a damaged load's cut or flipped byte): none, then closer to 0.
fn smaller_offsets(at: Option<u32>) -> Vec<Option<u32>> {
    match at {
        None => Vec::new(),
        Some(at) => std::iter::once(None)
            .chain(
                [0, at / 2, at.saturating_sub(1)]
                    .into_iter()
                    .filter(|o| *o < at)
                    .map(Some),
            )
            .collect(),
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
    if let Some(p) = d.pos {
        out.push(Decode {
            pos: None,
            ..d.clone()
        });
        for q in [0, p / 2, p - 1].into_iter().filter(|q| (0..p).contains(q)) {
            out.push(Decode {
                pos: Some(q),
                ..d.clone()
            });
        }
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
            for t in smaller_offsets(*truncate) {
                out.push(at(*seq, *flags, t, *flip));
            }
            for f in smaller_offsets(*flip) {
                out.push(at(*seq, *flags, *truncate, f));
            }
        }
        Op::StateLoad {
            slot,
            truncate,
            flip,
        } => {
            let at = |truncate, flip| Op::StateLoad {
                slot: slot.clone(),
                truncate,
                flip,
            };
            for t in smaller_offsets(*truncate) {
                out.push(at(t, *flip));
            }
            for f in smaller_offsets(*flip) {
                out.push(at(*truncate, f));
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
