//! The JSON-lines worker runner: a [`TrialRunner`] over a worker process that speaks
//! docs/worker-protocol.md, in any language.
//!
//! The runner starts the worker, reads its `hello` (engine, version, [`Capabilities`]), and
//! hands it one trial at a time: the setup and ops as a repro file holds them, the sequences to
//! observe and what to observe beyond them. The replies are [`StepObservation`]s, read into the
//! same types kvaudit's own runners fill, and checked against the request (one per op, the
//! sequences asked, in order, cells sorted): a worker that breaks the protocol is a harness
//! error that names it, never a finding.
//!
//! What the engine does wrong is a finding, whatever form it takes: an exception the worker
//! caught (`end` "crashed"), a worker killed by a signal or exiting mid-trial (the closed pipe,
//! its exit status and the last 4 KiB of its standard error), or no reply within the trial's
//! time (the worker is killed). The worker is started again for the next trial.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::base::cache::{
    HarnessError, Observe, OpOutcome, SeqObservation, StepObservation, TargetInfo,
};
use crate::base::capabilities::Capabilities;
use crate::base::op::{Op, SeqId, Setup, Trace};
use crate::running::runner::{TrialEnd, TrialRun, TrialRunner};

/// The protocol version this runner speaks.
pub const PROTOCOL: u32 = 1;

/// How many bytes of a worker's standard error a crash finding quotes.
const STDERR_TAIL: usize = 4096;

/// How a worker is started and driven.
#[derive(Clone, Debug)]
pub struct WorkerCommand {
    /// The target's name as the command line gives it (`python-ref`, `mlx-lm@0.32.2`).
    pub name: String,
    /// The program to run (an interpreter, or the worker itself).
    pub program: PathBuf,
    /// Its arguments (the worker's script first, for an interpreter).
    pub args: Vec<OsString>,
    /// Environment variables set for it (beside the inherited ones).
    pub env: Vec<(OsString, OsString)>,
    /// Faults the worker injects in its own cache (positive controls), as `hello` names them.
    pub faults: Vec<String>,
    /// How long one trial may take before it counts as a hang.
    pub timeout: Duration,
    /// How long the worker may take to answer `hello` (its imports, its model).
    pub start_timeout: Duration,
    /// What to observe beyond the sequences (less what the worker declares it cannot).
    pub observe: Observe,
    /// The `hello`'s `options`: target-specific settings (an object; the mlx-lm worker's
    /// `models`).
    pub options: serde_json::Value,
}

/// The worker's `hello`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    /// The protocol version it speaks.
    pub protocol: u32,
    /// The engine under test.
    pub engine: String,
    /// Its version.
    pub version: String,
    /// What it declares it can do.
    pub capabilities: Capabilities,
}

/// One reply line.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Reply {
    Hello(Hello),
    Step(StepReply),
    End(EndReply),
    Error(ErrorReply),
}

