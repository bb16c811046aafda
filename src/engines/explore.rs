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
//! Within a shard, threads pull chunks from a shared counter; a thread whose batch is still
//! short at a chunk's end (a shallow depth's chunks hold a few trials each) takes the next
//! chunk into the same batch when it starts where the last one ended, and a depth's last chunks
//! come in pieces, so that no thread runs on alone for a whole chunk at its end (a chunk is
//! finished once all its pieces are). Results are order-independent sums and minima, so any
//! split merges to the same report as an unsharded run.
//!
//! Stopping and resuming. A stop flag is read between batches: pieces of work in flight are
//! dropped, and the report holds the finished chunks, marked [`Incomplete`] (the depth in
//! progress and its finished chunks); checkpoints (the same partial report) go to the event
//! stream as chunks finish. A resumed run adds the partial report's counts to its own, counts
//! only the unfinished chunks, and reruns uncounted the finished chunks whose bits a later depth
//! reads: sums and minima again, so it ends with the report of a run never stopped.
//!
//! The explorer does not know which target it drives: it sees [`TrialRunner`]s only.

mod calibrate;
mod judging;
mod plan;
mod resume;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::base::cache::{HarnessError, TargetInfo};
use crate::base::capabilities::LeftOut;
use crate::base::domain::{total_trials, Domain};
use crate::base::op::{Op, Trace};
use crate::oracles::Registry;
use crate::records::incomplete::Incomplete;
use crate::records::report::{Event, Report, Shard, Timing};
use crate::records::tally::Tally;
use crate::running::judge::VerdictMemo;
use crate::running::runner::{
    enumerated_indices, BatchJudging, Enumerated, RunnerFactory, StartedBatch, StepVerdicts,
    TrialRun, TrialRunner,
};

pub use calibrate::{Estimate, CALIBRATE_FROM};
pub use judging::{OracleBits, RunOracles};
pub use resume::check_resumes;

use plan::{chunks, plan, Work};

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

/// Runs an exhaustive audit; `sink` sees the event stream (start, progress, findings, done).
pub fn run_exhaustive(
    cfg: &ExhaustiveConfig,
    runner_a: &RunnerFactory<'_>,
    runner_b: Option<&RunnerFactory<'_>>,
    sink: &mut dyn FnMut(&Event),
) -> Result<Report, HarnessError> {
    let stop = AtomicBool::new(false);
    Explorer::new(cfg, runner_a, runner_b)?.run(&RunControl::new(&stop), sink)
}

/// How a run is steered from outside: where it resumes, when it stops, how often it says what
/// it has finished.
pub struct RunControl<'a> {
    /// A partial report of this run to continue ([`Report::incomplete`]); the result is the
    /// report an uninterrupted run gives (but for wall-clock figures).
    pub resume: Option<&'a Report>,
    /// Set (by a signal handler) to stop: chunks in flight are dropped, and the report says
    /// which chunks were finished ([`Incomplete`]).
    pub stop: &'a AtomicBool,
    /// Least time between two [`Event::Checkpoint`]s (the first comes with the first finished
    /// chunk).
    pub checkpoint_every: Duration,
    /// A test hook (`KVAUDIT_TEST_HOLD_AT_DEPTH`, docs/usage.md): once the first chunk of this
    /// depth is finished, a checkpoint is written whatever `checkpoint_every` says, and no
    /// thread starts another piece of work until [`RunControl::stop`] is set. A test that stops
    /// the run from outside then stops it there, however fast the machine is.
    pub hold_at_depth: Option<u32>,
}

impl<'a> RunControl<'a> {
    /// A fresh run that stops when `stop` is set, with a checkpoint every 5 s.
    pub fn new(stop: &'a AtomicBool) -> Self {
        RunControl {
            resume: None,
            stop,
            checkpoint_every: Duration::from_secs(5),
            hold_at_depth: None,
        }
    }
}

/// What a run of work says: a piece of work is finished, the trials done so far, or (from a
/// thread) the thread has ended.
enum Said {
    Finished { work: Work, tally: Tally },
    Progress(u64),
    Ended(Result<(), HarnessError>),
}

