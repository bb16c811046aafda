//! The adapter from the native cell cache (crate `native-kv`) to [`CacheUnderTest`].
//!
//! The cache itself knows nothing of kvaudit; this module maps ops onto its calls, its refusals
//! onto [`OpOutcome::Refused`] and its decode errors onto `llama_decode` return codes, and keeps
//! what belongs to the context rather than the cache: the trial's state buffers
//! ([`SlotStore`]) and what `LLAMA_STATE_SEQ_FLAGS_ON_DEVICE` saves keep on the side
//! ([`ContextState`]).
//!
//! Setup mapping (`config.rs`, `memory_config`): the architecture picks the memory as llama.cpp's
//! `create_memory` does (`llama`: an attention cache; `gemma2`: iSWA; `mamba`: recurrent;
//! `jamba`, `lfm2`: hybrid; see `native_kv::memory`). `n_ctx` is padded as llama.cpp pads it (a multiple
//! of 256; with one stream per sequence, each stream holds `pad(n_ctx / n_seq_max, 256)` cells),
//! `kv_unified` picks one stream or one per sequence. iSWA takes the window [`NATIVE_N_SWA`] (the
//! tiny gemma2 models' `sliding_window`), and sizes its windowed cache from `n_ubatch` and
//! `swa_full` as llama.cpp does; recurrent memories roll back `n_rs_seq` tokens where the
//! architecture does (`lfm2`; elsewhere a non-zero `n_rs_seq` is unsupported), and their states carry a digest of the tokens they absorbed, from which the target
//! answers stand-in logits ([`stand_in_logits`]) for the cache-invisible oracle (attention
//! memories answer none: `native+tensors` runs the llama forward pass). Flash attention, the K/V cache types and the batch sizes otherwise
//! change how llama.cpp stores and computes rows, not the cell bookkeeping, so the native cache
//! ignores them.

use std::collections::{BTreeMap, BTreeSet};

use native_kv::{BatchToken, CacheConfig, Faults, Memory, MemoryConfig, MemoryKind, MemoryOps};

use crate::base::cache::SeqObservation;
use crate::base::cache::{
    AllocatedPart, Allocation, CacheUnderTest, Dump, DumpSize, HarnessError, OpOutcome, PartHolds,
    TargetInfo,
};
use crate::base::error::Error;
use crate::base::op::{Op, OpKind, Pos, SeqId, Setup, Slot};
use crate::base::slots::SlotStore;
use crate::base::state::StateFormat;
use crate::base::state::WholeCell;
use crate::running::state_runner::{KeyScope, KeyedTarget};
use crate::targets::dump_cells::{self, DumpObserved};

/// `LLAMA_STATE_SEQ_FLAGS_ON_DEVICE` (llama.h): the tensor data of a sequence save stays in the
/// context (`mem_storage[seq_id]`), the bytes carry the metadata only.
pub const STATE_SEQ_FLAGS_ON_DEVICE: u32 = 2;

/// The most cells the native cache allocates over all its streams: a setup beyond this is a
/// configuration it cannot take.
pub(crate) const MAX_CELLS: u64 = 1 << 20;

/// What a llama.cpp context keeps beside its KV cache for the state ops, per trial: the
/// in-trace buffers, and what `ON_DEVICE` sequence saves left in the context.
#[derive(Clone, Debug, Default)]
pub struct ContextState {
    /// The trial's state buffers.
    pub slots: SlotStore,
    /// Per sequence id saved with `ON_DEVICE`: the number of cells of its last such save (the
    /// size of the rows `mem_storage[seq_id]` holds, in cells).
    device_saves: BTreeMap<SeqId, u32>,
    /// Slots whose bytes were last written by an `ON_DEVICE` save: their rows are missing.
    device_slots: BTreeSet<Slot>,
}

impl ContextState {
    /// Forgets everything (at reset: a new context).
    pub fn clear(&mut self) {
        self.slots.clear();
        self.device_saves.clear();
        self.device_slots.clear();
    }

