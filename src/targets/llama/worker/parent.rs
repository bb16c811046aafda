//! The parent side of crash isolation: [`WorkerRunner`], a [`TrialRunner`] whose target lives in
//! a `kvaudit-llama-worker` process. It sends each batch as one request line, reads the replies the
//! process's reader thread decoded (`process.rs`, bounded, see [`super::wire`]), turns a death into
//! [`TrialEnd::Crashed`] with the signal, the step and llama.cpp's last words, and remembers
//! crashing prefixes. A trial that may corrupt the child's memory (`may_corrupt_memory`: a
//! sequence id at or beyond `n_seq_max`) runs alone in a child forked afresh and retired after it.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use super::last_words::{blamed_observation, crash_end, crash_marker, Marker};
use super::process::Worker;
use super::wire::{Reply, Request, AFTER_DEATH_REPLY_GROUP};
use super::WorkerSpec;
use crate::base::cache::{HarnessError, Observation, TargetInfo};
use crate::base::op::{Op, Setup, Trace};
use crate::running::runner::{
    BatchJudging, Enumerated, ObservationCrash, PreparedBatch, Skipped, StartedBatch, TrialEnd,
    TrialRun, TrialRunner,
};
use crate::targets::llama::startup::mark;
use crate::targets::llama::target::ResetMode;

/// Whether the first trial's reply has been marked (`KVAUDIT_TRACE_STARTUP`).
static FIRST_RUN: std::sync::Once = std::sync::Once::new();

/// Marks `phase` the first time only.
fn mark_once(once: &std::sync::Once, phase: &str) {
    once.call_once(|| mark(phase));
}

/// Where in a batch the worker died, how, and what it was observing then (`None`: running an op).
type Died = (usize, TrialEnd, Option<Observation>);

/// The parent side: a [`TrialRunner`] whose target lives in a child process.
pub struct WorkerRunner {
    spec: WorkerSpec,
    info: TargetInfo,
    worker: Option<Worker>,
    crashes: HashMap<(Setup, Vec<Op>), String>,
    /// What the requests written now leave out (a trial run again after an observation crash).
    skipped: Skipped,
    /// Worker processes started so far (restarts after crashes included).
    pub starts: usize,
    /// Processes lost to a crash or a hang so far: a fork server's child (the server lives on) or
    /// the whole worker.
    pub deaths: usize,
    /// Children retired so far around trials that may corrupt memory.
    pub retired: usize,
    /// Whether the worker's child has run no trial since it was forked from the warm server.
    child_fresh: bool,
    /// The last request's line, its buffer reused for the next.
    line: Vec<u8>,
}

impl WorkerRunner {
    /// Starts a worker and waits until it has loaded the shim.
    pub fn new(spec: WorkerSpec) -> Result<Self, HarnessError> {
        let placeholder = TargetInfo {
            name: spec.label.clone(),
            version: String::new(),
            faults: vec![],
            model: crate::targets::llama::target::model_name(&spec.model),
            state_format: spec.format,
        };
        let mut r = WorkerRunner {
            spec,
            info: placeholder,
            worker: None,
            crashes: HashMap::new(),
            skipped: Vec::new(),
            starts: 0,
            deaths: 0,
            retired: 0,
            child_fresh: true,
            line: Vec::new(),
        };
        r.start()?;
        Ok(r)
    }

