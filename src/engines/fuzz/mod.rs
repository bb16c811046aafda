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

pub mod compare;
mod coverage;
mod generate;
mod guide;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use crate::base::cache::HarnessError;
use crate::base::domain::Domain;
use crate::base::op::{Op, Trace};
use crate::engines::shrink::{
    shape, shrink, shrink_tree, shrink_tree_by, FailureMode, ShrinkConfig,
};
use crate::engines::theorem_check::{StillViolated, TheoremChecker};
use crate::oracles::theorems::{Derivation, Theorem, TheoremJudgement};
use crate::oracles::OracleId;
use crate::records::report::{Event, Finding, FindingKey, Report, Shard, Timing};
use crate::records::tally::Tally;
use crate::running::judge::{Judge, StepViolation};
use crate::running::runner::RunnerFactory;

pub use crate::records::fuzz::{
    CoveragePoint, FuzzSummary, GenConfig, Generator, NotReproduced, ProbeStats, QueueStats,
    ReloadStats, ShrinkRecord, TheoremFinding, TheoremStats,
};
pub use coverage::{Coverage, Reached};
pub use generate::{
    arb_op, case_runner, generate, kind_strategy, op_strategy, theorem_trace_strategy,
    trace_strategy, FuzzTrace,
};
pub use guide::{
    finding_feature, guide_runner, Feature, FindingSite, Mutation, Mutator, Queue, FRESH_ONE_IN,
    MUTATIONS, WARMUP_CASES,
};

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
    /// The numerical theorems to check on each case (they need a [`TheoremChecker`]). A guided
    /// run offers them its fresh draws only.
    pub theorems: Vec<Theorem>,
    /// Which generator draws the cases.
    pub generator: Generator,
    /// The guided generator's starting queue (`--corpus`): run first, in this order, as the
    /// first cases, then mutated with the entries the run adds.
    pub corpus: Vec<Trace>,
}

/// Where a case's trace came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Drawn {
    /// The random generator's case of the same number: shrunk through its value tree.
    Fresh,
    /// A starting queue entry.
    Corpus,
    /// A mutation of a queue entry.
    Mutated,
}

