//! The worker side of crash isolation: `kvaudit-llama-worker`, a fork server over a [`LlamaTarget`].
//!
//! The process (as AFL's fork server) loads the shim and the model once, reads the first request,
//! opens the context and builds that request's setup (a warm-up trial with no ops), then forks a
//! child that runs the request and every later one, reading them from stdin itself. A child that
//! dies takes only itself down: the server reports `Reply::Died` and forks a new child from the
//! same warm state, which reads the next request. Without it every crash cost a new process
//! (exec, dynamic loading, model, context and setup: about 25 ms; an `+assert` depth-3 audit
//! crashes about 2,000 times). A child lives until it dies or stdin closes, since a fork per
//! request costs a fifth of a release audit's time in copy-on-write faults, or until it has
//! answered a retiring request (`Request::retire`): then it ends, the server says
//! `Reply::Retired` and forks the next child from the warm state. The parent retires the child
//! before and after each trial that may corrupt memory, so that such a trial runs on the warm
//! server's heap and no later trial runs on its heap.
//!
//! Every libc call (fork, signals, waitpid, _exit, mallopt) goes through [`sys`].

use std::io::{BufRead, Write};
use std::path::Path;

use super::wire::{
    read_request, write_reply, FillScratch, Reply, ReplyWriter, Request, DIED_MARKER,
    REPLY_FLUSH_AFTER,
};
use crate::base::cache::{
    Allocation, CacheUnderTest, CodeCoverage, Dump, DumpSize, HarnessError, Observation, Observe,
    OpOutcome, SeqObservation, TargetInfo,
};
use crate::base::op::{Op, Setup, Trace};
use crate::base::state::{StateFormat, WholeCell};
use crate::oracles::Oracle;
use crate::running::judge::step_verdicts;
use crate::running::runner::{LocalRunner, StepVerdicts, TrialEnd, TrialRun, TrialRunner as _};
use crate::targets::llama::faults::LlamaFaults;
use crate::targets::llama::ffi::{CovMode, LlamaShim};
use crate::targets::llama::startup::mark;
use crate::targets::llama::sys;
use crate::targets::llama::target::{LlamaTarget, ResetMode};

/// The exit code of a child that ended after a retiring request, as asked.
const RETIRED_EXIT: i32 = 4;

/// A [`LlamaTarget`] wrapper that records the step before each op and the observation the
/// runner makes after it, for the fatal-signal report.
struct Stepped {
    target: LlamaTarget,
    /// What is being observed (`None`: ops of the trace run).
    observing: Option<Observation>,
    /// The test hook: this observation dies of SIGSEGV (`KVAUDIT_TEST_CRASH_OBSERVING`).
    crash_observing: Option<Observation>,
    /// The shim, when it records reached code (`+cov`): the trace's ops in [`CovMode::Ops`]
    /// (a trial's points, the guided fuzzer's signal), everything else in
    /// [`CovMode::Outside`] (where the build can: the points outside the ops, each sent once).
    cov: Option<LlamaShim>,
}

impl CacheUnderTest for Stepped {
    fn info(&self) -> TargetInfo {
        self.target.info()
    }
    fn reset(&mut self, setup: &Setup) -> Result<(), HarnessError> {
        sys::reset_current_step();
        self.observing = None;
        self.target.reset(setup)
    }
    fn apply(&mut self, op: &Op) -> Result<OpOutcome, HarnessError> {
        // The probe's decodes are observation, not trace steps.
        if self.observing.is_some() {
            return self.target.apply(op);
        }
        sys::advance_current_step();
        let Some(cov) = &self.cov else {
            return self.target.apply(op);
        };
        cov.cov_record(CovMode::Ops);
        let outcome = self.target.apply(op);
        cov.cov_record(CovMode::Outside);
        outcome
    }
    fn observing(&mut self, what: Option<Observation>) {
        self.observing = what;
        sys::set_current_observation(what.map_or(0, Observation::code));
        if what.is_some() && what == self.crash_observing {
            sys::crash_with_sigsegv();
        }
    }
    fn observe_seq(&mut self, seq: i32, out: &mut SeqObservation) -> Result<(), HarnessError> {
        self.target.observe_seq(seq, out)
    }
    fn next_pos(&mut self, seq: i32) -> Result<i32, HarnessError> {
        self.target.next_pos(seq)
    }
    fn whole_cells(&mut self, whole: &[u8]) -> Result<Option<Vec<WholeCell>>, HarnessError> {
        self.target.whole_cells(whole)
    }
    fn seq_state(&mut self, seq: i32) -> Result<Vec<u8>, HarnessError> {
        self.target.seq_state(seq)
    }
    fn seq_state_into(&mut self, seq: i32, into: &mut Vec<u8>) -> Result<(), HarnessError> {
        self.target.seq_state_into(seq, into)
    }
    fn last_logits(&mut self) -> Result<Option<Vec<f32>>, HarnessError> {
        self.target.last_logits()
    }
    fn set_seq_state(&mut self, seq: i32, bytes: &[u8]) -> Result<OpOutcome, HarnessError> {
        self.target.set_seq_state(seq, bytes)
    }
    fn state_get(&mut self) -> Result<Option<Vec<u8>>, HarnessError> {
        self.target.state_get()
    }
    fn state_set(&mut self, bytes: &[u8]) -> Result<OpOutcome, HarnessError> {
        self.target.state_set(bytes)
    }
    fn state_size(&mut self, dump: Dump) -> Result<Option<DumpSize>, HarnessError> {
        self.target.state_size(dump)
    }
    fn allocation(&mut self) -> Result<Option<Allocation>, HarnessError> {
        self.target.allocation()
    }
    // The twin's ops are observation, not trace steps: they do not advance the step counter.
    fn twin(&mut self) -> Result<Option<&mut dyn CacheUnderTest>, HarnessError> {
        self.target.twin()
    }
}

