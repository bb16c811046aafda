//! T1, placement and read-back (shared/seeds/000, Theorem T1; its binding witnesses are
//! `TestStandardLayoutNoOp` and the K/V bit equality of `TestSWAWindowUnsetIsNoOp`).
//!
//! - [`check_placement`]: after every op of a trace, every K/V row the target serializes for
//!   every sequence, at (layer, position, KV head), equals the row of the reference replay
//!   ([`Reference`]: the model over a position-keyed list, no cells), and after every decode the
//!   target's logits equal the reference's. A row written to the wrong head, layer or cell, a key
//!   not re-positioned or re-positioned by a composed rotation, a window read by index: each
//!   shows here as a row that is not the reference's.
//! - [`check_round_trip`]: serialize a sequence, restore it into a fresh cache, serialize again:
//!   the same bytes, and the same logits for the next token.
//! - [`check_paths`]: several traces that decode the same tokens into a sequence from an empty
//!   cache by different paths (one batch; prefill then single-token decodes; ...) each pass
//!   placement, end with logits equal to the cacheless [`Model::forward_sequence`], and leave the
//!   same rows. With the window unset this is the seed's "window unset is a no-op" witness; with a
//!   window, "windowed forward equals the `-inf`-masked reference".

use crate::base::cache::{CacheUnderTest, HarnessError, OpOutcome};
use crate::base::op::{OpKind, SeqId, Setup, Trace};
use crate::model::forward::Model;

use super::reference::Reference;
use super::{
    compare_rows, decode_one, judged, run_trace, target_rows, Measurement, Quantity, SeqRows,
    Theorem, TheoremError, TheoremJudgement, Tolerance, Verdict,
};

/// Runs `trace` on `target` beside the reference and measures every step.
/// [`TheoremError::Unsupported`]: the target cannot show rows or logits, or does not support an
/// op.
pub(crate) fn placement<'m>(
    target: &mut dyn CacheUnderTest,
    trace: &Trace,
    model: &'m Model,
) -> Result<(Measurement, Reference<'m>), TheoremError> {
    let mut m = Measurement::default();
    target.reset(&trace.setup)?;
    let mut reference = Reference::new(&trace.setup, Some(model));
    for op in &trace.setup.ops {
        if let Err(e) = reference.follow(op) {
            m.mismatch(|| format!("setup: the reference cannot follow {op}: {e}"));
        }
    }
    let seqs = trace.observed_seqs();
    let hd = model.hparams().head_dim;
    for (step, op) in trace.ops.iter().enumerate() {
        let outcome = target.apply(op)?;
        if let OpOutcome::Unsupported { reason } = outcome {
            return Err(TheoremError::unsupported(format!("{op}: {reason}")));
        }
        if !outcome.took_effect() {
            continue;
        }
        if let Err(e) = reference.follow(op) {
            m.mismatch(|| format!("step {}: the reference cannot follow {op}: {e}", step + 1));
        }
        let label = format!("after step {} ({op}):", step + 1);
        for &s in &seqs {
            let rows = target_rows(target, s)?;
            compare_rows(&mut m, &rows, &reference.seq_rows(s), hd, &label);
        }
        if op.kind() == OpKind::Decode {
            let Some(logits) = target.last_logits()? else {
                return Err(TheoremError::unsupported(format!(
                    "{} exposes no logits",
                    target.info().name
                )));
            };
            match reference.last_logits() {
                Some(r) => m.compare(Quantity::Logits, &logits, r, |i| {
                    format!("{label} logits[{i}]")
                }),
                None => m.mismatch(|| format!("{label} the reference has no logits")),
            }
        }
    }
    Ok((m, reference))
}

/// T1 placement over `trace` (see the module documentation), judged against `tolerance`.
pub fn check_placement(
    target: &mut dyn CacheUnderTest,
    trace: &Trace,
    model: &Model,
    tolerance: Tolerance,
) -> Result<TheoremJudgement, HarnessError> {
    judge_placement(Theorem::T1, "placement", target, trace, model, tolerance)
}

/// Placement over `trace`, judged as `theorem`'s check `name` (T1 placement; T2's reposition
/// witness is the same measurement).
pub(crate) fn judge_placement(
    theorem: Theorem,
    name: &str,
    target: &mut dyn CacheUnderTest,
    trace: &Trace,
    model: &Model,
    tolerance: Tolerance,
) -> Result<TheoremJudgement, HarnessError> {
    judged(
        placement(target, trace, model)
            .map(|(m, _)| TheoremJudgement::Judged(Verdict::judge(theorem, name, tolerance, m))),
    )
}

