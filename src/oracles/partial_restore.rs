//! **partial-restore**: a sequence's partial state (`LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`)
//! loaded back after more decodes gives back what a decode saw when it was saved, and so does
//! loading the same bytes a second time (issue 24; upstream #18552, "llama_state_seq_set_data_ext
//! - indeterminate results over multiple iterations", reported on an iSWA and a hybrid model).
//!
//! llama.h (include/llama.h:919-950 in 0.1.161, the same words in 0.1.156): `PARTIAL_ONLY`
//! "work[s] only with partial states, such as SWA KV cache or recurrent cache (e.g. Mamba)", and
//! `llama_state_seq_set_data` "Copy[s] the sequence data (originally copied with
//! `llama_state_seq_get_data`) into the specified sequence". Read together: the partial bytes
//! carry the part of the memory that cannot be rolled back by `seq_rm` (the windowed cache, the
//! recurrent states), and loading them puts that part back as it was when they were saved,
//! leaving the rest (the full-attention cache) to the caller's `seq_rm`. That is how
//! llama-server's context checkpoints use it (#15293, #18552's steps).
//!
//! The runner measures it after a trial's last op ([`crate::running::probe::probe_reloads`]
//! with [`Observe::partial`]): from the whole state the trial left, each sequence with cells
//! saves its partial state; the probe token is decoded after it (the reference logits); then
//! twice, the partial bytes are loaded back under the sequence's id, the probe's cell removed
//! with `seq_rm` and the probe token decoded again: both logits must equal the reference,
//! within `round-trip-logits`' tolerance ([`super::round_trip_logits::tolerance`]: the loaded
//! cells may sit in other slots). The plain sequence load in place is `save-load-invisible`'s,
//! measured by the same probe against the same kind of reference.
//!
//! Which memories it judges ([`applies`]): those whose partial part is not the whole memory or
//! is a recurrent state (iSWA, recurrent, hybrid, hybrid-iSWA). A plain KV cache ignores the
//! flag (`GGML_UNUSED(flags)`), so its partial load is `save-load-invisible`'s plain one; the
//! classes with an indexer or a compressed cache are left until their tolerance and gates are
//! measured. A partial load that fails is not judged (as a plain one in place: the windowed
//! cells must fit one contiguous slot, which llama.h does not promise).

use serde_json::json;

use super::round_trip_logits::{judged, judges_setup_reloads};
use super::{Oracle, OracleId, PositiveControl, Reads, Seen, Violation};
use crate::base::cache::{Observe, Reload, StepObservation};
use crate::base::op::{MemoryType, Setup};

/// Its id.
pub const ID: OracleId = OracleId::builtin(19, "partial-restore");

/// The kind: the first partial load after one more decode changed what the decode sees.
pub const CHANGES: &str = "partial load changes logits";
/// The kind: loading the same partial bytes a second time gave other logits.
pub const AGAIN_CHANGES: &str = "second partial load changes logits";

/// What llama.h says (module docs).
pub const LLAMA_H: [&str; 2] = [
    "LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: \"work only with partial states, such as SWA KV cache or recurrent cache (e.g. Mamba)\"",
    "llama_state_seq_set_data: \"Copy the sequence data (originally copied with `llama_state_seq_get_data`) into the specified sequence\"",
];

/// Whether a memory type's partial load is judged (module docs).
pub fn applies(memory: MemoryType) -> bool {
    matches!(
        memory,
        MemoryType::Iswa | MemoryType::Recurrent | MemoryType::Hybrid | MemoryType::HybridIswa
    )
}

fn partial(load: Reload) -> bool {
    load.partial()
}

