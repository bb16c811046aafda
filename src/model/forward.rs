//! The llama forward pass in f32, over a caller-owned KV store, plus a cacheless reference.
//!
//! [`Model::forward_token`] runs one token at one position: it computes the token's K and V,
//! hands them to a [`KvStore`] (`append`), and attends over whatever the store says is visible
//! (`visible`). A KV cache under audit plugs in by implementing [`KvStore`]; [`VecKvStore`] is the
//! obviously-correct one. [`Model::forward_sequence`] recomputes a whole sequence from scratch with
//! an explicit `-inf` mask and no store at all: the independent reference for theorems T1-T3 of
//! the seed document (cached == cacheless with max |Δ| = 0; eviction == never saw the span;
//! window masking == `-inf` masking).
//!
//! The graph is llama.cpp's `llama` graph (`src/models/llama.cpp` in llama-cpp-sys-2 0.1.161):
//! RMSNorm, Q/K/V projections, RoPE on Q and K, grouped-query attention with a causal mask by
//! position and softmax scaled by `1/sqrt(head_dim)`, output projection, residual, RMSNorm, SwiGLU
//! feed-forward (`down(silu(gate(x)) * up(x))`), residual; final RMSNorm and the output projection
//! (tied to `token_embd` when `output.weight` is absent).
//!
//! Layout conventions, checked against ggml:
//! - A weight with ggml dims `{n_in, n_out}` is `n_out` rows of `n_in` values, and `ggml_mul_mat`
//!   computes `out[j] = sum_i W[j*n_in + i] * x[i]` (`ggml_compute_forward_mul_mat_one_chunk`,
//!   `ggml/src/ggml-cpu/ggml-cpu.c`: a dot product of src0 row `ir0` with src1 column `ir1`).
//! - Q, K and V rows are head-major (`Qcur` is reshaped to `{head_dim, n_head, n_tokens}`), and
//!   query head `h` reads KV head `h / (n_head / n_head_kv)` (the broadcast `i02 = i12 / r2` in the
//!   same function).
//! - The sliding window follows `llama_hparams::is_masked_swa` (`LLAMA_SWA_TYPE_STANDARD`): a key
//!   at `p0` is hidden from a query at `p1` iff `p1 - p0 >= n_swa`.
//!
//! Determinism: every kernel is a fixed sequence of f32 operations (sums in index order, no fused
//! multiply-add, f64 only where ggml uses `ggml_float`), so the same inputs give the same bits on
//! every path. The numbers are close to llama.cpp's but not bit-identical to them (ggml uses SIMD
//! dot products, FMA, a vectorised `expf`, and by default an F16 KV cache). Measured once against
//! llama.cpp from llama-cpp-sys-2 0.1.161 (built without cmake as LLAMA-FACTS.md describes, one
//! thread, flash attention off) on the default tiny model and the 7-token prompt of the tests:
//! max |Δlogit| = 1.5e-6 with an F32 KV cache and 9.5e-4 with the default F16 one, the same argmax
//! at every position, and the same 24-token greedy continuation (pinned in the tests).

use std::path::Path;

use super::gguf::{GgufFile, GgufValue};
use super::rope::rope_row;
use super::ModelError;

pub use super::kv_store::{key_visible, KvEntry, KvStore, VecKvStore};

/// Shape and numeric hyper-parameters of a loaded model.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Dimension of one head (also the number of rotated dimensions).
    pub head_dim: usize,
    /// Hidden width of the feed-forward block.
    pub n_ff: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Training context length (informational).
    pub n_ctx_train: u32,
    /// RoPE base frequency.
    pub rope_freq_base: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// Sliding attention window (`None`: full causal attention).
    pub sliding_window: Option<u32>,
}