type RunnerPair = (Box<dyn TrialRunner>, Option<Box<dyn TrialRunner>>);

/// What every thread of a run reads.
struct Shared<'c> {
    cfg: &'c ExhaustiveConfig,
    ops: Vec<Op>,
    info_a: TargetInfo,
    info_b: Option<TargetInfo>,
    judges: RunOracles,
    /// The domain's op kinds a target declares it lacks (left out of `ops`).
    left_out: Vec<LeftOut>,
}

impl Shared<'_> {
    /// The report of this run with the counts of `tally`.
    fn report(&self, mut tally: Tally, elapsed_s: f64) -> Report {
        tally.asked(self.judges.ids());
        let trials = tally.trials;
        let mut report = Report::new(
            self.info_a.clone(),
            self.info_b.clone(),
            self.cfg.domain.clone(),
            self.cfg.depth,
            self.cfg.shard,
            tally,
            Timing {
                elapsed_s,
                trials_per_s: trials as f64 / elapsed_s.max(1e-9),
            },
        );
        report.left_out.clone_from(&self.left_out);
        report
    }
}

/// An exhaustive audit with its runners started: [`Explorer::estimate`] times a sample of its
/// trials, [`Explorer::run`] runs it.
pub struct Explorer<'c> {
    shared: Shared<'c>,
    /// One pair of runners per thread, kept across depths (a llama.cpp runner is a process).
    runners: Vec<RunnerPair>,
    /// When the runners were asked for: a worker's start counts in the run's time.
    started: Instant,
}

impl<'c> Explorer<'c> {
    /// Starts the runners (one pair per thread).
    pub fn new(
        cfg: &'c ExhaustiveConfig,
        runner_a: &RunnerFactory<'_>,
        runner_b: Option<&RunnerFactory<'_>>,
    ) -> Result<Self, HarnessError> {
        let started = Instant::now();
        let ops = cfg.domain.ops();
        let threads = cfg
            .threads
            .max(1)
            .min(chunks(ops.len(), 1, cfg.shard).len().max(1));
        // Started at once, one thread each: a llama.cpp runner is a process that loads a shim
        // and answers when ready, so starting them one after the other added a start per
        // thread to the run's time.
        let start_pair = || Ok((runner_a()?, runner_b.map(|f| f()).transpose()?));
        let runners: Vec<RunnerPair> = std::thread::scope(|scope| {
            let others: Vec<_> = (1..threads).map(|_| scope.spawn(start_pair)).collect();
            let first: Result<RunnerPair, HarnessError> = start_pair();
            std::iter::once(first)
                .chain(
                    others
                        .into_iter()
                        .map(|h| h.join().expect("a runner's start does not panic")),
                )
                .collect::<Result<_, HarnessError>>()
        })?;
        let info_a = runners[0].0.info();
        let info_b = runners[0].1.as_ref().map(|b| b.info());
        // The op kinds a target declares it lacks are never enumerated: the report lists them.
        let mut left_out = runners[0].0.capabilities().left_out(&info_a.label());
        if let (Some(b), Some(info)) = (&runners[0].1, &info_b) {
            left_out.extend(b.capabilities().left_out(&info.label()));
        }
        left_out.retain(|l| ops.iter().any(|op| op.kind().name() == l.op));
        let ops: Vec<Op> = ops
            .into_iter()
            .filter(|op| !left_out.iter().any(|l| l.op == op.kind().name()))
            .collect();
        let judges = RunOracles::new(&cfg.oracles, info_b.is_some());
        Ok(Explorer {
            shared: Shared {
                cfg,
                ops,
                info_a,
                info_b,
                judges,
                left_out,
            },
            runners,
            started,
        })
    }

    /// The report of this run with no trial: the heading `--resume` compares a partial report
    /// with.
    pub fn blank_report(&self) -> Report {
        self.shared.report(Tally::default(), 0.0)
    }

