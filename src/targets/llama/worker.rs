//! Crash isolation: llama.cpp runs in a worker process, so an abort is a finding, not the end.
//!
//! The parent ([`WorkerRunner`], a [`TrialRunner`]) starts `kvaudit worker` with the shim and the
//! model, sends batches of traces as JSON lines on its stdin (in a compact form: `Request`,
//! `WireRun`) and reads one [`TrialRun`] per trace back, flushed in groups of `REPLY_GROUP`.
//! The worker ([`worker_main`]) is a fork server: it loads everything once, warms a context up,
//! and forks a child that runs the traces with a [`LocalRunner`] over a [`LlamaTarget`]. Before
//! every op the child records (trial, step) in a static; a signal handler for SIGABRT, SIGSEGV,
//! SIGFPE, SIGBUS and SIGILL writes them to stderr and lets the signal kill the child. The server
//! then reports the death (`Reply::Died`) and forks a new child from its warm state; the parent
//! turns the missing result into [`TrialEnd::Crashed`] with the signal, the step and the last
//! lines llama.cpp printed (the failed `GGML_ASSERT` or `assert`) and goes on with the rest of the
//! batch. A trial that gives no answer within the timeout is a hang: SIGABRT to the worker, which
//! the server forwards to the child, and the trial is a crash finding too. Should the server
//! itself die, the parent starts a new worker.
//!
//! The target is deterministic, so a trace whose first `step` ops crashed once crashes again: the
//! parent remembers crashing prefixes and answers later traces that start with one without
//! running them (this keeps `+assert` audits, where thousands of traces share a crashing prefix,
//! from crashing thousands of times).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ffi::LlamaShim;
use super::target::{LlamaTarget, ResetMode};
use crate::base::op::{Op, Pos, SeqId, Setup, Trace};
use crate::base::state::StateFormat;
use crate::base::target::{HarnessError, OpOutcome, SeqObservation, StepObservation, TargetInfo};
use crate::running::runner::{LocalRunner, StartedBatch, TrialEnd, TrialRun, TrialRunner};

/// What a worker is started with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSpec {
    /// The `kvaudit` executable (normally `std::env::current_exe()`).
    pub exe: PathBuf,
    /// The built shim.
    pub shim: PathBuf,
    /// The model file.
    pub model: PathBuf,
    /// Target label for reports (`llama.cpp@0.1.156+assert`).
    pub label: String,
    /// The pin's state format.
    pub format: StateFormat,
    /// No answer for one trial within this long is a hang.
    pub timeout: Duration,
    /// How the worker resets between trials.
    pub reset: ResetMode,
}

/// One batch as the worker receives it: each distinct setup and op once, and every trace as
/// indices into them. (Traces as JSON objects cost more to write and to parse than a trial
/// takes to run: about a tenth of the worker's time and most of the parent's, perf, depth-3
/// seed audit.)
#[derive(Serialize, Deserialize)]
struct Request {
    setups: Vec<Setup>,
    ops: Vec<Op>,
    /// Per trace: its setup's index and its ops' indices.
    traces: Vec<(u32, Vec<u32>)>,
    /// Observe after the last op only (see `TrialRunner::run_batch_last`).
    #[serde(default)]
    last_only: bool,
    /// Flush after every reply instead of every [`REPLY_GROUP`].
    #[serde(default)]
    flush_each: bool,
}

impl Request {
    fn new(traces: &[Trace], last_only: bool, flush_each: bool) -> Request {
        let mut setups: Vec<Setup> = Vec::new();
        let mut ops: Vec<Op> = Vec::new();
        let mut op_index: HashMap<&Op, u32> = HashMap::new();
        let mut indexed = Vec::with_capacity(traces.len());
        for t in traces {
            // Batches hold one setup, or very few: a scan beats hashing a setup per trace.
            let si = match setups.iter().position(|s| *s == t.setup) {
                Some(i) => i,
                None => {
                    setups.push(t.setup.clone());
                    setups.len() - 1
                }
            };
            let oi = t
                .ops
                .iter()
                .map(|op| {
                    *op_index.entry(op).or_insert_with(|| {
                        ops.push(op.clone());
                        ops.len() as u32 - 1
                    })
                })
                .collect();
            indexed.push((si as u32, oi));
        }
        Request {
            setups,
            ops,
            traces: indexed,
            last_only,
            flush_each,
        }
    }

    /// Why the request is malformed: an index with no setup or op behind it.
    fn validate(&self) -> Result<(), String> {
        for (i, (si, oi)) in self.traces.iter().enumerate() {
            if *si as usize >= self.setups.len() {
                return Err(format!("trace {i}: no setup {si}"));
            }
            if let Some(k) = oi.iter().find(|&&k| k as usize >= self.ops.len()) {
                return Err(format!("trace {i}: no op {k}"));
            }
        }
        Ok(())
    }

