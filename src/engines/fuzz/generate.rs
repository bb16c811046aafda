//! The fuzzer's trace generator: proptest strategies ([`trace_strategy`], and
//! [`theorem_trace_strategy`] shaped for T2 and T3) with fork-weighted chunks, one ChaCha stream
//! per case ([`case_runner`]), and [`FuzzTrace`], the `arbitrary` twin for coverage-guided
//! fuzzers.

use arbitrary::{Arbitrary, Unstructured};
use proptest::prelude::*;
use proptest::strategy::Union;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use crate::base::op::{Decode, Op, OpGroup, OpKind, Pos, SeqId, Slot, Trace};
use crate::oracles::theorems::Theorem;
use crate::records::fuzz::GenConfig;

/// Which sequence of a fork a follow-up op touches.
#[derive(Clone, Copy, Debug)]
enum Role {
    Src,
    Dst,
}

/// An op that follows a `seq_cp(src, dst, ..)` in a fork chunk.
#[derive(Clone, Debug)]
enum FollowUp {
    Trim(Role, (Pos, Pos)),
    Shift(Role, (Pos, Pos), Pos),
    Keep(Role),
    CopyAgain((Pos, Pos)),
    Halve(Role, (Pos, Pos), i32),
    Decode(Role, u32),
}

impl FollowUp {
    fn op(&self, src: SeqId, dst: SeqId) -> Op {
        let who = |r: Role| match r {
            Role::Src => src,
            Role::Dst => dst,
        };
        match *self {
            FollowUp::Trim(r, (p0, p1)) => Op::SeqRm {
                seq: who(r),
                p0,
                p1,
            },
            FollowUp::Shift(r, (p0, p1), delta) => Op::SeqAdd {
                seq: who(r),
                p0,
                p1,
                delta,
            },
            FollowUp::Keep(r) => Op::SeqKeep { seq: who(r) },
            FollowUp::CopyAgain((p0, p1)) => Op::SeqCp { src, dst, p0, p1 },
            FollowUp::Halve(r, (p0, p1), d) => Op::SeqDiv {
                seq: who(r),
                p0,
                p1,
                d,
            },
            FollowUp::Decode(r, n) => Op::Decode(Decode::next(who(r), n)),
        }
    }
}

/// A pair of distinct sequences.
fn pair(n: SeqId) -> BoxedStrategy<(SeqId, SeqId)> {
    (0..n, 1..n)
        .prop_map(move |(a, k)| (a, (a + k) % n))
        .boxed()
}

/// A position range: mostly closed and narrow, sometimes open at one end or both.
fn range(g: &GenConfig) -> BoxedStrategy<(Pos, Pos)> {
    let cap = g.pos_cap;
    let width = (cap / 4).max(1);
    prop_oneof![
        6 => (0..cap, 1..=width).prop_map(|(p0, w)| (p0, p0 + w)),
        1 => Just((-1, -1)),
        1 => (0..cap).prop_map(|p0| (p0, -1)),
        1 => (1..=cap).prop_map(|p1| (-1, p1)),
    ]
    .boxed()
}

/// The range of a `seq_cp`: as [`range`], except with one stream per sequence, where llama.cpp
/// only copies whole sequences between streams (a partial copy is a known abort that would end
/// nearly every case): then whole copies, and a partial one in ten.
fn copy_range(g: &GenConfig) -> BoxedStrategy<(Pos, Pos)> {
    if g.whole_copies {
        Just((-1, -1)).boxed()
    } else if g.setup.kv_unified {
        range(g)
    } else {
        prop_oneof![9 => Just((-1, -1)), 1 => range(g)].boxed()
    }
}

fn delta(g: &GenConfig) -> BoxedStrategy<Pos> {
    let m = g.max_delta;
    prop_oneof![(1..=m), (1..=m).prop_map(|d| -d)].boxed()
}

