//! Tiny models with deterministic random weights, written as GGUF files that llama.cpp loads
//! without any download (see /work/shared/LLAMA-FACTS.md, "A tiny model llama.cpp loads
//! without any download" and "Other memory types"): a `llama` model here, and the `gemma2`,
//! `mamba` and `jamba` ones that give llama.cpp's other memory types in [`memory_types`].
//!
//! The same [`TinyModelSpec`] always gives a byte-identical file: the weights come from a
//! splitmix64 stream per tensor, seeded by the spec's seed and the tensor's name, and the GGUF
//! writer lays the file out deterministically. Weights are uniform with variance `1/fan_in`, so
//! activations stay O(1) through the layers and the logits are spread widely enough that greedy
//! decoding does not collapse onto one token. Norm weights are 1.
//!
//! [`default_model_path`] puts the default model in a cache directory once (written to a temporary
//! file and renamed, so concurrent callers never see a partial file) and returns its path.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::gguf::{GgufValue, GgufWriter};
use super::ModelError;
use crate::base::op::Arch;

pub mod deepseek4;
pub mod dsa;
pub mod memory_types;
pub mod minimax_m3;
pub mod qwen4exp;

/// `return Err(ModelError::Spec(..))` unless the condition holds.
macro_rules! ensure_spec {
    ($cond:expr, $($message:tt)+) => {
        if !$cond {
            return Err(ModelError::Spec(format!($($message)+)));
        }
    };
}

/// The architecture, hyper-parameters and seed of a tiny model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TinyModelSpec {
    /// `general.architecture`: which memory type llama.cpp gives a context of this model.
    #[serde(default, skip_serializing_if = "is_llama")]
    pub arch: Arch,
    /// Number of transformer blocks.
    pub n_layer: u32,
    /// Width of the residual stream.
    pub n_embd: u32,
    /// Query heads.
    pub n_head: u32,
    /// Key/value heads (grouped-query attention when fewer than `n_head`).
    pub n_head_kv: u32,
    /// Hidden width of the SwiGLU feed-forward block.
    pub n_ff: u32,
    /// Vocabulary size (token ids `0..n_vocab`; there is no tokenizer).
    pub n_vocab: u32,
    /// `llama.context_length`.
    pub n_ctx_train: u32,
    /// `llama.rope.freq_base`.
    pub rope_freq_base: f32,
    /// `llama.attention.layer_norm_rms_epsilon`.
    pub rms_eps: f32,
    /// Seed of the weight generator.
    pub seed: u64,
    /// When set, written as `ARCH.attention.sliding_window`. For `llama` it is honoured by
    /// [`crate::model::forward::Model`] only (llama.cpp's `llama` architecture ignores that key);
    /// for `gemma2` it is llama.cpp's `n_swa`, the window of its iSWA cache's windowed layers.
    pub sliding_window: Option<u32>,
}

fn is_llama(arch: &Arch) -> bool {
    *arch == Arch::Llama
}

impl Default for TinyModelSpec {
    fn default() -> Self {
        TinyModelSpec {
            arch: Arch::Llama,
            n_layer: 2,
            n_embd: 64,
            n_head: 4,
            n_head_kv: 2,
            n_ff: 128,
            n_vocab: 64,
            n_ctx_train: 512,
            rope_freq_base: 10000.0,
            rms_eps: 1e-5,
            seed: 0x6b76_6175_6469_7400, // "kvaudit\0"
            sliding_window: None,
        }
    }
}

impl TinyModelSpec {
    /// The model the op audits (I1, I2, crash, differential) run llama.cpp on: one block, two
    /// query heads sharing one KV head (so the grouped-query path still runs), n_embd 32.
    ///
    /// Those oracles observe the cache's cell bookkeeping (positions, sequence sets, the serialized
    /// cells), which llama.cpp runs the same way for any llama model, while a trial's cost is mostly
    /// the forward pass, the state copy and the K shift, all proportional to layers x KV heads.
    /// The depth-3 seed audit runs about twice as fast on this model as on [`Default`] (`cargo bench
    /// --bench llama`). The theorem measurements (T1 to T3), which look at K/V rows per (layer,
    /// head), keep the two-block default.
    pub fn audit() -> Self {
        TinyModelSpec {
            n_layer: 1,
            n_embd: 32,
            n_head: 2,
            n_head_kv: 1,
            n_ff: 32,
            ..TinyModelSpec::default()
        }
    }