    /// How long a trial may run before it counts as a hang, from now on.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.spec.timeout = timeout;
    }

    fn harness(&self, message: impl std::fmt::Display) -> HarnessError {
        HarnessError::Target {
            target: self.spec.label.clone(),
            message: message.to_string(),
        }
    }

    fn start(&mut self) -> Result<(), HarnessError> {
        let mut cmd = Command::new(&self.spec.exe);
        // The worker runs as `kvaudit` (argv[0]): an `assert` in llama.cpp prints the program's
        // name first, and a crash's kind quotes it ("SIGABRT: kvaudit: llama-kv-cells.h:351:
        // ..."), as corpus files and committed reports record it from before the worker had a
        // program of its own.
        cmd.arg0("kvaudit")
            .arg("--shim")
            .arg(&self.spec.shim)
            .arg("--model")
            .arg(&self.spec.model)
            .arg("--label")
            .arg(&self.spec.label)
            .env("GGML_NO_BACKTRACE", "1")
            .envs(self.spec.env.iter().map(|(k, v)| (k, v)));
        if self.spec.format.rot_fields {
            cmd.arg("--rot-fields");
        }
        for (set, flag) in [
            (self.spec.format.no_stream_count, "--no-stream-count"),
            (self.spec.format.no_seq_header, "--no-seq-header"),
            (self.spec.format.whole_has_outputs, "--whole-has-outputs"),
        ] {
            if set {
                cmd.arg(flag);
            }
        }
        if self.spec.reset == ResetMode::Rebuild {
            cmd.arg("--rebuild-resets");
        }
        cmd.arg("--observe")
            .arg(super::observe_arg(self.spec.observe));
        if let Some(what) = self.spec.crash_observing {
            cmd.arg("--crash-observing").arg(what.name());
        }
        for fault in self.spec.faults.names() {
            cmd.arg("--inject").arg(fault);
        }
        mark("parent: worker spawning");
        let mut w = Worker::spawn(&mut cmd).map_err(|e| {
            self.harness(format!(
                "cannot start worker {}: {e}",
                self.spec.exe.display()
            ))
        })?;
        self.starts += 1;
        match w.next_line(Duration::from_secs(60)) {
            Ok(Some(reply)) => match reply {
                Ok(Reply::Ready(info)) => {
                    mark("parent: worker ready");
                    self.info = info
                }
                Ok(Reply::Error(e)) => {
                    return Err(self.harness(format!("worker failed to start: {e}")))
                }
                Ok(other) => {
                    return Err(
                        self.harness(format!("worker said {} instead of ready", other.kind()))
                    )
                }
                Err(e) => return Err(self.harness(format!("worker said no ready: {e}"))),
            },
            _ => {
                let (_, text) = w.reap();
                return Err(self.harness(format!("worker died while starting: {}", text.trim())));
            }
        }
        self.worker = Some(w);
        self.child_fresh = true;
        Ok(())
    }

    /// Sends `traces` and collects results until the batch is done or the worker dies. Returns
    /// the results received and, if the worker died, the index of the trace it died on and how.
    /// The worker flushes its replies in groups (see `wire::REPLY_GROUP`), so traces between the
    /// last reply and the crashed one ran but were not reported: the caller sends them again.
    ///
    /// A trace that may corrupt memory ([`may_corrupt_memory`]) runs alone in a child that ran
    /// nothing before it and ends after it: the child before it is retired first (the request
    /// before it retires, or an empty retiring request), so that its outcome depends on its own
    /// ops only and no later trial runs on a heap it may have corrupted.
    fn send(
        &mut self,
        traces: &[Trace],
        last_only: bool,
        flush_each: bool,
        judge: &BatchJudging,
    ) -> Result<(Vec<TrialRun>, Option<Died>), HarnessError> {
        let isolated: Vec<bool> = traces.iter().map(may_corrupt_memory).collect();
        let mut runs = Vec::with_capacity(traces.len());
        let mut start = 0;
        while start < traces.len() {
            let end = if isolated[start] {
                if !self.child_fresh {
                    self.send_request(&[], last_only, flush_each, true, &judge.slice(0..0))?;
                }
                start + 1
            } else {
                isolated[start..]
                    .iter()
                    .position(|&i| i)
                    .map_or(traces.len(), |k| start + k)
            };
            // A segment retires its child when a trace that may corrupt memory is in it or next.
            let retire = isolated[start] || end < traces.len();
            let (more, died) = self.send_request(
                &traces[start..end],
                last_only,
                flush_each,
                retire,
                &judge.slice(start..end),
            )?;
            runs.extend(more);
            if let Some((at, how, observing)) = died {
                return Ok((runs, Some((start + at, how, observing))));
            }
            start = end;
        }
        Ok((runs, None))
    }

    /// One request for `traces` (its child ending after it when `retire`) and its replies.
    fn send_request(
        &mut self,
        traces: &[Trace],
        last_only: bool,
        flush_each: bool,
        retire: bool,
        judge: &BatchJudging,
    ) -> Result<(Vec<TrialRun>, Option<Died>), HarnessError> {
        self.write_request(traces, last_only, flush_each, retire, judge)?;
        self.read_replies(traces, last_only, flush_each, retire)
    }

    /// Starts the worker if needed and hands it `traces`; it starts on them at once. The child
    /// ends after the request when `retire`.
    fn write_request(
        &mut self,
        traces: &[Trace],
        last_only: bool,
        flush_each: bool,
        retire: bool,
        judge: &BatchJudging,
    ) -> Result<(), HarnessError> {
        let mut line = std::mem::take(&mut self.line);
        Request::new(traces, last_only, flush_each)
            .grouping(self.reply_group())
            .skipping(&self.skipped)
            .retiring(retire)
            .judging(judge)
            .write_line(&mut line);
        let written = self.write_line(&line, !traces.is_empty());
        self.line = line;
        written
    }

    /// Starts the worker if needed and writes `line`, a request (for at least one trace when
    /// `traces`).
    fn write_line(&mut self, line: &[u8], traces: bool) -> Result<(), HarnessError> {
        if self.worker.is_none() {
            self.start()?;
        }
        if traces {
            self.child_fresh = false;
        }
        let w = self.worker.as_mut().expect("started");
        if w.stdin
            .write_all(line)
            .and_then(|_| w.stdin.flush())
            .is_err()
        {
            // The worker is gone already; reading the replies reports how.
        }
        Ok(())
    }

    /// The second half of [`WorkerRunner::send`]: the replies to the request just written and,
    /// when it retires its child (`retire`), the server's word that the child has ended.
    fn read_replies(
        &mut self,
        traces: &[Trace],
        last_only: bool,
        flush_each: bool,
        retire: bool,
    ) -> Result<(Vec<TrialRun>, Option<Died>), HarnessError> {
        let (runs, died) = self.read_runs(traces, last_only, flush_each)?;
        if died.is_some() || !retire {
            return Ok((runs, died));
        }
        let w = self.worker.as_mut().expect("a request was written");
        match w.next_line(self.spec.timeout) {
            Ok(Some(Ok(Reply::Retired))) => {
                self.retired += 1;
                self.child_fresh = true;
                Ok((runs, None))
            }
            other => {
                // The protocol broke (or the server died between the runs and its word): the
                // worker's state is unknown, so a later batch gets a new one.
                self.worker = None;
                let said = match other {
                    Ok(Some(Ok(reply))) => format!("a {} reply", reply.kind()),
                    Ok(Some(Err(e))) => e.to_string(),
                    Ok(None) | Err(RecvTimeoutError::Disconnected) => "nothing (it ended)".into(),
                    Err(RecvTimeoutError::Timeout) => "nothing in time".into(),
                };
                Err(self.harness(format!("worker said {said} instead of retiring its child")))
            }
        }
    }

    /// The runs of the request just written, until the batch is done or the worker dies.
    fn read_runs(
        &mut self,
        traces: &[Trace],
        last_only: bool,
        flush_each: bool,
    ) -> Result<(Vec<TrialRun>, Option<Died>), HarnessError> {
        let w = self.worker.as_mut().expect("a request was written");
        let mut runs = Vec::with_capacity(traces.len());
        while runs.len() < traces.len() {
            let death = match w.next_line(self.spec.timeout) {
                Ok(Some(reply)) => match reply {
                    Ok(Reply::Run(r)) => {
                        if runs.is_empty() {
                            mark_once(&FIRST_RUN, "parent: first trial's reply");
                        }
                        runs.push(r);
                        continue;
                    }
                    Ok(Reply::Judged(bits, count)) => {
                        if runs.is_empty() {
                            mark_once(&FIRST_RUN, "parent: first trial's reply");
                        }
                        let count = count as usize;
                        if runs.len() + count > traces.len() {
                            self.worker = None;
                            return Err(self.harness(format!(
                                "worker judged {count} more trials after {} of a batch of {}",
                                runs.len(),
                                traces.len()
                            )));
                        }
                        runs.extend(std::iter::repeat(TrialRun::judged(bits)).take(count));
                        continue;
                    }
                    Ok(Reply::Died(raw)) => w.child_died(raw),
                    Ok(Reply::Error(e)) => return Err(self.harness(format!("worker: {e}"))),
                    // The protocol broke: the worker's state is unknown, so a later batch gets
                    // a new one.
                    Ok(other) => {
                        self.worker = None;
                        return Err(self
                            .harness(format!("worker sent an unexpected {} reply", other.kind())));
                    }
                    Err(e) => {
                        self.worker = None;
                        return Err(self.harness(format!("worker: {e}")));
                    }
                },
                Ok(None) | Err(RecvTimeoutError::Disconnected) => w.server_died(),
                Err(RecvTimeoutError::Timeout) => {
                    // SIGABRT makes the running child's handler say which trial and step it is
                    // stuck in (the fork server forwards it; a server stuck itself dies of it).
                    let death = w.abort_hang();
                    self.deaths += 1;
                    self.child_fresh = true;
                    // A marker that names a trial already answered is another child's (one that
                    // was idle when the SIGABRT reached it): it says nothing of the trial that
                    // hung, which is then blamed whole, at its last op, so that its prefix is
                    // remembered as crashing (every later trace starting with it is answered
                    // without running) only as far as it is known to reach.
                    let marker = crash_marker(&death.stderr)
                        .filter(|m| m.trial >= runs.len())
                        .unwrap_or(Marker {
                            trial: runs.len(),
                            step: traces[runs.len()].ops.len(),
                            observing: None,
                        });
                    let at = marker.trial.clamp(runs.len(), traces.len() - 1);
                    let step = marker.op_step().clamp(1, traces[at].ops.len().max(1));
                    let message = format!(
                        "hang: no result within {:.1} s",
                        self.spec.timeout.as_secs_f64()
                    );
                    if !death.server_alive {
                        self.worker = None;
                    }
                    let end = TrialEnd::Crashed { step, message };
                    return Ok((runs, Some((at, end, marker.observing))));
                }
            };
            self.deaths += 1;
            // The server forks a new child from its warm state (or a new worker starts).
            self.child_fresh = true;
            if !death.server_alive {
                self.worker = None;
            }
            let Some(marker) = crash_marker(&death.stderr) else {
                // No marker (an exit without a signal): which unreported trace died is unknown,
                // so run them again one reply at a time to find out.
                if !flush_each {
                    // (Reported whole, to be judged here: this is the rare path.)
                    let none = BatchJudging::default();
                    let (more, died) = self.send(&traces[runs.len()..], last_only, true, &none)?;
                    let base = runs.len();
                    runs.extend(more);
                    return Ok((runs, died.map(|(i, e, o)| (base + i, e, o))));
                }
                let end = crash_end(
                    &death.stderr,
                    death.status,
                    None,
                    traces[runs.len()].ops.len(),
                );
                let at = runs.len();
                return Ok((runs, Some((at, end, None))));
            };
            let at = marker.trial.clamp(runs.len(), traces.len() - 1);
            let end = crash_end(
                &death.stderr,
                death.status,
                Some(marker.op_step()),
                traces[at].ops.len(),
            );
            return Ok((runs, Some((at, end, marker.observing))));
        }
        Ok((runs, None))
    }

    fn known_crash(&self, trace: &Trace) -> Option<TrialEnd> {
        // The lookup clones the key; most runs never crash, and then there is nothing to find.
        if self.crashes.is_empty() {
            return None;
        }
        (1..=trace.ops.len()).find_map(|n| {
            self.crashes
                .get(&(trace.setup.clone(), trace.ops[..n].to_vec()))
                .map(|m| TrialEnd::Crashed {
                    step: n,
                    message: m.clone(),
                })
        })
    }
}

