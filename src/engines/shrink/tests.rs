//! Tests of the shrinker (`super`): each pass and the fixed point, with positive controls.

use super::*;
use crate::base::op::{Decode, Setup};
use crate::running::judge::native_judge as judge;

fn fuzz_setup() -> Setup {
    Setup {
        n_ctx: 256,
        n_seq_max: 4,
        ops: vec![Op::Decode(Decode::next(0, 7))],
        ..Setup::default()
    }
}

/// The seed's double copy and keep, buried in a longer trace with noise around it.
fn noisy_refcount_trace() -> Trace {
    let ops = vec![
        Op::Decode(Decode::next(2, 3)),
        Op::SeqAdd {
            seq: 2,
            p0: -1,
            p1: -1,
            delta: 5,
        },
        Op::SeqCp {
            src: 0,
            dst: 3,
            p0: -1,
            p1: -1,
        },
        Op::SeqCp {
            src: 0,
            dst: 1,
            p0: 1,
            p1: -1,
        },
        Op::Decode(Decode {
            seqs: vec![0, 3],
            n: 2,
            pos: None,
            tokens: None,
        }),
        Op::SeqDiv {
            seq: 2,
            p0: 0,
            p1: 9,
            d: 3,
        },
        Op::SeqCp {
            src: 0,
            dst: 1,
            p0: 0,
            p1: 5,
        },
        Op::SeqRm {
            seq: 3,
            p0: 4,
            p1: -1,
        },
        Op::Decode(Decode::next(2, 1)),
        Op::SeqKeep { seq: 0 },
        Op::Decode(Decode::next(1, 2)),
        Op::Clear,
    ];
    Trace {
        setup: fuzz_setup(),
        ops,
    }
}

#[test]
fn a_known_trace_shrinks_to_the_three_op_core() {
    let mut j = judge(&["refcount"]);
    let trace = noisy_refcount_trace();
    let first = j.run(&trace).unwrap();
    let v = first
        .first(OracleId::I1)
        .expect("the noisy trace breaks I1");
    let mode = FailureMode::of(&v.violation);
    let s = shrink(&trace, &mode, &mut j, &ShrinkConfig::default())
        .unwrap()
        .expect("it fails that way");
    let names: Vec<&str> = s.trace.ops.iter().map(Op::name).collect();
    eprintln!(
        "{} in {} executions",
        serde_json::to_string(&s.trace).unwrap(),
        s.executions
    );
    assert_eq!(names, ["seq_cp", "seq_cp", "seq_keep"], "{}", s.trace);
    assert!(s.minimal);
    assert_eq!(s.failure.step, 3);
    assert!(s.executions > 0);
    // Minimal: no single op can be dropped, no argument simplified.
    for i in 0..s.trace.ops.len() {
        let mut ops = s.trace.ops.clone();
        ops.remove(i);
        let t = Trace {
            ops,
            ..s.trace.clone()
        };
        assert!(
            mode.find(&j.run(&t).unwrap()).is_none(),
            "op {i} is droppable"
        );
        for c in simplifications(&s.trace.ops[i], 4) {
            let mut ops = s.trace.ops.clone();
            ops[i] = c.clone();
            let t = Trace {
                ops,
                ..s.trace.clone()
            };
            assert!(
                mode.find(&j.run(&t).unwrap()).is_none(),
                "{c} simplifies op {i}"
            );
        }
    }
    for hi in 1..4 {
        for lo in 0..hi {
            let ops: Vec<Op> = s.trace.ops.iter().map(|op| swap_seqs(op, lo, hi)).collect();
            if simplify::trace_rank(&Trace {
                ops: ops.clone(),
                ..s.trace.clone()
            }) < trace_rank(&s.trace)
            {
                let t = Trace {
                    ops,
                    ..s.trace.clone()
                };
                assert!(mode.find(&j.run(&t).unwrap()).is_none(), "swap {lo} {hi}");
            }
        }
    }
}

#[test]
fn a_trace_that_does_not_fail_that_way_is_not_shrunk() {
    let mut j = judge(&[]);
    let trace = noisy_refcount_trace();
    let mode = FailureMode {
        oracle: OracleId::I1,
        kind: "pos_min and pos_max stale on an empty sequence".into(),
    };
    assert!(shrink(&trace, &mode, &mut j, &ShrinkConfig::default())
        .unwrap()
        .is_none());
}

/// `trace` shrunk while it breaks I1 on the native model with the refcount fault.
fn shrunk_on_refcount(trace: &Trace) -> Shrunk {
    let mut j = judge(&["refcount"]);
    let v = j.run(trace).unwrap();
    let v = v.first(OracleId::I1).expect("the trace breaks I1");
    let mode = FailureMode::of(&v.violation);
    shrink(trace, &mode, &mut j, &ShrinkConfig::default())
        .unwrap()
        .expect("it fails that way")
}

