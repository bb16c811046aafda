//! The numerical oracles T1-T3 (shared/seeds/000) measured on a real llama.cpp build, where
//! bit-exactness is not promised: every figure is a measured value next to a stated tolerance, and
//! each is checked against the `[[measurement]]` predictions of PREREG.md (written before any was
//! taken).
//!
//! [`measure_pin`] builds (or finds) a pin, opens one llama.cpp context per experiment side (F32 K
//! and V cache types, flash attention off, one thread, a unified KV stream, `n_seq_max` 2, `n_ctx`
//! 256) and runs, on the fixed prompt [`prompt`] (12 tokens, [`crate::base::op::default_token`] 0..12,
//! positions 0..11):
//!
//! - **T1**: a full-state round trip (`llama_state_get_data`, `llama_state_set_data` into a fresh
//!   context, get again: the same bytes? the same next logits?); the K and V rows of
//!   `llama_state_seq_get_data` against the native forward pass ([`Model::forward_tokens`] over a
//!   [`VecKvStore`]) per (layer, position, KV head); the last logits against the native ones.
//! - **T2**: a context shift (`seq_rm` of the span [4, 8), `seq_add` of the survivors by -4, one
//!   more decode so llama.cpp applies its K-shift) against a fresh context that decoded only the
//!   survivors at their new positions: K and V rows, logits, a 32-token greedy continuation. Two
//!   variants (see [`t2_never_saw_trace`] and [`t2_too_late_trace`]): one where the survivors never
//!   attended the span (the theorem's precondition; the PREREG quantities), one where they did (the
//!   plain context shift of a prompt decoded in one batch; a control, expected to differ). Both
//!   also run on the native tensor cache ([`NativeTensorTarget`]), which re-positions each key by
//!   one rotation of its pre-RoPE row, for contrast.
//! - **T3**: a prefix splice (`seq_cp` of the first 8 tokens to seq 1, 4 suffix tokens decoded
//!   there) against a fresh prefill of prefix + suffix: logits, rows, 8-token greedy, cache length.
//!
//! Experiments drive both targets through [`CacheUnderTest`] (a private adapter opens llama.cpp
//! contexts with the F32 parameters) and read rows only from serialized state, through
//! [`crate::oracles::theorems::read_seq_rows`] (which undoes llama.cpp's transposed V).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};

use crate::base::op::{default_token, Decode, Op, Pos, SeqId, Setup, Trace};
use crate::base::state::StateFormat;
use crate::base::target::{CacheUnderTest, HarnessError};
use crate::model::forward::{argmax, Model, VecKvStore};
use crate::oracles::theorems::{
    decode_one, read_seq_rows, run_trace, CellRows, SeqRows, TheoremError,
};
use crate::records::prereg::MeasurementPrediction;
use crate::targets::llama::build::{ensure_built, BuildSpec, BuiltShim};
use crate::targets::llama::ffi::{LlamaContext, LlamaShim};
use crate::targets::llama::pins::Pin;
use crate::targets::llama::target::{LlamaTarget, ResetMode};
use crate::targets::native_tensor::NativeTensorTarget;

/// `ggml_type` id of F32, the K and V cache type of every context here.
pub const GGML_TYPE_F32: u32 = 0;

/// Context size of every experiment.
pub const N_CTX: u32 = 256;

/// Sequences of every context (T3 uses seq 1).
pub const N_SEQ_MAX: u32 = 2;

/// Tokens in the prompt.
pub const PROMPT_LEN: usize = 12;

/// The span T2 evicts, `[p0, p1)`.
pub const T2_SPAN: (Pos, Pos) = (4, 8);

/// Greedy tokens after T2's shift.
pub const T2_GREEDY: usize = 32;

/// Prompt tokens T3 copies to seq 1.
pub const T3_PREFIX: usize = 8;

/// Suffix tokens T3 decodes after the prefix.
pub const T3_SUFFIX: usize = 4;

/// Greedy tokens after T3's suffix.
pub const T3_GREEDY: usize = 8;

/// The prompt: `default_token(0..12)` = 12, 49, 23, 60, 34, 8, 45, 19, 56, 30, 4, 41.
pub fn prompt() -> Vec<i32> {
    (0..PROMPT_LEN as u32).map(default_token).collect()
}

/// The token decoded after the prompt (T1's round-trip probe) and after T2's shift:
/// `default_token(12)` = 15.
pub fn extra_token() -> i32 {
    default_token(PROMPT_LEN as u32)
}

/// T3's suffix: `default_token(12..16)` = 15, 52, 26, 63.
pub fn suffix() -> Vec<i32> {
    (PROMPT_LEN as u32..(PROMPT_LEN + T3_SUFFIX) as u32)
        .map(default_token)
        .collect()
}

fn setup() -> Setup {
    Setup {
        n_ctx: N_CTX,
        n_seq_max: N_SEQ_MAX,
        ops: Vec::new(),
    }
}

fn decode(seq: SeqId, tokens: &[i32], pos: Option<Pos>) -> Op {
    Op::Decode(Decode {
        pos,
        ..Decode::tokens(seq, tokens)
    })
}

/// The T2 survivors: the prompt without the span (A = tokens 0..4, B = tokens 8..12).
fn survivors() -> Vec<i32> {
    let p = prompt();
    let (s0, s1) = (T2_SPAN.0 as usize, T2_SPAN.1 as usize);
    p[..s0].iter().chain(&p[s1..]).copied().collect()
}