    /// The model the audits of `arch` run llama.cpp on: [`TinyModelSpec::audit`] for `llama`;
    /// for the others, the smallest shape that still has every part of the memory type:
    /// - `gemma2`: two blocks (gemma2's default layer pattern alternates windowed and full layers,
    ///   `load_swa_pattern(ml, 2)` in `src/models/gemma2.cpp`, so block 0 is windowed and block 1
    ///   full) and a window of 4 positions, so that a short trace already crosses it;
    /// - `mamba`: one block, n_embd 16 (the state is `conv_kernel - 1` + `state_size` rows);
    /// - `jamba`: two blocks, a mamba one and an attention one
    ///   ([`memory_types::jamba_is_attention_layer`]), n_embd 16;
    /// - `lfm2`: two blocks, a short-convolution one and an attention one (the same layer
    ///   pattern), n_embd 16;
    /// - `lfm2_swa`: lfm2's shape with a window of 4 positions (lfm2 makes every attention layer
    ///   windowed, so the iSWA pair's base cache holds cells but no layer).
    /// - `deepseek4`: two blocks, a CSA one (ratio 4, with the indexer) and an HCA one (ratio
    ///   128), n_embd 16, MLA heads of 8 ([`deepseek4`]), a window of 4 positions;
    /// - `minimax-m3`: two blocks, a dense-lead one (no indexer key cache) and a sparse one
    ///   (`minimax_m3`), n_embd 16, head dimension 8 (the indexer key's too);
    /// - `qwen4exp`: two blocks, a gated delta net and a dense-attention one with the QSA indexer
    ///   (`qwen4exp`), n_embd 16, head dimension 8 (the indexer key's too); `qwen4exp_ple`: the
    ///   same shape with a PLE module on the gated delta net (two heads of 8 per token);
    /// - `glm-dsa`: two blocks, a "full" indexer one and a "shared" one (no indexer key cache),
    ///   n_embd 16, two query heads over MLA (`dsa`: the head and indexer widths are its own);
    ///   `deepseek32`: the same shape, every block with an indexer; `dots3note`: the same
    ///   shape, a full-attention block with the indexer and a windowed one (window 4).
    /// - `llama_hd64`: the audit model with heads 64 wide (n_embd 128 over two query heads and
    ///   one KV head), so that llama.cpp quantizes and rotates its K/V cache.
    pub fn for_arch(arch: Arch) -> Self {
        let audit = TinyModelSpec::audit();
        match arch {
            Arch::Llama => audit,
            Arch::LlamaHd64 => TinyModelSpec {
                arch,
                n_embd: 128,
                ..audit
            },
            Arch::Gemma2 => TinyModelSpec {
                arch,
                n_layer: 2,
                sliding_window: arch.swa_window(),
                ..audit
            },
            Arch::Mamba => TinyModelSpec {
                arch,
                n_layer: 1,
                n_embd: 16,
                n_head: 0,
                n_head_kv: 0,
                n_ff: 0,
                ..audit
            },
            Arch::Deepseek4 => TinyModelSpec {
                arch,
                n_layer: deepseek4::COMPRESS_RATIOS.len() as u32,
                n_embd: 16,
                n_head: 2,
                n_head_kv: 1,
                n_ff: 16,
                sliding_window: arch.swa_window(),
                ..audit
            },
            Arch::Jamba
            | Arch::Lfm2
            | Arch::Lfm2Swa
            | Arch::MinimaxM3
            | Arch::Qwen4exp
            | Arch::Qwen4expPle
            | Arch::GlmDsa
            | Arch::Deepseek32
            | Arch::Dots3note => TinyModelSpec {
                arch,
                n_layer: 2,
                n_embd: 16,
                n_head: 2,
                n_head_kv: 1,
                n_ff: 16,
                sliding_window: arch.swa_window(),
                ..audit
            },
        }
    }

    /// Dimension of one attention head (0 for a model without attention).
    pub fn head_dim(&self) -> u32 {
        self.n_embd.checked_div(self.n_head).unwrap_or(0)
    }

