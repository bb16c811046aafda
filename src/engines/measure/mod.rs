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
//!   [`crate::model::forward::VecKvStore`]) per (layer, position, KV head); the last logits against the native ones.
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
//! [`crate::oracles::theorems::read_seq_rows`] (decoded by [`crate::base::state::parse_seq_rows`],
//! which undoes llama.cpp's transposed V).
//!
//! The module is split by concern: [`traces`] (the fixed traces), `compare` (one side of an
//! experiment and the differences of two), `experiments` (one function per experiment and the
//! stated tolerances), [`report`] (the [`MeasureReport`] and its renderings); this file opens the
//! pin and the targets and runs the experiments in order.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use thiserror::Error;

use crate::base::cache::{CacheUnderTest, HarnessError, OpOutcome};
use crate::base::exit;
use crate::base::op::SeqId;
use crate::base::state::RowError;
use crate::model::forward::Model;
use crate::model::ModelError;
use crate::oracles::theorems::TheoremError;
use crate::targets::llama::build::{ensure_built, BuildSpec, BuiltShim};
use crate::targets::llama::error::{LlamaError, ShimError};
use crate::targets::llama::ffi::{LlamaContext, LlamaShim};
use crate::targets::llama::pins::Pin;
use crate::targets::llama::target::{LlamaTarget, ResetMode};
use crate::targets::native_tensor::NativeTensorTarget;

mod compare;
mod experiments;
pub mod report;
pub mod traces;

pub use report::{
    Bound, ContextSummary, Experiment, Figure, MeasureReport, ModelSummary, PredictionRow,
};
pub use traces::{
    extra_token, prompt, suffix, t2_fresh_trace, t2_never_saw_trace, t2_too_late_trace,
    t3_fresh_trace, t3_splice_trace, N_CTX, N_SEQ_MAX, PROMPT_LEN, T2_GREEDY, T2_SPAN, T3_GREEDY,
    T3_PREFIX, T3_SUFFIX,
};

use experiments::{Figures, Lab};

/// `ggml_type` id of F32, the K and V cache type of every context here.
pub const GGML_TYPE_F32: u32 = 0;

/// Why `kvaudit measure` could not measure: the harness, never a figure (a value outside its
/// tolerance is a figure of the report).
///
/// Exit codes ([`MeasureError::exit_code`]): a label that is not a known llama.cpp pin is bad
/// input, exit 2 (`USAGE`); every other variant is the harness breaking, exit 3 (`HARNESS`): the
/// pin does not build or load, a context call fails, an op of a fixed experiment does not take
/// effect, rows do not decode. (A `--model` file is checked by the command line before measuring,
/// so a model that fails to load here is the harness's.)
#[derive(Debug, Error)]
pub enum MeasureError {
    /// The label is not a pin pins.toml knows.
    #[error("{0}")]
    Pin(LlamaError),
    /// The pin did not build.
    #[error("building {label}: {cause}")]
    Build {
        /// The pin label.
        label: String,
        /// Why.
        cause: LlamaError,
    },
    /// The built shim did not load.
    #[error("{0}")]
    Shim(LlamaError),
    /// The generated tiny model could not be made.
    #[error("tiny model: {0}")]
    TinyModel(ModelError),
    /// The model did not load into the native reference.
    #[error(transparent)]
    Model(ModelError),
    /// The model file could not be read for its hash.
    #[error("reading {}: {source}", path.display())]
    ModelFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A llama.cpp context call failed.
    #[error("{label}: {call}: {cause}")]
    Context {
        /// The pin label.
        label: String,
        /// The call (`state_get`, `state_set`).
        call: &'static str,
        /// Why.
        cause: ShimError,
    },
    /// A decode of T1's round trip did not succeed.
    #[error("{label}: the {what} decode returned {outcome:?}")]
    Decode {
        /// The pin label.
        label: String,
        /// Which decode (`prompt`, `probe`).
        what: &'static str,
        /// What it returned.
        outcome: OpOutcome,
    },
    /// An op of an experiment's trace did not take effect.
    #[error("{label}: {what} did not take effect: {outcome:?}")]
    NoEffect {
        /// The target.
        label: String,
        /// The op.
        what: String,
        /// What it did.
        outcome: OpOutcome,
    },
    /// A target did not support what an experiment needs (an op, logits).
    #[error("{target}: {source}")]
    Side {
        /// The target.
        target: String,
        /// What it did not support.
        source: TheoremError,
    },
    /// A greedy decode did not succeed.
    #[error("{target}: greedy decode: {source}")]
    Greedy {
        /// The target.
        target: String,
        /// Why.
        source: TheoremError,
    },
    /// The rows of a target's state did not decode.
    #[error("{target}: seq {seq}: {source}")]
    Rows {
        /// The target.
        target: String,
        /// The sequence.
        seq: SeqId,
        /// What did not decode.
        source: RowError,
    },
    /// The target has no logits after a trace.
    #[error("{target}: no logits")]
    NoLogits {
        /// The target.
        target: String,
    },
    /// A target failed.
    #[error(transparent)]
    Harness(#[from] HarnessError),
}

impl MeasureError {
    /// The exit code of `kvaudit measure` for this error (see the enum's documentation).
    pub fn exit_code(&self) -> i32 {
        match self {
            MeasureError::Pin(_) => exit::USAGE,
            _ => exit::HARNESS,
        }
    }

