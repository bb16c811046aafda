//! **Rollback**: after a recurrent state rolls back (a partial `seq_rm(seq, p0, -1)` that
//! llama.cpp accepted, with `n_rs_seq` > 0: the speculative-decoding path), the sequence's
//! next-token logits equal, within cache-invisible's tolerance, those of a fresh context that
//! decoded only the kept tokens, however many decodes followed. llama.h's `seq_rm` returns true
//! only when the removal happened (llama.h, `llama_memory_seq_rm`: "Returns false if a partial
//! sequence cannot be removed"); a rollback llama.cpp cannot do exactly must be refused.
//!
//! It reads the same logits probe as cache-invisible ([`crate::base::probe`]), and judges the
//! probes of the sequences whose state came back from a rollback
//! ([`crate::base::tokens::TokenModel::rolled_back`]); cache-invisible judges the others, so a
//! finding has one oracle. A refused rollback (deeper than `n_rs_seq`, or a second one before a
//! decode: `pending`, llama-memory-recurrent.cpp:207-213 in 0.1.161) must change nothing: the
//! token model keeps the state, and cache-invisible and the contract judge that.
//!
//! What llama.cpp 0.1.161 does (src/llama-memory-recurrent.cpp:200-214, src/models/lfm2.cpp:207-219):
//! a rollback of `d` tokens sets `rs_idx[seq] = d` and the next decode (`s_copy`) or dump
//! (`state_write`) reads snapshot plane `d`; a decode writes the planes of its own last
//! `min(n_tokens, n_rs_seq + 1)` tokens only, so plane `d` is the wanted state only when the
//! last decode wrote it (upstream #29117 and #26695 describe the stale planes).

use super::cache_invisible::{judged, probe_violation};
use super::{Oracle, OracleId, PositiveControl, Reads, Seen, Violation};
use crate::base::cache::Observe;

/// Its id.
pub const ID: OracleId = OracleId::builtin(16, "rollback");

/// Its one kind of violation.
const KIND: &str = "logits after a rollback differ from a fresh decode of the kept tokens";

/// The oracle, as a value ([`Oracle`]).
pub static ROLLBACK: Oracle = Oracle {
    id: ID,
    summary: "after an accepted recurrent rollback, the next-token logits equal a fresh decode of the kept tokens",
    reads: Reads::Step,
    kinds: &[KIND],
    positive_controls: &[
        PositiveControl {
            fault: "rollback_reads_stale_plane",
            target: "native[rollback_reads_stale_plane] (arch=lfm2, n_rs_seq=3)",
            seed_depth: None,
            evidence: "oracles/rollback_reads_stale_plane.json",
        },
        PositiveControl {
            fault: "rollback_reads_stale_plane",
            target: "native[rollback_reads_stale_plane] (arch=lfm2_swa, n_rs_seq=3)",
            seed_depth: None,
            evidence: "oracles/rollback_reads_stale_plane_hybrid_iswa.json",
        },
    ],
    observes: Observe {
        logits: true,
        ..Observe::BASIC
    },
    costly: true,
    holds: Some(holds_on),
    check: violation_on,
    judges: Some(judges_on),
    judges_setup: judges_setup_of,
    ..Oracle::DEFAULTS
};

fn holds_on(seen: &Seen<'_>) -> bool {
    match seen {
        Seen::Step { after, .. } => judged(after, true).all(|(p, tol)| p.max_abs_diff <= tol),
        _ => true,
    }
}

fn violation_on(seen: &Seen<'_>) -> Option<Violation> {
    match seen {
        Seen::Step { after, .. } => probe_violation(after, true, ID, KIND),
        _ => None,
    }
}

fn judges_on(seen: &Seen<'_>) -> bool {
    match seen {
        Seen::Step { after, .. } => judged(after, true).next().is_some(),
        _ => false,
    }
}

fn judges_setup_of(setup: &crate::base::op::Setup) -> bool {
    // Only a memory with recurrent states keeps rollback snapshots, and only with n_rs_seq
    // > 0 (llama.h:370); its probes are cache-invisible's, with that oracle's tolerances.
    setup.n_rs_seq > 0
        && setup.arch.memory().has_states()
        && super::cache_invisible::CACHE_INVISIBLE.judges_setup(setup)
}
