//! The worker's wire: one JSON line per request on the worker's stdin, one binary frame per
//! reply on its stdout, and the marker lines on its stderr.
//!
//! A reply frame (version [`REPLY_WIRE_VERSION`]) is its length (u32, little-endian, of what
//! follows), the version (u16), a kind byte (ready, run, error, died, retired) and the body: a
//! trial's run as counts and little-endian integers (each step's outcome, per sequence its
//! accessors and cells, the whole dump's cells, the round trip, the cells before the op), with
//! the rare parts (a refusal's reason, a crash, the probes, the target's info) as
//! length-prefixed JSON. Both sides check the version: a frame of another is
//! [`WireError::Version`]. The worker builds each frame whole in a buffer it keeps and writes
//! it in one piece ([`ReplyWriter`]), so a child that dies leaves whole frames in the pipe; a
//! frame cut short by the end of the pipe is dropped as truncated. (JSON replies had been a
//! tenth of the worker's time and most of the parent's reader thread.)
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
    CodeCoverage, Observation, OpOutcome, RoundTrip, SeqObservation, SeqRoundTrip, StepObservation,
    TargetInfo,
};
use crate::base::op::{Op, Setup, Trace};
use crate::base::state::WholeCell;
use crate::running::runner::{Skipped, TrialEnd, TrialRun};
pub use crate::targets::llama::error::WireError;

/// The longest request line the worker reads: 256 MiB. A request holds each distinct setup and
/// op of a batch once and every trace as a few indices (about 15 bytes per depth-3 trace), so
/// even a batch of millions of long traces stays far below; anything longer is not a request
/// kvaudit wrote.
pub const MAX_REQUEST_LINE_BYTES: usize = 256 << 20;

/// The worker flushes its replies every this many trials: one write per trial costs more than
/// the trial, and after a crash at most this many traces run twice.
pub(super) const REPLY_GROUP: usize = 64;

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
    /// Observe after the last op only (see `TrialRunner::run_batch_last`).
    #[serde(default)]
    pub(super) last_only: bool,
    /// Flush after every reply instead of every [`REPLY_GROUP`].
    #[serde(default)]
    pub(super) flush_each: bool,
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
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Request {
    /// The request for `traces`.
    pub(super) fn new(traces: &[Trace], last_only: bool, flush_each: bool) -> Request {
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
            skipped: Vec::new(),
            retire: false,
        }
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
    pub(super) fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).expect("a request serializes");
        line.push(b'\n');
        line
    }

    /// Why the request is malformed: an index with no setup or op behind it.
    fn validate(&self) -> Result<(), WireError> {
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
        self.traces.len()
    }

    /// The setup of the first trace, if any (the fork server warms up with it).
    pub(super) fn first_setup(&self) -> Option<&Setup> {
        let &(si, _) = self.traces.first()?;
        self.setups.get(si as usize)
    }

    /// Makes `into` trace `i` of a validated request, reusing its buffers (this runs once per
    /// trial).
    pub(super) fn fill(&self, i: usize, into: &mut Trace) {
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

/// One reply the worker writes on stdout, as a frame ([`ReplyWriter`], [`parse_reply_frame`]).
#[doc(hidden)]
#[derive(Debug)]
pub enum Reply {
    /// Loaded and ready, with what it runs.
    Ready(TargetInfo),
    /// One trial's run.
    Run(TrialRun),
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
            Reply::Error(_) => "error",
            Reply::Died(_) => "died",
            Reply::Retired => "retired",
        }
    }
}

/// The reply wire's version, the second field of every reply frame's header; both sides check
/// it (the JSON-lines replies before it were version 1; 3 added the dumps' sizes to a step, 4 a
/// sequence's third part, the hybrid-iSWA's recurrent states). Change it with any change of the
/// layout below.
pub const REPLY_WIRE_VERSION: u16 = 4;