impl HParams {
    /// Values in one K or V row: `n_head_kv * head_dim`.
    pub fn kv_width(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Values in one Q row: `n_head * head_dim`.
    pub fn q_width(&self) -> usize {
        self.n_head * self.head_dim
    }
}

/// The weights of one transformer block, each a flat row-major `[n_out][n_in]` matrix.
#[derive(Clone, Debug)]
struct Layer {
    attn_norm: Vec<f32>,
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
    ffn_norm: Vec<f32>,
    w_gate: Vec<f32>,
    w_up: Vec<f32>,
    w_down: Vec<f32>,
}

/// A llama model with f32 weights.
#[derive(Clone, Debug)]
pub struct Model {
    hparams: HParams,
    token_embd: Vec<f32>,
    output_norm: Vec<f32>,
    /// `None`: tied to `token_embd`.
    output: Option<Vec<f32>>,
    layers: Vec<Layer>,
}

/// `out[j] = sum_i w[j*n_in + i] * x[i]`: ggml's `mul_mat(W, x)` for W with dims `{n_in, n_out}`.
fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
    let n_in = x.len();
    debug_assert_eq!(w.len() % n_in, 0);
    w.chunks_exact(n_in).map(|row| dot(row, x)).collect()
}

/// Sequential f32 dot product (index order, separate multiply and add).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        acc += x * y;
    }
    acc
}

/// RMSNorm then the weight, as `ggml_compute_forward_rms_norm_f32` fused with `mul`
/// (`ggml/src/ggml-cpu/ops.cpp`): squares summed in f64, `scale = 1/sqrtf(mean + eps)`,
/// `y = x * scale * w`.
fn rms_norm(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let mut sum = 0.0f64;
    for &v in x {
        sum += f64::from(v * v);
    }
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0f32 / (mean + eps).sqrt();
    x.iter().zip(weight).map(|(&v, &w)| v * scale * w).collect()
}

/// `ggml_silu_f32`: `x / (1 + exp(-x))`.
fn silu(x: f32) -> f32 {
    x / (1.0f32 + (-x).exp())
}

/// Softmax of already-scaled scores, as ggml's `soft_max` shapes it: max, `exp(s - max)` in f32,
/// the sum in f64, one f32 reciprocal multiplied in. Masked scores are `-inf` and come out 0.
fn softmax_in_place(scores: &mut [f32]) {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += f64::from(*s);
    }
    let inv = (1.0f64 / sum) as f32;
    for s in scores.iter_mut() {
        *s *= inv;
    }
}

/// The feed-forward half of a block plus both residual adds, shared by both paths so the arithmetic
/// is identical; the attention (where caching matters) is written separately for each.
fn ffn_block(layer: &Layer, x_after_attn: &[f32], eps: f32) -> Vec<f32> {
    let h = rms_norm(x_after_attn, &layer.ffn_norm, eps);
    let gate = matvec(&layer.w_gate, &h);
    let up = matvec(&layer.w_up, &h);
    let act: Vec<f32> = gate.iter().zip(&up).map(|(&g, &u)| silu(g) * u).collect();
    let down = matvec(&layer.w_down, &act);
    down.iter()
        .zip(x_after_attn)
        .map(|(&d, &r)| d + r)
        .collect()
}

/// `return Err(ModelError::Invalid(..))` unless the condition holds: the shape checks of
/// [`Model::from_gguf`].
macro_rules! ensure_model {
    ($cond:expr, $($message:tt)+) => {
        if !$cond {
            return Err(ModelError::Invalid(format!($($message)+)));
        }
    };
}

impl Model {
    /// Loads a `llama`-architecture GGUF (F32, F16 or BF16 tensors; converted to f32).
    pub fn load(path: impl AsRef<Path>) -> Result<Model, ModelError> {
        let path = path.as_ref();
        let file = GgufFile::open(path)?;
        Self::from_gguf(&file).map_err(|e| ModelError::Load {
            path: path.to_path_buf(),
            source: Box::new(e),
        })
    }