impl TrialRunner for WorkerRunner {
    fn info(&self) -> TargetInfo {
        self.info.clone()
    }

    fn run_batch(&mut self, traces: &[Trace]) -> Result<Vec<TrialRun>, HarnessError> {
        self.run_in_worker(traces, false, false, &BatchJudging::default())
    }

    fn run_batch_last(&mut self, traces: &[Trace]) -> Result<Vec<TrialRun>, HarnessError> {
        self.run_in_worker(traces, true, false, &BatchJudging::default())
    }

    fn prepare_batch_last(
        &mut self,
        traces: Vec<Trace>,
        judge: BatchJudging,
        enumerated: Option<Enumerated<'_>>,
    ) -> PreparedBatch {
        // The worker judges with built-in oracles only (it knows no other): with any other
        // among them, the parent judges every trial.
        let builtin = crate::oracles::Registry::builtin();
        let judge = if judge.oracles.iter().all(|&id| builtin.get(id).is_some()) {
            judge
        } else {
            BatchJudging::default()
        };
        // Built while the previous batch runs. (Only the usual request: none of the previous
        // batch's skipped observations, no retiring; `start_batch_last` checks both.)
        let mut line = Vec::new();
        // An enumerated batch goes as its place in the enumeration: the worker makes the same
        // traces from it (the trace list, written by the parent and parsed by the worker, was
        // about a fifth of kvaudit's own samples in a depth-3 basic audit, perf).
        let request = enumerated
            .zip(traces.first())
            .and_then(|(run, t)| Request::enumerated(&t.setup, run, traces.len(), true));
        request
            .unwrap_or_else(|| Request::new(&traces, true, false))
            .grouping(self.reply_group())
            .judging(&judge)
            .write_line(&mut line);
        // Every trace of an enumerated batch is the setup's ops and some of the run's: one
        // that may corrupt memory is among them only if one of those ops names a sequence
        // beyond the setup's (see `may_corrupt_memory`).
        let may_corrupt = enumerated
            .zip(traces.first())
            .map(|(run, t)| ops_may_corrupt_memory(&t.setup, run.ops));
        PreparedBatch {
            traces,
            request: Some(line),
            judge,
            may_corrupt,
        }
    }