fn decode(g: &GenConfig) -> BoxedStrategy<Decode> {
    let n = g.n_seqs();
    let (tokens, cap) = (g.max_tokens, g.pos_cap);
    let all: Vec<SeqId> = (0..n).collect();
    prop_oneof![
        6 => (0..n, 1..=tokens).prop_map(|(s, k)| Decode::next(s, k)),
        2 => (
            proptest::sample::subsequence(all, 2..=n as usize).prop_shuffle(),
            1..=tokens
        )
            .prop_map(|(seqs, k)| Decode {
                seqs,
                n: k,
                pos: None,
                tokens: None,
            }),
        1 => (0..n, 1..=tokens, 0..=cap).prop_map(|(s, k, p)| Decode {
            pos: Some(p),
            ..Decode::next(s, k)
        }),
    ]
    .boxed()
}

/// Ops of one kind. State ops save or load a sequence (slot `a` or `b`) or the whole context
/// (slot `s`); one load in four is truncated.
pub fn kind_strategy(kind: OpKind, g: &GenConfig) -> BoxedStrategy<Op> {
    let n = g.n_seqs();
    let max_div = g.max_divisor;
    let slot =
        || prop_oneof![Just("a"), Just("b")].prop_map(|s| Slot::new(s).expect("a valid slot name"));
    let whole = || Slot::new("s").expect("a valid slot name");
    let truncate = || prop_oneof![3 => Just(None), 1 => (0u32..64).prop_map(Some)];
    match kind {
        OpKind::SeqRm => (prop_oneof![4 => 0..n, 1 => Just(-1)], range(g))
            .prop_map(|(seq, (p0, p1))| Op::SeqRm { seq, p0, p1 })
            .boxed(),
        OpKind::SeqCp => (pair(n), copy_range(g))
            .prop_map(|((src, dst), (p0, p1))| Op::SeqCp { src, dst, p0, p1 })
            .boxed(),
        OpKind::SeqKeep => (0..n).prop_map(|seq| Op::SeqKeep { seq }).boxed(),
        OpKind::SeqAdd => (0..n, range(g), delta(g))
            .prop_map(|(seq, (p0, p1), delta)| Op::SeqAdd { seq, p0, p1, delta })
            .boxed(),
        OpKind::SeqDiv => (0..n, range(g), 2..=max_div)
            .prop_map(|(seq, (p0, p1), d)| Op::SeqDiv { seq, p0, p1, d })
            .boxed(),
        OpKind::Clear => Just(Op::Clear).boxed(),
        OpKind::Decode => decode(g).prop_map(Op::Decode).boxed(),
        OpKind::StateSeqSave => (0..n, slot())
            .prop_map(|(seq, slot)| Op::StateSeqSave {
                seq,
                slot,
                flags: 0,
            })
            .boxed(),
        OpKind::StateSeqLoad => (0..n, slot(), truncate())
            .prop_map(|(seq, slot, truncate)| Op::StateSeqLoad {
                seq,
                slot,
                flags: 0,
                truncate,
                flip: None,
            })
            .boxed(),
        OpKind::StateSave => Just(Op::StateSave { slot: whole() }).boxed(),
        OpKind::StateLoad => truncate()
            .prop_map(move |truncate| Op::StateLoad {
                slot: whole(),
                truncate,
                flip: None,
            })
            .boxed(),
    }
}

/// One op of `group`: each kind the generator draws ([`GenConfig::draws`]) with its declared
/// weight ([`OpKind::weight`]).
fn group_strategy(group: OpGroup, g: &GenConfig) -> BoxedStrategy<Op> {
    Union::new_weighted(
        group
            .kinds()
            .filter(|&k| g.draws(k))
            .map(|k| (k.weight(), kind_strategy(k, g)))
            .collect(),
    )
    .boxed()
}

