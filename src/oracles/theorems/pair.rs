//! Metamorphic pairs: two traces whose observations must match (or, for a negative control, must
//! not). One side's observation is the K/V rows of some sequences read from the target's
//! serialized state, the logits right after the trace, and a greedy continuation: decode a first
//! token (given, or the argmax of those logits), then `n` argmax tokens, recording each step's
//! logits.

use serde::{Deserialize, Serialize};

use crate::base::cache::{CacheUnderTest, HarnessError, OpOutcome};
use crate::base::op::{SeqId, Trace};
use crate::model::forward::argmax;

use super::{
    compare_rows, decode_one, judged, run_trace, target_rows, Measurement, Quantity, SeqRows,
    Theorem, TheoremError, TheoremJudgement, Tolerance, Verdict,
};

/// A greedy continuation after the trace, in `seq`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Continuation {
    /// The sequence to continue, on the left and right side.
    pub seqs: (SeqId, SeqId),
    /// The first token to decode; `None`: the argmax of each side's logits after the trace.
    pub first: Option<u32>,
    /// Greedy tokens decoded after the first.
    pub n: usize,
}

/// Two traces whose observations must match.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pair {
    /// The theorem the pair witnesses.
    pub theorem: Theorem,
    /// The trace under test.
    pub left: Trace,
    /// Its partner.
    pub right: Trace,
    /// Sequences whose rows are compared: left's `.0` against right's `.1`.
    pub rows: Vec<(SeqId, SeqId)>,
    /// Compare the logits right after the two traces (each side's last decode).
    pub last_logits: bool,
    /// A greedy continuation on both sides.
    pub continuation: Option<Continuation>,
}

/// What one side showed.
#[derive(Clone, Debug, PartialEq)]
pub struct SideObservation {
    /// What each op of the trace did.
    pub outcomes: Vec<OpOutcome>,
    /// Rows of the requested sequences.
    pub rows: Vec<SeqRows>,
    /// Logits after the trace.
    pub last_logits: Option<Vec<f32>>,
    /// The continuation: each decoded token and the logits it produced.
    pub continuation: Vec<(u32, Vec<f32>)>,
    /// Why the continuation stopped early, if it did.
    pub continuation_stopped: Option<String>,
}

