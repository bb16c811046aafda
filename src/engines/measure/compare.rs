//! One side of an experiment and how two sides differ: running a trace and reading its rows from
//! serialized state ([`run_side`]), the native forward pass's rows ([`native_prefill`]), and the
//! largest |Δ| of rows and logits with where it is ([`MaxAbs`]).

use std::ops::Range;

use crate::base::cache::CacheUnderTest;
use crate::base::op::{Pos, SeqId, Trace};
use crate::model::forward::{argmax, Model, VecKvStore};
use crate::oracles::theorems::{decode_one, read_seq_rows, run_trace, CellRows, SeqRows};

use super::MeasureError;

/// The largest |Δ| over compared values, and where.
#[derive(Clone, Debug, Default)]
pub(super) struct MaxAbs {
    pub(super) value: f64,
    at: Option<String>,
    compared: u64,
    differing: u64,
}

impl MaxAbs {
    pub(super) fn update(&mut self, a: &[f32], b: &[f32], place: impl Fn(usize) -> String) {
        for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
            self.compared += 1;
            if x.to_bits() == y.to_bits() {
                continue;
            }
            self.differing += 1;
            let d = (f64::from(x) - f64::from(y)).abs();
            let d = if d.is_nan() { f64::INFINITY } else { d };
            if self.at.is_none() || d > self.value {
                self.value = d;
                self.at = Some(format!("{}: {x:e} vs {y:e}", place(i)));
            }
        }
    }

    pub(super) fn detail(&self) -> String {
        match &self.at {
            None => format!("all {} values bit-identical", self.compared),
            Some(at) => format!(
                "largest at {at}; {} of {} values differ",
                self.differing, self.compared
            ),
        }
    }
}

/// K and V differences between two sequences' rows, over common positions.
pub(super) struct RowsDiff {
    pub(super) k: MaxAbs,
    pub(super) v: MaxAbs,
    pub(super) positions_equal: bool,
    pub(super) positions: (Vec<Pos>, Vec<Pos>),
}

pub(super) fn diff_rows(
    a: &SeqRows,
    b: &SeqRows,
    head_dim: usize,
    layers: Range<usize>,
) -> RowsDiff {
    let mut k = MaxAbs::default();
    let mut v = MaxAbs::default();
    let by_pos = |rows: &SeqRows, p: Pos| rows.cells.iter().find(|c| c.pos == p).cloned();
    for x in &a.cells {
        let Some(y) = by_pos(b, x.pos) else { continue };
        for l in layers.clone() {
            if l >= x.k.len() || l >= y.k.len() {
                continue;
            }
            for (acc, ra, rb) in [(&mut k, &x.k[l], &y.k[l]), (&mut v, &x.v[l], &y.v[l])] {
                acc.update(ra, rb, |i| {
                    format!(
                        "layer {l} pos {} kv head {} dim {}",
                        x.pos,
                        i / head_dim,
                        i % head_dim
                    )
                });
            }
        }
    }
    RowsDiff {
        k,
        v,
        positions_equal: a.positions() == b.positions(),
        positions: (a.positions(), b.positions()),
    }
}

/// The native forward pass's rows for `tokens` at positions 0.., as [`SeqRows`], and the logits
/// of the last token.
pub(super) fn native_prefill(model: &Model, tokens: &[i32]) -> (SeqRows, Vec<f32>) {
    let mut kv = VecKvStore::for_model(model);
    let toks: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
    let positions: Vec<Pos> = (0..tokens.len() as Pos).collect();
    let logits = model.forward_tokens(&toks, &positions, &mut kv);
    let n_layer = model.hparams().n_layer;
    let cells = (0..tokens.len())
        .map(|j| CellRows {
            pos: kv.positions(0)[j],
            k: (0..n_layer).map(|l| kv.k(l, j).to_vec()).collect(),
            v: (0..n_layer).map(|l| kv.v(l, j).to_vec()).collect(),
        })
        .collect();
    (
        SeqRows::new(0, n_layer, cells),
        logits.last().cloned().unwrap_or_default(),
    )
}