    /// Appends everything the state ops read to a state key: the buffers, then the `ON_DEVICE`
    /// saves and slots, each list preceded by its length.
    fn write_key(&self, out: &mut Vec<u8>) {
        self.slots.write_key(out);
        out.extend_from_slice(&(self.device_saves.len() as u64).to_le_bytes());
        for (seq, cells) in &self.device_saves {
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(&cells.to_le_bytes());
        }
        out.extend_from_slice(&(self.device_slots.len() as u64).to_le_bytes());
        for slot in &self.device_slots {
            let name = slot.to_string();
            out.extend_from_slice(&(name.len() as u64).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
        }
    }
}

/// The sliding window of the native iSWA memory, in positions: the `sliding_window` of the tiny
/// gemma2 models ([`crate::base::op::Arch::swa_window`]), which the native model has no GGUF to read from.
pub const NATIVE_N_SWA: u32 = match crate::base::op::Arch::Gemma2.swa_window() {
    Some(w) => w,
    None => 0,
};

/// The size of the stand-in vocabulary ([`stand_in_logits`]).
pub const STAND_IN_VOCAB: usize = 32;

/// The logits the native target answers after a decode into a recurrent or hybrid memory: a
/// stand-in for a forward pass, which the native model does not compute. They are a
/// deterministic function of the digest of the last token's sequence state (the fold of every
/// token it absorbed, in order: `native_kv::recurrent`) and, for a hybrid memory, of the
/// positions of the attention cells that token sees; so two memories give the same logits
/// exactly when their states absorbed the same tokens in the same order (and their attention
/// parts hold the same positions), which is what the cache-invisible oracle compares. They are
/// not a language model's logits: no tolerance is needed, and none of their values mean
/// anything on their own.
pub fn stand_in_logits(digest: u64, attention: &[Pos]) -> Vec<f32> {
    let h = attention
        .iter()
        .fold(digest, |h, &p| native_kv::recurrent::fold_digest(h, -1, p));
    (0..STAND_IN_VOCAB as i32)
        .map(|i| {
            let x = native_kv::recurrent::fold_digest(h, i, 0);
            (x >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
        })
        .collect()
}

/// The native target: a [`Memory`] of the setup's architecture, with optional faults.
#[derive(Debug)]
pub struct NativeTarget {
    faults: Faults,
    /// What `cache` was made from.
    config: MemoryConfig,
    cache: Memory,
    context: ContextState,
    /// The stand-in logits of the last decode into a recurrent or hybrid memory
    /// ([`stand_in_logits`]); an attention memory has none (no forward pass).
    last_logits: Option<Vec<f32>>,
    /// The empty twin [`CacheUnderTest::twin`] hands out, made on first use.
    twin: Option<Box<NativeTarget>>,
}

impl Clone for NativeTarget {
    /// Everything but the twin, which is scratch space rebuilt on demand (the explorer forks
    /// targets per op; copying a twin would double the cost for nothing).
    fn clone(&self) -> Self {
        NativeTarget {
            faults: self.faults,
            config: self.config,
            cache: self.cache.clone(),
            context: self.context.clone(),
            last_logits: self.last_logits.clone(),
            twin: None,
        }
    }
}

impl NativeTarget {
    /// A native target with the given faults injected.
    pub fn new(faults: Faults) -> Self {
        let config = MemoryConfig {
            cache: CacheConfig {
                faults,
                ..CacheConfig::default()
            },
            kind: MemoryKind::Kv,
        };
        NativeTarget {
            faults,
            config,
            cache: Memory::new(config),
            context: ContextState::default(),
            last_logits: None,
            twin: None,
        }
    }

    /// The memory, for tests that look inside.
    pub fn memory(&self) -> &Memory {
        &self.cache
    }
}

/// Parses a comma-separated fault list (`refcount,seq_rm_off_by_one`).
pub fn parse_faults(list: &[String]) -> Result<Faults, Error> {
    let mut faults = Faults::default();
    for name in list
        .iter()
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        if !faults.enable(name) {
            return Err(format!(
                "unknown fault '{name}' (known: {})",
                Faults::NAMES.join(", ")
            )
            .into());
        }
    }
    Ok(faults)
}

/// Performs a memory op (not a decode, not a state op) on a cell cache: the one mapping from
/// [`Op`] to the native cache's calls, for every native target. A refusal of the cache is
/// [`OpOutcome::Refused`].
pub fn apply_memory_op<M: MemoryOps>(c: &mut M, op: &Op) -> OpOutcome {
    let res = match *op {
        Op::SeqRm { seq, p0, p1 } => c.seq_rm(seq, p0, p1).map(Some),
        Op::SeqCp { src, dst, p0, p1 } => c.seq_cp(src, dst, p0, p1).map(|_| None),
        Op::SeqKeep { seq } => c.seq_keep(seq).map(|_| None),
        Op::SeqAdd { seq, p0, p1, delta } => c.seq_add(seq, p0, p1, delta).map(|_| None),
        Op::SeqDiv { seq, p0, p1, d } => c.seq_div(seq, p0, p1, d).map(|_| None),
        Op::Clear => {
            c.clear();
            Ok(None)
        }
        Op::StateSeqSave { .. }
        | Op::StateSeqLoad { .. }
        | Op::StateSave { .. }
        | Op::StateLoad { .. } => {
            return OpOutcome::Unsupported {
                reason: "state ops need the context: apply_state_op".into(),
            }
        }
        // Each native target decodes its own way (metadata only, or through the model).
        Op::Decode(_) => {
            return OpOutcome::Unsupported {
                reason: "decode is not a memory op".into(),
            }
        }
    };
    match res {
        Ok(returned) => OpOutcome::Done { returned },
        Err(e) => OpOutcome::Refused {
            reason: e.to_string(),
        },
    }
}

/// A load's outcome: llama.h's "returns 0 on failure" is `returned: Some(false)`.
pub(crate) fn loaded(res: Result<usize, native_kv::RestoreError>) -> OpOutcome {
    OpOutcome::Done {
        returned: Some(matches!(res, Ok(n) if n > 0)),
    }
}

/// Performs a state op (`state_seq_save/load`, `state_save/load`) on a cell cache and its
/// context, as llama.cpp's `llama_context` does (src/llama-context.cpp, `state_seq_get_data`,
/// `state_seq_set_data`, `state_get_data`, `state_set_data`). `None` when `op` is no state op.
///
/// `device`: whether the target models `LLAMA_STATE_SEQ_FLAGS_ON_DEVICE`. A plain KV cache
/// ignores the flags (`GGML_UNUSED(flags)` in `llama_kv_cache::state_write/read`); the context
/// does not: with `ON_DEVICE` a save writes the metadata into the bytes and keeps the rows in
/// `mem_storage[seq]`, and a load reads the rows from `mem_storage[<seq id in the bytes>]`. What
/// that does at the cell level is modelled here:
/// - the bytes of an `ON_DEVICE` save have no rows; loaded without the flag they fail where the
///   rows should be, and the destination sequence is emptied (as any failure after the cells);
/// - an `ON_DEVICE` load of bytes too short for the header or with a bad magic throws outside
///   llama.cpp's `try` (the process terminates), and one whose header names a sequence never
///   saved `ON_DEVICE` in this context hits `GGML_ASSERT(mem_storage.find(..) != end)`: both
///   abort, refused here;
/// - an `ON_DEVICE` load that restores cells reads their rows from the device copy, whose size
///   must match (`GGML_ABORT("memory buffer mismatch")`, or `mbufs.at` throwing in a destructor
///   when the save held no rows): a different cell count aborts, refused here; bytes that carry
///   rows of a plain save misread them as the next layer's header and fail like a bad K/V section.
///
/// Flag bit 1 (`PARTIAL_ONLY` / `SWA_ONLY`) leaves the base cache of an iSWA pair and the
/// attention cache of a hybrid out of the dump and the load (`native_kv::Memory::state_seq_bytes_flags`).
pub fn apply_state_op<M: MemoryOps>(
    c: &mut M,
    ctx: &mut ContextState,
    op: &Op,
    device: bool,
) -> Option<OpOutcome> {
    let unsupported = || OpOutcome::Unsupported {
        reason: "LLAMA_STATE_SEQ_FLAGS_ON_DEVICE: device-side rows are not modelled on this target"
            .into(),
    };
    Some(match op {
        Op::StateSeqSave { seq, slot, flags } => {
            let on_device = flags & STATE_SEQ_FLAGS_ON_DEVICE != 0;
            if on_device && !device {
                return Some(unsupported());
            }
            match c.state_seq_bytes_flags(*seq, *flags) {
                Ok(bytes) => {
                    if on_device {
                        ctx.device_saves.insert(*seq, cells_in(&bytes).unwrap_or(0));
                        ctx.device_slots.insert(slot.clone());
                    } else {
                        ctx.device_slots.remove(slot);
                    }
                    let written = !bytes.is_empty();
                    ctx.slots.save(slot, bytes);
                    OpOutcome::Done {
                        returned: Some(written),
                    }
                }
                Err(e) => OpOutcome::Refused {
                    reason: e.to_string(),
                },
            }
        }
        Op::StateSeqLoad {
            seq,
            slot,
            flags,
            truncate,
            flip,
        } => {
            let on_device = flags & STATE_SEQ_FLAGS_ON_DEVICE != 0;
            if on_device && !device {
                return Some(unsupported());
            }
            let bytes = match ctx.slots.load(slot, *truncate, *flip) {
                Ok(b) => b,
                Err(refused) => return Some(refused),
            };
            if let Err(e) = c.check_seq(*seq) {
                return Some(OpOutcome::Refused {
                    reason: e.to_string(),
                });
            }
            let rows_missing = ctx.device_slots.contains(slot);
            if on_device {
                return Some(load_on_device(c, ctx, *seq, &bytes, rows_missing));
            }
            let res = c.state_seq_set_bytes_flags(*seq, &bytes, *flags);
            if rows_missing && res.is_ok() && cells_in(&bytes).unwrap_or(0) > 0 {
                // llama.cpp reads rows the bytes do not have: a failure after the cells.
                c.seq_rm(*seq, -1, -1).expect("seq checked");
                return Some(OpOutcome::Done {
                    returned: Some(false),
                });
            }
            loaded(res)
        }
        Op::StateSave { slot } => {
            let bytes = c.state_bytes();
            ctx.device_slots.remove(slot);
            ctx.slots.save(slot, bytes);
            OpOutcome::Done {
                returned: Some(true),
            }
        }
        Op::StateLoad {
            slot,
            truncate,
            flip,
        } => {
            let bytes = match ctx.slots.load(slot, *truncate, *flip) {
                Ok(b) => b,
                Err(refused) => return Some(refused),
            };
            loaded(c.state_set_bytes(&bytes))
        }
        Op::SeqRm { .. }
        | Op::SeqCp { .. }
        | Op::SeqKeep { .. }
        | Op::SeqAdd { .. }
        | Op::SeqDiv { .. }
        | Op::Clear
        | Op::Decode(_) => return None,
    })
}

/// An `ON_DEVICE` sequence load (see [`apply_state_op`]).
fn load_on_device<M: MemoryOps>(
    c: &mut M,
    ctx: &ContextState,
    seq: SeqId,
    bytes: &[u8],
    rows_missing: bool,
) -> OpOutcome {
    let abort = |why: String| OpOutcome::Refused {
        reason: format!("llama.cpp aborts: {why}"),
    };
    let Some(header_seq) = native_kv::state_seq_header(bytes) else {
        return abort(
            "ON_DEVICE load of bytes without a sequence-state header throws outside the try".into(),
        );
    };
    let Some(&saved) = ctx.device_saves.get(&header_seq) else {
        return abort(format!(
            "ON_DEVICE load of a state of seq {header_seq}, never saved ON_DEVICE in this context \
             (GGML_ASSERT mem_storage.find(seq_id_read) != end)"
        ));
    };
    let res = c.state_seq_set_bytes(seq, bytes);
    let read = match res {
        Ok(_) => cells_in(bytes).unwrap_or(0),
        Err(_) => return loaded(res),
    };
    if read > 0 && !rows_missing {
        // The plain save's rows sit where the next layer's header is read.
        c.seq_rm(seq, -1, -1).expect("seq checked");
        return OpOutcome::Done {
            returned: Some(false),
        };
    }
    if read > 0 && read != saved {
        return abort(format!(
            "ON_DEVICE load of {read} cells from a device copy of {saved} (memory buffer mismatch)"
        ));
    }
    loaded(res)
}

/// The number of cells over every stream of a sequence dump, when the bytes parse.
fn cells_in(bytes: &[u8]) -> Option<u32> {
    let crate::base::state::SeqState { caches, .. } =
        crate::base::state::parse_seq_state(bytes, StateFormat::default()).ok()?;
    Some(caches.first()?.iter().map(|s| s.cells.len() as u32).sum())
}

/// The batch of a decode op, one [`BatchToken`] per token.
pub fn batch_of(d: &crate::base::op::Decode) -> Vec<BatchToken> {
    d.token_ids()
        .into_iter()
        .enumerate()
        .map(|(i, token)| BatchToken {
            token,
            pos: d.pos.map(|p| p + i as Pos),
            seqs: d.seqs.clone(),
        })
        .collect()
}

/// What a native cell cache (`name`: `native` or `native+tensors`) with `faults` says it is.
pub(crate) fn native_info(name: &str, faults: Faults) -> TargetInfo {
    TargetInfo {
        name: name.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        faults: faults.enabled().into_iter().map(String::from).collect(),
        model: None,
        state_format: StateFormat::default(),
    }
}

/// The native model writes llama.cpp's layout: observed as llama.cpp is, from its own bytes.
impl DumpObserved for NativeTarget {
    fn dump_target_name(&self) -> String {
        "native".into()
    }