/// The longest reply frame the parent reads: 64 MiB. A frame is one trial's observations: per
/// step and sequence, its positions and cells (4 bytes per cell), so a trial of hundreds of
/// steps over a context of tens of thousands of cells still fits. A longer frame is refused
/// from its header, before anything is allocated for it.
pub const MAX_REPLY_FRAME_BYTES: usize = 64 << 20;

/// A reply frame's header: the length of what follows it (u32, little-endian), then the
/// version (u16).
const FRAME_HEADER: usize = 6;

const KIND_READY: u8 = 0;
const KIND_RUN: u8 = 1;
const KIND_ERROR: u8 = 2;
const KIND_DIED: u8 = 3;
const KIND_RETIRED: u8 = 4;

/// Writes reply frames, each built whole in a buffer the writer keeps (no allocation per
/// reply in the steady state) and handed to `out` in one `write_all`.
#[derive(Default)]
pub(super) struct ReplyWriter {
    frame: Vec<u8>,
}

impl ReplyWriter {
    /// Writes one reply frame, flushing when asked; false when the parent is gone.
    pub(super) fn write(&mut self, out: &mut impl Write, reply: &Reply, flush: bool) -> bool {
        // The whole frame goes to `out` in one write: written piece by piece into a buffered
        // writer, a frame larger than the buffer's free space was flushed in part, and a child
        // that crashed in its next trial (before the rest was flushed) left half a reply in the
        // pipe (seen on `+cov` with JSON lines, whose replies carry points).
        if encode_reply(reply, &mut self.frame).is_err() {
            return false;
        }
        out.write_all(&self.frame).is_ok() && (!flush || out.flush().is_ok())
    }
}

/// Encodes `reply` as one frame into `frame` (cleared first).
fn encode_reply(reply: &Reply, frame: &mut Vec<u8>) -> Result<(), serde_json::Error> {
    frame.clear();
    frame.extend_from_slice(&[0; 4]);
    frame.extend_from_slice(&REPLY_WIRE_VERSION.to_le_bytes());
    let mut e = Encoder(frame);
    match reply {
        Reply::Ready(info) => {
            e.u8(KIND_READY);
            e.json(info)?;
        }
        Reply::Run(run) => {
            e.u8(KIND_RUN);
            e.run(run)?;
        }
        Reply::Error(message) => {
            e.u8(KIND_ERROR);
            e.bytes(message.as_bytes());
        }
        Reply::Died(raw) => {
            e.u8(KIND_DIED);
            e.i32(*raw);
        }
        Reply::Retired => e.u8(KIND_RETIRED),
    }
    let len = (frame.len() - 4) as u32;
    frame[..4].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

struct Encoder<'a>(&'a mut Vec<u8>);

