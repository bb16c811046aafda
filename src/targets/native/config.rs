//! The native memory a setup asks for (`memory_config`, `cache_config`): the architecture
//! picks the memory as llama.cpp's `create_memory` does, `n_ctx` is padded and split into
//! streams as llama.cpp does, iSWA's windowed cache is sized from `n_ubatch` and `swa_full`,
//! recurrent memories roll back `n_rs_seq` tokens where the architecture does; and back, the
//! memory type a native memory's dumps are laid out as (`memory_type`).

use native_kv::{iswa_swa_size, CacheConfig, Faults, MemoryConfig, MemoryKind};

use super::{MAX_CELLS, NATIVE_N_SWA};
use crate::base::cache::HarnessError;
use crate::base::op::{Arch, MemoryType, Setup};

/// The cell cache configuration for `setup`, or why the native cache `name` (an attention
/// cache only: `native+tensors`) cannot hold it.
pub(crate) fn cache_config(
    name: &str,
    setup: &Setup,
    faults: Faults,
) -> Result<CacheConfig, HarnessError> {
    crate::base::cache::refuse_engine_settings(name, setup)?;
    if setup.arch.memory() != MemoryType::Kv {
        return Err(HarnessError::Unsupported {
            target: name.into(),
            reason: format!(
                "{} memory ({}) is not modelled by {name}: it carries attention rows only",
                setup.arch.memory(),
                setup.arch
            ),
        });
    }
    attention_config(name, setup, faults)
}

/// Why the native model cannot stand beside a llama.cpp memory of this type, or `None` where it
/// models it (the hunt pairs an entry with native only there: `engines::hunt::plan`).
pub fn lacks_memory(memory: MemoryType) -> Option<&'static str> {
    match memory {
        // The compressed rows are graph outputs that cells alone cannot describe
        // (docs/memory-types.md).
        MemoryType::Dsv4 => Some("the native model has no dsv4 memory yet"),
        MemoryType::Kv
        | MemoryType::Iswa
        | MemoryType::Recurrent
        | MemoryType::Hybrid
        | MemoryType::HybridIswa
        | MemoryType::Msa
        | MemoryType::Dsa
        | MemoryType::HybridIdx
        | MemoryType::DsaIswa => None,
    }
}

/// The memory configuration for `setup` (see the module docs), or why the native memory `name`
/// cannot hold it.
pub(crate) fn memory_config(
    name: &str,
    setup: &Setup,
    faults: Faults,
) -> Result<MemoryConfig, HarnessError> {
    crate::base::cache::refuse_engine_settings(name, setup)?;
    let cache = attention_config(name, setup, faults)?;
    let kind = match setup.arch.memory() {
        MemoryType::Kv => MemoryKind::Kv,
        MemoryType::Iswa => MemoryKind::Iswa {
            n_swa: NATIVE_N_SWA,
            swa_size: swa_size(setup, &cache),
        },
        MemoryType::HybridIswa => MemoryKind::HybridIswa {
            n_swa: NATIVE_N_SWA,
            swa_size: swa_size(setup, &cache),
            n_rs_seq: rollback_depth(name, setup)?,
            shape: None,
        },
        MemoryType::Msa => MemoryKind::Msa,
        MemoryType::HybridIdx => MemoryKind::HybridIdx {
            n_rs_seq: rollback_depth(name, setup)?,
            shape: None,
        },
        MemoryType::Dsv4 => {
            return Err(HarnessError::Unsupported {
                target: name.into(),
                reason: lacks_memory(setup.arch.memory())
                    .unwrap_or("not modelled")
                    .into(),
            })
        }
        MemoryType::Dsa => MemoryKind::Dsa,
        MemoryType::DsaIswa => MemoryKind::DsaIswa {
            n_swa: NATIVE_N_SWA,
            swa_size: swa_size(setup, &cache),
        },
        MemoryType::Recurrent => MemoryKind::Recurrent {
            n_rs_seq: rollback_depth(name, setup)?,
            shape: None,
        },
        MemoryType::Hybrid => MemoryKind::Hybrid {
            n_rs_seq: rollback_depth(name, setup)?,
            shape: None,
        },
    };
    Ok(MemoryConfig { cache, kind })
}

/// The windowed cache's cells per stream for `setup` (`iswa_swa_size`).
fn swa_size(setup: &Setup, cache: &CacheConfig) -> u32 {
    // llama_context::llama_context (src/llama-context.cpp:248-250): n_batch is at most n_ctx
    // (causal models), n_ubatch at most n_batch; defaults 2048 and 512.
    let n_batch = setup
        .n_batch
        .unwrap_or(2048)
        .min(cache.n_ctx * cache.n_stream());
    let n_ubatch = setup.n_ubatch.unwrap_or(512).min(n_batch);
    iswa_swa_size(
        cache.n_ctx,
        NATIVE_N_SWA,
        cache.unified,
        cache.n_seq_max,
        n_ubatch,
        setup.swa_full,
    )
}