/// The worker process: `kvaudit-llama-worker --shim SO --model GGUF --label L [--rot-fields]
/// [--rebuild-resets] [--observe WHAT] [--crash-observing OBSERVATION] [--inject FAULT...]`; it
/// observes what `observe` says after every op (`crash_observing`: a test hook, that
/// observation dies of SIGSEGV every time; `faults`: the target's test hooks, [`LlamaFaults`]).
/// Returns the process exit code (0: stdin closed; 3: a harness error,
/// reported as a `Reply::Error` line when the parent can still read it).
pub fn worker_main(
    shim: &Path,
    model: &Path,
    label: &str,
    format: StateFormat,
    reset: ResetMode,
    observe: Observe,
    crash_observing: Option<Observation>,
    faults: LlamaFaults,
) -> i32 {
    mark("worker: main");
    sys::install_fatal_signal_report();
    sys::keep_freed_memory();
    let mut out = match reply_output() {
        Ok(out) => out,
        // Nothing can be said on a stdout that cannot be written.
        Err(_) => return 3,
    };
    let loaded = match LlamaShim::load(shim) {
        Ok(s) => s,
        Err(e) => {
            write_reply(&mut out, &Reply::Error(e.to_string()), true);
            return 3;
        }
    };
    mark("worker: shim loaded");
    let cov = loaded.records_coverage().then(|| loaded.clone());
    // From the start: the context's construction and the setup's decodes (the warm-up below)
    // are code a run executes too.
    if let Some(cov) = &cov {
        cov.cov_record(CovMode::Outside);
    }
    let target = LlamaTarget::new(loaded, model, label, format, reset).with_faults(faults);
    let stepped = Stepped {
        target,
        observing: None,
        crash_observing,
        cov: cov.clone(),
    };
    let mut runner = LocalRunner::new(Box::new(stepped)).with_observe(observe);
    if !write_reply(&mut out, &Reply::Ready(runner.info()), true) {
        return 3;
    }
    let mut line = Vec::new();
    let mut input = std::io::BufReader::new(std::io::stdin());
    mark("worker: ready sent");
    let mut first = match next_request(&mut input, &mut line, &mut out) {
        Ok(Some(r)) => Some(r),
        Ok(None) => return 0,
        Err(code) => return code,
    };
    mark("worker: first request read");
    // Warm up here, so that every child starts with the context open and the setup's state saved
    // (its resets then restore it). A failure is left for the child to report.
    if let Some(setup) = first.as_ref().and_then(Request::first_setup) {
        let _ = runner.run_last(&Trace {
            setup: setup.clone(),
            ops: vec![],
        });
    }
    mark("worker: warmed up (model, context, setup)");
    if !input.buffer().is_empty() {
        // The parent sends one request at a time and waits for its replies: bytes beyond the first
        // line would be read by the first child only and lost to later ones.
        write_reply(
            &mut out,
            &Reply::Error("a second request arrived before the first was answered".into()),
            true,
        );
        return 3;
    }
    sys::install_sigabrt_forwarding();
    // From here on a SIGABRT is a trial's hang: held until a child runs it (see hold_sigabrt).
    sys::hold_sigabrt();
    let server = std::process::id();
    loop {
        if out.flush().is_err() {
            return 3;
        }
        let forked = sys::fork_and_run(|| {
            // A child outliving its server would keep the pipes open: die with the server.
            sys::kill_me_when_parent_dies();
            if std::os::unix::process::parent_id() != server {
                return 3;
            }
            sys::install_fatal_signal_report();
            sys::release_sigabrt();
            serve_requests(
                &mut runner,
                cov.as_ref(),
                first.take(),
                &mut input,
                &mut line,
                &mut out,
            )
        });
        let pid = match forked {
            Ok(pid) => pid,
            Err(e) => {
                write_reply(&mut out, &Reply::Error(format!("fork failed: {e}")), true);
                return 3;
            }
        };
        // Only the child reads stdin from here on; a later child reads it afresh.
        first = None;
        // The child sends the points reached outside ops so far (the construction, the
        // warm-up) with its first trial; a later child need not send them again.
        if let Some(cov) = &cov {
            let _ = cov.cov_take_outside();
        }
        sys::set_sigabrt_forwarding_target(pid);
        sys::release_sigabrt();
        let status = sys::wait_for_child(pid);
        sys::hold_sigabrt();
        sys::set_sigabrt_forwarding_target(0);
        sys::discard_held_sigabrt();
        let ended =
            <std::process::ExitStatus as std::os::unix::process::ExitStatusExt>::from_raw(status);
        if let Some(code @ (0 | 3)) = ended.code() {
            // stdin closed (0) or the child reported a harness error itself (3).
            return code;
        }
        if ended.code() == Some(RETIRED_EXIT) {
            // Said only now that the child is gone: the parent writes the next request after
            // it, so no child but the next reads it.
            if !write_reply(&mut out, &Reply::Retired, true) {
                return 3;
            }
            input = std::io::BufReader::new(std::io::stdin());
            continue;
        }
        // The child's last words are on stderr before this line: the parent reads up to it.
        eprintln!("{DIED_MARKER}");
        if !write_reply(&mut out, &Reply::Died(status), true) {
            return 3;
        }
        input = std::io::BufReader::new(std::io::stdin());
    }
}

