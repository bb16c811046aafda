//! The worker's wire: one JSON line per request on the worker's stdin, one binary frame per
//! reply on its stdout, and the marker lines on its stderr.
//!
//! A request holds its traces as indices into the distinct setups and ops it lists, or, for an
//! explorer's batch, as their place in the exhaustive enumeration (the domain's ops, the depth,
//! the first trial's number and the count: `Odometer`), from which the worker makes the same
//! traces.
//!
//! A reply frame (version [`REPLY_WIRE_VERSION`]) is its length (u32, little-endian, of what
//! follows), the version (u16), a kind byte (ready, run, judged, error, died, retired) and the
//! body: the verdicts of consecutive trials judged alike when the request judges in the worker
//! and they violate nothing afresh (two u64 bit sets and a u32 count), else a trial's run as
//! counts and little-endian integers (each step's outcome, per sequence its accessors and
//! cells, the whole dump's cells, the round trip, the cells before the op), with the rare parts
//! (a refusal's reason, a crash, the probes, the target's info) as length-prefixed JSON. Both
//! sides check the version: a frame of another is [`WireError::Version`]. The worker builds
//! each frame whole in a buffer it keeps and writes it in one piece ([`ReplyWriter`]), so a
//! child that dies leaves whole frames in the pipe; a frame cut short by the end of the pipe
//! is dropped as truncated. (JSON replies had been a tenth of the worker's time and most of
//! the parent's reader thread.)
//!
//! Both readers are bounded: a line or frame longer than its direction's limit
//! ([`MAX_REQUEST_LINE_BYTES`], [`MAX_REPLY_FRAME_BYTES`]) is not buffered whole but refused
//! with [`WireError::TooLong`] (a frame from its header, before anything is allocated), and
//! one that is not a request or reply is [`WireError::Malformed`] (a request whose traces name
//! a setup or op it does not hold: [`WireError::Invalid`]); neither panics.
//! [`parse_request_line`] and [`parse_reply_frame`] are the pure decoders both sides use,
//! public so that a fuzz target can call them; the types they return are opaque outside this
//! crate.

use std::collections::HashMap;
use std::io::{self, BufRead, Write};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::base::cache::{
    CodeCoverage, NextLogits, Observation, OpOutcome, RoundTrip, SeqObservation, SeqRoundTrip,
    StepObservation, TargetInfo,
};
use crate::base::op::{Op, Setup, Trace};
use crate::base::state::WholeCell;
use crate::base::word_hash::BuildWordHasher;
use crate::oracles::{Oracle, Registry};
use crate::running::runner::{
    enumerated_indices, BatchJudging, Enumerated, Skipped, StepVerdicts, TrialEnd, TrialRun,
};
pub use crate::targets::llama::error::WireError;

/// The longest request line the worker reads: 256 MiB. A request holds each distinct setup and
/// op of a batch once and every trace as a few indices (about 15 bytes per depth-3 trace), so
/// even a batch of millions of long traces stays far below; anything longer is not a request
/// kvaudit wrote.
pub const MAX_REQUEST_LINE_BYTES: usize = 256 << 20;

/// The worker flushes its replies every this many trials, or once [`REPLY_FLUSH_AFTER`] has
/// passed since its last flush: one write per trial costs more than the trial, and after a
/// crash at most this many traces run twice. Each flush wakes the parent's reader and the
/// thread waiting for the batch (64 cost the parent a wake-up pair per millisecond of a
/// worker); trials judged alike in a row travel as one reply, so a batch of a clean audit's
/// (2,048 traces) is a few frames and one flush: the parent's reader wakes once per batch.
pub(super) const REPLY_GROUP: usize = 2048;

/// The longest the worker holds replies before it flushes them (see [`REPLY_GROUP`]): a slow
/// target's group would otherwise keep the parent waiting long enough to take it for a hang.
pub(super) const REPLY_FLUSH_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

/// The flush group once a child of the worker has died: a child that dies takes its unflushed
/// replies with it and the parent runs their traces again, up to a whole group per death. A
/// trial judged in the worker answers in 17 bytes, so 256 of them never filled the buffer
/// before a flush, and a `+assert` depth-3 audit (about 1,900 deaths) ran a quarter of a
/// million traces twice: 15.5 s against 10.8 s when whole replies still spilled early.
pub(super) const AFTER_DEATH_REPLY_GROUP: u32 = 16;

