//! The worker's line protocol: one JSON line per request on the worker's stdin, one JSON line
//! per reply on its stdout, and the marker lines on its stderr.
//!
//! Both readers are bounded: a line longer than its direction's limit
//! ([`MAX_REQUEST_LINE_BYTES`], [`MAX_REPLY_LINE_BYTES`]) is not buffered whole but refused with
//! [`WireError::TooLong`], and a line that is not a request or reply is [`WireError::Malformed`]
//! (a request whose traces name a setup or op it does not hold: [`WireError::Invalid`]); neither
//! panics. [`parse_request_line`] and [`parse_reply_line`] are the pure decoders both sides use,
//! public so that a fuzz target can call them; the types they return are opaque outside this
//! crate.

use std::collections::HashMap;
use std::io::{self, BufRead, Write};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::base::cache::{
    CodeCoverage, LogitsProbe, Observation, OpOutcome, ReloadProbe, RoundTrip, SeqObservation,
    StateSizes, StepObservation, TargetInfo,
};
use crate::base::op::{CacheType, MemoryType, Op, Pos, SeqId, Setup, Trace};
use crate::base::state::WholeCell;
use crate::running::runner::{Skipped, TrialEnd, TrialRun};
pub use crate::targets::llama::error::WireError;

/// The longest request line the worker reads: 256 MiB. A request holds each distinct setup and
/// op of a batch once and every trace as a few indices (about 15 bytes per depth-3 trace), so
/// even a batch of millions of long traces stays far below; anything longer is not a request
/// kvaudit wrote.
pub const MAX_REQUEST_LINE_BYTES: usize = 256 << 20;

/// The longest reply line the parent reads: 64 MiB. A reply is one trial's observations: per
/// step and sequence, its positions and cells (a few bytes per cell), so a trial of hundreds of
/// steps over a context of tens of thousands of cells still fits.
pub const MAX_REPLY_LINE_BYTES: usize = 64 << 20;

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

/// One line the worker writes on stdout.
#[doc(hidden)]
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    /// Loaded and ready, with what it runs.
    Ready(TargetInfo),
    /// One trial's run.
    Run(WireRun),
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

/// A [`TrialRun`] as the worker writes it: JSON arrays instead of objects, and the two common
/// outcomes and the common end as short externally tagged variants (serde parses internally
/// tagged enums by buffering them first).
#[doc(hidden)]
#[derive(Debug, Serialize, Deserialize)]
pub struct WireRun(
    Vec<WireStep>,
    WireEnd,
    /// The points of code the trial's ops reached, on a `+cov` build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    Option<CodeCoverage>,
);

/// One sequence of a step: (seq, pos_min, pos_max, cells, second_cells).
type WireSeq = (SeqId, Pos, Pos, Vec<Pos>, Option<Vec<Pos>>);

/// One logits probe: (seq, max_abs_diff, n_tokens, cache, shifted, memory, rolled_back,
/// v_summed_in_f16).
type WireProbe = (SeqId, f32, u32, CacheType, bool, MemoryType, bool, bool);

/// One step: the op's outcome and, per sequence, (seq, pos_min, pos_max, cells, second_cells);
/// then what else was observed (the logits probe, the reload probe, the dumps' sizes; null when
/// absent).
#[derive(Debug, Serialize, Deserialize)]
struct WireStep(
    WireOutcome,
    Vec<WireSeq>,
    Option<Vec<WholeCell>>,
    Option<RoundTrip>,
    Option<Vec<SeqObservation>>,
    #[serde(default)] Option<Vec<WireProbe>>,
    #[serde(default)] Option<Vec<ReloadProbe>>,
    #[serde(default)] Option<StateSizes>,
);

#[derive(Debug, Serialize, Deserialize)]
enum WireOutcome {
    /// [`OpOutcome::Done`].
    D(Option<bool>),
    /// [`OpOutcome::Decoded`].
    R(i32),
    /// Anything else, as is.
    Other(OpOutcome),
}

