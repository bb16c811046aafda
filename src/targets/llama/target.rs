//! `CacheUnderTest` over a real llama.cpp context (in this process; see [`super::worker`] for the
//! crash-isolated form the command line uses).
//!
//! Resets are fast and honest: the first reset for a setup builds it for real (clear, then the
//! setup's decodes) and saves the full state; later resets for the same setup restore that saved
//! state with `llama_state_set_data`. A restore rebuilds derived state, which is harmless *before*
//! a trace's first op (the state after the setup is consistent on every pin); it is never done in
//! the middle of a trace. `tests/it` checks that both kinds of reset give identical observations.
//!
//! The setup's configuration (`kv_unified`, `n_batch`, `n_ubatch`, `flash_attn`, `type_k`,
//! `type_v`) goes into the context params; a configuration llama.cpp refuses to make a context
//! for (e.g. a quantized V cache without flash attention) is [`HarnessError::Unsupported`] with
//! llama.cpp's message. The setup's architecture picks the model: the target's own model file
//! for `llama` (the tiny audit model or `--model`), the generated tiny model of that architecture
//! otherwise ([`crate::model::tiny::try_arch_model_path`]), so that a `gemma2` setup runs
//! llama.cpp's iSWA cache, `mamba` its recurrent memory and `jamba` its hybrid memory. A context
//! is keyed by its model and params. State ops read and write the target's [`SlotStore`], emptied
//! at every reset. The round trip's twin is a second context with the same params, made on first use and
//! made again when the params change.

use std::path::{Path, PathBuf};

use super::faults::LlamaFaults;
use super::ffi::{ContextParams, LlamaContext, LlamaShim, ShimError};
use crate::base::cache::{
    Allocation, CacheUnderTest, Dump, DumpSize, HarnessError, OpOutcome, SeqObservation, TargetInfo,
};
use crate::base::config::MemoryType;
use crate::base::op::{Arch, CacheType, ForeignDump, Op, OpKind, Pos, SeqId, Setup};
use crate::base::setting::{Key, Setting, Value};
use crate::base::slots::SlotStore;
use crate::base::state::{StateFormat, WholeCell};
use crate::targets::dump_cells::{self, DumpObserved};

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
    /// The generated tiny models of the other architectures, written on first use.
    arch_models: Vec<(Arch, PathBuf)>,
    ctx: Option<(ContextKey, LlamaContext)>,
    /// The setup, the state right after it, and the slots its ops wrote (a restore must bring
    /// those back too: the trace may load them).
    saved: Option<(Setup, Vec<u8>, SlotStore)>,
    /// The type of the K and V caches, over the setup's; `None`: the setup's.
    cache_type: Option<CacheType>,
    /// The context holds the logits of a successful decode made since the last reset.
    logits_valid: bool,
    /// The state ops' buffers of the current trial.
    slots: SlotStore,
    /// The round trip's twin: a target over a second context with the same params (its own
    /// `twin` stays `None`).
    twin: Option<Box<LlamaTarget>>,
    /// Contexts of other configurations, each with its saved setup state, most recent last: a
    /// batch that alternates configurations keeps its fast resets.
    parked: Vec<Parked>,
    /// Configurations llama.cpp refused, with its reason (asked once, not per trial).
    refused: Vec<(ContextKey, String)>,
    /// Setups whose saved state does not restore faithfully on this pin: rebuilt every time.
    unrestorable: Vec<Setup>,
    /// A state op with `LLAMA_STATE_SEQ_FLAGS_ON_DEVICE` ran since the context was made: the
    /// context keeps device buffers per sequence (`mem_storage`) that neither a clear nor a
    /// restore empties, so the next reset makes a new context (trials stay independent).
    device_state_used: bool,
    /// A cross-stream `seq_cp` ran since the context was made: llama.cpp queues its buffer copy
    /// (`sc_info`) until the next update, and neither `llama_memory_clear` nor a state load drops
    /// the queue (llama-kv-cache.cpp `seq_cp`, `clear`, `update`, both pins), so a restore would
    /// let it land in the next trial: the next reset makes a new context.
    stream_copy_pending: bool,
    /// The target that makes the dumps of other configurations ([`Setup::foreign`]), made on
    /// first use, and the dumps it made, most recent last (a setup's are the same every trial).
    foreign_maker: Option<Box<LlamaTarget>>,
    foreign_dumps: Vec<(Setup, ForeignDump, Vec<u8>)>,
    /// The test hooks injected around llama.cpp's calls ([`LlamaFaults`]; none by default).
    faults: LlamaFaults,
    /// Whether any of `faults` is on (set with them, by [`LlamaTarget::with_faults`] only):
    /// without, every op and dump of every trial skips their hooks.
    faulty: bool,
    /// The memory type of the last reset's setup (how [`LlamaFaults::seq_dump`] parses a dump).
    memory: MemoryType,
    /// What the memory of the context of this key allocated, as `llama_init_from_model` logged
    /// it (read once per context: the sizes observation asks after every op).
    allocated: Option<(ContextKey, Allocation)>,
}

