//! A setup's settings as one list: every field of [`Setup`] but its ops, plus the thread count
//! kvaudit runs every context with, as (key, value) pairs. This is the one place a setting is
//! declared: the llama.cpp target hands the list to the shim as data (`kvaudit_shim_open` applies
//! the pairs to `llama_context_params` by one loop, `targets/llama-cpp/shim/kvaudit_shim.c`), the C
//! reproducer writes one `cp.FIELD = VALUE;` per pair, the bug report lists them, and
//! `--config key=value` parses by the same keys.
//!
//! [`Setup::settings`] destructures the setup without `..`, so a new field of [`Setup`] does not
//! compile until it has a [`Key`]; a key the shim does not know makes `kvaudit_shim_open` fail, and
//! `llama::settings_*` (tests/data/llama/settings_*.json) sets every key to a value that is not its
//! default and reads each back from the context, the C program and the bug report.

use std::fmt;

use super::config::{Arch, CacheType};
use super::op::Setup;

/// The name of one setting: what JSON, `--config`, the shim and the bug report call it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// `n_ctx`: context size in cells (llama.cpp pads it to a multiple of 256).
    NCtx,
    /// `n_seq_max`: how many sequences the context is made for.
    NSeqMax,
    /// `kv_unified`: one KV stream shared by every sequence.
    KvUnified,
    /// `n_batch`: logical batch size.
    NBatch,
    /// `n_ubatch`: physical batch size.
    NUbatch,
    /// `flash_attn`: flash attention on or off.
    FlashAttn,
    /// `type_k`: the K cache's element type.
    TypeK,
    /// `type_v`: the V cache's element type.
    TypeV,
    /// `arch`: the model's architecture (which memory type the context gets): not a context
    /// parameter but the model file a context is made from.
    Arch,
    /// `swa_full`: the sliding-window cache holds the full context.
    SwaFull,
    /// `n_rs_seq`: recurrent-state snapshots per sequence for rollback (0: none).
    NRsSeq,
    /// `embd_input`: decodes feed embeddings, not token ids (how the batch is filled, not a
    /// context parameter).
    EmbdInput,
    /// `n_threads`: threads for decoding (and for batches): always 1 in kvaudit, not a field of
    /// the setup.
    NThreads,
}

impl Key {
    /// Every key, in the order settings are listed.
    pub const ALL: [Key; 13] = [
        Key::NCtx,
        Key::NSeqMax,
        Key::KvUnified,
        Key::NBatch,
        Key::NUbatch,
        Key::FlashAttn,
        Key::TypeK,
        Key::TypeV,
        Key::Arch,
        Key::SwaFull,
        Key::NRsSeq,
        Key::EmbdInput,
        Key::NThreads,
    ];

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            Key::NCtx => "n_ctx",
            Key::NSeqMax => "n_seq_max",
            Key::KvUnified => "kv_unified",
            Key::NBatch => "n_batch",
            Key::NUbatch => "n_ubatch",
            Key::FlashAttn => "flash_attn",
            Key::TypeK => "type_k",
            Key::TypeV => "type_v",
            Key::Arch => "arch",
            Key::SwaFull => "swa_full",
            Key::NRsSeq => "n_rs_seq",
            Key::EmbdInput => "embd_input",
            Key::NThreads => "n_threads",
        }
    }

    /// Whether `--config` may set it (every field of the setup; not the thread count).
    pub fn configurable(self) -> bool {
        self != Key::NThreads
    }

    /// Sets this key of `setup` from `--config` text.
    fn set(self, setup: &mut Setup, v: &str) -> Result<(), String> {
        let k = self.name();
        let num = || {
            v.parse::<u32>()
                .map_err(|_| format!("configuration {k}: {v:?} is not a number"))
        };
        let flag = || match v {
            "true" | "on" | "1" => Ok(true),
            "false" | "off" | "0" => Ok(false),
            _ => Err(format!("configuration {k}: {v:?} is not true/false")),
        };
        match self {
            Key::NCtx => setup.n_ctx = num()?,
            Key::NSeqMax => setup.n_seq_max = num()?,
            Key::KvUnified => setup.kv_unified = flag()?,
            Key::NBatch => setup.n_batch = Some(num()?),
            Key::NUbatch => setup.n_ubatch = Some(num()?),
            Key::FlashAttn => setup.flash_attn = flag()?,
            Key::TypeK => setup.type_k = v.parse()?,
            Key::TypeV => setup.type_v = v.parse()?,
            Key::Arch => setup.arch = v.parse()?,
            Key::SwaFull => setup.swa_full = flag()?,
            Key::NRsSeq => setup.n_rs_seq = num()?,
            Key::EmbdInput => setup.embd_input = flag()?,
            Key::NThreads => return Err(format!("configuration {k}: kvaudit runs one thread")),
        }
        Ok(())
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A setting's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Value {
    /// A count (sizes, threads).
    Count(u32),
    /// On or off.
    Flag(bool),
    /// A cache element type.
    Type(CacheType),
    /// A model architecture.
    Arch(Arch),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Count(n) => write!(f, "{n}"),
            Value::Flag(b) => write!(f, "{b}"),
            Value::Type(t) => write!(f, "{t}"),
            Value::Arch(a) => write!(f, "{a}"),
        }
    }
}