/// One op, any kind: a memory op or decode, or (with `g.state`) a state op, the groups weighted
/// by [`OpGroup::weight`].
pub fn op_strategy(g: &GenConfig) -> BoxedStrategy<Op> {
    let memory = group_strategy(OpGroup::Memory, g);
    if g.state {
        prop_oneof![
            OpGroup::Memory.weight() => memory,
            OpGroup::State.weight() => group_strategy(OpGroup::State, g),
        ]
        .boxed()
    } else {
        memory
    }
}

fn role() -> BoxedStrategy<Role> {
    prop_oneof![3 => Just(Role::Dst), 1 => Just(Role::Src)].boxed()
}

fn follow_up(g: &GenConfig) -> BoxedStrategy<FollowUp> {
    let max_div = g.max_divisor;
    let tokens = g.max_tokens;
    // A memory that cannot shift gets no Shift or Halve (weight 0 is not a weight proptest takes).
    let shifts = u32::from(g.draws(OpKind::SeqAdd));
    let mut arms: Vec<(u32, BoxedStrategy<FollowUp>)> = vec![
        (
            4,
            (role(), range(g))
                .prop_map(|(r, x)| FollowUp::Trim(r, x))
                .boxed(),
        ),
        (
            3 * shifts,
            (role(), range(g), delta(g))
                .prop_map(|(r, x, d)| FollowUp::Shift(r, x, d))
                .boxed(),
        ),
        (2, role().prop_map(FollowUp::Keep).boxed()),
        (3, copy_range(g).prop_map(FollowUp::CopyAgain).boxed()),
        (
            shifts,
            (role(), range(g), 2..=max_div)
                .prop_map(|(r, x, d)| FollowUp::Halve(r, x, d))
                .boxed(),
        ),
        (
            2,
            (role(), 1..=tokens)
                .prop_map(|(r, k)| FollowUp::Decode(r, k))
                .boxed(),
        ),
    ];
    arms.retain(|(w, _)| *w > 0);
    Union::new_weighted(arms).boxed()
}

/// A fork: `seq_cp(src, dst, range)` and up to three follow-ups on the same two sequences.
fn fork(g: &GenConfig) -> BoxedStrategy<Vec<Op>> {
    (
        pair(g.n_seqs()),
        copy_range(g),
        proptest::collection::vec(follow_up(g), 0..=3),
    )
        .prop_map(|((src, dst), (p0, p1), rest)| {
            let mut ops = vec![Op::SeqCp { src, dst, p0, p1 }];
            ops.extend(rest.iter().map(|f| f.op(src, dst)));
            ops
        })
        .boxed()
}

/// One chunk of a plain trace: a single op, or (one time in four) a [`fork`].
pub(super) fn chunk_strategy(g: &GenConfig) -> BoxedStrategy<Vec<Op>> {
    prop_oneof![
        3 => op_strategy(g).prop_map(|op| vec![op]),
        1 => fork(g),
    ]
    .boxed()
}

/// Traces of `min_len..=max_len` ops from `g.setup`: single ops and forks, cut to `max_len`;
/// with T2 or T3 in `g.theorems`, the biased [`theorem_trace_strategy`] instead.
pub fn trace_strategy(g: &GenConfig) -> BoxedStrategy<Trace> {
    if g.theorems.iter().any(|&t| t != Theorem::T1) {
        return theorem_trace_strategy(g);
    }
    let setup = g.setup.clone();
    let max_len = g.max_len;
    proptest::collection::vec(chunk_strategy(g), g.min_len..=g.max_len)
        .prop_map(move |chunks| {
            let mut ops: Vec<Op> = chunks.into_iter().flatten().collect();
            ops.truncate(max_len);
            Trace {
                setup: setup.clone(),
                ops,
            }
        })
        .boxed()
}

fn rm_all(seq: SeqId) -> Op {
    Op::SeqRm {
        seq,
        p0: -1,
        p1: -1,
    }
}

