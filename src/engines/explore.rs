//! The exhaustive explorer: every op sequence of length 1..=N over a domain, judged by the
//! oracles, with shards and threads.
//!
//! Order. Trials are numbered depth by depth, and within a depth lexicographically over the
//! domain's op list (the first op is the most significant digit). Every prefix of a trial is a
//! trial of its own, so each trial is judged on the observation after its *last* op; a finding is
//! recorded only where that violation is fresh (no earlier step of the same trace violated the
//! same oracle), and each distinct finding keeps its smallest trial in that order, which is also
//! a shortest one.
//!
//! Freshness without re-observing. Runners are asked for the observation after the last op only
//! ([`TrialRunner::run_batch_last`]): a target that replays traces from the start then serializes
//! its state once per trial instead of once per op. Whether an earlier step violated an oracle is
//! known from the trial's prefix, which is a trial of the previous depth: depths run one after
//! another, and each keeps, per oracle, one "violated at some step" bit per trial.
//!
//! Work. Each depth is split into one chunk per first op; shard K of M takes the chunks whose
//! first op `a` has `a % M == K` at every depth, so a trial's prefix is always in the same shard.
//! Within a shard, threads pull chunks from a shared counter. Results are order-independent sums
//! and minima, so any split merges to the same report as an unsharded run.
//!
//! The explorer does not know which target it drives: it sees [`TrialRunner`]s only.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::base::domain::{total_trials, Domain};
use crate::base::op::{Op, Trace};
use crate::base::target::{HarnessError, TargetInfo};
use crate::oracles::{Oracle, Reads, Registry, Seen};
use crate::records::report::{Event, Report, Shard, Timing};
use crate::records::tally::Tally;
use crate::running::runner::{RunnerFactory, StartedBatch, TrialEnd, TrialRun, TrialRunner};

/// What an exhaustive audit runs.
pub struct ExhaustiveConfig {
    /// The domain.
    pub domain: Domain,
    /// Longest trace.
    pub depth: u32,
    /// This run's share of the work.
    pub shard: Shard,
    /// Worker threads (each with its own runners).
    pub threads: usize,
    /// Traces sent to a runner at once.
    pub batch: usize,
    /// The oracles that judge each trial (those of them that read observations).
    pub oracles: Registry,
}

/// A unit of work: all trials of one depth that start with one op.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    depth: u32,
    first: usize,
}

/// The chunks of one depth that belong to `shard`.
fn chunks(n_ops: usize, depth: u32, shard: Shard) -> Vec<Chunk> {
    (0..n_ops)
        .filter(|f| f % shard.count == shard.index)
        .map(|first| Chunk { depth, first })
        .collect()
}

impl Chunk {
    fn len(&self, n: u64) -> u64 {
        n.pow(self.depth - 1)
    }

    /// Index of this chunk's first trial among the trials of its depth.
    fn base_in_depth(&self, n: u64) -> u64 {
        self.first as u64 * n.pow(self.depth - 1)
    }
}

/// Per tracked oracle, one bit per trial of a depth: "violated at some step of this trial".
struct EverBits {
    bits: Vec<Vec<AtomicU64>>,
}

impl EverBits {
    fn new(tracked: usize, n_trials: u64) -> Self {
        let words = n_trials.div_ceil(64) as usize;
        let make = || (0..words).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        EverBits {
            bits: (0..tracked).map(|_| make()).collect(),
        }
    }

    fn get(&self, k: usize, i: u64) -> bool {
        self.bits[k][(i / 64) as usize].load(Ordering::Relaxed) & (1 << (i % 64)) != 0
    }

    fn set(&self, k: usize, i: u64) {
        self.bits[k][(i / 64) as usize].fetch_or(1 << (i % 64), Ordering::Relaxed);
    }
}

/// A set of tracked oracles (a `Judges`' step and pair oracles), by index: one bit each.
pub type OracleBits = u64;

/// The oracles an exhaustive run asks, split by what they read. Step and pair oracles are
/// *tracked*: whether they failed at an earlier step of a trial is known from its prefix.
pub struct Judges {
    /// Tracked oracles (step oracles on A, then pair oracles), at most 64.
    tracked: Vec<&'static dyn Oracle>,
    /// Crash oracles.
    crash: Vec<&'static dyn Oracle>,
}