/// One (key, value) pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Setting {
    /// Which setting.
    pub key: Key,
    /// Its value.
    pub value: Value,
}

/// The threads kvaudit runs every context with: cheap, and deterministic for auditing.
pub const N_THREADS: u32 = 1;

impl Setting {
    /// The value as the shim takes it (`kvaudit_shim_setting.value`): counts as they are, flags
    /// 0/1, cache types as their `enum ggml_type`; `None` for the architecture, which picks the
    /// model file rather than a context parameter.
    pub fn shim_value(&self) -> Option<i64> {
        match self.value {
            Value::Count(n) => Some(i64::from(n)),
            Value::Flag(b) => Some(i64::from(b)),
            Value::Type(t) => Some(i64::from(t.ggml_type())),
            Value::Arch(_) => None,
        }
    }

    /// The `llama_context_params` fields this setting sets and their values as C source (as in
    /// llama.h), or `None` for a setting that is no context field: the architecture (the
    /// model) and `embd_input` (read by the C program's decode helper, `n_embd_input`).
    pub fn llama_h(&self) -> Option<Vec<(&'static str, String)>> {
        let c = |v: Value| match v {
            Value::Count(n) => n.to_string(),
            Value::Flag(b) => b.to_string(),
            Value::Type(t) => ggml_type_c(t).to_string(),
            Value::Arch(a) => a.to_string(),
        };
        let one = |field: &'static str| Some(vec![(field, c(self.value))]);
        match self.key {
            Key::NCtx => one("n_ctx"),
            Key::NSeqMax => one("n_seq_max"),
            Key::KvUnified => one("kv_unified"),
            Key::NBatch => one("n_batch"),
            Key::NUbatch => one("n_ubatch"),
            Key::FlashAttn => Some(vec![(
                "flash_attn_type",
                if self.value == Value::Flag(true) {
                    "LLAMA_FLASH_ATTN_TYPE_ENABLED"
                } else {
                    "LLAMA_FLASH_ATTN_TYPE_DISABLED"
                }
                .to_string(),
            )]),
            Key::TypeK => one("type_k"),
            Key::TypeV => one("type_v"),
            Key::SwaFull => one("swa_full"),
            Key::NRsSeq => one("n_rs_seq"),
            Key::NThreads => Some(vec![
                ("n_threads", c(self.value)),
                ("n_threads_batch", c(self.value)),
            ]),
            Key::Arch | Key::EmbdInput => None,
        }
    }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.key, self.value)
    }
}