impl Encoder<'_> {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn bool(&mut self, v: bool) {
        self.0.push(u8::from(v));
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn len(&mut self, n: usize) {
        self.u32(n as u32);
    }
    fn bytes(&mut self, b: &[u8]) {
        self.len(b.len());
        self.0.extend_from_slice(b);
    }
    fn i32s(&mut self, v: &[i32]) {
        self.len(v.len());
        for &x in v {
            self.i32(x);
        }
    }
    fn u32s(&mut self, v: &[u32]) {
        self.len(v.len());
        for &x in v {
            self.u32(x);
        }
    }
    /// The rare parts (refusals, crashes, probes) as length-prefixed JSON.
    fn json(&mut self, v: &impl Serialize) -> Result<(), serde_json::Error> {
        let at = self.0.len();
        self.u32(0);
        serde_json::to_writer(&mut *self.0, v)?;
        let len = (self.0.len() - at - 4) as u32;
        self.0[at..at + 4].copy_from_slice(&len.to_le_bytes());
        Ok(())
    }
    /// An optional rare part: a flag, then its JSON.
    fn option_json(&mut self, v: Option<&impl Serialize>) -> Result<(), serde_json::Error> {
        match v {
            None => {
                self.u8(0);
                Ok(())
            }
            Some(v) => {
                self.u8(1);
                self.json(v)
            }
        }
    }
    fn seq(&mut self, q: &SeqObservation) {
        let SeqObservation {
            seq,
            pos_min,
            pos_max,
            cells,
            second_cells,
            third_cells,
        } = q;
        self.i32(*seq);
        self.i32(*pos_min);
        self.i32(*pos_max);
        self.i32s(cells);
        for part in [second_cells, third_cells] {
            match part {
                None => self.u8(0),
                Some(c) => {
                    self.u8(1);
                    self.i32s(c);
                }
            }
        }
    }
    fn seqs(&mut self, v: &[SeqObservation]) {
        self.len(v.len());
        for q in v {
            self.seq(q);
        }
    }
    fn run(&mut self, run: &TrialRun) -> Result<(), serde_json::Error> {
        let TrialRun {
            steps,
            end,
            observation_crash,
            code,
        } = run;
        match end {
            TrialEnd::Completed => self.u8(0),
            other => {
                self.u8(1);
                self.json(other)?;
            }
        }
        self.option_json(observation_crash.as_ref())?;
        match code {
            None => self.u8(0),
            Some(CodeCoverage { pcs, edges }) => {
                self.u8(1);
                self.u32s(pcs);
                self.u32s(edges);
            }
        }
        self.len(steps.len());
        for st in steps {
            self.step(st)?;
        }
        Ok(())
    }
    fn step(&mut self, st: &StepObservation) -> Result<(), serde_json::Error> {
        // Every field, so that a new one does not compile until the wire carries it.
        let StepObservation {
            outcome,
            seqs,
            whole,
            round_trip,
            before,
            logits_probe,
            reload_probe,
            sizes,
        } = st;
        match outcome {
            OpOutcome::Done { returned: None } => self.u8(0),
            OpOutcome::Done {
                returned: Some(false),
            } => self.u8(1),
            OpOutcome::Done {
                returned: Some(true),
            } => self.u8(2),
            OpOutcome::Decoded { rc } => {
                self.u8(3);
                self.i32(*rc);
            }
            other => {
                self.u8(4);
                self.json(other)?;
            }
        }
        self.seqs(seqs);
        match whole {
            None => self.u8(0),
            Some(cells) => {
                self.u8(1);
                self.len(cells.len());
                for WholeCell { pos, seqs } in cells {
                    self.i32(*pos);
                    self.i32s(seqs);
                }
            }
        }
        match round_trip {
            None => self.u8(0),
            Some(RoundTrip {
                whole_loaded,
                whole_twin,
                whole_same_bytes,
                seqs,
            }) => {
                self.u8(1);
                self.bool(*whole_loaded);
                self.seqs(whole_twin);
                self.bool(*whole_same_bytes);
                self.len(seqs.len());
                for SeqRoundTrip {
                    loaded,
                    twin,
                    same_bytes,
                } in seqs
                {
                    self.bool(*loaded);
                    self.seq(twin);
                    self.bool(*same_bytes);
                }
            }
        }
        match before {
            None => self.u8(0),
            Some(b) => {
                self.u8(1);
                self.seqs(b);
            }
        }
        // The probes: after a trial's last op only, when asked for.
        self.option_json(logits_probe.as_ref())?;
        self.option_json(reload_probe.as_ref())?;
        // The dumps' sizes (the state-size oracle), when asked for.
        self.option_json(sizes.as_ref())
    }
}

