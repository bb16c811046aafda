//! A setup as mlx-lm caches: the cache class of each layer, the model's shape and the limits,
//! read as `workers/mlx_worker.py`'s `Config` reads it (its defaults and its refusals), so that
//! the program builds what the worker built. Every value reaches the program as a number or as
//! one of the fixed names here, never as the setup's text.

use std::fmt::Write as _;

use crate::base::config::CacheType;
use crate::base::error::Error;
use crate::base::op::{Arch, Setup};
use crate::model::tiny::TinyModelSpec;

/// mlx-lm's cache classes, as the worker's `engine.cache` names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheKind {
    /// `KVCache`.
    Plain,
    /// `RotatingKVCache(max_size, keep)`.
    Rotating,
    /// `ChunkedKVCache(chunk_size)`.
    Chunked,
    /// `ConcatenateKVCache`.
    Concatenate,
    /// `QuantizedKVCache(group_size, bits)`.
    Quantized,
}

impl CacheKind {
    const ALL: [CacheKind; 5] = [
        CacheKind::Plain,
        CacheKind::Rotating,
        CacheKind::Chunked,
        CacheKind::Concatenate,
        CacheKind::Quantized,
    ];

    /// Its `engine.cache` name.
    pub fn name(self) -> &'static str {
        match self {
            CacheKind::Plain => "plain",
            CacheKind::Rotating => "rotating",
            CacheKind::Chunked => "chunked",
            CacheKind::Concatenate => "concatenate",
            CacheKind::Quantized => "quantized",
        }
    }

    /// Its mlx-lm class.
    pub fn class(self) -> &'static str {
        match self {
            CacheKind::Plain => "KVCache",
            CacheKind::Rotating => "RotatingKVCache",
            CacheKind::Chunked => "ChunkedKVCache",
            CacheKind::Concatenate => "ConcatenateKVCache",
            CacheKind::Quantized => "QuantizedKVCache",
        }
    }
}

/// The model the worker runs a setup on (`model_for` in `workers/mlx_worker.py`).
#[derive(Clone, Debug, PartialEq)]
pub enum MlxModel {
    /// kvaudit's tiny GGUF llama of this spec, the file the worker loads (`gguf_model`): the
    /// program makes its weights again from the spec's seed (splitmix64, as `model/tiny`).
    Gguf(TinyModelSpec),
    /// The windowed llama the worker builds in code (hidden 64, 2 layers, vocabulary 97).
    Windowed,
    /// mlx-lm's llama4 text model the worker builds in code (`llama4_model`), with its own
    /// `make_cache`.
    Llama4,
}

/// The setup as the mlx-lm worker runs it.
#[derive(Clone, Debug, PartialEq)]
pub struct MlxSetup {
    /// Tokens a sequence may hold (kvaudit's limit: a decode beyond it returns 1).
    pub n_ctx: u32,
    /// Sequences (one prompt cache each).
    pub n_seq_max: u32,
    /// The cache class of each layer (gemma2: the windowed layer first, as mlx-lm orders them;
    /// llama4: three chunked layers, then the global one).
    pub kinds: Vec<CacheKind>,
    /// The model.
    pub model: MlxModel,
    /// `engine.batch=true`: several sequences decode as one batch cache.
    pub batch: bool,
    /// gemma2's sliding window.
    pub window: Option<u32>,
    /// A `RotatingKVCache`'s `max_size` and `keep`.
    pub max_size: Option<u32>,
    /// See `max_size`.
    pub keep: u32,
    /// A `ChunkedKVCache`'s chunk size.
    pub chunk_size: Option<u32>,
    /// A `QuantizedKVCache`'s bits and group size.
    pub bits: Option<u32>,
    /// See `bits`.
    pub group_size: Option<u32>,
    /// The head size, when not the model's default (a quantized cache needs 64).
    pub head_dim: Option<u32>,
    /// Whether the model has a windowed layer (arch gemma2).
    pub windowed: bool,
}

/// The layers of the worker's llama4 (`LLAMA4_LAYERS`): layer 3 is its global layer.
const LLAMA4_LAYERS: usize = 4;
/// The vocabulary of the models the worker builds in code (`VOCAB`).
const IN_CODE_VOCAB: i32 = 97;

/// The most tokens and sequences the worker takes.
const MAX_CTX: u32 = 1 << 16;
const MAX_SEQS: u32 = 64;

fn unsupported(why: String) -> Error {
    Error::input(format!(
        "the mlx-lm worker cannot run this setup ({why}): no mlx-lm program replays it"
    ))
}

