//! What a memory's size observations hold: the sizes the state calls report against the bytes
//! they write ([`StateSizes`], the `state-size` oracle) and what the memory allocated when its
//! context was made ([`Allocation`], the `allocation` oracle). Re-exported by [`super`].

use serde::{Deserialize, Serialize};

use crate::base::op::SeqId;

/// `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY` (llama.h): a sequence save of the memory's partial
/// part only (a hybrid's recurrent states, an iSWA memory's windowed cache), the flags the size
/// observation measures beside 0.
pub const STATE_SEQ_FLAGS_PARTIAL_ONLY: u32 = 1;

/// Which dump a size is of ([`CacheUnderTest::state_size`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dump {
    /// The whole context (`llama_state_get_size` / `llama_state_get_data`).
    Whole,
    /// One sequence with flags (`llama_state_seq_get_size_ext` / `llama_state_seq_get_data_ext`;
    /// flags 0: the plain calls).
    Seq {
        /// The sequence.
        seq: SeqId,
        /// The `llama_state_seq_flags`.
        flags: u32,
    },
}

/// One dump's size: what the size call reported and how many bytes the data call wrote into a
/// buffer of that size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpSize {
    /// `llama_state_*get_size*`.
    pub reported: u64,
    /// `llama_state_*get_data*`'s return value.
    pub written: u64,
}

/// One sequence's dump sizes (see [`StateSizes`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqSizes {
    /// The sequence.
    pub seq: SeqId,
    /// With flags 0.
    pub full: DumpSize,
    /// With [`STATE_SEQ_FLAGS_PARTIAL_ONLY`] (`None`: the target has no flags).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<DumpSize>,
}

/// The memory's size as the state calls give it after an op ([`Observe::sizes`]): the whole
/// dump's and each observed sequence's (the `state-size` oracle, `oracles/state_size.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateSizes {
    /// The whole context's dump.
    pub whole: DumpSize,
    /// Every observed sequence, in the observation's order.
    pub seqs: Vec<SeqSizes>,
    /// What the memory allocated when its context was made (`None`: the target cannot say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated: Option<Allocation>,
}

/// What a memory allocated when its context was made ([`CacheUnderTest::allocation`]; the
/// `allocation` oracle, `oracles/allocation.rs`; issue 24 item 3, upstream #19559): the
/// context's size and each cache or state store of the memory, in the order the memory made
/// them. llama.h has no C call that tells it (`llama_memory_breakdown_print` rounds to whole
/// MiB; `llama_get_memory_breakdown` is C++), so on llama.cpp it is read from what
/// `llama_init_from_model` logs (`targets/llama/memory_log.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// `llama_n_ctx`: the context's size after llama.cpp padded it.
    pub n_ctx: u32,
    /// `llama_n_seq_max`.
    pub n_seq_max: u32,
    /// `kv_unified` as the context was made with it (always true before 0.1.113).
    pub kv_unified: bool,
    /// Each cache and state store.
    pub parts: Vec<AllocatedPart>,
}

/// One cache or state store of an [`Allocation`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatedPart {
    /// What llama.cpp calls it (`llama_kv_cache`, `non-SWA KV cache`, `llama_memory_recurrent`).
    pub name: String,
    /// What it holds, which says how many cells the configuration gives it.
    pub holds: PartHolds,
    /// Cells per stream (a recurrent memory: its states).
    pub cells: u32,
    /// Streams (1 for a unified cache and for recurrent states).
    pub streams: u32,
}

impl AllocatedPart {
    /// A part named `name` holding `holds`, of `streams` streams of `cells` cells.
    pub fn new(name: &str, holds: PartHolds, cells: u32, streams: u32) -> Self {
        AllocatedPart {
            name: name.into(),
            holds,
            cells,
            streams,
        }
    }
}

/// What an [`AllocatedPart`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartHolds {
    /// A cell per position of every sequence, up to the context's size: a plain, non-SWA,
    /// main or indexer cache.
    Context,
    /// At most the context: a windowed cache, or a compressed one (one cell per several
    /// positions).
    AtMostContext,
    /// One recurrent state per sequence.
    States,
}