    fn start_batch_last(&mut self, batch: PreparedBatch) -> Result<StartedBatch, HarnessError> {
        let PreparedBatch {
            traces,
            request,
            judge,
            may_corrupt,
        } = batch;
        // A batch holding a trace that starts with a known crashing prefix takes the careful
        // path at the finish (those traces are answered without running them), and so does one
        // holding a trace that runs in a child of its own. (The crashes known now: the batch
        // before, finished since the request was prepared, may have added some.)
        let per_trace = may_corrupt != Some(false);
        let sent = !traces
            .iter()
            .any(|t| self.known_crash(t).is_some() || (per_trace && may_corrupt_memory(t)));
        if sent {
            match request.filter(|_| self.skipped.is_empty()) {
                Some(line) => self.write_line(&line, !traces.is_empty())?,
                None => self.write_request(&traces, true, false, false, &judge)?,
            }
        }
        Ok(StartedBatch {
            traces,
            sent,
            judge,
        })
    }

    fn finish_batch_last(
        &mut self,
        batch: StartedBatch,
    ) -> Result<(Vec<Trace>, Vec<TrialRun>), HarnessError> {
        let runs = self.run_in_worker(&batch.traces, true, batch.sent, &batch.judge)?;
        Ok((batch.traces, runs))
    }
}