/// How many dumps of other configurations a target keeps.
const MAX_FOREIGN_KEPT: usize = 16;

/// A context set aside by a reset to another configuration.
struct Parked {
    params: ContextKey,
    ctx: LlamaContext,
    saved: Option<(Setup, Vec<u8>, SlotStore)>,
}

/// What a context is opened with: a model file and the context params.
#[derive(Clone, Debug, PartialEq)]
struct ContextKey {
    model: PathBuf,
    params: ContextParams,
    /// The architecture the model is of (which memory type the context must build).
    arch: Arch,
}

/// `LLAMA_STATE_SEQ_FLAGS_ON_DEVICE` (llama.h).
const STATE_SEQ_FLAGS_ON_DEVICE: u32 = 2;

/// How many contexts of other configurations a target keeps.
const MAX_PARKED: usize = 4;

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
            arch_models: Vec::new(),
            ctx: None,
            saved: None,
            cache_type: None,
            logits_valid: false,
            slots: SlotStore::default(),
            twin: None,
            parked: Vec::new(),
            unrestorable: Vec::new(),
            device_state_used: false,
            stream_copy_pending: false,
            refused: Vec::new(),
            foreign_maker: None,
            foreign_dumps: Vec::new(),
            faults: LlamaFaults::default(),
            faulty: false,
            memory: MemoryType::Kv,
            allocated: None,
        }
    }

    /// The same target with the test hooks `faults` (docs/usage.md, `--inject` on llama.cpp).
    pub fn with_faults(mut self, faults: LlamaFaults) -> Self {
        self.faults = faults;
        self.faulty = faults.any();
        self
    }

    /// The same target with K and V caches of `cache_type`, for the numerical oracles.
    pub fn with_cache_type(mut self, cache_type: CacheType) -> Self {
        self.cache_type = Some(cache_type);
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
        t.with_faults(self.faults)
    }

    /// `llama_memory_seq_pos_max(seq)`.
    fn pos_max(&mut self, seq: SeqId) -> Result<Pos, HarnessError> {
        let r = self.ctx()?.seq_pos_max(seq);
        r.map_err(|e| self.harness(format!("{e:#}")))
    }

    fn harness(&self, message: impl std::fmt::Display) -> HarnessError {
        HarnessError::Target {
            target: self.label.clone(),
            message: message.to_string(),
        }
    }

    /// The context params of `setup`'s configuration (the [`Self::with_cache_type`] override,
    /// when set, wins over the setup's cache types).
    pub fn params(&self, setup: &Setup) -> ContextParams {
        let retyped = self.cache_type.into_iter().flat_map(|t| {
            [Key::TypeK, Key::TypeV].map(|key| Setting {
                key,
                value: Value::Type(t),
            })
        });
        super::context_params(setup.settings().into_iter().chain(retyped))
    }

    /// The model file a setup of `arch` runs on: the target's own for `llama`, else the generated
    /// tiny model of `arch` (written to the cache directory once).
    fn model_for(&mut self, arch: Arch) -> Result<PathBuf, HarnessError> {
        if arch == Arch::Llama {
            return Ok(self.model.clone());
        }
        if let Some((_, path)) = self.arch_models.iter().find(|(a, _)| *a == arch) {
            return Ok(path.clone());
        }
        let path = crate::model::tiny::try_arch_model_path(arch)
            .map_err(|e| self.harness(format!("the tiny {arch} model: {e:#}")))?;
        self.arch_models.push((arch, path.clone()));
        Ok(path)
    }

    /// What a context for `setup` is opened with.
    fn key(&mut self, setup: &Setup) -> Result<ContextKey, HarnessError> {
        Ok(ContextKey {
            model: self.model_for(setup.arch)?,
            params: self.params(setup),
            arch: setup.arch,
        })
    }

    /// Opens a context for `key`: a context llama.cpp refuses for this configuration is
    /// [`HarnessError::Unsupported`], any other failure (the model, the library) a harness error.
    ///
    /// A generated model of another architecture than llama that the pin cannot load (an
    /// architecture it does not know yet), or a memory the pin builds for it that is not the
    /// architecture's memory type (lfm2_swa before 0.1.137 makes a plain hybrid memory: no
    /// windowed cache), is unsupported too: the setup asks for a memory class this version lacks.
    fn open(&self, key: &ContextKey) -> Result<LlamaContext, HarnessError> {
        let unsupported = |reason: String| HarnessError::Unsupported {
            target: self.label.clone(),
            reason,
        };
        let mut ctx = self
            .shim
            .open(&key.model, &key.params)
            .map_err(|e| match e {
                // The shim loads the model first: a message from llama_init_from_model means the
                // model loaded and the context was refused (its checks log under that name, and so
                // does its catch of the constructor's exceptions).
                ShimError::Open { ref message, .. }
                    if message.contains("llama_init_from_model") =>
                {
                    unsupported(message.trim().to_string())
                }
                ShimError::Open { ref message, .. }
                    if key.arch != Arch::Llama
                        && message.contains("llama_model_load_from_file") =>
                {
                    unsupported(format!(
                        "this llama.cpp cannot load the generated {} model (an architecture it does not know): {}",
                        key.arch,
                        message.trim()
                    ))
                }
                e => self.harness(format!("{e:#}")),
            })?;
        let memory = key.arch.memory();
        let parts =
            super::memory_log::read(&mut ctx).map_err(|e| self.harness(format!("{e:#}")))?;
        if let Some(built) = super::memory_log::other_memory(memory, &parts) {
            return Err(unsupported(format!(
                "this llama.cpp builds {} for the {} model, not the {memory} memory",
                built, key.arch
            )));
        }
        Ok(ctx)
    }

    /// Restores the state saved after `setup` into the current context, if that is what it
    /// saved (`None`: it saved another setup's, or nothing).
    fn restore_saved(&mut self, setup: &Setup) -> Option<Result<(), HarnessError>> {
        let (saved_setup, bytes, slots) = self.saved.as_ref()?;
        if saved_setup != setup {
            return None;
        }
        // Fields borrowed apart (this runs once per trial): the saved state is neither moved
        // out nor back, and no slots are copied when the setup saved none.
        let restored = match self.ctx.as_mut() {
            Some((_, ctx)) => ctx.state_set(bytes).map_err(|e| format!("restore: {e:#}")),
            None => Err("no context: reset first".to_string()),
        };
        if slots.is_empty() {
            self.slots.clear();
        } else {
            self.slots.clone_from(slots);
        }
        Some(restored.map_err(|m| self.harness(m)))
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

    /// Makes the context of `params` current: parks the current one (with its saved state) and
    /// takes a parked one of `params`, or opens one. Only at reset: a parked context is restored
    /// or rebuilt before any trace runs on it.
    fn switch_context(&mut self, params: ContextKey) -> Result<(), HarnessError> {
        if let Some((p, ctx)) = self.ctx.take() {
            self.parked.push(Parked {
                params: p,
                ctx,
                saved: self.saved.take(),
            });
            if self.parked.len() > MAX_PARKED {
                self.parked.remove(0);
            }
        }
        self.saved = None;
        if let Some(i) = self.parked.iter().position(|x| x.params == params) {
            let x = self.parked.remove(i);
            self.ctx = Some((x.params, x.ctx));
            self.saved = x.saved;
            return Ok(());
        }
        if let Some((_, reason)) = self.refused.iter().find(|(p, _)| *p == params) {
            return Err(HarnessError::Unsupported {
                target: self.label.clone(),
                reason: reason.clone(),
            });
        }
        match self.open(&params) {
            Ok(ctx) => {
                self.ctx = Some((params, ctx));
                Ok(())
            }
            Err(HarnessError::Unsupported { target, reason }) => {
                self.refused.push((params, reason.clone()));
                Err(HarnessError::Unsupported { target, reason })
            }
            Err(e) => Err(e),
        }
    }

    /// Every sequence of `setup` as the context answers now: accessors and dump bytes.
    fn snapshot(&mut self, setup: &Setup) -> Result<Vec<(Pos, Pos, Vec<u8>)>, HarnessError> {
        let mut out = Vec::new();
        for seq in 0..setup.n_seq_max as SeqId {
            let c = self.ctx()?;
            let r = (|| {
                Ok::<_, ShimError>((
                    c.seq_pos_min(seq)?,
                    c.seq_pos_max(seq)?,
                    c.state_seq_get(seq)?,
                ))
            })();
            out.push(r.map_err(|e| self.harness(format!("snapshot: {e:#}")))?);
        }
        Ok(out)
    }

    /// The reset of the context and its slots to the state after `setup`'s ops (the slots of
    /// other configurations' dumps are [`Self::fill_foreign`]'s).
    fn reset_context(&mut self, setup: &Setup) -> Result<(), HarnessError> {
        self.logits_valid = false;
        self.slots.clear();
        // (`memory` is this setup's: `reset` sets it first.)
        let fast = self.reset_mode == ResetMode::Restore
            && !self.memory.has_window()
            && self.memory != MemoryType::HybridIdx
            && setup.n_rs_seq == 0;
        // The common case first: another trial from the setup whose state the current context
        // saved (`saved` is always the current context's) and nothing that needs a new
        // context. Its key (the context's settings as strings) is not built again: that cost
        // more per trial than the restore's own bookkeeping (perf, depth-3 seed audit).
        if fast && !self.device_state_used && !self.stream_copy_pending {
            if let Some(restored) = self.restore_saved(setup) {
                return restored;
            }
        }
        let params = self.key(setup)?;
        if self.reset_mode == ResetMode::Fresh {
            self.ctx = None;
            self.saved = None;
            let ctx = self.open(&params)?;
            self.ctx = Some((params, ctx));
        } else if std::mem::take(&mut self.device_state_used)
            | std::mem::take(&mut self.stream_copy_pending)
        {
            // Its saved setup state is still good: restore it into the new context.
            let saved = self.saved.take();
            self.ctx = None;
            self.switch_context(params)?;
            self.saved = saved;
        } else if self.ctx.as_ref().map(|(p, _)| p) != Some(&params) {
            self.switch_context(params)?;
        }
        // A whole-state load leaves the slot search's head at the start of the cache
        // (`llama_kv_cache::state_read` clears first), where the setup left it past its last
        // cell. In a memory with a windowed cache (iSWA, hybrid-iSWA, DSA-iSWA: `has_window`;
        // DSA-iSWA's was restored until `reset_equivalence_dsa_iswa_0.1.161`) the head decides
        // which masked cells the next decode
        // overwrites (src/llama-kv-cache.cpp:1020-1105), so a restored setup would evict other
        // positions than the setup built from scratch (and the C reproducer) does: such setups
        // are rebuilt every trial. So are setups with recurrent rollback (`n_rs_seq` > 0): a load
        // writes a state's rows to plane 0 only and resets `rs_idx`, so the snapshot planes a
        // rollback reads are not the ones the setup's decodes wrote
        // (src/llama-memory-recurrent.cpp, `state_read_data`; every rollback after such a
        // restore differed from a fresh decode, 125 of 125 in the first `rollback` audit). And
        // so are hybrid-idx setups: 0.1.161's load re-pools the QSA blocks without the indexer
        // cells' M-RoPE ext (`round_trip_logits_hybrid_idx_load_drops_the_indexer_cell_ext`), so
        // a restored setup kept its cells and changed its logits (`decode(0, 1)` after it: 0.14
        // from a fresh decode; `reset_equivalence_hybrid_idx_0.1.161`). A class, not a check:
        // comparing two probe decodes' logits after the load with the built setup's (once per
        // setup, as the cells are compared below) found them equal (2026-12-06), since whether
        // the lost cell exts change the top-k choice depends on the tokens a trial decodes.
        if fast {
            if let Some(restored) = self.restore_saved(setup) {
                return restored;
            }
            self.saved = None;
        }
        self.rebuild(setup)?;
        if fast && !self.unrestorable.contains(setup) {
            let bytes = self
                .ctx()?
                .state_get()
                .map_err(|e| self.harness(format!("save: {e:#}")))?;
            // A restore is only a fast reset if it gives back what the setup built: on some pins
            // and configurations it does not (0.1.156 keeps one stream of a multi-stream whole
            // state, corpora/). Checked once per setup; such a setup is rebuilt every time, and
            // the round-trip oracle reports the loss as a finding.
            let built = self.snapshot(setup)?;
            self.ctx()?
                .state_set(&bytes)
                .map_err(|e| self.harness(format!("restore: {e:#}")))?;
            if self.snapshot(setup)? == built {
                self.saved = Some((setup.clone(), bytes, self.slots.clone()));
            } else {
                self.unrestorable.push(setup.clone());
                self.saved = None;
                self.rebuild(setup)?;
            }
        }
        Ok(())
    }

    /// Puts `setup`'s dumps of other configurations in their slots: each made once by a
    /// second target (its own context of the other configuration, the setup's ops, a save) and
    /// kept. A configuration llama.cpp refuses makes the setup unsupported.
    fn fill_foreign(&mut self, setup: &Setup) -> Result<(), HarnessError> {
        for f in &setup.foreign {
            let kept = self
                .foreign_dumps
                .iter()
                .find(|(s, d, _)| s == setup && d == f)
                .map(|(_, _, b)| b.clone());
            let bytes = match kept {
                Some(b) => b,
                None => {
                    let maker_setup = f.maker(setup).map_err(|e| self.harness(e))?;
                    if self.foreign_maker.is_none() {
                        let mut t = self.fresh_copy();
                        t.reset_mode = ResetMode::Rebuild;
                        self.foreign_maker = Some(Box::new(t));
                    }
                    let maker = self.foreign_maker.as_mut().expect("made above");
                    maker.reset(&maker_setup)?;
                    let c = maker.ctx()?;
                    let saved = match f.seq {
                        None => c.state_get(),
                        Some(seq) => c.state_seq_get(seq),
                    };
                    let b = saved.map_err(|e| {
                        self.harness(format!(
                            "the dump of slot {} under {}: {e:#}",
                            f.slot, f.config
                        ))
                    })?;
                    if self.foreign_dumps.len() >= MAX_FOREIGN_KEPT {
                        self.foreign_dumps.remove(0);
                    }
                    self.foreign_dumps
                        .push((setup.clone(), f.clone(), b.clone()));
                    b
                }
            };
            self.slots.save(&f.slot, bytes);
        }
        Ok(())
    }

    fn rebuild(&mut self, setup: &Setup) -> Result<(), HarnessError> {
        self.ctx()?.clear(true).map_err(|e| self.harness(e))?;
        crate::base::cache::apply_setup_ops(self, setup)?;
        Ok(())
    }
}