/// The worker's replies: fd 1 itself (a duplicate of it) under a buffer of 64 KiB, whose
/// spills and flushes reach the pipe whole. Not through `std::io::stdout()`: that is
/// line-buffered and keeps back what follows the last newline byte it is handed, and binary
/// frames hold 0x0A anywhere (a position 10), so a child that died after a spill lost up to a
/// KiB of a frame; the parent then read the server's death notice as the frame's rest, waited
/// for a hang and blamed another trace (whose first op it then remembered as a crashing
/// prefix): `llama::crash_after_a_spilled_reply_buffer_0.1.161`.
fn reply_output() -> std::io::Result<std::io::BufWriter<std::fs::File>> {
    use std::os::fd::AsFd;
    let fd = std::io::stdout().as_fd().try_clone_to_owned()?;
    Ok(std::io::BufWriter::with_capacity(
        1 << 16,
        std::fs::File::from(fd),
    ))
}

/// The next request: `Ok(None)` at the end of input; `Err(exit code)` after reporting a
/// malformed, oversized or unreadable one.
fn next_request(
    input: &mut impl BufRead,
    line: &mut Vec<u8>,
    out: &mut impl Write,
) -> Result<Option<Request>, i32> {
    read_request(input, line).map_err(|e| {
        write_reply(out, &Reply::Error(format!("bad request: {e}")), true);
        3
    })
}

/// The fork server's child: runs `first` (the request the server read) and then every request on
/// stdin. Exit codes: 0 stdin closed, 3 a harness error (reported as `Reply::Error`),
/// [`RETIRED_EXIT`] after a retiring request; any other end is a death the server reports.
fn serve_requests(
    runner: &mut LocalRunner,
    cov: Option<&LlamaShim>,
    mut first: Option<Request>,
    input: &mut impl BufRead,
    line: &mut Vec<u8>,
    out: &mut impl Write,
) -> i32 {
    let mut trace = Trace {
        setup: Setup::default(),
        ops: Vec::new(),
    };
    // One frame buffer for every reply of the child.
    let mut replies = ReplyWriter::default();
    loop {
        let req = match first.take() {
            Some(r) => r,
            None => {
                // Wait for the request with SIGABRT live (a hang's abort ends an idle child),
                // then hold it while the line is read: a child aborted in the middle of a long
                // line left the rest of it in the pipe, which the next child read as a request
                // of its own ("bad request", seen once in llama::hang_0.1.161 under load).
                let _ = input.fill_buf();
                sys::hold_sigabrt();
                let read = next_request(input, line, out);
                sys::release_sigabrt();
                match read {
                    Ok(Some(r)) => r,
                    Ok(None) => return 0,
                    Err(code) => return code,
                }
            }
        };
        let code = run_request(runner, cov, &req, &mut trace, &mut replies, out);
        if code != 0 {
            return code;
        }
        if req.retire {
            return RETIRED_EXIT;
        }
    }
}

