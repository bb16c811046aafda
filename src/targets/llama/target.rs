//! `CacheUnderTest` over a real llama.cpp context (in this process; see [`super::worker`] for the
//! crash-isolated form the command line uses).
//!
//! Resets are fast and honest: the first reset for a setup builds it for real (clear, then the
//! setup's decodes) and saves the full state; later resets for the same setup restore that saved
//! state with `llama_state_set_data`. A restore rebuilds derived state, which is harmless *before*
//! a trace's first op (the state after the setup is consistent on every pin); it is never done in
//! the middle of a trace. `tests/it` checks that both kinds of reset give identical observations.

use std::path::{Path, PathBuf};

use super::ffi::{ContextParams, FlashAttn, LlamaContext, LlamaShim, ShimError};
use crate::base::op::{Op, Pos, SeqId, Setup};
use crate::base::state::StateFormat;
use crate::base::target::{CacheUnderTest, HarnessError, OpOutcome, TargetInfo};

/// How a [`LlamaTarget`] resets between trials.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetMode {
    /// Restore the state saved right after the setup (fast).
    Restore,
    /// Clear and re-run the setup every time (slow; the reference for the fast path).
    Rebuild,
    /// A fresh context, then the setup, every time: the naive harness benchmarks compare with.
    Fresh,
}

/// A llama.cpp context driven op by op.
pub struct LlamaTarget {
    shim: LlamaShim,
    model: PathBuf,
    label: String,
    format: StateFormat,
    reset_mode: ResetMode,
    ctx: Option<(ContextParams, LlamaContext)>,
    saved: Option<(Setup, Vec<u8>)>,
    /// `ggml_type` of the K and V caches; `None`: llama.cpp's default (F16).
    cache_type: Option<u32>,
    /// The context holds the logits of a successful decode made since the last reset.
    logits_valid: bool,
}

impl LlamaTarget {
    /// A target over a loaded shim and a model file. `label` names it in reports
    /// (`llama.cpp@0.1.156+assert`); `format` is the pin's state format.
    pub fn new(
        shim: LlamaShim,
        model: &Path,
        label: &str,
        format: StateFormat,
        reset_mode: ResetMode,
    ) -> Self {
        LlamaTarget {
            shim,
            model: model.to_path_buf(),
            label: label.to_string(),
            format,
            reset_mode,
            ctx: None,
            saved: None,
            cache_type: None,
            logits_valid: false,
        }
    }

    /// The same target with K and V caches of `ggml_type` (0 = F32), for the numerical oracles.
    pub fn with_cache_type(mut self, ggml_type: u32) -> Self {
        self.cache_type = Some(ggml_type);
        self
    }

    /// Another target with the same shim, model and settings, and no context yet.
    pub fn fresh_copy(&self) -> Self {
        let mut t = LlamaTarget::new(
            self.shim.clone(),
            &self.model,
            &self.label,
            self.format,
            self.reset_mode,
        );
        t.cache_type = self.cache_type;
        t
    }

    fn harness(&self, message: impl std::fmt::Display) -> HarnessError {
        HarnessError::Target {
            target: self.label.clone(),
            message: message.to_string(),
        }
    }

    fn params(&self, setup: &Setup) -> ContextParams {
        ContextParams {
            type_k: self.cache_type,
            type_v: self.cache_type,
            n_ctx: setup.n_ctx,
            n_seq_max: setup.n_seq_max,
            // A unified KV stream: every sequence shares the cells, as the native model does.
            kv_unified: true,
            flash_attn: FlashAttn::Off,
            n_threads: 1,
            ..ContextParams::default()
        }
    }

    fn ctx(&mut self) -> Result<&mut LlamaContext, HarnessError> {
        match self.ctx.as_mut() {
            Some((_, c)) => Ok(c),
            None => Err(HarnessError::Target {
                target: self.label.clone(),
                message: "no context: reset first".into(),
            }),
        }
    }

    /// The context, for measurements that need more than the trait (logits, full state).
    pub fn context(&mut self) -> Option<&mut LlamaContext> {
        self.ctx.as_mut().map(|(_, c)| c)
    }

    fn rebuild(&mut self, setup: &Setup) -> Result<(), HarnessError> {
        self.ctx()?.clear(true).map_err(|e| self.harness(e))?;
        crate::base::target::apply_setup_ops(self, setup)?;
        Ok(())
    }
}

impl CacheUnderTest for LlamaTarget {
    fn info(&self) -> TargetInfo {
        TargetInfo {
            name: self.label.clone(),
            version: self.shim.version().to_string(),
            faults: Vec::new(),
            model: model_name(&self.model),
            state_format: self.format,
        }
    }