fn decode_into(seq: SeqId, n: u32) -> Op {
    Op::Decode(Decode::next(seq, n))
}

/// T2's shapes, on a pair of sequences `s` (emptied first, so that its positions are the
/// chunk's own) and `o`: survivors shifted out of the way of a span that comes from a sibling,
/// the span evicted and the survivors shifted back (the seed's never-saw construction); the same
/// shift out and back with nothing in between; or a tail evicted before anything attended it.
/// Then up to two decodes into `s`.
fn evict_chunk(g: &GenConfig) -> BoxedStrategy<Vec<Op>> {
    (
        pair(g.n_seqs()),
        1..=4i32,
        1..=4i32,
        1..=g.max_delta,
        0..4u8,
        proptest::collection::vec(1..=g.max_tokens, 0..=2),
    )
        .prop_map(|((s, o), a, b, d, shape, tail)| {
            let mut ops = vec![rm_all(s)];
            match shape {
                0 | 1 => {
                    ops.extend([
                        rm_all(o),
                        decode_into(s, a as u32),
                        decode_into(s, b as u32),
                        Op::SeqAdd {
                            seq: s,
                            p0: a,
                            p1: -1,
                            delta: d,
                        },
                        Op::SeqCp {
                            src: s,
                            dst: o,
                            p0: 0,
                            p1: a,
                        },
                        decode_into(o, d as u32),
                        Op::SeqCp {
                            src: o,
                            dst: s,
                            p0: a,
                            p1: a + d,
                        },
                    ]);
                }
                2 => ops.extend([
                    decode_into(s, a as u32),
                    decode_into(s, b as u32),
                    Op::SeqAdd {
                        seq: s,
                        p0: a,
                        p1: -1,
                        delta: d,
                    },
                ]),
                _ => ops.push(decode_into(s, (a + b) as u32)),
            }
            if shape < 3 {
                ops.extend([
                    Op::SeqRm {
                        seq: s,
                        p0: a,
                        p1: a + d,
                    },
                    Op::SeqAdd {
                        seq: s,
                        p0: a + d,
                        p1: -1,
                        delta: -d,
                    },
                ]);
            } else {
                ops.push(Op::SeqRm {
                    seq: s,
                    p0: a,
                    p1: -1,
                });
            }
            ops.extend(tail.into_iter().map(|k| decode_into(s, k)));
            ops
        })
        .boxed()
}

/// T3's prefix reuse: `seq_cp` of a prefix of `s` (rebuilt from empty, or as the trace left
/// it) into an emptied `o`, then up to four tokens decoded into `o`.
fn prefix_chunk(g: &GenConfig) -> BoxedStrategy<Vec<Op>> {
    (
        pair(g.n_seqs()),
        proptest::option::of(1..=8u32),
        prop_oneof![3 => 1..=8i32, 1 => Just(-1)],
        0..=g.max_tokens,
    )
        .prop_map(|((s, o), fresh, p1, k)| {
            let mut ops = Vec::new();
            if let Some(n) = fresh {
                ops.extend([rm_all(s), decode_into(s, n)]);
            }
            ops.extend([
                rm_all(o),
                Op::SeqCp {
                    src: s,
                    dst: o,
                    p0: 0,
                    p1,
                },
            ]);
            if k > 0 {
                ops.push(decode_into(o, k));
            }
            ops
        })
        .boxed()
}

/// T3 under a window `w`: `s` rebuilt with `n > w` tokens, a span evicted that every later
/// query is at least `w` positions past, then up to three decodes (nothing else may follow).
fn window_chunk(g: &GenConfig, w: u32) -> BoxedStrategy<Vec<Op>> {
    let w = w.min(64) as i32;
    (
        0..g.n_seqs(),
        1..=8i32,
        0..64i32,
        0..64i32,
        proptest::collection::vec(1..=g.max_tokens, 0..=3),
    )
        .prop_map(move |(s, extra, e0, len, tail)| {
            let n = w + extra;
            // Evicted positions must be <= n - w (the first later query is at n).
            let last = n - w;
            let e0 = e0 % (last + 1);
            let e1 = e0 + 1 + len % (last + 1 - e0);
            let mut ops = vec![
                rm_all(s),
                decode_into(s, n as u32),
                Op::SeqRm {
                    seq: s,
                    p0: e0,
                    p1: e1,
                },
            ];
            ops.extend(tail.into_iter().map(|k| decode_into(s, k)));
            ops
        })
        .boxed()
}