/// `enum ggml_type` name of a cache type, as C source.
pub fn ggml_type_c(t: CacheType) -> &'static str {
    match t {
        CacheType::F16 => "GGML_TYPE_F16",
        CacheType::F32 => "GGML_TYPE_F32",
        CacheType::Q8_0 => "GGML_TYPE_Q8_0",
        CacheType::Q4_0 => "GGML_TYPE_Q4_0",
    }
}

impl Setup {
    /// Every setting of this setup, in [`Key::ALL`] order: each field (the batch sizes when
    /// set: unset, llama.cpp's defaults hold; `embd_input` when on), then the thread count.
    pub fn settings(&self) -> Vec<Setting> {
        // No `..`: a new field does not compile until it is listed here.
        let Setup {
            n_ctx,
            n_seq_max,
            kv_unified,
            n_batch,
            n_ubatch,
            flash_attn,
            type_k,
            type_v,
            arch,
            swa_full,
            n_rs_seq,
            embd_input,
            ops: _,
            // Not a setting of this context: the slots its trace starts with.
            foreign: _,
            // Another engine's own settings: llama.cpp and the native caches have none, and
            // refuse a setup that names any (`Setup::check_engine_settings`).
            engine: _,
        } = self;
        let set = |key, value| Some(Setting { key, value });
        [
            set(Key::NCtx, Value::Count(*n_ctx)),
            set(Key::NSeqMax, Value::Count(*n_seq_max)),
            set(Key::KvUnified, Value::Flag(*kv_unified)),
            n_batch.and_then(|n| set(Key::NBatch, Value::Count(n))),
            n_ubatch.and_then(|n| set(Key::NUbatch, Value::Count(n))),
            set(Key::FlashAttn, Value::Flag(*flash_attn)),
            set(Key::TypeK, Value::Type(*type_k)),
            set(Key::TypeV, Value::Type(*type_v)),
            set(Key::Arch, Value::Arch(*arch)),
            set(Key::SwaFull, Value::Flag(*swa_full)),
            set(Key::NRsSeq, Value::Count(*n_rs_seq)),
            // Listed when on only: off is how every program before it decoded.
            embd_input.then_some(Setting {
                key: Key::EmbdInput,
                value: Value::Flag(true),
            }),
            set(Key::NThreads, Value::Count(N_THREADS)),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// The settings that differ from [`Setup::default`]'s (the thread count never does).
    pub fn non_default_settings(&self) -> Vec<Setting> {
        let default = Setup::default().settings();
        self.settings()
            .into_iter()
            .filter(|s| !default.contains(s))
            .collect()
    }

    /// Sets `key` from `--config` text.
    pub(super) fn set_text(&mut self, key: &str, value: &str) -> Result<(), String> {
        let known = || {
            Key::ALL
                .iter()
                .filter(|k| k.configurable())
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match Key::ALL
            .into_iter()
            .find(|k| k.configurable() && k.name() == key)
        {
            Some(k) => k.set(self, value),
            None => Err(format!(
                "unknown configuration key {key:?} (known: {})",
                known()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_configurable_key_is_set_by_its_name_and_listed_once() {
        let mut s = Setup::default();
        for (k, v) in [
            ("n_ctx", "512"),
            ("n_seq_max", "3"),
            ("kv_unified", "off"),
            ("n_batch", "64"),
            ("n_ubatch", "8"),
            ("flash_attn", "on"),
            ("type_k", "q8_0"),
            ("type_v", "f32"),
            ("arch", "gemma2"),
            ("swa_full", "off"),
            ("n_rs_seq", "2"),
            ("embd_input", "on"),
        ] {
            s.set_text(k, v).unwrap();
        }
        let listed: Vec<Key> = s.settings().iter().map(|s| s.key).collect();
        assert_eq!(listed, Key::ALL);
        let changed: Vec<Key> = s.non_default_settings().iter().map(|s| s.key).collect();
        assert_eq!(changed, &Key::ALL[..12]);
        assert!(s.set_text("n_threads", "2").is_err());
        assert!(s
            .set_text("frobnicate", "1")
            .unwrap_err()
            .contains("known: n_ctx"));
    }
}