/// What the fork server writes on stderr after a child died, after everything the child wrote.
pub(super) const DIED_MARKER: &str = "kvaudit-worker: child ended";

/// How much of a malformed line an error quotes.
const EXCERPT_BYTES: usize = 120;

/// One batch as the worker receives it: each distinct setup and op once, and every trace as
/// indices into them. (Traces as JSON objects cost more to write and to parse than a trial
/// takes to run: about a tenth of the worker's time and most of the parent's, perf, depth-3
/// seed audit.)
#[doc(hidden)]
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    setups: Vec<Setup>,
    ops: Vec<Op>,
    /// Per trace: its setup's index and its ops' indices.
    traces: Vec<(u32, Vec<u32>)>,
    /// The traces as a run of an exhaustive enumeration over `ops` instead (`traces` is then
    /// empty): what the parent's explorer enumerates, sent as four numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    odometer: Option<Odometer>,
    /// Observe after the last op only (see `TrialRunner::run_batch_last`).
    #[serde(default)]
    pub(super) last_only: bool,
    /// Flush after every reply instead of every [`REPLY_GROUP`].
    #[serde(default)]
    pub(super) flush_each: bool,
    /// Flush after every this many replies instead of every [`REPLY_GROUP`] (the parent asks
    /// for fewer once a child of this worker has died: see [`AFTER_DEATH_REPLY_GROUP`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) group: Option<u32>,
    /// Observations every trace leaves out, each from its step on: the request runs again a
    /// trace whose observation crashed (`LocalRunner::set_skipped`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) skipped: Skipped,
    /// The child that runs the request ends after it (the fork server says
    /// [`Reply::Retired`] once it has) and the next request runs in a child forked afresh from
    /// the warm server: a trial that may corrupt memory neither inherits nor leaves a heap
    /// another trial ran on (`WorkerRunner`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub(super) retire: bool,
    /// Built-in step oracles, by name, that judge each completed trial's last step in the
    /// worker (`last_only` requests): a trial none of them finds violated afresh is answered
    /// with [`Reply::Judged`], its verdicts, instead of its step (`TrialRun::judged`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) judge: Vec<String>,
    /// Per trace (empty: none), the oracles of `judge` its earlier steps violated, as bits: a
    /// violation of one of them is not fresh.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) prior: Vec<u64>,
}

/// What [`Request::fill`] keeps between the fills of one request: the op indices of the
/// enumerated trace the filled trace holds (empty: not known), and room for the next's.
#[derive(Default)]
pub(super) struct FillScratch {
    held: Vec<usize>,
    next: Vec<usize>,
    /// The request's setup the trace holds since this request's first fill: the setup is
    /// not compared again for every trial.
    setup: Option<u32>,
}

/// A request's traces as a run of an exhaustive enumeration (`runner::Enumerated`): trials
/// `from..from + len` of those with `depth` ops over the request's ops, in lexicographic
/// order, all of setup `setup`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct Odometer {
    setup: u32,
    depth: u32,
    from: u64,
    len: u32,
}

/// The most traces an enumerated request holds (a larger batch is sent trace by trace): a
/// request that decodes can then be filled whole quickly (the fuzz target does).
pub(super) const MAX_ENUMERATED_TRACES: usize = 1 << 16;

/// The longest trace an enumerated request holds.
const MAX_ENUMERATED_DEPTH: u32 = 64;

fn is_false(b: &bool) -> bool {
    !*b
}