    fn reset(&mut self, setup: &Setup) -> Result<(), HarnessError> {
        self.logits_valid = false;
        let params = self.params(setup);
        if self.reset_mode == ResetMode::Fresh || self.ctx.as_ref().map(|(p, _)| p) != Some(&params)
        {
            self.ctx = None;
            self.saved = None;
            let ctx = self
                .shim
                .open(&self.model, &params)
                .map_err(|e| self.harness(format!("{e:#}")))?;
            self.ctx = Some((params, ctx));
        }
        if self.reset_mode == ResetMode::Restore {
            if let Some((saved_setup, bytes)) = self.saved.take() {
                if saved_setup == *setup {
                    let restored = self.ctx()?.state_set(&bytes);
                    self.saved = Some((saved_setup, bytes));
                    return restored.map_err(|e| self.harness(format!("restore: {e:#}")));
                }
            }
        }
        self.rebuild(setup)?;
        if self.reset_mode == ResetMode::Restore {
            let bytes = self
                .ctx()?
                .state_get()
                .map_err(|e| self.harness(format!("save: {e:#}")))?;
            self.saved = Some((setup.clone(), bytes));
        }
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Result<OpOutcome, HarnessError> {
        let applied = apply_op(self.ctx()?, op);
        let outcome = applied.map_err(|e| HarnessError::Target {
            target: self.label.clone(),
            message: format!("{op}: {e:#}"),
        })?;
        if outcome == (OpOutcome::Decoded { rc: 0 }) {
            self.logits_valid = true;
        }
        Ok(outcome)
    }

    fn seq_pos_min(&mut self, seq: SeqId) -> Result<Pos, HarnessError> {
        let r = self.ctx()?.seq_pos_min(seq);
        r.map_err(|e| self.harness(format!("{e:#}")))
    }

    fn seq_pos_max(&mut self, seq: SeqId) -> Result<Pos, HarnessError> {
        let r = self.ctx()?.seq_pos_max(seq);
        r.map_err(|e| self.harness(format!("{e:#}")))
    }

    fn seq_state(&mut self, seq: SeqId) -> Result<Vec<u8>, HarnessError> {
        let r = self.ctx()?.state_seq_get(seq);
        r.map_err(|e| self.harness(format!("{e:#}")))
    }

    fn last_logits(&mut self) -> Result<Option<Vec<f32>>, HarnessError> {
        if !self.logits_valid {
            return Ok(None);
        }
        let r = self.ctx()?.logits_last();
        r.map(Some)
            .map_err(|e| self.harness(format!("logits: {e:#}")))
    }
}

/// Performs one op on a llama.cpp context: the one mapping from [`Op`] to the memory API and
/// `llama_decode` (a token outside the vocabulary is unsupported, not sent).
pub fn apply_op(c: &mut LlamaContext, op: &Op) -> Result<OpOutcome, ShimError> {
    let returned = match *op {
        Op::SeqRm { seq, p0, p1 } => Some(c.seq_rm(seq, p0, p1)?),
        Op::SeqCp { src, dst, p0, p1 } => {
            c.seq_cp(src, dst, p0, p1)?;
            None
        }
        Op::SeqKeep { seq } => {
            c.seq_keep(seq)?;
            None
        }
        Op::SeqAdd { seq, p0, p1, delta } => {
            c.seq_add(seq, p0, p1, delta)?;
            None
        }
        Op::SeqDiv { seq, p0, p1, d } => {
            c.seq_div(seq, p0, p1, d)?;
            None
        }
        Op::Clear => {
            c.clear(true)?;
            None
        }
        Op::StateSeqSave { .. }
        | Op::StateSeqLoad { .. }
        | Op::StateSave { .. }
        | Op::StateLoad { .. } => {
            return Ok(OpOutcome::Unsupported {
                reason: "state ops: not yet implemented for llama.cpp".into(),
            })
        }
        Op::Decode(ref d) => {
            let tokens = d.token_ids();
            if let Some(t) = tokens.iter().find(|&&t| t < 0 || t >= c.n_vocab()) {
                return Ok(OpOutcome::Unsupported {
                    reason: format!("token {t} outside the model's vocabulary"),
                });
            }
            let positions: Option<Vec<Pos>> =
                d.pos.map(|p| (0..d.n as Pos).map(|i| p + i).collect());
            let seqs: Vec<&[SeqId]> = tokens.iter().map(|_| d.seqs.as_slice()).collect();
            let rc = c.decode(&tokens, positions.as_deref(), &seqs)?;
            return Ok(OpOutcome::Decoded { rc });
        }
    };
    Ok(OpOutcome::Done { returned })
}

/// How reports name a model file: its file name (the generated tiny models carry a hash of their
/// bytes in it).
pub fn model_name(path: &Path) -> Option<String> {
    path.file_name().map(|n| n.to_string_lossy().into_owned())
}