/// T2, the survivors never saw the span (the theorem's precondition). A and B are decoded first,
/// together, at positions 0..7, exactly as the fresh partner decodes them; B is moved up by 4
/// (`seq_add`); A is shared with seq 1, where the span S (prompt tokens 4..8) is decoded at 4..7
/// (this decode applies B's +4 K-shift); S is copied into seq 0 and seq 1 dropped. Seq 0 now
/// holds the 12-token prompt A S B at 0..11, and B never attended S. Then the context shift:
/// `seq_rm(0, 4, 8)`, `seq_add(0, 8, -1, -4)`, and the extra token, whose decode applies B's -4
/// K-shift. In exact arithmetic seq 0 equals the partner's; in llama.cpp B's keys are its
/// prefill keys rotated by +4 and then by -4, each rotation composed onto the rotated row.
pub fn t2_never_saw_trace() -> Trace {
    let p = prompt();
    let (s0, s1) = T2_SPAN;
    let span = s1 - s0;
    Trace {
        setup: setup(),
        ops: vec![
            decode(0, &survivors(), Some(0)),
            Op::SeqAdd {
                seq: 0,
                p0: s0,
                p1: -1,
                delta: span,
            },
            Op::SeqCp {
                src: 0,
                dst: 1,
                p0: 0,
                p1: s0,
            },
            decode(1, &p[s0 as usize..s1 as usize], Some(s0)),
            Op::SeqCp {
                src: 1,
                dst: 0,
                p0: s0,
                p1: s1,
            },
            Op::SeqRm {
                seq: 1,
                p0: -1,
                p1: -1,
            },
            Op::SeqRm {
                seq: 0,
                p0: s0,
                p1: s1,
            },
            Op::SeqAdd {
                seq: 0,
                p0: s1,
                p1: -1,
                delta: -span,
            },
            decode(0, &[extra_token()], None),
        ],
    }
}

/// T2, the plain context shift: the prompt decoded in one batch at 0..11, `seq_rm(0, 4, 8)`,
/// `seq_add(0, 8, -1, -4)`, the extra token. The survivors B attended the span before it was
/// evicted, so from layer 1 on their rows are not those of a context that never saw it (the seed's
/// "span-exact, not retroactive"): a control, expected to differ. Layer 0's K rows depend on the
/// token and the position only, so there they measure one composed rotation (-4 onto the row
/// rotated at 8..11).
pub fn t2_too_late_trace() -> Trace {
    let (s0, s1) = T2_SPAN;
    Trace {
        setup: setup(),
        ops: vec![
            decode(0, &prompt(), Some(0)),
            Op::SeqRm {
                seq: 0,
                p0: s0,
                p1: s1,
            },
            Op::SeqAdd {
                seq: 0,
                p0: s1,
                p1: -1,
                delta: -(s1 - s0),
            },
            decode(0, &[extra_token()], None),
        ],
    }
}

/// T2's partner: a fresh context that decodes the survivors at 0..7 in one batch, then the extra
/// token at 8.
pub fn t2_fresh_trace() -> Trace {
    Trace {
        setup: setup(),
        ops: vec![
            decode(0, &survivors(), Some(0)),
            decode(0, &[extra_token()], None),
        ],
    }
}

/// T3: the prompt decoded into seq 0 at 0..11, its first 8 tokens copied to seq 1
/// (`seq_cp(0, 1, 0, 8)`), the suffix decoded into seq 1 at 8..11. Observed: seq 1.
pub fn t3_splice_trace() -> Trace {
    Trace {
        setup: setup(),
        ops: vec![
            decode(0, &prompt(), Some(0)),
            Op::SeqCp {
                src: 0,
                dst: 1,
                p0: 0,
                p1: T3_PREFIX as Pos,
            },
            decode(1, &suffix(), None),
        ],
    }
}

/// T3's partner: prefix and suffix decoded fresh into seq 0 in one batch at 0..11.
pub fn t3_fresh_trace() -> Trace {
    let mut tokens = prompt()[..T3_PREFIX].to_vec();
    tokens.extend(suffix());
    Trace {
        setup: setup(),
        ops: vec![decode(0, &tokens, Some(0))],
    }
}

/// What a figure is held to.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// `value <= x`.
    AtMost(f64),
    /// `value == x` (yes/no quantities measure 1 or 0).
    Is(f64),
    /// A control: expected to differ, held to nothing.
    Control,
}

impl Bound {
    /// Whether `value` is within the bound (`None` for a control).
    pub fn accepts(&self, value: f64) -> Option<bool> {
        match *self {
            Bound::AtMost(x) => Some(value <= x),
            Bound::Is(x) => Some(value == x),
            Bound::Control => None,
        }
    }

    fn text(&self) -> String {
        match *self {
            Bound::AtMost(0.0) => "= 0 (bit-exact)".into(),
            Bound::AtMost(x) => format!("<= {x:e}"),
            Bound::Is(x) => format!("= {x}"),
            Bound::Control => "control (none)".into(),
        }
    }
}

/// One measured quantity.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// The quantity's name (PREREG.md spells predicted ones the same way).
    pub quantity: String,
    /// Which experiment measured it.
    pub experiment: String,
    /// The value: a max |Δ|, a count, or 1/0 for yes/no.
    pub value: f64,
    /// The stated tolerance.
    pub tolerance: Bound,
    /// Whether the value is within it (`None` for a control).
    pub within: Option<bool>,
    /// Where the largest difference is, how many values differ, the tokens, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// One side of a T2 or T3 pair, or the native reference of T1.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Experiment {
    /// Its name (the prefix of its figures).
    pub name: String,
    /// What it does and why.
    pub about: String,
    /// The ops on the context under test, in llama.h terms.
    pub under_test: Vec<String>,
    /// The ops of the fresh partner, if any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partner: Vec<String>,
}

/// A PREREG.md prediction checked against a figure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PredictionRow {
    /// The quantity.
    pub quantity: String,
    /// The prediction, as written.
    pub predicted: String,
    /// The measured value (`None`: this run has no such figure).
    pub measured: Option<f64>,
    /// Whether it held (`false` when nothing was measured).
    pub confirmed: bool,
}

/// The model the contexts ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSummary {
    /// The GGUF file's name (the generated tiny model's name holds a hash of its bytes).
    pub file: String,
    /// SHA-256 of the file.
    pub sha256: String,
    /// Layers.
    pub n_layer: usize,
    /// Residual width.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Vocabulary.
    pub n_vocab: usize,
}

