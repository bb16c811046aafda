//! Random exploration: a seeded trace generator, and the loop that runs, judges and shrinks.
//!
//! Exhaustive audits stop at small depths over small domains; the bugs that need several
//! sequences forked, trimmed, shifted and decoded again live in long, wide traces. The generator
//! ([`trace_strategy`], a proptest strategy, and [`FuzzTrace`], its `arbitrary` twin for
//! coverage-guided fuzzers) draws traces of up to [`GenConfig::max_len`] ops over every sequence
//! of the context, open and closed ranges, positive and negative deltas, divisors of at least 2,
//! and single- and multi-sequence decodes. Forks are weighted: a `seq_cp` is often followed at
//! once by trims, shifts and copies of the same pair of sequences.
//!
//! Seeds. Case `i` of seed `s` is drawn from its own ChaCha stream ([`case_runner`]), so a case
//! can be drawn again without the cases before it, and a seed gives the same traces on every
//! machine. [`run_fuzz`] judges every step of every case ([`crate::running::judge`]), shrinks each new
//! failure ([`crate::engines::shrink`]) and keeps one finding per oracle, kind and shape of the minimal
//! trace. Everything it decides is a function of the seed and the number of cases; only the
//! wall-clock figures differ between runs (and how many cases a `--time` limit lets through).
//!
//! Theorem oracles ([`run_fuzz_with`], `--oracles T1,T2,T3`). Each case is also offered to each
//! requested theorem on a [`TheoremChecker`]: T1 judges it as it is, T2 and T3 judge the pair
//! each of their derivations gives ([`crate::oracles::theorems::derive_pairs`]). A case with no pair is
//! counted as such ([`TheoremStats`]), never as a pass; a violated check is shrunk with the same
//! moves while the same derivation still gives a violated pair, and becomes a
//! [`TheoremFinding`]. Plain traces rarely end in a shape with a partner (about 5% of them for
//! T2 or T3, none out of the window), so with T2 or T3 the generator appends chunks shaped for
//! them ([`theorem_trace_strategy`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde::{Deserialize, Serialize};

use crate::base::domain::Domain;
use crate::base::op::{Decode, Op, Pos, SeqId, Setup, Trace};
use crate::base::target::HarnessError;
use crate::engines::shrink::{shape, shrink_tree, shrink_tree_by, FailureMode, ShrinkConfig};
use crate::engines::theorem_check::{StillViolated, TheoremChecker};
use crate::oracles::theorems::{Derivation, Judgement as TheoremJudgement, Theorem, Verdict};
use crate::oracles::OracleId;
use crate::records::report::{Event, Finding, FindingKey, Report, Shard, Timing};
use crate::records::tally::Tally;
use crate::running::judge::Judge;
use crate::running::runner::RunnerFactory;

/// What the generator draws from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenConfig {
    /// Where every trace starts (kept fixed by the shrinker). Its `n_seq_max` is the number of
    /// sequences the ops name.
    pub setup: Setup,
    /// Shortest trace.
    pub min_len: usize,
    /// Longest trace.
    pub max_len: usize,
    /// Largest position in a range or an explicit decode position.
    pub pos_cap: Pos,
    /// Largest `|delta|` of a `seq_add`.
    pub max_delta: Pos,
    /// Largest divisor of a `seq_div` (the smallest is 2).
    pub max_divisor: i32,
    /// Most tokens in one decode.
    pub max_tokens: u32,
    /// Theorems to bias the draws towards (`kvaudit fuzz --oracles T2,T3`): with T2 or T3 here,
    /// each trace is a random prefix followed by one or two chunks shaped so that the theorem's
    /// derivations find a partner ([`theorem_trace_strategy`]). Empty: the plain generator.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub theorems: Vec<Theorem>,
    /// The target's sliding window, when it has one: the biased generator then also draws
    /// evictions of keys out of every later query's window (T3's out-of-window pairs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u32>,
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig::with_max_len(64)
    }
}

impl GenConfig {
    /// The default generator for traces of `max_len / 2 ..= max_len` ops: the seed's setup
    /// (positions 0..6 in seq 0) in a context of 4 sequences.
    pub fn with_max_len(max_len: usize) -> Self {
        GenConfig {
            setup: Setup {
                n_ctx: 256,
                n_seq_max: 4,
                ops: vec![Op::Decode(Decode::next(0, 7))],
            },
            min_len: (max_len / 2).max(1),
            max_len,
            pos_cap: 32,
            max_delta: 8,
            max_divisor: 4,
            max_tokens: 4,
            theorems: Vec::new(),
            window: None,
        }
    }

