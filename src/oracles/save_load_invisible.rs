//! **save-load-invisible**: a save and load in place changes nothing a later decode sees
//! (issue 23): `[trace, save, load, probe]` against `[trace, probe]` on the same context, the
//! whole state (`llama_state_get_data` then `llama_state_set_data` into the context itself) and
//! each sequence's (`llama_state_seq_get_data` then `llama_state_seq_set_data` under its own
//! id). The runner measures it after a trial's last op ([`crate::running::probe::probe_reloads`]).
//! Where `round-trip-logits` loads into an empty twin, this loads into the context that wrote
//! the state, with whatever it keeps beside the cells (its slot search's head, rows of freed
//! cells, a pending K-shift, a recurrent memory's tails).
//!
//! A whole load of the context's own bytes that fails is a finding: llama.h offers no other way
//! back. A sequence's load that fails is not judged: the sequence's cells are removed first
//! (src/llama-kv-cache.cpp, `state_read_meta`) and its cells must then fit in one contiguous
//! slot, which a fragmented cache or cells shared with another sequence may not have, and
//! llama.h does not promise it. The tolerance is `round-trip-logits`'
//! ([`super::round_trip_logits::tolerance`]).

use serde_json::json;

use super::round_trip_logits::{check_reloads, judged, OBSERVES};
use super::{Oracle, OracleId, PositiveControl, Reads, Seen, Violation};
use crate::base::cache::{Reload, StepObservation};
use crate::base::op::Setup;

/// Its id.
pub const ID: OracleId = OracleId::builtin(15, "save-load-invisible");

/// The plain loads back into the context (the partial ones are `partial-restore`'s).
fn in_place(load: Reload) -> bool {
    !load.into_twin() && !load.partial()
}

/// The first way the in-place loads of `after` changed what a decode sees, if any.
pub fn check_in_place(after: &StepObservation) -> Option<Violation> {
    let failed = after
        .reload_probe
        .iter()
        .flatten()
        .any(|p| p.load == Reload::WholeInPlace && !p.loaded);
    if failed {
        return Some(Violation {
            oracle: ID,
            kind: "whole load failed".into(),
            seq: None,
            observed: json!("llama_state_set_data returned 0"),
            expected: json!("the context loads the bytes its llama_state_get_data wrote"),
        });
    }
    check_reloads(ID, after, in_place)
}

/// The oracle, as a value ([`Oracle`]).
pub static SAVE_LOAD_INVISIBLE: Oracle = Oracle {
    id: ID,
    summary: "a save and load in place (whole, per sequence) leaves each sequence's next-token logits as they were",
    reads: Reads::Step,
    kinds: &[
        "whole load failed",
        "whole load changes logits",
        "seq load changes logits",
    ],
    positive_controls: &[
        PositiveControl {
            fault: "save_drops_state",
            target: "native[save_drops_state] (arch=jamba)",
            seed_depth: None,
            evidence: "oracles/save_load_invisible_save_drops_state.json",
        },
        PositiveControl {
            fault: "save_drops_state",
            target: "native[save_drops_state] (arch=lfm2_swa)",
            seed_depth: None,
            evidence: "oracles/save_load_invisible_save_drops_state_hybrid_iswa.json",
        },
        PositiveControl {
            fault: "save_drops_state",
            target: "native[save_drops_state] (arch=qwen4exp)",
            seed_depth: None,
            evidence: "oracles/save_load_invisible_save_drops_state_hybrid_idx.json",
        },
        PositiveControl {
            fault: "0.1.156's whole load loses sequence 0 (its own bug, fixed by 0.1.157)",
            target: "llama.cpp@0.1.156 (arch=deepseek4)",
            seed_depth: None,
            evidence: "oracles/round_trip_dsv4_whole_load_loses_seq_0.json",
        },
        PositiveControl {
            fault: "save_drops_rows: the llama.cpp target's test hook (per-sequence dumps with their V rows zeroed)",
            target: "llama.cpp@0.1.161[save_drops_rows] (domain msa)",
            seed_depth: None,
            evidence: "oracles/cache_invisible_save_drops_rows_msa.json",
        },
    ],
    observes: OBSERVES,
    costly: true,
    holds: Some(holds_on),
    check: violation_on,
    judges: Some(judges_on),
    judges_setup: judges_setup_of,
    ..Oracle::DEFAULTS
};

fn holds_on(seen: &Seen<'_>) -> bool {
    match seen {
        Seen::Step { after, .. } => check_in_place(after).is_none(),
        _ => true,
    }
}

fn violation_on(seen: &Seen<'_>) -> Option<Violation> {
    match seen {
        Seen::Step { after, .. } => check_in_place(after),
        _ => None,
    }
}

fn judges_on(seen: &Seen<'_>) -> bool {
    match seen {
        Seen::Step { after, .. } => {
            judged(after, in_place).next().is_some()
                || after
                    .reload_probe
                    .iter()
                    .flatten()
                    .any(|p| p.load == Reload::WholeInPlace)
        }
        _ => false,
    }
}

fn judges_setup_of(setup: &Setup) -> bool {
    super::round_trip_logits::judges_setup_reloads(setup)
}

#[cfg(test)]
mod tests {
    use super::super::round_trip_logits::tests::{seen, step};
    use super::*;

    #[test]
    fn in_place_loads_are_judged_and_twin_loads_are_not() {
        let s = step(&[
            (Reload::WholeInPlace, true, 0.0),
            (Reload::SeqTwin, true, 3.0),
        ]);
        assert!(SAVE_LOAD_INVISIBLE.judges(&seen(&s)));
        assert!(SAVE_LOAD_INVISIBLE.holds(&seen(&s)));
        let s = step(&[
            (Reload::WholeInPlace, true, 0.0),
            (Reload::SeqInPlace, true, 3.0),
        ]);
        let v = SAVE_LOAD_INVISIBLE.check(&seen(&s)).unwrap();
        assert_eq!(v.kind, "seq load changes logits");
    }

    #[test]
    fn a_failed_whole_load_is_caught_and_a_failed_seq_load_not_judged() {
        let s = step(&[(Reload::WholeInPlace, false, 0.0)]);
        assert!(SAVE_LOAD_INVISIBLE.judges(&seen(&s)));
        assert_eq!(
            SAVE_LOAD_INVISIBLE.check(&seen(&s)).unwrap().kind,
            "whole load failed"
        );
        let s = step(&[(Reload::SeqInPlace, false, 0.0)]);
        assert!(!SAVE_LOAD_INVISIBLE.judges(&seen(&s)));
        assert!(SAVE_LOAD_INVISIBLE.holds(&seen(&s)));
    }
}
