//! The cache a trace starts from ([`Setup`]): its shape, the context settings it runs under, the
//! ops that build its initial state, and the dumps made under other configurations that it puts
//! in slots ([`ForeignDump`]). [`super`] re-exports both, beside the ops a setup holds.

use serde::{Deserialize, Serialize};

use super::{is_zero, Arch, CacheType, InvalidOp, Op, SeqId, Slot};

/// The cache a trace starts from: its shape, the context settings it runs under, and the ops
/// that build the initial state.
///
/// Every field but `n_ctx`, `n_seq_max` and `ops` is left out of the JSON when it has its
/// default, so repro files written before the field existed read back as the same setup.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Setup {
    /// Context size in cells (llama.cpp pads it to a multiple of 256).
    #[serde(default = "default_n_ctx")]
    pub n_ctx: u32,
    /// Number of sequences the context is made for (`n_seq_max`).
    #[serde(default = "default_n_seq_max")]
    pub n_seq_max: u32,
    /// One KV stream shared by every sequence (`kv_unified`, default here: true). False is
    /// llama.cpp's own default: one stream of `n_ctx / n_seq_max` cells per sequence.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub kv_unified: bool,
    /// Logical batch size (`n_batch`); `None`: llama.cpp's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_batch: Option<u32>,
    /// Physical batch size (`n_ubatch`); a decode longer than this is split. `None`: default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_ubatch: Option<u32>,
    /// Flash attention on (default off).
    #[serde(default, skip_serializing_if = "is_false")]
    pub flash_attn: bool,
    /// The K cache's element type.
    #[serde(default, skip_serializing_if = "CacheType::is_default")]
    pub type_k: CacheType,
    /// The V cache's element type.
    #[serde(default, skip_serializing_if = "CacheType::is_default")]
    pub type_v: CacheType,
    /// The model's architecture, which decides the memory type llama.cpp gives the context
    /// (`llama-model.cpp`, `create_memory`): `llama` (an attention KV cache, the default),
    /// `gemma2` (iSWA), `mamba` (recurrent), `jamba` and `lfm2` (hybrid), `lfm2_swa` (hybrid-iSWA).
    #[serde(default, skip_serializing_if = "Arch::is_default")]
    pub arch: Arch,
    /// The sliding-window cache holds the full context (`swa_full`; llama.cpp's default: true).
    /// False makes the windowed cache small enough to evict. Only iSWA memory reads it.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub swa_full: bool,
    /// Recurrent-state snapshots per sequence for rollback (`n_rs_seq`, llama.h:370 in 0.1.161,
    /// "[EXPERIMENTAL]"; default 0: no rollback): how many tokens a partial `seq_rm` may take
    /// back from a recurrent state. llama.cpp clamps it to 0 for an architecture without
    /// rollback (`llm_arch_supports_rs_rollback`, src/llama-arch.cpp), which the llama.cpp
    /// target reports as unsupported. Only recurrent and hybrid memories read it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub n_rs_seq: u32,
    /// Decodes feed embeddings instead of token ids (`embd_input`; default off): each token t
    /// becomes `llama_batch.embd`'s row of the model's `n_embd` floats, a fixed function of t
    /// (the shim's `shim_token_embd`, the C reproducer's `token_embd`), as a multimodal
    /// client's image or audio chunk does. llama.h allows either input
    /// (`llama_batch`: "token" or "embd"); llama.cpp's cache stands in a token id for the cell
    /// of an embedding on models that read tokens back (PLE, src/llama-kv-cache.cpp:1159-1168
    /// in 0.1.161) and orders an embedding ubatch by its place, not its positions (:1869).
    #[serde(default, skip_serializing_if = "is_false")]
    pub embd_input: bool,
    /// Settings of one engine's own, handed to its worker as they are (mlx-lm:
    /// `cache = "rotating"`, `max_size = "8"`, `keep = "4"`; docs/worker-protocol.md): what
    /// engines share is the fields above. A target that does not know a key cannot take the
    /// setup (unsupported, never ignored). `--config engine.KEY=VALUE` sets one.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub engine: std::collections::BTreeMap<String, String>,
    /// Ops run before the trace; not checked and not counted.
    #[serde(default)]
    pub ops: Vec<Op>,
    /// Dumps saved by a context of another configuration, put in slots before the trace runs,
    /// so that its loads bring a state across configurations (llama.h: a load that cannot
    /// apply returns 0). Empty: every slot starts empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub foreign: Vec<ForeignDump>,
}