    /// The work of every depth, resuming after `resume`.
    fn plans(&self, resume: Option<&Incomplete>) -> Vec<Vec<Work>> {
        let (cfg, n_ops) = (self.shared.cfg, self.shared.ops.len());
        (1..=cfg.depth)
            .map(|d| plan(n_ops, d, cfg.depth, cfg.shard, resume))
            .collect()
    }

    /// Trials this run will do (counted or rerun), resuming after `resume`.
    pub fn trials_to_run(&self, resume: Option<&Incomplete>) -> u64 {
        self.plans(resume).iter().flatten().map(|w| w.len).sum()
    }

    /// Runs the audit (or the rest of it, see [`RunControl::resume`]); `sink` sees the event
    /// stream (start, progress, checkpoints, findings, done). A run stopped by
    /// [`RunControl::stop`] returns its partial report, marked [`Report::incomplete`].
    pub fn run(
        self,
        ctl: &RunControl<'_>,
        sink: &mut dyn FnMut(&Event),
    ) -> Result<Report, HarnessError> {
        let resume_at = ctl.resume.and_then(|r| r.incomplete.as_ref());
        if let Some(finished) = ctl.resume.filter(|r| r.incomplete.is_none()) {
            return Ok(finished.clone());
        }
        let plans = self.plans(resume_at);
        let total: u64 = plans.iter().flatten().map(|w| w.len).sum();
        let Explorer {
            shared,
            mut runners,
            started,
        } = self;
        let cfg = shared.cfg;
        sink(&Event::Start {
            target: shared.info_a.clone(),
            vs: shared.info_b.clone(),
            domain: cfg.domain.name.clone(),
            depth: cfg.depth,
            ops: shared.ops.len(),
            trials: total,
            shard: cfg.shard,
        });
        let earlier_s = ctl.resume.map_or(0.0, |r| r.timing.elapsed_s);
        let elapsed = || earlier_s + started.elapsed().as_secs_f64();
        let mut tally = ctl
            .resume
            .map(|r| r.clone().into_tally())
            .unwrap_or_default();
        let n = shared.ops.len() as u64;
        let done = AtomicU64::new(0);
        let mut prev: Option<EverBits> = None;
        let mut last_checkpoint: Option<Instant> = None;
        let mut stopped: Option<Incomplete> = None;
        let hold = AtomicBool::new(false);
        for depth in 1..=cfg.depth {
            let mut done_here: Vec<usize> = resume_at
                .filter(|r| r.depth == depth)
                .map(|r| r.chunks_done.clone())
                .unwrap_or_default();
            // Stopped in a depth that only reruns finished work: the partial report stands.
            let stopped_in = |done_here: Vec<usize>| match resume_at {
                Some(r) if depth < r.depth => r.clone(),
                _ => Incomplete {
                    depth,
                    chunks_done: done_here,
                },
            };
            if ctl.stop.load(Ordering::SeqCst) {
                stopped = Some(stopped_in(done_here));
                break;
            }
            let work = &plans[depth as usize - 1];
            // A chunk may come in pieces (`split_tail`): it is finished, and its tally counted,
            // once every piece is (a checkpoint then never holds part of a chunk that a resumed
            // run would run again).
            let mut pieces_left: HashMap<usize, (usize, Tally)> = HashMap::new();
            for w in work.iter().filter(|w| w.counted) {
                pieces_left.entry(w.chunk.first).or_default().0 += 1;
            }
            let counted = pieces_left.len();
            // The last depth's bits are read by no later depth.
            let ever = (depth < cfg.depth)
                .then(|| EverBits::new(shared.judges.tracked_count(), n.pow(depth)));
            let mut finished = 0;
            run_work(
                &shared,
                &mut runners,
                work,
                (prev.as_ref(), ever.as_ref()),
                (ctl.stop, &hold),
                &done,
                &mut |said| {
                    let (work, t) = match said {
                        Said::Finished { work, tally } => (work, tally),
                        Said::Progress(d) => {
                            return sink(&Event::Progress {
                                done: d,
                                total,
                                elapsed_s: started.elapsed().as_secs_f64(),
                            })
                        }
                        Said::Ended(_) => return,
                    };
                    if !work.counted {
                        return;
                    }
                    let Some((left, chunk_tally)) = pieces_left.get_mut(&work.chunk.first) else {
                        return;
                    };
                    chunk_tally.merge(t);
                    *left -= 1;
                    if *left > 0 {
                        return;
                    }
                    let (_, chunk_tally) = pieces_left
                        .remove(&work.chunk.first)
                        .expect("looked up above");
                    tally.merge(chunk_tally);
                    finished += 1;
                    let at = done_here.partition_point(|&c| c < work.chunk.first);
                    done_here.insert(at, work.chunk.first);
                    let hold_here =
                        ctl.hold_at_depth == Some(depth) && !hold.load(Ordering::SeqCst);
                    if hold_here
                        || last_checkpoint.map_or(true, |t| t.elapsed() >= ctl.checkpoint_every)
                    {
                        last_checkpoint = Some(Instant::now());
                        let mut r = shared.report(tally.clone(), elapsed());
                        r.incomplete = Some(Incomplete {
                            depth,
                            chunks_done: done_here.clone(),
                        });
                        sink(&Event::Checkpoint(Box::new(r)));
                    }
                    if hold_here {
                        hold.store(true, Ordering::SeqCst);
                    }
                },
            )?;
            if finished < counted {
                stopped = Some(stopped_in(done_here));
                break;
            }
            prev = ever;
        }
        let mut report = shared.report(tally, elapsed());
        report.incomplete = stopped;
        for f in &report.findings {
            sink(&Event::Finding(f.clone()));
        }
        sink(&Event::Done(Box::new(report.clone())));
        Ok(report)
    }
}