impl Request {
    /// The request for `traces`.
    pub(super) fn new(traces: &[Trace], last_only: bool, flush_each: bool) -> Request {
        let mut setups: Vec<Setup> = Vec::new();
        let mut ops: Vec<Op> = Vec::new();
        // Ops are hashed by their words, not SipHash: kvaudit's own values, once per trace.
        let mut op_index: HashMap<&Op, u32, BuildWordHasher> = HashMap::default();
        let mut indexed: Vec<(u32, Vec<u32>)> = Vec::with_capacity(traces.len());
        for (k, t) in traces.iter().enumerate() {
            // Batches hold one setup, or very few: a scan beats hashing a setup per trace.
            let si = match setups.iter().position(|s| *s == t.setup) {
                Some(i) => i,
                None => {
                    setups.push(t.setup.clone());
                    setups.len() - 1
                }
            };
            // An explorer's consecutive traces share most of their ops (an odometer turns the
            // last one): an op equal to the previous trace's at the same place takes its index
            // without being hashed.
            let prev = k.checked_sub(1).map(|j| (&traces[j].ops, &indexed[j].1));
            let oi = t
                .ops
                .iter()
                .enumerate()
                .map(|(i, op)| match prev {
                    Some((p_ops, p_idx)) if p_ops.get(i) == Some(op) => p_idx[i],
                    _ => *op_index.entry(op).or_insert_with(|| {
                        ops.push(op.clone());
                        ops.len() as u32 - 1
                    }),
                })
                .collect();
            indexed.push((si as u32, oi));
        }
        Request {
            setups,
            ops,
            traces: indexed,
            odometer: None,
            last_only,
            flush_each,
            group: None,
            skipped: Vec::new(),
            retire: false,
            judge: Vec::new(),
            prior: Vec::new(),
        }
    }

    /// The request for the `len` traces of setup `setup` that `run` names (`None`: more than
    /// [`MAX_ENUMERATED_TRACES`], or none, or an enumeration deeper than this wire carries).
    pub(super) fn enumerated(
        setup: &Setup,
        run: Enumerated<'_>,
        len: usize,
        last_only: bool,
    ) -> Option<Request> {
        if len == 0 || len > MAX_ENUMERATED_TRACES || run.depth > MAX_ENUMERATED_DEPTH {
            return None;
        }
        let mut req = Request::new(&[], last_only, false);
        req.setups = vec![setup.clone()];
        req.ops = run.ops.to_vec();
        req.odometer = Some(Odometer {
            setup: 0,
            depth: run.depth,
            from: run.from,
            len: len as u32,
        });
        Some(req)
    }

    /// This request, its trials' last steps judged in the worker as `judging` says (bit k of
    /// a [`Reply::Judged`] is its k-th oracle).
    pub(super) fn judging(mut self, judging: &BatchJudging) -> Request {
        self.judge = judging
            .oracles
            .iter()
            .map(|o| o.name().to_string())
            .collect();
        self.prior = judging.prior.clone();
        self
    }

    /// What trace `i`'s earlier steps violated, of the oracles that judge here.
    pub(super) fn prior(&self, i: usize) -> u64 {
        self.prior.get(i).copied().unwrap_or(0)
    }