    /// A step of one side of an experiment failed: a harness error stays one, anything else is
    /// what `wrap` makes of it.
    fn from_step(e: TheoremError, wrap: impl FnOnce(TheoremError) -> Self) -> Self {
        match e {
            TheoremError::Harness(h) => MeasureError::Harness(h),
            other => wrap(other),
        }
    }

    /// A llama.cpp context call of `label` failed.
    fn context(label: &str, call: &'static str, cause: ShimError) -> Self {
        MeasureError::Context {
            label: label.into(),
            call,
            cause,
        }
    }
}

/// Builds `label`'s pin if needed and measures T1-T3 on it (see the module documentation), on
/// `model` or the default tiny model. `Err` when the harness breaks (build, load, a context that
/// does not open, an op that does not take effect); every measured value, within its tolerance or
/// not, is a figure of the report. Predictions are not read here: see
/// [`MeasureReport::check_predictions`].
pub fn measure_pin(label: &str, model: Option<&Path>) -> Result<MeasureReport, MeasureError> {
    let pin = Pin::parse(label).map_err(MeasureError::Pin)?;
    let info = pin.info().map_err(MeasureError::Pin)?;
    let built =
        ensure_built(&BuildSpec::new(pin.clone()), true).map_err(|cause| MeasureError::Build {
            label: label.into(),
            cause,
        })?;
    let shim = loaded_shim(&built)?;
    let model_path = match model {
        Some(m) => m.to_path_buf(),
        None => crate::model::tiny::try_default_model_path().map_err(MeasureError::TinyModel)?,
    };
    let native_model = Arc::new(Model::load(&model_path).map_err(MeasureError::Model)?);
    let hp = native_model.hparams().clone();
    let format = crate::targets::llama::state_format(&info);
    // A fresh context at every reset, with F32 K and V caches (flash attention off, one thread,
    // unified KV: the settings of `LlamaTarget`).
    let llama = LlamaTarget::new(
        shim.clone(),
        &model_path,
        &pin.label(),
        format,
        ResetMode::Fresh,
    )
    .with_cache_type(crate::base::op::CacheType::F32);
    let mut lab = Lab {
        label,
        llama,
        native: NativeTensorTarget::new(native_model.clone(), Default::default()),
        model: &native_model,
        figures: Figures {
            figures: Vec::new(),
        },
        experiments: Vec::new(),
    };
    lab.t1_round_trip()?;
    lab.t1_vs_native()?;
    lab.t2()?;
    lab.t3()?;
    let (f, experiments, p) = (lab.figures, lab.experiments, prompt());

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
            sha256: crate::base::files::file_sha256(&model_path).map_err(|source| {
                MeasureError::ModelFile {
                    path: model_path.clone(),
                    source,
                }
            })?,
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
fn loaded_shim(built: &BuiltShim) -> Result<LlamaShim, MeasureError> {
    static SHIMS: OnceLock<Mutex<HashMap<PathBuf, LlamaShim>>> = OnceLock::new();
    let mut shims = SHIMS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(shim) = shims.get(&built.so_path) {
        return Ok(shim.clone());
    }
    let shim = LlamaShim::load_built(built).map_err(|e| MeasureError::Shim(e.into()))?;
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