    fn dump_format(&self) -> StateFormat {
        StateFormat {
            memory: memory_type(&self.config.kind),
            ..StateFormat::default()
        }
    }

    fn accessors(&mut self, seq: SeqId) -> Result<(Pos, Pos), HarnessError> {
        let e = |e| harness_error("native", e);
        Ok((
            self.cache.seq_pos_min(seq).map_err(e)?,
            self.cache.seq_pos_max(seq).map_err(e)?,
        ))
    }

    fn dump_into(&mut self, seq: SeqId, into: &mut Vec<u8>) -> Result<(), HarnessError> {
        *into = self.seq_state(seq)?;
        Ok(())
    }
}

impl CacheUnderTest for NativeTarget {
    fn info(&self) -> TargetInfo {
        native_info("native", self.faults)
    }

    fn reset(&mut self, setup: &Setup) -> Result<(), HarnessError> {
        let config = memory_config("native", setup, self.faults)?;
        if self.config == config {
            self.cache.clear();
        } else {
            self.cache = Memory::new(config);
            self.config = config;
        }
        self.context.clear();
        self.last_logits = None;
        crate::base::cache::apply_setup_ops(self, setup)?;
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Result<OpOutcome, HarnessError> {
        Ok(match op {
            Op::StateSeqSave { .. }
            | Op::StateSeqLoad { .. }
            | Op::StateSave { .. }
            | Op::StateLoad { .. } => {
                let outcome = apply_state_op(&mut self.cache, &mut self.context, op, true)
                    .expect("apply_state_op takes every state op");
                if op.kind() == OpKind::StateLoad {
                    // A loaded context brings its own outputs: not the logits of our last decode.
                    self.last_logits = None;
                }
                outcome
            }
            Op::Decode(d) => {
                let rc = match self.cache.decode(&batch_of(d)) {
                    Ok(_) => 0,
                    Err(e) => e.return_code(),
                };
                if rc == 0 {
                    self.last_logits = self.stand_in_logits(d.seqs[0]);
                }
                OpOutcome::Decoded { rc }
            }
            Op::SeqRm { .. }
            | Op::SeqCp { .. }
            | Op::SeqKeep { .. }
            | Op::SeqAdd { .. }
            | Op::SeqDiv { .. }
            | Op::Clear => apply_memory_op(&mut self.cache, op),
        })
    }

    fn last_logits(&mut self) -> Result<Option<Vec<f32>>, HarnessError> {
        Ok(self.last_logits.clone())
    }

    fn observe_seq(&mut self, seq: SeqId, out: &mut SeqObservation) -> Result<(), HarnessError> {
        dump_cells::observe_seq(self, seq, out)
    }

    fn next_pos(&mut self, seq: SeqId) -> Result<Pos, HarnessError> {
        Ok(self.accessors(seq)?.1 + 1)
    }

    fn whole_cells(&mut self, whole: &[u8]) -> Result<Option<Vec<WholeCell>>, HarnessError> {
        dump_cells::whole_cells(self, whole)
    }

    fn seq_state(&mut self, seq: SeqId) -> Result<Vec<u8>, HarnessError> {
        self.cache
            .state_seq_bytes(seq)
            .map_err(|e| harness_error("native", e))
    }

    fn fork(&self) -> Option<Box<dyn CacheUnderTest + Send>> {
        Some(Box::new(self.clone()))
    }

    fn set_seq_state(&mut self, seq: SeqId, bytes: &[u8]) -> Result<OpOutcome, HarnessError> {
        Ok(set_seq_state(&mut self.cache, seq, bytes))
    }

    fn state_get(&mut self) -> Result<Option<Vec<u8>>, HarnessError> {
        Ok(Some(self.cache.state_bytes()))
    }

    /// The native model's sizes are those of its own dumps, which it writes to measure them
    /// (it has no size call of its own); `PARTIAL_ONLY` writes what flags 0 writes (the native
    /// model ignores the flag). Under `seq_size_scales_with_n_seq_max` a sequence's reported
    /// size is 4 bytes per sequence beyond the first too large.
    fn state_size(&mut self, dump: Dump) -> Result<Option<DumpSize>, HarnessError> {
        let written = match dump {
            Dump::Whole => self.cache.state_bytes().len() as u64,
            Dump::Seq { seq, .. } => self.seq_state(seq)?.len() as u64,
        };
        let extra = match dump {
            Dump::Seq { .. } if self.faults.seq_size_scales_with_n_seq_max => {
                4 * u64::from(self.config.cache.n_seq_max.saturating_sub(1))
            }
            _ => 0,
        };
        Ok(Some(DumpSize {
            reported: written + extra,
            written,
        }))
    }

    /// What llama.cpp's memory of the same kind allocates for this configuration (the parts it
    /// makes, `targets/llama/memory_log.rs`), from the cells per stream the model holds. Under
    /// `attn_sized_by_n_ctx` each cache of the context's positions is reported at the whole
    /// context per stream.
    fn allocation(&mut self) -> Result<Option<Allocation>, HarnessError> {
        let c = self.config.cache;
        let streams = if c.unified { 1 } else { c.n_seq_max.max(1) };
        let n_ctx = c.n_ctx * streams;
        let context = |name: &str| AllocatedPart {
            name: name.into(),
            holds: PartHolds::Context,
            cells: if self.faults.attn_sized_by_n_ctx {
                n_ctx
            } else {
                c.n_ctx
            },
            streams,
        };
        let windowed = |swa_size: u32| AllocatedPart {
            name: "SWA KV cache".into(),
            holds: PartHolds::AtMostContext,
            cells: swa_size,
            streams,
        };
        let states = AllocatedPart {
            name: "llama_memory_recurrent".into(),
            holds: PartHolds::States,
            cells: c.n_seq_max.max(1),
            streams: 1,
        };
        let parts = match self.config.kind {
            MemoryKind::Kv => vec![context("llama_kv_cache")],
            MemoryKind::Iswa { swa_size, .. } => {
                vec![context("non-SWA KV cache"), windowed(swa_size)]
            }
            MemoryKind::Msa | MemoryKind::Dsa => {
                vec![context("main KV cache"), context("indexer KV cache")]
            }
            MemoryKind::DsaIswa { swa_size, .. } => vec![
                context("main KV cache"),
                context("indexer KV cache"),
                windowed(swa_size),
            ],
            MemoryKind::Recurrent { .. } => vec![states],
            MemoryKind::Hybrid { .. } => vec![context("llama_kv_cache"), states],
            MemoryKind::HybridIswa { swa_size, .. } => {
                vec![context("non-SWA KV cache"), windowed(swa_size), states]
            }
            MemoryKind::HybridIdx { .. } => vec![
                context("llama_kv_cache"),
                states,
                context("indexer KV cache"),
            ],
        };
        Ok(Some(Allocation {
            n_ctx,
            n_seq_max: c.n_seq_max.max(1),
            kv_unified: c.unified,
            parts,
        }))
    }

    fn state_set(&mut self, bytes: &[u8]) -> Result<OpOutcome, HarnessError> {
        self.last_logits = None;
        Ok(loaded(self.cache.state_set_bytes(bytes)))
    }

    /// The complete key of [`KeyedTarget::write_state_key`]: the twin every round trip empties
    /// is the only thing it leaves out.
    fn observation_key(&self, out: &mut Vec<u8>) -> bool {
        KeyedTarget::write_state_key(self, out, KeyScope::Complete);
        true
    }

    fn twin(&mut self) -> Result<Option<&mut dyn CacheUnderTest>, HarnessError> {
        let config = self.config;
        let twin = self
            .twin
            .get_or_insert_with(|| Box::new(NativeTarget::new(self.faults)));
        if twin.config == config {
            twin.cache.clear();
        } else {
            twin.cache = Memory::new(config);
            twin.config = config;
        }
        twin.context.clear();
        twin.last_logits = None;
        Ok(Some(&mut **twin))
    }
}

/// The native target's complete state is its memory (cells, pending shifts, sequence bitsets,
/// heads, the position index; recurrent cells and rollbacks), its context (the trial's buffers,
/// what `ON_DEVICE` saves left behind) and the stand-in logits of its last decode. The
/// configuration is fixed by the setup, and the twin is scratch that every use empties.
impl KeyedTarget for NativeTarget {
    fn fork_keyed(&self) -> Box<dyn KeyedTarget> {
        Box::new(self.clone())
    }