impl MlxSetup {
    /// The setup as the worker reads it, or why the worker would refuse it.
    pub fn of(s: &Setup) -> Result<MlxSetup, Error> {
        let gemma2 = match s.arch {
            Arch::Llama | Arch::LlamaHd64 => false,
            Arch::Gemma2 => true,
            other => {
                return Err(unsupported(format!(
                    "arch {other}: it runs a llama or a llama with a windowed layer (gemma2)"
                )))
            }
        };
        if !s.kv_unified || !s.swa_full || s.n_rs_seq > 0 || s.embd_input {
            return Err(unsupported(
                "kv_unified, swa_full, n_rs_seq or embd_input other than the default".into(),
            ));
        }
        if !s.foreign.is_empty() {
            return Err(unsupported("foreign dumps".into()));
        }
        if !(1..=MAX_SEQS).contains(&s.n_seq_max) || !(1..=MAX_CTX).contains(&s.n_ctx) {
            return Err(unsupported(format!(
                "n_ctx {}, n_seq_max {}",
                s.n_ctx, s.n_seq_max
            )));
        }
        if s.type_k != s.type_v {
            return Err(unsupported("type_k differs from type_v".into()));
        }
        let quant = match s.type_k {
            CacheType::Q8_0 => Some(8),
            CacheType::Q4_0 => Some(4),
            CacheType::F16 | CacheType::F32 => None,
        };
        let engine = &s.engine;
        let known = [
            "model",
            "cache",
            "batch",
            "max_size",
            "keep",
            "chunk_size",
            "bits",
            "group_size",
            "window",
        ];
        if let Some(k) = engine.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(unsupported(format!("engine key {k:?}")));
        }
        let named = match engine.get("cache") {
            None => None,
            Some(v) => Some(
                CacheKind::ALL
                    .into_iter()
                    .find(|k| k.name() == v)
                    .ok_or_else(|| unsupported(format!("engine cache {v:?}")))?,
            ),
        };
        let llama4 = match engine.get("model").map(String::as_str) {
            None | Some("llama") => false,
            Some("llama4") => true,
            Some(other) => return Err(unsupported(format!("engine model {other:?}"))),
        };
        if llama4
            && (!gemma2
                || named.is_some()
                || quant.is_some()
                || engine.get("batch").is_some_and(|b| b != "false"))
        {
            return Err(unsupported(
                "engine model=llama4 runs with arch gemma2, its own caches and no batch".into(),
            ));
        }
        let kind = match (quant, named) {
            _ if llama4 => CacheKind::Chunked,
            (Some(_), None | Some(CacheKind::Quantized)) => CacheKind::Quantized,
            (Some(_), Some(_)) => {
                return Err(unsupported("a quantized type with another cache".into()))
            }
            (None, k) => k.unwrap_or(CacheKind::Plain),
        };
        if gemma2 && !llama4 && kind != CacheKind::Plain {
            return Err(unsupported(format!(
                "arch gemma2 with cache {}",
                kind.name()
            )));
        }
        let num = |key: &str, default: u32, lo: u32, hi: u32| -> Result<u32, Error> {
            match engine.get(key) {
                None => Ok(default),
                Some(text) => text
                    .parse::<u32>()
                    .ok()
                    .filter(|v| (lo..=hi).contains(v))
                    .ok_or_else(|| unsupported(format!("engine {key}={text:?}"))),
            }
        };
        let batch = match engine.get("batch").map(String::as_str) {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => return Err(unsupported(format!("engine batch={other:?}"))),
        };
        let rotating = kind == CacheKind::Rotating;
        // gemma2's window and keep belong to the windowed llama, not to llama4
        let gemma2 = gemma2 && !llama4;
        let window = if gemma2 {
            Some(num("window", 8, 1, 4096)?)
        } else {
            None
        };
        let max_size = if rotating {
            Some(num("max_size", 8, 1, 4096)?)
        } else {
            window
        };
        let keep = if rotating || gemma2 {
            num("keep", 0, 0, 4095)?
        } else {
            0
        };
        if max_size.is_some_and(|m| keep >= m) {
            return Err(unsupported(format!("keep {keep} >= max_size")));
        }
        let quantized = kind == CacheKind::Quantized;
        let chunk_size = if kind == CacheKind::Chunked || llama4 {
            Some(num("chunk_size", 4, 1, 1 << 20)?)
        } else {
            None
        };
        let bits = if quantized {
            Some(num("bits", quant.unwrap_or(8), 2, 8)?)
        } else {
            None
        };
        let group_size = if quantized {
            Some(num("group_size", 32, 32, 128)?)
        } else {
            None
        };
        if quantized
            && (!matches!(bits, Some(2..=6 | 8)) || !matches!(group_size, Some(32 | 64 | 128)))
        {
            return Err(unsupported("QuantizedKVCache bits or group size".into()));
        }
        if batch && !matches!(kind, CacheKind::Plain | CacheKind::Rotating) {
            return Err(unsupported(format!(
                "batch=true with cache {}",
                kind.name()
            )));
        }
        // Every other engine key must belong to the cache kind (the worker's ENGINE_KEYS).
        for k in engine.keys() {
            let applies = match k.as_str() {
                "cache" | "batch" => true,
                "max_size" => rotating,
                "keep" => rotating || gemma2,
                "chunk_size" => kind == CacheKind::Chunked,
                "model" => true,
                "bits" | "group_size" => quantized,
                _ => gemma2, // "window"
            };
            if !applies {
                return Err(unsupported(format!("engine key {k:?} does not apply here")));
            }
        }
        let head_dim = (s.arch == Arch::LlamaHd64 || quantized).then_some(64);
        let model = if llama4 {
            MlxModel::Llama4
        } else if gemma2 {
            MlxModel::Windowed
        } else {
            // the worker's `models` option: the llama_hd64 file where heads must be 64 wide
            MlxModel::Gguf(TinyModelSpec::for_arch(if head_dim.is_some() {
                Arch::LlamaHd64
            } else {
                Arch::Llama
            }))
        };
        let kinds = match &model {
            MlxModel::Llama4 => {
                let mut k = vec![CacheKind::Chunked; LLAMA4_LAYERS - 1];
                k.push(CacheKind::Plain);
                k
            }
            MlxModel::Windowed => vec![CacheKind::Rotating, CacheKind::Plain],
            MlxModel::Gguf(spec) => vec![kind; spec.n_layer as usize],
        };
        Ok(MlxSetup {
            n_ctx: s.n_ctx,
            n_seq_max: s.n_seq_max,
            kinds,
            model,
            batch,
            window,
            max_size,
            keep,
            chunk_size,
            bits,
            group_size,
            head_dim,
            windowed: gemma2 || llama4,
        })
    }

    /// The layer whose positions are a sequence's cells (gemma2: the full-attention layer;
    /// llama4: the global one, its last).
    pub fn base(&self) -> usize {
        match self.model {
            MlxModel::Llama4 => LLAMA4_LAYERS - 1,
            MlxModel::Windowed => 1,
            MlxModel::Gguf(_) => 0,
        }
    }

    /// The model in words, for the program's header.
    pub fn model_in_words(&self) -> String {
        match &self.model {
            MlxModel::Gguf(spec) => format!(
                "kvaudit's tiny GGUF llama ({} layer(s), n_embd {}, {} heads, {} KV heads, vocabulary {}), the file its mlx-lm worker and llama.cpp targets load (`kvaudit model`), its weights made again here from seed {:#x}",
                spec.n_layer, spec.n_embd, spec.n_head, spec.n_head_kv, spec.n_vocab, spec.seed
            ),
            MlxModel::Windowed => "a tiny llama with a sliding-window layer built in code (hidden 64, 2 layers, 4 heads, 2 KV heads, vocabulary 97), random weights from mx.random.seed(0)".into(),
            MlxModel::Llama4 => "mlx-lm's llama4 text model built in code (4 layers, hidden 64, 4 heads, 2 KV heads, vocabulary 97), random weights from mx.random.seed(0)".into(),
        }
    }

    /// The model's vocabulary: a token outside it makes a decode return -1.
    pub fn vocab(&self) -> i32 {
        match &self.model {
            MlxModel::Gguf(spec) => spec.n_vocab as i32,
            MlxModel::Windowed | MlxModel::Llama4 => IN_CODE_VOCAB,
        }
    }

    /// Whether a sequence's cache may refuse a trim (a `RotatingKVCache` that wrapped).
    pub fn may_refuse_trim(&self) -> bool {
        self.kinds.contains(&CacheKind::Rotating)
    }

    /// The constructor of one layer's cache, as Python.
    fn constructor(&self, kind: CacheKind) -> String {
        let n = |v: Option<u32>| v.unwrap_or_default();
        match kind {
            CacheKind::Plain => "C.KVCache()".into(),
            CacheKind::Rotating => {
                format!("C.RotatingKVCache({}, {})", n(self.max_size), self.keep)
            }
            CacheKind::Chunked => format!("C.ChunkedKVCache({})", n(self.chunk_size)),
            CacheKind::Concatenate => "C.ConcatenateKVCache()".into(),
            CacheKind::Quantized => format!(
                "C.QuantizedKVCache(group_size={}, bits={})",
                n(self.group_size),
                n(self.bits)
            ),
        }
    }

    /// The program's constants and `make_cache`: what the prelude reads.
    pub fn emit(&self, s: &mut String) {
        let opt = |v: Option<u32>| v.map_or("None".to_string(), |v| v.to_string());
        let _ = writeln!(s, "N_SEQ = {}", self.n_seq_max);
        let _ = writeln!(
            s,
            "N_CTX = {}  # kvaudit's limit: a decode beyond it returns 1 (no room)",
            self.n_ctx
        );
        let _ = writeln!(s, "N_LAYERS = {}", self.kinds.len());
        let kinds: Vec<String> = self
            .kinds
            .iter()
            .map(|k| format!("\"{}\"", k.name()))
            .collect();
        let _ = writeln!(s, "KINDS = [{}]", kinds.join(", "));
        let _ = writeln!(
            s,
            "BASE = {}  # the layer whose positions are a sequence's cells",
            self.base()
        );
        let _ = writeln!(
            s,
            "WIN = {}  # the windowed layer, whose accessors are the sequence's",
            if self.windowed { "0" } else { "None" }
        );
        let _ = writeln!(s, "WINDOW = {}", opt(self.window));
        let _ = writeln!(s, "HEAD_DIM = {}", opt(self.head_dim));
        let _ = writeln!(s, "BATCH = {}", if self.batch { "True" } else { "False" });
        let _ = writeln!(s, "CHUNK_SIZE = {}", opt(self.chunk_size));
        match &self.model {
            MlxModel::Gguf(spec) => {
                let _ = writeln!(s, "MODEL = \"gguf\"");
                let _ = writeln!(s, "# kvaudit's tiny GGUF llama (`kvaudit model` writes it), its weights made again here");
                let _ = writeln!(
                    s,
                    "GGUF = dict(n_layer={}, n_embd={}, n_head={}, n_head_kv={}, n_ff={}, n_vocab={}, n_ctx_train={},",
                    spec.n_layer, spec.n_embd, spec.n_head, spec.n_head_kv, spec.n_ff, spec.n_vocab, spec.n_ctx_train
                );
                let _ = writeln!(
                    s,
                    "            rope_freq_base={:?}, rms_eps={:?}, seed={:#x})",
                    f64::from(spec.rope_freq_base),
                    f64::from(spec.rms_eps),
                    spec.seed
                );
            }
            MlxModel::Windowed => {
                let _ = writeln!(s, "MODEL = \"windowed\"");
            }
            MlxModel::Llama4 => {
                let _ = writeln!(s, "MODEL = \"llama4\"");
            }
        }
        let _ = writeln!(s, "\n\ndef make_cache():");
        if self.model == MlxModel::Llama4 {
            let _ = writeln!(s, "    \"\"\"A fresh prompt cache of one sequence: the model's own (llama4's make_cache).\"\"\"");
            let _ = writeln!(s, "    return C.make_prompt_cache(model)\n");
            return;
        }
        let _ = writeln!(
            s,
            "    \"\"\"A fresh prompt cache of one sequence: one cache per layer.\"\"\""
        );
        let layers: Vec<String> = self.kinds.iter().map(|&k| self.constructor(k)).collect();
        let _ = writeln!(s, "    return [{}]\n", layers.join(", "));
    }

    /// The configuration in words, for the header and the bug report.
    pub fn describe(&self) -> String {
        let mut words = vec![format!(
            "{} sequences (one prompt cache each), n_ctx {}",
            self.n_seq_max, self.n_ctx
        )];
        if self.model == MlxModel::Llama4 {
            words.push(format!(
                "mlx-lm's llama4 text model (4 layers, attention_chunk_size {}) with its own make_cache: ChunkedKVCache({}) on layers 0-2, KVCache on the global layer 3",
                self.chunk_size.unwrap_or_default(),
                self.chunk_size.unwrap_or_default()
            ));
        } else if self.windowed {
            words.push(format!(
                "a windowed layer (sliding_window {}) with RotatingKVCache({}, {}) and a full-attention layer with KVCache",
                self.window.unwrap_or_default(),
                self.max_size.unwrap_or_default(),
                self.keep
            ));
        } else {
            words.push(format!(
                "{} on each of the model's {} layer(s): kvaudit's tiny GGUF llama",
                self.constructor(self.kinds[0]).trim_start_matches("C."),
                self.kinds.len()
            ));
        }
        if let Some(h) = self.head_dim {
            words.push(format!("head_dim {h}"));
        }
        if self.batch {
            words.push(
                "several sequences decode as one batch (BatchKVCache.merge / extract)".into(),
            );
        }
        words.join(", ")
    }
}