#[derive(Debug, Serialize, Deserialize)]
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
                    .map(|q| {
                        (
                            q.seq,
                            q.pos_min,
                            q.pos_max,
                            q.cells.clone(),
                            q.second_cells.clone(),
                        )
                    })
                    .collect();
                WireStep(
                    outcome,
                    seqs,
                    st.whole.clone(),
                    st.round_trip.clone(),
                    st.before.clone(),
                    st.logits_probe.as_ref().map(|p| {
                        p.iter()
                            .map(|x| {
                                (
                                    x.seq,
                                    x.max_abs_diff,
                                    x.n_tokens,
                                    x.cache,
                                    x.shifted,
                                    x.memory,
                                    x.rolled_back,
                                    x.v_summed_in_f16,
                                )
                            })
                            .collect()
                    }),
                    st.reload_probe.clone(),
                    st.sizes.clone(),
                )
            })
            .collect();
        let end = match &run.end {
            TrialEnd::Completed => WireEnd::C,
            other => WireEnd::Other(other.clone()),
        };
        WireRun(steps, end, run.code.clone())
    }
}

impl From<WireRun> for TrialRun {
    fn from(WireRun(steps, end, code): WireRun) -> TrialRun {
        let steps = steps
            .into_iter()
            .map(
                |WireStep(outcome, seqs, whole, round_trip, before, probe, reload_probe, sizes)| {
                    let outcome = match outcome {
                        WireOutcome::D(returned) => OpOutcome::Done { returned },
                        WireOutcome::R(rc) => OpOutcome::Decoded { rc },
                        WireOutcome::Other(o) => o,
                    };
                    let seqs = seqs
                        .into_iter()
                        .map(
                            |(seq, pos_min, pos_max, cells, second_cells)| SeqObservation {
                                seq,
                                pos_min,
                                pos_max,
                                cells,
                                second_cells,
                            },
                        )
                        .collect();
                    Arc::new(StepObservation {
                        outcome,
                        seqs,
                        whole,
                        round_trip,
                        before,
                        logits_probe: probe.map(|p| {
                            p.into_iter()
                                .map(
                                    |(
                                        seq,
                                        max_abs_diff,
                                        n_tokens,
                                        cache,
                                        shifted,
                                        memory,
                                        rolled_back,
                                        v_summed_in_f16,
                                    )| LogitsProbe {
                                        seq,
                                        max_abs_diff,
                                        n_tokens,
                                        cache,
                                        shifted,
                                        memory,
                                        rolled_back,
                                        v_summed_in_f16,
                                    },
                                )
                                .collect()
                        }),
                        reload_probe,
                        sizes,
                    })
                },
            )
            .collect();
        let end = match end {
            WireEnd::C => TrialEnd::Completed,
            WireEnd::Other(e) => e,
        };
        TrialRun {
            steps,
            end,
            observation_crash: None,
            code,
        }
    }
}

/// Decodes one request line (with or without its newline) and checks that every trace's
/// indices name a setup and op of the request.
pub fn parse_request_line(bytes: &[u8]) -> Result<Request, WireError> {
    let req: Request = decode("request", bytes, MAX_REQUEST_LINE_BYTES)?;
    req.validate()?;
    Ok(req)
}