/// What one side of a pair showed: the rows of the observed sequence (its resident cells), the
/// logits after the trace, and the greedy continuation.
pub(super) struct Side {
    pub(super) rows: SeqRows,
    pub(super) logits: Vec<f32>,
    pub(super) greedy: Vec<u32>,
}

/// Runs `trace` (every op must take effect), reads `seq`'s rows and the last logits, then decodes
/// `n_greedy` argmax tokens into `seq`.
pub(super) fn run_side(
    target: &mut dyn CacheUnderTest,
    trace: &Trace,
    seq: SeqId,
    n_greedy: usize,
) -> Result<Side, MeasureError> {
    let name = target.info().name;
    let outcomes = run_trace(target, trace).map_err(|e| {
        MeasureError::from_step(e, |source| MeasureError::Side {
            target: name.clone(),
            source,
        })
    })?;
    for (op, o) in trace.ops.iter().zip(&outcomes) {
        if !o.took_effect() {
            return Err(MeasureError::NoEffect {
                label: name,
                what: op.to_string(),
                outcome: o.clone(),
            });
        }
    }
    let format = target.info().state_format;
    let bytes = target.seq_state(seq)?;
    let rows = read_seq_rows(seq, &bytes, format).map_err(|source| MeasureError::Rows {
        target: name.clone(),
        seq,
        source,
    })?;
    let logits = target
        .last_logits()?
        .ok_or_else(|| MeasureError::NoLogits {
            target: name.clone(),
        })?;
    let mut greedy = Vec::with_capacity(n_greedy);
    let mut l = logits.clone();
    for _ in 0..n_greedy {
        let t = argmax(&l);
        greedy.push(t);
        l = decode_one(target, seq, t).map_err(|e| {
            MeasureError::from_step(e, |source| MeasureError::Greedy {
                target: name.clone(),
                source,
            })
        })?;
    }
    Ok(Side {
        rows,
        logits,
        greedy,
    })
}

/// Token positions that differ (plus any difference in length), and the first one.
pub(super) fn flips(a: &[u32], b: &[u32]) -> (usize, Option<usize>) {
    let n = a.iter().zip(b).filter(|(x, y)| x != y).count() + a.len().abs_diff(b.len());
    let first = a
        .iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or((a.len() != b.len()).then_some(a.len().min(b.len())));
    (n, first)
}

pub(super) fn logits_diff(a: &[f32], b: &[f32]) -> MaxAbs {
    let mut m = MaxAbs::default();
    m.update(a, b, |i| format!("logit {i}"));
    m
}

pub(super) fn greedy_detail(a: &[u32], b: &[u32], first: Option<usize>) -> String {
    match first {
        None => format!("both {a:?}"),
        Some(i) => format!("first flip at step {i}: {a:?} vs {b:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::traces::{t2_fresh_trace, t2_never_saw_trace};
    use super::*;
    use crate::targets::native_tensor::NativeTensorTarget;

    #[test]
    fn the_native_cache_passes_t2_never_saw_bit_for_bit() {
        let model = NativeTensorTarget::default_model(None).unwrap();
        let mut t = NativeTensorTarget::new(model, Default::default());
        let a = run_side(&mut t, &t2_never_saw_trace(), 0, 4).unwrap();
        let b = run_side(&mut t, &t2_fresh_trace(), 0, 4).unwrap();
        assert_eq!(a.rows.positions(), (0..9).collect::<Vec<_>>());
        let d = diff_rows(&a.rows, &b.rows, 16, 0..2);
        assert_eq!((d.k.differing, d.v.differing), (0, 0), "{}", d.k.detail());
        assert_eq!(logits_diff(&a.logits, &b.logits).differing, 0);
        assert_eq!(a.greedy, b.greedy);
    }
}