    /// The oracles that judge the trials' last steps in the worker ([`Request::judge`]); a
    /// name that is not a built-in oracle is [`WireError::Invalid`].
    pub(super) fn judges(&self) -> Result<Vec<&'static Oracle>, WireError> {
        let builtin = Registry::builtin();
        self.judge
            .iter()
            .map(|name| {
                builtin
                    .find(name)
                    .ok_or_else(|| WireError::Invalid(format!("no built-in oracle {name:?}")))
            })
            .collect()
    }

    /// This request, its replies flushed every `group` (`None`: every [`REPLY_GROUP`]).
    pub(super) fn grouping(mut self, group: Option<u32>) -> Request {
        self.group = group;
        self
    }

    /// How many replies the worker writes between two flushes.
    pub(super) fn reply_group(&self) -> usize {
        self.group.map_or(REPLY_GROUP, |g| g.max(1) as usize)
    }

    /// This request, its child ending after it when `retire`.
    pub(super) fn retiring(mut self, retire: bool) -> Request {
        self.retire = retire;
        self
    }

    /// This request, leaving `skipped` out of its traces.
    pub(super) fn skipping(mut self, skipped: &[(usize, Observation)]) -> Request {
        self.skipped = skipped.to_vec();
        self
    }

    /// The request as one line, newline included.
    #[cfg(test)]
    pub(super) fn to_line(&self) -> Vec<u8> {
        let mut line = Vec::new();
        self.write_line(&mut line);
        line
    }

    /// The request as one line, newline included, into `line` (cleared first; its buffer
    /// is reused from one batch to the next).
    pub(super) fn write_line(&self, line: &mut Vec<u8>) {
        line.clear();
        serde_json::to_writer(&mut *line, self).expect("a request serializes");
        line.push(b'\n');
    }

    /// Why the request is malformed: an index with no setup or op behind it, or an oracle to
    /// judge with that the worker does not have.
    fn validate(&self) -> Result<(), WireError> {
        self.judges()?;
        if !self.prior.is_empty() && self.prior.len() != self.len() {
            return Err(WireError::Invalid(format!(
                "prior bits for {} traces, the request holds {}",
                self.prior.len(),
                self.len()
            )));
        }
        if let Some(o) = &self.odometer {
            let n = self.ops.len() as u64;
            let space = n.checked_pow(o.depth);
            let end = o.from.checked_add(u64::from(o.len));
            let why = if !self.traces.is_empty() {
                Some("an enumerated request lists no traces".to_string())
            } else if o.setup as usize >= self.setups.len() {
                Some(format!("no setup {}", o.setup))
            } else if n == 0 {
                Some("no ops to enumerate".to_string())
            } else if o.depth == 0 || o.depth > MAX_ENUMERATED_DEPTH {
                Some(format!("depth {} (1 to {MAX_ENUMERATED_DEPTH})", o.depth))
            } else if o.len as usize > MAX_ENUMERATED_TRACES {
                Some(format!(
                    "{} traces (at most {MAX_ENUMERATED_TRACES})",
                    o.len
                ))
            } else if end.is_none() || matches!((space, end), (Some(s), Some(e)) if e > s) {
                Some(format!(
                    "traces {}..+{} of an enumeration that holds {space:?}",
                    o.from, o.len
                ))
            } else {
                None
            };
            if let Some(why) = why {
                return Err(WireError::Invalid(format!("enumerated request: {why}")));
            }
            return Ok(());
        }
        for (i, (si, oi)) in self.traces.iter().enumerate() {
            if *si as usize >= self.setups.len() {
                return Err(WireError::Invalid(format!("trace {i}: no setup {si}")));
            }
            if let Some(k) = oi.iter().find(|&&k| k as usize >= self.ops.len()) {
                return Err(WireError::Invalid(format!("trace {i}: no op {k}")));
            }
        }
        Ok(())
    }

    /// Number of traces.
    pub(super) fn len(&self) -> usize {
        match &self.odometer {
            Some(o) => o.len as usize,
            None => self.traces.len(),
        }
    }

    /// The setup of the first trace, if any (the fork server warms up with it).
    pub(super) fn first_setup(&self) -> Option<&Setup> {
        let si = match &self.odometer {
            Some(o) => (o.len > 0).then_some(o.setup)?,
            None => self.traces.first()?.0,
        };
        self.setups.get(si as usize)
    }

    /// Makes `into` trace `i` of a validated request, reusing its buffers (this runs once per
    /// trial); `scratch` is this request's (made for it, then passed to each fill): it knows
    /// which enumerated trace `into` holds.
    pub(super) fn fill(&self, i: usize, into: &mut Trace, scratch: &mut FillScratch) {
        let si = match &self.odometer {
            Some(o) => o.setup,
            None => self.traces[i].0,
        };
        if scratch.setup != Some(si) {
            let setup = &self.setups[si as usize];
            if into.setup != *setup {
                into.setup = setup.clone();
            }
            scratch.setup = Some(si);
        }
        // Consecutive traces share most of their ops: those in place are kept.
        match &self.odometer {
            Some(o) => {
                let FillScratch { held, next, .. } = scratch;
                enumerated_indices(self.ops.len() as u64, o.depth, o.from + i as u64, next);
                into.refill_indexed(&self.ops, held, next);
                std::mem::swap(held, next);
            }
            None => {
                scratch.held.clear();
                into.refill_ops(self.traces[i].1.iter().map(|&k| &self.ops[k as usize]));
            }
        }
    }
}