/// A chunk shaped for one of `g.theorems`; `last`: the chunk ends the trace, so T3's window
/// shape (which nothing but decodes may follow) is allowed.
fn theorem_chunk(g: &GenConfig, last: bool) -> BoxedStrategy<Vec<Op>> {
    let mut shapes: Vec<BoxedStrategy<Vec<Op>>> = Vec::new();
    if g.theorems.contains(&Theorem::T2) {
        shapes.push(evict_chunk(g));
    }
    if g.theorems.contains(&Theorem::T3) {
        shapes.push(prefix_chunk(g));
        if let (true, Some(w)) = (last, g.window) {
            shapes.push(window_chunk(g, w));
        }
    }
    if shapes.is_empty() {
        return op_strategy(g).prop_map(|op| vec![op]).boxed();
    }
    proptest::strategy::Union::new(shapes).boxed()
}

/// Traces biased towards the pairs of T2 and T3 (`g.theorems`): a random prefix of up to
/// `max_len / 4` chunks of the plain generator (which leaves the cells fragmented, shared and
/// shifted), then, with probability 1/3, one theorem chunk, then a last one (`evict_chunk`,
/// `prefix_chunk`, `window_chunk`). The prefix is cut so that the whole fits `max_len`;
/// `min_len` does not apply. The plain generator almost never draws a trace whose last eviction
/// or copy has a partner; these chunks do most of the time, while the prefix still decides
/// where the cells are.
pub fn theorem_trace_strategy(g: &GenConfig) -> BoxedStrategy<Trace> {
    let setup = g.setup.clone();
    let max_len = g.max_len;
    (
        proptest::collection::vec(chunk_strategy(g), 0..=(g.max_len / 4).max(1)),
        proptest::option::weighted(1.0 / 3.0, theorem_chunk(g, false)),
        theorem_chunk(g, true),
    )
        .prop_map(move |(prefix, middle, last)| {
            let tail: Vec<Op> = middle.into_iter().flatten().chain(last).collect();
            let mut ops: Vec<Op> = prefix.into_iter().flatten().collect();
            ops.truncate(max_len.saturating_sub(tail.len()));
            ops.extend(tail);
            ops.truncate(max_len);
            Trace {
                setup: setup.clone(),
                ops,
            }
        })
        .boxed()
}

/// The proptest runner case `case` of seed `seed` draws from: its own ChaCha stream.
pub fn case_runner(seed: u64, case: u64) -> TestRunner {
    stream_runner(b"kvaudit-fuzz-v1\0", seed, case)
}

/// A proptest runner on the ChaCha stream of `label` (at most 16 bytes), `seed` and `case`.
pub(super) fn stream_runner(label: &[u8], seed: u64, case: u64) -> TestRunner {
    let mut bytes = [0u8; 32];
    bytes[..label.len()].copy_from_slice(label);
    bytes[16..24].copy_from_slice(&seed.to_le_bytes());
    bytes[24..].copy_from_slice(&case.to_le_bytes());
    TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    )
}

/// The trace of case `case` of seed `seed`.
pub fn generate(g: &GenConfig, seed: u64, case: u64) -> Trace {
    trace_strategy(g)
        .new_tree(&mut case_runner(seed, case))
        .expect("the generator rejects nothing")
        .current()
}

