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
//! Work. Depth 1 is one chunk; each deeper depth is split into one chunk per first op. Shard K of
//! M takes chunks `c` with `c % M == K`; within a shard, threads pull chunks from a shared
//! counter. Results are order-independent sums and minima, so any split merges to the same report
//! as an unsharded run.
//!
//! The explorer does not know which target it drives: it sees [`TrialRunner`]s only.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::domain::Domain;
use crate::op::{Op, Trace};
use crate::oracle::{
    check_differential, check_invariants, differential_holds, invariants_hold, OracleId, Violation,
};
use crate::report::{Event, Finding, OracleStats, Report, Shard, Timing};
use crate::runner::{TrialEnd, TrialRun, TrialRunner};
use crate::target::{HarnessError, TargetInfo};

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

/// A unit of work: all trials of one depth that start with one op (or all of depth 1).
#[derive(Clone, Copy, Debug)]
struct Chunk {
    depth: u32,
    first: Option<usize>,
}

fn chunks(n_ops: usize, depth: u32) -> Vec<Chunk> {
    let mut v = vec![Chunk {
        depth: 1,
        first: None,
    }];
    for d in 2..=depth {
        v.extend((0..n_ops).map(|f| Chunk {
            depth: d,
            first: Some(f),
        }));
    }
    v
}

impl Chunk {
    fn len(&self, n: u64) -> u64 {
        match self.first {
            None => n.pow(self.depth),
            Some(_) => n.pow(self.depth - 1),
        }
    }

    /// Global index of this chunk's first trial.
    fn base_index(&self, n: u64) -> u64 {
        let before = total_trials(n, self.depth - 1);
        before + self.first.map_or(0, |f| f as u64 * n.pow(self.depth - 1))
    }
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

    /// Judges one trial (and its partner on a second target, if any) and records the result.
    pub fn judge(
        &mut self,
        trace: &Trace,
        index: u64,
        a: (&TargetInfo, &TrialRun),
        b: Option<(&TargetInfo, &TrialRun)>,
    ) {
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
            return;
        }
        let (info_a, run_a) = a;
        let last = run_a.steps.len();
        let (i1, i2) = invariants_hold(&run_a.steps[last - 1]);
        for (oracle, holds) in [(OracleId::I1, i1), (OracleId::I2, i2)] {
            self.count(oracle, depth, !holds);
            if holds {
                continue;
            }
            let held_before = run_a.steps[..last - 1].iter().all(|s| {
                let (e1, e2) = invariants_hold(s);
                if oracle == OracleId::I1 {
                    e1
                } else {
                    e2
                }
            });
            if held_before {
                let (v1, v2) = check_invariants(&run_a.steps[last - 1]);
                let v = if oracle == OracleId::I1 { v1 } else { v2 };
                self.record(
                    trace,
                    index,
                    last,
                    info_a,
                    v.expect("the oracle failed above"),
                );
            }
        }
        if let Some((info_b, run_b)) = b {
            let holds = differential_holds(&run_a.steps[last - 1], &run_b.steps[last - 1]);
            self.count(OracleId::Differential, depth, !holds);
            if !holds {
                let held_before = run_a.steps[..last - 1]
                    .iter()
                    .zip(&run_b.steps)
                    .all(|(x, y)| differential_holds(x, y));
                if held_before {
                    let v = check_differential(&run_a.steps[last - 1], &run_b.steps[last - 1])
                        .expect("failed above");
                    let label = TargetInfo {
                        name: format!("{} vs {}", info_a.label(), info_b.label()),
                        ..info_a.clone()
                    };
                    self.record(trace, index, last, &label, v);
                }
            }
        }
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
    let all = chunks(ops.len(), cfg.depth);
    let mine: Vec<(usize, Chunk)> = all
        .iter()
        .copied()
        .enumerate()
        .filter(|(c, _)| *c % cfg.shard.count == cfg.shard.index)
        .collect();
    let total: u64 = mine.iter().map(|(_, c)| c.len(n)).sum();
    let (info_a, info_b) = {
        let a = runner_a()?;
        let b = runner_b.map(|f| f()).transpose()?;
        (a.info(), b.map(|b| b.info()))
    };
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
    let next_chunk = AtomicUsize::new(0);
    let done = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let threads = cfg.threads.max(1).min(mine.len().max(1));
    let (tx, rx) = mpsc::channel::<Result<Tally, HarnessError>>();
    let mut results = Vec::with_capacity(threads);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let tx = tx.clone();
            let (ops, mine, next_chunk, done, failed) = (&ops, &mine, &next_chunk, &done, &failed);
            scope.spawn(move || {
                let r = worker(cfg, ops, mine, next_chunk, done, failed, runner_a, runner_b);
                if r.is_err() {
                    failed.store(true, Ordering::Relaxed);
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
    let mut tally = Tally::default();
    for r in results {
        tally.merge(r?);
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

#[allow(clippy::too_many_arguments)]
fn worker(
    cfg: &ExhaustiveConfig,
    ops: &[Op],
    mine: &[(usize, Chunk)],
    next_chunk: &AtomicUsize,
    done: &AtomicU64,
    failed: &AtomicBool,
    runner_a: &RunnerFactory<'_>,
    runner_b: Option<&RunnerFactory<'_>>,
) -> Result<Tally, HarnessError> {
    let mut a = runner_a()?;
    let mut b = runner_b.map(|f| f()).transpose()?;
    let (info_a, info_b) = (a.info(), b.as_ref().map(|b| b.info()));
    let n = ops.len() as u64;
    let mut tally = Tally::default();
    let mut batch: Vec<Trace> = Vec::with_capacity(cfg.batch);
    let mut indices: Vec<u64> = Vec::with_capacity(cfg.batch);
    loop {
        if failed.load(Ordering::Relaxed) {
            break;
        }
        let i = next_chunk.fetch_add(1, Ordering::Relaxed);
        let Some(&(_, chunk)) = mine.get(i) else {
            break;
        };
        let base = chunk.base_index(n);
        let free = match chunk.first {
            None => chunk.depth as usize,
            Some(_) => chunk.depth as usize - 1,
        };
        let mut digits = vec![0usize; free];
        let mut offset = 0u64;
        loop {
            let mut trace_ops = Vec::with_capacity(chunk.depth as usize);
            trace_ops.extend(chunk.first.map(|f| ops[f].clone()));
            trace_ops.extend(digits.iter().map(|&d| ops[d].clone()));
            batch.push(Trace {
                setup: cfg.domain.setup.clone(),
                ops: trace_ops,
            });
            indices.push(base + offset);
            offset += 1;
            let more = odometer(&mut digits, ops.len());
            if batch.len() == cfg.batch || !more {
                let ra = a.run_batch(&batch)?;
                let rb = b.as_mut().map(|b| b.run_batch(&batch)).transpose()?;
                for (j, trace) in batch.iter().enumerate() {
                    let pb = match (&info_b, &rb) {
                        (Some(ib), Some(rb)) => Some((ib, &rb[j])),
                        _ => None,
                    };
                    tally.judge(trace, indices[j], (&info_a, &ra[j]), pb);
                }
                done.fetch_add(batch.len() as u64, Ordering::Relaxed);
                batch.clear();
                indices.clear();
            }
            if !more {
                break;
            }
        }
    }
    Ok(tally)
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
    fn chunk_indices_cover_every_trial_once() {
        let n = 5u64;
        let cs = chunks(5, 3);
        let mut next = 0;
        for c in &cs {
            assert_eq!(c.base_index(n), next);
            next += c.len(n);
        }
        assert_eq!(next, total_trials(n, 3));
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