/// Runs `work` on every thread's runners: `said` hears of each finished piece (on this
/// thread) and of the trials done so far, every 100 ms. Pieces in flight when `stop`
/// is set are dropped unfinished.
#[allow(clippy::too_many_arguments)]
fn run_work(
    shared: &Shared<'_>,
    runners: &mut [RunnerPair],
    work: &[Work],
    (prev, ever): (Option<&EverBits>, Option<&EverBits>),
    (stop, hold): (&AtomicBool, &AtomicBool),
    done: &AtomicU64,
    said: &mut dyn FnMut(Said),
) -> Result<(), HarnessError> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<Said>();
    let threads = runners.len();
    let mut result = Ok(());
    std::thread::scope(|scope| {
        for (ra, rb) in runners.iter_mut() {
            let tx = tx.clone();
            let ctx = DepthWork {
                cfg: shared.cfg,
                ops: &shared.ops,
                work,
                next: &next,
                done,
                failed: &failed,
                stop,
                hold,
                prev,
                ever,
                info_a: &shared.info_a,
                info_b: shared.info_b.as_ref(),
                judges: &shared.judges,
            };
            scope.spawn(move || {
                let r = ctx.run(ra.as_mut(), rb.as_deref_mut(), &tx);
                if r.is_err() {
                    ctx.failed.store(true, Ordering::Relaxed);
                }
                let _ = tx.send(Said::Ended(r));
            });
        }
        drop(tx);
        let mut ended = 0;
        let mut said_progress = Instant::now();
        while ended < threads {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(Said::Ended(r)) => {
                    ended += 1;
                    if result.is_ok() {
                        result = r;
                    }
                }
                Ok(s) => said(s),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            if said_progress.elapsed() >= Duration::from_millis(100) {
                said_progress = Instant::now();
                said(Said::Progress(done.load(Ordering::Relaxed)));
            }
        }
    });
    result
}