#[derive(Debug, Deserialize)]
struct StepReply {
    id: u64,
    step: usize,
    #[serde(flatten)]
    observation: StepObservation,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EndReply {
    id: u64,
    end: TrialEnd,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ErrorReply {
    #[serde(default)]
    id: Option<u64>,
    message: String,
}

/// One trial as the worker is handed it.
#[derive(Serialize)]
struct TrialRequest<'a> {
    id: u64,
    setup: &'a Setup,
    ops: &'a [Op],
    seqs: &'a [SeqId],
    observe: ObserveRequest,
}

#[derive(Serialize)]
struct ObserveRequest {
    before: bool,
    whole: bool,
    round_trip: bool,
    logits: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    next_logits: bool,
}

/// What the reader thread saw on the worker's standard output.
enum Line {
    Text(String),
    Closed,
}

/// A running worker process.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Line>,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl Worker {
    /// Starts `cmd`, its standard output read line by line and its standard error's tail kept.
    fn start(cmd: &WorkerCommand) -> Result<Worker, HarnessError> {
        let mut child = Command::new(&cmd.program)
            .args(&cmd.args)
            .envs(cmd.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| harness(cmd, format!("cannot start {}: {e}", cmd.program.display())))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let mut err = child.stderr.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut line = String::new();
                match r.read_line(&mut line) {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(Line::Closed);
                        return;
                    }
                    Ok(_) => {
                        if tx.send(Line::Text(line)).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let tail = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    return;
                }
                let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                t.extend_from_slice(&buf[..n]);
                if t.len() > STDERR_TAIL {
                    let cut = t.len() - STDERR_TAIL;
                    t.drain(..cut);
                }
            }
        });
        Ok(Worker {
            child,
            stdin,
            lines,
            stderr,
        })
    }

    fn send(&mut self, line: &str) -> std::io::Result<()> {
        self.stdin.write_all(line.as_bytes())?;
        self.stdin.write_all(b"\n")?;
        self.stdin.flush()
    }

    /// The next line before `deadline`: `Ok(None)` when the worker closed its output, `Err`
    /// when the deadline passed.
    fn next_line(&self, deadline: Instant) -> Result<Option<String>, ()> {
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(wait) {
            Ok(Line::Text(t)) => Ok(Some(t)),
            Ok(Line::Closed) | Err(RecvTimeoutError::Disconnected) => Ok(None),
            Err(RecvTimeoutError::Timeout) => Err(()),
        }
    }

    /// The worker's exit, waited for a moment after its output closed (then killed).
    fn exit(&mut self) -> Option<ExitStatus> {
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => return Some(s),
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
                _ => {
                    let _ = self.child.kill();
                    return self.child.wait().ok();
                }
            }
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The tail of what it wrote on standard error, as text.
    fn stderr_tail(&self) -> String {
        // The reader thread may still be copying the last bytes the worker wrote.
        std::thread::sleep(Duration::from_millis(20));
        let t = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&t).trim_end().to_string()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.send(r#"{"bye":{}}"#);
        let until = Instant::now() + Duration::from_millis(200);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        self.kill();
    }
}

fn harness(cmd: &WorkerCommand, message: String) -> HarnessError {
    HarnessError::Target {
        target: cmd.name.clone(),
        message,
    }
}

/// The first line of a crash finding for a worker that died with `status`: the signal's name
/// (`SIGABRT`, as the llama.cpp worker writes it) or the exit status.
fn death_line(status: Option<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Some(s) => match (s.signal(), s.code()) {
            (Some(sig), _) => format!(
                "{}: the worker was killed by signal {sig}",
                super::signal_name(sig)
            ),
            (None, Some(code)) => format!("exit: the worker exited with status {code} mid-trial"),
            (None, None) => "exit: the worker ended mid-trial".to_string(),
        },
        None => "exit: the worker ended mid-trial (its status is unknown)".to_string(),
    }
}

/// A runner over one worker process at a time (see the module docs).
pub struct JsonlRunner {
    cmd: WorkerCommand,
    worker: Option<Worker>,
    hello: Hello,
    observe: Observe,
    next_id: u64,
}

impl JsonlRunner {
    /// Starts the worker and reads its `hello`.
    pub fn new(cmd: WorkerCommand) -> Result<JsonlRunner, HarnessError> {
        let (worker, hello) = Self::start(&cmd)?;
        let observe = hello.capabilities.observable(cmd.observe);
        Ok(JsonlRunner {
            cmd,
            worker: Some(worker),
            hello,
            observe,
            next_id: 1,
        })
    }

    /// What the worker said in its `hello`.
    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    fn start(cmd: &WorkerCommand) -> Result<(Worker, Hello), HarnessError> {
        let mut w = Worker::start(cmd)?;
        let hello = serde_json::json!({"hello": {"protocol": PROTOCOL, "faults": cmd.faults, "options": cmd.options}});
        let dead = |w: &mut Worker, what: &str| {
            let status = w.exit();
            harness(
                cmd,
                format!(
                    "the worker {what} before its hello ({}); its standard error: {}",
                    death_line(status),
                    w.stderr_tail()
                ),
            )
        };
        if w.send(&hello.to_string()).is_err() {
            return Err(dead(&mut w, "closed its input"));
        }
        let deadline = Instant::now() + cmd.start_timeout;
        let line = match w.next_line(deadline) {
            Ok(Some(l)) => l,
            Ok(None) => return Err(dead(&mut w, "ended")),
            Err(()) => {
                w.kill();
                return Err(harness(
                    cmd,
                    format!(
                        "no hello from the worker within {:.0} s; its standard error: {}",
                        cmd.start_timeout.as_secs_f64(),
                        w.stderr_tail()
                    ),
                ));
            }
        };
        match serde_json::from_str::<Reply>(&line) {
            Ok(Reply::Hello(h)) if h.protocol == PROTOCOL => Ok((w, h)),
            Ok(Reply::Hello(h)) => Err(harness(
                cmd,
                format!(
                    "the worker speaks protocol {}, this kvaudit {PROTOCOL}",
                    h.protocol
                ),
            )),
            Ok(Reply::Error(e)) => Err(harness(
                cmd,
                format!("the worker refused its hello: {}", e.message),
            )),
            Ok(_) => Err(harness(
                cmd,
                format!("the worker's first line is not a hello: {}", clip(&line)),
            )),
            Err(e) => Err(harness(
                cmd,
                format!("the worker's hello does not read ({e}): {}", clip(&line)),
            )),
        }
    }

