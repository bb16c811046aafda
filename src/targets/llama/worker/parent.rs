//! The parent side of crash isolation: [`WorkerRunner`], a [`TrialRunner`] whose target lives in
//! a `kvaudit worker` process. It sends each batch as one request line, reads the replies on a
//! reader thread (bounded and decoded there, see [`super::wire`]), turns a death into
//! [`TrialEnd::Crashed`] with the signal, the step and llama.cpp's last words, and remembers
//! crashing prefixes.

use std::collections::{HashMap, VecDeque};
use std::io::{BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::wire::{
    parse_reply_line, read_line_limited, LineRead, Reply, Request, WireError, DIED_MARKER,
    MAX_REPLY_LINE_BYTES,
};
use super::WorkerSpec;
use crate::base::cache::{HarnessError, Observation, TargetInfo};
use crate::base::op::{Op, Setup, Trace};
use crate::oracles::crash::{crash_kind, HEAP_CORRUPTION};
use crate::running::runner::{
    ObservationCrash, Skipped, StartedBatch, TrialEnd, TrialRun, TrialRunner,
};
use crate::targets::llama::sys;
use crate::targets::llama::target::ResetMode;

/// One reply as the reader thread decoded it.
type ReplyLine = Result<Reply, WireError>;

/// Where in a batch the worker died, how, and what it was observing then (`None`: running an op).
type Died = (usize, TrialEnd, Option<Observation>);

struct Worker {
    child: Child,
    stdin: ChildStdin,
    /// Groups of decoded stdout lines, as the reader thread found them in one read; `None` at
    /// the end.
    lines: Receiver<Option<Vec<ReplyLine>>>,
    /// Lines of the last group not taken yet.
    pending: VecDeque<ReplyLine>,
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

    /// The next line the worker wrote, decoded: `Ok(None)` when its stdout has closed.
    fn next_line(&mut self, timeout: Duration) -> Result<Option<ReplyLine>, RecvTimeoutError> {
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
        // Our own child, waited for (reaped) before it is dropped, so the pid is still its. A
        // failure means it is gone already, which the reads below find out.
        let _ = sys::send_sigabrt(self.child.id());
        loop {
            match self.next_line(Duration::from_secs(10)) {
                Ok(Some(l)) => {
                    if let Ok(Reply::Died(raw)) = l {
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
    /// What the requests written now leave out (a trial run again after an observation crash).
    skipped: Skipped,
    /// Worker processes started so far (restarts after crashes included).
    pub starts: usize,
    /// Processes lost to a crash or a hang so far: a fork server's child (the server lives on) or
    /// the whole worker.
    pub deaths: usize,
}

/// How much of the worker's stderr is kept (its end: llama.cpp's last words).
const STDERR_KEEP: usize = 8192;

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
            // message per line cost the parent a wake-up per trial). Lines are decoded here, on
            // this thread, each at most MAX_REPLY_LINE_BYTES long.
            let mut reader = BufReader::with_capacity(1 << 16, stdout);
            let mut line = Vec::new();
            loop {
                let mut group = Vec::new();
                loop {
                    match read_line_limited(&mut reader, &mut line, MAX_REPLY_LINE_BYTES) {
                        Ok(LineRead::Line) => group.push(parse_reply_line(&line)),
                        Ok(LineRead::TooLong) => group.push(Err(WireError::TooLong {
                            what: "reply",
                            limit: MAX_REPLY_LINE_BYTES,
                        })),
                        Ok(LineRead::End) | Err(_) => {
                            if !group.is_empty() {
                                let _ = tx.send(Some(group));
                            }
                            let _ = tx.send(None);
                            return;
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
            pending: VecDeque::new(),
            stderr,
            stderr_reader: Some(stderr_reader),
        };
        match w.next_line(Duration::from_secs(60)) {
            Ok(Some(reply)) => match reply {
                Ok(Reply::Ready(info)) => self.info = info,
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
        Ok(())
    }

    /// Sends `traces` and collects results until the batch is done or the worker dies. Returns
    /// the results received and, if the worker died, the index of the trace it died on and how.
    /// The worker flushes its replies in groups (see `wire::REPLY_GROUP`), so traces between the
    /// last reply and the crashed one ran but were not reported: the caller sends them again.
    fn send(
        &mut self,
        traces: &[Trace],
        last_only: bool,
        flush_each: bool,
    ) -> Result<(Vec<TrialRun>, Option<Died>), HarnessError> {
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
        let line = Request::new(traces, last_only, flush_each)
            .skipping(&self.skipped)
            .to_line();
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
    ) -> Result<(Vec<TrialRun>, Option<Died>), HarnessError> {
        let w = self.worker.as_mut().expect("a request was written");
        let mut runs = Vec::with_capacity(traces.len());
        while runs.len() < traces.len() {
            let death = match w.next_line(self.spec.timeout) {
                Ok(Some(reply)) => match reply {
                    Ok(Reply::Run(r)) => {
                        runs.push(r.into());
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
                    let marker = crash_marker(&death.stderr).unwrap_or(Marker {
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
            if !death.server_alive {
                self.worker = None;
            }
            let Some(marker) = crash_marker(&death.stderr) else {
                // No marker (an exit without a signal): which unreported trace died is unknown,
                // so run them again one reply at a time to find out.
                if !flush_each {
                    let (more, died) = self.send(&traces[runs.len()..], last_only, true)?;
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
                Some(end) => out[i] = Some(TrialRun::new(vec![], end)),
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
                    observation_crash: Some(first),
                    ..TrialRun::new(vec![], end)
                });
            }
            skipped.push((step, what));
            self.skipped = skipped.clone();
            let sent = self.send(std::slice::from_ref(trace), last_only, true);
            self.skipped.clear();
            let (mut runs, died) = sent?;
            match died.map(|(at, end, o)| (at, blamed_observation(o, &end), end)) {
                None => {
                    let mut run = runs.pop().expect("one run per trace");
                    run.observation_crash = Some(first);
                    return Ok(run);
                }
                Some((_, Some(what), TrialEnd::Crashed { step, message })) => {
                    crash = (step, what, message);
                }
                Some((_, _, end)) => {
                    return Ok(TrialRun {
                        observation_crash: Some(first),
                        ..TrialRun::new(vec![], end)
                    });
                }
            }
        }
    }
}

/// The observation a crash is blamed on: what the worker was observing, unless glibc's
/// allocator aborted. It finds a corrupted heap at a later malloc or free than the write that
/// corrupted it, so such an abort while observing is the op's (a decode writing out of bounds:
/// corpora/crash_decode_next_pos_seq_id_out_of_range.json), as before observation crashes had
/// a class.
fn blamed_observation(observing: Option<Observation>, end: &TrialEnd) -> Option<Observation> {
    observing.filter(|_| {
        !matches!(end, TrialEnd::Crashed { message, .. } if crash_kind(message) == HEAP_CORRUPTION)
    })
}

/// What the worker's signal handler reported last: the trial within the request, the step
/// counter and what was being observed.
#[derive(Debug, PartialEq)]
struct Marker {
    trial: usize,
    step: usize,
    observing: Option<Observation>,
}

impl Marker {
    /// The 1-based step of the op the crash belongs to: the cells before an op are observed
    /// before the op advances the counter.
    fn op_step(&self) -> usize {
        match self.observing {
            Some(Observation::Before) => self.step + 1,
            _ => self.step,
        }
    }
}

fn crash_marker(stderr: &str) -> Option<Marker> {
    let line = stderr
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(sys::FATAL_SIGNAL_REPORT))?;
    let nums: Vec<usize> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|s| s.parse().ok())
        .collect();
    let (trial, step, observing) = match nums[..] {
        [_sig, trial, step] => (trial, step, None),
        [_sig, trial, step, code] => (trial, step, Observation::from_code(code)),
        _ => return None,
    };
    Some(Marker {
        trial,
        step,
        observing,
    })
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
        .filter(|l| !l.is_empty() && !l.starts_with(sys::FATAL_SIGNAL_REPORT.trim_end()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_text_is_read_back() {
        let stderr = "/root/.cargo/registry/src/x/llama-cpp-sys-2-0.1.156/llama.cpp/src/llama-kv-cells.h:318: void llama_kv_cells::seq_add(uint32_t, llama_seq_id): Assertion `!seq[i].test(seq_id)' failed.\n\nkvaudit-worker: signal 6 trial 12 step 2\n";
        assert_eq!(
            crash_marker(stderr),
            Some(Marker {
                trial: 12,
                step: 2,
                observing: None
            })
        );
        let observing = "kvaudit-worker: signal 11 trial 3 step 1 observing 3\n";
        assert_eq!(
            crash_marker(observing).map(|m| (m.op_step(), m.observing)),
            Some((1, Some(Observation::Whole)))
        );
        let before = "kvaudit-worker: signal 11 trial 0 step 0 observing 2\n";
        assert_eq!(
            crash_marker(before).map(|m| (m.op_step(), m.observing)),
            Some((1, Some(Observation::Before)))
        );
        match crash_end(stderr, None, Some(2), 3) {
            TrialEnd::Crashed { step, message } => {
                assert_eq!(step, 2);
                assert!(message.contains("llama-kv-cells.h:318:"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
}