    /// Builds the model from an opened GGUF file.
    pub fn from_gguf(f: &GgufFile) -> Result<Model, ModelError> {
        let arch = f.get_str("general.architecture")?;
        ensure_model!(
            arch == "llama",
            "architecture {arch:?} is not supported (only \"llama\")"
        );
        let key = |k: &str| format!("llama.{k}");
        let u32_key = |k: &str| -> Result<usize, ModelError> { Ok(f.get_u32(&key(k))? as usize) };

        let n_embd = u32_key("embedding_length")?;
        let n_layer = u32_key("block_count")?;
        let n_ff = u32_key("feed_forward_length")?;
        let n_head = u32_key("attention.head_count")?;
        let n_head_kv = match f.get_u32_opt(&key("attention.head_count_kv"))? {
            Some(v) => v as usize,
            None => n_head,
        };
        let n_ctx_train = f.get_u32(&key("context_length"))?;
        let rms_eps = f.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
        let rope_freq_base = f.get_f32_opt(&key("rope.freq_base"))?.unwrap_or(10000.0);
        let sliding_window = f.get_u32_opt(&key("attention.sliding_window"))?;
        ensure_model!(
            n_layer > 0 && n_embd > 0 && n_head > 0 && n_head_kv > 0 && n_ff > 0,
            "model sizes must be positive"
        );
        ensure_model!(
            n_head % n_head_kv == 0,
            "n_head {n_head} is not a multiple of n_head_kv {n_head_kv}"
        );
        let head_dim = match f.get_u32_opt(&key("attention.key_length"))? {
            Some(v) => v as usize,
            None => {
                ensure_model!(
                    n_embd % n_head == 0,
                    "n_embd {n_embd} is not a multiple of n_head {n_head}"
                );
                n_embd / n_head
            }
        };
        if let Some(v) = f.get_u32_opt(&key("attention.value_length"))? {
            ensure_model!(
                v as usize == head_dim,
                "value head size {v} differs from key head size {head_dim}: not supported"
            );
        }
        if let Some(n_rot) = f.get_u32_opt(&key("rope.dimension_count"))? {
            ensure_model!(
                n_rot as usize == head_dim,
                "partial RoPE (n_rot {n_rot} != head_dim {head_dim}) is not supported"
            );
        }
        ensure_model!(head_dim % 2 == 0, "head_dim {head_dim} must be even");
        match f.get(&key("rope.scaling.type")) {
            None => {}
            Some(GgufValue::String(s)) if s == "none" || s == "linear" && rope_scale_is_one(f) => {}
            Some(other) => {
                return Err(ModelError::Invalid(format!(
                    "RoPE scaling {other:?} is not supported"
                )))
            }
        }
        if let Some(n) = f.get_u32_opt(&key("expert_count"))? {
            ensure_model!(n == 0, "mixture-of-experts models are not supported");
        }
        ensure_model!(
            sliding_window != Some(0),
            "a sliding window of 0 hides every key"
        );
        for t in &f.tensors {
            ensure_model!(
                !t.name.ends_with(".bias") && t.name != "rope_freqs.weight",
                "tensor {:?} is not supported by this reference (no biases, no RoPE frequency factors)",
                t.name
            );
        }
        let n_vocab = match f.get_u32_opt(&key("vocab_size"))? {
            Some(v) => v as usize,
            None => {
                let info = f.tensor_info("token_embd.weight").ok_or_else(|| {
                    ModelError::Invalid("tensor \"token_embd.weight\" is missing".into())
                })?;
                *info.dims.get(1).unwrap_or(&1) as usize
            }
        };

        let hparams = HParams {
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_vocab,
            n_ctx_train,
            rope_freq_base,
            rms_eps,
            sliding_window,
        };
        let q_w = hparams.q_width();
        let kv_w = hparams.kv_width();
        let tensor = |name: &str, dims: &[usize]| -> Result<Vec<f32>, ModelError> {
            let info = f
                .tensor_info(name)
                .ok_or_else(|| ModelError::Invalid(format!("tensor {name:?} is missing")))?;
            let pad = |d: &[u64]| {
                let mut v = d.to_vec();
                v.resize(4, 1);
                v
            };
            let want: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
            ensure_model!(
                pad(&info.dims) == pad(&want),
                "tensor {name:?} has dims {:?}, expected {want:?}",
                info.dims
            );
            Ok(f.tensor_f32(name)?)
        };

        let token_embd = tensor("token_embd.weight", &[n_embd, n_vocab])?;
        let output_norm = tensor("output_norm.weight", &[n_embd])?;
        let output = match f.tensor_info("output.weight") {
            Some(_) => Some(tensor("output.weight", &[n_embd, n_vocab])?),
            None => None,
        };
        let mut layers = Vec::with_capacity(n_layer);
        for l in 0..n_layer {
            let t = |name: &str, dims: &[usize]| tensor(&format!("blk.{l}.{name}.weight"), dims);
            layers.push(Layer {
                attn_norm: t("attn_norm", &[n_embd])?,
                wq: t("attn_q", &[n_embd, q_w])?,
                wk: t("attn_k", &[n_embd, kv_w])?,
                wv: t("attn_v", &[n_embd, kv_w])?,
                wo: t("attn_output", &[q_w, n_embd])?,
                ffn_norm: t("ffn_norm", &[n_embd])?,
                w_gate: t("ffn_gate", &[n_embd, n_ff])?,
                w_up: t("ffn_up", &[n_embd, n_ff])?,
                w_down: t("ffn_down", &[n_ff, n_embd])?,
            });
        }
        Ok(Model {
            hparams,
            token_embd,
            output_norm,
            output,
            layers,
        })
    }

