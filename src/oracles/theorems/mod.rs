//! Numerical oracles T1-T3 (shared/seeds/000): bit-exactness theorems about a KV cache's tensors,
//! checked as metamorphic relations on any target that exposes them.
//!
//! - **T1, placement and read-back** ([`t1`]): every K/V row read from the target's serialized
//!   state at (layer, cell, KV head) equals the row an independent reference computes for that
//!   token at that position; a state round trip (serialize, restore into a fresh cache,
//!   serialize) is byte-identical and gives the same next logits.
//! - **T2, eviction == never saw the span** ([`t2`]): removing a span and shifting the survivors
//!   down leaves a cache equal (K/V rows, logits, greedy continuation) to a fresh one that decoded
//!   only the survivors at their new positions, when no survivor attended the span; evicting too
//!   late, or not at all, is not equal.
//! - **T3, window and prefix** ([`t3`]): the sliding window hides exactly the keys whose absolute
//!   position is out of range, so it survives eviction, is a no-op when unset and equals an
//!   explicitly `-inf`-masked reference; reusing a copied prefix and decoding a suffix equals
//!   decoding prefix and suffix fresh.
//!
//! A check returns a [`TheoremJudgement`]: a [`Verdict`] holding the [`Measurement`] (max |Δ| of K, V and
//! logits as f64, greedy token flips, whether the structure matched) and whether it is within the
//! stated [`Tolerance`] (0 for the native target: equality of `f32::to_bits`), or `Unsupported`
//! when the target exposes no rows, logits or restore. A violated theorem is a verdict, never an
//! `Err`; `Err` is the harness breaking.
//!
//! Everything here drives targets only through [`CacheUnderTest`] and reads rows only from the
//! target's own serialized state (through [`crate::base::state`]), so a second target exposing the same
//! observations (llama.cpp: `llama_get_logits_ith`, `llama_state_seq_set_data`) plugs in
//! unchanged. The references ([`reference::Reference`], [`Model::forward_sequence`]) never touch
//! a target. Pairs can be derived from a trace ([`derive_pair`]) for random exploration.
//!
//! [`Model::forward_sequence`]: crate::model::forward::Model::forward_sequence

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::base::cache::{CacheUnderTest, HarnessError, OpOutcome};
use crate::base::op::{Op, Pos, SeqId, Trace};
use crate::base::state::{parse_seq_rows, RowError, StateFormat};

pub use crate::base::state::CellRows;

pub mod pair;
pub mod reference;
pub mod t1;
pub mod t2;
pub mod t3;

pub use pair::{check_pair, check_pair_on, Continuation, Pair};

/// Which theorem of the seed document.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Theorem {
    /// Placement and read-back.
    T1,
    /// Eviction == never saw the span.
    T2,
    /// Window masking by absolute position; prefix reuse == recompute.
    T3,
}

impl Theorem {
    /// Every theorem, in order.
    pub const ALL: [Theorem; 3] = [Theorem::T1, Theorem::T2, Theorem::T3];

    /// The name used in files and on command lines.
    pub fn name(self) -> &'static str {
        match self {
            Theorem::T1 => "T1",
            Theorem::T2 => "T2",
            Theorem::T3 => "T3",
        }
    }

    /// Looks a theorem up by name (`T2`, `t2`).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for Theorem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How far two observations may be apart and still count as equal.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    /// Largest accepted |Δ| of any K, V or logit value; 0 means bit-identical (`f32::to_bits`
    /// equality, so `-0.0` and `0.0` differ).
    pub max_abs_delta: f64,
}

impl Tolerance {
    /// Bit-for-bit: what the native target is held to.
    pub const EXACT: Tolerance = Tolerance { max_abs_delta: 0.0 };

    /// Whether `m` is within this tolerance (and structurally equal, with no token flip).
    pub fn accepts(&self, m: &Measurement) -> bool {
        if !m.structure_equal || m.token_flips > 0 {
            return false;
        }
        if self.max_abs_delta == 0.0 {
            m.bit_identical
        } else {
            m.max_abs_delta() <= self.max_abs_delta
        }
    }
}

/// Which quantity a compared value belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quantity {
    /// A K row.
    K,
    /// A V row.
    V,
    /// Logits.
    Logits,
}