/// One reply the worker writes on stdout, as a frame ([`ReplyWriter`], [`parse_reply_frame`]).
#[doc(hidden)]
#[derive(Debug)]
pub enum Reply {
    /// Loaded and ready, with what it runs.
    Ready(TargetInfo),
    /// One trial's run.
    Run(TrialRun),
    /// The verdicts of this many consecutive trials (at least one), the same for each, judged
    /// in the worker ([`Request::judge`]), none violated afresh; the parent makes each a
    /// [`TrialRun::judged`]. (Most trials of an audit end clean: one frame for a run of them.)
    Judged(StepVerdicts, u32),
    /// A harness error; the worker ends after it.
    Error(String),
    /// The fork server's child running the request died; its raw `waitpid` status. The server
    /// lives on and takes the next request.
    Died(i32),
    /// The child that ran a retiring request has ended as asked; the next request runs in a
    /// new one.
    Retired,
}

impl Reply {
    /// The variant's name, for messages about an unexpected reply.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Reply::Ready(_) => "ready",
            Reply::Run(_) => "run",
            Reply::Judged(..) => "judged",
            Reply::Error(_) => "error",
            Reply::Died(_) => "died",
            Reply::Retired => "retired",
        }
    }
}

mod codec;

use codec::encode_reply;
pub(super) use codec::ReplyWriter;
pub use codec::{
    parse_reply_frame, parse_reply_frame_shared, StepCache, MAX_REPLY_FRAME_BYTES,
    REPLY_WIRE_VERSION,
};

/// Whether `buffered` starts with a whole frame (the reader then decodes it without a read).
pub(super) fn whole_frame_buffered(buffered: &[u8]) -> bool {
    buffered.len() >= 4
        && u32::from_le_bytes(buffered[..4].try_into().expect("4 bytes")) as usize + 4
            <= buffered.len()
}

/// How a bounded frame read ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum FrameRead {
    /// A whole frame, header included, in the buffer.
    Frame,
    /// The input had ended between frames.
    End,
    /// The input ended inside a frame (the writer died mid-frame): what was read is dropped.
    Truncated,
    /// The header announced more than the limit: the frame was read to its end but not kept.
    TooLong,
}

/// Reads one reply frame into `frame` (reused: cleared first), keeping at most `limit` bytes:
/// a longer frame is skipped whole, so the next call starts at the next frame.
pub(super) fn read_frame_limited<R: io::Read>(
    input: &mut R,
    frame: &mut Vec<u8>,
    limit: usize,
) -> io::Result<FrameRead> {
    frame.clear();
    let mut header = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match input.read(&mut header[got..]) {
            Ok(0) => {
                return Ok(if got == 0 {
                    FrameRead::End
                } else {
                    FrameRead::Truncated
                })
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_le_bytes(header) as usize;
    if len > limit {
        let skipped = io::copy(
            &mut <&mut R as io::Read>::take(input, len as u64),
            &mut io::sink(),
        )?;
        return Ok(if skipped == len as u64 {
            FrameRead::TooLong
        } else {
            FrameRead::Truncated
        });
    }
    frame.extend_from_slice(&header);
    frame.resize(4 + len, 0);
    match input.read_exact(&mut frame[4..]) {
        Ok(()) => Ok(FrameRead::Frame),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            frame.clear();
            Ok(FrameRead::Truncated)
        }
        Err(e) => Err(e),
    }
}

/// Decodes one request line (with or without its newline) and checks that every trace's
/// indices name a setup and op of the request.
pub fn parse_request_line(bytes: &[u8]) -> Result<Request, WireError> {
    let req: Request = decode("request", bytes, MAX_REQUEST_LINE_BYTES)?;
    req.validate()?;
    Ok(req)
}

fn decode<'de, T: Deserialize<'de>>(
    what: &'static str,
    bytes: &'de [u8],
    limit: usize,
) -> Result<T, WireError> {
    if bytes.len() > limit + 1 || (bytes.len() == limit + 1 && bytes[limit] != b'\n') {
        return Err(WireError::TooLong { what, limit });
    }
    serde_json::from_slice(bytes).map_err(|e| WireError::Malformed {
        what,
        error: e.to_string(),
        excerpt: String::from_utf8_lossy(&bytes[..bytes.len().min(EXCERPT_BYTES)])
            .trim_end()
            .to_string(),
    })
}

/// How a bounded line read ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum LineRead {
    /// A line (without its newline; the last line of the input may lack one).
    Line,
    /// The input had ended.
    End,
    /// The line went past the limit: it was read to its end but not kept.
    TooLong,
}