    /// The model's hyper-parameters.
    pub fn hparams(&self) -> &HParams {
        &self.hparams
    }

    /// Whether the output projection is tied to the token embeddings.
    pub fn has_tied_output(&self) -> bool {
        self.output.is_none()
    }

    /// Sets the sliding window used by every forward pass (`None`: full causal).
    ///
    /// # Panics
    /// On `Some(0)`, which would hide every key including the query's own.
    pub fn set_sliding_window(&mut self, window: Option<u32>) {
        assert_ne!(window, Some(0), "a sliding window of 0 hides every key");
        self.hparams.sliding_window = window;
    }

    /// A copy of the model with another sliding window (see [`Model::set_sliding_window`]).
    pub fn with_sliding_window(&self, window: Option<u32>) -> Model {
        let mut m = self.clone();
        m.set_sliding_window(window);
        m
    }

    fn embed(&self, token: u32) -> Vec<f32> {
        let n = self.hparams.n_embd;
        let t = token as usize;
        assert!(
            t < self.hparams.n_vocab,
            "token {token} is outside the vocabulary of {}",
            self.hparams.n_vocab
        );
        self.token_embd[t * n..(t + 1) * n].to_vec()
    }

    fn logits(&self, x: &[f32]) -> Vec<f32> {
        let h = rms_norm(x, &self.output_norm, self.hparams.rms_eps);
        matvec(self.output.as_deref().unwrap_or(&self.token_embd), &h)
    }