/// A trace drawn by `arbitrary` (for coverage-guided fuzzers such as `cargo fuzz`) over the
/// default generator's domain, with the same fork weighting; its length follows the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuzzTrace(pub Trace);

fn arb_range(u: &mut Unstructured<'_>, g: &GenConfig) -> arbitrary::Result<(Pos, Pos)> {
    let cap = g.pos_cap;
    Ok(match u.int_in_range(0..=8u8)? {
        0 => (-1, -1),
        1 => (u.int_in_range(0..=cap - 1)?, -1),
        2 => (-1, u.int_in_range(1..=cap)?),
        _ => {
            let p0 = u.int_in_range(0..=cap - 1)?;
            (p0, p0 + u.int_in_range(1..=(cap / 4).max(1))?)
        }
    })
}

fn arb_delta(u: &mut Unstructured<'_>, g: &GenConfig) -> arbitrary::Result<Pos> {
    let d = u.int_in_range(1..=g.max_delta)?;
    Ok(if u.arbitrary()? { d } else { -d })
}

fn arb_pair(u: &mut Unstructured<'_>, n: SeqId) -> arbitrary::Result<(SeqId, SeqId)> {
    let a = u.int_in_range(0..=n - 1)?;
    let k = u.int_in_range(1..=n - 1)?;
    Ok((a, (a + k) % n))
}

/// An item of `items`, drawn by weight from one byte (the weights sum to at most 256).
fn arb_weighted<T: Copy>(u: &mut Unstructured<'_>, items: &[(u32, T)]) -> arbitrary::Result<T> {
    let total: u32 = items.iter().map(|&(w, _)| w).sum();
    let mut r = u32::from(u.int_in_range(0..=(total - 1) as u8)?);
    for &(w, item) in items {
        if r < w {
            return Ok(item);
        }
        r -= w;
    }
    unreachable!("r is below the total weight")
}

/// One op, any kind, drawn by `arbitrary` with the weights of [`op_strategy`].
pub fn arb_op(u: &mut Unstructured<'_>, g: &GenConfig) -> arbitrary::Result<Op> {
    let weighted =
        |group: OpGroup| -> Vec<(u32, OpKind)> { group.kinds().map(|k| (k.weight(), k)).collect() };
    let group = if g.state {
        arb_weighted(
            u,
            &[
                (OpGroup::Memory.weight(), OpGroup::Memory),
                (OpGroup::State.weight(), OpGroup::State),
            ],
        )?
    } else {
        OpGroup::Memory
    };
    let kinds: Vec<(u32, OpKind)> = weighted(group)
        .into_iter()
        .filter(|&(_, k)| g.draws(k))
        .collect();
    let kind = arb_weighted(u, &kinds)?;
    arb_kind_op(u, g, kind)
}