impl WorkerRunner {
    /// How often the worker flushes its replies: every [`AFTER_DEATH_REPLY_GROUP`] once one of
    /// its children has died (crashes come in runs: fewer traces run twice), else the default.
    fn reply_group(&self) -> Option<u32> {
        (self.deaths > 0).then_some(AFTER_DEATH_REPLY_GROUP)
    }

    /// Runs `traces` in the worker, restarting it after each crash. `sent`: the request for all of
    /// `traces` is written already (by [`TrialRunner::start_batch_last`]).
    fn run_in_worker(
        &mut self,
        traces: &[Trace],
        last_only: bool,
        mut sent: bool,
        judge: &BatchJudging,
    ) -> Result<Vec<TrialRun>, HarnessError> {
        // The usual batch: no crash known, none happens. Its runs are the reply's, in order,
        // without the bookkeeping below (a slot per trace and the indices still to run).
        let mut first = None;
        if self.crashes.is_empty() {
            let got = if std::mem::take(&mut sent) {
                self.read_replies(traces, last_only, false, false)?
            } else {
                self.send(traces, last_only, false, judge)?
            };
            if got.1.is_none() {
                return Ok(got.0);
            }
            first = Some(got);
        }
        let mut out: Vec<Option<TrialRun>> = vec![None; traces.len()];
        let mut todo: Vec<usize> = Vec::with_capacity(traces.len());
        for (i, t) in traces.iter().enumerate() {
            match self.known_crash(t) {
                Some(end) => out[i] = Some(TrialRun::new(vec![], end)),
                None => todo.push(i),
            }
        }
        while !todo.is_empty() {
            // With no crash known before it, the first answer covers every trace of the batch.
            let (runs, died) = if let Some(got) = first.take() {
                got
            } else if std::mem::take(&mut sent) {
                debug_assert_eq!(todo.len(), traces.len());
                self.read_replies(traces, last_only, false, false)?
            } else {
                let batch: Vec<Trace> = todo.iter().map(|&i| traces[i].clone()).collect();
                self.send(&batch, last_only, false, &judge.pick(&todo))?
            };
            let n_ok = runs.len();
            for (k, r) in runs.into_iter().enumerate() {
                out[todo[k]] = Some(r);
            }
            let Some((at, end, observing)) = died else {
                break;
            };
            let crashed = todo[at];
            let observing = blamed_observation(observing, &end);
            out[crashed] = Some(match (observing, end) {
                (Some(what), TrialEnd::Crashed { step, message }) => {
                    // The op returned: its prefix does not crash (a longer trial that does not
                    // observe there runs), so it is not remembered as a crashing one.
                    let first = ObservationCrash {
                        step,
                        observation: what,
                        message,
                    };
                    self.run_without(&traces[crashed], last_only, first)?
                }
                (_, end) => {
                    if let TrialEnd::Crashed { step, message } = &end {
                        let t = &traces[crashed];
                        // A crash in the setup is reported at step 1 of a trace that may
                        // have no op.
                        let prefix = t.ops[..(*step).min(t.ops.len())].to_vec();
                        self.crashes
                            .insert((t.setup.clone(), prefix), message.clone());
                    }
                    TrialRun::new(vec![], end)
                }
            });
            // The rest of the batch, with the traces that ran but were not reported: skip those
            // that share the crashing prefix, send the others again.
            let rest: Vec<usize> = todo[n_ok..at]
                .iter()
                .chain(&todo[at + 1..])
                .copied()
                .collect();
            todo.clear();
            for i in rest {
                match self.known_crash(&traces[i]) {
                    Some(end) => out[i] = Some(TrialRun::new(vec![], end)),
                    None => todo.push(i),
                }
            }
        }
        Ok(out
            .into_iter()
            .map(|r| r.expect("every trace answered"))
            .collect())
    }
}