    /// Q (rotated), K before and after RoPE, and V for one normalised input row.
    fn qkv(&self, layer: &Layer, h: &[f32], pos: i32) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
        let hp = &self.hparams;
        let mut q = matvec(&layer.wq, h);
        let k_raw = matvec(&layer.wk, h);
        let v = matvec(&layer.wv, h);
        rope_row(&mut q, hp.n_head, hp.head_dim, pos, hp.rope_freq_base);
        let mut k = k_raw.clone();
        rope_row(&mut k, hp.n_head_kv, hp.head_dim, pos, hp.rope_freq_base);
        (q, k_raw, k, v)
    }

    fn kq_scale(&self) -> f32 {
        // src/models/llama.cpp: kq_scale = 1.0f/sqrtf(float(n_embd_head)).
        1.0f32 / (self.hparams.head_dim as f32).sqrt()
    }

    /// Runs one token at `pos` through the model, appending its K/V to `kv` (per layer, before
    /// attending) and attending over `kv.visible(..)`. Returns the logits.
    ///
    /// # Panics
    /// When `token` is outside the vocabulary or the store yields rows of the wrong width.
    pub fn forward_token<S: KvStore + ?Sized>(&self, token: u32, pos: i32, kv: &mut S) -> Vec<f32> {
        let hp = &self.hparams;
        let hd = hp.head_dim;
        let group = hp.n_head / hp.n_head_kv;
        let scale = self.kq_scale();
        let mut x = self.embed(token);
        for (il, layer) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, &layer.attn_norm, hp.rms_eps);
            let (q, k_raw, k, v) = self.qkv(layer, &h, pos);
            kv.append(il, pos, &k_raw, &k, &v);
            let entries: Vec<KvEntry<'_>> = kv.visible(il, pos, hp.sliding_window).collect();
            let mut attn = vec![0.0f32; hp.q_width()];
            for head in 0..hp.n_head {
                let kvh = head / group;
                let qh = &q[head * hd..(head + 1) * hd];
                let mut probs: Vec<f32> = entries
                    .iter()
                    .map(|e| dot(qh, &e.k[kvh * hd..(kvh + 1) * hd]) * scale)
                    .collect();
                softmax_in_place(&mut probs);
                let out = &mut attn[head * hd..(head + 1) * hd];
                for (p, e) in probs.iter().zip(&entries) {
                    let vh = &e.v[kvh * hd..(kvh + 1) * hd];
                    for (o, &vv) in out.iter_mut().zip(vh) {
                        *o += p * vv;
                    }
                }
            }
            let o = matvec(&layer.wo, &attn);
            let x_attn: Vec<f32> = o.iter().zip(&x).map(|(&a, &r)| a + r).collect();
            x = ffn_block(layer, &x_attn, hp.rms_eps);
        }
        self.logits(&x)
    }

    /// [`Model::forward_token`] for each `(token, position)` in turn; the logits of each.
    pub fn forward_tokens<S: KvStore + ?Sized>(
        &self,
        tokens: &[u32],
        positions: &[i32],
        kv: &mut S,
    ) -> Vec<Vec<f32>> {
        assert_eq!(tokens.len(), positions.len(), "one position per token");
        tokens
            .iter()
            .zip(positions)
            .map(|(&t, &p)| self.forward_token(t, p, kv))
            .collect()
    }

    /// The cacheless reference: recomputes every token of the sequence from scratch, layer by
    /// layer, with an explicit additive mask (`0` or `-inf`, by [`key_visible`] over all tokens of
    /// the sequence, as llama.cpp masks a batch) before the softmax. Returns the logits of every
    /// token. Equals [`Model::forward_tokens`] over an empty [`VecKvStore`] bit for bit when the
    /// positions increase.
    pub fn forward_sequence(&self, tokens: &[u32], positions: &[i32]) -> Vec<Vec<f32>> {
        assert_eq!(tokens.len(), positions.len(), "one position per token");
        let hp = &self.hparams;
        let hd = hp.head_dim;
        let n = tokens.len();
        let group = hp.n_head / hp.n_head_kv;
        let scale = self.kq_scale();
        let mut xs: Vec<Vec<f32>> = tokens.iter().map(|&t| self.embed(t)).collect();
        for layer in &self.layers {
            let mut qs = Vec::with_capacity(n);
            let mut ks = Vec::with_capacity(n);
            let mut vs = Vec::with_capacity(n);
            for (x, &pos) in xs.iter().zip(positions) {
                let h = rms_norm(x, &layer.attn_norm, hp.rms_eps);
                let (q, _k_raw, k, v) = self.qkv(layer, &h, pos);
                qs.push(q);
                ks.push(k);
                vs.push(v);
            }
            let mask: Vec<Vec<f32>> = (0..n)
                .map(|i| {
                    (0..n)
                        .map(|j| {
                            if key_visible(positions[j], positions[i], hp.sliding_window) {
                                0.0
                            } else {
                                f32::NEG_INFINITY
                            }
                        })
                        .collect()
                })
                .collect();
            let mut next = Vec::with_capacity(n);
            for i in 0..n {
                let mut attn = vec![0.0f32; hp.q_width()];
                for head in 0..hp.n_head {
                    let kvh = head / group;
                    let qh = &qs[i][head * hd..(head + 1) * hd];
                    let mut probs: Vec<f32> = (0..n)
                        .map(|j| dot(qh, &ks[j][kvh * hd..(kvh + 1) * hd]) * scale + mask[i][j])
                        .collect();
                    softmax_in_place(&mut probs);
                    let out = &mut attn[head * hd..(head + 1) * hd];
                    for (j, &p) in probs.iter().enumerate() {
                        if mask[i][j] == f32::NEG_INFINITY {
                            // exp(-inf) is exactly 0; skipping keeps a -0.0 accumulator intact.
                            continue;
                        }
                        let vh = &vs[j][kvh * hd..(kvh + 1) * hd];
                        for (o, &vv) in out.iter_mut().zip(vh) {
                            *o += p * vv;
                        }
                    }
                }
                let o = matvec(&layer.wo, &attn);
                let x_attn: Vec<f32> = o.iter().zip(&xs[i]).map(|(&a, &r)| a + r).collect();
                next.push(ffn_block(layer, &x_attn, hp.rms_eps));
            }
            xs = next;
        }
        xs.iter().map(|x| self.logits(x)).collect()
    }

    /// Greedy decoding: runs `prompt` at positions `0..`, then appends `n_new` argmax tokens.
    /// Returns only the new tokens.
    pub fn greedy(&self, prompt: &[u32], n_new: usize) -> Vec<u32> {
        assert!(!prompt.is_empty(), "greedy decoding needs a prompt");
        let mut kv = VecKvStore::for_model(self);
        let positions: Vec<i32> = (0..prompt.len() as i32).collect();
        let logits = self.forward_tokens(prompt, &positions, &mut kv);
        let last = logits.last().expect("non-empty prompt");
        self.greedy_continue(&mut kv, last, prompt.len() as i32, n_new)
    }

    /// Continues greedy decoding over an existing store: `last_logits` are the logits of the last
    /// token already in `kv`, and the next token goes to `next_pos`.
    pub fn greedy_continue<S: KvStore + ?Sized>(
        &self,
        kv: &mut S,
        last_logits: &[f32],
        next_pos: i32,
        n_new: usize,
    ) -> Vec<u32> {
        let mut out = Vec::with_capacity(n_new);
        let mut logits = last_logits.to_vec();
        for i in 0..n_new {
            let token = argmax(&logits);
            out.push(token);
            if i + 1 < n_new {
                logits = self.forward_token(token, next_pos + i as i32, kv);
            }
        }
        out
    }
}

