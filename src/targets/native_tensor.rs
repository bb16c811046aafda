//! Target `native+tensors`: the native cell cache with its tensor payload, filled by the reference
//! llama model, so that its K/V rows and logits are real.
//!
//! Every decode places the batch in the cell cache (batch validation, slot search, placement:
//! exactly what the metadata-only `native` target does), then runs
//! [`Model::forward_token`] for each token in batch order over [`CellKv`], a
//! [`KvStore`] view of the cell cache itself: `append` writes the token's rows into its cell,
//! `visible` returns the cells the query may attend, chosen by the cache
//! ([`CellCache::attention_cells`]: same sequence, position `<=` the query's, inside the
//! sliding window by absolute position). A token sees the tokens before it in its batch, as
//! llama.cpp's batch mask lets it whenever a sequence's positions increase within the batch (a
//! batch that repeats a position in one sequence is the one case where the two differ: llama.cpp
//! lets both tokens see each other). Like llama.cpp's mask, a token in several sequences attends
//! through its first one.
//!
//! Memory ops run on the cell cache; `seq_add`/`seq_div` re-position the keys of moved cells at
//! once (llama.cpp defers its K-shift to the next decode). The serialized state carries the rows
//! (per sequence and whole context), and the state ops and loads restore them
//! ([`CacheUnderTest::set_seq_state`], [`CacheUnderTest::state_set`]). With one stream per
//! sequence the payload is indexed by cell number across streams, and a cross-stream `seq_cp`
//! copies the rows with the cells. `LLAMA_STATE_SEQ_FLAGS_ON_DEVICE`, which keeps rows in the
//! context instead of the bytes, is not modelled here (the op is unsupported; the metadata-only
//! `native` target models it).

use std::path::Path;
use std::sync::Arc;

use native_kv::tensors::TensorShape;
use native_kv::{CacheConfig, CellCache, Faults};

use crate::base::cache::SeqObservation;
use crate::base::cache::{CacheUnderTest, HarnessError, OpOutcome, TargetInfo};
use crate::base::op::{Op, Pos, SeqId, Setup};
use crate::base::state::{StateFormat, WholeCell};
use crate::model::forward::{KvEntry, KvStore, Model};
use crate::targets::dump_cells::{self, DumpObserved};
use crate::targets::native::{apply_state_op, batch_of, loaded, set_seq_state, ContextState};

/// The name of this target on the command line and in reports.
pub const NAME: &str = "native+tensors";

/// The tensor shape of the native cache for `model`: its layers, KV heads, head dimension and
/// RoPE base, and its sliding window on every layer.
pub fn shape_for(model: &Model) -> TensorShape {
    let hp = model.hparams();
    TensorShape::new(hp.n_layer, hp.n_head_kv, hp.head_dim, hp.rope_freq_base)
        .with_window(hp.sliding_window)
}

/// Loads the model a `native+tensors` target runs: `path`, or the default tiny model
/// ([`crate::model::tiny::try_default_model_path`], generated on first use).
pub fn load_model(path: Option<&Path>) -> Result<Arc<Model>, HarnessError> {
    let fail = |message: String| HarnessError::Target {
        target: NAME.into(),
        message,
    };
    let path = match path {
        Some(p) => p.to_path_buf(),
        None => crate::model::tiny::try_default_model_path()
            .map_err(|e| fail(format!("writing the tiny model: {e:#}")))?,
    };
    let model = Model::load(&path).map_err(|e| fail(format!("{e:#}")))?;
    Ok(Arc::new(model))
}

/// The native cell cache with a tensor payload, driven by `model`.
#[derive(Debug)]
pub struct NativeTensorTarget {
    faults: Faults,
    model: Arc<Model>,
    cache: CellCache,
    last_logits: Option<Vec<f32>>,
    context: ContextState,
    /// The empty twin [`CacheUnderTest::twin`] hands out, made on first use.
    twin: Option<Box<NativeTensorTarget>>,
}

impl Clone for NativeTensorTarget {
    /// Everything but the twin (scratch space, rebuilt on demand).
    fn clone(&self) -> Self {
        NativeTensorTarget {
            faults: self.faults,
            model: Arc::clone(&self.model),
            cache: self.cache.clone(),
            last_logits: self.last_logits.clone(),
            context: self.context.clone(),
            twin: None,
        }
    }
}

impl NativeTensorTarget {
    /// A target running `model` (its sliding window, if any, is the cache's window on every
    /// layer), with `faults` injected.
    pub fn new(model: Arc<Model>, faults: Faults) -> Self {
        let cache = CellCache::with_tensors(
            CacheConfig {
                faults,
                ..CacheConfig::default()
            },
            shape_for(&model),
        );
        NativeTensorTarget {
            faults,
            model,
            cache,
            last_logits: None,
            context: ContextState::default(),
            twin: None,
        }
    }