/// Decodes one reply frame, header included. Any bytes decode or fail with a
/// [`WireError`]: a count is checked against the bytes left before anything is allocated for
/// it, so no input makes the decoder allocate more than the frame's own size.
pub fn parse_reply_frame(frame: &[u8]) -> Result<Reply, WireError> {
    let malformed = |error: String| WireError::Malformed {
        what: "reply",
        error,
        excerpt: excerpt(frame),
    };
    if frame.len() < FRAME_HEADER {
        return Err(malformed(format!("a frame of {} bytes", frame.len())));
    }
    let len = u32::from_le_bytes(frame[..4].try_into().expect("4 bytes")) as usize;
    if len > MAX_REPLY_FRAME_BYTES {
        return Err(WireError::TooLong {
            what: "reply",
            limit: MAX_REPLY_FRAME_BYTES,
        });
    }
    if len + 4 != frame.len() {
        return Err(malformed(format!(
            "the header says {len} bytes, the frame holds {}",
            frame.len() - 4
        )));
    }
    let version = u16::from_le_bytes(frame[4..6].try_into().expect("2 bytes"));
    if version != REPLY_WIRE_VERSION {
        return Err(WireError::Version {
            found: u32::from(version),
            expected: u32::from(REPLY_WIRE_VERSION),
        });
    }
    let mut d = Decoder {
        bytes: &frame[FRAME_HEADER..],
    };
    let reply = d.reply().map_err(malformed)?;
    if !d.bytes.is_empty() {
        return Err(malformed(format!(
            "{} bytes after the reply",
            d.bytes.len()
        )));
    }
    Ok(reply)
}

fn excerpt(bytes: &[u8]) -> String {
    let shown = &bytes[..bytes.len().min(EXCERPT_BYTES)];
    shown.iter().map(|b| format!("{b:02x}")).collect()
}

struct Decoder<'a> {
    bytes: &'a [u8],
}

type Decoded<T> = Result<T, String>;