    /// Makes `into` trace `i` of a validated request, reusing its buffers (this runs once per
    /// trial).
    fn fill(&self, i: usize, into: &mut Trace) {
        let (si, oi) = &self.traces[i];
        let setup = &self.setups[*si as usize];
        if into.setup != *setup {
            into.setup = setup.clone();
        }
        into.ops.clear();
        into.ops
            .extend(oi.iter().map(|&k| self.ops[k as usize].clone()));
    }
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Reply {
    Ready(TargetInfo),
    Run(WireRun),
    Error(String),
    /// The fork server's child running the request died; its raw `waitpid` status. The server
    /// lives on and takes the next request (see [`worker_main`]).
    Died(i32),
}

/// A [`TrialRun`] as the worker writes it: JSON arrays instead of objects, and the two common
/// outcomes and the common end as short externally tagged variants (serde parses internally
/// tagged enums by buffering them first).
#[derive(Serialize, Deserialize)]
struct WireRun(Vec<WireStep>, WireEnd);

/// One step: the op's outcome and, per sequence, (seq, pos_min, pos_max, cells).
#[derive(Serialize, Deserialize)]
struct WireStep(WireOutcome, Vec<(SeqId, Pos, Pos, Vec<Pos>)>);

#[derive(Serialize, Deserialize)]
enum WireOutcome {
    /// [`OpOutcome::Done`].
    D(Option<bool>),
    /// [`OpOutcome::Decoded`].
    R(i32),
    /// Anything else, as is.
    Other(OpOutcome),
}

#[derive(Serialize, Deserialize)]
enum WireEnd {
    /// [`TrialEnd::Completed`].
    C,
    /// Anything else, as is.
    Other(TrialEnd),
}

impl From<&TrialRun> for WireRun {
    fn from(run: &TrialRun) -> WireRun {
        let steps = run
            .steps
            .iter()
            .map(|st| {
                let outcome = match &st.outcome {
                    OpOutcome::Done { returned } => WireOutcome::D(*returned),
                    OpOutcome::Decoded { rc } => WireOutcome::R(*rc),
                    other => WireOutcome::Other(other.clone()),
                };
                let seqs = st
                    .seqs
                    .iter()
                    .map(|q| (q.seq, q.pos_min, q.pos_max, q.cells.clone()))
                    .collect();
                WireStep(outcome, seqs)
            })
            .collect();
        let end = match &run.end {
            TrialEnd::Completed => WireEnd::C,
            other => WireEnd::Other(other.clone()),
        };
        WireRun(steps, end)
    }
}

impl From<WireRun> for TrialRun {
    fn from(WireRun(steps, end): WireRun) -> TrialRun {
        let steps = steps
            .into_iter()
            .map(|WireStep(outcome, seqs)| {
                let outcome = match outcome {
                    WireOutcome::D(returned) => OpOutcome::Done { returned },
                    WireOutcome::R(rc) => OpOutcome::Decoded { rc },
                    WireOutcome::Other(o) => o,
                };
                let seqs = seqs
                    .into_iter()
                    .map(|(seq, pos_min, pos_max, cells)| SeqObservation {
                        seq,
                        pos_min,
                        pos_max,
                        cells,
                    })
                    .collect();
                Arc::new(StepObservation { outcome, seqs })
            })
            .collect();
        let end = match end {
            WireEnd::C => TrialEnd::Completed,
            WireEnd::Other(e) => e,
        };
        TrialRun { steps, end }
    }
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    /// Groups of stdout lines, as the reader thread found them in one read; `None` at the end.
    lines: Receiver<Option<Vec<String>>>,
    /// Lines of the last group not taken yet.
    pending: std::collections::VecDeque<String>,
    stderr: Arc<Mutex<String>>,
    /// Ends when the child's stderr closes: join it before reading what a dead child said.
    stderr_reader: Option<std::thread::JoinHandle<()>>,
}

/// How a trial's process died, and what it printed.
struct Death {
    status: Option<std::process::ExitStatus>,
    stderr: String,
    /// Whether the fork server lives on (only its child died) and can take the next request.
    server_alive: bool,
}

impl Worker {
    /// Waits for the child to end and for its stderr to be drained; returns status and text.
    fn reap(&mut self) -> (Option<std::process::ExitStatus>, String) {
        let status = self.child.wait().ok();
        if let Some(h) = self.stderr_reader.take() {
            let _ = h.join();
        }
        let text = self.stderr.lock().expect("stderr buffer").clone();
        (status, text)
    }

    /// The next line the worker wrote: `Ok(None)` when its stdout has closed.
    fn next_line(&mut self, timeout: Duration) -> Result<Option<String>, RecvTimeoutError> {
        if let Some(l) = self.pending.pop_front() {
            return Ok(Some(l));
        }
        match self.lines.recv_timeout(timeout)? {
            Some(group) => {
                self.pending.extend(group);
                Ok(self.pending.pop_front())
            }
            None => Ok(None),
        }
    }

    /// The whole worker process ended (its stdout closed).
    fn server_died(&mut self) -> Death {
        let (status, stderr) = self.reap();
        Death {
            status,
            stderr,
            server_alive: false,
        }
    }

