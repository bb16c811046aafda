//! The value types of a context's configuration that are not ops: the K/V cache element types
//! and the model architectures, with the memory type each architecture selects. `op.rs`
//! re-exports them beside [`super::op::Setup`], which holds them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A tiny model's architecture: what kvaudit's model writer emits and what decides the memory
/// type a llama.cpp context gets.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    /// `llama`: one attention KV cache (`llama_kv_cache`).
    #[default]
    Llama,
    /// `gemma2`: a full cache beside a sliding-window one (`llama_kv_cache_iswa`).
    Gemma2,
    /// `mamba`: one recurrent state per sequence (`llama_memory_recurrent`).
    Mamba,
    /// `jamba`: recurrent and attention layers (`llama_memory_hybrid`).
    Jamba,
    /// `lfm2`: short-convolution and attention layers (`llama_memory_hybrid`), the one
    /// architecture kvaudit writes whose recurrent states roll back (`n_rs_seq`,
    /// `llm_arch_supports_rs_rollback` in 0.1.161's src/llama-arch.cpp; not in 0.1.156's).
    Lfm2,
    /// `lfm2_swa`: lfm2 with `lfm2.attention.sliding_window`, which makes every attention layer
    /// windowed (`is_swa_impl`, src/models/lfm2.cpp:26-31 in 0.1.161) and `swa_type` STANDARD,
    /// so `create_memory` gives it `llama_memory_hybrid_iswa` (src/llama-model.cpp:2730). Its
    /// GGUF architecture is `lfm2` ([`Arch::gguf_name`]).
    Lfm2Swa,
    /// `minimax-m3`: dense-lead layers and sparse-attention (MSA) layers, one attention cache
    /// beside an indexer key cache of the sparse layers (`llama_kv_cache_msa`; 0.1.161,
    /// `llama-model.cpp:2382`).
    #[serde(rename = "minimax-m3")]
    MinimaxM3,
    /// `qwen4exp`: gated-delta-net (recurrent) layers and dense-attention layers that carry a QSA
    /// indexer: an attention cache, a recurrent memory and an indexer key cache of the attention
    /// layers (`llama_memory_hybrid_idx`; 0.1.161, `llama-model.cpp:2694-2730`).
    Qwen4exp,
    /// `deepseek4`: MLA attention over a raw windowed token cache beside compressed K caches and
    /// compressor states per compression ratio (`llama_kv_cache_dsv4`; 0.1.161,
    /// `llama-model.cpp:2594-2640`).
    Deepseek4,
    /// `glm-dsa`: MLA layers with a lightning indexer, "full" indexer layers (with an indexer
    /// key) and "shared" ones (reusing the previous full layer's top-k), one K-only MLA cache
    /// beside an indexer key cache of the full layers (`llama_kv_cache_dsa`; 0.1.161,
    /// `llama-model.cpp:2404-2456`, `filter_lid` = `is_indexer_full`).
    #[serde(rename = "glm-dsa")]
    GlmDsa,
    /// `deepseek32`: glm-dsa's tensors with an indexer on every layer (`llama_kv_cache_dsa`
    /// since 0.1.147, the first pin with the class, `llama-model.cpp:2018` there).
    Deepseek32,
    /// `dots3note`: MLA layers, full-attention ones with a lightning indexer and sliding-window
    /// ones without (`attention.sliding_window_pattern`, `attention.indexer.types`): a DSA cache
    /// of the full layers beside a windowed K-only cache of the others
    /// (`llama_kv_cache_dsa_iswa`; 0.1.157 on, `llama-model.cpp:2543-2595` in 0.1.161).
    Dots3note,
    /// `llama_hd64`: a `llama` model (one attention KV cache) whose heads are 64 wide, the
    /// smallest head size with which llama.cpp quantizes the K/V cache (q8_0 and q4_0 rows are
    /// blocks of 32) and rotates it (`attn_rot_k`, a head size that is a multiple of 64,
    /// llama-kv-cache.cpp:321-325 in 0.1.161); the `quant` preset runs it. Its GGUF
    /// architecture is `llama` ([`Arch::gguf_name`]).
    LlamaHd64,
    /// `qwen4exp_ple`: the `qwen4exp` model (`llama_memory_hybrid_idx`) with a PLE n-gram hash
    /// embedding on its gated-delta-net layer (`ple.layers`, src/models/qwen4exp.cpp:85-162 in
    /// 0.1.161): each token gathers rows keyed by the tokens before it, which the attention
    /// cache's cells keep (`llama_kv_cell_ext::tok`, `get_prev_tokens`,
    /// llama-kv-cache.cpp:1847-1908), and a conv history rides in the recurrent state beside
    /// R. Its GGUF architecture is `qwen4exp` ([`Arch::gguf_name`]).
    Qwen4expPle,
}