/// llama.cpp is observed through its own accessors and per-sequence dumps.
impl DumpObserved for LlamaTarget {
    fn dump_target_name(&self) -> String {
        self.label.clone()
    }

    fn dump_format(&self) -> StateFormat {
        StateFormat {
            memory: self.memory,
            ..self.format
        }
    }

    fn accessors(&mut self, seq: SeqId) -> Result<(Pos, Pos), HarnessError> {
        let r = self.ctx()?.seq_pos_min(seq);
        let min = r.map_err(|e| self.harness(format!("{e:#}")))?;
        Ok((min, self.pos_max(seq)?))
    }

    fn dump_into(&mut self, seq: SeqId, into: &mut Vec<u8>) -> Result<(), HarnessError> {
        self.seq_state_into(seq, into)
    }
}

impl CacheUnderTest for LlamaTarget {
    fn info(&self) -> TargetInfo {
        // A source tree's shim says its label; reports want what the tree says of itself.
        let version = match super::pins::Pin::parse(&self.label) {
            Ok(pin) if pin.tree.is_some() => pin.version_text().ok(),
            _ => None,
        };
        TargetInfo {
            name: self.label.clone(),
            version: version.unwrap_or_else(|| self.shim.version().to_string()),
            faults: self.faults.names(),
            model: model_name(&self.model),
            state_format: self.format,
        }
    }