    /// Checks the shape constraints llama.cpp and the reference forward pass rely on.
    pub fn validate(&self) -> Result<(), ModelError> {
        ensure_spec!(
            self.n_layer > 0 && self.n_embd > 0 && self.n_vocab > 0,
            "tiny model: sizes must be positive: {self:?}"
        );
        if self.arch == Arch::Mamba {
            // Mamba has no attention and no feed-forward block: every head count is 0.
            ensure_spec!(
                self.n_head == 0 && self.n_head_kv == 0 && self.n_ff == 0,
                "tiny model: mamba has no attention heads and no feed-forward block: {self:?}"
            );
            return Ok(());
        }
        ensure_spec!(self.n_ff > 0, "tiny model: n_ff must be positive: {self:?}");
        ensure_spec!(
            !matches!(self.arch, Arch::Jamba | Arch::Lfm2 | Arch::Lfm2Swa) || self.n_layer >= 2,
            "tiny model: jamba and lfm2 need two blocks, one recurrent and one attention"
        );
        ensure_spec!(
            self.arch != Arch::MinimaxM3 || self.n_layer > minimax_m3::DENSE_LEAD,
            "tiny model: minimax-m3 needs a dense-lead block and a sparse one"
        );
        ensure_spec!(
            !matches!(self.arch, Arch::Qwen4exp | Arch::Qwen4expPle)
                || self.n_layer >= qwen4exp::FULL_ATTENTION_INTERVAL,
            "tiny model: qwen4exp needs a gated-delta-net block and an attention one"
        );
        ensure_spec!(
            !matches!(self.arch, Arch::GlmDsa | Arch::Dots3note) || self.n_layer >= 2,
            "tiny model: glm-dsa and dots3note need two blocks, a full indexer one and a shared or windowed one"
        );
        ensure_spec!(
            self.arch != Arch::Gemma2 || self.n_layer >= 2,
            "tiny model: gemma2 needs two blocks, one windowed and one full"
        );
        ensure_spec!(
            self.n_head > 0 && self.n_embd % self.n_head == 0,
            "tiny model: n_embd {} is not a multiple of n_head {}",
            self.n_embd,
            self.n_head
        );
        ensure_spec!(
            self.n_head_kv > 0 && self.n_head % self.n_head_kv == 0,
            "tiny model: n_head {} is not a multiple of n_head_kv {}",
            self.n_head,
            self.n_head_kv
        );
        ensure_spec!(
            self.head_dim() % 2 == 0,
            "tiny model: head dimension {} must be even for RoPE",
            self.head_dim()
        );
        ensure_spec!(
            self.sliding_window != Some(0),
            "tiny model: a sliding window of 0 hides every key"
        );
        ensure_spec!(
            self.rope_freq_base > 0.0 && self.rms_eps >= 0.0,
            "tiny model: rope_freq_base must be > 0 and rms_eps >= 0"
        );
        Ok(())
    }
}

/// splitmix64 (Steele, Lea, Flood 2014): a tiny, well-mixed, deterministic generator.
#[derive(Clone, Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1), exactly representable (24 random bits).
    fn next_signed_unit(&mut self) -> f32 {
        let bits = (self.next_u64() >> 40) as u32; // 24 bits
        (bits as f32) * (2.0 / 16_777_216.0) - 1.0
    }
}

/// A per-tensor stream, so one tensor's values do not depend on the sizes of the others.
fn tensor_rng(seed: u64, name: &str) -> SplitMix64 {
    // FNV-1a of the name, mixed into the seed.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut mix = SplitMix64(seed ^ h);
    SplitMix64(mix.next_u64())
}

/// `n` values uniform in `[-a, a)` with `a = sqrt(3 / fan_in)`, i.e. variance `1 / fan_in`.
fn uniform_weights(seed: u64, name: &str, n: usize, fan_in: u32) -> Vec<f32> {
    let a = (3.0f32 / fan_in as f32).sqrt();
    let mut rng = tensor_rng(seed, name);
    (0..n).map(|_| rng.next_signed_unit() * a).collect()
}