/// What a comparison measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Number of f32 values compared.
    pub values_compared: u64,
    /// Largest |Δ| over compared K values.
    pub k_max_abs_delta: f64,
    /// Largest |Δ| over compared V values.
    pub v_max_abs_delta: f64,
    /// Largest |Δ| over compared logits.
    pub logits_max_abs_delta: f64,
    /// Greedy continuation steps whose token differs (plus any difference in length).
    pub token_flips: usize,
    /// The shapes matched: same resident positions, same op outcomes, same state bytes where
    /// bytes are compared.
    pub structure_equal: bool,
    /// Structure equal and every compared value has the same bits.
    pub bit_identical: bool,
    /// Where the first difference was seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_difference: Option<String>,
}

impl Default for Measurement {
    fn default() -> Self {
        Measurement {
            values_compared: 0,
            k_max_abs_delta: 0.0,
            v_max_abs_delta: 0.0,
            logits_max_abs_delta: 0.0,
            token_flips: 0,
            structure_equal: true,
            bit_identical: true,
            first_difference: None,
        }
    }
}

impl Measurement {
    /// The largest |Δ| of any compared value.
    pub fn max_abs_delta(&self) -> f64 {
        self.k_max_abs_delta
            .max(self.v_max_abs_delta)
            .max(self.logits_max_abs_delta)
    }

    fn note(&mut self, at: impl FnOnce() -> String) {
        if self.first_difference.is_none() {
            self.first_difference = Some(at());
        }
    }

    /// Compares two equally long runs of values of one quantity; `at` names the place of the
    /// first differing value (called at most once per measurement).
    pub fn compare(
        &mut self,
        what: Quantity,
        a: &[f32],
        b: &[f32],
        at: impl FnOnce(usize) -> String,
    ) {
        if a.len() != b.len() {
            let (la, lb) = (a.len(), b.len());
            self.mismatch(|| format!("{} ({la} values vs {lb})", at(0)));
            return;
        }
        let mut first = None;
        let mut max = 0.0f64;
        for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
            if x.to_bits() == y.to_bits() {
                continue;
            }
            first.get_or_insert(i);
            let d = (f64::from(x) - f64::from(y)).abs();
            max = max.max(if d.is_nan() { f64::INFINITY } else { d });
        }
        self.values_compared += a.len() as u64;
        let slot = match what {
            Quantity::K => &mut self.k_max_abs_delta,
            Quantity::V => &mut self.v_max_abs_delta,
            Quantity::Logits => &mut self.logits_max_abs_delta,
        };
        *slot = slot.max(max);
        if let Some(i) = first {
            self.bit_identical = false;
            let (x, y) = (a[i], b[i]);
            self.note(|| format!("{}: {x:e} vs {y:e}", at(i)));
        }
    }

    /// Records a structural difference.
    pub fn mismatch(&mut self, what: impl FnOnce() -> String) {
        self.structure_equal = false;
        self.bit_identical = false;
        self.note(what);
    }

    /// Compares two greedy continuations token by token.
    pub fn tokens(&mut self, a: &[u32], b: &[u32]) {
        let flips = a.iter().zip(b).filter(|(x, y)| x != y).count() + a.len().abs_diff(b.len());
        if flips > 0 {
            self.token_flips += flips;
            self.bit_identical = false;
            self.note(|| format!("greedy continuation {a:?} vs {b:?}"));
        }
    }

    /// Folds another measurement into this one (maxima, sums, first difference kept).
    pub fn absorb(&mut self, o: &Measurement) {
        self.values_compared += o.values_compared;
        self.k_max_abs_delta = self.k_max_abs_delta.max(o.k_max_abs_delta);
        self.v_max_abs_delta = self.v_max_abs_delta.max(o.v_max_abs_delta);
        self.logits_max_abs_delta = self.logits_max_abs_delta.max(o.logits_max_abs_delta);
        self.token_flips += o.token_flips;
        self.structure_equal &= o.structure_equal;
        self.bit_identical &= o.bit_identical;
        if self.first_difference.is_none() {
            self.first_difference = o.first_difference.clone();
        }
    }
}

/// A judged check: what was measured and whether the theorem's relation held.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// The theorem.
    pub theorem: Theorem,
    /// Which check (`placement`, `round trip`, `pair`, ...).
    pub check: String,
    /// Whether the relation held within the tolerance.
    pub holds: bool,
    /// The tolerance judged against.
    pub tolerance: Tolerance,
    /// What was measured.
    pub measurement: Measurement,
}

