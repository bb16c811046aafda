//! **Configuration differential**: one target under two configurations (`--vs-config`, e.g.
//! unified vs one stream per sequence, flash attention off vs on, `n_ubatch` 1 vs whole) must
//! answer the same: from the same cells before an op, the same op gives the same outcome and
//! the same cells after it, except where a documented difference applies ([`DOCUMENTED`]).
//!
//! Judging from equal *before* states (not from the trace's start) is what lets a documented
//! difference happen once without every later op being reported: after it, the two contexts
//! hold different cells and the oracle has nothing to compare.

use serde_json::json;

use super::differential::check_differential;
use super::{Oracle, OracleId, PositiveControl, Reads, Seen, Violation};
use crate::base::cache::{Observe, OpOutcome, StepObservation};
use crate::base::op::Op;

/// Its id.
pub const ID: OracleId = OracleId::builtin(11, "config-differential");

/// A difference between configurations that llama.h or llama.cpp's documentation allows.
#[derive(Clone, Copy, Debug)]
pub struct Documented {
    /// Short name.
    pub name: &'static str,
    /// Why it is allowed.
    pub why: &'static str,
}

/// The allowed differences, in the order they are tried.
pub static DOCUMENTED: [Documented; 3] = [
    Documented {
        name: "capacity",
        why: "a decode that fits one configuration may not fit the other (one stream per \
              sequence holds n_ctx / n_seq_max cells each; n_ubatch changes padding): llama_decode \
              returns 1, 'could not find a KV slot', and leaves the memory as it was",
    },
    Documented {
        name: "sequence ids",
        why:
            "with one stream per sequence only ids below n_seq_max exist; a unified cache accepts \
              more (LLAMA_MAX_SEQ): one side refuses (decode -1, or a refusal) what the other takes",
    },
    Documented {
        name: "cross-stream copy",
        why: "a partial seq_cp between two streams is not supported by llama.cpp (GGML_ASSERT); \
              a target that refuses it instead differs from the unified one",
    },
];

/// Which documented difference explains `a` and `b` differing after `op`, if any.
pub fn documented_difference(op: &Op, a: &OpOutcome, b: &OpOutcome) -> Option<&'static Documented> {
    use OpOutcome::{Decoded, Done, Refused};
    let pick = |name: &str| DOCUMENTED.iter().find(|d| d.name == name);
    let refused_by_one = matches!(
        (a, b),
        (Refused { .. }, Done { .. }) | (Done { .. }, Refused { .. })
    );
    match op {
        Op::Decode(_) => match (a, b) {
            (Decoded { rc: 1 }, Decoded { rc: 0 }) | (Decoded { rc: 0 }, Decoded { rc: 1 }) => {
                pick("capacity")
            }
            (Decoded { rc: -1 }, Decoded { rc: 0 }) | (Decoded { rc: 0 }, Decoded { rc: -1 }) => {
                pick("sequence ids")
            }
            _ if refused_by_one => pick("sequence ids"),
            _ => None,
        },
        Op::SeqCp { .. } if refused_by_one => pick("cross-stream copy"),
        Op::SeqCp { .. } => None,
        // Any other op that one configuration refuses names a sequence id it does not take.
        Op::SeqRm { .. }
        | Op::SeqKeep { .. }
        | Op::SeqAdd { .. }
        | Op::SeqDiv { .. }
        | Op::Clear
        | Op::StateSeqSave { .. }
        | Op::StateSeqLoad { .. }
        | Op::StateSave { .. }
        | Op::StateLoad { .. } => refused_by_one.then(|| pick("sequence ids")).flatten(),
    }
}

/// The oracle on one step of the two configurations' runs.
pub fn check_config_differential(
    op: &Op,
    a: &StepObservation,
    b: &StepObservation,
) -> Option<Violation> {
    let (ba, bb) = (a.before.as_ref()?, b.before.as_ref()?);
    if ba != bb {
        return None;
    }
    if documented_difference(op, &a.outcome, &b.outcome).is_some() {
        return None;
    }
    let v = check_differential(a, b)?;
    Some(Violation {
        oracle: ID,
        kind: v.kind,
        seq: v.seq,
        observed: v.observed,
        expected: json!({ "other configuration": v.expected }),
    })
}