fn tiny_model_writer(spec: &TinyModelSpec, tied_output: bool) -> Result<GgufWriter, ModelError> {
    spec.validate()?;
    match spec.arch {
        Arch::Llama | Arch::LlamaHd64 => {}
        Arch::MinimaxM3 => return Ok(minimax_m3::writer(spec)),
        Arch::Qwen4exp | Arch::Qwen4expPle => return Ok(qwen4exp::writer(spec)),
        Arch::Deepseek4 => return Ok(deepseek4::writer(spec)),
        Arch::GlmDsa | Arch::Deepseek32 | Arch::Dots3note => return Ok(dsa::writer(spec)),
        Arch::Gemma2 | Arch::Mamba | Arch::Jamba | Arch::Lfm2 | Arch::Lfm2Swa => {
            return Ok(memory_types::writer(spec))
        }
    }
    let s = spec;
    let hd = s.head_dim();
    let (embd, vocab, ff) = (u64::from(s.n_embd), u64::from(s.n_vocab), u64::from(s.n_ff));
    let q_out = u64::from(s.n_head * hd);
    let kv_out = u64::from(s.n_head_kv * hd);

    let mut w = GgufWriter::new();
    // Key types exactly as llama.cpp checks them (LLAMA-FACTS.md).
    w.add_kv("general.architecture", GgufValue::String("llama".into()))
        .add_kv("general.name", GgufValue::String("kvaudit-tiny".into()))
        .add_kv("llama.context_length", GgufValue::U32(s.n_ctx_train))
        .add_kv("llama.embedding_length", GgufValue::U32(s.n_embd))
        .add_kv("llama.block_count", GgufValue::U32(s.n_layer))
        .add_kv("llama.feed_forward_length", GgufValue::U32(s.n_ff))
        .add_kv("llama.attention.head_count", GgufValue::U32(s.n_head))
        .add_kv("llama.attention.head_count_kv", GgufValue::U32(s.n_head_kv))
        .add_kv("llama.vocab_size", GgufValue::U32(s.n_vocab))
        .add_kv(
            "llama.attention.layer_norm_rms_epsilon",
            GgufValue::F32(s.rms_eps),
        )
        .add_kv("llama.rope.freq_base", GgufValue::F32(s.rope_freq_base))
        .add_kv("tokenizer.ggml.model", GgufValue::String("none".into()));
    if let Some(window) = s.sliding_window {
        w.add_kv("llama.attention.sliding_window", GgufValue::U32(window));
    }

    let ones = |n: u64| vec![1.0f32; n as usize];
    // Embeddings with unit variance: the residual stream starts at RMS ~1.
    w.add_tensor_f32(
        "token_embd.weight",
        &[embd, vocab],
        uniform_weights(s.seed, "token_embd.weight", (embd * vocab) as usize, 1),
    );
    w.add_tensor_f32("output_norm.weight", &[embd], ones(embd));
    if !tied_output {
        w.add_tensor_f32(
            "output.weight",
            &[embd, vocab],
            uniform_weights(s.seed, "output.weight", (embd * vocab) as usize, s.n_embd),
        );
    }
    for l in 0..s.n_layer {
        let name = |t: &str| format!("blk.{l}.{t}.weight");
        let mut mat = |t: &str, rows_in: u64, rows_out: u64| {
            let n = name(t);
            let data = uniform_weights(s.seed, &n, (rows_in * rows_out) as usize, rows_in as u32);
            w.add_tensor_f32(n, &[rows_in, rows_out], data);
        };
        mat("attn_q", embd, q_out);
        mat("attn_k", embd, kv_out);
        mat("attn_v", embd, kv_out);
        mat("attn_output", q_out, embd);
        mat("ffn_gate", embd, ff);
        mat("ffn_up", embd, ff);
        mat("ffn_down", ff, embd);
        w.add_tensor_f32(name("attn_norm"), &[embd], ones(embd));
        w.add_tensor_f32(name("ffn_norm"), &[embd], ones(embd));
    }
    Ok(w)
}

/// The GGUF bytes of the tiny model for `spec` (with a separate `output.weight`).
pub fn tiny_model_bytes(spec: &TinyModelSpec) -> Result<Vec<u8>, ModelError> {
    Ok(tiny_model_writer(spec, false)?.to_bytes())
}

