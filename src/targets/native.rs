//! The adapter from the native cell cache (crate `native-kv`) to [`CacheUnderTest`].
//!
//! The cache itself knows nothing of kvaudit; this module maps ops onto its calls, its refusals
//! onto [`OpOutcome::Refused`] and its decode errors onto `llama_decode` return codes.

use native_kv::{BatchToken, CacheConfig, CellCache, Faults};

use crate::base::error::Error;
use crate::base::op::{Op, Pos, SeqId, Setup};
use crate::base::state::StateFormat;
use crate::base::target::{CacheUnderTest, HarnessError, OpOutcome, TargetInfo};

/// The native target: a [`CellCache`] with optional faults.
#[derive(Clone, Debug)]
pub struct NativeTarget {
    faults: Faults,
    cache: CellCache,
}

impl NativeTarget {
    /// A native target with the given faults injected.
    pub fn new(faults: Faults) -> Self {
        NativeTarget {
            faults,
            cache: CellCache::new(CacheConfig {
                faults,
                ..CacheConfig::default()
            }),
        }
    }

    /// The cache, for tests that look inside.
    pub fn cache(&self) -> &CellCache {
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

/// Performs a memory op (not a decode) on a cell cache: the one mapping from [`Op`] to the
/// native cache's calls, for every native target. A refusal of the cache is
/// [`OpOutcome::Refused`].
pub fn apply_memory_op(c: &mut CellCache, op: &Op) -> OpOutcome {
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
        Op::StateSeqSave { .. } | Op::StateSeqLoad { .. } | Op::StateSave { .. } | Op::StateLoad { .. } => {
            return OpOutcome::Unsupported { reason: "state ops: not yet implemented natively".into() }
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

/// The cell cache configuration for `setup`, or why the native cache `name` cannot hold it.
pub(crate) fn cache_config(
    name: &str,
    setup: &Setup,
    faults: Faults,
) -> Result<CacheConfig, HarnessError> {
    if setup.n_seq_max as usize > native_kv::MAX_SEQ {
        return Err(HarnessError::Target {
            target: name.into(),
            message: format!(
                "n_seq_max {} above the native limit {}",
                setup.n_seq_max,
                native_kv::MAX_SEQ
            ),
        });
    }
    Ok(CacheConfig {
        n_ctx: setup.n_ctx,
        n_seq_max: setup.n_seq_max,
        faults,
    })
}

impl CacheUnderTest for NativeTarget {
    fn info(&self) -> TargetInfo {
        native_info("native", self.faults)
    }

    fn reset(&mut self, setup: &Setup) -> Result<(), HarnessError> {
        let config = cache_config("native", setup, self.faults)?;
        if *self.cache.config() == config {
            self.cache.clear();
        } else {
            self.cache = CellCache::new(config);
        }
        crate::base::target::apply_setup_ops(self, setup)?;
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Result<OpOutcome, HarnessError> {
        Ok(match op {
            Op::Decode(d) => {
                let rc = match self.cache.decode(&batch_of(d)) {
                    Ok(_) => 0,
                    Err(e) => e.return_code(),
                };
                OpOutcome::Decoded { rc }
            }
            other => apply_memory_op(&mut self.cache, other),
        })
    }

    fn seq_pos_min(&mut self, seq: SeqId) -> Result<Pos, HarnessError> {
        self.cache
            .seq_pos_min(seq)
            .map_err(|e| HarnessError::Target {
                target: "native".into(),
                message: e.to_string(),
            })
    }

    fn seq_pos_max(&mut self, seq: SeqId) -> Result<Pos, HarnessError> {
        self.cache
            .seq_pos_max(seq)
            .map_err(|e| HarnessError::Target {
                target: "native".into(),
                message: e.to_string(),
            })
    }

    fn seq_state(&mut self, seq: SeqId) -> Result<Vec<u8>, HarnessError> {
        self.cache
            .state_seq_bytes(seq)
            .map_err(|e| HarnessError::Target {
                target: "native".into(),
                message: e.to_string(),
            })
    }

    fn fork(&self) -> Option<Box<dyn CacheUnderTest + Send>> {
        Some(Box::new(self.clone()))
    }
}