/// The llama.cpp context parameters of every experiment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContextSummary {
    /// `n_ctx`.
    pub n_ctx: u32,
    /// `n_seq_max`.
    pub n_seq_max: u32,
    /// `n_threads`.
    pub n_threads: u32,
    /// `kv_unified`.
    pub kv_unified: bool,
    /// Flash attention (`off`).
    pub flash_attn: String,
    /// K cache type.
    pub type_k: String,
    /// V cache type.
    pub type_v: String,
}

/// Everything one `kvaudit measure` run found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MeasureReport {
    /// The pin label, e.g. `llama.cpp@0.1.161`.
    pub target: String,
    /// The shim's version string.
    pub shim_version: String,
    /// `LLAMA_STATE_SEQ_VERSION` of the pin.
    pub state_seq_version: i32,
    /// The model.
    pub model: ModelSummary,
    /// The context parameters.
    pub context: ContextSummary,
    /// The prompt (token ids at positions 0..).
    pub prompt: Vec<i32>,
    /// The experiments, in order.
    pub experiments: Vec<Experiment>,
    /// Every measured figure.
    pub figures: Vec<Figure>,
    /// PREREG.md predictions for this target, against the figures.
    #[serde(default)]
    pub predictions: Vec<PredictionRow>,
}

/// The largest |Δ| over compared values, and where.
#[derive(Clone, Debug, Default)]
struct MaxAbs {
    value: f64,
    at: Option<String>,
    compared: u64,
    differing: u64,
}