/// The seed's double copy and keep, on sequences 2 and 3, at positions 100 to 103 of a
/// 250-token decode, after a setup decode into a sequence the failure does not need.
fn far_from_the_core() -> Trace {
    let cp = Op::SeqCp {
        src: 2,
        dst: 3,
        p0: 100,
        p1: 104,
    };
    Trace {
        setup: Setup {
            ops: vec![
                Op::Decode(Decode::next(1, 5)),
                Op::Decode(Decode::next(2, 250)),
            ],
            ..fuzz_setup()
        },
        ops: vec![cp.clone(), cp, Op::SeqKeep { seq: 2 }],
    }
}

#[test]
fn setup_ops_decodes_positions_and_ids_shrink_to_the_core() {
    let s = shrunk_on_refcount(&far_from_the_core());
    let core = Trace {
        setup: Setup {
            ops: vec![Op::Decode(Decode::next(0, 1))],
            ..fuzz_setup()
        },
        ops: vec![
            Op::SeqCp {
                src: 0,
                dst: 1,
                p0: 0,
                p1: 1,
            },
            Op::SeqCp {
                src: 0,
                dst: 1,
                p0: 0,
                p1: 1,
            },
            Op::SeqKeep { seq: 0 },
        ],
    };
    assert_eq!(
        s.trace,
        core,
        "{}",
        serde_json::to_string(&s.trace).unwrap()
    );
    assert!(s.minimal);
}

#[test]
fn a_minimal_trace_comes_back_unchanged() {
    let first = shrunk_on_refcount(&noisy_refcount_trace());
    let again = shrunk_on_refcount(&first.trace);
    assert_eq!(again.trace, first.trace);
    assert!(again.minimal);
    // It was tried: every op dropped, every argument simplified, and none kept.
    assert!(again.executions > first.trace.ops.len() as u64);
}

#[test]
fn each_excess_over_the_core_is_shrunk_away() {
    let core = shrunk_on_refcount(&noisy_refcount_trace()).trace;
    let renamed = map_trace_seqs(&core, |s| 3 - s);
    let mut longer = core.clone();
    longer.setup.ops[0] = Op::Decode(Decode::next(0, 200));
    // Positions 40 and up, which the longer decode fills.
    let shifted = map_ops(&longer, |op| shift_positions(op, -40)).unwrap();
    let mut extra_setup = core.clone();
    extra_setup.setup.ops.push(Op::Decode(Decode::next(2, 3)));
    for (what, t) in [
        ("renamed", renamed),
        ("shifted", shifted),
        ("a longer setup decode", longer),
        ("a setup op more", extra_setup),
    ] {
        assert_ne!(t, core, "{what}");
        assert!(trace_rank(&t) > trace_rank(&core), "{what}");
        let s = shrunk_on_refcount(&t);
        assert_eq!(
            s.trace,
            core,
            "{what}: {}",
            serde_json::to_string(&s.trace).unwrap()
        );
        let settings = |t: &Trace| Setup {
            ops: Vec::new(),
            ..t.setup.clone()
        };
        assert_eq!(
            settings(&s.trace),
            settings(&t),
            "{what}: settings are kept"
        );
    }
}

#[test]
fn the_budget_is_kept_and_reported() {
    let mut j = judge(&["refcount"]);
    let trace = noisy_refcount_trace();
    let v = j.run(&trace).unwrap();
    let mode = FailureMode::of(&v.first(OracleId::I1).unwrap().violation);
    let cfg = ShrinkConfig {
        max_executions: 5,
        ..ShrinkConfig::default()
    };
    let s = shrink(&trace, &mode, &mut j, &cfg).unwrap().unwrap();
    assert!(!s.minimal);
    assert!(s.executions <= 6, "{}", s.executions);
}

#[test]
fn simplifications_are_strictly_smaller() {
    let ops = [
        Op::SeqRm {
            seq: -1,
            p0: -1,
            p1: -1,
        },
        Op::SeqAdd {
            seq: 3,
            p0: 5,
            p1: 9,
            delta: -7,
        },
        Op::SeqDiv {
            seq: 1,
            p0: 2,
            p1: -1,
            d: 4,
        },
        Op::Decode(Decode {
            seqs: vec![3, 1],
            n: 4,
            pos: Some(9),
            tokens: Some(vec![1, 2, 3, 4]),
        }),
    ];
    for op in ops {
        let cs = simplifications(&op, 4);
        assert!(!cs.is_empty(), "{op}");
        for c in &cs {
            assert!(op_size(c) < op_size(&op), "{c} from {op}");
            assert_eq!(c.name(), op.name());
        }
    }
    assert!(simplifications(&Op::SeqKeep { seq: 0 }, 4).is_empty());
    assert!(simplifications(&Op::Clear, 4).is_empty());
}