impl Judges {
    /// The oracles of `oracles` that judge a run with or without a second target.
    pub fn new(oracles: &Registry, with_vs: bool) -> Judges {
        let observing: Vec<_> = oracles.observing(with_vs).collect();
        let tracked: Vec<_> = observing
            .iter()
            .copied()
            .filter(|o| matches!(o.reads(), Reads::Step | Reads::Pair))
            .collect();
        assert!(tracked.len() <= 64, "at most 64 observation oracles");
        Judges {
            tracked,
            crash: observing
                .into_iter()
                .filter(|o| o.reads() == Reads::Crash)
                .collect(),
        }
    }

    /// Every oracle asked, tracked then crash: what a report lists ([`Tally::asked`]).
    pub fn ids(&self) -> impl Iterator<Item = crate::oracles::OracleId> + '_ {
        self.tracked.iter().chain(&self.crash).map(|o| o.id())
    }

    /// Judges one trial (and its partner on a second target, if any) on the observation after
    /// its last op, and records the result in `tally`. `prior` says which tracked oracles
    /// already failed at an earlier step (then a violation now is counted but is not a new
    /// finding). Returns which tracked oracles fail now, or `None` when the trial was not
    /// judged (crash, unsupported op).
    pub fn judge(
        &self,
        tally: &mut Tally,
        trace: &Trace,
        index: u64,
        a: (&TargetInfo, &TrialRun),
        b: Option<(&TargetInfo, &TrialRun)>,
        prior: OracleBits,
    ) -> Option<OracleBits> {
        tally.trials += 1;
        let depth = trace.ops.len() as u32;
        let mut judged = true;
        let mut crashed = false;
        for (info, run) in std::iter::once(a).chain(b) {
            match &run.end {
                TrialEnd::Completed => {}
                TrialEnd::Unsupported { .. } => judged = false,
                TrialEnd::Crashed { step, message } => {
                    judged = false;
                    crashed = true;
                    // Steps after a crash do not run, so a crash is fresh only at the trace's
                    // last op; longer traces through the same crash are counted, not recorded.
                    if *step == trace.ops.len() {
                        let op = step.checked_sub(1).and_then(|i| trace.ops.get(i));
                        let seen = Seen::Crash { op, message };
                        for oracle in &self.crash {
                            if let Some(v) = oracle.check(&seen) {
                                tally.record(trace, index, *step, &info.label(), v);
                            }
                        }
                    }
                }
            }
        }
        for oracle in &self.crash {
            tally.count(oracle.id(), depth, crashed);
        }
        if !judged {
            let unsupported = [Some(a), b]
                .into_iter()
                .flatten()
                .any(|(_, r)| matches!(r.end, TrialEnd::Unsupported { .. }));
            tally.unsupported += u64::from(unsupported);
            return None;
        }
        let (info_a, run_a) = a;
        let op = trace.ops.last().expect("a trial has at least one op");
        let last = run_a
            .steps
            .last()
            .expect("a completed trial has its last observation");
        let last_b = b.map(|(info_b, run_b)| {
            let step = run_b
                .steps
                .last()
                .expect("a completed trial has its last observation");
            (info_b, step)
        });
        let mut now: OracleBits = 0;
        for (k, oracle) in self.tracked.iter().enumerate() {
            let (seen, vs) = match (oracle.reads(), last_b) {
                (Reads::Pair, Some((info_b, step_b))) => (
                    Seen::Pair {
                        op,
                        a: last,
                        b: step_b,
                    },
                    Some(info_b),
                ),
                (Reads::Pair, None) => continue,
                _ => (
                    Seen::Step {
                        op,
                        after: last,
                        arch: trace.setup.arch,
                    },
                    None,
                ),
            };
            if !oracle.judges(&seen) {
                tally.unjudged(oracle.id());
                continue;
            }
            let violated = !oracle.holds(&seen);
            tally.count(oracle.id(), depth, violated);
            if violated {
                now |= 1 << k;
                if prior & (1 << k) == 0 {
                    let v = oracle.check(&seen).unwrap_or_else(|| {
                        panic!(
                            "oracle {} does not hold but reports no violation",
                            oracle.id()
                        )
                    });
                    // Labels are built only here: most trials record nothing.
                    let label = match vs {
                        Some(info_b) => format!("{} vs {}", info_a.label(), info_b.label()),
                        None => info_a.label(),
                    };
                    tally.record(trace, index, trace.ops.len(), &label, v);
                }
            }
        }
        Some(now)
    }
}