/// The domain a fuzz report names: the generator's setup and sequences.
fn fuzz_domain(g: &GenConfig) -> Domain {
    Domain {
        name: "fuzz".into(),
        setup: g.setup.clone(),
        seqs: (0..g.n_seqs()).collect(),
        rm_all: true,
        copies: true,
        keep: true,
        clear: true,
        ..Domain::default()
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
    Ok(run_fuzz_with_queue(cfg, runner_a, runner_b, checker, sink)?.0)
}

/// [`run_fuzz_with`], also handing back the guided generator's queue at the end (the starting
/// queue, then each case that reached new coverage, in order; empty for a random run): what
/// `--corpus` persists.
pub fn run_fuzz_with_queue(
    cfg: &FuzzConfig,
    runner_a: &RunnerFactory<'_>,
    runner_b: Option<&RunnerFactory<'_>>,
    checker: Option<&mut TheoremChecker>,
    sink: &mut dyn FnMut(&Event),
) -> Result<(Report, Vec<Trace>), HarnessError> {
    let never = AtomicBool::new(false);
    run_fuzz_until(
        cfg,
        runner_a,
        runner_b,
        checker,
        (&never, &BTreeSet::new()),
        sink,
    )
}

/// [`run_fuzz_with_queue`] that also ends, between cases, once `stop` is set (a hunt's deadline
/// or a signal): the report then covers the cases run so far. A failure whose signature is in
/// `known` (findings a hunt already has, their `shape` empty) is counted but not shrunk again.
pub fn run_fuzz_until(
    cfg: &FuzzConfig,
    runner_a: &RunnerFactory<'_>,
    runner_b: Option<&RunnerFactory<'_>>,
    checker: Option<&mut TheoremChecker>,
    (stop, known): (&AtomicBool, &BTreeSet<FindingKey>),
    sink: &mut dyn FnMut(&Event),
) -> Result<(Report, Vec<Trace>), HarnessError> {
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
    let mut not_reproduced: Vec<NotReproduced> = Vec::new();
    let mut case = 0u64;
    let mut probes: Option<ProbeStats> = None;
    let mut reloads: Option<ReloadStats> = None;
    let guided = cfg.generator == Generator::Guided;
    let mutator = guided.then(|| Mutator::new(&cfg.gen));
    let mut queue = Queue::new(if guided {
        cfg.corpus.clone()
    } else {
        Vec::new()
    });
    let mut queue_stats = QueueStats {
        loaded: queue.entries().len() as u64,
        ..QueueStats::default()
    };
    let mut coverage = Coverage::default();
    let mut points: Vec<CoveragePoint> = Vec::new();
    loop {
        if cfg.cases.is_some_and(|n| case >= n)
            || cfg.time.is_some_and(|t| started.elapsed() >= t)
            || stop.load(Ordering::Relaxed)
        {
            break;
        }
        let child = match &mutator {
            _ if case < queue_stats.loaded => {
                Some((queue.entries()[case as usize].clone(), Drawn::Corpus))
            }
            Some(m) => m
                .next_case(&mut queue, cfg.seed, case)
                .map(|t| (t, Drawn::Mutated)),
            None => None,
        };
        let (trace, drawn) = child.unwrap_or_else(|| {
            let trace = strategy
                .new_tree(&mut case_runner(cfg.seed, case))
                .expect("the generator rejects nothing")
                .current();
            (trace, Drawn::Fresh)
        });
        queue_stats.mutated += u64::from(drawn == Drawn::Mutated);
        if let (Some(t), Drawn::Fresh) = (&mut theorems, drawn) {
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
        let (verdict, run_a) = judge.run_observed(&trace)?;
        let judged_at = started.elapsed();
        let reached = coverage.add(&trace, &run_a);
        if guided {
            // A violation's signature is a feature too: the cases that reach a rare one are
            // where the queue's energy goes.
            let mut features = reached.features;
            features.extend(
                verdict
                    .violations
                    .iter()
                    .filter(|v| v.step > 0 && wanted.contains(&v.violation.oracle))
                    .map(|v| finding_feature(&signature(&judge, &trace, v))),
            );
            queue.observe(&features);
            if drawn == Drawn::Corpus {
                queue.rate(case as usize, &features);
            } else if reached.new {
                queue.push(trace.clone(), &features);
                queue_stats.kept_from_mutations += u64::from(drawn == Drawn::Mutated);
            }
        }
        for p in &verdict.logits_probes {
            probes.get_or_insert_with(ProbeStats::default).add(p);
        }
        for p in &verdict.reload_probes {
            reloads.get_or_insert_with(ReloadStats::default).add(p);
        }
        tally.unsupported += u64::from(verdict.unsupported.is_some());
        for &oracle in &wanted {
            if verdict.unjudged.contains(&oracle) {
                tally.unjudged(oracle);
                continue;
            }
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
            let signature = signature(&judge, &trace, v);
            if known.contains(&signature) {
                continue;
            }
            if let Some((done, first_shape)) = by_signature.get(&signature) {
                if *done >= cfg.shrinks_per_signature {
                    if let Some(r) = records.get_mut(first_shape) {
                        r.duplicates += 1;
                    }
                    continue;
                }
            }
            let shrunk = if drawn == Drawn::Fresh {
                let mut tree = strategy
                    .new_tree(&mut case_runner(cfg.seed, case))
                    .expect("the generator rejects nothing");
                shrink_tree(&mut tree, &mode, &mut judge, &cfg.shrink)?
            } else {
                shrink(&trace, &mode, &mut judge, &cfg.shrink)?
            };
            // The shrinker replays the case first: a target that answers it another way now is
            // data about the target, not a harness failure.
            let Some(shrunk) = shrunk else {
                sink(&Event::NotReproduced {
                    oracle: mode.oracle,
                    kind: mode.kind.clone(),
                    case,
                    step: v.step,
                });
                not_reproduced.push(NotReproduced {
                    case,
                    oracle: mode.oracle.to_string(),
                    kind: mode.kind.clone(),
                    step: v.step,
                    trace: trace.clone(),
                });
                continue;
            };
            shrink_executions += shrunk.executions;
            shrink_elapsed += shrunk.elapsed;
            let shape = format!("{who}|{}", shape(&mode, &shrunk.trace));
            let entry = by_signature
                .entry(signature.clone())
                .or_insert((0, shape.clone()));
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
            // The queue's traces all start from the run's setup (`--corpus` holds them so), and
            // the shrinker may shorten the setup's ops: a minimal trace from another setup stays
            // out of the queue.
            if guided && finding.trace.setup == trace.setup {
                // The minimal trace, and the prefix before its failing op: the state the failure
                // needs, where the failures next to it are (another op, another range).
                let t = &finding.trace;
                let site = FindingSite {
                    step: finding.step,
                    seq: finding.seq,
                    op: t.ops[finding.step - 1].kind(),
                };
                queue.push_finding(t.clone(), finding_feature(&signature), site);
                if finding.step > 1 {
                    let prefix = Trace {
                        setup: t.setup.clone(),
                        ops: t.ops[..finding.step - 1].to_vec(),
                    };
                    queue.push_finding(prefix, finding_feature(&(&signature, "prefix")), site);
                }
            }
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
                    found_at_s: judged_at.as_secs_f64(),
                },
            );
            let key = FindingKey {
                shape,
                ..finding.key()
            };
            tally.findings.insert(key, finding);
        }
        case += 1;
        // Powers of two: a curve of a few dozen points whatever the run's length.
        if case.is_power_of_two() {
            points.push(coverage.point(case, started.elapsed().as_secs_f64()));
        }
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
    if !wanted.is_empty() && points.last().map_or(true, |p| p.cases != case) {
        points.push(coverage.point(case, elapsed));
    }
    queue_stats.entries = queue.kept() as u64;
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
        logits_probes: probes,
        reload_probes: reloads,
        generator_kind: cfg.generator,
        coverage: points,
        queue: guided.then_some(queue_stats),
        code: coverage.code(&report.target.name),
        not_reproduced,
    });
    sink(&Event::Done(Box::new(report.clone())));
    Ok((report, queue.into_kept()))
}