    fn reset(&mut self, setup: &Setup) -> Result<(), HarnessError> {
        if !setup.engine.is_empty() {
            return crate::base::cache::refuse_engine_settings(&self.label, setup);
        }
        self.memory = setup.arch.memory();
        self.reset_context(setup)?;
        if setup.foreign.is_empty() {
            return Ok(());
        }
        self.fill_foreign(setup)
    }

    fn apply(&mut self, op: &Op) -> Result<OpOutcome, HarnessError> {
        let Some((params, ctx)) = self.ctx.as_mut() else {
            return Err(self.harness("no context: reset first"));
        };
        if let Op::StateSeqSave { flags, .. } | Op::StateSeqLoad { flags, .. } = op {
            self.device_state_used |= flags & STATE_SEQ_FLAGS_ON_DEVICE != 0;
        }
        // kv_unified is a flag: 1 in the shim's encoding when on. Looked up only for the ops
        // that depend on it (a lookup by name on every op was a measurable part of a trial).
        let unified = || params.params.get(Key::KvUnified.name()) == Some(1);
        if let Op::SeqCp { src, dst, .. } = op {
            self.stream_copy_pending |= src != dst && !unified();
        }
        let sent = if self.faulty {
            match self.faults.op_sent(op, unified) {
                Some(sent) => sent,
                None => return Ok(OpOutcome::Done { returned: None }),
            }
        } else {
            std::borrow::Cow::Borrowed(op)
        };
        let applied = apply_op(ctx, &mut self.slots, &sent);
        let outcome = applied.map_err(|e| HarnessError::Target {
            target: self.label.clone(),
            message: format!("{op}: {e:#}"),
        })?;
        if let Op::StateSeqSave { slot, .. } = &*sent {
            if let Ok(bytes) = self.slots.load(slot, None, None) {
                let bytes = self.faults.seq_dump(bytes, self.format, self.memory);
                self.slots.save(slot, bytes);
            }
        }
        if outcome == (OpOutcome::Decoded { rc: 0 }) {
            self.logits_valid = true;
        }
        if op.kind() == OpKind::StateLoad {
            // The loaded state brings its own output buffer: not the logits of our last decode.
            self.logits_valid = false;
        }
        Ok(outcome)
    }