/// Runs an exhaustive audit; `sink` sees the event stream (start, progress, findings, done).
pub fn run_exhaustive(
    cfg: &ExhaustiveConfig,
    runner_a: &RunnerFactory<'_>,
    runner_b: Option<&RunnerFactory<'_>>,
    sink: &mut dyn FnMut(&Event),
) -> Result<Report, HarnessError> {
    let ops = cfg.domain.ops();
    let n = ops.len() as u64;
    let total: u64 = (1..=cfg.depth)
        .flat_map(|d| chunks(ops.len(), d, cfg.shard))
        .map(|c| c.len(n))
        .sum();
    let threads = cfg
        .threads
        .max(1)
        .min(chunks(ops.len(), 1, cfg.shard).len().max(1));
    // One pair of runners per thread, kept across depths (a llama.cpp runner is a process).
    let mut runners: Vec<(Box<dyn TrialRunner>, Option<Box<dyn TrialRunner>>)> = (0..threads)
        .map(|_| Ok((runner_a()?, runner_b.map(|f| f()).transpose()?)))
        .collect::<Result<_, HarnessError>>()?;
    let info_a = runners[0].0.info();
    let info_b = runners[0].1.as_ref().map(|b| b.info());
    let judges = Judges::new(&cfg.oracles, info_b.is_some());
    sink(&Event::Start {
        target: info_a.clone(),
        vs: info_b.clone(),
        domain: cfg.domain.name.clone(),
        depth: cfg.depth,
        ops: ops.len(),
        trials: total,
        shard: cfg.shard,
    });
    let started = Instant::now();
    let done = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let mut tally = Tally::default();
    let mut prev: Option<EverBits> = None;
    for depth in 1..=cfg.depth {
        let mine = chunks(ops.len(), depth, cfg.shard);
        let ever = EverBits::new(judges.tracked.len(), n.pow(depth));
        let next_chunk = AtomicUsize::new(0);
        let (tx, rx) = mpsc::channel::<Result<Tally, HarnessError>>();
        let mut results = Vec::with_capacity(threads);
        std::thread::scope(|scope| {
            for (ra, rb) in runners.iter_mut() {
                let tx = tx.clone();
                let ctx = DepthWork {
                    cfg,
                    ops: &ops,
                    mine: &mine,
                    next_chunk: &next_chunk,
                    done: &done,
                    failed: &failed,
                    prev: prev.as_ref(),
                    ever: &ever,
                    info_a: &info_a,
                    info_b: info_b.as_ref(),
                    judges: &judges,
                };
                scope.spawn(move || {
                    let r = ctx.run(ra.as_mut(), rb.as_deref_mut());
                    if r.is_err() {
                        ctx.failed.store(true, Ordering::Relaxed);
                    }
                    let _ = tx.send(r);
                });
            }
            while results.len() < threads {
                match rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(r) => results.push(r),
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
                sink(&Event::Progress {
                    done: done.load(Ordering::Relaxed),
                    total,
                    elapsed_s: started.elapsed().as_secs_f64(),
                });
            }
        });
        for r in results {
            tally.merge(r?);
        }
        prev = Some(ever);
    }
    let elapsed = started.elapsed().as_secs_f64();
    tally.asked(judges.ids());
    let report = Report::new(
        info_a,
        info_b,
        cfg.domain.clone(),
        cfg.depth,
        cfg.shard,
        tally,
        Timing {
            elapsed_s: elapsed,
            trials_per_s: total as f64 / elapsed.max(1e-9),
        },
    );
    for f in &report.findings {
        sink(&Event::Finding(f.clone()));
    }
    sink(&Event::Done(Box::new(report.clone())));
    Ok(report)
}