impl Verdict {
    /// Judges `measurement` against `tolerance`.
    pub fn judge(
        theorem: Theorem,
        check: &str,
        tolerance: Tolerance,
        measurement: Measurement,
    ) -> Self {
        Verdict {
            theorem,
            check: check.into(),
            holds: tolerance.accepts(&measurement),
            tolerance,
            measurement,
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.measurement;
        write!(
            f,
            "{} {}: {} (max|Δ| {:e}: K {:e}, V {:e}, logits {:e}; {} token flip(s); {} values; tolerance {:e})",
            self.theorem,
            self.check,
            if self.holds { "holds" } else { "violated" },
            m.max_abs_delta(),
            m.k_max_abs_delta,
            m.v_max_abs_delta,
            m.logits_max_abs_delta,
            m.token_flips,
            m.values_compared,
            self.tolerance.max_abs_delta
        )?;
        if let Some(d) = &m.first_difference {
            write!(f, "; first difference: {d}")?;
        }
        Ok(())
    }
}

/// A check either judged, or not applicable to the target (neither a pass nor a failure).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "judgement", rename_all = "snake_case")]
pub enum TheoremJudgement {
    /// Measured and judged.
    Judged(Verdict),
    /// The target does not expose what the check needs.
    Unsupported {
        /// Why.
        reason: String,
    },
}

impl fmt::Display for TheoremJudgement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TheoremJudgement::Judged(v) => v.fmt(f),
            TheoremJudgement::Unsupported { reason } => write!(f, "unsupported: {reason}"),
        }
    }
}

/// The resident cells of one sequence with their rows, in position order (cells at one position
/// ordered by their K bits, so equal multisets compare equal whatever the cell layout).
#[derive(Clone, Debug, PartialEq)]
pub struct SeqRows {
    /// The sequence.
    pub seq: SeqId,
    /// Layers in the state (0: the target serializes no tensors).
    pub n_layer: usize,
    /// The cells.
    pub cells: Vec<CellRows>,
}

impl SeqRows {
    /// Builds the canonical (position, then K bits) order.
    pub fn new(seq: SeqId, n_layer: usize, mut cells: Vec<CellRows>) -> Self {
        let key =
            |c: &CellRows| -> Vec<u32> { c.k.iter().flatten().map(|x| x.to_bits()).collect() };
        cells.sort_by(|a, b| a.pos.cmp(&b.pos).then_with(|| key(a).cmp(&key(b))));
        SeqRows {
            seq,
            n_layer,
            cells,
        }
    }

    /// The resident positions, ascending.
    pub fn positions(&self) -> Vec<Pos> {
        self.cells.iter().map(|c| c.pos).collect()
    }
}

/// The cells and rows of `seq` from `llama_state_seq_get_data` bytes (the base cache of an iSWA
/// memory; every stream), decoded by [`crate::base::state::parse_seq_rows`].
pub fn read_seq_rows(seq: SeqId, bytes: &[u8], format: StateFormat) -> Result<SeqRows, RowError> {
    let rows = parse_seq_rows(bytes, format)?;
    Ok(SeqRows::new(seq, rows.n_layer, rows.cells))
}

/// Why a step of a check stopped before the check could judge.
///
/// Exit codes: [`TheoremError::Unsupported`] never leaves a check (it is the judgement
/// [`TheoremJudgement::Unsupported`], neither a pass nor a failure; [`TheoremError::into_judgement`]);
/// where a caller needs every step to run (`kvaudit measure`) it is the harness breaking, exit 3
/// (`HARNESS`), as the other variants always are.
#[derive(Debug, Error)]
pub enum TheoremError {
    /// The target does not expose what the check needs: rows in its state, logits, restore, or
    /// an op of the trace.
    #[error("{reason}")]
    Unsupported {
        /// Why.
        reason: String,
    },
    /// The target's serialized state does not decode to rows.
    #[error("target {target}: state of seq {seq}: {source}")]
    Rows {
        /// Which target.
        target: String,
        /// Which sequence was dumped.
        seq: SeqId,
        /// What did not decode.
        source: RowError,
    },
    /// The target failed.
    #[error(transparent)]
    Harness(#[from] HarnessError),
}

impl TheoremError {
    /// A target's "not supported", as an error of the step that needed it.
    pub fn unsupported(reason: impl Into<String>) -> Self {
        TheoremError::Unsupported {
            reason: reason.into(),
        }
    }

