//! The reply frame's binary codec: the header (length, [`REPLY_WIRE_VERSION`]), the kind byte and
//! the body of a [`Reply`] as counts and little-endian integers with the rare parts as
//! length-prefixed JSON; [`ReplyWriter`] builds each frame whole in a buffer it keeps, and
//! [`parse_reply_frame`] decodes one without allocating more than the frame's own size. The
//! framing on the pipe (bounded reads, truncation) is the parent module's.
//!
//! Each step of a run is length-prefixed, so that the parent's reader can look its bytes up
//! before decoding them ([`StepCache`], [`parse_reply_frame_shared`]): an exhaustive audit's
//! trials end in far fewer distinct observations than there are trials (the seed domain's
//! 5,884,900 depth-4 traces reach 53,573 distinct native states), and a step seen before is
//! handed on as the same shared observation, neither decoded nor allocated again, whose
//! verdicts the judging thread's memo then answers (`running::judge::VerdictMemo`).

use std::io::Write;

use crate::base::word_hash::BuildWordHasher;

use super::*;

/// The reply wire's version, the second field of every reply frame's header; both sides check
/// it (the JSON-lines replies before it were version 1; 3 added the dumps' sizes to a step, 4 a
/// sequence's third part, the hybrid-iSWA's recurrent states, 6 each step's length before it,
/// 7 the judged kind, 8 its count of consecutive trials, 9 the probed sequences' next-token
/// logits). Change it with any change of the layout below.
pub const REPLY_WIRE_VERSION: u16 = 9;

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
const KIND_JUDGED: u8 = 5;

/// Writes reply frames, each built whole in a buffer the writer keeps (no allocation per
/// reply in the steady state) and handed to `out` in one `write_all`.
#[derive(Default)]
pub(in crate::targets::llama::worker) struct ReplyWriter {
    frame: Vec<u8>,
}