    /// The default tiny model ([`crate::model::tiny::try_default_model_path`]) with `window`.
    pub fn default_model(window: Option<u32>) -> Result<Arc<Model>, HarnessError> {
        if window == Some(0) {
            return Err(HarnessError::Target {
                target: NAME.into(),
                message: "a sliding window of 0 hides every key".into(),
            });
        }
        let mut model = Arc::unwrap_or_clone(load_model(None)?);
        model.set_sliding_window(window);
        Ok(Arc::new(model))
    }

    /// The cache, for tests that look inside.
    pub fn cache(&self) -> &CellCache {
        &self.cache
    }

    /// The model the target runs.
    pub fn model(&self) -> &Model {
        &self.model
    }

    fn harness(&self, message: impl std::fmt::Display) -> HarnessError {
        HarnessError::Target {
            target: NAME.into(),
            message: message.to_string(),
        }
    }

    /// Places the batch, then runs the model token by token over the cell cache.
    fn decode(&mut self, d: &crate::base::op::Decode) -> OpOutcome {
        let batch = batch_of(d);
        let n_vocab = self.model.hparams().n_vocab;
        // llama_batch_allocr::init checks token ids first (rc -1, cache untouched).
        if batch
            .iter()
            .any(|t| t.token < 0 || t.token as usize >= n_vocab)
        {
            return OpOutcome::Decoded { rc: -1 };
        }
        let cells = match self.cache.decode(&batch) {
            Ok(cells) => cells,
            Err(e) => {
                return OpOutcome::Decoded {
                    rc: e.return_code(),
                }
            }
        };
        let mut logits = Vec::new();
        for (t, &cell) in batch.iter().zip(&cells) {
            let pos = self.cache.cell_pos(cell).expect("decode placed the cell");
            let mut kv = CellKv {
                cache: &mut self.cache,
                cell,
                seq: t.seqs[0],
            };
            logits = self.model.forward_token(t.token as u32, pos, &mut kv);
        }
        self.last_logits = Some(logits);
        OpOutcome::Decoded { rc: 0 }
    }
}

/// The cell cache as the forward pass's [`KvStore`], for one token: the cell it was placed in and
/// the sequence it attends through.
pub struct CellKv<'c> {
    /// The cache (with a tensor payload).
    pub cache: &'c mut CellCache,
    /// The token's cell.
    pub cell: usize,
    /// The token's first sequence.
    pub seq: SeqId,
}

impl KvStore for CellKv<'_> {
    fn append(&mut self, layer: usize, pos: i32, k_raw: &[f32], k_rotated: &[f32], v: &[f32]) {
        debug_assert_eq!(self.cache.cell_pos(self.cell), Some(pos));
        self.cache.write_rows(self.cell, layer, k_raw, k_rotated, v);
    }

    fn visible<'a>(
        &'a self,
        layer: usize,
        query_pos: i32,
        window: Option<u32>,
    ) -> Box<dyn Iterator<Item = KvEntry<'a>> + 'a> {
        let cache: &'a CellCache = self.cache;
        let cells = cache
            .attention_cells(self.seq, query_pos, layer, window)
            .expect("the decode validated the sequence");
        let t = cache.tensors().expect("a tensor cache");
        Box::new(cells.into_iter().map(move |c| KvEntry {
            pos: cache.cell_pos(c).expect("attended cells are resident"),
            k: t.k(c, layer),
            v: t.v(c, layer),
        }))
    }
}

/// The tensor model writes llama.cpp's layout of a plain cache: observed from its own bytes.
impl DumpObserved for NativeTensorTarget {
    fn dump_target_name(&self) -> String {
        NAME.into()
    }

    fn dump_format(&self) -> StateFormat {
        StateFormat::default()
    }

    fn accessors(&mut self, seq: SeqId) -> Result<(Pos, Pos), HarnessError> {
        Ok((
            self.cache.seq_pos_min(seq).map_err(|e| self.harness(e))?,
            self.cache.seq_pos_max(seq).map_err(|e| self.harness(e))?,
        ))
    }

    fn dump_into(&mut self, seq: SeqId, into: &mut Vec<u8>) -> Result<(), HarnessError> {
        *into = self.seq_state(seq)?;
        Ok(())
    }
}

impl CacheUnderTest for NativeTensorTarget {
    fn info(&self) -> TargetInfo {
        crate::targets::native::native_info(NAME, self.faults)
    }