    /// What a check returns for this error: [`TheoremJudgement::Unsupported`], or the harness error
    /// (rows that do not decode keep today's [`HarnessError::Target`] message).
    pub fn into_judgement(self) -> Result<TheoremJudgement, HarnessError> {
        match self {
            TheoremError::Unsupported { reason } => Ok(TheoremJudgement::Unsupported { reason }),
            TheoremError::Rows {
                target,
                seq,
                source,
            } => Err(HarnessError::Target {
                target,
                message: format!("state of seq {seq}: {source}"),
            }),
            TheoremError::Harness(e) => Err(e),
        }
    }
}

/// Reads the rows of `seq` from `target`'s serialized state. A target that serializes no K/V
/// rows for a non-empty sequence is [`TheoremError::Unsupported`].
pub fn target_rows(target: &mut dyn CacheUnderTest, seq: SeqId) -> Result<SeqRows, TheoremError> {
    let format = target.info().state_format;
    let bytes = target.seq_state(seq)?;
    let rows = read_seq_rows(seq, &bytes, format).map_err(|source| TheoremError::Rows {
        target: target.info().name,
        seq,
        source,
    })?;
    if rows.n_layer == 0 && !rows.cells.is_empty() {
        return Err(TheoremError::unsupported(format!(
            "{} serializes no K/V rows",
            target.info().name
        )));
    }
    Ok(rows)
}

/// Judges a check's steps: an unsupported step is the judgement [`TheoremJudgement::Unsupported`].
pub(crate) fn judged(
    r: Result<TheoremJudgement, TheoremError>,
) -> Result<TheoremJudgement, HarnessError> {
    r.or_else(TheoremError::into_judgement)
}

/// Compares the rows of two sequences, K and V per (layer, position, KV head); positions present
/// on one side only are a structural difference. `label` prefixes places in the measurement.
pub fn compare_rows(m: &mut Measurement, a: &SeqRows, b: &SeqRows, head_dim: usize, label: &str) {
    if a.positions() != b.positions() {
        let (pa, pb) = (a.positions(), b.positions());
        m.mismatch(|| format!("{label} seq {}: resident positions {pa:?} vs {pb:?}", a.seq));
    }
    // An empty sequence serializes no tensor section at all, so its layer count says nothing.
    if a.n_layer != b.n_layer && !a.cells.is_empty() && !b.cells.is_empty() {
        let (la, lb) = (a.n_layer, b.n_layer);
        m.mismatch(|| format!("{label} seq {}: {la} layers vs {lb}", a.seq));
        return;
    }
    // Merge-walk by position so that rows at common positions are measured even when the sets
    // differ.
    let (mut i, mut j) = (0, 0);
    while i < a.cells.len() && j < b.cells.len() {
        let (x, y) = (&a.cells[i], &b.cells[j]);
        match x.pos.cmp(&y.pos) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                for l in 0..a.n_layer {
                    for (what, name, ra, rb) in [
                        (Quantity::K, "K", &x.k[l], &y.k[l]),
                        (Quantity::V, "V", &x.v[l], &y.v[l]),
                    ] {
                        let heads = ra.len().max(1).div_ceil(head_dim.max(1));
                        for h in 0..heads {
                            let r = h * head_dim..((h + 1) * head_dim).min(ra.len());
                            let (ha, hb) = (
                                ra.get(r.clone()).unwrap_or(&[]),
                                rb.get(r.clone()).unwrap_or(&[]),
                            );
                            m.compare(what, ha, hb, |d| {
                                format!(
                                    "{label} seq {} layer {l} pos {} kv head {h} {name}[{d}]",
                                    a.seq, x.pos
                                )
                            });
                        }
                    }
                }
                i += 1;
                j += 1;
            }
        }
    }
}

/// Resets `target` to the trace's setup and applies its ops; [`TheoremError::Unsupported`] when
/// the target does not support an op.
pub fn run_trace(
    target: &mut dyn CacheUnderTest,
    trace: &Trace,
) -> Result<Vec<OpOutcome>, TheoremError> {
    target.reset(&trace.setup)?;
    let mut outcomes = Vec::with_capacity(trace.ops.len());
    for op in &trace.ops {
        let o = target.apply(op)?;
        if let OpOutcome::Unsupported { reason } = &o {
            return Err(TheoremError::unsupported(format!("{op}: {reason}")));
        }
        outcomes.push(o);
    }
    Ok(outcomes)
}

/// Decodes one token into `seq` at the next position; its logits. [`TheoremError::Unsupported`]
/// when the decode does not succeed or the target exposes no logits.
pub fn decode_one(
    target: &mut dyn CacheUnderTest,
    seq: SeqId,
    token: u32,
) -> Result<Vec<f32>, TheoremError> {
    let op = Op::Decode(crate::base::op::Decode::tokens(seq, &[token as i32]));
    match target.apply(&op)? {
        OpOutcome::Decoded { rc: 0 } => match target.last_logits()? {
            Some(l) => Ok(l),
            None => Err(TheoremError::unsupported(format!(
                "{} exposes no logits",
                target.info().name
            ))),
        },
        other => Err(TheoremError::unsupported(format!("{op}: {other:?}"))),
    }
}

