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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::base::domain::Domain;
use crate::base::op::{Op, Trace};
use crate::base::target::{HarnessError, TargetInfo};
use crate::oracles::{
    check_differential, check_invariants, differential_holds, invariants_hold, OracleId, Violation,
};
use crate::records::report::{Event, Finding, OracleStats, Report, Shard, Timing};
use crate::running::runner::{StartedBatch, TrialEnd, TrialRun, TrialRunner};

/// Makes one runner per thread.
pub type RunnerFactory<'a> = dyn Fn() -> Result<Box<dyn TrialRunner>, HarnessError> + Sync + 'a;

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
}

/// Number of trials of length `1..=depth` over `n` ops: sum of n^k.
pub fn total_trials(n: u64, depth: u32) -> u64 {
    (1..=depth)
        .map(|k| n.saturating_pow(k))
        .fold(0u64, u64::saturating_add)
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

/// Per oracle, one bit per trial of a depth: "violated at some step of this trial".
struct EverBits {
    bits: [Vec<AtomicU64>; 3],
}

/// The oracles whose freshness is tracked, in [`EverBits`] order.
const TRACKED: [OracleId; 3] = [OracleId::I1, OracleId::I2, OracleId::Differential];

impl EverBits {
    fn new(n_trials: u64) -> Self {
        let words = n_trials.div_ceil(64) as usize;
        let make = || (0..words).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        EverBits {
            bits: [make(), make(), make()],
        }
    }

    fn get(&self, k: usize, i: u64) -> bool {
        self.bits[k][(i / 64) as usize].load(Ordering::Relaxed) & (1 << (i % 64)) != 0
    }

    fn set(&self, k: usize, i: u64) {
        self.bits[k][(i / 64) as usize].fetch_or(1 << (i % 64), Ordering::Relaxed);
    }
}

/// Whether each tracked oracle was violated at some step before a trial's last op.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Prior {
    /// Per oracle in I1, I2, differential order.
    pub violated: [bool; 3],
}

/// Counts and findings of part of a run; merged by addition and minimum.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Trials run.
    pub trials: u64,
    /// Trials stopped by an unsupported op.
    pub unsupported: u64,
    /// Per oracle.
    pub oracles: BTreeMap<OracleId, OracleStats>,
    /// Best representative per finding signature.
    pub findings: BTreeMap<String, Finding>,
}

impl Tally {
    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: Tally) {
        self.trials += other.trials;
        self.unsupported += other.unsupported;
        for (id, s) in other.oracles {
            self.oracles.entry(id).or_default().merge(&s);
        }
        for (sig, f) in other.findings {
            self.offer(sig, f);
        }
    }

    fn offer(&mut self, sig: String, f: Finding) {
        match self.findings.get(&sig) {
            Some(old) if (old.depth, old.trial_index) <= (f.depth, f.trial_index) => {}
            _ => {
                self.findings.insert(sig, f);
            }
        }
    }

    fn count(&mut self, oracle: OracleId, depth: u32, violated: bool) {
        let s = self.oracles.entry(oracle).or_default();
        s.checked += 1;
        if violated {
            s.violations += 1;
            s.first_depth = Some(s.first_depth.map_or(depth, |d| d.min(depth)));
        }
    }

    /// Judges one trial (and its partner on a second target, if any) on the observation after
    /// its last op, and records the result. `prior` says which oracles already failed at an
    /// earlier step (then a violation now is counted but is not a new finding). Returns which
    /// tracked oracles fail now, or `None` when the trial was not judged (crash, unsupported op).
    pub fn judge(
        &mut self,
        trace: &Trace,
        index: u64,
        a: (&TargetInfo, &TrialRun),
        b: Option<(&TargetInfo, &TrialRun)>,
        prior: Prior,
    ) -> Option<[bool; 3]> {
        self.trials += 1;
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
                        let v = Violation {
                            oracle: OracleId::Crash,
                            kind: crash_kind(message),
                            seq: None,
                            observed: serde_json::json!({ "crash": message }),
                            expected: serde_json::json!("the op returns"),
                        };
                        self.record(trace, index, *step, info, v);
                    }
                }
            }
        }
        self.count(OracleId::Crash, depth, crashed);
        if !judged {
            let unsupported = [Some(a), b]
                .into_iter()
                .flatten()
                .any(|(_, r)| matches!(r.end, TrialEnd::Unsupported { .. }));
            self.unsupported += u64::from(unsupported);
            return None;
        }
        let (info_a, run_a) = a;
        let last = run_a
            .steps
            .last()
            .expect("a completed trial has its last observation");
        let (i1, i2) = invariants_hold(last);
        let mut now = [!i1, !i2, false];
        for (k, oracle) in [(0, OracleId::I1), (1, OracleId::I2)] {
            self.count(oracle, depth, now[k]);
            if now[k] && !prior.violated[k] {
                let (v1, v2) = check_invariants(last);
                let v = if k == 0 { v1 } else { v2 };
                self.record(
                    trace,
                    index,
                    trace.ops.len(),
                    info_a,
                    v.expect("the oracle failed above"),
                );
            }
        }
        if let Some((info_b, run_b)) = b {
            let last_b = run_b
                .steps
                .last()
                .expect("a completed trial has its last observation");
            now[2] = !differential_holds(last, last_b);
            self.count(OracleId::Differential, depth, now[2]);
            if now[2] && !prior.violated[2] {
                let v = check_differential(last, last_b).expect("failed above");
                let label = TargetInfo {
                    name: format!("{} vs {}", info_a.label(), info_b.label()),
                    ..info_a.clone()
                };
                self.record(trace, index, trace.ops.len(), &label, v);
            }
        }
        Some(now)
    }

    fn record(
        &mut self,
        trace: &Trace,
        index: u64,
        step: usize,
        target: &TargetInfo,
        v: Violation,
    ) {
        let sig = Finding::signature_of(
            v.oracle,
            &target.label(),
            &v.kind,
            trace.ops[step - 1].name(),
        );
        if matches!(self.findings.get(&sig), Some(old) if (old.depth, old.trial_index) <= (trace.ops.len() as u32, index))
        {
            return;
        }
        let f = Finding {
            oracle: v.oracle,
            kind: v.kind,
            target: target.label(),
            depth: trace.ops.len() as u32,
            trial_index: index,
            step,
            seq: v.seq,
            trace: trace.clone(),
            observed: v.observed,
            expected: v.expected,
        };
        self.offer(f.signature(), f);
    }
}

/// The class of a crash message, for telling crash findings apart.
pub fn crash_kind(message: &str) -> String {
    let first = message.lines().next().unwrap_or("crash");
    first.chars().take(80).collect()
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
        let ever = EverBits::new(n.pow(depth));
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
            let prior = match self.prev {
                Some(prev) => Prior {
                    violated: [0, 1, 2].map(|k| prev.get(k, index / n)),
                },
                None => Prior::default(),
            };
            let now = tally.judge(
                trace,
                depth_base + index,
                (self.info_a, &done.ra[j]),
                pb,
                prior,
            );
            if let Some(now) = now {
                for k in 0..TRACKED.len() {
                    if now[k] || prior.violated[k] {
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