impl WorkerRunner {
    /// Runs `trace` again, alone, without the observation that crashed (`first`) from its step
    /// on, and without each further one that crashes then: the oracles that do not read them
    /// still judge the trial. An observation no step can do without (the sequences') ends the
    /// trial unobserved at its step.
    fn run_without(
        &mut self,
        trace: &Trace,
        last_only: bool,
        first: ObservationCrash,
    ) -> Result<TrialRun, HarnessError> {
        let mut skipped: Skipped = Vec::new();
        let mut crash = (first.step, first.observation, first.message.clone());
        loop {
            let (step, what, message) = crash;
            if what == Observation::Sequences || skipped.iter().any(|&(_, w)| w == what) {
                // Left out already and crashed again: the trace is not what the worker ran.
                let end = TrialEnd::Crashed { step, message };
                return Ok(TrialRun {
                    observation_crash: Some(Box::new(first)),
                    code: None,
                    ..TrialRun::new(vec![], end)
                });
            }
            skipped.push((step, what));
            self.skipped = skipped.clone();
            let none = BatchJudging::default();
            let sent = self.send(std::slice::from_ref(trace), last_only, true, &none);
            self.skipped.clear();
            let (mut runs, died) = sent?;
            match died.map(|(at, end, o)| (at, blamed_observation(o, &end), end)) {
                None => {
                    let mut run = runs.pop().expect("one run per trace");
                    run.observation_crash = Some(Box::new(first));
                    return Ok(run);
                }
                Some((_, Some(what), TrialEnd::Crashed { step, message })) => {
                    crash = (step, what, message);
                }
                Some((_, _, end)) => {
                    return Ok(TrialRun {
                        observation_crash: Some(Box::new(first)),
                        code: None,
                        ..TrialRun::new(vec![], end)
                    });
                }
            }
        }
    }
}