/// What one thread needs to work through the chunks of one depth.
#[derive(Clone, Copy)]
struct DepthWork<'a> {
    cfg: &'a ExhaustiveConfig,
    ops: &'a [Op],
    mine: &'a [Chunk],
    next_chunk: &'a AtomicUsize,
    done: &'a AtomicU64,
    failed: &'a AtomicBool,
    /// "Violated at some step" bits of the previous depth (none at depth 1).
    prev: Option<&'a EverBits>,
    /// The same bits for this depth, filled here.
    ever: &'a EverBits,
    info_a: &'a TargetInfo,
    info_b: Option<&'a TargetInfo>,
    judges: &'a Judges,
}

/// A batch out at the runners, with each trace's index within its depth.
struct InFlight {
    indices: Vec<u64>,
    a: StartedBatch,
    b: Option<StartedBatch>,
}

impl DepthWork<'_> {
    fn run(
        &self,
        a: &mut (dyn TrialRunner + 'static),
        mut b: Option<&mut (dyn TrialRunner + 'static)>,
    ) -> Result<Tally, HarnessError> {
        let n = self.ops.len() as u64;
        let mut tally = Tally::default();
        let mut batch: Vec<Trace> = Vec::with_capacity(self.cfg.batch);
        let mut indices: Vec<u64> = Vec::with_capacity(self.cfg.batch);
        // While a worker process runs one batch, this thread builds the next and judges the
        // previous one: one batch in flight, finished before the next is started.
        let mut in_flight: Option<InFlight> = None;
        loop {
            if self.failed.load(Ordering::Relaxed) {
                break;
            }
            let i = self.next_chunk.fetch_add(1, Ordering::Relaxed);
            let Some(&chunk) = self.mine.get(i) else {
                break;
            };
            let mut digits = vec![0usize; chunk.depth as usize - 1];
            let mut in_depth = chunk.base_in_depth(n);
            loop {
                let mut trace_ops = Vec::with_capacity(chunk.depth as usize);
                trace_ops.push(self.ops[chunk.first].clone());
                trace_ops.extend(digits.iter().map(|&d| self.ops[d].clone()));
                batch.push(Trace {
                    setup: self.cfg.domain.setup.clone(),
                    ops: trace_ops,
                });
                indices.push(in_depth);
                in_depth += 1;
                let more = odometer(&mut digits, self.ops.len());
                if batch.len() == self.cfg.batch || !more {
                    let finished = in_flight
                        .take()
                        .map(|f| self.finish(f, a, b.as_deref_mut()))
                        .transpose()?;
                    let a_started = a.start_batch_last(std::mem::replace(
                        &mut batch,
                        Vec::with_capacity(self.cfg.batch),
                    ))?;
                    let b_started = match b.as_deref_mut() {
                        Some(b) => Some(b.start_batch_last(a_started.traces.clone())?),
                        None => None,
                    };
                    in_flight = Some(InFlight {
                        indices: std::mem::replace(
                            &mut indices,
                            Vec::with_capacity(self.cfg.batch),
                        ),
                        a: a_started,
                        b: b_started,
                    });
                    if let Some(done) = finished {
                        self.judge_batch(&mut tally, done, n);
                    }
                }
                if !more {
                    break;
                }
            }
        }
        if let Some(f) = in_flight.take() {
            let done = self.finish(f, a, b.as_deref_mut())?;
            self.judge_batch(&mut tally, done, n);
        }
        Ok(tally)
    }

    /// Waits for a batch's results from both runners.
    fn finish(
        &self,
        f: InFlight,
        a: &mut (dyn TrialRunner + 'static),
        b: Option<&mut (dyn TrialRunner + 'static)>,
    ) -> Result<FinishedBatch, HarnessError> {
        // b first: an in-process runner (native) then runs while a's worker is busy.
        let rb = match (b, f.b) {
            (Some(b), Some(started)) => Some(b.finish_batch_last(started)?.1),
            _ => None,
        };
        let (traces, ra) = a.finish_batch_last(f.a)?;
        Ok(FinishedBatch {
            indices: f.indices,
            traces,
            ra,
            rb,
        })
    }

    /// Judges a finished batch into `tally` and marks this depth's "ever violated" bits.
    fn judge_batch(&self, tally: &mut Tally, done: FinishedBatch, n: u64) {
        for (j, trace) in done.traces.iter().enumerate() {
            let index = done.indices[j];
            let depth = trace.ops.len() as u64;
            let depth_base = total_trials(n, depth as u32 - 1);
            let pb = match (self.info_b, &done.rb) {
                (Some(ib), Some(rb)) => Some((ib, &rb[j])),
                _ => None,
            };
            // The prefix (all ops but the last) is trial index / n of the previous depth, in the
            // same lexicographic numbering.
            let tracked = self.judges.tracked.len();
            let prior: OracleBits = match self.prev {
                Some(prev) => (0..tracked)
                    .filter(|&k| prev.get(k, index / n))
                    .fold(0, |bits, k| bits | 1 << k),
                None => 0,
            };
            let now = self.judges.judge(
                tally,
                trace,
                depth_base + index,
                (self.info_a, &done.ra[j]),
                pb,
                prior,
            );
            if let Some(now) = now {
                for k in 0..tracked {
                    if (now | prior) & (1 << k) != 0 {
                        self.ever.set(k, index);
                    }
                }
            }
        }
        self.done
            .fetch_add(done.traces.len() as u64, Ordering::Relaxed);
    }
}

/// A batch's traces and results.
struct FinishedBatch {
    indices: Vec<u64>,
    traces: Vec<Trace>,
    ra: Vec<TrialRun>,
    rb: Option<Vec<TrialRun>>,
}

/// Advances `digits` (most significant first) in base `n`; false when it wraps around.
fn odometer(digits: &mut [usize], n: usize) -> bool {
    for d in digits.iter_mut().rev() {
        *d += 1;
        if *d < n {
            return true;
        }
        *d = 0;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oracle_whose_observation_a_target_cannot_give_is_not_judged_not_passed() {
        use crate::base::target::Observe;
        use crate::running::runner::{LocalRunner, TrialRunner};
        use crate::targets::native::NativeTarget;
        let basic = || -> Result<Box<dyn TrialRunner>, HarnessError> {
            Ok(Box::new(
                LocalRunner::new(Box::new(NativeTarget::new(Default::default())))
                    .with_observe(Observe::BASIC),
            ))
        };
        let cfg = ExhaustiveConfig {
            domain: crate::base::domain::Domain::preset("seed").unwrap(),
            depth: 1,
            shard: Shard::WHOLE,
            threads: 1,
            batch: 64,
            oracles: crate::oracles::Registry::builtin(),
        };
        let report = run_exhaustive(&cfg, &basic, None, &mut |_| {}).unwrap();
        let stats = |name: &str| &report.oracles[&crate::oracles::OracleId::known(name).unwrap()];
        assert_eq!(stats("I1").checked, 49);
        for name in ["conservation", "round-trip", "contract"] {
            assert_eq!(stats(name).checked, 0, "{name}");
        }
        assert!(report.oracle_table().contains("0 (not judged)"));
    }

    #[test]
    fn shards_cover_every_trial_once() {
        let n = 5u64;
        for depth in 1..=3 {
            let mut seen = vec![0u32; n.pow(depth) as usize];
            for k in 0..3 {
                for c in chunks(5, depth, Shard::new(k, 3).unwrap()) {
                    for i in 0..c.len(n) {
                        seen[(c.base_in_depth(n) + i) as usize] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&s| s == 1));
        }
        assert_eq!(total_trials(49, 3), 49 + 49 * 49 + 49 * 49 * 49);
    }

    #[test]
    fn odometer_counts_lexicographically() {
        let mut d = vec![0, 0];
        let mut seen = vec![d.clone()];
        while odometer(&mut d, 3) {
            seen.push(d.clone());
        }
        assert_eq!(seen.len(), 9);
        assert_eq!(seen[1], vec![0, 1]);
        assert_eq!(seen[3], vec![1, 0]);
    }
}