/// Runs `trace` on `target` and observes it. [`TheoremError::Unsupported`]: the target cannot
/// show what is asked (no rows in its state, no logits, an unsupported op).
pub fn observe_side(
    target: &mut dyn CacheUnderTest,
    trace: &Trace,
    rows: &[SeqId],
    continuation: Option<(SeqId, Option<u32>, usize)>,
) -> Result<SideObservation, TheoremError> {
    let outcomes = run_trace(target, trace)?;
    let seq_rows = rows
        .iter()
        .map(|&s| target_rows(target, s))
        .collect::<Result<Vec<_>, _>>()?;
    let last_logits = target.last_logits()?;
    let mut steps = Vec::new();
    let mut stopped = None;
    if let Some((seq, first, n)) = continuation {
        let mut token = match (first, &last_logits) {
            (Some(t), _) => Some(t),
            (None, Some(l)) => Some(argmax(l)),
            (None, None) => {
                return Err(TheoremError::unsupported(format!(
                    "{} exposes no logits to continue from",
                    target.info().name
                )))
            }
        };
        for _ in 0..=n {
            let Some(t) = token else { break };
            match decode_one(target, seq, t) {
                Ok(l) => {
                    token = Some(argmax(&l));
                    steps.push((t, l));
                }
                Err(TheoremError::Unsupported { reason }) => {
                    if target.last_logits()?.is_none() {
                        return Err(TheoremError::Unsupported { reason });
                    }
                    stopped = Some(reason);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(SideObservation {
        outcomes,
        rows: seq_rows,
        last_logits,
        continuation: steps,
        continuation_stopped: stopped,
    })
}

/// Measures one pair's two observations against each other. `head_dim` locates differences.
pub fn measure(
    a: &SideObservation,
    b: &SideObservation,
    pair: &Pair,
    head_dim: usize,
) -> Measurement {
    let mut m = Measurement::default();
    for (ra, rb) in a.rows.iter().zip(&b.rows) {
        compare_rows(&mut m, ra, rb, head_dim, "rows:");
    }
    if pair.last_logits {
        match (&a.last_logits, &b.last_logits) {
            (Some(x), Some(y)) => m.compare(Quantity::Logits, x, y, |i| {
                format!("logits after the trace [{i}]")
            }),
            (x, y) => {
                let (x, y) = (x.is_some(), y.is_some());
                m.mismatch(|| format!("logits after the trace present: {x} vs {y}"))
            }
        }
    }
    for (step, ((ta, la), (tb, lb))) in a.continuation.iter().zip(&b.continuation).enumerate() {
        if ta != tb {
            break; // from here on the contexts differ; the flip is counted below
        }
        m.compare(Quantity::Logits, la, lb, |i| {
            format!("continuation step {step} (token {ta}) logits[{i}]")
        });
    }
    let ta: Vec<u32> = a.continuation.iter().map(|s| s.0).collect();
    let tb: Vec<u32> = b.continuation.iter().map(|s| s.0).collect();
    m.tokens(&ta, &tb);
    if a.continuation_stopped != b.continuation_stopped {
        let (x, y) = (
            a.continuation_stopped.clone(),
            b.continuation_stopped.clone(),
        );
        m.mismatch(|| format!("continuation stopped: {x:?} vs {y:?}"));
    }
    m
}

/// Observes side `i` (0: left, 1: right) of `pair` on `target`.
fn observe_pair_side(
    target: &mut dyn CacheUnderTest,
    pair: &Pair,
    i: usize,
) -> Result<SideObservation, TheoremError> {
    let pick = |s: (SeqId, SeqId)| if i == 0 { s.0 } else { s.1 };
    let rows: Vec<SeqId> = pair.rows.iter().map(|&r| pick(r)).collect();
    let cont = pair
        .continuation
        .as_ref()
        .map(|c| (pick(c.seqs), c.first, c.n));
    let trace = if i == 0 { &pair.left } else { &pair.right };
    observe_side(target, trace, &rows, cont)
}

fn judge(
    pair: &Pair,
    a: &SideObservation,
    b: &SideObservation,
    tolerance: Tolerance,
    head_dim: usize,
) -> TheoremJudgement {
    let m = measure(a, b, pair, head_dim);
    TheoremJudgement::Judged(Verdict::judge(pair.theorem, "pair", tolerance, m))
}

/// Runs both sides of `pair` on one target, one after the other, and judges them against
/// `tolerance`. `head_dim` locates differences by KV head.
pub fn check_pair(
    target: &mut dyn CacheUnderTest,
    pair: &Pair,
    tolerance: Tolerance,
    head_dim: usize,
) -> Result<TheoremJudgement, HarnessError> {
    let sides = both_sides(|i| observe_pair_side(target, pair, i));
    judged(sides.map(|(a, b)| judge(pair, &a, &b, tolerance, head_dim)))
}

/// Runs the left side on `left` and the right side on `right` (two configurations of a target,
/// e.g. with and without a window), and judges them.
pub fn check_pair_on(
    left: &mut dyn CacheUnderTest,
    right: &mut dyn CacheUnderTest,
    pair: &Pair,
    tolerance: Tolerance,
    head_dim: usize,
) -> Result<TheoremJudgement, HarnessError> {
    let sides = both_sides(|i| match i {
        0 => observe_pair_side(left, pair, 0),
        _ => observe_pair_side(right, pair, 1),
    });
    judged(sides.map(|(a, b)| judge(pair, &a, &b, tolerance, head_dim)))
}

/// Observes side 0, then side 1. A harness error stops at once; an unsupported left side still
/// lets the right one run (whose harness error then wins), and is the reason given otherwise.
fn both_sides(
    mut side: impl FnMut(usize) -> Result<SideObservation, TheoremError>,
) -> Result<(SideObservation, SideObservation), TheoremError> {
    let a = match side(0) {
        Err(e) if !matches!(e, TheoremError::Unsupported { .. }) => return Err(e),
        a => a,
    };
    let b = side(1);
    match (a, b) {
        (_, Err(e)) if !matches!(e, TheoremError::Unsupported { .. }) => Err(e),
        (Err(e), _) | (_, Err(e)) => Err(e),
        (Ok(a), Ok(b)) => Ok((a, b)),
    }
}