/// The memory implementation an architecture selects.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum MemoryType {
    /// `llama_kv_cache`.
    #[default]
    Kv,
    /// `llama_kv_cache_iswa`.
    Iswa,
    /// `llama_memory_recurrent`.
    Recurrent,
    /// `llama_memory_hybrid`.
    Hybrid,
    /// `llama_memory_hybrid_iswa`: an iSWA pair of attention caches and a recurrent memory.
    HybridIswa,
    /// `llama_kv_cache_msa`: two attention caches that take every op alike, the K/V cache of
    /// every layer and the indexer key cache of the sparse layers.
    Msa,
    /// `llama_memory_hybrid_idx`: `llama_memory_hybrid` (an attention cache and a recurrent
    /// memory) with an indexer key cache that mirrors the attention cache cell for cell.
    HybridIdx,
    /// `llama_kv_cache_dsv4`: a raw K-only iSWA cache of every layer, three compressed K caches
    /// (CSA, HCA, the indexer's LID) and their compressor states, one stream per sequence.
    Dsv4,
    /// `llama_kv_cache_dsa`: two K-only attention caches that take every op alike, the MLA
    /// cache of every layer and the lightning-indexer key cache of the indexer layers
    /// (src/llama-kv-cache-dsa.cpp).
    Dsa,
    /// `llama_kv_cache_dsa_iswa`: a DSA memory (the MLA cache and the lightning-indexer key
    /// cache) of the full-attention layers beside a windowed K-only cache of the sliding-window
    /// layers (src/llama-kv-cache-dsa-iswa.cpp).
    DsaIswa,
}

impl Arch {
    /// Every architecture, in the order docs list them.
    pub const ALL: [Arch; 14] = [
        Arch::Llama,
        Arch::Gemma2,
        Arch::Mamba,
        Arch::Jamba,
        Arch::Lfm2,
        Arch::Lfm2Swa,
        Arch::MinimaxM3,
        Arch::Qwen4exp,
        Arch::Deepseek4,
        Arch::GlmDsa,
        Arch::Deepseek32,
        Arch::Dots3note,
        Arch::LlamaHd64,
        Arch::Qwen4expPle,
    ];

    pub(crate) fn is_default(&self) -> bool {
        *self == Arch::Llama
    }