fn rope_scale_is_one(f: &GgufFile) -> bool {
    matches!(
        f.get("llama.rope.scaling.factor"),
        None | Some(GgufValue::F32(1.0))
    )
}

/// Index of the largest logit (the lowest index on ties; NaNs never win).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] || logits[best].is_nan() && !v.is_nan() {
            best = i;
        }
    }
    best as u32
}

/// The largest absolute difference between two equally long vectors (NaN if either holds one).
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "max_abs_diff: lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, |m, d| {
            if d.is_nan() || m.is_nan() {
                f32::NAN
            } else {
                m.max(d)
            }
        })
}

impl VecKvStore {
    /// An empty store shaped for `model`.
    pub fn for_model(model: &Model) -> Self {
        Self::new(model.hparams.n_layer, model.hparams.kv_width())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tiny::{tiny_model_bytes, tiny_model_bytes_tied, TinyModelSpec};

    const PROMPT: [u32; 7] = [1, 17, 42, 5, 63, 8, 30];

    fn tiny() -> Model {
        let bytes = tiny_model_bytes(&TinyModelSpec::default()).unwrap();
        Model::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    fn assert_bits_eq(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert_eq!(
                bits(x),
                bits(y),
                "{what}: token {i} differs, max|Δ| = {:e}",
                max_abs_diff(x, y)
            );
        }
    }

    fn positions(n: usize) -> Vec<i32> {
        (0..n as i32).collect()
    }

    #[test]
    fn loads_the_tiny_model() {
        let m = tiny();
        let hp = m.hparams();
        assert_eq!(
            (
                hp.n_layer,
                hp.n_embd,
                hp.n_head,
                hp.n_head_kv,
                hp.head_dim,
                hp.n_ff,
                hp.n_vocab
            ),
            (2, 64, 4, 2, 16, 128, 64)
        );
        assert_eq!(hp.kv_width(), 32);
        assert!(!m.has_tied_output());
        assert_eq!(hp.sliding_window, None);
    }

    /// T1 (seed: TestStandardLayoutNoOp): the cached path equals the cacheless reference with
    /// max |Δ| = 0 for a 7-token prompt.
    #[test]
    fn cached_equals_cacheless_bit_for_bit() {
        let m = tiny();
        let pos = positions(PROMPT.len());
        let mut kv = VecKvStore::for_model(&m);
        let cached = m.forward_tokens(&PROMPT, &pos, &mut kv);
        let reference = m.forward_sequence(&PROMPT, &pos);
        assert_bits_eq(&cached, &reference, "cached vs cacheless");
        // The store holds one entry per token and layer, at the right positions, and each
        // rotated key is one rotation of its raw key.
        for l in 0..2 {
            assert_eq!(kv.positions(l), &pos[..]);
            for (j, &p) in pos.iter().enumerate() {
                let rotated = crate::model::rope::rope_rotated(kv.k_raw(l, j), 2, 16, p, 10000.0);
                assert_eq!(bits(&rotated), bits(kv.k(l, j)));
            }
        }
    }

    #[test]
    fn activations_are_sane_and_greedy_is_not_degenerate() {
        let m = tiny();
        let logits = m.forward_sequence(&PROMPT, &positions(PROMPT.len()));
        for l in &logits {
            assert!(l.iter().all(|x| x.is_finite()));
            let mean = l.iter().sum::<f32>() / l.len() as f32;
            let sd =
                (l.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / l.len() as f32).sqrt();
            assert!(sd > 0.2 && sd < 20.0, "logit sd {sd}");
        }
        let argmaxes: std::collections::BTreeSet<u32> = logits.iter().map(|l| argmax(l)).collect();
        assert!(argmaxes.len() >= 3, "prompt argmaxes {argmaxes:?}");
        let generated = m.greedy(&PROMPT, 24);
        let distinct: std::collections::BTreeSet<u32> = generated.iter().copied().collect();
        assert!(distinct.len() >= 4, "greedy {generated:?}");
        // Greedy through the store agrees with greedy through the reference.
        let mut seq = PROMPT.to_vec();
        for &t in &generated[..6] {
            let l = m.forward_sequence(&seq, &positions(seq.len()));
            assert_eq!(argmax(l.last().unwrap()), t);
            seq.push(t);
        }
    }

    /// T3: no window is full causal (bit-identical on both paths); a window at least as long as
    /// the sequence is full causal; a window of 3 changes the last logits; the windowed cached path
    /// equals the `-inf`-masked reference bit for bit.
    #[test]
    fn sliding_window_semantics() {
        let m = tiny();
        let pos = positions(PROMPT.len());
        let full_ref = m.forward_sequence(&PROMPT, &pos);
        let run_cached = |model: &Model| {
            let mut kv = VecKvStore::for_model(model);
            model.forward_tokens(&PROMPT, &pos, &mut kv)
        };
        let full_cached = run_cached(&m);
        assert_bits_eq(&full_cached, &full_ref, "unset window vs full causal");
        for w in [7, 8, 100, u32::MAX] {
            let mw = m.with_sliding_window(Some(w));
            assert_bits_eq(&run_cached(&mw), &full_ref, &format!("window {w} cached"));
            assert_bits_eq(
                &mw.forward_sequence(&PROMPT, &pos),
                &full_ref,
                &format!("window {w} reference"),
            );
        }
        let m3 = m.with_sliding_window(Some(3));
        let w3_cached = run_cached(&m3);
        let w3_ref = m3.forward_sequence(&PROMPT, &pos);
        assert_bits_eq(&w3_cached, &w3_ref, "window 3: cached vs -inf reference");
        // The first 3 tokens see everything before them anyway.
        assert_bits_eq(&w3_cached[..3], &full_ref[..3], "window 3, first tokens");
        let d = max_abs_diff(&w3_cached[6], &full_ref[6]);
        assert!(
            d > 1e-3,
            "window 3 did not change the last logits (max|Δ| = {d})"
        );
    }

    #[test]
    fn window_mask_follows_positions_not_indices() {
        // The seed's eviction-renumber case: positions [0,1,2,7,8], W = 3, query at 8 sees 7, 8.
        let table = [
            (5, 5, Some(1), true),
            (4, 5, Some(1), false),
            (3, 5, Some(3), true),
            (2, 5, Some(3), false),
            (0, 5, None, true),
            (6, 5, None, false),
            (6, 5, Some(3), false),
            (i32::MIN, i32::MAX, Some(u32::MAX), false),
        ];
        for (k, q, w, want) in table {
            assert_eq!(key_visible(k, q, w), want, "key {k} query {q} window {w:?}");
        }
        let mut kv = VecKvStore::new(1, 2);
        for p in [0, 1, 2, 7, 8] {
            kv.append(0, p, &[p as f32, 0.0], &[p as f32, 0.0], &[0.0, p as f32]);
        }
        let seen: Vec<i32> = kv.visible(0, 8, Some(3)).map(|e| e.pos).collect();
        assert_eq!(seen, vec![7, 8]);
        let seen: Vec<i32> = kv.visible(0, 2, None).map(|e| e.pos).collect();
        assert_eq!(seen, vec![0, 1, 2]);
    }

    #[test]
    fn gapped_positions_match_the_reference() {
        // Positions with a hole, as after an eviction without renumbering.
        let m = tiny().with_sliding_window(Some(3));
        let pos = [0, 1, 2, 7, 8, 9, 10];
        let mut kv = VecKvStore::for_model(&m);
        let cached = m.forward_tokens(&PROMPT, &pos, &mut kv);
        assert_bits_eq(
            &cached,
            &m.forward_sequence(&PROMPT, &pos),
            "gapped positions",
        );
    }

    #[test]
    fn tied_output_loads_and_runs() {
        let bytes = tiny_model_bytes_tied(&TinyModelSpec::default()).unwrap();
        let m = Model::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap();
        assert!(m.has_tied_output());
        let logits = m.forward_sequence(&PROMPT, &positions(PROMPT.len()));
        assert!(logits.iter().flatten().all(|x| x.is_finite()));
    }

    #[test]
    fn load_from_disk_and_reject_bad_files() {
        let dir = std::env::temp_dir().join(format!("kvaudit-forward-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tiny.gguf");
        crate::model::tiny::write_tiny_model(&TinyModelSpec::default(), &path).unwrap();
        let m = Model::load(&path).unwrap();
        let pos = positions(3);
        assert_bits_eq(
            &m.forward_sequence(&PROMPT[..3], &pos),
            &tiny().forward_sequence(&PROMPT[..3], &pos),
            "loaded from disk",
        );

        // Wrong architecture.
        let mut w = crate::model::gguf::GgufWriter::new();
        w.add_kv("general.architecture", GgufValue::String("gpt2".into()));
        let err = Model::from_gguf(&GgufFile::from_bytes(w.to_bytes()).unwrap()).unwrap_err();
        assert!(err.to_string().contains("gpt2"), "{err:#}");
        // A key with the wrong type (block_count as int32).
        let mut w = crate::model::gguf::GgufWriter::new();
        w.add_kv("general.architecture", GgufValue::String("llama".into()))
            .add_kv("llama.embedding_length", GgufValue::U32(64))
            .add_kv("llama.block_count", GgufValue::I32(2));
        let err = Model::from_gguf(&GgufFile::from_bytes(w.to_bytes()).unwrap()).unwrap_err();
        assert!(format!("{err:#}").contains("llama.block_count"), "{err:#}");
        // A missing tensor is named.
        let f = GgufFile::from_bytes(tiny_model_bytes(&TinyModelSpec::default()).unwrap()).unwrap();
        let mut w = crate::model::gguf::GgufWriter::new();
        for (k, v) in &f.metadata {
            w.add_kv(k.clone(), v.clone());
        }
        for t in f.tensors.iter().filter(|t| t.name != "blk.1.ffn_up.weight") {
            w.add_tensor_f32(t.name.clone(), &t.dims, f.tensor_f32(&t.name).unwrap());
        }
        let err = Model::from_gguf(&GgufFile::from_bytes(w.to_bytes()).unwrap()).unwrap_err();
        assert!(
            format!("{err:#}").contains("blk.1.ffn_up.weight"),
            "{err:#}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The greedy continuation of the default tiny model, as both this reference and llama.cpp
    /// 0.1.161 (F32 and F16 KV cache, batch and token-by-token decode) produced it on 2026-11-29.
    #[test]
    fn greedy_matches_the_recorded_llama_cpp_continuation() {
        const LLAMA_CPP_0_1_161_GREEDY: [u32; 24] = [
            61, 20, 18, 33, 10, 16, 56, 42, 33, 10, 37, 3, 7, 52, 6, 54, 46, 24, 36, 42, 9, 46, 47,
            51,
        ];
        assert_eq!(tiny().greedy(&PROMPT, 24), LLAMA_CPP_0_1_161_GREEDY);
    }

    #[test]
    fn argmax_prefers_the_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.2]), 1);
    }
}