    fn reset(&mut self, setup: &Setup) -> Result<(), HarnessError> {
        let config = crate::targets::native::cache_config(NAME, setup, self.faults)?;
        if *self.cache.config() == config {
            self.cache.clear();
        } else {
            self.cache = CellCache::with_tensors(config, shape_for(&self.model));
        }
        self.last_logits = None;
        self.context.clear();
        crate::base::cache::apply_setup_ops(self, setup)?;
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Result<OpOutcome, HarnessError> {
        Ok(match op {
            // ON_DEVICE saves keep rows in the context: not modelled here (Unsupported).
            Op::StateSeqSave { .. }
            | Op::StateSeqLoad { .. }
            | Op::StateSave { .. }
            | Op::StateLoad { .. } => apply_state_op(&mut self.cache, &mut self.context, op, false)
                .expect("apply_state_op takes every state op"),
            Op::Decode(d) => self.decode(d),
            Op::SeqRm { .. }
            | Op::SeqCp { .. }
            | Op::SeqKeep { .. }
            | Op::SeqAdd { .. }
            | Op::SeqDiv { .. }
            | Op::Clear => crate::targets::native::apply_memory_op(&mut self.cache, op),
        })
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
        self.cache.state_seq_bytes(seq).map_err(|e| self.harness(e))
    }

    fn fork(&self) -> Option<Box<dyn CacheUnderTest + Send>> {
        Some(Box::new(self.clone()))
    }

    fn last_logits(&mut self) -> Result<Option<Vec<f32>>, HarnessError> {
        Ok(self.last_logits.clone())
    }

    fn set_seq_state(&mut self, seq: SeqId, bytes: &[u8]) -> Result<OpOutcome, HarnessError> {
        Ok(set_seq_state(&mut self.cache, seq, bytes))
    }

    fn state_get(&mut self) -> Result<Option<Vec<u8>>, HarnessError> {
        Ok(Some(self.cache.state_bytes()))
    }

    fn state_set(&mut self, bytes: &[u8]) -> Result<OpOutcome, HarnessError> {
        Ok(loaded(self.cache.state_set_bytes(bytes)))
    }

    fn twin(&mut self) -> Result<Option<&mut dyn CacheUnderTest>, HarnessError> {
        let config = *self.cache.config();
        let twin = self.twin.get_or_insert_with(|| {
            Box::new(NativeTensorTarget::new(
                Arc::clone(&self.model),
                self.faults,
            ))
        });
        if *twin.cache.config() == config {
            twin.cache.clear();
        } else {
            twin.cache = CellCache::with_tensors(config, shape_for(&twin.model));
        }
        twin.last_logits = None;
        twin.context.clear();
        Ok(Some(&mut **twin))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::op::Decode;
    use crate::base::state::{parse_seq_state, StateFormat};
    use crate::model::forward::max_abs_diff;

    const PROMPT: [i32; 7] = [1, 17, 42, 5, 63, 8, 30];

    fn target(window: Option<u32>, faults: Faults) -> NativeTensorTarget {
        NativeTensorTarget::new(NativeTensorTarget::default_model(window).unwrap(), faults)
    }

    fn decode(seq: SeqId, tokens: &[i32]) -> Op {
        Op::Decode(Decode::tokens(seq, tokens))
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn decode_through_the_cell_cache_equals_the_cacheless_reference() {
        let mut t = target(None, Faults::default());
        t.reset(&Setup::default()).unwrap();
        assert_eq!(
            t.apply(&decode(0, &PROMPT)).unwrap(),
            OpOutcome::Decoded { rc: 0 }
        );
        let tokens: Vec<u32> = PROMPT.iter().map(|&x| x as u32).collect();
        let positions: Vec<i32> = (0..7).collect();
        let reference = t.model().forward_sequence(&tokens, &positions);
        let last = t.last_logits().unwrap().unwrap();
        assert_eq!(
            bits(&last),
            bits(&reference[6]),
            "max|Δ| = {:e}",
            max_abs_diff(&last, &reference[6])
        );
        // The serialized state carries 2 layers of 7 F32 rows of 32 values for K and for V.
        let bytes = t.seq_state(0).unwrap();
        let parsed = parse_seq_state(&bytes, StateFormat::default()).unwrap();
        let kv = parsed.caches[0][0].kv.as_ref().unwrap();
        assert_eq!(
            (kv.n_layer, kv.k[1].row_bytes, kv.v[0].data.len()),
            (2, 128, 7 * 128)
        );
    }

    #[test]
    fn bad_tokens_are_refused_and_restore_works() {
        let mut t = target(None, Faults::default());
        t.reset(&Setup::default()).unwrap();
        assert_eq!(
            t.apply(&decode(0, &[1, 64])).unwrap(),
            OpOutcome::Decoded { rc: -1 }
        );
        assert_eq!(SeqObservation::of(&mut t, 0).unwrap().pos_max, -1);
        t.apply(&decode(0, &PROMPT)).unwrap();
        let bytes = t.seq_state(0).unwrap();
        t.reset(&Setup::default()).unwrap();
        assert_eq!(
            t.set_seq_state(0, &bytes).unwrap(),
            OpOutcome::Done {
                returned: Some(true)
            }
        );
        assert_eq!(t.seq_state(0).unwrap(), bytes);
        assert_eq!(
            t.set_seq_state(0, &bytes[..20]).unwrap(),
            OpOutcome::Done {
                returned: Some(false)
            }
        );
    }
}