/// Writes the tiny model for `spec` to `path` (atomically: a temporary file in the same directory,
/// then a rename).
pub fn write_tiny_model(spec: &TinyModelSpec, path: &Path) -> Result<(), ModelError> {
    let bytes = tiny_model_bytes(spec)?;
    write_atomically(path, &bytes)
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ModelError> {
    crate::base::files::write_atomically(path, bytes).map_err(|source| ModelError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// The directory cached artefacts go to: `$KVAUDIT_CACHE_DIR`, else `$XDG_CACHE_HOME/kvaudit`,
/// else `~/.cache/kvaudit`, else `<temp dir>/kvaudit`.
pub fn cache_dir() -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = env("KVAUDIT_CACHE_DIR") {
        return d;
    }
    if let Some(d) = env("XDG_CACHE_HOME") {
        return d.join("kvaudit");
    }
    if let Some(home) = env("HOME") {
        return home.join(".cache").join("kvaudit");
    }
    std::env::temp_dir().join("kvaudit")
}

/// The path of the tiny model for `spec` in [`cache_dir`], writing it first if it is absent or
/// differs from what the spec generates. The file name holds a hash of the generated bytes (a
/// function of the spec and of this generator), so a spec or generator change gets a new file.
pub fn cached_model_path(spec: &TinyModelSpec) -> Result<PathBuf, ModelError> {
    let bytes = tiny_model_bytes(spec)?;
    let digest = Sha256::digest(&bytes);
    let hash: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let path = cache_dir().join(format!("tiny-{}-{hash}.gguf", spec.arch.name()));
    match std::fs::read(&path) {
        Ok(existing) if existing == bytes => {}
        _ => write_atomically(&path, &bytes)?,
    }
    Ok(path)
}

/// The path of the audit model ([`TinyModelSpec::audit`]) in the cache directory, written there on
/// first use: what llama.cpp targets run on unless `--model` names another file.
pub fn try_audit_model_path() -> Result<PathBuf, ModelError> {
    cached_model_path(&TinyModelSpec::audit())
}

/// The path of the audit model of `arch` ([`TinyModelSpec::for_arch`]) in the cache directory,
/// written there on first use: what a llama.cpp target runs a setup of that architecture on.
pub fn try_arch_model_path(arch: Arch) -> Result<PathBuf, ModelError> {
    cached_model_path(&TinyModelSpec::for_arch(arch))
}

/// Like [`default_model_path`], returning an error instead of panicking when the cache directory
/// cannot be written.
pub fn try_default_model_path() -> Result<PathBuf, ModelError> {
    cached_model_path(&TinyModelSpec::default())
}

/// The path of the default tiny model ([`TinyModelSpec::default`]) in the cache directory,
/// written there on first use.
///
/// # Panics
/// When the cache directory cannot be created or written; use [`try_default_model_path`] to handle
/// that instead (or point `KVAUDIT_CACHE_DIR` somewhere writable).
pub fn default_model_path() -> PathBuf {
    try_default_model_path()
        .unwrap_or_else(|e| panic!("cannot write the default tiny model: {e:#}"))
}

#[cfg(test)]
pub(crate) fn tiny_model_bytes_tied(spec: &TinyModelSpec) -> Result<Vec<u8>, ModelError> {
    Ok(tiny_model_writer(spec, true)?.to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gguf::GgufFile;

    use crate::base::files::sha256_hex;

    #[test]
    fn same_spec_gives_identical_bytes() {
        let a = tiny_model_bytes(&TinyModelSpec::default()).unwrap();
        let b = tiny_model_bytes(&TinyModelSpec::default()).unwrap();
        assert_eq!(sha256_hex(&a), sha256_hex(&b));
        let other = TinyModelSpec {
            seed: 1,
            ..TinyModelSpec::default()
        };
        assert_ne!(
            sha256_hex(&a),
            sha256_hex(&tiny_model_bytes(&other).unwrap())
        );
    }

    #[test]
    fn every_arch_gives_identical_bytes_and_its_own_keys() {
        for arch in Arch::ALL {
            let spec = TinyModelSpec::for_arch(arch);
            let a = tiny_model_bytes(&spec).unwrap();
            assert_eq!(a, tiny_model_bytes(&spec).unwrap(), "{arch}");
            let f = GgufFile::from_bytes(a).unwrap();
            let gguf = arch.gguf_name();
            assert_eq!(f.get_str("general.architecture").unwrap(), gguf);
            f.get_u32(&format!("{gguf}.block_count")).unwrap();
            assert_eq!(
                f.get_u32(&format!("{gguf}.attention.sliding_window")).ok(),
                arch.swa_window(),
                "{arch}"
            );
            for t in &f.tensors {
                assert_eq!((f.data_offset + t.offset) % 32, 0, "{}", t.name);
            }
        }
        let jamba =
            GgufFile::from_bytes(tiny_model_bytes(&TinyModelSpec::for_arch(Arch::Jamba)).unwrap())
                .unwrap();
        // Layer 0 recurrent (0 KV heads), layer 1 attention.
        assert!(jamba.tensor_info("blk.0.ssm_a").is_some());
        assert!(jamba.tensor_info("blk.1.attn_k.weight").is_some());
        assert!(jamba.tensor_info("blk.0.attn_k.weight").is_none());
        let gemma2 =
            GgufFile::from_bytes(tiny_model_bytes(&TinyModelSpec::for_arch(Arch::Gemma2)).unwrap())
                .unwrap();
        assert_eq!(
            gemma2.get_u32("gemma2.attention.sliding_window").unwrap(),
            4
        );
        assert!(gemma2.tensor_info("output.weight").is_none());
    }

    #[test]
    fn default_model_bytes_are_pinned() {
        // Pins the generator: if this changes, every cached model and any recorded finding that
        // names this model changes meaning. Update deliberately.
        let bytes = tiny_model_bytes(&TinyModelSpec::default()).unwrap();
        assert_eq!(bytes.len(), 330_720);
        assert_eq!(sha256_hex(&bytes), PINNED_SHA256);
    }

    const PINNED_SHA256: &str = "b62a41556b17cadc404460e0665db7433b6fad369f428d0cebd0496a50eb15f0";

    #[test]
    fn file_has_the_keys_and_shapes_llama_cpp_checks() {
        let spec = TinyModelSpec::default();
        let f = GgufFile::from_bytes(tiny_model_bytes(&spec).unwrap()).unwrap();
        assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), "none");
        for key in [
            "llama.context_length",
            "llama.embedding_length",
            "llama.block_count",
            "llama.feed_forward_length",
            "llama.attention.head_count",
            "llama.attention.head_count_kv",
            "llama.vocab_size",
        ] {
            f.get_u32(key).unwrap();
        }
        f.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap();
        f.get_f32("llama.rope.freq_base").unwrap();
        assert_eq!(
            f.tensor_info("token_embd.weight").unwrap().dims,
            vec![64, 64]
        );
        assert_eq!(
            f.tensor_info("blk.1.attn_k.weight").unwrap().dims,
            vec![64, 32]
        );
        assert_eq!(
            f.tensor_info("blk.0.attn_output.weight").unwrap().dims,
            vec![64, 64]
        );
        assert_eq!(
            f.tensor_info("blk.0.ffn_down.weight").unwrap().dims,
            vec![128, 64]
        );
        for t in &f.tensors {
            assert_eq!((f.data_offset + t.offset) % 32, 0, "{}", t.name);
        }
        let norm = f.tensor_f32("blk.0.attn_norm.weight").unwrap();
        assert!(norm.iter().all(|&x| x == 1.0));
        let q = f.tensor_f32("blk.0.attn_q.weight").unwrap();
        let var = q.iter().map(|x| x * x).sum::<f32>() / q.len() as f32;
        assert!((var - 1.0 / 64.0).abs() < 0.002, "variance {var}");
    }

    #[test]
    fn cached_path_is_written_once_and_reused() {
        let dir = std::env::temp_dir().join(format!("kvaudit-tiny-cache-{}", std::process::id()));
        let spec = TinyModelSpec {
            seed: 42,
            ..TinyModelSpec::default()
        };
        // Set only through the spec-independent helper to avoid racing on process env vars.
        let bytes = tiny_model_bytes(&spec).unwrap();
        let path = dir.join("m.gguf");
        write_tiny_model(&spec, &path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        write_tiny_model(&spec, &path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().contains(".tmp."))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        std::fs::remove_dir_all(&dir).unwrap();

        let p1 = try_default_model_path().unwrap();
        let p2 = try_default_model_path().unwrap();
        assert_eq!(p1, p2);
        assert_eq!(
            std::fs::read(&p1).unwrap(),
            tiny_model_bytes(&TinyModelSpec::default()).unwrap()
        );
    }

    #[test]
    fn invalid_specs_are_rejected() {
        let bad = TinyModelSpec {
            n_head: 3,
            ..TinyModelSpec::default()
        };
        assert!(tiny_model_bytes(&bad).is_err());
        let bad = TinyModelSpec {
            sliding_window: Some(0),
            ..TinyModelSpec::default()
        };
        assert!(tiny_model_bytes(&bad).is_err());
    }
}