impl MaxAbs {
    fn update(&mut self, a: &[f32], b: &[f32], place: impl Fn(usize) -> String) {
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

    fn detail(&self) -> String {
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
struct RowsDiff {
    k: MaxAbs,
    v: MaxAbs,
    positions_equal: bool,
    positions: (Vec<Pos>, Vec<Pos>),
}

fn diff_rows(a: &SeqRows, b: &SeqRows, head_dim: usize, layers: Range<usize>) -> RowsDiff {
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
fn native_prefill(model: &Model, tokens: &[i32]) -> (SeqRows, Vec<f32>) {
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
struct Side {
    rows: SeqRows,
    logits: Vec<f32>,
    greedy: Vec<u32>,
}

/// Runs `trace` (every op must take effect), reads `seq`'s rows and the last logits, then decodes
/// `n_greedy` argmax tokens into `seq`.
fn run_side(
    target: &mut dyn CacheUnderTest,
    trace: &Trace,
    seq: SeqId,
    n_greedy: usize,
) -> Result<Side, String> {
    let name = target.info().name;
    let fail = |m: String| format!("{name}: {m}");
    let outcomes = run_trace(target, trace).map_err(|e| match e {
        TheoremError::Harness(h) => h.to_string(),
        other => fail(other.to_string()),
    })?;
    for (op, o) in trace.ops.iter().zip(&outcomes) {
        if !o.took_effect() {
            return Err(fail(format!("{op} did not take effect: {o:?}")));
        }
    }
    let format = target.info().state_format;
    let bytes = target.seq_state(seq).map_err(|e| e.to_string())?;
    let rows = read_seq_rows(seq, &bytes, format).map_err(|e| fail(format!("seq {seq}: {e}")))?;
    let logits = target
        .last_logits()
        .map_err(|e| e.to_string())?
        .ok_or_else(|| fail("no logits".into()))?;
    let mut greedy = Vec::with_capacity(n_greedy);
    let mut l = logits.clone();
    for _ in 0..n_greedy {
        let t = argmax(&l);
        greedy.push(t);
        l = decode_one(target, seq, t).map_err(|e| match e {
            TheoremError::Harness(h) => h.to_string(),
            other => fail(format!("greedy decode: {other}")),
        })?;
    }
    Ok(Side {
        rows,
        logits,
        greedy,
    })
}

/// Token positions that differ (plus any difference in length), and the first one.
fn flips(a: &[u32], b: &[u32]) -> (usize, Option<usize>) {
    let n = a.iter().zip(b).filter(|(x, y)| x != y).count() + a.len().abs_diff(b.len());
    let first = a
        .iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or((a.len() != b.len()).then_some(a.len().min(b.len())));
    (n, first)
}

fn logits_diff(a: &[f32], b: &[f32]) -> MaxAbs {
    let mut m = MaxAbs::default();
    m.update(a, b, |i| format!("logit {i}"));
    m
}

/// Collects figures as they are measured.
struct Figures {
    figures: Vec<Figure>,
}

impl Figures {
    fn push(
        &mut self,
        quantity: &str,
        experiment: &str,
        value: f64,
        tolerance: Bound,
        detail: Option<String>,
    ) {
        self.figures.push(Figure {
            quantity: quantity.into(),
            experiment: experiment.into(),
            value,
            tolerance,
            within: tolerance.accepts(value),
            detail,
        });
    }

    fn flag(&mut self, quantity: &str, experiment: &str, yes: bool, detail: Option<String>) {
        self.push(
            quantity,
            experiment,
            f64::from(u8::from(yes)),
            Bound::Is(1.0),
            detail,
        );
    }
}

// Stated tolerances (the issue's, before measuring). A rotation compiled with fused multiply-adds
// differs from an unfused one by a few ulps of values of order 1, hence 1e-5 for rows; logits
// compound that through two layers, hence the issue's 1e-4 target; T2's composed rotations and
// their effect downstream are held to 1e-4 (K) and 1e-3 (logits).
const TOL_ROWS: Bound = Bound::AtMost(1e-5);
const TOL_LOGITS: Bound = Bound::AtMost(1e-4);
const TOL_T2_K: Bound = Bound::AtMost(1e-4);
const TOL_T2_LOGITS: Bound = Bound::AtMost(1e-3);
const TOL_T3_LOGITS: Bound = Bound::AtMost(1e-5);
const EXACT: Bound = Bound::AtMost(0.0);
const NO_FLIP: Bound = Bound::Is(0.0);

fn ops_text(trace: &Trace) -> Vec<String> {
    trace.ops.iter().map(|o| o.to_string()).collect()
}

fn harness(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Builds `label`'s pin if needed and measures T1-T3 on it (see the module documentation), on
/// `model` or the default tiny model. `Err` when the harness breaks (build, load, a context that
/// does not open, an op that does not take effect); every measured value, within its tolerance or
/// not, is a figure of the report. Predictions are not read here: see
/// [`MeasureReport::check_predictions`].
pub fn measure_pin(label: &str, model: Option<&Path>) -> Result<MeasureReport, String> {
    let pin = Pin::parse(label).map_err(|e| format!("{e:#}"))?;
    let info = pin.info().map_err(|e| format!("{e:#}"))?;
    let built = ensure_built(&BuildSpec::new(pin.clone()), true)
        .map_err(|e| format!("building {label}: {e:#}"))?;
    let shim = loaded_shim(&built)?;
    let model_path = match model {
        Some(m) => m.to_path_buf(),
        None => crate::model::tiny::try_default_model_path()
            .map_err(|e| format!("tiny model: {e:#}"))?,
    };
    let native_model = Arc::new(Model::load(&model_path).map_err(|e| format!("{e:#}"))?);
    let hp = native_model.hparams().clone();
    let hd = hp.head_dim;
    let format = StateFormat {
        rot_fields: info.kv_state_has_n_rot,
    };
    // A fresh context at every reset, with F32 K and V caches (flash attention off, one thread,
    // unified KV: the settings of `LlamaTarget`).
    let mut llama = LlamaTarget::new(
        shim.clone(),
        &model_path,
        &pin.label(),
        format,
        ResetMode::Fresh,
    )
    .with_cache_type(GGML_TYPE_F32);
    let mut native = NativeTensorTarget::new(native_model.clone(), Default::default());
    let mut f = Figures {
        figures: Vec::new(),
    };
    let mut experiments = Vec::new();
    let p = prompt();

    // ---- T1: state round trip -------------------------------------------------------------
    let prefill = Trace {
        setup: setup(),
        ops: vec![decode(0, &p, Some(0))],
    };
    experiments.push(Experiment {
        name: "T1.round_trip".into(),
        about: format!(
            "decode the prompt into seq 0 at 0..{}, llama_state_get_data; a fresh context: \
             llama_state_set_data, llama_state_get_data (same bytes?); then token {} decoded at \
             position {} in both (same logits?)",
            PROMPT_LEN - 1,
            extra_token(),
            PROMPT_LEN
        ),
        under_test: ops_text(&prefill),
        partner: vec![
            "llama_state_set_data(<bytes>) into a fresh context".into(),
            "llama_state_get_data".into(),
        ],
    });
    let mut original = llama.fresh_copy();
    original.reset(&setup()).map_err(harness)?;
    let o = original.apply(&prefill.ops[0]).map_err(harness)?;
    if !o.took_effect() {
        return Err(format!("{label}: the prompt decode returned {o:?}"));
    }
    let bytes = ctx_of(&mut original)
        .map_err(harness)?
        .state_get()
        .map_err(|e| format!("{e:#}"))?;
    let mut restored = llama.fresh_copy();
    restored.reset(&setup()).map_err(harness)?;
    ctx_of(&mut restored)
        .map_err(harness)?
        .state_set(&bytes)
        .map_err(|e| format!("{label}: state_set: {e:#}"))?;
    let again = ctx_of(&mut restored)
        .map_err(harness)?
        .state_get()
        .map_err(|e| format!("{e:#}"))?;
    let first_diff = bytes.iter().zip(&again).position(|(a, b)| a != b);
    f.flag(
        "T1.round_trip_bytes_equal",
        "T1.round_trip",
        bytes == again,
        Some(format!(
            "{} bytes, then {} bytes; first difference at {}",
            bytes.len(),
            again.len(),
            first_diff.map_or("none".into(), |i| format!("byte {i}"))
        )),
    );
    let probe = decode(0, &[extra_token()], None);
    let mut next = Vec::new();
    for t in [&mut original, &mut restored] {
        let o = t.apply(&probe).map_err(harness)?;
        if !o.took_effect() {
            return Err(format!("{label}: the probe decode returned {o:?}"));
        }
        next.push(t.last_logits().map_err(harness)?.unwrap_or_default());
    }
    let d = logits_diff(&next[0], &next[1]);
    f.push(
        "T1.round_trip_logits_max_abs",
        "T1.round_trip",
        d.value,
        EXACT,
        Some(d.detail()),
    );
    drop((original, restored));

    // ---- T1: rows and logits vs the native forward pass ------------------------------------
    experiments.push(Experiment {
        name: "T1.vs_native".into(),
        about: format!(
            "decode the prompt into seq 0 at 0..{} in one batch; K and V rows of \
             llama_state_seq_get_data(0) (F32; V transposed without flash attention) against the \
             native forward pass (Model::forward_tokens over a VecKvStore, same tokens and \
             positions), per (layer, position, KV head); the last logits against the native ones; \
             then {T2_GREEDY} greedy tokens on each",
            PROMPT_LEN - 1
        ),
        under_test: ops_text(&prefill),
        partner: vec!["native: Model::forward_tokens(prompt, 0..12, VecKvStore)".into()],
    });
    let side = run_side(&mut llama, &prefill, 0, T2_GREEDY)?;
    let (native_rows, native_logits) = native_prefill(&native_model, &p);
    let rd = diff_rows(&side.rows, &native_rows, hd, 0..hp.n_layer);
    f.flag(
        "T1.rows_positions_equal",
        "T1.vs_native",
        rd.positions_equal,
        Some(format!(
            "llama.cpp {:?}, native {:?}",
            rd.positions.0, rd.positions.1
        )),
    );
    f.push(
        "T1.k_rows_vs_native_max_abs",
        "T1.vs_native",
        rd.k.value,
        TOL_ROWS,
        Some(rd.k.detail()),
    );
    f.push(
        "T1.v_rows_vs_native_max_abs",
        "T1.vs_native",
        rd.v.value,
        TOL_ROWS,
        Some(rd.v.detail()),
    );
    let ld = logits_diff(&side.logits, &native_logits);
    f.push(
        "logits_vs_native_max_abs",
        "T1.vs_native",
        ld.value,
        TOL_LOGITS,
        Some(ld.detail()),
    );
    let (am_l, am_n) = (argmax(&side.logits), argmax(&native_logits));
    f.flag(
        "logits_vs_native_argmax_equal",
        "T1.vs_native",
        am_l == am_n,
        Some(format!("llama.cpp {am_l}, native {am_n}")),
    );
    let toks: Vec<u32> = p.iter().map(|&t| t as u32).collect();
    let native_greedy = native_model.greedy(&toks, T2_GREEDY);
    let (n, first) = flips(&side.greedy, &native_greedy);
    f.push(
        "greedy32_vs_native_token_flips",
        "T1.vs_native",
        n as f64,
        NO_FLIP,
        Some(greedy_detail(&side.greedy, &native_greedy, first)),
    );

    // ---- T2: context shift vs never saw the span ---------------------------------------------
    let fresh = t2_fresh_trace();
    let (s0, s1) = T2_SPAN;
    for (name, trace, about, control) in [
        (
            "T2",
            t2_never_saw_trace(),
            format!(
                "the survivors never attended the span: A (prompt 0..{s0}) and B (prompt \
                 {s1}..{PROMPT_LEN}) decoded together at 0..7 exactly as the fresh partner does; B \
                 moved to {s1}..{} (seq_add +{}); the span S (prompt {s0}..{s1}) decoded into seq 1 \
                 (sharing A) at {s0}..{} (this decode applies B's +{} K-shift) and copied into seq \
                 0, seq 1 dropped: seq 0 holds the prompt at 0..{}, and B never attended S; then the \
                 context shift seq_rm(0, {s0}, {s1}), seq_add(0, {s1}, -1, -{}) and token {} decoded \
                 at {} (llama.cpp applies the -{} K-shift here, composed onto B's rotated keys). \
                 Against a fresh context that decodes A and B at 0..7, then the same token: K and V \
                 rows of seq 0, the logits, {T2_GREEDY} greedy tokens",
                PROMPT_LEN as Pos - 1,
                s1 - s0,
                s1 - 1,
                s1 - s0,
                PROMPT_LEN - 1,
                s1 - s0,
                extra_token(),
                PROMPT_LEN as Pos - (s1 - s0),
                s1 - s0
            ),
            false,
        ),
        (
            "T2.too_late",
            t2_too_late_trace(),
            format!(
                "control, the plain context shift: the prompt decoded in one batch at 0..{}, then \
                 seq_rm(0, {s0}, {s1}), seq_add(0, {s1}, -1, -{}), token {} at {}. The survivors \
                 after the span attended it, so rows from layer 1 on, logits and greedy tokens are \
                 expected to differ from the fresh partner (the theorem's \"span-exact, not \
                 retroactive\"); layer 0's K rows depend on token and position only and measure \
                 one composed rotation",
                PROMPT_LEN - 1,
                s1 - s0,
                extra_token(),
                PROMPT_LEN as Pos - (s1 - s0)
            ),
            true,
        ),
    ] {
        experiments.push(Experiment {
            name: name.into(),
            about,
            under_test: ops_text(&trace),
            partner: ops_text(&fresh),
        });
        for (who, target) in [
            ("", &mut llama as &mut dyn CacheUnderTest),
            (".native", &mut native as &mut dyn CacheUnderTest),
        ] {
            let shifted = run_side(target, &trace, 0, T2_GREEDY)?;
            let partner = run_side(target, &fresh, 0, T2_GREEDY)?;
            let all = diff_rows(&shifted.rows, &partner.rows, hd, 0..hp.n_layer);
            let layer0 = diff_rows(&shifted.rows, &partner.rows, hd, 0..1);
            let ld = logits_diff(&shifted.logits, &partner.logits);
            let (n, first) = flips(&shifted.greedy, &partner.greedy);
            let q = |s: &str| format!("{name}{who}.{s}");
            // llama.cpp is held to the stated tolerances, the native cache to bit-exactness; the
            // too-late control only where it measures rotations alone (layer 0's K).
            let (tk, tl, tf, tk0) = match (control, who.is_empty()) {
                (false, true) => (TOL_T2_K, TOL_T2_LOGITS, NO_FLIP, TOL_T2_K),
                (false, false) => (EXACT, EXACT, NO_FLIP, EXACT),
                (true, true) => (Bound::Control, Bound::Control, Bound::Control, TOL_T2_K),
                (true, false) => (Bound::Control, Bound::Control, Bound::Control, EXACT),
            };
            f.flag(
                &q("positions_equal"),
                name,
                all.positions_equal,
                Some(format!(
                    "shifted {:?}, fresh {:?}",
                    all.positions.0, all.positions.1
                )),
            );
            let k_name = if control { "k_max_abs" } else { "k_after_shift_max_abs" };
            f.push(&q(k_name), name, all.k.value, tk, Some(all.k.detail()));
            f.push(
                &q("k_layer0_max_abs"),
                name,
                layer0.k.value,
                tk0,
                Some(layer0.k.detail()),
            );
            let v_name = if control { "v_max_abs" } else { "v_after_shift_max_abs" };
            f.push(&q(v_name), name, all.v.value, tk, Some(all.v.detail()));
            f.push(&q("logits_max_abs"), name, ld.value, tl, Some(ld.detail()));
            f.push(
                &q("greedy32_token_flips"),
                name,
                n as f64,
                tf,
                Some(greedy_detail(&shifted.greedy, &partner.greedy, first)),
            );
            f.push(
                &q("greedy32_first_flip"),
                name,
                first.map_or(-1.0, |i| i as f64),
                Bound::Control,
                Some("index of the first differing greedy token, -1 when none".into()),
            );
        }
    }

    // ---- T3: prefix splice vs recompute ------------------------------------------------------
    let splice = t3_splice_trace();
    let recompute = t3_fresh_trace();
    experiments.push(Experiment {
        name: "T3".into(),
        about: format!(
            "prefix splice: the prompt decoded into seq 0 at 0..{}, its first {T3_PREFIX} tokens \
             copied to seq 1 (seq_cp(0, 1, 0, {T3_PREFIX})), the suffix {:?} decoded into seq 1 at \
             {T3_PREFIX}..{}. Against a fresh context that decodes prefix and suffix into seq 0 in \
             one batch at 0..{}: logits after the suffix, K and V rows of seq 1 vs seq 0, cache \
             length (resident cells of the sequence), {T3_GREEDY} greedy tokens",
            PROMPT_LEN - 1,
            suffix(),
            T3_PREFIX + T3_SUFFIX - 1,
            T3_PREFIX + T3_SUFFIX - 1
        ),
        under_test: ops_text(&splice),
        partner: ops_text(&recompute),
    });
    for (who, target) in [
        ("", &mut llama as &mut dyn CacheUnderTest),
        (".native", &mut native as &mut dyn CacheUnderTest),
    ] {
        let spliced = run_side(target, &splice, 1, T3_GREEDY)?;
        let fresh = run_side(target, &recompute, 0, T3_GREEDY)?;
        let q = |s: &str| format!("T3{who}.{s}");
        let (tl, tr) = if who.is_empty() {
            (TOL_T3_LOGITS, TOL_ROWS)
        } else {
            (EXACT, EXACT)
        };
        let ld = logits_diff(&spliced.logits, &fresh.logits);
        f.push(
            &q("prefix_logits_max_abs"),
            "T3",
            ld.value,
            tl,
            Some(ld.detail()),
        );
        f.flag(
            &q("prefix_greedy_equal"),
            "T3",
            spliced.greedy == fresh.greedy,
            Some(format!(
                "spliced {:?}, fresh {:?}",
                spliced.greedy, fresh.greedy
            )),
        );
        // The rows were read before the greedy decodes: the cache as the suffix left it.
        let (ns, nf) = (spliced.rows.cells.len(), fresh.rows.cells.len());
        f.flag(
            &q("cache_length_equal"),
            "T3",
            ns == nf,
            Some(format!(
                "seq 1 spliced: {ns} cells, seq 0 fresh: {nf} cells"
            )),
        );
        let rd = diff_rows(&spliced.rows, &fresh.rows, hd, 0..hp.n_layer);
        f.push(
            &q("k_rows_max_abs"),
            "T3",
            rd.k.value,
            tr,
            Some(rd.k.detail()),
        );
        f.push(
            &q("v_rows_max_abs"),
            "T3",
            rd.v.value,
            tr,
            Some(rd.v.detail()),
        );
    }

    Ok(MeasureReport {
        target: pin.label(),
        shim_version: shim.version().to_string(),
        state_seq_version: shim.state_seq_format(),
        model: ModelSummary {
            file: model_path
                .file_name()
                .map_or(model_path.display().to_string(), |n| {
                    n.to_string_lossy().into_owned()
                }),
            sha256: crate::targets::llama::build::file_sha256(&model_path)
                .map_err(|e| format!("{e:#}"))?,
            n_layer: hp.n_layer,
            n_embd: hp.n_embd,
            n_head: hp.n_head,
            n_head_kv: hp.n_head_kv,
            head_dim: hp.head_dim,
            n_vocab: hp.n_vocab,
        },
        context: ContextSummary {
            n_ctx: N_CTX,
            n_seq_max: N_SEQ_MAX,
            n_threads: 1,
            kv_unified: true,
            flash_attn: "off".into(),
            type_k: "F32".into(),
            type_v: "F32".into(),
        },
        prompt: p,
        experiments,
        figures: f.figures,
        predictions: Vec::new(),
    })
}

/// The shim of `built`, loaded once per process and never unloaded. Unloading a shim leaves
/// ggml's terminate handler (installed by a static initializer, ggml/src/ggml.cpp:16-26 in
/// 0.1.161) pointing into unmapped code, and loading the same shim again at the same address trips
/// `GGML_ASSERT(prev != ggml_uncaught_exception)` in that initializer: an abort, seen when two
/// measurements of one pin ran in one test process.
fn loaded_shim(built: &BuiltShim) -> Result<LlamaShim, String> {
    static SHIMS: OnceLock<Mutex<HashMap<PathBuf, LlamaShim>>> = OnceLock::new();
    let mut shims = SHIMS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(shim) = shims.get(&built.so_path) {
        return Ok(shim.clone());
    }
    let shim = LlamaShim::load_built(built).map_err(|e| format!("{e:#}"))?;
    shims.insert(built.so_path.clone(), shim.clone());
    Ok(shim)
}

/// The context of a target that has been reset.
fn ctx_of(t: &mut LlamaTarget) -> Result<&mut LlamaContext, HarnessError> {
    let label = t.info().name;
    t.context().ok_or(HarnessError::Target {
        target: label,
        message: "no context: reset first".into(),
    })
}

fn greedy_detail(a: &[u32], b: &[u32], first: Option<usize>) -> String {
    match first {
        None => format!("both {a:?}"),
        Some(i) => format!("first flip at step {i}: {a:?} vs {b:?}"),
    }
}

impl MeasureReport {
    /// The figure named `quantity`, if measured.
    pub fn figure(&self, quantity: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.quantity == quantity)
    }

    /// Checks every prediction for this report's target against the figures (replacing earlier
    /// rows). A predicted quantity this run does not measure is a row with no value, not
    /// confirmed.
    pub fn check_predictions(&mut self, predictions: &[MeasurementPrediction]) {
        self.predictions = predictions
            .iter()
            .filter(|p| p.target == self.target)
            .map(|p| {
                let measured = self.figure(&p.quantity).map(|f| f.value);
                PredictionRow {
                    quantity: p.quantity.clone(),
                    predicted: prediction_text(p),
                    measured,
                    confirmed: measured.is_some_and(|v| p.holds(v)),
                }
            })
            .collect();
    }

    /// Whether every checked prediction held.
    pub fn all_confirmed(&self) -> bool {
        self.predictions.iter().all(|p| p.confirmed)
    }

    /// The figures outside their stated tolerance (controls excluded).
    pub fn outside_tolerance(&self) -> Vec<&Figure> {
        self.figures
            .iter()
            .filter(|f| f.within == Some(false))
            .collect()
    }

    /// The JSON report.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("a report always serializes");
        s.push('\n');
        s
    }

    /// The Markdown report.
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# kvaudit measure: {} (T1-T3)\n", self.target);
        let m = &self.model;
        let c = &self.context;
        let _ = writeln!(
            s,
            "Shim `{}`, `LLAMA_STATE_SEQ_VERSION` {}. Model `{}` (SHA-256 {}; {} layers, n_embd {}, \
             {} heads / {} KV heads of {}, vocabulary {}). Every context: n_ctx {}, n_seq_max {}, {} thread, \
             kv_unified {}, flash attention {}, K cache {}, V cache {}; logits of the last token of \
             each decode. Prompt (positions 0..{}): `{:?}`.\n",
            self.shim_version,
            self.state_seq_version,
            m.file,
            &m.sha256[..m.sha256.len().min(16)],
            m.n_layer,
            m.n_embd,
            m.n_head,
            m.n_head_kv,
            m.head_dim,
            m.n_vocab,
            c.n_ctx,
            c.n_seq_max,
            c.n_threads,
            c.kv_unified,
            c.flash_attn,
            c.type_k,
            c.type_v,
            self.prompt.len().saturating_sub(1),
            self.prompt
        );
        if !self.predictions.is_empty() {
            let _ = writeln!(s, "## Prediction (PREREG.md) vs measurement\n");
            let _ = writeln!(s, "| quantity | predicted | measured | |");
            let _ = writeln!(s, "|---|---|---:|---|");
            for p in &self.predictions {
                let _ = writeln!(
                    s,
                    "| `{}` | {} | {} | {} |",
                    p.quantity,
                    p.predicted,
                    p.measured.map_or("not measured".into(), fmt_value),
                    if p.confirmed {
                        "confirmed"
                    } else {
                        "**FALSIFIED**"
                    }
                );
            }
            let _ = writeln!(s);
        }
        let _ = writeln!(s, "## Reading\n");
        for l in self.reading() {
            let _ = writeln!(s, "- {l}");
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "## Figures\n");
        let _ = writeln!(s, "| quantity | value | tolerance | within |");
        let _ = writeln!(s, "|---|---:|---|---|");
        for f in &self.figures {
            let _ = writeln!(
                s,
                "| `{}` | {} | {} | {} |",
                f.quantity,
                fmt_value(f.value),
                f.tolerance.text(),
                match f.within {
                    Some(true) => "yes",
                    Some(false) => "**no**",
                    None => "-",
                }
            );
        }
        let _ = writeln!(s, "\n## Experiments\n");
        for e in &self.experiments {
            let _ = writeln!(s, "### {}\n\n{}.\n", e.name, e.about);
            let _ = writeln!(
                s,
                "Under test:\n\n```text\n{}\n```\n",
                e.under_test.join("\n")
            );
            if !e.partner.is_empty() {
                let _ = writeln!(s, "Partner:\n\n```text\n{}\n```\n", e.partner.join("\n"));
            }
            for f in self.figures.iter().filter(|f| f.experiment == e.name) {
                if let Some(d) = &f.detail {
                    let _ = writeln!(s, "- `{}` = {}: {d}", f.quantity, fmt_value(f.value));
                }
            }
            let _ = writeln!(s);
        }
        s
    }

    /// What the figures say, in sentences: the stated tolerances, why T2 has two variants, and
    /// each falsified prediction or figure outside its tolerance with where it was seen.
    pub fn reading(&self) -> Vec<String> {
        let v = |q: &str| {
            self.figure(q)
                .map_or("(not measured)".into(), |f| fmt_value(f.value))
        };
        let mut out = vec![
            "Tolerances were stated before measuring: 0 (bit-exact) for the state round trip and \
             for every native-cache figure; 1e-5 for K/V rows against the native forward pass and \
             for T3 (ggml-cpu's RoPE and dot products are compiled with fused multiply-adds, the \
             native ones are not: last-bit differences of values of order 1); 1e-4 for logits \
             against native (the issue's target); 1e-4 (K) and 1e-3 (logits) for T2, whose keys \
             are re-rotated by composition; no greedy token may flip."
                .to_string(),
            format!(
                "T2 is measured twice. The PREREG quantities (`T2.k_after_shift_max_abs`, \
                 `T2.logits_max_abs`, `T2.greedy32_token_flips`) compare with a context that never \
                 saw the span, so they are taken where the theorem's precondition holds: the \
                 survivors never attended the span (experiment T2), and the only difference left in \
                 exact arithmetic is how the keys are re-positioned. There llama.cpp measures {} in \
                 K and {} in logits, with {} greedy flips, while the native cache (one rotation \
                 from the pre-RoPE row) measures {} and {}: {}",
                v("T2.k_after_shift_max_abs"),
                v("T2.logits_max_abs"),
                v("T2.greedy32_token_flips"),
                v("T2.native.k_after_shift_max_abs"),
                v("T2.native.logits_max_abs"),
                match self.figure("T2.k_after_shift_max_abs").map(|f| f.value) {
                    Some(k) if k > 0.0 => {
                        "llama.cpp's K-shift composes a rotation onto the rotated key, as \
                         PREREG.md expected."
                    }
                    Some(_) => {
                        "llama.cpp's keys after the shift are bit-identical to a fresh prefill, \
                         which PREREG.md did not expect."
                    }
                    None => "llama.cpp's side was not measured.",
                },
            ),
            format!(
                "The plain context shift of a prompt decoded in one batch (T2.too_late) is a \
                 control: the survivors attended the span before it was evicted. Its layer-0 keys \
                 (token and position only) differ by {} on llama.cpp and {} on the native cache: \
                 one composed rotation. From layer 1 on it differs by {} in K and {} in logits with \
                 {} of {T2_GREEDY} greedy tokens flipped (first at step {}), and the native cache \
                 shows {} and {} with {} flips: the span's influence, which no cache can undo \
                 (\"span-exact, not retroactive\"), not an error of llama.cpp's.",
                v("T2.too_late.k_layer0_max_abs"),
                v("T2.too_late.native.k_layer0_max_abs"),
                v("T2.too_late.k_max_abs"),
                v("T2.too_late.logits_max_abs"),
                v("T2.too_late.greedy32_token_flips"),
                v("T2.too_late.greedy32_first_flip"),
                v("T2.too_late.native.k_max_abs"),
                v("T2.too_late.native.logits_max_abs"),
                v("T2.too_late.native.greedy32_token_flips"),
            ),
        ];
        for p in self.predictions.iter().filter(|p| !p.confirmed) {
            let detail = self
                .figure(&p.quantity)
                .and_then(|f| f.detail.clone())
                .unwrap_or_else(|| "this run measures no such quantity".into());
            out.push(format!(
                "FALSIFIED: `{}` was predicted {} and measured {}: {detail}. The prediction stays \
                 as written.",
                p.quantity,
                p.predicted,
                p.measured.map_or("nothing".into(), fmt_value)
            ));
        }
        for f in self.outside_tolerance() {
            out.push(format!(
                "Outside its stated tolerance ({}): `{}` = {}; {}.",
                f.tolerance.text(),
                f.quantity,
                fmt_value(f.value),
                f.detail.as_deref().unwrap_or("no detail")
            ));
        }
        if self.predictions.iter().all(|p| p.confirmed) && self.outside_tolerance().is_empty() {
            out.push(format!(
                "Every figure is within its stated tolerance{}.",
                if self.predictions.is_empty() {
                    String::new()
                } else {
                    format!(" and all {} predictions held", self.predictions.len())
                }
            ));
        }
        out
    }

    /// A short table for a terminal.
    pub fn to_terminal(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{} (T1-T3, F32 KV cache, flash attention off)",
            self.target
        );
        let w = self
            .figures
            .iter()
            .map(|f| f.quantity.len())
            .max()
            .unwrap_or(0);
        for f in &self.figures {
            let _ = writeln!(
                s,
                "  {:<w$}  {:>10}  tolerance {}{}",
                f.quantity,
                fmt_value(f.value),
                f.tolerance.text(),
                if f.within == Some(false) {
                    "  OUTSIDE"
                } else {
                    ""
                }
            );
        }
        for p in &self.predictions {
            let _ = writeln!(
                s,
                "  prediction {}: {}, measured {}: {}",
                p.quantity,
                p.predicted,
                p.measured.map_or("nothing".into(), fmt_value),
                if p.confirmed {
                    "confirmed"
                } else {
                    "FALSIFIED"
                }
            );
        }
        s
    }
}

fn prediction_text(p: &MeasurementPrediction) -> String {
    let mut parts = Vec::new();
    if let Some(e) = p.equal {
        parts.push(if e {
            "yes".to_string()
        } else {
            "no".to_string()
        });
    }
    if let Some(x) = p.min_gt {
        parts.push(format!("> {x:e}"));
    }
    if let Some(x) = p.max_le {
        parts.push(format!("<= {x:e}"));
    }
    parts.join(" and ")
}

fn fmt_value(v: f64) -> String {
    if v == 0.0 || (v.fract() == 0.0 && v.abs() < 1e6) {
        format!("{v}")
    } else {
        format!("{v:.3e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_and_suffix_are_the_documented_tokens() {
        assert_eq!(prompt(), [12, 49, 23, 60, 34, 8, 45, 19, 56, 30, 4, 41]);
        assert_eq!(extra_token(), 15);
        assert_eq!(suffix(), [15, 52, 26, 63]);
        assert_eq!(survivors(), [12, 49, 23, 60, 56, 30, 4, 41]);
    }

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

    #[test]
    fn predictions_are_matched_by_target_and_quantity() {
        let mut r = MeasureReport {
            target: "llama.cpp@0.1.161".into(),
            shim_version: String::new(),
            state_seq_version: 4,
            model: ModelSummary {
                file: String::new(),
                sha256: String::new(),
                n_layer: 0,
                n_embd: 0,
                n_head: 0,
                n_head_kv: 0,
                head_dim: 0,
                n_vocab: 0,
            },
            context: ContextSummary {
                n_ctx: 0,
                n_seq_max: 0,
                n_threads: 0,
                kv_unified: true,
                flash_attn: String::new(),
                type_k: String::new(),
                type_v: String::new(),
            },
            prompt: Vec::new(),
            experiments: Vec::new(),
            figures: Vec::new(),
            predictions: Vec::new(),
        };
        let mut f = Figures {
            figures: Vec::new(),
        };
        f.push("T2.logits_max_abs", "T2", 2e-3, TOL_T2_LOGITS, None);
        r.figures = f.figures;
        let ps =
            crate::records::prereg::parse_measurements(include_str!("../../PREREG.md")).unwrap();
        r.check_predictions(&ps);
        let row = |q: &str| r.predictions.iter().find(|p| p.quantity == q).unwrap();
        assert!(!row("T2.logits_max_abs").confirmed);
        assert_eq!(row("T2.logits_max_abs").predicted, "> 0e0 and <= 1e-3");
        assert_eq!(row("T3.prefix_greedy_equal").measured, None);
        assert!(r.predictions.iter().all(|p| p.quantity != "x"));
        assert_eq!(r.figures[0].within, Some(false));
    }
}