    /// Checks the bounds before anything runs.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_len == 0 {
            return Err("--max-len must be at least 1".into());
        }
        if self.min_len == 0 || self.min_len > self.max_len {
            return Err(format!(
                "--min-len must be in 1..={} (--max-len), got {}",
                self.max_len, self.min_len
            ));
        }
        if self.setup.n_seq_max < 2 {
            return Err("the context needs at least 2 sequences to fork".into());
        }
        if self.pos_cap < 2 || self.max_delta < 1 || self.max_divisor < 2 || self.max_tokens < 1 {
            return Err("pos_cap >= 2, max_delta >= 1, max_divisor >= 2, max_tokens >= 1".into());
        }
        Ok(())
    }

    fn n_seqs(&self) -> SeqId {
        self.setup.n_seq_max as SeqId
    }
}

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

/// One op, any kind.
pub fn op_strategy(g: &GenConfig) -> BoxedStrategy<Op> {
    let n = g.n_seqs();
    let max_div = g.max_divisor;
    prop_oneof![
        8 => (prop_oneof![4 => 0..n, 1 => Just(-1)], range(g))
            .prop_map(|(seq, (p0, p1))| Op::SeqRm { seq, p0, p1 }),
        6 => (pair(n), range(g)).prop_map(|((src, dst), (p0, p1))| Op::SeqCp { src, dst, p0, p1 }),
        3 => (0..n).prop_map(|seq| Op::SeqKeep { seq }),
        6 => (0..n, range(g), delta(g))
            .prop_map(|(seq, (p0, p1), delta)| Op::SeqAdd { seq, p0, p1, delta }),
        3 => (0..n, range(g), 2..=max_div)
            .prop_map(|(seq, (p0, p1), d)| Op::SeqDiv { seq, p0, p1, d }),
        1 => Just(Op::Clear),
        10 => decode(g).prop_map(Op::Decode),
    ]
    .boxed()
}

fn role() -> BoxedStrategy<Role> {
    prop_oneof![3 => Just(Role::Dst), 1 => Just(Role::Src)].boxed()
}

fn follow_up(g: &GenConfig) -> BoxedStrategy<FollowUp> {
    let max_div = g.max_divisor;
    let tokens = g.max_tokens;
    prop_oneof![
        4 => (role(), range(g)).prop_map(|(r, x)| FollowUp::Trim(r, x)),
        3 => (role(), range(g), delta(g)).prop_map(|(r, x, d)| FollowUp::Shift(r, x, d)),
        2 => role().prop_map(FollowUp::Keep),
        3 => range(g).prop_map(FollowUp::CopyAgain),
        1 => (role(), range(g), 2..=max_div).prop_map(|(r, x, d)| FollowUp::Halve(r, x, d)),
        2 => (role(), 1..=tokens).prop_map(|(r, k)| FollowUp::Decode(r, k)),
    ]
    .boxed()
}