    fn observe_seq(&mut self, seq: SeqId, out: &mut SeqObservation) -> Result<(), HarnessError> {
        dump_cells::observe_seq(self, seq, out)
    }

    fn next_pos(&mut self, seq: SeqId) -> Result<Pos, HarnessError> {
        Ok(self.pos_max(seq)? + 1)
    }

    fn whole_cells(&mut self, whole: &[u8]) -> Result<Option<Vec<WholeCell>>, HarnessError> {
        dump_cells::whole_cells(self, whole)
    }

    fn seq_state(&mut self, seq: SeqId) -> Result<Vec<u8>, HarnessError> {
        let mut bytes = Vec::new();
        self.seq_state_into(seq, &mut bytes)?;
        Ok(bytes)
    }

    fn seq_state_into(&mut self, seq: SeqId, into: &mut Vec<u8>) -> Result<(), HarnessError> {
        let r = self.ctx()?.state_seq_get_into(seq, into);
        r.map_err(|e| self.harness(format!("{e:#}")))?;
        if self.faulty {
            self.faults
                .seq_dump_in_place(into, self.format, self.memory);
        }
        Ok(())
    }

    fn last_logits(&mut self) -> Result<Option<Vec<f32>>, HarnessError> {
        if !self.logits_valid {
            return Ok(None);
        }
        let r = self.ctx()?.logits_last();
        r.map(Some)
            .map_err(|e| self.harness(format!("logits: {e:#}")))
    }