/// The first partial load of `after` whose probe's logits differ from the reference by more
/// than the tolerance, if any.
pub fn check_partial(after: &StepObservation) -> Option<Violation> {
    let (p, tol) = judged(after, partial)
        .filter(|(p, _)| applies(p.memory))
        .find(|(p, tol)| p.max_abs_diff > *tol)?;
    Some(Violation {
        oracle: ID,
        kind: if p.load == Reload::SeqPartialAgain {
            AGAIN_CHANGES
        } else {
            CHANGES
        }
        .into(),
        seq: Some(p.seq),
        observed: json!({ "max_abs_diff": p.max_abs_diff, "load": p.load.name() }),
        expected: json!({
            "max_abs_diff_at_most": tol,
            "memory": p.memory,
            "cache": p.cache,
        }),
    })
}

/// The oracle, as a value ([`Oracle`]).
pub static PARTIAL_RESTORE: Oracle = Oracle {
    id: ID,
    summary: "a PARTIAL_ONLY sequence state loaded back after more decodes, once and twice, gives the logits a decode saw when it was saved",
    reads: Reads::Step,
    kinds: &[CHANGES, AGAIN_CHANGES],
    positive_controls: &[
        PositiveControl {
            fault: "partial_load_keeps_states",
            target: "native[partial_load_keeps_states] (arch=jamba)",
            seed_depth: None,
            evidence: "oracles/partial_restore_keeps_states.json",
        },
        PositiveControl {
            fault: "partial_load_keeps_states",
            target: "native[partial_load_keeps_states] (arch=lfm2_swa)",
            seed_depth: None,
            evidence: "oracles/partial_restore_keeps_states_hybrid_iswa.json",
        },
    ],
    observes: Observe {
        reload: true,
        partial: true,
        ..Observe::BASIC
    },
    costly: true,
    check: violation_on,
    judges: Some(judges_on),
    judges_setup: judges_setup_of,
    ..Oracle::DEFAULTS
};

fn violation_on(seen: &Seen<'_>) -> Option<Violation> {
    match seen {
        Seen::Step { after, .. } => check_partial(after),
        _ => None,
    }
}

fn judges_on(seen: &Seen<'_>) -> bool {
    match seen {
        Seen::Step { after, .. } => judged(after, partial).any(|(p, _)| applies(p.memory)),
        _ => false,
    }
}

fn judges_setup_of(setup: &Setup) -> bool {
    applies(setup.arch.memory()) && judges_setup_reloads(setup)
}

#[cfg(test)]
mod tests {
    use super::super::round_trip_logits::tests::{seen, step};
    use super::*;

    fn with_memory(mut s: StepObservation, memory: MemoryType) -> StepObservation {
        for p in s.reload_probe.iter_mut().flatten() {
            p.memory = memory;
        }
        s
    }

    #[test]
    fn partial_loads_are_judged_on_the_memories_with_a_partial_part() {
        let s = with_memory(
            step(&[
                (Reload::SeqInPlace, true, 3.0),
                (Reload::SeqPartialInPlace, true, 0.0),
                (Reload::SeqPartialAgain, true, 0.0),
            ]),
            MemoryType::Hybrid,
        );
        assert!(PARTIAL_RESTORE.judges(&seen(&s)));
        assert!(PARTIAL_RESTORE.holds(&seen(&s)));
        let s = with_memory(
            step(&[
                (Reload::SeqPartialInPlace, true, 0.0),
                (Reload::SeqPartialAgain, true, 0.5),
            ]),
            MemoryType::Iswa,
        );
        assert_eq!(
            PARTIAL_RESTORE.check(&seen(&s)).unwrap().kind,
            AGAIN_CHANGES
        );
        // A plain KV cache ignores the flag: not judged here.
        let kv = step(&[(Reload::SeqPartialInPlace, true, 0.5)]);
        assert!(!PARTIAL_RESTORE.judges(&seen(&kv)));
        assert!(PARTIAL_RESTORE.holds(&seen(&kv)));
    }

    #[test]
    fn a_failed_partial_load_is_not_judged() {
        let s = with_memory(
            step(&[(Reload::SeqPartialInPlace, false, 0.0)]),
            MemoryType::Hybrid,
        );
        assert!(!PARTIAL_RESTORE.judges(&seen(&s)));
    }
}