    /// The name as in GGUF's `general.architecture`, JSON and the command line.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Gemma2 => "gemma2",
            Arch::Mamba => "mamba",
            Arch::Jamba => "jamba",
            Arch::Lfm2 => "lfm2",
            Arch::Lfm2Swa => "lfm2_swa",
            Arch::MinimaxM3 => "minimax-m3",
            Arch::Qwen4exp => "qwen4exp",
            Arch::Deepseek4 => "deepseek4",
            Arch::GlmDsa => "glm-dsa",
            Arch::Deepseek32 => "deepseek32",
            Arch::Dots3note => "dots3note",
            Arch::LlamaHd64 => "llama_hd64",
            Arch::Qwen4expPle => "qwen4exp_ple",
        }
    }

    /// The architecture the model's GGUF names (`general.architecture`, the prefix of its keys):
    /// [`Arch::name`] but for `lfm2_swa`, an `lfm2` model with a sliding window,
    /// `llama_hd64`, a `llama` model with wider heads, and `qwen4exp_ple`, a `qwen4exp` model
    /// with a PLE layer.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Lfm2Swa => "lfm2",
            Arch::LlamaHd64 => "llama",
            Arch::Qwen4expPle => "qwen4exp",
            Arch::Llama
            | Arch::Gemma2
            | Arch::Mamba
            | Arch::Jamba
            | Arch::Lfm2
            | Arch::MinimaxM3
            | Arch::Qwen4exp
            | Arch::Deepseek4
            | Arch::GlmDsa
            | Arch::Deepseek32
            | Arch::Dots3note => self.name(),
        }
    }

    /// The sliding window, in positions, of the windowed layers of the model kvaudit runs for
    /// this architecture (its generated tiny model, `ARCH.attention.sliding_window`): the one
    /// place the window is chosen, read by the model writer, the native iSWA memory and the
    /// oracles. `None` for architectures without windowed layers.
    pub const fn swa_window(self) -> Option<u32> {
        match self {
            Arch::Gemma2 | Arch::Lfm2Swa | Arch::Deepseek4 | Arch::Dots3note => Some(4),
            Arch::Llama
            | Arch::Mamba
            | Arch::Jamba
            | Arch::Lfm2
            | Arch::MinimaxM3
            | Arch::Qwen4exp
            | Arch::Qwen4expPle => None,
            Arch::GlmDsa | Arch::Deepseek32 | Arch::LlamaHd64 => None,
        }
    }

    /// Whether llama.cpp can move positions in this architecture's memory (`seq_add`,
    /// `seq_div`; `llama_memory_can_shift`): the fuzz generator draws no shift where it cannot
    /// (`GenConfig::draws`), as the presets of these architectures list none.
    /// - qwen4exp ropes with IMRoPE: `llama_kv_cache::seq_add`/`seq_div` assert
    ///   `n_pos_per_embd() == 1` (src/llama-kv-cache.cpp:595, :645 in 0.1.161; :577, :627 in
    ///   0.1.157), an abort in release builds too, and `get_can_shift` is false (:1208-1216).
    /// - deepseek4: `llama_kv_cache_dsv4::get_can_shift` is false (llama-kv-cache-dsv4.cpp:
    ///   1451-1455), so the next decode's update aborts on the pending shift
    ///   (`GGML_ABORT`, llama-kv-cache.cpp:876-878; a reload probe after a `seq_add` hit
    ///   `GGML_ASSERT(buffer)` in a fuzz run).
    pub fn can_shift(self) -> bool {
        match self {
            Arch::Qwen4exp | Arch::Qwen4expPle | Arch::Deepseek4 => false,
            Arch::Llama
            | Arch::Gemma2
            | Arch::Mamba
            | Arch::Jamba
            | Arch::Lfm2
            | Arch::Lfm2Swa
            | Arch::MinimaxM3
            | Arch::GlmDsa
            | Arch::Deepseek32
            | Arch::Dots3note
            | Arch::LlamaHd64 => true,
        }
    }

    /// The memory type llama.cpp gives a context of this architecture.
    pub fn memory(self) -> MemoryType {
        match self {
            Arch::Llama | Arch::LlamaHd64 => MemoryType::Kv,
            Arch::Gemma2 => MemoryType::Iswa,
            Arch::Mamba => MemoryType::Recurrent,
            Arch::Jamba | Arch::Lfm2 => MemoryType::Hybrid,
            Arch::Lfm2Swa => MemoryType::HybridIswa,
            Arch::MinimaxM3 => MemoryType::Msa,
            Arch::Qwen4exp | Arch::Qwen4expPle => MemoryType::HybridIdx,
            Arch::Deepseek4 => MemoryType::Dsv4,
            Arch::GlmDsa | Arch::Deepseek32 => MemoryType::Dsa,
            Arch::Dots3note => MemoryType::DsaIswa,
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Arch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Arch::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                format!("unknown architecture {s:?} (known: llama, gemma2, mamba, jamba, lfm2, lfm2_swa, minimax-m3, qwen4exp, deepseek4, glm-dsa, deepseek32, dots3note, llama_hd64, qwen4exp_ple)")
            })
    }
}

impl MemoryType {
    /// Whether this is the attention cache alone (`llama_kv_cache`), the default.
    pub fn is_kv(&self) -> bool {
        *self == MemoryType::Kv
    }