/// T1 state round trip: run `trace`, serialize `seq`, decode `probe` into it; then restore the
/// bytes into a fresh cache of the same shape, serialize again (must be the same bytes) and decode
/// `probe` (must give the same logits).
pub fn check_round_trip(
    target: &mut dyn CacheUnderTest,
    trace: &Trace,
    seq: SeqId,
    probe: u32,
    tolerance: Tolerance,
    head_dim: usize,
) -> Result<TheoremJudgement, HarnessError> {
    judged(round_trip(target, trace, seq, probe, tolerance, head_dim))
}

fn round_trip(
    target: &mut dyn CacheUnderTest,
    trace: &Trace,
    seq: SeqId,
    probe: u32,
    tolerance: Tolerance,
    head_dim: usize,
) -> Result<TheoremJudgement, TheoremError> {
    run_trace(target, trace)?;
    let mut m = Measurement::default();
    let before = target.seq_state(seq)?;
    let rows_before = target_rows(target, seq)?;
    let logits_before = decode_one(target, seq, probe)?;
    target.reset(&Setup {
        ops: Vec::new(),
        ..trace.setup.clone()
    })?;
    match target.set_seq_state(seq, &before)? {
        OpOutcome::Done { .. } => {}
        OpOutcome::Unsupported { reason } => return Err(TheoremError::Unsupported { reason }),
        other => {
            m.mismatch(|| format!("restoring the state of seq {seq}: {other:?}"));
            return Ok(TheoremJudgement::Judged(Verdict::judge(
                Theorem::T1,
                "round trip",
                tolerance,
                m,
            )));
        }
    }
    let after = target.seq_state(seq)?;
    if after != before {
        let at = before.iter().zip(&after).position(|(a, b)| a != b);
        let (lb, la) = (before.len(), after.len());
        m.mismatch(|| {
            format!("state bytes differ after the round trip ({lb} vs {la} bytes, first at {at:?})")
        });
    }
    match target_rows(target, seq) {
        Ok(rows_after) => compare_rows(&mut m, &rows_before, &rows_after, head_dim, "round trip:"),
        // Rows vanished after the restore: the logits below still judge the round trip.
        Err(TheoremError::Unsupported { .. }) => {}
        Err(e) => return Err(e),
    }
    match decode_one(target, seq, probe) {
        Ok(l) => m.compare(Quantity::Logits, &logits_before, &l, |i| {
            format!("next logits after the round trip [{i}]")
        }),
        Err(TheoremError::Unsupported { reason }) => {
            m.mismatch(|| format!("decode after the round trip: {reason}"))
        }
        Err(e) => return Err(e),
    }
    Ok(TheoremJudgement::Judged(Verdict::judge(
        Theorem::T1,
        "round trip",
        tolerance,
        m,
    )))
}

/// T1 over several paths to the same sequence (see the module documentation): each trace must
/// decode `seq` from an empty cache and end with a decode into it. `theorem` names the witness in
/// the verdict (T1 for the window-unset no-op, T3 for the masked reference).
pub fn check_paths(
    target: &mut dyn CacheUnderTest,
    traces: &[Trace],
    seq: SeqId,
    model: &Model,
    theorem: Theorem,
    tolerance: Tolerance,
) -> Result<TheoremJudgement, HarnessError> {
    judged(paths(target, traces, seq, model, theorem, tolerance))
}

fn paths(
    target: &mut dyn CacheUnderTest,
    traces: &[Trace],
    seq: SeqId,
    model: &Model,
    theorem: Theorem,
    tolerance: Tolerance,
) -> Result<TheoremJudgement, TheoremError> {
    let mut m = Measurement::default();
    let mut first: Option<SeqRows> = None;
    let hd = model.hparams().head_dim;
    for (i, trace) in traces.iter().enumerate() {
        let (pm, reference) = placement(target, trace, model)?;
        m.absorb(&pm);
        let entries = reference.seq_entries(seq);
        let tokens: Vec<u32> = entries.iter().map(|e| e.token).collect();
        let positions: Vec<i32> = entries.iter().map(|e| e.pos).collect();
        let label = format!("path {i}:");
        match (target.last_logits()?, tokens.is_empty()) {
            (Some(l), false) => {
                let cacheless = model.forward_sequence(&tokens, &positions);
                let last = cacheless.last().expect("non-empty");
                m.compare(Quantity::Logits, &l, last, |j| {
                    format!("{label} last logits vs the cacheless forward [{j}]")
                });
            }
            _ => m.mismatch(|| format!("{label} no logits, or no tokens in seq {seq}")),
        }
        let rows = target_rows(target, seq)?;
        match &first {
            None => first = Some(rows),
            Some(r0) => compare_rows(&mut m, r0, &rows, hd, &format!("path 0 vs {label}")),
        }
    }
    Ok(TheoremJudgement::Judged(Verdict::judge(
        theorem, "paths", tolerance, m,
    )))
}