    fn set_seq_state(&mut self, seq: SeqId, bytes: &[u8]) -> Result<OpOutcome, HarnessError> {
        let r = self.ctx()?.state_seq_load(seq, bytes, 0);
        let read = r.map_err(|e| self.harness(format!("state_seq_set: {e:#}")))?;
        Ok(OpOutcome::Done {
            returned: Some(read > 0),
        })
    }

    fn state_get(&mut self) -> Result<Option<Vec<u8>>, HarnessError> {
        let r = self.ctx()?.state_get();
        r.map(Some)
            .map_err(|e| self.harness(format!("state_get: {e:#}")))
    }

    fn state_size(&mut self, dump: Dump) -> Result<Option<DumpSize>, HarnessError> {
        let (seq, flags) = match dump {
            Dump::Whole => (None, 0),
            Dump::Seq { seq, flags } => (Some(seq), flags),
        };
        match self.ctx()?.state_dump_size(seq, flags) {
            Err(e) if no_state_seq_flags(&e) => Ok(None),
            Err(e) => Err(self.harness(format!("state sizes: {e:#}"))),
            Ok((reported, written)) => {
                let reported = match seq {
                    Some(_) => {
                        let n_seq_max = self
                            .ctx
                            .as_ref()
                            .and_then(|(k, _)| k.params.get(Key::NSeqMax.name()));
                        let n_seq_max = n_seq_max.and_then(|n| u32::try_from(n).ok());
                        self.faults
                            .seq_size_reported(reported as u64, n_seq_max.unwrap_or(1))
                    }
                    None => reported as u64,
                };
                Ok(Some(DumpSize {
                    reported,
                    written: written as u64,
                }))
            }
        }
    }