/// Decodes one reply line (with or without its newline).
pub fn parse_reply_line(bytes: &[u8]) -> Result<Reply, WireError> {
    decode("reply", bytes, MAX_REPLY_LINE_BYTES)
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

/// Writes one reply line, flushing when asked; false when the parent is gone.
pub(super) fn write_reply(out: &mut impl Write, reply: &Reply, flush: bool) -> bool {
    // The whole line goes to `out` in one write: serialized piece by piece into a buffered
    // writer, a line larger than the buffer's free space was flushed in part, and a child that
    // crashed in its next trial (before the rest was flushed) left half a reply in the pipe,
    // which the parent read as a malformed line (seen on `+cov`, whose replies carry points).
    let mut line = match serde_json::to_vec(reply) {
        Ok(line) => line,
        Err(_) => return false,
    };
    line.push(b'\n');
    out.write_all(&line).is_ok() && (!flush || out.flush().is_ok())
}

/// Fuzz target `worker_wire` (`fuzz/fuzz_targets/worker_wire.rs`, and `tests/it/fuzz_seeds.rs`
/// over its seeds): any bytes, as a request line and as a reply line, decode or fail with a
/// [`WireError`]; every trace of a request that decodes can be filled (its indices were
/// checked), and a run reply that decodes turns into a `TrialRun`. Panics otherwise.
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
    if let Ok(Reply::Run(run)) = parse_reply_line(data) {
        let _ = TrialRun::from(run);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seeds of the `worker_wire` fuzz target (`fuzz/seeds/worker_wire/`) are real lines of
    /// this wire: a request for seed-domain traces, a run reply, a death and an error.
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
        let line = |r: &Reply| {
            let mut v = serde_json::to_vec(r).unwrap();
            v.push(b'\n');
            v
        };
        let seeds = [
            ("gen-request", Request::new(&traces, true, false).to_line()),
            ("gen-reply-run", line(&Reply::Run(WireRun::from(&run)))),
            ("gen-reply-died", line(&Reply::Died(134))),
            ("gen-reply-error", line(&Reply::Error("bad request".into()))),
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
            },
            SeqObservation {
                seq: 1,
                pos_min: -1,
                pos_max: -1,
                cells: vec![],
                second_cells: None,
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
        for run in runs {
            let line = serde_json::to_string(&Reply::Run(WireRun::from(&run))).unwrap();
            match parse_reply_line(line.as_bytes()).unwrap() {
                Reply::Run(w) => assert_eq!(TrialRun::from(w), run),
                other => panic!("{line}: {other:?}"),
            }
        }
    }

    /// A valid line of each direction, as the other side writes it.
    fn valid_lines() -> (Vec<u8>, Vec<u8>) {
        let d = crate::base::domain::Domain::preset("seed").unwrap();
        let trace = Trace {
            setup: d.setup.clone(),
            ops: d.ops()[..3].to_vec(),
        };
        let request = Request::new(&[trace], false, false).to_line();
        let reply = serde_json::to_vec(&Reply::Died(134)).unwrap();
        (request, reply)
    }

    #[test]
    fn a_reply_reaches_the_pipe_whole_or_not_at_all() {
        // What a child leaves in the pipe when it crashes right after a reply it did not
        // flush: whole lines only, however small the buffer against the line.
        let mut out = std::io::BufWriter::with_capacity(16, Vec::new());
        for n in [3, 40, 200] {
            let reply = Reply::Error("x".repeat(n));
            assert!(write_reply(&mut out, &reply, false));
            let in_pipe = out.get_ref();
            assert!(
                in_pipe.is_empty() || in_pipe.ends_with(b"\n"),
                "half a line in the pipe: {:?}",
                String::from_utf8_lossy(in_pipe)
            );
        }
    }

    #[test]
    fn truncated_garbage_and_huge_lines_are_errors_not_panics() {
        let (request, reply) = valid_lines();
        assert!(parse_request_line(&request).is_ok());
        assert!(matches!(parse_reply_line(&reply), Ok(Reply::Died(134))));
        // Every truncation of a valid line is refused (a prefix of JSON is never JSON here).
        for cut in 0..request.len() - 1 {
            let err = parse_request_line(&request[..cut]).unwrap_err();
            assert!(matches!(err, WireError::Malformed { .. }), "{cut}: {err}");
        }
        for cut in 0..reply.len() {
            assert!(parse_reply_line(&reply[..cut]).is_err(), "{cut}");
        }
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
            assert!(parse_reply_line(g).is_err(), "reply {excerpt:?}");
        }
        // An index past the end is the one well-formed request that is still refused.
        let err = parse_request_line(garbage[5]).unwrap_err();
        assert!(err.to_string().contains("no setup 0"), "{err}");
        // Over the limit: refused before decoding, and the message states the limit.
        let huge = vec![b' '; MAX_REPLY_LINE_BYTES + 2];
        let err = parse_reply_line(&huge).unwrap_err();
        assert!(matches!(err, WireError::TooLong { .. }), "{err}");
        assert!(err.to_string().contains(&MAX_REPLY_LINE_BYTES.to_string()));
        let huge = vec![b' '; MAX_REQUEST_LINE_BYTES + 1];
        assert!(matches!(
            parse_request_line(&huge),
            Err(WireError::TooLong { .. })
        ));
        // A malformed line is quoted, but only its start.
        let err = parse_reply_line(&[b'x'; 5000]).unwrap_err().to_string();
        assert!(err.len() < 400, "{}", err.len());
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