/// A fork: `seq_cp(src, dst, range)` and up to three follow-ups on the same two sequences.
fn fork(g: &GenConfig) -> BoxedStrategy<Vec<Op>> {
    (
        pair(g.n_seqs()),
        range(g),
        proptest::collection::vec(follow_up(g), 0..=3),
    )
        .prop_map(|((src, dst), (p0, p1), rest)| {
            let mut ops = vec![Op::SeqCp { src, dst, p0, p1 }];
            ops.extend(rest.iter().map(|f| f.op(src, dst)));
            ops
        })
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
    let chunk = prop_oneof![
        3 => op_strategy(g).prop_map(|op| vec![op]),
        1 => fork(g),
    ];
    proptest::collection::vec(chunk, g.min_len..=g.max_len)
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
    let chunk = prop_oneof![
        3 => op_strategy(g).prop_map(|op| vec![op]),
        1 => fork(g),
    ];
    (
        proptest::collection::vec(chunk, 0..=(g.max_len / 4).max(1)),
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
    let mut bytes = [0u8; 32];
    bytes[..16].copy_from_slice(b"kvaudit-fuzz-v1\0");
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

fn arb_op(u: &mut Unstructured<'_>, g: &GenConfig) -> arbitrary::Result<Op> {
    let n = g.n_seqs();
    let seq = |u: &mut Unstructured<'_>| u.int_in_range(0..=n - 1);
    Ok(match u.int_in_range(0..=36u8)? {
        0..=7 => {
            let seq = if u.ratio(1, 5)? { -1 } else { seq(u)? };
            let (p0, p1) = arb_range(u, g)?;
            Op::SeqRm { seq, p0, p1 }
        }
        8..=13 => {
            let (src, dst) = arb_pair(u, n)?;
            let (p0, p1) = arb_range(u, g)?;
            Op::SeqCp { src, dst, p0, p1 }
        }
        14..=16 => Op::SeqKeep { seq: seq(u)? },
        17..=22 => {
            let s = seq(u)?;
            let (p0, p1) = arb_range(u, g)?;
            Op::SeqAdd {
                seq: s,
                p0,
                p1,
                delta: arb_delta(u, g)?,
            }
        }
        23..=25 => {
            let s = seq(u)?;
            let (p0, p1) = arb_range(u, g)?;
            Op::SeqDiv {
                seq: s,
                p0,
                p1,
                d: u.int_in_range(2..=g.max_divisor)?,
            }
        }
        26 => Op::Clear,
        _ => {
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
        let f = match u.int_in_range(0..=14u8)? {
            0..=3 => FollowUp::Trim(r, arb_range(u, g)?),
            4..=6 => FollowUp::Shift(r, arb_range(u, g)?, arb_delta(u, g)?),
            7 | 8 => FollowUp::Keep(r),
            9..=11 => FollowUp::CopyAgain(arb_range(u, g)?),
            12 => FollowUp::Halve(r, arb_range(u, g)?, u.int_in_range(2..=g.max_divisor)?),
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

/// What a fuzz run does.
#[derive(Clone, Debug)]
pub struct FuzzConfig {
    /// The seed (printed at the start of a run).
    pub seed: u64,
    /// Cases to run; `None`: until `time` runs out.
    pub cases: Option<u64>,
    /// Wall-time limit, shrinking included.
    pub time: Option<Duration>,
    /// The generator.
    pub gen: GenConfig,
    /// Shrinking limits.
    pub shrink: ShrinkConfig,
    /// How many failures of one signature (oracle, kind, op at the failing step) are shrunk;
    /// later ones are counted against the finding of the first.
    pub shrinks_per_signature: u32,
    /// The observation oracles to judge; `None`: I1, I2, crash, and differential with a second
    /// target (the default).
    pub oracles: Option<Vec<OracleId>>,
    /// The numerical theorems to check on each case (they need a [`TheoremChecker`]).
    pub theorems: Vec<Theorem>,
}

/// How one finding of a fuzz run was found and shrunk (same order as the report's findings).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShrinkRecord {
    /// Target(s), oracle, kind and op names of the minimal trace: what findings are told
    /// apart by.
    pub shape: String,
    /// The case (from 0) that found it first.
    pub case: u64,
    /// Length of that case's trace.
    pub length: usize,
    /// The first step of that trace that violated the oracle.
    pub step: usize,
    /// Length of the shrunk trace.
    pub shrunk_len: usize,
    /// Target executions the shrink took.
    pub executions: u64,
    /// Wall time the shrink took, in seconds.
    pub elapsed_s: f64,
    /// True if the shrink reached its fixed point (see [`crate::engines::shrink`]).
    pub minimal: bool,
    /// Later failing cases that came to the same finding.
    pub duplicates: u64,
}

impl ShrinkRecord {
    /// One line: how the finding was found and what shrinking it took.
    pub fn summary(&self) -> String {
        format!(
            "found by case {} ({} ops, first fails at step {}); shrunk to {} ops{} in {} executions, {:.3} s; {} more failing case(s) came to it",
            self.case,
            self.length,
            self.step,
            self.shrunk_len,
            if self.minimal { " (minimal)" } else { " (budget ran out)" },
            self.executions,
            self.elapsed_s,
            self.duplicates
        )
    }
}

/// The fuzz-specific part of a report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FuzzSummary {
    /// The seed.
    pub seed: u64,
    /// The generator.
    pub generator: GenConfig,
    /// Cases run.
    pub cases: u64,
    /// Target executions, cases and shrinking together.
    pub executions: u64,
    /// Of which shrinking.
    pub shrink_executions: u64,
    /// Wall time spent shrinking, in seconds.
    pub shrink_elapsed_s: f64,
    /// One per finding, in the report's order.
    pub findings: Vec<ShrinkRecord>,
    /// The oracles asked for with `--oracles` (absent: the default set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracles: Option<Vec<String>>,
    /// Per theorem checked (`--oracles T1,T2,T3`): how many cases it judged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub theorems: Vec<TheoremStats>,
    /// Violated theorems, one per theorem, derivation and shape of the shrunk trace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub theorem_findings: Vec<TheoremFinding>,
}

/// What one theorem did over a fuzz run. Every case is offered to it; a case from which no pair
/// derives is `no_pair`, neither a pass nor a failure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TheoremStats {
    /// The theorem.
    pub theorem: Theorem,
    /// Cases offered.
    pub cases: u64,
    /// Cases judged by at least one check (T1: every case the target could show).
    pub checked: u64,
    /// Cases no derivation gave a pair for.
    pub no_pair: u64,
    /// Cases whose every check was unsupported by the target.
    pub unsupported: u64,
    /// Cases with a violated check.
    pub violations: u64,
    /// Judged checks per derivation (`placement` for T1).
    pub pairs: BTreeMap<String, u64>,
}

impl TheoremStats {
    /// The share of the cases that were judged.
    pub fn checked_fraction(&self) -> f64 {
        self.checked as f64 / (self.cases.max(1)) as f64
    }

    /// One line: cases, judged, no pair, unsupported, violated, pairs by derivation.
    pub fn summary(&self) -> String {
        let by: Vec<String> = self.pairs.iter().map(|(d, n)| format!("{d} {n}")).collect();
        format!(
            "{}: {} cases, {} checked ({:.1}%), {} no pair, {} unsupported, {} violated; checks: {}",
            self.theorem.name(),
            self.cases,
            self.checked,
            100.0 * self.checked_fraction(),
            self.no_pair,
            self.unsupported,
            self.violations,
            if by.is_empty() { "none".to_string() } else { by.join(", ") }
        ) + if self.checked == 0 {
            " (never checked: this run says nothing about it)"
        } else {
            ""
        }
    }
}

/// A violated theorem: the shrunk trace, its partner and the verdict, and how it was found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TheoremFinding {
    /// The theorem.
    pub theorem: Theorem,
    /// How the pair was derived (absent for T1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub derivation: Option<Derivation>,
    /// The target it was seen on.
    pub target: String,
    /// Theorem, derivation and op names of the shrunk trace: what findings are told apart by.
    pub shape: String,
    /// The shrunk trace (the pair's left side).
    pub trace: Trace,
    /// Its derived partner (the right side), for T2 and T3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partner: Option<Trace>,
    /// The verdict on the shrunk trace.
    pub verdict: Verdict,
    /// The case (from 0) that found it first.
    pub case: u64,
    /// Length of that case's trace.
    pub length: usize,
    /// Length of the shrunk trace.
    pub shrunk_len: usize,
    /// Target executions the shrink took.
    pub executions: u64,
    /// Wall time the shrink took, in seconds.
    pub elapsed_s: f64,
    /// True if the shrink reached its fixed point.
    pub minimal: bool,
    /// Later failing cases that came to the same finding.
    pub duplicates: u64,
}

impl TheoremFinding {
    /// One line: how the finding was found and what shrinking it took.
    pub fn summary(&self) -> String {
        format!(
            "found by case {} ({} ops); shrunk to {} ops{} in {} executions, {:.3} s; {} more failing case(s) came to it",
            self.case,
            self.length,
            self.shrunk_len,
            if self.minimal { " (minimal)" } else { " (budget ran out)" },
            self.executions,
            self.elapsed_s,
            self.duplicates
        )
    }

    fn title(&self) -> String {
        match self.derivation {
            Some(d) => format!("{} {} pair violated on {}", self.theorem, d, self.target),
            None => format!("{} placement violated on {}", self.theorem, self.target),
        }
    }
}

impl FuzzSummary {
    /// The theorem part of the terminal report (empty without theorem oracles); `numbered`
    /// findings came before.
    pub fn theorems_terminal(&self, numbered: usize) -> String {
        let mut s = String::new();
        if self.theorems.is_empty() {
            return s;
        }
        let _ = writeln!(
            s,
            "\ntheorem oracles (window {}):",
            window_text(self.generator.window)
        );
        for t in &self.theorems {
            let _ = writeln!(s, "  {}", t.summary());
        }
        for (i, f) in self.theorem_findings.iter().enumerate() {
            let _ = writeln!(s, "\nfinding {}: {}", numbered + i + 1, f.title());
            let _ = write!(s, "{}", f.trace);
            if let Some(p) = &f.partner {
                let _ = writeln!(s, "  partner:");
                let _ = write!(s, "{p}");
            }
            let _ = writeln!(s, "  {}", f.verdict);
            let _ = writeln!(s, "  {}", f.summary());
        }
        s
    }

    /// The theorem part of the Markdown report (empty without theorem oracles).
    pub fn theorems_markdown(&self, numbered: usize) -> String {
        let mut s = String::new();
        if self.theorems.is_empty() {
            return s;
        }
        let _ = writeln!(
            s,
            "\n## Theorem oracles\n\nWindow {}.\n\n| theorem | cases | checked | no pair | unsupported | violated | checks |\n|---|---:|---:|---:|---:|---:|---|",
            window_text(self.generator.window)
        );
        for t in &self.theorems {
            let by: Vec<String> = t.pairs.iter().map(|(d, n)| format!("{d} {n}")).collect();
            let _ = writeln!(
                s,
                "| {} | {} | {} ({:.1}%) | {} | {} | {} | {} |",
                t.theorem.name(),
                t.cases,
                t.checked,
                100.0 * t.checked_fraction(),
                t.no_pair,
                t.unsupported,
                t.violations,
                by.join(", ")
            );
        }
        for (i, f) in self.theorem_findings.iter().enumerate() {
            let _ = writeln!(s, "\n## Finding {}: {}\n", numbered + i + 1, f.title());
            let _ = writeln!(s, "```text\n{}```\n", f.trace);
            if let Some(p) = &f.partner {
                let _ = writeln!(s, "Partner:\n\n```text\n{p}```\n");
            }
            let _ = writeln!(s, "- verdict: {}\n- {}", f.verdict, f.summary());
        }
        s
    }
}

fn window_text(w: Option<u32>) -> String {
    w.map_or("unset".into(), |w| w.to_string())
}

/// The domain a fuzz report names: the generator's setup and sequences.
fn fuzz_domain(g: &GenConfig) -> Domain {
    Domain {
        name: "fuzz".into(),
        setup: g.setup.clone(),
        seqs: (0..g.n_seqs()).collect(),
        ranges: Vec::new(),
        deltas: Vec::new(),
        divisors: Vec::new(),
        rm_all: true,
        copies: true,
        keep: true,
        clear: true,
        decode_next: Vec::new(),
    }
}

/// Runs random cases, judges every step, shrinks each new failure; `sink` sees the events.
pub fn run_fuzz(
    cfg: &FuzzConfig,
    runner_a: &RunnerFactory<'_>,
    runner_b: Option<&RunnerFactory<'_>>,
    sink: &mut dyn FnMut(&Event),
) -> Result<Report, HarnessError> {
    run_fuzz_with(cfg, runner_a, runner_b, None, sink)
}

/// Counters and findings of the theorem oracles over a run.
struct TheoremRun<'c> {
    checker: &'c mut TheoremChecker,
    stats: Vec<TheoremStats>,
    /// Per signature (theorem, derivation, target): shrinks done, and the first one's shape.
    by_signature: BTreeMap<String, (u32, String)>,
    findings: BTreeMap<String, TheoremFinding>,
}

impl TheoremRun<'_> {
    /// Offers case `case` (`trace`) to every theorem; shrinks each new violation. Returns the
    /// shrinking executions and time spent.
    fn case(
        &mut self,
        cfg: &FuzzConfig,
        strategy: &BoxedStrategy<Trace>,
        case: u64,
        trace: &Trace,
    ) -> Result<(u64, Duration), HarnessError> {
        let label = self.checker.info().label();
        let (mut executions, mut elapsed) = (0, Duration::ZERO);
        for st in &mut self.stats {
            let theorem = st.theorem;
            st.cases += 1;
            let checks = self.checker.check(theorem, trace)?;
            if checks.is_empty() {
                st.no_pair += 1;
                continue;
            }
            let mut judged = false;
            for c in &checks {
                if let TheoremJudgement::Judged(_) = c.judgement {
                    judged = true;
                    let name = c.derivation.map_or("placement", Derivation::name);
                    *st.pairs.entry(name.into()).or_default() += 1;
                }
            }
            st.checked += u64::from(judged);
            st.unsupported += u64::from(!judged);
            st.violations += u64::from(checks.iter().any(|c| c.violated()));
            for c in checks.into_iter().filter(|c| c.violated()) {
                let derivation = c.derivation;
                let dname = derivation.map_or("placement", Derivation::name);
                let signature = format!("{theorem}|{dname}|{label}");
                if let Some((done, first)) = self.by_signature.get(&signature) {
                    if *done >= cfg.shrinks_per_signature {
                        if let Some(f) = self.findings.get_mut(first) {
                            f.duplicates += 1;
                        }
                        continue;
                    }
                }
                let mut tree = strategy
                    .new_tree(&mut case_runner(cfg.seed, case))
                    .expect("the generator rejects nothing");
                let pred = StillViolated {
                    checker: self.checker,
                    theorem,
                    derivation,
                };
                // The target is deterministic, so the case fails again; should it not, the
                // unshrunk case is the finding.
                let shrunk = shrink_tree_by(&mut tree, pred, &cfg.shrink)?;
                let (small, check, ex, el, minimal) = match shrunk {
                    Some(s) => (s.trace, s.failure, s.executions, s.elapsed, s.minimal),
                    None => (trace.clone(), c, 0, Duration::ZERO, false),
                };
                executions += ex;
                elapsed += el;
                let names: Vec<&str> = small.ops.iter().map(Op::name).collect();
                let shape = format!("{label}|{theorem}|{dname}|{}", names.join(","));
                let entry = self
                    .by_signature
                    .entry(signature)
                    .or_insert((0, shape.clone()));
                entry.0 += 1;
                if let Some(f) = self.findings.get_mut(&shape) {
                    f.duplicates += 1;
                    continue;
                }
                let TheoremJudgement::Judged(verdict) = check.judgement else {
                    unreachable!("a violated check is judged")
                };
                self.findings.insert(
                    shape.clone(),
                    TheoremFinding {
                        theorem,
                        derivation,
                        target: label.clone(),
                        shape,
                        shrunk_len: small.ops.len(),
                        partner: check.pair.map(|p| p.right),
                        trace: small,
                        verdict,
                        case,
                        length: trace.ops.len(),
                        executions: ex,
                        elapsed_s: el.as_secs_f64(),
                        minimal,
                        duplicates: 0,
                    },
                );
            }
        }
        Ok((executions, elapsed))
    }
}

/// [`run_fuzz`] with the theorem oracles of `cfg.theorems` checked on `checker` (required when
/// there are any): each case is offered to each theorem, each violated check shrunk while the
/// same derivation still gives a violated pair.
pub fn run_fuzz_with(
    cfg: &FuzzConfig,
    runner_a: &RunnerFactory<'_>,
    runner_b: Option<&RunnerFactory<'_>>,
    checker: Option<&mut TheoremChecker>,
    sink: &mut dyn FnMut(&Event),
) -> Result<Report, HarnessError> {
    let mut judge = Judge::new(runner_a, runner_b)?;
    let mut theorems = match (checker, cfg.theorems.is_empty()) {
        (_, true) => None,
        (Some(checker), false) => Some(TheoremRun {
            checker,
            stats: cfg
                .theorems
                .iter()
                .map(|&theorem| TheoremStats {
                    theorem,
                    cases: 0,
                    checked: 0,
                    no_pair: 0,
                    unsupported: 0,
                    violations: 0,
                    pairs: BTreeMap::new(),
                })
                .collect(),
            by_signature: BTreeMap::new(),
            findings: BTreeMap::new(),
        }),
        (None, false) => {
            return Err(HarnessError::Target {
                target: judge.label(),
                message: "theorem oracles need a target that exposes rows and logits".into(),
            })
        }
    };
    let label = judge.label();
    let (info_a, info_b) = (judge.target().clone(), judge.vs().cloned());
    let strategy = trace_strategy(&cfg.gen);
    let total = cfg.cases.unwrap_or(0);
    sink(&Event::FuzzStart {
        target: info_a.clone(),
        vs: info_b.clone(),
        seed: cfg.seed,
        cases: cfg.cases,
        min_len: cfg.gen.min_len,
        max_len: cfg.gen.max_len,
        time_s: cfg.time.map(|t| t.as_secs_f64()),
    });
    let wanted = match &cfg.oracles {
        Some(list) => list.clone(),
        None => judge
            .oracles()
            .observing(info_b.is_some())
            .map(|o| o.id())
            .collect(),
    };
    let started = Instant::now();
    let mut last_progress = started;
    let mut tally = Tally::default();
    // Per signature: shrinks done, and the shape the first one came to.
    let mut by_signature: BTreeMap<FindingKey, (u32, String)> = BTreeMap::new();
    let mut records: BTreeMap<String, ShrinkRecord> = BTreeMap::new();
    let (mut shrink_executions, mut shrink_elapsed) = (0u64, Duration::ZERO);
    let mut case = 0u64;
    loop {
        if cfg.cases.is_some_and(|n| case >= n) || cfg.time.is_some_and(|t| started.elapsed() >= t)
        {
            break;
        }
        let trace = strategy
            .new_tree(&mut case_runner(cfg.seed, case))
            .expect("the generator rejects nothing")
            .current();
        if let Some(t) = &mut theorems {
            let (ex, el) = t.case(cfg, &strategy, case, &trace)?;
            shrink_executions += ex;
            shrink_elapsed += el;
        }
        tally.trials += 1;
        if wanted.is_empty() {
            case += 1;
            if last_progress.elapsed() >= Duration::from_millis(100) {
                last_progress = Instant::now();
                sink(&Event::Progress {
                    done: case,
                    total,
                    elapsed_s: started.elapsed().as_secs_f64(),
                });
            }
            continue;
        }
        let verdict = judge.run(&trace)?;
        tally.unsupported += u64::from(verdict.unsupported.is_some());
        for &oracle in &wanted {
            let s = tally.oracles.entry(oracle).or_default();
            s.checked += 1;
            if let Some(v) = verdict.first(oracle) {
                s.violations += 1;
                let d = v.step as u32;
                s.first_depth = Some(s.first_depth.map_or(d, |f| f.min(d)));
            }
        }
        for v in &verdict.violations {
            if !wanted.contains(&v.violation.oracle) {
                continue;
            }
            if v.step == 0 {
                return Err(HarnessError::Setup {
                    target: label.clone(),
                    op: "setup".into(),
                    message: format!("{}", v.violation),
                });
            }
            let mode = FailureMode::of(&v.violation);
            let who = judge.label_of(v);
            let signature =
                FindingKey::new(mode.oracle, &who, &mode.kind, trace.ops[v.step - 1].name());
            if let Some((done, first_shape)) = by_signature.get(&signature) {
                if *done >= cfg.shrinks_per_signature {
                    if let Some(r) = records.get_mut(first_shape) {
                        r.duplicates += 1;
                    }
                    continue;
                }
            }
            let mut tree = strategy
                .new_tree(&mut case_runner(cfg.seed, case))
                .expect("the generator rejects nothing");
            let shrunk = shrink_tree(&mut tree, &mode, &mut judge, &cfg.shrink)?
                .expect("the case failed this way a moment ago");
            shrink_executions += shrunk.executions;
            shrink_elapsed += shrunk.elapsed;
            let shape = format!("{who}|{}", shape(&mode, &shrunk.trace));
            let entry = by_signature.entry(signature).or_insert((0, shape.clone()));
            entry.0 += 1;
            let new = !records.contains_key(&shape);
            sink(&Event::Shrunk {
                oracle: mode.oracle,
                kind: mode.kind.clone(),
                case,
                length: trace.ops.len(),
                step: v.step,
                shrunk_len: shrunk.trace.ops.len(),
                executions: shrunk.executions,
                elapsed_s: shrunk.elapsed.as_secs_f64(),
                new,
            });
            if !new {
                records.get_mut(&shape).expect("present").duplicates += 1;
                continue;
            }
            let f = shrunk.failure.violation;
            let finding = Finding {
                oracle: f.oracle,
                kind: f.kind,
                target: who,
                depth: shrunk.trace.ops.len() as u32,
                trial_index: case,
                step: shrunk.failure.step,
                seq: f.seq,
                trace: shrunk.trace,
                observed: f.observed,
                expected: f.expected,
            };
            sink(&Event::Finding(finding.clone()));
            records.insert(
                shape.clone(),
                ShrinkRecord {
                    shape: shape.clone(),
                    case,
                    length: trace.ops.len(),
                    step: v.step,
                    shrunk_len: finding.trace.ops.len(),
                    executions: shrunk.executions,
                    elapsed_s: shrunk.elapsed.as_secs_f64(),
                    minimal: shrunk.minimal,
                    duplicates: 0,
                },
            );
            let key = FindingKey {
                shape,
                ..finding.key()
            };
            tally.findings.insert(key, finding);
        }
        case += 1;
        if last_progress.elapsed() >= Duration::from_millis(100) {
            last_progress = Instant::now();
            sink(&Event::Progress {
                done: case,
                total,
                elapsed_s: started.elapsed().as_secs_f64(),
            });
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    tally.asked(wanted.iter().copied());
    let mut report = Report::new(
        info_a,
        info_b,
        fuzz_domain(&cfg.gen),
        cfg.gen.max_len as u32,
        Shard::WHOLE,
        tally,
        Timing {
            elapsed_s: elapsed,
            trials_per_s: case as f64 / elapsed.max(1e-9),
        },
    );
    let findings = report
        .findings
        .iter()
        .map(|f| {
            let mode = FailureMode {
                oracle: f.oracle,
                kind: f.kind.clone(),
            };
            records[&format!("{}|{}", f.target, shape(&mode, &f.trace))].clone()
        })
        .collect();
    let (theorem_executions, stats, theorem_findings) = match theorems {
        Some(t) => {
            let mut f: Vec<TheoremFinding> = t.findings.into_values().collect();
            f.sort_by(|a, b| {
                (a.theorem, a.derivation, a.case, &a.shape).cmp(&(
                    b.theorem,
                    b.derivation,
                    b.case,
                    &b.shape,
                ))
            });
            (t.checker.executions(), t.stats, f)
        }
        None => (0, Vec::new(), Vec::new()),
    };
    report.fuzz = Some(FuzzSummary {
        seed: cfg.seed,
        generator: cfg.gen.clone(),
        cases: case,
        executions: judge.executions() + theorem_executions,
        shrink_executions,
        shrink_elapsed_s: shrink_elapsed.as_secs_f64(),
        findings,
        oracles: cfg.oracles.as_ref().map(|o| {
            o.iter()
                .map(|o| o.name().to_string())
                .chain(cfg.theorems.iter().map(|t| t.name().to_string()))
                .collect()
        }),
        theorems: stats,
        theorem_findings,
    });
    sink(&Event::Done(Box::new(report.clone())));
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::targets::registry::TargetSpec;

    #[test]
    fn a_seed_draws_the_same_traces_every_time() {
        let g = GenConfig::default();
        for case in [0, 1, 17] {
            assert_eq!(generate(&g, 7, case), generate(&g, 7, case));
        }
        assert_ne!(generate(&g, 7, 0), generate(&g, 8, 0));
        assert_ne!(generate(&g, 7, 0), generate(&g, 7, 1));
    }

    #[test]
    fn traces_stay_in_the_generator_domain() {
        let g = GenConfig::with_max_len(40);
        let mut forks_then_more = 0;
        for case in 0..50 {
            let t = generate(&g, 1, case);
            assert!((20..=40).contains(&t.ops.len()), "{}", t.ops.len());
            assert_eq!(t.setup, g.setup);
            for (i, op) in t.ops.iter().enumerate() {
                op.for_each_seq(|s| assert!((0..4).contains(&s), "{op}"));
                match op {
                    Op::SeqDiv { d, .. } => assert!((2..=4).contains(d)),
                    Op::SeqAdd { delta, .. } => assert!(*delta != 0 && delta.abs() <= 8),
                    Op::SeqCp { src, dst, .. } => {
                        assert_ne!(src, dst);
                        if matches!(t.ops.get(i + 1), Some(Op::SeqRm { .. } | Op::SeqAdd { .. })) {
                            forks_then_more += 1;
                        }
                    }
                    Op::Decode(d) => assert!((1..=4).contains(&d.n)),
                    _ => {}
                }
            }
        }
        assert!(
            forks_then_more > 50,
            "forks followed by trims/shifts: {forks_then_more}"
        );
    }

    #[test]
    fn arbitrary_traces_are_deterministic_and_in_domain() {
        let data: Vec<u8> = (0..4096u32)
            .map(|i| (i * 2_654_435_761u32 >> 13) as u8)
            .collect();
        let a = FuzzTrace::arbitrary(&mut Unstructured::new(&data)).unwrap();
        let b = FuzzTrace::arbitrary(&mut Unstructured::new(&data)).unwrap();
        assert_eq!(a, b);
        assert!(!a.0.ops.is_empty() && a.0.ops.len() <= 64);
        for op in &a.0.ops {
            op.for_each_seq(|s| assert!((0..4).contains(&s), "{op}"));
        }
    }

    #[test]
    fn the_theorem_bias_makes_pairs_likely_and_stays_in_bounds() {
        use crate::oracles::theorems::derive_pairs;
        let mut g = GenConfig::with_max_len(24);
        let plain = |g: &GenConfig, t: Theorem| {
            (0..100)
                .filter(|&c| !derive_pairs(t, &generate(g, 5, c), g.window).is_empty())
                .count()
        };
        let (t2_plain, t3_plain) = (plain(&g, Theorem::T2), plain(&g, Theorem::T3));
        g.theorems = vec![Theorem::T2, Theorem::T3];
        g.window = Some(3);
        assert_eq!(generate(&g, 5, 9), generate(&g, 5, 9));
        for c in 0..100 {
            let t = generate(&g, 5, c);
            assert!(t.ops.len() <= 24 && !t.ops.is_empty(), "{}", t.ops.len());
            assert_eq!(t.setup, g.setup);
        }
        let (t2, t3) = (plain(&g, Theorem::T2), plain(&g, Theorem::T3));
        assert!(
            t2 > 30 && t2 > 3 * t2_plain,
            "T2: {t2} biased, {t2_plain} plain"
        );
        assert!(
            t3 > 30 && t3 > 3 * t3_plain,
            "T3: {t3} biased, {t3_plain} plain"
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_findings() {
        let f = TargetSpec::new("native", &["refcount".into()])
            .factory()
            .unwrap();
        let cfg = FuzzConfig {
            seed: 3,
            cases: Some(40),
            time: None,
            gen: GenConfig::with_max_len(32),
            shrink: ShrinkConfig::default(),
            shrinks_per_signature: 1,
            oracles: None,
            theorems: Vec::new(),
        };
        let run = || run_fuzz(&cfg, f.as_ref(), None, &mut |_| {}).unwrap();
        let (a, b) = (run(), run());
        assert!(a.has_findings());
        assert_eq!(a.findings, b.findings);
        let strip = |r: &Report| {
            let mut s = r.fuzz.clone().unwrap();
            s.shrink_elapsed_s = 0.0;
            s.findings.iter_mut().for_each(|f| f.elapsed_s = 0.0);
            s
        };
        assert_eq!(strip(&a), strip(&b));
        assert_eq!(a.oracles, b.oracles);
    }
}