/// The pair a theorem derives from `trace` for random exploration (`kvaudit fuzz --oracles`):
/// T2 the never-saw partner of its last eviction ([`t2::never_saw_pair`]), T3 the fresh recompute
/// of its last prefix copy ([`t3::prefix_pair`]) or, with a window, the trace without an eviction
/// of keys no later query can see ([`t3::out_of_window_pair`]). `None` when the trace has no such
/// shape or the relation would not have to hold (a survivor saw the span). T1 needs no partner:
/// [`t1::check_placement`] judges any trace.
pub fn derive_pair(theorem: Theorem, trace: &Trace, window: Option<u32>) -> Option<Pair> {
    match theorem {
        Theorem::T1 => None,
        Theorem::T2 => t2::never_saw_pair(trace),
        Theorem::T3 => {
            t3::prefix_pair(trace).or_else(|| window.and_then(|w| t3::out_of_window_pair(trace, w)))
        }
    }
}

/// How a pair was derived from a trace (a theorem may have several derivations).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Derivation {
    /// T2: the never-saw partner of the last eviction ([`t2::never_saw_pair`]).
    NeverSaw,
    /// T3: the fresh recompute of the last prefix copy ([`t3::prefix_pair`]).
    Prefix,
    /// T3 with a window: the trace without its last eviction, of keys no later query can see
    /// ([`t3::out_of_window_pair`]).
    OutOfWindow,
}

impl Derivation {
    /// The name used in reports (as in `tests/data/theorems`).
    pub fn name(self) -> &'static str {
        match self {
            Derivation::NeverSaw => "never_saw",
            Derivation::Prefix => "prefix",
            Derivation::OutOfWindow => "out_of_window",
        }
    }

    /// The derivations of `theorem` (none for T1, which needs no partner).
    pub fn of(theorem: Theorem) -> &'static [Derivation] {
        match theorem {
            Theorem::T1 => &[],
            Theorem::T2 => &[Derivation::NeverSaw],
            Theorem::T3 => &[Derivation::Prefix, Derivation::OutOfWindow],
        }
    }

    /// The pair this derivation gives for `trace` under `window`, if any.
    pub fn derive(self, trace: &Trace, window: Option<u32>) -> Option<Pair> {
        match self {
            Derivation::NeverSaw => t2::never_saw_pair(trace),
            Derivation::Prefix => t3::prefix_pair(trace),
            Derivation::OutOfWindow => window.and_then(|w| t3::out_of_window_pair(trace, w)),
        }
    }
}

impl fmt::Display for Derivation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Every pair `theorem` derives from `trace`, by derivation: [`derive_pair`] stops at the first,
/// while random exploration judges each (a trace may end with both a prefix copy and an
/// out-of-window eviction, and each is a T3 relation of its own).
pub fn derive_pairs(
    theorem: Theorem,
    trace: &Trace,
    window: Option<u32>,
) -> Vec<(Derivation, Pair)> {
    Derivation::of(theorem)
        .iter()
        .filter_map(|&d| d.derive(trace, window).map(|p| (d, p)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measurement_is_bitwise_and_locates_the_difference() {
        let mut m = Measurement::default();
        m.compare(Quantity::K, &[1.0, 2.0], &[1.0, 2.0], |_| "x".into());
        assert!(m.bit_identical && Tolerance::EXACT.accepts(&m));
        m.compare(Quantity::V, &[0.0], &[-0.0], |i| format!("v[{i}]"));
        assert!(!m.bit_identical);
        assert_eq!(m.max_abs_delta(), 0.0);
        assert!(!Tolerance::EXACT.accepts(&m));
        assert!(Tolerance {
            max_abs_delta: 1e-6
        }
        .accepts(&m));
        m.compare(Quantity::Logits, &[1.0], &[1.5], |_| "l".into());
        assert_eq!(m.logits_max_abs_delta, 0.5);
        assert_eq!(m.first_difference.as_deref(), Some("v[0]: 0e0 vs -0e0"));
        m.tokens(&[1, 2, 3], &[1, 4]);
        assert_eq!(m.token_flips, 2);
    }

    #[test]
    fn theorem_names_round_trip() {
        for t in Theorem::ALL {
            assert_eq!(Theorem::from_name(&t.name().to_lowercase()), Some(t));
        }
    }
}