/// An op of `kind`, as [`kind_strategy`] draws it.
fn arb_kind_op(u: &mut Unstructured<'_>, g: &GenConfig, kind: OpKind) -> arbitrary::Result<Op> {
    let n = g.n_seqs();
    let seq = |u: &mut Unstructured<'_>| u.int_in_range(0..=n - 1);
    let slot = |u: &mut Unstructured<'_>| -> arbitrary::Result<Slot> {
        let name = if u.arbitrary()? { "a" } else { "b" };
        Ok(Slot::new(name).expect("a valid slot name"))
    };
    let whole = || Slot::new("s").expect("a valid slot name");
    let truncate = |u: &mut Unstructured<'_>| -> arbitrary::Result<Option<u32>> {
        Ok(if u.ratio(1, 4)? {
            Some(u.int_in_range(0..=63)?)
        } else {
            None
        })
    };
    Ok(match kind {
        OpKind::SeqRm => {
            let seq = if u.ratio(1, 5)? { -1 } else { seq(u)? };
            let (p0, p1) = arb_range(u, g)?;
            Op::SeqRm { seq, p0, p1 }
        }
        OpKind::SeqCp => {
            let (src, dst) = arb_pair(u, n)?;
            let (p0, p1) = arb_range(u, g)?;
            Op::SeqCp { src, dst, p0, p1 }
        }
        OpKind::SeqKeep => Op::SeqKeep { seq: seq(u)? },
        OpKind::SeqAdd => {
            let s = seq(u)?;
            let (p0, p1) = arb_range(u, g)?;
            Op::SeqAdd {
                seq: s,
                p0,
                p1,
                delta: arb_delta(u, g)?,
            }
        }
        OpKind::SeqDiv => {
            let s = seq(u)?;
            let (p0, p1) = arb_range(u, g)?;
            Op::SeqDiv {
                seq: s,
                p0,
                p1,
                d: u.int_in_range(2..=g.max_divisor)?,
            }
        }
        OpKind::Clear => Op::Clear,
        OpKind::Decode => {
            let k = u.int_in_range(1..=g.max_tokens)?;
            let mut d = Decode::next(seq(u)?, k);
            match u.int_in_range(0..=8u8)? {
                0 => d.pos = Some(u.int_in_range(0..=g.pos_cap)?),
                1 | 2 => {
                    let other = (d.seqs[0] + u.int_in_range(1..=n - 1)?) % n;
                    d.seqs.push(other);
                }
                _ => {}
            }
            Op::Decode(d)
        }
        OpKind::StateSeqSave => Op::StateSeqSave {
            seq: seq(u)?,
            slot: slot(u)?,
            flags: 0,
        },
        OpKind::StateSeqLoad => Op::StateSeqLoad {
            seq: seq(u)?,
            slot: slot(u)?,
            flags: 0,
            truncate: truncate(u)?,
            flip: None,
        },
        OpKind::StateSave => Op::StateSave { slot: whole() },
        OpKind::StateLoad => Op::StateLoad {
            slot: whole(),
            truncate: truncate(u)?,
            flip: None,
        },
    })
}

fn arb_chunk(u: &mut Unstructured<'_>, g: &GenConfig, out: &mut Vec<Op>) -> arbitrary::Result<()> {
    if !u.ratio(1, 4)? {
        out.push(arb_op(u, g)?);
        return Ok(());
    }
    let (src, dst) = arb_pair(u, g.n_seqs())?;
    let (p0, p1) = arb_range(u, g)?;
    out.push(Op::SeqCp { src, dst, p0, p1 });
    for _ in 0..u.int_in_range(0..=3u8)? {
        let r = if u.ratio(1, 4)? { Role::Src } else { Role::Dst };
        // As `follow_up`: no shift where the memory cannot shift; the range trims instead.
        let shifts = g.draws(OpKind::SeqAdd);
        let f = match u.int_in_range(0..=14u8)? {
            0..=3 => FollowUp::Trim(r, arb_range(u, g)?),
            4..=6 if shifts => FollowUp::Shift(r, arb_range(u, g)?, arb_delta(u, g)?),
            12 if shifts => {
                FollowUp::Halve(r, arb_range(u, g)?, u.int_in_range(2..=g.max_divisor)?)
            }
            4..=6 | 12 => FollowUp::Trim(r, arb_range(u, g)?),
            7 | 8 => FollowUp::Keep(r),
            9..=11 => FollowUp::CopyAgain(arb_range(u, g)?),
            _ => FollowUp::Decode(r, u.int_in_range(1..=g.max_tokens)?),
        };
        out.push(f.op(src, dst));
    }
    Ok(())
}

impl<'a> Arbitrary<'a> for FuzzTrace {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let g = GenConfig::default();
        let mut ops = Vec::new();
        while !u.is_empty() && ops.len() < g.max_len {
            arb_chunk(u, &g, &mut ops)?;
        }
        ops.truncate(g.max_len);
        Ok(FuzzTrace(Trace {
            setup: g.setup,
            ops,
        }))
    }
}