/// A dump made under another configuration ([`Setup::foreign`]): a context of the setup with
/// `config` applied (`type_k=f32`, `flash_attn=on`, `kv_unified=false`, `arch=llama_hd64`, ...)
/// runs the setup's ops, then `ops` (what that context holds beyond the setup's: more cells
/// than this context has, a sequence id it does not take), and saves the whole context (`seq`
/// unset) or one sequence into `slot`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForeignDump {
    /// The slot the dump is put in.
    pub slot: Slot,
    /// The other configuration, as `--vs-config` takes it.
    pub config: String,
    /// The sequence saved (`llama_state_seq_get_data`); unset: the whole context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<SeqId>,
    /// Ops the other context runs after the setup's, before the save.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<Op>,
}

impl ForeignDump {
    /// The setup whose context makes this dump for `setup`: its configuration under
    /// [`ForeignDump::config`], the same ops and then [`ForeignDump::ops`], no foreign dumps of
    /// its own.
    pub fn maker(&self, setup: &Setup) -> Result<Setup, InvalidOp> {
        let mut s = setup.with_config(&self.config)?;
        s.foreign.clear();
        s.ops.extend(self.ops.iter().cloned());
        Ok(s)
    }
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn default_n_ctx() -> u32 {
    256
}

fn default_n_seq_max() -> u32 {
    4
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            n_ctx: default_n_ctx(),
            n_seq_max: default_n_seq_max(),
            kv_unified: true,
            n_batch: None,
            n_ubatch: None,
            flash_attn: false,
            type_k: CacheType::F16,
            type_v: CacheType::F16,
            arch: Arch::Llama,
            swa_full: true,
            n_rs_seq: 0,
            embd_input: false,
            engine: std::collections::BTreeMap::new(),
            ops: Vec::new(),
            foreign: Vec::new(),
        }
    }
}

impl Setup {
    /// The context settings in one line, for reports: `unified, n_ctx 256, n_seq_max 2, K/V
    /// f16/f16, flash attention off` plus the batch sizes when set.
    pub fn config_label(&self) -> String {
        let mut s = format!(
            "{}, n_ctx {}, n_seq_max {}, K/V {}/{}, flash attention {}",
            if self.kv_unified {
                "unified"
            } else {
                "one stream per sequence"
            },
            self.n_ctx,
            self.n_seq_max,
            self.type_k,
            self.type_v,
            if self.flash_attn { "on" } else { "off" }
        );
        if let Some(b) = self.n_batch {
            s.push_str(&format!(", n_batch {b}"));
        }
        if let Some(u) = self.n_ubatch {
            s.push_str(&format!(", n_ubatch {u}"));
        }
        if self.arch != Arch::Llama {
            s.push_str(&format!(", {} memory ({})", self.arch.memory(), self.arch));
        }
        if !self.swa_full {
            s.push_str(", swa_full off");
        }
        if self.n_rs_seq > 0 {
            s.push_str(&format!(", n_rs_seq {}", self.n_rs_seq));
        }
        if self.embd_input {
            s.push_str(", embedding inputs");
        }
        for (k, v) in &self.engine {
            s.push_str(&format!(", engine.{k}={v}"));
        }
        for f in &self.foreign {
            s.push_str(&format!(", slot {} saved under {}", f.slot, f.config));
            if !f.ops.is_empty() {
                s.push_str(&format!(" after {} more ops", f.ops.len()));
            }
        }
        s
    }

    /// The same setup under another configuration: `kv_unified=false`, `flash_attn=true`,
    /// `n_ubatch=1`, `type_k=q8_0`, ... (comma-separated `key=value` pairs).
    pub fn with_config(&self, spec: &str) -> Result<Setup, InvalidOp> {
        self.with_config_text(spec).map_err(InvalidOp)
    }

    fn with_config_text(&self, spec: &str) -> Result<Setup, String> {
        let mut s = self.clone();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("configuration {part:?}: expected key=value"))?;
            match k.trim().strip_prefix("engine.") {
                Some(key) if !key.is_empty() => {
                    s.engine.insert(key.to_string(), v.trim().to_string());
                }
                _ => s.set_text(k.trim(), v.trim())?,
            }
        }
        Ok(s)
    }
}