/// The signature failures are counted under (oracle, target, kind, op at the failing step): one
/// of each is shrunk (`shrinks_per_signature`), and each is a feature of the guided queue.
fn signature(judge: &Judge, trace: &Trace, v: &StepViolation) -> FindingKey {
    let mode = FailureMode::of(&v.violation);
    FindingKey::new(
        mode.oracle,
        &judge.label_of(v),
        &mode.kind,
        trace.ops[v.step - 1].name(),
    )
}

/// A comma-separated list from the environment variable `name`, or `default`.
fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Fuzz target `trace` (`fuzz/fuzz_targets/trace.rs`, and `tests/it/fuzz_seeds.rs` over its
/// seeds): a [`FuzzTrace`] drawn from `data`, run on the native cache and judged on every step.
/// Panics when an oracle listed in `KVAUDIT_FUZZ_ORACLES` (default `I1,crash`; I2 is left out
/// because an interior `seq_rm` breaks it by design) is violated, with the trace as JSON (save
/// it and run `kvaudit shrink FILE`). Faults come from `KVAUDIT_FUZZ_INJECT` (e.g. `refcount`,
/// a positive control). The judge and its target are made once per thread.
#[doc(hidden)]
pub fn fuzz_trace(data: &[u8]) {
    use arbitrary::Arbitrary;
    use std::cell::RefCell;

    thread_local! {
        static JUDGE: RefCell<(Judge, Vec<OracleId>)> = RefCell::new({
            let faults = env_list("KVAUDIT_FUZZ_INJECT", "");
            let factory = crate::targets::registry::TargetSpec::new("native", &faults)
                .factory()
                .expect("KVAUDIT_FUZZ_INJECT names known faults");
            let judge = Judge::new(factory.as_ref(), None).expect("the native target starts");
            let oracles = env_list("KVAUDIT_FUZZ_ORACLES", "I1,crash")
                .iter()
                .map(|o| OracleId::known(o).expect("KVAUDIT_FUZZ_ORACLES names oracles"))
                .collect();
            (judge, oracles)
        });
    }
    let Ok(FuzzTrace(trace)) = FuzzTrace::arbitrary(&mut arbitrary::Unstructured::new(data)) else {
        return;
    };
    JUDGE.with(|cell| {
        let (judge, oracles) = &mut *cell.borrow_mut();
        let verdict = judge.run(&trace).expect("the native target does not break");
        if let Some(v) = verdict
            .violations
            .iter()
            .find(|v| oracles.contains(&v.violation.oracle))
        {
            panic!(
                "{} at step {}\n{trace}\ntrace (save it and run `kvaudit shrink FILE`):\n{}",
                v.violation,
                v.step,
                serde_json::to_string(&trace).expect("traces serialize")
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::targets::registry::TargetSpec;
    use arbitrary::{Arbitrary, Unstructured};

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
    fn whole_copies_draws_no_range_copy_fresh_or_mutated() {
        let mut g = GenConfig::with_max_len(40);
        g.whole_copies = true;
        let whole = |t: &Trace| {
            t.ops.iter().all(|op| match op {
                Op::SeqCp { p0, p1, .. } => *p0 <= 0 && *p1 < 0,
                _ => true,
            })
        };
        let queue: Vec<Trace> = (0..30).map(|c| generate(&g, 2, c)).collect();
        assert!(queue.iter().all(whole));
        let copies: usize = queue
            .iter()
            .map(|t| {
                t.ops
                    .iter()
                    .filter(|o| matches!(o, Op::SeqCp { .. }))
                    .count()
            })
            .sum();
        assert!(copies > 30, "copies drawn: {copies}");
        let mutator = guide::Mutator::new(&g);
        let mut runner = case_runner(2, 0);
        for k in 0..200 {
            let child = mutator.child(&queue, k % queue.len(), &mut runner);
            assert!(whole(&child), "{child}");
        }
    }

    #[test]
    fn arbitrary_traces_are_deterministic_and_in_domain() {
        let data: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2_654_435_761u32) >> 13) as u8)
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
        for generator in [Generator::Random, Generator::Guided] {
            let cfg = FuzzConfig {
                seed: 3,
                cases: Some(40),
                time: None,
                gen: GenConfig::with_max_len(32),
                shrink: ShrinkConfig::default(),
                shrinks_per_signature: 1,
                oracles: None,
                theorems: Vec::new(),
                generator,
                corpus: Vec::new(),
            };
            let run = || run_fuzz_with_queue(&cfg, f.as_ref(), None, None, &mut |_| {}).unwrap();
            let ((a, qa), (b, qb)) = (run(), run());
            assert!(a.has_findings());
            assert_eq!(a.findings, b.findings);
            assert_eq!(qa, qb);
            assert_eq!(qa.is_empty(), generator == Generator::Random);
            let strip = |r: &Report| {
                let mut s = r.fuzz.clone().unwrap();
                s.shrink_elapsed_s = 0.0;
                s.findings.iter_mut().for_each(|f| {
                    f.elapsed_s = 0.0;
                    f.found_at_s = 0.0;
                });
                s.coverage.iter_mut().for_each(|p| p.elapsed_s = 0.0);
                s
            };
            assert_eq!(strip(&a), strip(&b));
            assert_eq!(a.oracles, b.oracles);
        }
    }
}