    /// The running worker, started again (and checked to declare the same) after a death.
    fn worker(&mut self) -> Result<&mut Worker, HarnessError> {
        if self.worker.is_none() {
            let (w, hello) = Self::start(&self.cmd)?;
            if hello != self.hello {
                return Err(harness(
                    &self.cmd,
                    "the worker, started again, declared another engine or other capabilities"
                        .to_string(),
                ));
            }
            self.worker = Some(w);
        }
        Ok(self.worker.as_mut().expect("just started"))
    }

    /// Runs one trial. A worker that had run earlier trials and dies before its first reply
    /// to this one may have died of the trial before (on its way out of it, after its `end`):
    /// the trial runs once more in a new worker, and only a death there is this trial's.
    fn run_one(&mut self, trace: &Trace) -> Result<TrialRun, HarnessError> {
        let fresh = self.worker.is_none();
        let (run, replied) = self.run_once(trace)?;
        let died =
            matches!(&run.end, TrialEnd::Crashed { message, .. } if !message.starts_with("hang:"));
        if died && !replied && !fresh {
            return self.run_once(trace).map(|(run, _)| run);
        }
        Ok(run)
    }

    /// Runs one trial in the current worker (started when there is none); with whether the
    /// worker answered anything to it.
    fn run_once(&mut self, trace: &Trace) -> Result<(TrialRun, bool), HarnessError> {
        let id = self.next_id;
        self.next_id += 1;
        let seqs = trace.observed_seqs();
        let request = serde_json::json!({"trial": TrialRequest {
            id,
            setup: &trace.setup,
            ops: &trace.ops,
            seqs: &seqs,
            observe: ObserveRequest {
                before: self.observe.before,
                whole: self.observe.whole,
                round_trip: self.observe.round_trip,
                logits: self.observe.logits,
                next_logits: self.observe.next_logits,
            },
        }});
        let line = request.to_string();
        let timeout = self.cmd.timeout;
        let cmd = self.cmd.clone();
        let w = self.worker()?;
        let mut steps = Vec::with_capacity(trace.ops.len());
        let deadline = Instant::now() + timeout;
        let sent = w.send(&line).is_ok();
        let mut replied = false;
        loop {
            let next = if sent {
                w.next_line(deadline)
            } else {
                Ok(None)
            };
            let text = match next {
                Ok(Some(t)) => {
                    replied = true;
                    t
                }
                Ok(None) => {
                    // The worker died: the op it was running (or observing) crashed it.
                    let status = w.exit();
                    let tail = w.stderr_tail();
                    self.worker = None;
                    let step = (steps.len() + 1).min(trace.ops.len().max(1));
                    let message = format!("{}\n{tail}", death_line(status));
                    let run = TrialRun::new(steps, TrialEnd::Crashed { step, message });
                    return Ok((run, replied));
                }
                Err(()) => {
                    w.kill();
                    let tail = w.stderr_tail();
                    self.worker = None;
                    let step = (steps.len() + 1).min(trace.ops.len().max(1));
                    let message = format!(
                        "hang: no result within {:.1} s\n{tail}",
                        timeout.as_secs_f64()
                    );
                    let run = TrialRun::new(steps, TrialEnd::Crashed { step, message });
                    return Ok((run, replied));
                }
            };
            let reply: Reply = serde_json::from_str(&text).map_err(|e| {
                harness(
                    &cmd,
                    format!("trial {id}: a reply does not read ({e}): {}", clip(&text)),
                )
            })?;
            match reply {
                Reply::Step(s) => {
                    check_step(&s, id, steps.len() + 1, trace, &seqs)
                        .map_err(|m| harness(&cmd, format!("trial {id}: {m}")))?;
                    // An unsupported op is not observed: the trial ends before it, as a local
                    // runner's does (the `end` that follows says so).
                    if !matches!(s.observation.outcome, OpOutcome::Unsupported { .. }) {
                        steps.push(Arc::new(s.observation));
                    }
                }
                Reply::End(e) => {
                    if e.id != id {
                        return Err(harness(
                            &cmd,
                            format!("trial {id}: an end for trial {}", e.id),
                        ));
                    }
                    return check_end(e.end, &steps, trace)
                        .map(|end| (TrialRun::new(steps, end), true))
                        .map_err(|m| harness(&cmd, format!("trial {id}: {m}")));
                }
                Reply::Error(e) => {
                    let which = e.id.map_or(String::new(), |i| format!(" (trial {i})"));
                    return Err(harness(
                        &cmd,
                        format!("the worker reports an error{which}: {}", e.message),
                    ));
                }
                Reply::Hello(_) => {
                    return Err(harness(&cmd, format!("trial {id}: a second hello")));
                }
            }
        }
    }
}

