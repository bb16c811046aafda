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
//! machine. [`run_fuzz`] judges every step of every case ([`crate::judge`]), shrinks each new
//! failure ([`crate::shrink`]) and keeps one finding per oracle, kind and shape of the minimal
//! trace. Everything it decides is a function of the seed and the number of cases; only the
//! wall-clock figures differ between runs (and how many cases a `--time` limit lets through).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde::{Deserialize, Serialize};

use crate::domain::Domain;
use crate::explore::{RunnerFactory, Tally};
use crate::judge::Judge;
use crate::op::{Decode, Op, Pos, SeqId, Setup, Trace};
use crate::oracle::OracleId;
use crate::report::{Event, Finding, Report, Shard, Timing};
use crate::shrink::{shape, shrink_tree, FailureMode, ShrinkConfig};
use crate::target::HarnessError;

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

/// Traces of `min_len..=max_len` ops from `g.setup`: single ops and forks, cut to `max_len`.
pub fn trace_strategy(g: &GenConfig) -> BoxedStrategy<Trace> {
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
    /// True if the shrink reached its fixed point (see [`crate::shrink`]).
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
    let mut judge = Judge::new(runner_a, runner_b)?;
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
    let mut wanted = vec![OracleId::I1, OracleId::I2, OracleId::Crash];
    if info_b.is_some() {
        wanted.push(OracleId::Differential);
    }
    let started = Instant::now();
    let mut last_progress = started;
    let mut tally = Tally::default();
    // Per signature: shrinks done, and the shape the first one came to.
    let mut by_signature: BTreeMap<String, (u32, String)> = BTreeMap::new();
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
        let verdict = judge.run(&trace)?;
        tally.trials += 1;
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
                Finding::signature_of(mode.oracle, &who, &mode.kind, trace.ops[v.step - 1].name());
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
            tally.findings.insert(shape, finding);
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
    report.fuzz = Some(FuzzSummary {
        seed: cfg.seed,
        generator: cfg.gen.clone(),
        cases: case,
        executions: judge.executions(),
        shrink_executions,
        shrink_elapsed_s: shrink_elapsed.as_secs_f64(),
        findings,
    });
    sink(&Event::Done(Box::new(report.clone())));
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::TargetSpec;

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
