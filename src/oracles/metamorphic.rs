//! The theorems T1-T3 of shared/seeds/000 as registry entries. Their checks live in
//! [`super::theorems`]: unlike the observation oracles they run metamorphic partner traces on a
//! target with K/V rows and logits ([`Reads::Runs`]), so engines hand them whole traces through
//! `engines::theorem_check` instead of observations; [`Oracle::holds`] and [`Oracle::check`] see
//! nothing here.

use super::{Oracle, OracleId, PositiveControl, Reads};

/// T1, placement and read-back.
pub static T1: Oracle = Oracle {
    id: OracleId::builtin(4, "T1"),
    reads: Reads::Runs,
    summary: "K/V rows land in and read back from the right (layer, position, KV head) slot; a state round trip is exact",
    kinds: &["placement*", "round trip*"],
    positive_controls: &[
        PositiveControl {
            fault: "kv_head_swap",
            target: "native+tensors[kv_head_swap]",
            seed_depth: None,
            evidence: "theorems/t1_fault_kv_head_swap.json",
        },
        PositiveControl {
            fault: "kv_layer_swap",
            target: "native+tensors[kv_layer_swap]",
            seed_depth: None,
            evidence: "theorems/t1_fault_kv_layer_swap.json",
        },
    ],
    ..Oracle::DEFAULTS
};

/// T2, evicting a span == never having seen it.
pub static T2: Oracle = Oracle {
    id: OracleId::builtin(5, "T2"),
    reads: Reads::Runs,
    summary:
        "evicting a span and shifting the survivors equals a fresh cache that never saw the span",
    kinds: &["reposition*", "never saw*"],
    positive_controls: &[PositiveControl {
        fault: "seq_add_delta_rotation",
        target: "native+tensors[seq_add_delta_rotation]",
        seed_depth: None,
        evidence: "theorems/t2_fault_delta_rotation.json",
    }],
    ..Oracle::DEFAULTS
};

/// T3, the sliding window keyed off absolute positions; prefix reuse == recompute.
pub static T3: Oracle = Oracle {
    id: OracleId::builtin(6, "T3"),
    reads: Reads::Runs,
    summary: "the sliding-window mask is keyed off absolute positions; a copied prefix plus a suffix prefill equals full recompute",
    kinds: &["window bound*", "prefix*", "out of window*"],
    positive_controls: &[PositiveControl {
        fault: "window_index_keyed",
        target: "native+tensors[window_index_keyed]",
        seed_depth: None,
        evidence: "theorems/t3_fault_window_index_keyed.json",
    }],
    ..Oracle::DEFAULTS
};