    fn allocation(&mut self) -> Result<Option<Allocation>, HarnessError> {
        let label = self.label.clone();
        let harness = |e: ShimError| HarnessError::Target {
            target: label.clone(),
            message: format!("memory allocation: {e:#}"),
        };
        let Some((key, ctx)) = self.ctx.as_mut() else {
            return Err(self.harness("no context: reset first"));
        };
        let cached = self.allocated.as_ref().filter(|(k, _)| k == key);
        let mut allocated = match cached {
            Some((_, a)) => a.clone(),
            None => {
                let parts = super::memory_log::read(ctx).map_err(harness)?;
                let n_ctx = ctx.setting_value(Key::NCtx.name()).map_err(harness)?;
                let n_seq_max = ctx.setting_value(Key::NSeqMax.name()).map_err(harness)?;
                let unified = ctx.setting_value(Key::KvUnified.name()).map_err(harness)?;
                let (Some(n_ctx), Some(n_seq_max), Some(unified)) = (n_ctx, n_seq_max, unified)
                else {
                    return Ok(None);
                };
                if parts.is_empty() {
                    return Ok(None);
                }
                let a = Allocation {
                    n_ctx: u32::try_from(n_ctx).unwrap_or(u32::MAX),
                    n_seq_max: u32::try_from(n_seq_max).unwrap_or(u32::MAX),
                    kv_unified: unified != 0,
                    parts,
                };
                self.allocated = Some((key.clone(), a.clone()));
                a
            }
        };
        self.faults.allocation(&mut allocated);
        Ok(Some(allocated))
    }

