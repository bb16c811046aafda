//! A setup as mlx-lm caches: the cache class of each layer, the model's shape and the limits,
//! read as `workers/mlx_worker.py`'s `Config` reads it (its defaults and its refusals), so that
//! the program builds what the worker built. Every value reaches the program as a number or as
//! one of the fixed names here, never as the setup's text.

use std::fmt::Write as _;

use crate::base::config::CacheType;
use crate::base::error::Error;
use crate::base::op::{Arch, Setup};

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

/// The setup as the mlx-lm worker runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlxSetup {
    /// Tokens a sequence may hold (kvaudit's limit: a decode beyond it returns 1).
    pub n_ctx: u32,
    /// Sequences (one prompt cache each).
    pub n_seq_max: u32,
    /// The cache class of each layer (gemma2: the windowed layer first, as mlx-lm orders them).
    pub kinds: [CacheKind; 2],
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
        let kind = match (quant, named) {
            (Some(_), None | Some(CacheKind::Quantized)) => CacheKind::Quantized,
            (Some(_), Some(_)) => {
                return Err(unsupported("a quantized type with another cache".into()))
            }
            (None, k) => k.unwrap_or(CacheKind::Plain),
        };
        if gemma2 && kind != CacheKind::Plain {
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
        let chunk_size = if kind == CacheKind::Chunked {
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
                "bits" | "group_size" => quantized,
                _ => gemma2, // "window"
            };
            if !applies {
                return Err(unsupported(format!("engine key {k:?} does not apply here")));
            }
        }
        Ok(MlxSetup {
            n_ctx: s.n_ctx,
            n_seq_max: s.n_seq_max,
            kinds: if gemma2 {
                [CacheKind::Rotating, CacheKind::Plain]
            } else {
                [kind, kind]
            },
            batch,
            window,
            max_size,
            keep,
            chunk_size,
            bits,
            group_size,
            head_dim: (s.arch == Arch::LlamaHd64 || quantized).then_some(64),
            windowed: gemma2,
        })
    }

    /// The layer whose positions are a sequence's cells (gemma2: the full-attention layer).
    pub fn base(&self) -> usize {
        usize::from(self.windowed)
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
        let _ = writeln!(s, "N_LAYERS = 2");
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
        let _ = writeln!(s, "\n\ndef make_cache():");
        let _ = writeln!(s, "    \"\"\"A fresh prompt cache of one sequence.\"\"\"");
        let layers: Vec<String> = self.kinds.iter().map(|&k| self.constructor(k)).collect();
        let _ = writeln!(s, "    return [{}]\n", layers.join(", "));
    }

    /// The configuration in words, for the header and the bug report.
    pub fn describe(&self) -> String {
        let mut words = vec![format!(
            "{} sequences (one prompt cache each), n_ctx {}",
            self.n_seq_max, self.n_ctx
        )];
        if self.windowed {
            words.push(format!(
                "a windowed layer (sliding_window {}) with RotatingKVCache({}, {}) and a full-attention layer with KVCache",
                self.window.unwrap_or_default(),
                self.max_size.unwrap_or_default(),
                self.keep
            ));
        } else {
            words.push(format!(
                "{} on both layers",
                self.constructor(self.kinds[0]).trim_start_matches("C.")
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