/// The rollback depth of `setup`'s recurrent states: `n_rs_seq` where the architecture rolls
/// back (`lfm2`), as llama.cpp keeps it; a non-zero depth for an architecture llama.cpp clamps
/// to 0 (`llm_arch_supports_rs_rollback`, src/llama-arch.cpp) is unsupported, as the llama.cpp
/// target says, and so is one deeper than the native memory's planes.
fn rollback_depth(name: &str, setup: &Setup) -> Result<u32, HarnessError> {
    let unsupported = |reason: String| HarnessError::Unsupported {
        target: name.into(),
        reason,
    };
    match setup.arch {
        _ if setup.n_rs_seq == 0 => Ok(0),
        Arch::Lfm2 | Arch::Lfm2Swa | Arch::Qwen4exp | Arch::Qwen4expPle
            if setup.n_rs_seq < native_kv::recurrent::MAX_PLANES as u32 =>
        {
            Ok(setup.n_rs_seq)
        }
        Arch::Lfm2 | Arch::Lfm2Swa | Arch::Qwen4exp | Arch::Qwen4expPle => {
            Err(unsupported(format!(
                "n_rs_seq {} above the native limit {}",
                setup.n_rs_seq,
                native_kv::recurrent::MAX_PLANES - 1
            )))
        }
        Arch::Llama
        | Arch::LlamaHd64
        | Arch::Gemma2
        | Arch::Mamba
        | Arch::Jamba
        | Arch::MinimaxM3
        | Arch::Deepseek4
        | Arch::GlmDsa
        | Arch::Deepseek32
        | Arch::Dots3note => Err(unsupported(format!(
            "n_rs_seq = {} requested, {} has no recurrent rollback",
            setup.n_rs_seq, setup.arch
        ))),
    }
}

/// The attention cache of `setup` (an iSWA memory's base cache), whatever the architecture.
fn attention_config(
    name: &str,
    setup: &Setup,
    faults: Faults,
) -> Result<CacheConfig, HarnessError> {
    if let Some(f) = setup.foreign.first() {
        // Its dumps are its own layout, not llama.cpp's: what a load of another
        // configuration's dump does is llama.cpp's state reader, which the native model lacks.
        return Err(HarnessError::Unsupported {
            target: name.into(),
            reason: format!(
                "a dump saved under another configuration (slot {}: {}): the native model does not load across configurations",
                f.slot, f.config
            ),
        });
    }
    if setup.n_seq_max as usize > native_kv::MAX_SEQ {
        return Err(HarnessError::Unsupported {
            target: name.into(),
            reason: format!(
                "n_seq_max {} above the native limit {}",
                setup.n_seq_max,
                native_kv::MAX_SEQ
            ),
        });
    }
    // llama_context::llama_context: n_seq_max >= 1, n_ctx padded to 256, and per stream
    // n_ctx_seq = pad(n_ctx / n_seq_max, 256) when not unified.
    let pad = |n: u64| n.div_ceil(256) * 256;
    let n_seq_max = setup.n_seq_max.max(1);
    let n_ctx = pad(u64::from(setup.n_ctx));
    let (per_stream, n_stream) = if setup.kv_unified {
        (n_ctx, 1)
    } else {
        (pad(n_ctx / u64::from(n_seq_max)), u64::from(n_seq_max))
    };
    if per_stream == 0 || per_stream * n_stream > MAX_CELLS {
        return Err(HarnessError::Unsupported {
            target: name.into(),
            reason: format!(
                "{n_stream} stream(s) of {per_stream} cells: the native cache holds 1 to {MAX_CELLS} cells"
            ),
        });
    }
    Ok(CacheConfig {
        n_ctx: per_stream as u32,
        n_seq_max,
        unified: setup.kv_unified,
        faults,
    })
}

/// The memory type whose dumps a native memory of `kind` writes.
pub(crate) fn memory_type(kind: &MemoryKind) -> MemoryType {
    match kind {
        MemoryKind::Kv => MemoryType::Kv,
        MemoryKind::Iswa { .. } => MemoryType::Iswa,
        MemoryKind::Msa => MemoryType::Msa,
        MemoryKind::Dsa => MemoryType::Dsa,
        MemoryKind::DsaIswa { .. } => MemoryType::DsaIswa,
        MemoryKind::Recurrent { .. } => MemoryType::Recurrent,
        MemoryKind::HybridIswa { .. } => MemoryType::HybridIswa,
        MemoryKind::HybridIdx { .. } => MemoryType::HybridIdx,
        MemoryKind::Hybrid { .. } => MemoryType::Hybrid,
    }
}