/// The oracle, as a value ([`Oracle`]).
pub static CONFIG_DIFFERENTIAL: Oracle = Oracle {
    id: ID,
    summary: "one target under two configurations (--vs-config): from the same cells, the same op gives the same answers, except documented differences",
    reads: Reads::Pair,
    kinds: &[
        "op outcome differs",
        "resident positions differ",
        "accessors differ",
    ],
    positive_controls: &[
        PositiveControl {
            fault: "streams_rm_whole",
            target: "native[streams_rm_whole] vs native[streams_rm_whole] (kv_unified=false)",
            seed_depth: None,
            evidence: "oracles/config_differential_streams_rm_whole.json",
        },
        PositiveControl {
            fault: "streams_rm_whole",
            target: "native[streams_rm_whole] vs kv_unified=false (arch=lfm2_swa)",
            seed_depth: None,
            evidence: "oracles/config_differential_streams_rm_whole_hybrid_iswa.json",
        },
        PositiveControl {
            fault: "streams_rm_whole",
            target: "native[streams_rm_whole] vs kv_unified=false (arch=minimax-m3)",
            seed_depth: None,
            evidence: "oracles/config_differential_streams_rm_whole_msa.json",
        },
        PositiveControl {
            fault: "streams_rm_whole",
            target: "native[streams_rm_whole] vs kv_unified=false (arch=qwen4exp)",
            seed_depth: None,
            evidence: "oracles/config_differential_streams_rm_whole_hybrid_idx.json",
        },
        PositiveControl {
            fault: "streams_rm_whole",
            target: "native[streams_rm_whole] vs kv_unified=false (arch=dots3note)",
            seed_depth: None,
            evidence: "oracles/config_differential_streams_rm_whole_dsa_iswa.json",
        },
        PositiveControl {
            fault: "streams_rm_whole",
            target: "native[streams_rm_whole] vs kv_unified=false (arch=glm-dsa)",
            seed_depth: None,
            evidence: "oracles/config_differential_streams_rm_whole_dsa.json",
        },
        PositiveControl {
            fault: "streams_rm_whole: the llama.cpp target's test hook",
            target: "llama.cpp@0.1.161[streams_rm_whole] vs kv_unified=true (domain dsv4)",
            seed_depth: None,
            evidence: "oracles/config_differential_streams_rm_whole_dsv4.json",
        },
        PositiveControl {
            fault: "extract_drops_last",
            target: "mlx-lm@0.32.2[extract_drops_last] vs engine.batch=false",
            seed_depth: None,
            evidence: "audits/mlx_extract_drops_last_d1.json",
        },
    ],
    observes: Observe {
        before: true,
        ..Observe::BASIC
    },
    holds: Some(holds_on),
    check: violation_on,
    // Two configurations whose dumps are laid out otherwise (one stream or one per sequence)
    // made two different loads of a cut buffer: not compared.
    judges: Some(super::differential::judges_unless_damaged_apart),
    ..Oracle::DEFAULTS
};

fn holds_on(seen: &Seen<'_>) -> bool {
    match seen {
        Seen::Pair { op, a, b, .. } => check_config_differential(op, a, b).is_none(),
        _ => true,
    }
}

fn violation_on(seen: &Seen<'_>) -> Option<Violation> {
    match seen {
        Seen::Pair { op, a, b, .. } => check_config_differential(op, a, b),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::cache::SeqObservation;
    use crate::base::op::Decode;

    fn seq(cells: &[i32]) -> SeqObservation {
        SeqObservation {
            seq: 0,
            pos_min: cells.first().copied().unwrap_or(-1),
            pos_max: cells.last().copied().unwrap_or(-1),
            cells: cells.to_vec(),
            second_cells: None,
            third_cells: None,
        }
    }

    fn step(outcome: OpOutcome, before: &[i32], after: &[i32]) -> StepObservation {
        let mut s = StepObservation::basic(outcome, vec![seq(after)]);
        s.before = Some(vec![seq(before)]);
        s
    }

    #[test]
    fn forced_mismatch_from_equal_states_is_caught() {
        let op = Op::SeqRm {
            seq: 0,
            p0: 1,
            p1: 2,
        };
        let done = OpOutcome::Done {
            returned: Some(true),
        };
        let a = step(done.clone(), &[0, 1, 2], &[0, 2]);
        let b = step(done, &[0, 1, 2], &[]);
        let v = check_config_differential(&op, &a, &b).unwrap();
        assert_eq!(v.kind, "resident positions differ");
    }

    #[test]
    fn documented_differences_and_diverged_states_are_not_judged() {
        let op = Op::Decode(Decode::next(0, 1));
        let a = step(OpOutcome::Decoded { rc: 0 }, &[0], &[0, 1]);
        let b = step(OpOutcome::Decoded { rc: 1 }, &[0], &[0]);
        assert!(check_config_differential(&op, &a, &b).is_none());
        let a = step(OpOutcome::Decoded { rc: 0 }, &[0], &[0, 1]);
        let b = step(OpOutcome::Decoded { rc: 0 }, &[0, 1], &[0, 1, 2]);
        assert!(check_config_differential(&op, &a, &b).is_none());
    }

    #[test]
    fn a_cut_load_of_two_layouts_is_not_judged() {
        // The regenerated hunt's group 89 (2026-12-07): a whole state cut at byte 818 and
        // loaded, unified against one stream per sequence; each configuration failed its
        // load at another field.
        let op = Op::StateLoad {
            slot: crate::base::op::Slot::new("s").unwrap(),
            truncate: Some(818),
            flip: None,
        };
        let done = OpOutcome::Done {
            returned: Some(false),
        };
        let a = step(done.clone(), &[0, 1, 2], &[]);
        let b = step(done, &[0, 1, 2], &[0, 1, 2]);
        let pair = |damaged_apart| Seen::Pair {
            op: &op,
            a: &a,
            b: &b,
            damaged_apart,
        };
        let judges = CONFIG_DIFFERENTIAL.judges.expect("a judges function");
        assert!(!judges(&pair(true)));
        assert!(judges(&pair(false)));
        assert!(!holds_on(&pair(false)));
    }
}
