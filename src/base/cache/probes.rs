//! What the probes after a trial's last op hold: a sequence's next-token logits against a fresh
//! decode ([`LogitsProbe`]), after a save and load ([`ReloadProbe`], by [`Reload`]), and the
//! logits themselves for a comparison across engines ([`NextLogits`]). Re-exported by
//! [`super`].

use serde::{Deserialize, Serialize};

use crate::base::op::{CacheType, MemoryType, SeqId};

/// Which save and load a [`ReloadProbe`] measured: the state saved after the trial, whole
/// (`llama_state_get_data`) or per sequence (`llama_state_seq_get_data`), loaded into the
/// target's empty twin or back into the audited context itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reload {
    /// The whole state into the emptied twin (`llama_state_set_data`).
    WholeTwin,
    /// The sequence's state alone into the emptied twin (`llama_state_seq_set_data`).
    SeqTwin,
    /// The whole state back into the audited context.
    WholeInPlace,
    /// The sequence's state back into the audited context, under its own id.
    SeqInPlace,
    /// The sequence's partial state (`LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`) loaded back under
    /// its own id after one more decode, that decode's cells removed
    /// ([`crate::oracles::partial_restore`]).
    SeqPartialInPlace,
    /// The same partial bytes loaded a second time, after the probe decode again.
    SeqPartialAgain,
}

impl Reload {
    /// Every load, in the order the probe takes them.
    pub const ALL: [Reload; 6] = [
        Reload::WholeTwin,
        Reload::SeqTwin,
        Reload::WholeInPlace,
        Reload::SeqInPlace,
        Reload::SeqPartialInPlace,
        Reload::SeqPartialAgain,
    ];

    /// Whether the state goes into the twin (the round trip) rather than back into the context.
    pub fn into_twin(self) -> bool {
        matches!(self, Reload::WholeTwin | Reload::SeqTwin)
    }

    /// Whether only the sequence's partial state was saved and loaded (`PARTIAL_ONLY`).
    pub fn partial(self) -> bool {
        matches!(self, Reload::SeqPartialInPlace | Reload::SeqPartialAgain)
    }

    /// Whether the whole context was saved and loaded (rather than one sequence).
    pub fn whole(self) -> bool {
        matches!(self, Reload::WholeTwin | Reload::WholeInPlace)
    }

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Reload::WholeTwin => "whole into the twin",
            Reload::SeqTwin => "seq into the twin",
            Reload::WholeInPlace => "whole in place",
            Reload::SeqInPlace => "seq in place",
            Reload::SeqPartialInPlace => "seq partial in place",
            Reload::SeqPartialAgain => "seq partial in place again",
        }
    }
}

/// One sequence's next-token logits after one save and load ([`Reload`]), against the logits
/// the context gave for the same probe token before the load (`running/probe.rs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReloadProbe {
    /// The sequence.
    pub seq: SeqId,
    /// Which save and load.
    pub load: Reload,
    /// The load returned non-zero (a load that failed has no logits to compare:
    /// `max_abs_diff` is 0).
    pub loaded: bool,
    /// The largest absolute difference between the two logit vectors (`f32::MAX` when the
    /// probe decode failed after the load, or the vectors differ in length or are not finite).
    pub max_abs_diff: f32,
    /// The coarser of the setup's K and V cache types (F32 for a recurrent memory).
    pub cache: CacheType,
    /// The memory type of the setup's architecture.
    pub memory: MemoryType,
    /// V rows summed in F16 (as [`LogitsProbe::v_summed_in_f16`]): no tolerance is measured.
    #[serde(default)]
    pub v_summed_in_f16: bool,
}

// As for `LogitsProbe`: the difference is never NaN.
impl Eq for ReloadProbe {}

/// One sequence's logits probe: the logits of a probe token decoded after the sequence's last
/// position, in the audited cache and in a fresh context that decoded the sequence's resident
/// tokens at their positions (`running/probe.rs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogitsProbe {
    /// The sequence.
    pub seq: SeqId,
    /// The largest absolute difference between the two logit vectors (`f32::MAX` when they
    /// differ in length or either is not finite).
    pub max_abs_diff: f32,
    /// How many resident tokens the fresh context decoded.
    pub n_tokens: u32,
    /// The coarser of the setup's K and V cache types: the oracle's tolerance depends on it.
    pub cache: CacheType,
    /// A resident token was moved by `seq_add`/`seq_div` since it was decoded: its key was
    /// rotated again in place (llama.cpp's K-shift rounds differently from a fresh rotation).
    #[serde(default)]
    pub shifted: bool,
    /// The memory type of the setup's architecture (iSWA and recurrent memories have their own
    /// tolerances).
    #[serde(default)]
    pub memory: MemoryType,
    /// The sequence's recurrent state came back from a rollback (an accepted partial `seq_rm`
    /// with `n_rs_seq` > 0, [`crate::base::tokens::TokenModel::rolled_back`]): the rollback
    /// oracle judges this probe, cache-invisible the others.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rolled_back: bool,
    /// Flash attention on over an F16 or F32 V cache (an F32 one is cast to F16 first,
    /// src/llama-graph.cpp:2727-2733 in 0.1.161): ggml-cpu's flash attention accumulates the
    /// weighted V rows in F16 (`VKQ16`, ggml-cpu/ops.cpp:8940-9035 in 0.1.161), so the order
    /// of the cells changes the sum's rounding at F16 precision; no tolerance is measured for
    /// it but MSA's (the oracles' `unmeasured_f16_sum`).
    #[serde(default)]
    pub v_summed_in_f16: bool,
}

// A probe's difference is never NaN (see `max_abs_diff`), so equality is an equivalence.
impl Eq for LogitsProbe {}

/// One sequence's next-token logits: those of the probe token decoded right after its last
/// position in the audited cache (`running/probe.rs`), the whole vocabulary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NextLogits {
    /// The sequence.
    pub seq: SeqId,
    /// One logit per token id.
    pub logits: Vec<f32>,
}

/// The largest absolute difference of two logit vectors; `f32::MAX` when their lengths differ
/// or a difference is not finite (so that a probe's figure is always a comparable number).
pub fn logits_distance(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::MAX;
    }
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| {
        let d = (x - y).abs();
        if d.is_finite() {
            m.max(d)
        } else {
            f32::MAX
        }
    })
}

// A NaN logit makes an observation unequal to itself, which at worst makes a comparison of
// two observations miss (no memo keys on them).
impl Eq for NextLogits {}