/// Reads one line into `line` (cleared first, newline removed), keeping at most `limit` bytes of
/// it: a longer line is read to its end and dropped, so the next call starts at the next line.
pub(super) fn read_line_limited(
    input: &mut impl BufRead,
    line: &mut Vec<u8>,
    limit: usize,
) -> io::Result<LineRead> {
    line.clear();
    let mut too_long = false;
    loop {
        let available = match input.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(match (too_long, line.is_empty()) {
                (true, _) => LineRead::TooLong,
                (false, true) => LineRead::End,
                (false, false) => LineRead::Line,
            });
        }
        let (chunk, found) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], true),
            None => (available, false),
        };
        if !too_long && line.len() + chunk.len() > limit {
            too_long = true;
            *line = Vec::new();
        }
        if !too_long {
            line.extend_from_slice(chunk);
        }
        let used = chunk.len() + usize::from(found);
        input.consume(used);
        if found {
            return Ok(if too_long {
                LineRead::TooLong
            } else {
                LineRead::Line
            });
        }
    }
}

/// Reads and decodes the next request: `Ok(None)` at the end of input.
pub(super) fn read_request(
    input: &mut impl BufRead,
    line: &mut Vec<u8>,
) -> Result<Option<Request>, WireError> {
    let read =
        read_line_limited(input, line, MAX_REQUEST_LINE_BYTES).map_err(|error| WireError::Io {
            what: "reading a request",
            error,
        })?;
    match read {
        LineRead::End => Ok(None),
        LineRead::TooLong => Err(WireError::TooLong {
            what: "request",
            limit: MAX_REQUEST_LINE_BYTES,
        }),
        LineRead::Line => parse_request_line(line).map(Some),
    }
}

/// Writes one reply frame, flushing when asked; false when the parent is gone. For the rare
/// replies (ready, error, died, retired); a trial's run goes through a [`ReplyWriter`] the
/// child keeps.
pub(super) fn write_reply(out: &mut impl Write, reply: &Reply, flush: bool) -> bool {
    ReplyWriter::default().write(out, reply, flush)
}

/// Fuzz target `worker_wire` (`fuzz/fuzz_targets/worker_wire.rs`, and `tests/it/fuzz_seeds.rs`
/// over its seeds): any bytes, as a request line and as a reply frame, decode or fail with a
/// [`WireError`]; every trace of a request that decodes can be filled (its indices were
/// checked), a reply that decodes encodes back to itself, and the bytes read as a stream of
/// frames end in whole frames, skipped ones or a truncation. Panics otherwise.
#[doc(hidden)]
pub fn fuzz_worker_wire(data: &[u8]) {
    if let Ok(req) = parse_request_line(data) {
        let mut trace = Trace {
            setup: Setup::default(),
            ops: Vec::new(),
        };
        let mut scratch = FillScratch::default();
        for i in 0..req.len() {
            req.fill(i, &mut trace, &mut scratch);
        }
        let _ = req.first_setup();
    }
    if let Ok(reply) = parse_reply_frame(data) {
        // What decodes encodes to a frame that decodes to the same reply.
        let mut frame = Vec::new();
        encode_reply(&reply, &mut frame).expect("a decoded reply encodes");
        let again = parse_reply_frame(&frame).expect("an encoded reply decodes");
        assert_eq!(format!("{again:?}"), format!("{reply:?}"));
    }
    // The bytes as a stream of frames, read with a small limit: each read ends, none panics.
    let mut input = data;
    let mut frame = Vec::new();
    for _ in 0..data.len() + 1 {
        match read_frame_limited(&mut input, &mut frame, 1 << 12) {
            Ok(FrameRead::Frame) => {
                let _ = parse_reply_frame(&frame);
            }
            Ok(FrameRead::TooLong) => {}
            Ok(FrameRead::End | FrameRead::Truncated) | Err(_) => break,
        }
    }
}

#[cfg(test)]
mod tests;