/// Whether a trial may corrupt the worker's memory without crashing, so that it must not share
/// a process with another trial: it names a sequence id at or beyond the setup's `n_seq_max`
/// (in its setup or its ops). llama.cpp checks such ids against `LLAMA_MAX_SEQ` only, or not
/// before it uses them: 0.1.161's batch allocator writes its next-position array at the id
/// before it validates it (corpora/crash_decode_next_pos_seq_id_out_of_range.json), and the
/// heap it corrupts made later trials of the same child crash or not from run to run (`seqids`
/// audits: crash 0, 54, 53). A sanitizer's report ends the child anyway (it aborts).
pub fn may_corrupt_memory(trace: &Trace) -> bool {
    ops_may_corrupt_memory(&trace.setup, &trace.ops)
}

/// Whether a trace of `setup` made of some of `ops` may corrupt memory: one of them, or of the
/// setup's, names a sequence beyond the setup's ([`may_corrupt_memory`]).
fn ops_may_corrupt_memory(setup: &Setup, ops: &[Op]) -> bool {
    let limit = setup.n_seq_max as i64;
    let mut beyond = false;
    for op in setup.ops.iter().chain(ops) {
        op.for_each_seq(|s| beyond |= s as i64 >= limit);
    }
    beyond
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trial_naming_a_sequence_id_beyond_n_seq_max_runs_alone() {
        use crate::base::op::Decode;
        let setup = Setup {
            n_seq_max: 2,
            ops: vec![Op::Decode(Decode::next(0, 7))],
            ..Setup::default()
        };
        let trace = |ops: Vec<Op>| Trace {
            setup: setup.clone(),
            ops,
        };
        let any_seq = Op::SeqRm {
            seq: -1,
            p0: -1,
            p1: -1,
        };
        assert!(!may_corrupt_memory(&trace(vec![
            any_seq.clone(),
            Op::Decode(Decode::next(1, 1))
        ])));
        assert!(may_corrupt_memory(&trace(vec![
            any_seq,
            Op::Decode(Decode::next(2, 1))
        ])));
        let beyond_in_setup = Trace {
            setup: Setup {
                ops: vec![Op::Decode(Decode::next(40, 1))],
                ..setup.clone()
            },
            ops: vec![],
        };
        assert!(may_corrupt_memory(&beyond_in_setup));
    }
}