impl ReplyWriter {
    /// Writes one reply frame, flushing when asked; false when the parent is gone.
    pub(in crate::targets::llama::worker) fn write(
        &mut self,
        out: &mut impl Write,
        reply: &Reply,
        flush: bool,
    ) -> bool {
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
pub(super) fn encode_reply(reply: &Reply, frame: &mut Vec<u8>) -> Result<(), serde_json::Error> {
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
        Reply::Judged(StepVerdicts { judged, violated }, count) => {
            e.u8(KIND_JUDGED);
            e.u64(*judged);
            e.u64(*violated);
            e.u32(*count);
        }
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
    fn u64(&mut self, v: u64) {
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
            judged,
        } = run;
        // A judged run travels as its own kind (`Reply::Judged`), never inside a run.
        debug_assert!(judged.is_none(), "a judged run is sent as Reply::Judged");
        match end {
            TrialEnd::Completed => self.u8(0),
            other => {
                self.u8(1);
                self.json(other)?;
            }
        }
        self.option_json(observation_crash.as_ref())?;
        match code.as_deref() {
            None => self.u8(0),
            Some(CodeCoverage {
                pcs,
                edges,
                outside,
            }) => {
                self.u8(1);
                self.u32s(pcs);
                self.u32s(edges);
                self.u32s(outside);
            }
        }
        self.len(steps.len());
        for st in steps {
            // The step's length first (patched once it is written): the reader looks the
            // step's bytes up before it decodes them.
            let at = self.0.len();
            self.u32(0);
            self.step(st)?;
            let n = (self.0.len() - at - 4) as u32;
            self.0[at..at + 4].copy_from_slice(&n.to_le_bytes());
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
            next_logits,
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
        // Their logit vectors, when asked for: per sequence its id and the f32s' bits.
        match next_logits {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                self.len(v.len());
                for NextLogits { seq, logits } in v {
                    self.i32(*seq);
                    self.len(logits.len());
                    for x in logits {
                        self.u32(x.to_bits());
                    }
                }
            }
        }
        self.option_json(reload_probe.as_ref())?;
        // The dumps' sizes (the state-size oracle), when asked for.
        self.option_json(sizes.as_ref())
    }
}

/// Decodes one reply frame, header included. Any bytes decode or fail with a
/// [`WireError`]: a count is checked against the bytes left before anything is allocated for
/// it, so no input makes the decoder allocate more than the frame's own size.
pub fn parse_reply_frame(frame: &[u8]) -> Result<Reply, WireError> {
    parse_reply_frame_shared(frame, &mut StepCache::default())
}

/// [`parse_reply_frame`], with each step that `cache` has seen (the same bytes) handed on as
/// the observation it decoded then, and each new one remembered.
pub fn parse_reply_frame_shared(frame: &[u8], cache: &mut StepCache) -> Result<Reply, WireError> {
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
        cache,
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

/// The steps a reader decoded, by their bytes: the same bytes decode to the same observation,
/// so a step seen before is the same shared one. Bounded: emptied when it holds
/// [`StepCache::MAX_STEPS`] (the distinct observations of a long audit do not all fit, and an
/// emptied cache only costs decoding again).
#[derive(Default)]
pub struct StepCache {
    steps: HashMap<Box<[u8]>, Arc<StepObservation>, BuildWordHasher>,
}

impl StepCache {
    /// How many steps a cache holds before it starts afresh.
    pub const MAX_STEPS: usize = 1 << 15;

    fn get(&self, bytes: &[u8]) -> Option<Arc<StepObservation>> {
        self.steps.get(bytes).cloned()
    }

    fn put(&mut self, bytes: &[u8], step: &Arc<StepObservation>) {
        if self.steps.len() >= Self::MAX_STEPS {
            self.steps.clear();
        }
        self.steps.insert(bytes.into(), step.clone());
    }
}

struct Decoder<'a, 'c> {
    bytes: &'a [u8],
    cache: &'c mut StepCache,
}

type Decoded<T> = Result<T, String>;

impl<'a> Decoder<'a, '_> {
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
    fn u64(&mut self) -> Decoded<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
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
            KIND_JUDGED => {
                let verdicts = StepVerdicts {
                    judged: self.u64()?,
                    violated: self.u64()?,
                };
                match self.u32()? {
                    0 => return Err("a judged reply for no trial".into()),
                    count => Reply::Judged(verdicts, count),
                }
            }
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
            Ok(Box::new(CodeCoverage {
                pcs: d.u32s()?,
                edges: d.u32s()?,
                outside: d.u32s()?,
            }))
        })?;
        // A step takes at least 14 bytes: its length, its outcome, a count and five flags.
        let n = self.count(14)?;
        let steps = (0..n).map(|_| self.shared_step()).collect::<Decoded<_>>()?;
        Ok(TrialRun {
            steps,
            end,
            observation_crash,
            code,
            judged: None,
        })
    }
    /// A length-prefixed step: the cache's if it has the same bytes, else decoded (the whole
    /// length and nothing more) and remembered.
    fn shared_step(&mut self) -> Decoded<Arc<StepObservation>> {
        let n = self.count(1)?;
        let bytes = self.take(n)?;
        if let Some(known) = self.cache.get(bytes) {
            return Ok(known);
        }
        // A step's own decoder, with no cache: a step holds no steps.
        let mut none = StepCache::default();
        let mut d = Decoder {
            bytes,
            cache: &mut none,
        };
        let step = Arc::new(d.step()?);
        if !d.bytes.is_empty() {
            return Err(format!("{} bytes after a step", d.bytes.len()));
        }
        self.cache.put(bytes, &step);
        Ok(step)
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
        let next_logits = self.option(|d| {
            // A sequence's entry takes at least 8 bytes: its id and a count.
            let n = d.count(8)?;
            (0..n)
                .map(|_| {
                    let seq = d.i32()?;
                    let logits = d.u32s()?.into_iter().map(f32::from_bits).collect();
                    Ok(NextLogits { seq, logits })
                })
                .collect()
        })?;
        let reload_probe = self.option(Self::json)?;
        let sizes = self.option(Self::json)?;
        Ok(StepObservation {
            outcome,
            seqs,
            whole,
            round_trip,
            before,
            logits_probe,
            next_logits,
            reload_probe,
            sizes,
        })
    }
}