    fn write_state_key(&self, out: &mut Vec<u8>, scope: KeyScope) {
        let scope = match scope {
            KeyScope::Complete => native_kv::KeyScope::Complete,
            KeyScope::WithoutIndex => native_kv::KeyScope::WithoutIndex,
        };
        self.cache
            .write_state_key(out, scope)
            .expect("the native target's memory carries no tensor payload");
        self.context.write_key(out);
        match &self.last_logits {
            None => out.push(0),
            Some(logits) => {
                out.push(1);
                out.extend_from_slice(&(logits.len() as u64).to_le_bytes());
                for x in logits {
                    out.extend_from_slice(&x.to_bits().to_le_bytes());
                }
            }
        }
    }
}

impl NativeTarget {
    /// The stand-in logits after a decode whose last token's first sequence is `seq`: `None`
    /// for an attention memory (no forward pass) or a sequence without a state.
    fn stand_in_logits(&self, seq: SeqId) -> Option<Vec<f32>> {
        let digest = self.cache.state_digest(seq)?;
        let pos = self.cache.seq_pos_max(seq).ok()?;
        Some(stand_in_logits(
            digest,
            &self.cache.attention_positions(seq, pos),
        ))
    }
}

/// `llama_state_seq_set_data(bytes, seq)` on a cell cache: an invalid `seq` is refused, a load
/// that fails is `returned: Some(false)` (llama.cpp returned 0).
pub(crate) fn set_seq_state<M: MemoryOps>(c: &mut M, seq: SeqId, bytes: &[u8]) -> OpOutcome {
    if let Err(e) = c.check_seq(seq) {
        return OpOutcome::Refused {
            reason: e.to_string(),
        };
    }
    loaded(c.state_seq_set_bytes(seq, bytes))
}

/// A cache refusal where the harness expected none (an accessor on an invalid sequence).
pub(crate) fn harness_error(target: &str, e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Target {
        target: target.into(),
        message: e.to_string(),
    }
}

mod config;
pub use config::lacks_memory;
pub(crate) use config::{cache_config, memory_config, memory_type};

#[cfg(test)]
mod tests;