/// The verdicts of `judges` on a completed trial's last (and only) step, when the request asks
/// for them and none of them finds it violated afresh (beyond `prior`, what its earlier steps
/// violated): the trial is then answered with them instead of its step. A freshly violated
/// step, or any other run (unsupported, crashed, an observation crash), goes whole to the
/// parent, which judges it and records what it shows.
fn judged_here(
    judges: &[&'static Oracle],
    last_only: bool,
    trace: &Trace,
    prior: u64,
    run: &TrialRun,
) -> Option<StepVerdicts> {
    if judges.is_empty() || !last_only || run.end != TrialEnd::Completed {
        return None;
    }
    if run.observation_crash.is_some() {
        return None;
    }
    let [last] = run.steps.as_slice() else {
        return None;
    };
    let op = trace.ops.last()?;
    let verdicts = step_verdicts(judges, op, last, trace.setup.arch);
    (verdicts.violated & !prior == 0).then_some(verdicts)
}

/// Writes the reply for a run of trials judged alike, if any (false: the parent is gone).
fn write_judged_run(
    replies: &mut ReplyWriter,
    out: &mut impl Write,
    run: Option<(StepVerdicts, u32)>,
) -> bool {
    run.map_or(true, |(v, count)| {
        replies.write(out, &Reply::Judged(v, count), false)
    })
}

/// Runs one request's trials, each run with the points of code its ops reached when `cov` records
/// them (0: done; 3: a harness error, already reported as `Reply::Error`).
fn run_request(
    runner: &mut LocalRunner,
    cov: Option<&LlamaShim>,
    req: &Request,
    trace: &mut Trace,
    replies: &mut ReplyWriter,
    out: &mut impl Write,
) -> i32 {
    let n = req.len();
    // Checked when the request was read: the oracles are built in.
    let judges = match req.judges() {
        Ok(j) => j,
        Err(e) => {
            write_reply(out, &Reply::Error(e.to_string()), true);
            return 3;
        }
    };
    let mut scratch = FillScratch::default();
    // The verdicts of the trials judged alike since the last reply written, and how many.
    let mut judged_run: Option<(StepVerdicts, u32)> = None;
    let mut last_flush = sys::coarse_now();
    runner.set_skipped(&req.skipped);
    for trial in 0..n {
        req.fill(trial, trace, &mut scratch);
        sys::set_current_trial(trial);
        let result = if req.last_only {
            runner.run_last(trace)
        } else {
            runner.run(trace)
        };
        // The points of this trial's ops (taking them clears them for the next trial), and
        // those first reached outside ops since the last trial.
        let code = cov.and_then(LlamaShim::cov_take).map(|p| CodeCoverage {
            pcs: p.pcs,
            edges: p.edges,
            outside: cov
                .and_then(LlamaShim::cov_take_outside)
                .unwrap_or_default(),
        });
        let (reply, failed) = match result {
            Ok(run) if code.is_none() => {
                match judged_here(&judges, req.last_only, trace, req.prior(trial), &run) {
                    Some(verdicts) => {
                        // Its observation goes nowhere: the next trial observes into it.
                        runner.recycle(run);
                        (Reply::Judged(verdicts, 1), false)
                    }
                    None => (Reply::Run(run), false),
                }
            }
            Ok(mut run) => {
                run.code = code.map(Box::new);
                (Reply::Run(run), false)
            }
            Err(e) => (Reply::Error(e.to_string()), true),
        };
        // After each trial: a slow target's trials then reach the parent within 100 ms (and
        // the coarse clock's tick) of the first one that ends after it, whatever the group.
        let late = sys::coarse_now().saturating_sub(last_flush) >= REPLY_FLUSH_AFTER;
        let flush = failed
            || req.flush_each
            || late
            || (trial + 1) % req.reply_group() == 0
            || trial + 1 == n;
        // Consecutive trials judged alike go as one reply, written before anything else and
        // at every flush: what reaches the parent, and when, is what single replies gave.
        let written = match reply {
            Reply::Judged(v, 1) => match &mut judged_run {
                Some((held, count)) if *held == v => {
                    *count += 1;
                    true
                }
                _ => {
                    let ok = write_judged_run(replies, out, judged_run.take());
                    judged_run = Some((v, 1));
                    ok
                }
            },
            reply => {
                write_judged_run(replies, out, judged_run.take())
                    && replies.write(out, &reply, false)
            }
        };
        if flush {
            last_flush = sys::coarse_now();
        }
        let flushed =
            !flush || (write_judged_run(replies, out, judged_run.take()) && out.flush().is_ok());
        if !written || !flushed || failed {
            return 3;
        }
    }
    if out.flush().is_err() {
        return 3;
    }
    0
}