impl<'a> Decoder<'a> {
    fn take(&mut self, n: usize) -> Decoded<&'a [u8]> {
        if n > self.bytes.len() {
            return Err(format!("{n} bytes wanted, {} left", self.bytes.len()));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Decoded<u8> {
        Ok(self.take(1)?[0])
    }
    fn flag(&mut self) -> Decoded<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(format!("flag {b}")),
        }
    }
    fn u32(&mut self) -> Decoded<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn i32(&mut self) -> Decoded<i32> {
        Ok(i32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    /// A count of items of at least `min_size` bytes each: no more than the bytes left hold.
    fn count(&mut self, min_size: usize) -> Decoded<usize> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_size) > self.bytes.len() {
            return Err(format!("{n} items in {} bytes", self.bytes.len()));
        }
        Ok(n)
    }
    fn i32s(&mut self) -> Decoded<Vec<i32>> {
        let n = self.count(4)?;
        (0..n).map(|_| self.i32()).collect()
    }
    fn u32s(&mut self) -> Decoded<Vec<u32>> {
        let n = self.count(4)?;
        (0..n).map(|_| self.u32()).collect()
    }
    fn json<T: serde::de::DeserializeOwned>(&mut self) -> Decoded<T> {
        let n = self.count(1)?;
        let text = self.take(n)?;
        serde_json::from_slice(text).map_err(|e| e.to_string())
    }
    fn option<T>(&mut self, f: impl FnOnce(&mut Self) -> Decoded<T>) -> Decoded<Option<T>> {
        if self.flag()? {
            f(self).map(Some)
        } else {
            Ok(None)
        }
    }
    fn seq(&mut self) -> Decoded<SeqObservation> {
        Ok(SeqObservation {
            seq: self.i32()?,
            pos_min: self.i32()?,
            pos_max: self.i32()?,
            cells: self.i32s()?,
            second_cells: self.option(Self::i32s)?,
            third_cells: self.option(Self::i32s)?,
        })
    }
    fn seqs(&mut self) -> Decoded<Vec<SeqObservation>> {
        // A sequence takes at least 18 bytes: three i32, a count and two flags.
        let n = self.count(18)?;
        (0..n).map(|_| self.seq()).collect()
    }
    fn reply(&mut self) -> Decoded<Reply> {
        Ok(match self.u8()? {
            KIND_READY => Reply::Ready(self.json()?),
            KIND_RUN => Reply::Run(self.run()?),
            KIND_ERROR => {
                let n = self.count(1)?;
                Reply::Error(String::from_utf8_lossy(self.take(n)?).into_owned())
            }
            KIND_DIED => Reply::Died(self.i32()?),
            KIND_RETIRED => Reply::Retired,
            k => return Err(format!("reply kind {k}")),
        })
    }
    fn run(&mut self) -> Decoded<TrialRun> {
        let end = match self.u8()? {
            0 => TrialEnd::Completed,
            1 => self.json()?,
            b => return Err(format!("trial end {b}")),
        };
        let observation_crash = self.option(Self::json)?;
        let code = self.option(|d| {
            Ok(CodeCoverage {
                pcs: d.u32s()?,
                edges: d.u32s()?,
            })
        })?;
        // A step takes at least 10 bytes: its outcome, a count and five flags.
        let n = self.count(10)?;
        let steps = (0..n)
            .map(|_| self.step().map(Arc::new))
            .collect::<Decoded<_>>()?;
        Ok(TrialRun {
            steps,
            end,
            observation_crash,
            code,
        })
    }
    fn step(&mut self) -> Decoded<StepObservation> {
        let outcome = match self.u8()? {
            0 => OpOutcome::Done { returned: None },
            1 => OpOutcome::Done {
                returned: Some(false),
            },
            2 => OpOutcome::Done {
                returned: Some(true),
            },
            3 => OpOutcome::Decoded { rc: self.i32()? },
            4 => self.json()?,
            b => return Err(format!("op outcome {b}")),
        };
        let seqs = self.seqs()?;
        let whole = self.option(|d| {
            // A cell takes at least 8 bytes: its position and a count.
            let n = d.count(8)?;
            (0..n)
                .map(|_| {
                    Ok(WholeCell {
                        pos: d.i32()?,
                        seqs: d.i32s()?,
                    })
                })
                .collect()
        })?;
        let round_trip = self.option(|d| {
            let whole_loaded = d.flag()?;
            let whole_twin = d.seqs()?;
            let whole_same_bytes = d.flag()?;
            let n = d.count(19)?;
            let seqs = (0..n)
                .map(|_| {
                    Ok(SeqRoundTrip {
                        loaded: d.flag()?,
                        twin: d.seq()?,
                        same_bytes: d.flag()?,
                    })
                })
                .collect::<Decoded<_>>()?;
            Ok(RoundTrip {
                whole_loaded,
                whole_twin,
                whole_same_bytes,
                seqs,
            })
        })?;
        let before = self.option(Self::seqs)?;
        let logits_probe = self.option(Self::json)?;
        let reload_probe = self.option(Self::json)?;
        let sizes = self.option(Self::json)?;
        Ok(StepObservation {
            outcome,
            seqs,
            whole,
            round_trip,
            before,
            logits_probe,
            reload_probe,
            sizes,
        })
    }
}

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
        for i in 0..req.len() {
            req.fill(i, &mut trace);
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
mod tests {
    use super::*;

    /// The seeds of the `worker_wire` fuzz target (`fuzz/seeds/worker_wire/`) are real lines and
    /// frames of this wire: a request for seed-domain traces, a run reply, a death and an error.
    /// `KVAUDIT_BLESS_SEEDS=1` writes them; otherwise they must be what this code writes.
    #[test]
    fn the_fuzz_seeds_are_real_lines() {
        let d = crate::base::domain::Domain::preset("seed").unwrap();
        let ops = d.ops();
        let traces: Vec<Trace> = (0..6)
            .map(|i| Trace {
                setup: d.setup.clone(),
                ops: vec![ops[i * 7].clone(), ops[(i * 11) % ops.len()].clone()],
            })
            .collect();
        let seq = SeqObservation {
            seq: 0,
            pos_min: 0,
            pos_max: 6,
            cells: vec![0, 1, 2, 3, 4, 5, 6],
            second_cells: None,
            third_cells: None,
        };
        let run = TrialRun {
            steps: vec![Arc::new(StepObservation::basic(
                OpOutcome::Done {
                    returned: Some(true),
                },
                vec![seq],
            ))],
            end: TrialEnd::Crashed {
                step: 2,
                message: "signal SIGABRT".into(),
            },
            observation_crash: None,
            code: None,
        };
        let frame = |r: &Reply| {
            let mut v = Vec::new();
            encode_reply(r, &mut v).unwrap();
            v
        };
        let seeds = [
            ("gen-request", Request::new(&traces, true, false).to_line()),
            ("gen-reply-run", frame(&Reply::Run(run))),
            ("gen-reply-died", frame(&Reply::Died(134))),
            (
                "gen-reply-error",
                frame(&Reply::Error("bad request".into())),
            ),
        ];
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/worker_wire");
        for (name, bytes) in seeds {
            let path = dir.join(name);
            if std::env::var_os("KVAUDIT_BLESS_SEEDS").is_some() {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&path, &bytes).unwrap();
            }
            let on_disk = std::fs::read(&path).unwrap_or_default();
            assert_eq!(
                on_disk,
                bytes,
                "{} is stale: KVAUDIT_BLESS_SEEDS=1 rewrites it",
                path.display()
            );
        }
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
        let back = parse_request_line(&req.to_line()).unwrap();
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
        let err = parse_request_line(&bad.to_line()).unwrap_err();
        assert!(matches!(err, WireError::Invalid(_)), "{err:?}");
        assert!(err.to_string().contains("no op 999"), "{err}");
    }

    #[test]
    fn runs_survive_the_wire_form() {
        let seqs = vec![
            SeqObservation {
                seq: 0,
                pos_min: 0,
                pos_max: 6,
                cells: vec![0, 1, 2, 2, 6],
                second_cells: None,
                third_cells: None,
            },
            SeqObservation {
                seq: 1,
                pos_min: -1,
                pos_max: -1,
                cells: vec![],
                second_cells: None,
                third_cells: None,
            },
        ];
        let step = |outcome| Arc::new(StepObservation::basic(outcome, seqs.clone()));
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
                observation_crash: None,
                code: None,
            },
            TrialRun {
                steps: vec![step(OpOutcome::Unsupported {
                    reason: "why".into(),
                })],
                end: TrialEnd::Unsupported {
                    step: 1,
                    reason: "why".into(),
                },
                observation_crash: None,
                code: None,
            },
            TrialRun {
                steps: vec![],
                end: TrialEnd::Crashed {
                    step: 2,
                    message: "SIGABRT".into(),
                },
                observation_crash: None,
                code: None,
            },
        ];
        let mut rich = runs[0].clone();
        let mut step = StepObservation::clone(&rich.steps[0]);
        step.whole = Some(vec![
            WholeCell {
                pos: 3,
                seqs: vec![0, 1],
            },
            WholeCell {
                pos: 4,
                seqs: vec![],
            },
        ]);
        step.round_trip = Some(RoundTrip {
            whole_loaded: true,
            whole_twin: seqs.clone(),
            whole_same_bytes: false,
            seqs: vec![SeqRoundTrip {
                loaded: false,
                twin: seqs[0].clone(),
                same_bytes: true,
            }],
        });
        step.before = Some(seqs.clone());
        step.seqs[0].second_cells = Some(vec![6]);
        rich.steps[0] = Arc::new(step);
        rich.code = Some(CodeCoverage {
            pcs: vec![1, 70000],
            edges: vec![u32::MAX],
        });
        rich.observation_crash = Some(crate::running::runner::ObservationCrash {
            step: 1,
            observation: Observation::Whole,
            message: "SIGSEGV".into(),
        });
        let mut frame = Vec::new();
        for run in runs.into_iter().chain([rich]) {
            encode_reply(&Reply::Run(run.clone()), &mut frame).unwrap();
            match parse_reply_frame(&frame).unwrap() {
                Reply::Run(back) => assert_eq!(back, run),
                other => panic!("{other:?}"),
            }
        }
    }

    /// A valid request line and reply frame, as the other side writes them.
    fn valid_lines() -> (Vec<u8>, Vec<u8>) {
        let d = crate::base::domain::Domain::preset("seed").unwrap();
        let trace = Trace {
            setup: d.setup.clone(),
            ops: d.ops()[..3].to_vec(),
        };
        let request = Request::new(&[trace], false, false).to_line();
        let mut reply = Vec::new();
        encode_reply(&Reply::Error("no model".into()), &mut reply).unwrap();
        (request, reply)
    }

    #[test]
    fn a_reply_reaches_the_pipe_whole_or_not_at_all() {
        // What a child leaves in the pipe when it crashes right after a reply it did not
        // flush: whole frames only, however small the buffer against the frame.
        let mut out = std::io::BufWriter::with_capacity(16, Vec::new());
        let mut replies = ReplyWriter::default();
        for n in [3, 40, 200] {
            let reply = Reply::Error("x".repeat(n));
            assert!(replies.write(&mut out, &reply, false));
            let mut in_pipe = &out.get_ref()[..];
            let mut frame = Vec::new();
            loop {
                match read_frame_limited(&mut in_pipe, &mut frame, 1 << 20).unwrap() {
                    FrameRead::Frame => assert!(parse_reply_frame(&frame).is_ok()),
                    FrameRead::End => break,
                    other => panic!("{other:?} in the pipe after {n}: {:?}", out.get_ref()),
                }
            }
        }
    }

    #[test]
    fn truncated_garbage_and_huge_lines_are_errors_not_panics() {
        let (request, reply) = valid_lines();
        assert!(parse_request_line(&request).is_ok());
        assert!(matches!(parse_reply_frame(&reply), Ok(Reply::Error(e)) if e == "no model"));
        // Every truncation of a valid line is refused (a prefix of JSON is never JSON here).
        for cut in 0..request.len() - 1 {
            let err = parse_request_line(&request[..cut]).unwrap_err();
            assert!(matches!(err, WireError::Malformed { .. }), "{cut}: {err}");
        }
        for cut in 0..reply.len() {
            assert!(parse_reply_frame(&reply[..cut]).is_err(), "{cut}");
        }
        // Another version is refused with both versions named.
        let mut other = reply.clone();
        other[4] ^= 0x40;
        let err = parse_reply_frame(&other).unwrap_err();
        assert!(
            matches!(
                err,
                WireError::Version { expected, .. }
                    if expected as u64 == u64::from(super::REPLY_WIRE_VERSION)
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("another build of kvaudit"),
            "{err}"
        );
        let garbage: [&[u8]; 8] = [
            b"",
            b"\n",
            b"\xff\xfe\x00garbage",
            b"null",
            b"{\"died\":\"x\"}",
            b"{\"setups\":[],\"ops\":[],\"traces\":[[0,[]]]}",
            b"{\"run\":[[[{\"D\":null},[[0,0,0,[1,2]]]]],\"C\"],\"extra\":1}",
            &[b'['; 10_000],
        ];
        for g in garbage {
            let excerpt = String::from_utf8_lossy(&g[..g.len().min(20)]).into_owned();
            assert!(parse_request_line(g).is_err(), "request {excerpt:?}");
            assert!(parse_reply_frame(g).is_err(), "reply {excerpt:?}");
        }
        // An index past the end is the one well-formed request that is still refused.
        let err = parse_request_line(garbage[5]).unwrap_err();
        assert!(err.to_string().contains("no setup 0"), "{err}");
        // Over the limit: refused before decoding, and the message states the limit.
        let mut huge = ((MAX_REPLY_FRAME_BYTES + 1) as u32).to_le_bytes().to_vec();
        huge.extend_from_slice(&REPLY_WIRE_VERSION.to_le_bytes());
        let err = parse_reply_frame(&huge).unwrap_err();
        assert!(matches!(err, WireError::TooLong { .. }), "{err}");
        assert!(err.to_string().contains(&MAX_REPLY_FRAME_BYTES.to_string()));
        let huge = vec![b' '; MAX_REQUEST_LINE_BYTES + 1];
        assert!(matches!(
            parse_request_line(&huge),
            Err(WireError::TooLong { .. })
        ));
        // A malformed line is quoted, but only its start.
        let mut long = vec![b'x'; 5000];
        long[..4].copy_from_slice(&4996u32.to_le_bytes());
        let err = parse_reply_frame(&long).unwrap_err().to_string();
        assert!(err.len() < 400, "{}", err.len());
    }

    #[test]
    fn frame_reads_skip_oversized_frames_and_stop_at_a_truncated_one() {
        let frame = |r: &Reply| {
            let mut v = Vec::new();
            encode_reply(r, &mut v).unwrap();
            v
        };
        let mut input = frame(&Reply::Died(9));
        input.extend(frame(&Reply::Error("e".repeat(100))));
        input.extend(frame(&Reply::Retired));
        let whole = input.len();
        input.extend(&frame(&Reply::Died(6))[..5]);
        assert!(whole_frame_buffered(&input));
        assert!(!whole_frame_buffered(&input[whole..]));
        let mut reader = io::BufReader::with_capacity(7, &input[..]);
        let mut buf = Vec::new();
        let mut next = |reader: &mut io::BufReader<&[u8]>| {
            let r = read_frame_limited(reader, &mut buf, 64).unwrap();
            (r, parse_reply_frame(&buf).map(|r| r.kind()).ok())
        };
        assert_eq!(next(&mut reader), (FrameRead::Frame, Some("died")));
        // Over the limit of 64 bytes: skipped whole, the next frame read as it is.
        assert_eq!(next(&mut reader).0, FrameRead::TooLong);
        assert_eq!(next(&mut reader), (FrameRead::Frame, Some("retired")));
        // The writer died mid-frame: the rest is dropped, not decoded.
        assert_eq!(next(&mut reader), (FrameRead::Truncated, None));
        assert_eq!(next(&mut reader).0, FrameRead::End);
        // A header announcing more than the limit allocates nothing for it.
        let mut lying = u32::MAX.to_le_bytes().to_vec();
        lying.extend_from_slice(&[0; 10]);
        let mut buf = Vec::new();
        let r = read_frame_limited(&mut &lying[..], &mut buf, MAX_REPLY_FRAME_BYTES).unwrap();
        assert_eq!(r, FrameRead::Truncated);
        assert!(buf.capacity() < 1024, "{}", buf.capacity());
    }

    #[test]
    fn bounded_reads_stop_at_the_limit_and_resume_at_the_next_line() {
        let input = b"short\nthis one is far too long\nok\nlast without newline";
        // A tiny buffer, so that lines span several reads.
        let mut reader = io::BufReader::with_capacity(4, &input[..]);
        let mut line = Vec::new();
        let mut next = |reader: &mut io::BufReader<&[u8]>| {
            let r = read_line_limited(reader, &mut line, 10).unwrap();
            (r, String::from_utf8(line.clone()).unwrap())
        };
        assert_eq!(next(&mut reader), (LineRead::Line, "short".into()));
        assert_eq!(next(&mut reader), (LineRead::TooLong, "".into()));
        assert_eq!(next(&mut reader), (LineRead::Line, "ok".into()));
        assert_eq!(next(&mut reader).0, LineRead::TooLong);
        assert_eq!(next(&mut reader), (LineRead::End, "".into()));
        let mut exact = &b"0123456789\n"[..];
        assert_eq!(
            read_line_limited(&mut exact, &mut line, 10).unwrap(),
            LineRead::Line
        );
    }

    #[test]
    fn an_oversized_request_on_the_pipe_is_a_typed_error() {
        use std::io::Read as _;
        let endless = io::repeat(b'[').take(MAX_REQUEST_LINE_BYTES as u64 + 10);
        let mut input = io::BufReader::with_capacity(1 << 20, endless);
        let mut line = Vec::new();
        let err = read_request(&mut input, &mut line).unwrap_err();
        assert!(
            matches!(
                err,
                WireError::TooLong {
                    what: "request",
                    ..
                }
            ),
            "{err}"
        );
    }
}