    /// The fork server said its child died with the raw wait status `raw`. Takes what the child
    /// printed: everything on stderr up to the server's [`DIED_MARKER`] line, which it writes
    /// after the child has ended (waiting briefly for the reader thread to catch up).
    fn child_died(&mut self, raw: i32) -> Death {
        use std::os::unix::process::ExitStatusExt;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let stderr = loop {
            {
                let mut buf = self.stderr.lock().expect("stderr buffer");
                if let Some(i) = buf.find(DIED_MARKER) {
                    let text = buf[..i].to_string();
                    let end = buf[i..].find('\n').map_or(buf.len(), |n| i + n + 1);
                    buf.drain(..end);
                    break text;
                }
                if std::time::Instant::now() > deadline {
                    break std::mem::take(&mut *buf);
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        Death {
            status: Some(std::process::ExitStatus::from_raw(raw)),
            stderr,
            server_alive: true,
        }
    }

    /// Ends a hanging trial: SIGABRT to the worker, which its fork server forwards to the running
    /// child; then the child's death as the server reports it, or the server's own end.
    fn abort_hang(&mut self) -> Death {
        // SAFETY: kill(2) on our own child's pid; it is waited for (reaped) before it is dropped.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGABRT);
        }
        loop {
            match self.next_line(Duration::from_secs(10)) {
                Ok(Some(l)) => {
                    if let Ok(Reply::Died(raw)) = serde_json::from_str::<Reply>(&l) {
                        return self.child_died(raw);
                    }
                    // A reply the child flushed before it was stopped: the trial it answers ran
                    // before the hang and is sent again with the rest.
                }
                Ok(None) | Err(RecvTimeoutError::Disconnected) => return self.server_died(),
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    return self.server_died();
                }
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The parent side: a [`TrialRunner`] whose target lives in a child process.
pub struct WorkerRunner {
    spec: WorkerSpec,
    info: TargetInfo,
    worker: Option<Worker>,
    crashes: HashMap<(Setup, Vec<Op>), String>,
    /// Worker processes started so far (restarts after crashes included).
    pub starts: usize,
    /// Processes lost to a crash or a hang so far: a fork server's child (the server lives on) or
    /// the whole worker.
    pub deaths: usize,
}

const STDERR_KEEP: usize = 8192;

/// The worker flushes its replies every this many trials: one write per trial costs more than
/// the trial, and after a crash at most this many traces run twice.
const REPLY_GROUP: usize = 64;

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
            starts: 0,
            deaths: 0,
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
        cmd.arg("worker")
            .arg("--shim")
            .arg(&self.spec.shim)
            .arg("--model")
            .arg(&self.spec.model)
            .arg("--label")
            .arg(&self.spec.label)
            .env("GGML_NO_BACKTRACE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if self.spec.format.rot_fields {
            cmd.arg("--rot-fields");
        }
        if self.spec.reset == ResetMode::Rebuild {
            cmd.arg("--rebuild-resets");
        }
        let mut child = cmd.spawn().map_err(|e| {
            self.harness(format!(
                "cannot start worker {}: {e}",
                self.spec.exe.display()
            ))
        })?;
        self.starts += 1;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let mut stderr_pipe = child.stderr.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            // The worker writes its replies in groups: pass each group on in one message (a
            // message per line cost the parent a wake-up per trial).
            let mut reader = BufReader::with_capacity(1 << 16, stdout);
            loop {
                let mut group = Vec::new();
                loop {
                    let mut line = String::new();
                    match reader.read_line(&mut line) {
                        Ok(0) | Err(_) => {
                            if !group.is_empty() {
                                let _ = tx.send(Some(group));
                            }
                            let _ = tx.send(None);
                            return;
                        }
                        Ok(_) => {
                            if line.ends_with('\n') {
                                line.pop();
                            }
                            group.push(line);
                        }
                    }
                    // Another read only if a whole line is already buffered (no system call).
                    if !reader.buffer().contains(&b'\n') {
                        break;
                    }
                }
                if tx.send(Some(group)).is_err() {
                    return;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let keep = stderr.clone();
        let stderr_reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut s = keep.lock().expect("stderr buffer");
                s.push_str(&String::from_utf8_lossy(&buf[..n]));
                if s.len() > STDERR_KEEP {
                    let cut = s.len() - STDERR_KEEP / 2;
                    let cut = (cut..s.len())
                        .find(|&i| s.is_char_boundary(i))
                        .unwrap_or(s.len());
                    s.drain(..cut);
                }
            }
        });
        let mut w = Worker {
            child,
            stdin,
            lines,
            pending: std::collections::VecDeque::new(),
            stderr,
            stderr_reader: Some(stderr_reader),
        };
        match w.next_line(Duration::from_secs(60)) {
            Ok(Some(line)) => match serde_json::from_str::<Reply>(&line) {
                Ok(Reply::Ready(info)) => self.info = info,
                Ok(Reply::Error(e)) => {
                    return Err(self.harness(format!("worker failed to start: {e}")))
                }
                _ => return Err(self.harness(format!("worker said {line:?} instead of ready"))),
            },
            _ => {
                let (_, text) = w.reap();
                return Err(self.harness(format!("worker died while starting: {}", text.trim())));
            }
        }
        self.worker = Some(w);
        Ok(())
    }

    /// Sends `traces` and collects results until the batch is done or the worker dies. Returns
    /// the results received and, if the worker died, the index of the trace it died on and how.
    /// The worker flushes its replies in groups (see [`REPLY_GROUP`]), so traces between the
    /// last reply and the crashed one ran but were not reported: the caller sends them again.
    fn send(
        &mut self,
        traces: &[Trace],
        last_only: bool,
        flush_each: bool,
    ) -> Result<(Vec<TrialRun>, Option<(usize, TrialEnd)>), HarnessError> {
        self.write_request(traces, last_only, flush_each)?;
        self.read_replies(traces, last_only, flush_each)
    }

    /// Starts the worker if needed and hands it `traces`; it starts on them at once.
    fn write_request(
        &mut self,
        traces: &[Trace],
        last_only: bool,
        flush_each: bool,
    ) -> Result<(), HarnessError> {
        if self.worker.is_none() {
            self.start()?;
        }
        let w = self.worker.as_mut().expect("started");
        let mut line = serde_json::to_vec(&Request::new(traces, last_only, flush_each))
            .expect("traces serialize");
        line.push(b'\n');
        if w.stdin
            .write_all(&line)
            .and_then(|_| w.stdin.flush())
            .is_err()
        {
            // The worker is gone already; reading the replies reports how.
        }
        Ok(())
    }

    /// The second half of [`WorkerRunner::send`]: the replies to the request just written.
    fn read_replies(
        &mut self,
        traces: &[Trace],
        last_only: bool,
        flush_each: bool,
    ) -> Result<(Vec<TrialRun>, Option<(usize, TrialEnd)>), HarnessError> {
        let w = self.worker.as_mut().expect("a request was written");
        let mut runs = Vec::with_capacity(traces.len());
        while runs.len() < traces.len() {
            let death = match w.next_line(self.spec.timeout) {
                Ok(Some(l)) => match serde_json::from_str::<Reply>(&l) {
                    Ok(Reply::Run(r)) => {
                        runs.push(r.into());
                        continue;
                    }
                    Ok(Reply::Died(raw)) => w.child_died(raw),
                    Ok(Reply::Error(e)) => return Err(self.harness(format!("worker: {e}"))),
                    _ => return Err(self.harness(format!("worker sent an unexpected line: {l:?}"))),
                },
                Ok(None) | Err(RecvTimeoutError::Disconnected) => w.server_died(),
                Err(RecvTimeoutError::Timeout) => {
                    // SIGABRT makes the running child's handler say which trial and step it is
                    // stuck in (the fork server forwards it; a server stuck itself dies of it).
                    let death = w.abort_hang();
                    self.deaths += 1;
                    let (at, step) = crash_marker(&death.stderr)
                        .unwrap_or((runs.len(), traces[runs.len()].ops.len()));
                    let at = at.clamp(runs.len(), traces.len() - 1);
                    let step = step.clamp(1, traces[at].ops.len().max(1));
                    let message = format!(
                        "hang: no result within {:.1} s",
                        self.spec.timeout.as_secs_f64()
                    );
                    if !death.server_alive {
                        self.worker = None;
                    }
                    return Ok((runs, Some((at, TrialEnd::Crashed { step, message }))));
                }
            };
            self.deaths += 1;
            if !death.server_alive {
                self.worker = None;
            }
            let Some((at, marker_step)) = crash_marker(&death.stderr) else {
                // No marker (an exit without a signal): which unreported trace died is unknown,
                // so run them again one reply at a time to find out.
                if !flush_each {
                    let (more, died) = self.send(&traces[runs.len()..], last_only, true)?;
                    let base = runs.len();
                    runs.extend(more);
                    return Ok((runs, died.map(|(i, e)| (base + i, e))));
                }
                let end = crash_end(
                    &death.stderr,
                    death.status,
                    None,
                    traces[runs.len()].ops.len(),
                );
                let at = runs.len();
                return Ok((runs, Some((at, end))));
            };
            let at = at.clamp(runs.len(), traces.len() - 1);
            let end = crash_end(
                &death.stderr,
                death.status,
                Some(marker_step),
                traces[at].ops.len(),
            );
            return Ok((runs, Some((at, end))));
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
        self.run_in_worker(traces, false, false)
    }

    fn run_batch_last(&mut self, traces: &[Trace]) -> Result<Vec<TrialRun>, HarnessError> {
        self.run_in_worker(traces, true, false)
    }

    fn start_batch_last(&mut self, traces: Vec<Trace>) -> Result<StartedBatch, HarnessError> {
        // A batch holding a trace that starts with a known crashing prefix takes the careful
        // path at the finish (those traces are answered without running them).
        let sent = !traces.iter().any(|t| self.known_crash(t).is_some());
        if sent {
            self.write_request(&traces, true, false)?;
        }
        Ok(StartedBatch { traces, sent })
    }

    fn finish_batch_last(
        &mut self,
        batch: StartedBatch,
    ) -> Result<(Vec<Trace>, Vec<TrialRun>), HarnessError> {
        let runs = self.run_in_worker(&batch.traces, true, batch.sent)?;
        Ok((batch.traces, runs))
    }
}

impl WorkerRunner {
    /// Runs `traces` in the worker, restarting it after each crash. `sent`: the request for all of
    /// `traces` is written already (by [`TrialRunner::start_batch_last`]).
    fn run_in_worker(
        &mut self,
        traces: &[Trace],
        last_only: bool,
        mut sent: bool,
    ) -> Result<Vec<TrialRun>, HarnessError> {
        let mut out: Vec<Option<TrialRun>> = vec![None; traces.len()];
        let mut todo: Vec<usize> = Vec::with_capacity(traces.len());
        for (i, t) in traces.iter().enumerate() {
            match self.known_crash(t) {
                Some(end) => out[i] = Some(TrialRun { steps: vec![], end }),
                None => todo.push(i),
            }
        }
        while !todo.is_empty() {
            let (runs, died) = if std::mem::take(&mut sent) {
                debug_assert_eq!(todo.len(), traces.len());
                self.read_replies(traces, last_only, false)?
            } else {
                let batch: Vec<Trace> = todo.iter().map(|&i| traces[i].clone()).collect();
                self.send(&batch, last_only, false)?
            };
            let n_ok = runs.len();
            for (k, r) in runs.into_iter().enumerate() {
                out[todo[k]] = Some(r);
            }
            let Some((at, end)) = died else { break };
            let crashed = todo[at];
            if let TrialEnd::Crashed { step, message } = &end {
                let t = &traces[crashed];
                self.crashes
                    .insert((t.setup.clone(), t.ops[..*step].to_vec()), message.clone());
            }
            out[crashed] = Some(TrialRun { steps: vec![], end });
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
                    Some(end) => out[i] = Some(TrialRun { steps: vec![], end }),
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

/// The (trial within the request, step) the worker's signal handler reported last.
fn crash_marker(stderr: &str) -> Option<(usize, usize)> {
    let line = stderr
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("kvaudit-worker: signal "))?;
    let nums: Vec<usize> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|s| s.parse().ok())
        .collect();
    match nums[..] {
        [_sig, trial, step] => Some((trial, step)),
        _ => None,
    }
}

/// Reads how the worker died: the step its signal handler reported, the exit status and the
/// last lines llama.cpp printed.
fn crash_end(
    stderr: &str,
    status: Option<std::process::ExitStatus>,
    marker_step: Option<usize>,
    trace_len: usize,
) -> TrialEnd {
    use std::os::unix::process::ExitStatusExt;
    let step = marker_step.unwrap_or(trace_len).clamp(1, trace_len.max(1));
    let signal = status.and_then(|s| s.signal());
    let what = match signal {
        Some(s) => signal_name(s).to_string(),
        None => match status.and_then(|s| s.code()) {
            Some(c) => format!("exit status {c}"),
            None => "worker died".to_string(),
        },
    };
    let detail = crash_detail(stderr);
    let message = if detail.is_empty() {
        what
    } else {
        format!("{what}: {detail}")
    };
    TrialEnd::Crashed { step, message }
}

/// The assertion line llama.cpp printed, with machine-specific directories removed so the same
/// crash reads the same everywhere.
pub fn crash_detail(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("kvaudit-worker: signal"))
        .collect();
    let keyed = lines.iter().rev().find(|l| {
        l.contains("GGML_ASSERT")
            || l.contains("Assertion")
            || l.contains("GGML_ABORT")
            || l.contains("terminate called")
    });
    // Without a recognised line, the last thing printed is the best clue there is.
    let line = keyed.or(lines.last()).copied().unwrap_or("");
    strip_dirs(line)
}

fn strip_dirs(s: &str) -> String {
    s.split(' ')
        .map(|w| match w.rfind('/') {
            Some(i) if w.contains(".c") || w.contains(".h") => &w[i + 1..],
            _ => w,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGABRT => "SIGABRT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGFPE => "SIGFPE",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGKILL => "SIGKILL",
        _ => "signal",
    }
}

// ---- the child side ----

static CURRENT_TRIAL: AtomicUsize = AtomicUsize::new(0);
static CURRENT_STEP: AtomicUsize = AtomicUsize::new(0);

/// Writes `n` in decimal into `buf` from `at`; returns the new end. Async-signal-safe.
fn put_num(buf: &mut [u8], mut at: usize, n: usize) -> usize {
    let mut digits = [0u8; 20];
    let mut k = 0;
    let mut v = n;
    loop {
        digits[k] = b'0' + (v % 10) as u8;
        k += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    while k > 0 && at < buf.len() {
        k -= 1;
        buf[at] = digits[k];
        at += 1;
    }
    at
}

extern "C" fn on_fatal_signal(sig: libc::c_int) {
    // Only async-signal-safe calls here: write(2), signal(2), raise(3).
    let mut buf = [0u8; 128];
    let prefix = b"\nkvaudit-worker: signal ";
    buf[..prefix.len()].copy_from_slice(prefix);
    let mut at = put_num(&mut buf, prefix.len(), sig as usize);
    for (label, value) in [
        (&b" trial "[..], CURRENT_TRIAL.load(Ordering::Relaxed)),
        (&b" step "[..], CURRENT_STEP.load(Ordering::Relaxed)),
    ] {
        buf[at..at + label.len()].copy_from_slice(label);
        at = put_num(&mut buf, at + label.len(), value);
    }
    buf[at] = b'\n';
    // SAFETY: write(2) and signal(2)/raise(3) are async-signal-safe; buf is a local array.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), at + 1);
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

fn install_signal_handlers() {
    for sig in [
        libc::SIGABRT,
        libc::SIGSEGV,
        libc::SIGFPE,
        libc::SIGBUS,
        libc::SIGILL,
    ] {
        // SAFETY: on_fatal_signal only makes async-signal-safe calls; installing it replaces the
        // default action, which it restores before re-raising.
        unsafe {
            libc::signal(
                sig,
                on_fatal_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
}

/// A [`LlamaTarget`] wrapper that records the step before each op, for the signal handler.
struct Stepped(LlamaTarget);

impl crate::base::target::CacheUnderTest for Stepped {
    fn info(&self) -> TargetInfo {
        self.0.info()
    }
    fn reset(&mut self, setup: &Setup) -> Result<(), HarnessError> {
        CURRENT_STEP.store(0, Ordering::Relaxed);
        self.0.reset(setup)
    }
    fn apply(&mut self, op: &Op) -> Result<crate::base::target::OpOutcome, HarnessError> {
        CURRENT_STEP.fetch_add(1, Ordering::Relaxed);
        self.0.apply(op)
    }
    fn seq_pos_min(&mut self, seq: i32) -> Result<i32, HarnessError> {
        self.0.seq_pos_min(seq)
    }
    fn seq_pos_max(&mut self, seq: i32) -> Result<i32, HarnessError> {
        self.0.seq_pos_max(seq)
    }
    fn seq_state(&mut self, seq: i32) -> Result<Vec<u8>, HarnessError> {
        self.0.seq_state(seq)
    }
}

/// Tells glibc's malloc (which llama.cpp's C++ uses; kvaudit's Rust side uses mimalloc) to keep
/// freed memory instead of returning it to the kernel. Every trial allocates and frees the same
/// buffers (batch allocator, graph, state copies); with the default thresholds the heap top was
/// trimmed with `brk` and large blocks `munmap`ed and faulted in again on every trial, about 3%
/// of a worker's time (perf, depth-3 seed audit).
fn keep_freed_memory() {
    // SAFETY: mallopt only sets allocator parameters; called before the worker allocates through
    // llama.cpp. A refused setting (return 0) only costs speed.
    unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TOP_PAD, 16 << 20);
    }
}

/// The child: `kvaudit worker --shim SO --model GGUF --label L [--rot-fields] [--rebuild-resets]`.
/// Returns the process exit code.
///
/// The process is a fork server (as AFL's): it loads the shim and the model once, reads the first
/// request, opens the context and builds that request's setup (a warm-up trial with no ops), then
/// forks a child that runs the request and every later one, reading them from stdin itself. A
/// child that dies takes only itself down: the server reports `Reply::Died` and forks a new
/// child from the same warm state, which reads the next request. Without it every crash cost a
/// new process (exec, dynamic loading, model, context and setup: about 25 ms; an `+assert`
/// depth-3 audit crashes about 2,000 times). A child lives until it dies or stdin closes, since a
/// fork per request costs a fifth of a release audit's time in copy-on-write faults.
pub fn worker_main(
    shim: &Path,
    model: &Path,
    label: &str,
    format: StateFormat,
    reset: ResetMode,
) -> i32 {
    install_signal_handlers();
    keep_freed_memory();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
    let loaded = match LlamaShim::load(shim) {
        Ok(s) => s,
        Err(e) => {
            say(&mut out, &Reply::Error(format!("{e:#}")), true);
            return 3;
        }
    };
    let target = LlamaTarget::new(loaded, model, label, format, reset);
    let mut runner = LocalRunner::new(Box::new(Stepped(target)));
    if !say(&mut out, &Reply::Ready(runner.info()), true) {
        return 3;
    }
    let mut input = std::io::BufReader::new(std::io::stdin());
    let mut first = match read_request(&mut input, &mut out) {
        Ok(Some(r)) => Some(r),
        Ok(None) => return 0,
        Err(code) => return code,
    };
    // Warm up here, so that every child starts with the context open and the setup's state saved
    // (its resets then restore it). A failure is left for the child to report.
    if let Some(req) = &first {
        if let Some(&(si, _)) = req.traces.first() {
            let _ = runner.run_last(&Trace {
                setup: req.setups[si as usize].clone(),
                ops: vec![],
            });
        }
    }
    if !input.buffer().is_empty() {
        // The parent sends one request at a time and waits for its replies: bytes beyond the first
        // line would be read by the first child only and lost to later ones.
        say(
            &mut out,
            &Reply::Error("a second request arrived before the first was answered".into()),
            true,
        );
        return 3;
    }
    install_forwarding_abort_handler();
    // SAFETY: getpid cannot fail.
    let server = unsafe { libc::getpid() };
    loop {
        if out.flush().is_err() {
            return 3;
        }
        // SAFETY: this process has one thread (the worker runs no other), so the child may go on
        // running Rust and llama.cpp code; it leaves with _exit, never returning into this loop.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            say(&mut out, &Reply::Error("fork failed".into()), true);
            return 3;
        }
        if pid == 0 {
            // A child outliving its server would keep the pipes open, and the parent would wait
            // forever for the end of a worker that is gone: die with the server.
            // SAFETY: prctl(PR_SET_PDEATHSIG) and getppid only affect this process.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != server {
                    libc::_exit(3);
                }
            }
            install_signal_handlers();
            let code = serve_requests(&mut runner, first.take(), &mut input, &mut out);
            // SAFETY: _exit(2) ends the child without running exit handlers it shares with the
            // server; its replies are flushed.
            unsafe { libc::_exit(code) };
        }
        // Only the child reads stdin from here on; a later child reads it afresh.
        first = None;
        CHILD.store(pid, Ordering::SeqCst);
        let status = wait_for(pid);
        CHILD.store(0, Ordering::SeqCst);
        if libc::WIFEXITED(status) && matches!(libc::WEXITSTATUS(status), 0 | 3) {
            // stdin closed (0) or the child reported a harness error itself (3).
            return libc::WEXITSTATUS(status);
        }
        // The child's last words are on stderr before this line: the parent reads up to it.
        eprintln!("{DIED_MARKER}");
        if !say(&mut out, &Reply::Died(status), true) {
            return 3;
        }
        input = std::io::BufReader::new(std::io::stdin());
    }
}

/// Reads and decodes one request line: `Ok(None)` at the end of input; `Err(exit code)` after
/// reporting a malformed request.
fn read_request(input: &mut impl BufRead, out: &mut impl Write) -> Result<Option<Request>, i32> {
    let mut line = String::new();
    match input.read_line(&mut line) {
        Ok(0) => return Ok(None),
        Ok(_) => {}
        Err(_) => return Err(3),
    }
    let decoded = serde_json::from_str::<Request>(&line)
        .map_err(|e| e.to_string())
        .and_then(|req| req.validate().map(|()| req));
    match decoded {
        Ok(r) => Ok(Some(r)),
        Err(e) => {
            say(out, &Reply::Error(format!("bad request: {e}")), true);
            Err(3)
        }
    }
}

/// The fork server's child: runs `first` (the request the server read) and then every request on
/// stdin. Exit codes: 0 stdin closed, 3 a harness error (reported as [`Reply::Error`]); any other
/// end is a death the server reports.
fn serve_requests(
    runner: &mut LocalRunner,
    mut first: Option<Request>,
    input: &mut impl BufRead,
    out: &mut impl Write,
) -> i32 {
    let mut trace = Trace {
        setup: Setup::default(),
        ops: Vec::new(),
    };
    loop {
        let req = match first.take() {
            Some(r) => r,
            None => match read_request(input, out) {
                Ok(Some(r)) => r,
                Ok(None) => return 0,
                Err(code) => return code,
            },
        };
        let code = run_request(runner, &req, &mut trace, out);
        if code != 0 {
            return code;
        }
    }
}

/// What the fork server writes on stderr after a child died, after everything the child wrote.
const DIED_MARKER: &str = "kvaudit-worker: child ended";

/// The child of the fork server running one request's trials (0: done; 3: a harness error,
/// already reported as [`Reply::Error`]).
fn run_request(
    runner: &mut LocalRunner,
    req: &Request,
    trace: &mut Trace,
    out: &mut impl Write,
) -> i32 {
    let n = req.traces.len();
    for trial in 0..n {
        req.fill(trial, trace);
        CURRENT_TRIAL.store(trial, Ordering::Relaxed);
        let result = if req.last_only {
            runner.run_last(trace)
        } else {
            runner.run(trace)
        };
        let (reply, failed) = match result {
            Ok(run) => (Reply::Run(WireRun::from(&run)), false),
            Err(e) => (Reply::Error(e.to_string()), true),
        };
        let flush = failed || req.flush_each || (trial + 1) % REPLY_GROUP == 0 || trial + 1 == n;
        if !say(out, &reply, flush) || failed {
            return 3;
        }
    }
    if out.flush().is_err() {
        return 3;
    }
    0
}

/// Writes one reply line, flushing when asked.
fn say(out: &mut impl Write, reply: &Reply, flush: bool) -> bool {
    let ok = serde_json::to_writer(&mut *out, reply).is_ok() && out.write_all(b"\n").is_ok();
    ok && (!flush || out.flush().is_ok())
}

/// `waitpid` until the child has ended (a forwarded SIGABRT interrupts the wait); the raw status.
fn wait_for(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child; status is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return status;
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            // No such child any more: report it as a plain failure.
            return 255 << 8;
        }
    }
}

/// The fork server's running child (0: none).
static CHILD: AtomicI32 = AtomicI32::new(0);

/// In the fork server, SIGABRT (the parent's "this trial hangs") goes to the running child, whose
/// own handler then says which trial and step it was in. Without a child, the server itself is
/// stuck (in a warm-up), and the signal is fatal as usual.
extern "C" fn on_abort_in_server(sig: libc::c_int) {
    let child = CHILD.load(Ordering::SeqCst);
    if child > 0 {
        // SAFETY: kill(2) is async-signal-safe; child is our own child's pid.
        unsafe {
            libc::kill(child, libc::SIGABRT);
        }
        return;
    }
    on_fatal_signal(sig);
}

fn install_forwarding_abort_handler() {
    // SAFETY: on_abort_in_server only makes async-signal-safe calls (kill, or on_fatal_signal's).
    unsafe {
        libc::signal(
            libc::SIGABRT,
            on_abort_in_server as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_text_is_read_back() {
        let stderr = "/root/.cargo/registry/src/x/llama-cpp-sys-2-0.1.156/llama.cpp/src/llama-kv-cells.h:318: void llama_kv_cells::seq_add(uint32_t, llama_seq_id): Assertion `!seq[i].test(seq_id)' failed.\n\nkvaudit-worker: signal 6 trial 12 step 2\n";
        assert_eq!(crash_marker(stderr), Some((12, 2)));
        match crash_end(stderr, None, Some(2), 3) {
            TrialEnd::Crashed { step, message } => {
                assert_eq!(step, 2);
                assert!(message.contains("llama-kv-cells.h:318:"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn numbers_are_written_without_allocating() {
        let mut buf = [0u8; 8];
        let end = put_num(&mut buf, 1, 407);
        assert_eq!(&buf[1..end], b"407");
    }

    #[test]
    fn requests_carry_each_setup_and_op_once_and_give_the_traces_back() {
        let d = crate::base::domain::Domain::preset("seed").unwrap();
        let ops = d.ops();
        let other_setup = Setup {
            n_seq_max: 3,
            ..d.setup.clone()
        };
        let traces: Vec<Trace> = (0..40)
            .map(|i| Trace {
                setup: if i % 7 == 0 {
                    other_setup.clone()
                } else {
                    d.setup.clone()
                },
                ops: vec![ops[i % 5].clone(), ops[(i * 3) % 11].clone()],
            })
            .collect();
        let req = Request::new(&traces, true, false);
        assert_eq!(req.setups.len(), 2);
        assert!(req.ops.len() <= 11, "{} ops", req.ops.len());
        let line = serde_json::to_string(&req).unwrap();
        let back: Request = serde_json::from_str(&line).unwrap();
        back.validate().unwrap();
        let mut into = Trace {
            setup: Setup::default(),
            ops: vec![],
        };
        for (i, t) in traces.iter().enumerate() {
            back.fill(i, &mut into);
            assert_eq!(&into, t, "trace {i}");
        }
        let mut bad = back;
        bad.traces[0].1.push(999);
        assert!(bad.validate().unwrap_err().contains("no op 999"));
    }

    #[test]
    fn runs_survive_the_wire_form() {
        let seqs = vec![
            SeqObservation {
                seq: 0,
                pos_min: 0,
                pos_max: 6,
                cells: vec![0, 1, 2, 2, 6],
            },
            SeqObservation {
                seq: 1,
                pos_min: -1,
                pos_max: -1,
                cells: vec![],
            },
        ];
        let step = |outcome| {
            Arc::new(StepObservation {
                outcome,
                seqs: seqs.clone(),
            })
        };
        let runs = [
            TrialRun {
                steps: vec![
                    step(OpOutcome::Done { returned: None }),
                    step(OpOutcome::Done {
                        returned: Some(false),
                    }),
                    step(OpOutcome::Decoded { rc: -1 }),
                    step(OpOutcome::Refused {
                        reason: "seq 9".into(),
                    }),
                ],
                end: TrialEnd::Completed,
            },
            TrialRun {
                steps: vec![step(OpOutcome::Unsupported {
                    reason: "why".into(),
                })],
                end: TrialEnd::Unsupported {
                    step: 1,
                    reason: "why".into(),
                },
            },
            TrialRun {
                steps: vec![],
                end: TrialEnd::Crashed {
                    step: 2,
                    message: "SIGABRT".into(),
                },
            },
        ];
        for run in runs {
            let line = serde_json::to_string(&Reply::Run(WireRun::from(&run))).unwrap();
            match serde_json::from_str::<Reply>(&line).unwrap() {
                Reply::Run(w) => assert_eq!(TrialRun::from(w), run),
                _ => panic!("{line}"),
            }
        }
    }
}