    fn state_set(&mut self, bytes: &[u8]) -> Result<OpOutcome, HarnessError> {
        self.logits_valid = false;
        let r = self.ctx()?.state_load(bytes);
        let read = r.map_err(|e| self.harness(format!("state_set: {e:#}")))?;
        Ok(OpOutcome::Done {
            returned: Some(read > 0),
        })
    }

    fn twin(&mut self) -> Result<Option<&mut dyn CacheUnderTest>, HarnessError> {
        let Some((params, _)) = self.ctx.as_ref() else {
            return Err(self.harness("no context: reset first"));
        };
        let params = params.clone();
        let current = self
            .twin
            .as_ref()
            .and_then(|t| t.ctx.as_ref())
            .is_some_and(|(p, _)| *p == params);
        if !current {
            self.twin = None;
            let ctx = self.open(&params)?;
            let mut twin = self.fresh_copy();
            twin.reset_mode = ResetMode::Rebuild;
            twin.ctx = Some((params, ctx));
            self.twin = Some(Box::new(twin));
        }
        let memory = self.memory;
        let twin = self.twin.as_mut().expect("made above");
        // Its dumps are laid out as this target's: the same memory type.
        twin.memory = memory;
        twin.logits_valid = false;
        twin.slots.clear();
        let cleared = twin.ctx()?.clear(true);
        cleared.map_err(|e| self.harness(format!("twin clear: {e:#}")))?;
        Ok(Some(&mut **self.twin.as_mut().expect("made above")))
    }
}

/// Whether the shim refused a state op's flags because its llama.cpp has none (crate versions
/// before 0.1.122: kvaudit_shim.c, `shim_no_state_seq_flags`).
fn no_state_seq_flags(e: &ShimError) -> bool {
    matches!(e, ShimError::NoData { log, .. }
        if log.contains("llama_state_seq_flags are not in this llama.cpp version"))
}

/// A state op with flags on a llama.cpp without `llama_state_seq_flags`.
fn flags_unsupported() -> OpOutcome {
    OpOutcome::Unsupported {
        reason: "llama_state_seq_flags are not in this llama.cpp version (before 0.1.122)".into(),
    }
}

/// Performs one op on a llama.cpp context: the one mapping from [`Op`] to the memory API,
/// `llama_decode` (a token outside the vocabulary is unsupported, not sent) and the state API
/// (over the trial's `slots`).
pub fn apply_op(
    c: &mut LlamaContext,
    slots: &mut SlotStore,
    op: &Op,
) -> Result<OpOutcome, ShimError> {
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
        Op::StateSeqSave {
            seq,
            ref slot,
            flags,
        } => {
            let bytes = match c.state_seq_save(seq, flags) {
                Err(e) if no_state_seq_flags(&e) => return Ok(flags_unsupported()),
                r => r?,
            };
            let written = !bytes.is_empty();
            slots.save(slot, bytes);
            Some(written)
        }
        Op::StateSeqLoad {
            seq,
            ref slot,
            flags,
            truncate,
            flip,
        } => {
            let bytes = match slots.load(slot, truncate, flip) {
                Ok(b) => b,
                Err(refused) => return Ok(refused),
            };
            match c.state_seq_load(seq, &bytes, flags) {
                Err(e) if no_state_seq_flags(&e) => return Ok(flags_unsupported()),
                r => Some(r? > 0),
            }
        }
        Op::StateSave { ref slot } => {
            let bytes = c.state_save()?;
            let written = !bytes.is_empty();
            slots.save(slot, bytes);
            Some(written)
        }
        Op::StateLoad {
            ref slot,
            truncate,
            flip,
        } => {
            let bytes = match slots.load(slot, truncate, flip) {
                Ok(b) => b,
                Err(refused) => return Ok(refused),
            };
            Some(c.state_load(&bytes)? > 0)
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