    /// The name as in reports: `kv`, `iswa`, `recurrent`, `hybrid`, `hybrid_iswa`, `msa`,
    /// `hybrid_idx`, `dsv4`, `dsa`, `dsa_iswa`.
    pub fn name(self) -> &'static str {
        match self {
            MemoryType::Kv => "kv",
            MemoryType::Iswa => "iswa",
            MemoryType::Recurrent => "recurrent",
            MemoryType::Hybrid => "hybrid",
            MemoryType::HybridIswa => "hybrid_iswa",
            MemoryType::Msa => "msa",
            MemoryType::HybridIdx => "hybrid_idx",
            MemoryType::Dsv4 => "dsv4",
            MemoryType::Dsa => "dsa",
            MemoryType::DsaIswa => "dsa_iswa",
        }
    }

    /// Whether the memory has a windowed attention cache beside its base one (iswa,
    /// hybrid_iswa, dsa_iswa): `seq_pos_min`/`seq_pos_max` of its attention part are the
    /// windowed cache's (src/llama-kv-cache-iswa.cpp:142-149, src/llama-kv-cache-dsa-iswa.cpp:112-119).
    pub fn has_window(self) -> bool {
        match self {
            MemoryType::Iswa | MemoryType::HybridIswa | MemoryType::DsaIswa => true,
            MemoryType::Kv
            | MemoryType::Recurrent
            | MemoryType::Hybrid
            | MemoryType::Msa
            | MemoryType::HybridIdx
            | MemoryType::Dsv4 => false,
            MemoryType::Dsa => false,
        }
    }

    /// Whether the memory has recurrent states (recurrent, hybrid, hybrid_iswa, hybrid_idx).
    pub fn has_states(self) -> bool {
        match self {
            MemoryType::Recurrent
            | MemoryType::Hybrid
            | MemoryType::HybridIswa
            | MemoryType::HybridIdx => true,
            MemoryType::Kv | MemoryType::Iswa | MemoryType::Msa | MemoryType::Dsv4 => false,
            MemoryType::Dsa | MemoryType::DsaIswa => false,
        }
    }

    /// Whether the memory pairs attention with recurrent states (hybrid, hybrid_iswa,
    /// hybrid_idx, whose `seq_rm` asks the recurrent part first too,
    /// src/llama-memory-hybrid-idx.cpp:185-204): `seq_rm`
    /// asks the recurrent part first and a refusal changes neither
    /// (src/llama-memory-hybrid.cpp:143-150, src/llama-memory-hybrid-iswa.cpp `seq_rm`), and the
    /// accessors are the intersection of the parts' ranges.
    pub fn is_hybrid(self) -> bool {
        match self {
            MemoryType::Hybrid | MemoryType::HybridIswa | MemoryType::HybridIdx => true,
            MemoryType::Kv
            | MemoryType::Iswa
            | MemoryType::Recurrent
            | MemoryType::Msa
            | MemoryType::Dsv4 => false,
            MemoryType::Dsa | MemoryType::DsaIswa => false,
        }
    }
}

impl fmt::Display for MemoryType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The element type of a K or V cache.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum CacheType {
    /// 16-bit float: llama.cpp's default.
    #[default]
    F16,
    /// 32-bit float.
    F32,
    /// 8-bit blocks (`GGML_TYPE_Q8_0`).
    Q8_0,
    /// 4-bit blocks (`GGML_TYPE_Q4_0`).
    Q4_0,
}

impl CacheType {
    /// Every type, in the order presets and docs list them.
    pub const ALL: [CacheType; 4] = [
        CacheType::F16,
        CacheType::F32,
        CacheType::Q8_0,
        CacheType::Q4_0,
    ];

    pub(crate) fn is_default(&self) -> bool {
        *self == CacheType::F16
    }

    /// The `enum ggml_type` value.
    pub fn ggml_type(self) -> u32 {
        match self {
            CacheType::F32 => 0,
            CacheType::F16 => 1,
            CacheType::Q4_0 => 2,
            CacheType::Q8_0 => 8,
        }
    }

    /// The name as in JSON and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            CacheType::F16 => "f16",
            CacheType::F32 => "f32",
            CacheType::Q8_0 => "q8_0",
            CacheType::Q4_0 => "q4_0",
        }
    }
}

impl fmt::Display for CacheType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for CacheType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        CacheType::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| format!("unknown cache type {s:?} (known: f16, f32, q8_0, q4_0)"))
    }
}