/// What one thread needs to work through the pieces of one depth.
#[derive(Clone, Copy)]
struct DepthWork<'a> {
    cfg: &'a ExhaustiveConfig,
    ops: &'a [Op],
    work: &'a [Work],
    next: &'a AtomicUsize,
    done: &'a AtomicU64,
    failed: &'a AtomicBool,
    stop: &'a AtomicBool,
    /// Set by [`RunControl::hold_at_depth`]: take no new piece until stopped.
    hold: &'a AtomicBool,
    /// "Violated at some step" bits of the previous depth (none at depth 1).
    prev: Option<&'a EverBits>,
    /// The same bits for this depth, filled here (none where no later depth reads them).
    ever: Option<&'a EverBits>,
    info_a: &'a TargetInfo,
    info_b: Option<&'a TargetInfo>,
    judges: &'a RunOracles,
}

/// A batch out at the runners, with each trace's index within its depth, and the pieces of
/// work it finishes (those whose last batch it is), each with the number of the batch's
/// traces up to its end.
struct InFlight {
    indices: Vec<u64>,
    a: StartedBatch,
    b: Option<StartedBatch>,
    finishes: Vec<(usize, Work)>,
}

impl DepthWork<'_> {
    fn stopping(&self) -> bool {
        self.failed.load(Ordering::Relaxed) || self.stop.load(Ordering::Relaxed)
    }

    fn run(
        &self,
        a: &mut (dyn TrialRunner + 'static),
        mut b: Option<&mut (dyn TrialRunner + 'static)>,
        said: &mpsc::Sender<Said>,
    ) -> Result<(), HarnessError> {
        let n = self.ops.len() as u64;
        // The tally of the piece whose batches are being judged (batches are judged in order).
        let mut tally = Tally::default();
        // This thread's runner shares step observations between trials; so are their verdicts.
        let mut verdicts = VerdictMemo::default();
        let mut batch: Vec<Trace> = Vec::with_capacity(self.cfg.batch);
        let mut indices: Vec<u64> = Vec::with_capacity(self.cfg.batch);
        // While a worker process runs one batch, this thread builds the next and judges the
        // previous one: one batch in flight, finished before the next is started.
        let mut in_flight: Option<InFlight> = None;
        // Alone, a trial is judged on its last step only: a runner that observes it in another
        // process may judge it there and send back the verdicts instead of the step, with each
        // trace's prior bits (what its prefix violated: no new finding there).
        let judge_where_observed = match b {
            None => self.judges.tracked_ids(),
            Some(_) => Vec::new(),
        };
        let mut priors: Vec<u64> = Vec::with_capacity(self.cfg.batch);
        // The traces of judged batches, filled again for the next ones: a trace's setup and
        // ops are cloned only where they differ from what it held (an odometer turns the last
        // op), not allocated and dropped for every trial.
        let mut spare: Vec<Trace> = Vec::new();
        // Each spare trace's index within its depth: which ops it holds (see `refill`).
        let mut spare_indices: Vec<u64> = Vec::new();
        let mut held = Vec::new();
        let mut wanted = Vec::new();
        // The number within the depth of the batch's first trace (see `Enumerated`).
        let mut batch_from = 0;
        // The pieces the batch being built finishes, each with the batch's length at its end.
        let mut batch_pieces: Vec<(usize, Work)> = Vec::new();
        // A piece taken to continue the batch being built that did not start where it ended:
        // the next one to run.
        let mut claimed: Option<Work> = None;
        'pieces: loop {
            while self.hold.load(Ordering::SeqCst) && !self.stopping() {
                std::thread::sleep(Duration::from_millis(1));
            }
            if self.stopping() {
                return Ok(());
            }
            let piece = match claimed.take() {
                Some(piece) => piece,
                None => {
                    let i = self.next.fetch_add(1, Ordering::Relaxed);
                    let Some(&piece) = self.work.get(i) else {
                        break;
                    };
                    piece
                }
            };
            let chunk = piece.chunk;
            let first_in_depth = chunk.base_in_depth(n) + piece.from;
            for (k, in_depth) in (first_in_depth..first_in_depth + piece.len).enumerate() {
                if batch.is_empty() {
                    batch_from = in_depth;
                }
                // Spare traces were made here, of this run's setup, which runners leave as it
                // is: it is not compared again for every trial.
                let mut trace = spare.pop().unwrap_or_else(|| Trace {
                    setup: self.cfg.domain.setup.clone(),
                    ops: Vec::with_capacity(chunk.depth as usize),
                });
                debug_assert!(trace.setup == self.cfg.domain.setup);
                // A spare trace holds the ops of its index: only those that differ are copied.
                enumerated_indices(n, chunk.depth, in_depth, &mut wanted);
                match spare_indices.pop() {
                    Some(i) => enumerated_indices(n, trace.ops.len() as u32, i, &mut held),
                    None => held.clear(),
                }
                trace.refill_indexed(self.ops, &held, &wanted);
                batch.push(trace);
                indices.push(in_depth);
                if !judge_where_observed.is_empty() {
                    priors.push(self.prior(in_depth, n));
                }
                let last = k as u64 + 1 == piece.len;
                if last {
                    batch_pieces.push((batch.len(), piece));
                }
                let full = batch.len() == self.cfg.batch;
                if !full && !last {
                    continue;
                }
                // A short piece (a shallow depth's chunks hold a few trials each) does not go
                // alone: the batch goes on with the next piece when that one starts where this
                // one ends, up to an eighth of a batch (each request's round trip cost about as
                // much as the depth-2 trials of a chunk; the eighth leaves every thread some).
                if !full
                    && batch.len() < self.cfg.batch.div_ceil(8)
                    && !self.hold.load(Ordering::SeqCst)
                {
                    let i = self.next.fetch_add(1, Ordering::Relaxed);
                    if let Some(&next) = self.work.get(i) {
                        claimed = Some(next);
                        let adjacent = next.chunk.depth == chunk.depth
                            && next.chunk.base_in_depth(n) + next.from == in_depth + 1;
                        if adjacent {
                            continue 'pieces;
                        }
                    }
                }
                if self.stopping() {
                    break 'pieces;
                }
                // No prior bits at all (a run that has found nothing yet) go as none.
                if priors.iter().all(|&p| p == 0) {
                    priors.clear();
                }
                // The next request is built before the previous batch is waited for: the
                // worker then waits only for it to be written.
                let a_prepared = a.prepare_batch_last(
                    std::mem::replace(&mut batch, Vec::with_capacity(self.cfg.batch)),
                    BatchJudging {
                        oracles: judge_where_observed.clone(),
                        prior: std::mem::take(&mut priors),
                    },
                    Some(Enumerated {
                        ops: self.ops,
                        depth: chunk.depth,
                        from: batch_from,
                    }),
                );
                let finished = in_flight
                    .take()
                    .map(|f| self.finish(f, a, b.as_deref_mut()))
                    .transpose()?;
                let a_started = a.start_batch_last(a_prepared)?;
                let b_started = match b.as_deref_mut() {
                    Some(b) => {
                        let prepared = b.prepare_batch_last(
                            a_started.traces.clone(),
                            BatchJudging::default(),
                            None,
                        );
                        Some(b.start_batch_last(prepared)?)
                    }
                    None => None,
                };
                in_flight = Some(InFlight {
                    indices: std::mem::replace(&mut indices, Vec::with_capacity(self.cfg.batch)),
                    a: a_started,
                    b: b_started,
                    finishes: std::mem::take(&mut batch_pieces),
                });
                if let Some(done) = finished {
                    spare_indices.clear();
                    spare_indices.extend_from_slice(&done.indices);
                    spare = self.judge_batch(&mut verdicts, &mut tally, done, n, said);
                }
            }
        }
        if let Some(f) = in_flight.take() {
            if self.stopping() {
                return Ok(());
            }
            let done = self.finish(f, a, b)?;
            self.judge_batch(&mut verdicts, &mut tally, done, n, said);
        }
        Ok(())
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
            finishes: f.finishes,
        })
    }

    /// The tracked oracles that trial `index` (of this depth) violated at an earlier step: its
    /// prefix (all ops but the last) is trial `index / n` of the previous depth, in the same
    /// lexicographic numbering.
    fn prior(&self, index: u64, n: u64) -> OracleBits {
        match self.prev {
            Some(prev) => (0..self.judges.tracked_count())
                .filter(|&k| prev.get(k, index / n))
                .fold(0, |bits, k| bits | 1 << k),
            None => 0,
        }
    }

    /// Judges a finished batch into `tally`, marks this depth's "ever violated" bits, and
    /// hands the tally on at the end of each piece of work the batch finishes.
    fn judge_batch(
        &self,
        verdicts: &mut VerdictMemo,
        tally: &mut Tally,
        done: FinishedBatch,
        n: u64,
        said: &mpsc::Sender<Said>,
    ) -> Vec<Trace> {
        let mut finishes = done.finishes.iter().peekable();
        // Consecutive clean trials judged where they were observed, not yet recorded: at the
        // last depth (no "ever violated" bits to mark) such a trial only adds to the counts,
        // so a run of them is recorded at once (most trials of an audit are such).
        let mut clean: Option<(u32, StepVerdicts, u64)> = None;
        let record_clean = |tally: &mut Tally, clean: &mut Option<(u32, StepVerdicts, u64)>| {
            if let Some((depth, v, count)) = clean.take() {
                self.judges.record_judged(tally, depth, v, count);
            }
        };
        for (j, trace) in done.traces.iter().enumerate() {
            let alone_clean = (self.ever.is_none() && done.rb.is_none())
                .then(|| done.ra[j].only_verdicts())
                .flatten()
                .filter(|v| v.violated == 0);
            if let Some(v) = alone_clean {
                let depth = trace.ops.len() as u32;
                match &mut clean {
                    Some((d, held, count)) if *d == depth && *held == v => *count += 1,
                    _ => {
                        record_clean(tally, &mut clean);
                        clean = Some((depth, v, 1));
                    }
                }
            } else {
                record_clean(tally, &mut clean);
                self.judge_one(verdicts, tally, &done, j, n);
            }
            if finishes.peek().is_some_and(|(end, _)| *end == j + 1) {
                record_clean(tally, &mut clean);
            }
            while let Some(&(_, work)) = finishes.next_if(|(end, _)| *end == j + 1) {
                let tally = std::mem::take(tally);
                let _ = said.send(Said::Finished { work, tally });
            }
        }
        record_clean(tally, &mut clean);
        self.done
            .fetch_add(done.traces.len() as u64, Ordering::Relaxed);
        done.traces
    }

    /// Judges trial `j` of a finished batch into `tally`, and marks this depth's "ever
    /// violated" bits.
    fn judge_one(
        &self,
        verdicts: &mut VerdictMemo,
        tally: &mut Tally,
        done: &FinishedBatch,
        j: usize,
        n: u64,
    ) {
        let (trace, index) = (&done.traces[j], done.indices[j]);
        let depth = trace.ops.len() as u64;
        let depth_base = total_trials(n, depth as u32 - 1);
        let pb = match (self.info_b, &done.rb) {
            (Some(ib), Some(rb)) => Some((ib, &rb[j])),
            _ => None,
        };
        let tracked = self.judges.tracked_count();
        let prior = self.prior(index, n);
        if let Some(code) = &done.ra[j].code {
            tally.code.get_or_insert_with(Default::default).add(code);
        }
        let now = self.judges.judge(
            verdicts,
            tally,
            trace,
            depth_base + index,
            (self.info_a, &done.ra[j]),
            pb,
            prior,
        );
        if let (Some(now), Some(ever)) = (now, self.ever) {
            for k in 0..tracked {
                if (now | prior) & (1 << k) != 0 {
                    ever.set(k, index);
                }
            }
        }
    }
}

/// A batch's traces and results.
struct FinishedBatch {
    indices: Vec<u64>,
    traces: Vec<Trace>,
    ra: Vec<TrialRun>,
    rb: Option<Vec<TrialRun>>,
    finishes: Vec<(usize, Work)>,
}

#[cfg(test)]
mod tests;