/// Whether `s` is the step the runner waits for: of trial `id`, number `step`, observing
/// `seqs` in order, each sequence's cells sorted.
fn check_step(
    s: &StepReply,
    id: u64,
    step: usize,
    trace: &Trace,
    seqs: &[SeqId],
) -> Result<(), String> {
    if s.id != id {
        return Err(format!("a step of trial {}", s.id));
    }
    if s.step != step || step > trace.ops.len() {
        return Err(format!(
            "step {} came where step {step} of {} was due",
            s.step,
            trace.ops.len()
        ));
    }
    let observed: Vec<SeqId> = s.observation.seqs.iter().map(|o| o.seq).collect();
    if observed != seqs {
        return Err(format!(
            "step {step} observed the sequences {observed:?}, not the {seqs:?} asked"
        ));
    }
    fn unsorted(list: &[SeqObservation]) -> Option<&SeqObservation> {
        let sorted = |c: &[i32]| c.windows(2).all(|w| w[0] <= w[1]);
        list.iter().find(|o| {
            !sorted(&o.cells)
                || o.second_cells.as_deref().is_some_and(|c| !sorted(c))
                || o.third_cells.as_deref().is_some_and(|c| !sorted(c))
        })
    }
    let before = s.observation.before.as_deref().unwrap_or(&[]);
    if let Some(o) = unsorted(&s.observation.seqs).or_else(|| unsorted(before)) {
        return Err(format!("step {step}: seq {}'s cells are not sorted", o.seq));
    }
    Ok(())
}

/// The trial's end, checked against the steps answered.
fn check_end(
    end: TrialEnd,
    steps: &[Arc<StepObservation>],
    trace: &Trace,
) -> Result<TrialEnd, String> {
    let n = steps.len();
    match &end {
        TrialEnd::Completed if n != trace.ops.len() => {
            Err(format!("completed after {n} of {} steps", trace.ops.len()))
        }
        TrialEnd::Unsupported { step, .. } if *step != 0 && *step != n + 1 => {
            Err(format!("unsupported at step {step} after {n} steps"))
        }
        TrialEnd::Crashed { step, .. } if *step > trace.ops.len() => {
            Err(format!("crashed at step {step} of {}", trace.ops.len()))
        }
        _ => Ok(end),
    }
}

/// A reply line cut for an error message.
fn clip(line: &str) -> String {
    let t = line.trim_end();
    if t.chars().count() > 200 {
        format!("{}...", t.chars().take(200).collect::<String>())
    } else {
        t.to_string()
    }
}

impl TrialRunner for JsonlRunner {
    fn info(&self) -> TargetInfo {
        TargetInfo {
            name: self.cmd.name.clone(),
            version: format!("{} {}", self.hello.engine, self.hello.version),
            faults: self.cmd.faults.clone(),
            model: None,
            state_format: Default::default(),
        }
    }

    fn capabilities(&self) -> Capabilities {
        self.hello.capabilities.clone()
    }

    fn run_batch(&mut self, traces: &[Trace]) -> Result<Vec<TrialRun>, HarnessError> {
        traces.iter().map(|t| self.run_one(t)).collect()
    }
}
