//! Tests of the native adapters on the issue-10 surface: the state ops and their outcomes, the
//! whole-context dump as the shared parser reads it, and the observation's round trip into the
//! twin through the runner, on both native targets and in both stream modes.

use super::*;
use crate::base::cache::Observe;
use crate::base::op::{Decode, Trace};
use crate::base::state::parse_whole_state;
use crate::base::state::WholeCell;
use crate::running::runner::LocalRunner;
use crate::targets::native_tensor::NativeTensorTarget;

fn slot(name: &str) -> Slot {
    Slot::new(name).unwrap()
}

fn decode(seq: SeqId, n: u32) -> Op {
    Op::Decode(Decode::next(seq, n))
}

fn save(seq: SeqId, name: &str, flags: u32) -> Op {
    Op::StateSeqSave {
        seq,
        slot: slot(name),
        flags,
    }
}

fn load(seq: SeqId, name: &str, flags: u32) -> Op {
    Op::StateSeqLoad {
        seq,
        slot: slot(name),
        flags,
        truncate: None,
        flip: None,
    }
}

const TRUE: OpOutcome = OpOutcome::Done {
    returned: Some(true),
};
const FALSE: OpOutcome = OpOutcome::Done {
    returned: Some(false),
};

fn setup(unified: bool) -> Setup {
    Setup {
        n_seq_max: 3,
        kv_unified: unified,
        ..Setup::default()
    }
}

/// A trace over every state op, a reload into another sequence, and a damaged load.
fn state_trace(unified: bool) -> Trace {
    Trace {
        setup: setup(unified),
        ops: vec![
            decode(0, 4),
            decode(1, 2),
            save(0, "a", 0),
            Op::StateSave { slot: slot("w") },
            Op::SeqRm {
                seq: 0,
                p0: 1,
                p1: 3,
            },
            load(2, "a", 0),
            Op::StateSeqLoad {
                seq: 1,
                slot: slot("a"),
                flags: 0,
                truncate: Some(30),
                flip: None,
            },
            Op::StateLoad {
                slot: slot("w"),
                truncate: None,
                flip: None,
            },
            Op::SeqKeep { seq: 0 },
        ],
    }
}

fn targets() -> Vec<Box<dyn CacheUnderTest + Send>> {
    let model = NativeTensorTarget::default_model(None).unwrap();
    vec![
        Box::new(NativeTarget::new(Faults::default())),
        Box::new(NativeTensorTarget::new(model, Faults::default())),
    ]
}

#[test]
fn state_ops_give_llama_h_outcomes() {
    for mut t in targets() {
        for unified in [true, false] {
            let trace = state_trace(unified);
            t.reset(&trace.setup).unwrap();
            let (last, ops) = trace.ops.split_last().unwrap();
            let outcomes: Vec<OpOutcome> = ops.iter().map(|op| t.apply(op).unwrap()).collect();
            let name = t.info().name;
            assert_eq!(outcomes[2], TRUE, "{name}");
            assert_eq!(outcomes[3], TRUE, "{name}");
            assert_eq!(outcomes[5], TRUE, "{name}: a reload into another sequence");
            assert_eq!(outcomes[6], FALSE, "{name}: a truncated load returns 0");
            assert_eq!(outcomes[7], TRUE, "{name}");
            // The truncated load emptied seq 1; the whole load brought it back.
            assert_eq!(
                SeqObservation::of(t.as_mut(), 1).unwrap().pos_max,
                1,
                "{name}"
            );
            assert_eq!(
                SeqObservation::of(t.as_mut(), 2).unwrap().pos_max,
                -1,
                "{name}: replaced by the whole load"
            );
            // seq_keep(0) works on seq 0's stream: unified it removes seq 1, per stream not.
            assert_eq!(t.apply(last).unwrap(), OpOutcome::Done { returned: None });
            let kept = if unified { -1 } else { 1 };
            assert_eq!(
                SeqObservation::of(t.as_mut(), 1).unwrap().pos_max,
                kept,
                "{name}"
            );
            // A slot never written in this trial is refused; reset forgets the slots.
            t.reset(&trace.setup).unwrap();
            assert!(matches!(
                t.apply(&load(0, "a", 0)).unwrap(),
                OpOutcome::Refused { .. }
            ));
        }
    }
}

#[test]
fn whole_dump_parses_with_every_stream() {
    let faults = Faults {
        orphan_cell: true,
        ..Faults::default()
    };
    for unified in [true, false] {
        let mut t = NativeTarget::new(faults);
        t.reset(&setup(unified)).unwrap();
        for op in [
            decode(0, 3),
            decode(2, 1),
            Op::SeqRm {
                seq: 0,
                p0: 1,
                p1: 2,
            },
        ] {
            t.apply(&op).unwrap();
        }
        let whole = t.state_get().unwrap().unwrap();
        let cells = parse_whole_state(&whole, StateFormat::default()).unwrap();
        let cell = |pos, seqs: &[SeqId]| WholeCell {
            pos,
            seqs: seqs.to_vec(),
        };
        // Unified, seq 2's cell is the fourth of the one stream; otherwise the only cell of
        // stream 2, dumped after stream 0's (stream 1 writes a count of 0): the same list.
        let expect = vec![cell(0, &[0]), cell(1, &[]), cell(2, &[0]), cell(0, &[2])];
        assert_eq!(cells, expect, "unified {unified}");
    }
}

#[test]
fn streams_follow_the_padded_setup() {
    let c = |s: &str| {
        cache_config(
            "native",
            &Setup::default().with_config(s).unwrap(),
            Faults::default(),
        )
    };
    let u = c("n_ctx=100,n_seq_max=3").unwrap();
    assert_eq!((u.n_ctx, u.n_stream()), (256, 1));
    let m = c("n_ctx=1000,n_seq_max=3,kv_unified=false").unwrap();
    assert_eq!(
        (m.n_ctx, m.n_stream()),
        (512, 3),
        "pad(pad(1000) / 3) = pad(341)"
    );
    assert!(matches!(
        c("n_ctx=4294967295"),
        Err(HarnessError::Unsupported { .. })
    ));
    assert!(matches!(
        c("n_seq_max=65"),
        Err(HarnessError::Unsupported { .. })
    ));
}

#[test]
fn on_device_loads_mirror_the_context_storage() {
    let mut t = NativeTarget::new(Faults::default());
    t.reset(&setup(true)).unwrap();
    t.apply(&decode(0, 3)).unwrap();
    t.apply(&save(0, "p", 0)).unwrap();
    // Nothing saved ON_DEVICE for seq 0 yet: llama.cpp's GGML_ASSERT.
    assert!(matches!(
        t.apply(&load(1, "p", 2)).unwrap(),
        OpOutcome::Refused { reason } if reason.contains("GGML_ASSERT")
    ));
    assert_eq!(t.apply(&save(0, "d", 2)).unwrap(), TRUE);
    // A device save's bytes have no rows: a plain load fails after the cells.
    t.apply(&decode(1, 2)).unwrap();
    assert_eq!(t.apply(&load(1, "d", 0)).unwrap(), FALSE);
    assert_eq!(SeqObservation::of(&mut t, 1).unwrap().pos_max, -1);
    // ON_DEVICE with the device copy: restores.
    assert_eq!(t.apply(&load(1, "d", 2)).unwrap(), TRUE);
    assert_eq!(SeqObservation::of(&mut t, 1).unwrap().pos_max, 2);
    // ON_DEVICE of a plain save's bytes: its rows are misread, the load fails.
    assert_eq!(t.apply(&load(2, "p", 2)).unwrap(), FALSE);
    // A device copy of another size: memory buffer mismatch, an abort.
    t.apply(&decode(0, 1)).unwrap();
    t.apply(&save(0, "p", 0)).unwrap();
    t.apply(&save(0, "d2", 2)).unwrap();
    assert!(matches!(
        t.apply(&load(1, "d", 2)).unwrap(),
        OpOutcome::Refused { .. }
    ));
    // Flag bit 1 (partial only) is ignored by a plain KV cache.
    assert_eq!(t.apply(&load(2, "p", 1)).unwrap(), TRUE);
    // The tensor target does not model device rows.
    let model = NativeTensorTarget::default_model(None).unwrap();
    let mut nt = NativeTensorTarget::new(model, Faults::default());
    nt.reset(&setup(true)).unwrap();
    assert!(matches!(
        nt.apply(&save(0, "d", 2)).unwrap(),
        OpOutcome::Unsupported { .. }
    ));
}

#[test]
fn the_runner_observes_whole_dumps_and_round_trips_on_both_targets() {
    for t in targets() {
        let name = t.info().name;
        let mut runner = LocalRunner::new(t).with_observe(Observe::ALL);
        for unified in [true, false] {
            let trace = state_trace(unified);
            let run = runner.run(&trace).unwrap();
            assert_eq!(run.steps.len(), trace.ops.len(), "{name}");
            for (i, step) in run.steps.iter().enumerate() {
                let whole = step.whole.as_ref().expect("a whole dump");
                let rt = step.round_trip.as_ref().expect("a round trip");
                assert!(rt.whole_loaded && rt.whole_same_bytes, "{name} step {i}");
                for (seq, twin) in step.seqs.iter().zip(&rt.whole_twin) {
                    assert_eq!(seq, twin, "{name} step {i}");
                }
                for (seq, rt) in step.seqs.iter().zip(&rt.seqs) {
                    assert!(rt.loaded || seq.cells.is_empty(), "{name} step {i}");
                    assert!(rt.same_bytes, "{name} step {i}");
                    assert_eq!(rt.twin.cells, seq.cells, "{name} step {i}");
                }
                // Conservation: the whole dump holds each sequence's cells.
                for seq in &step.seqs {
                    let mut from_whole: Vec<Pos> = whole
                        .iter()
                        .filter(|c| c.seqs.contains(&seq.seq))
                        .map(|c| c.pos)
                        .collect();
                    from_whole.sort_unstable();
                    assert_eq!(from_whole, seq.cells, "{name} step {i}");
                }
            }
        }
    }
}

#[test]
fn restore_drops_last_cell_shows_in_the_round_trip_only() {
    let faults = Faults {
        restore_drops_last_cell: true,
        ..Faults::default()
    };
    let mut runner =
        LocalRunner::new(Box::new(NativeTarget::new(faults))).with_observe(Observe::ALL);
    let trace = Trace {
        setup: setup(true),
        ops: vec![decode(0, 3)],
    };
    let run = runner.run(&trace).unwrap();
    let step = &run.steps[0];
    assert_eq!(step.seqs[0].cells, vec![0, 1, 2]);
    let rt = step.round_trip.as_ref().unwrap();
    assert!(rt.whole_loaded && !rt.whole_same_bytes);
    assert_eq!(rt.whole_twin[0].cells, vec![0, 1]);
    assert_eq!(rt.seqs[0].twin.cells, vec![0, 1]);
}

#[test]
fn the_architecture_picks_the_memory_as_create_memory_does() {
    let m = |s: &str| {
        memory_config(
            "native",
            &Setup::default().with_config(s).unwrap(),
            Faults::default(),
        )
        .unwrap()
        .kind
    };
    assert_eq!(m("n_ctx=1024"), MemoryKind::Kv);
    // pad(min(1024, 4 * 1 + 32), 256); swa_full (llama.cpp's default) keeps the base size.
    assert_eq!(
        m("n_ctx=1024,arch=gemma2,swa_full=false,n_ubatch=32"),
        MemoryKind::Iswa {
            n_swa: NATIVE_N_SWA,
            swa_size: 256
        }
    );
    assert_eq!(
        m("n_ctx=1024,arch=gemma2,n_ubatch=32"),
        MemoryKind::Iswa {
            n_swa: NATIVE_N_SWA,
            swa_size: 1024
        }
    );
    assert!(matches!(
        m("arch=mamba"),
        MemoryKind::Recurrent { n_rs_seq: 0, .. }
    ));
    assert!(matches!(
        m("arch=jamba"),
        MemoryKind::Hybrid { n_rs_seq: 0, .. }
    ));
    // native+tensors carries attention rows only.
    assert!(matches!(
        cache_config(
            "native+tensors",
            &Setup::default().with_config("arch=gemma2").unwrap(),
            Faults::default()
        ),
        Err(HarnessError::Unsupported { .. })
    ));
}

#[test]
fn every_memory_type_runs_a_trace_and_round_trips_its_dumps() {
    for arch in ["llama", "gemma2", "mamba", "jamba"] {
        let setup = Setup::default()
            .with_config(&format!("arch={arch},n_seq_max=2"))
            .unwrap();
        let mut t = NativeTarget::new(Faults::default());
        t.reset(&setup).unwrap();
        t.apply(&decode(0, 3)).unwrap();
        t.apply(&Op::SeqCp {
            src: 0,
            dst: 1,
            p0: -1,
            p1: -1,
        })
        .unwrap();
        assert_eq!(SeqObservation::of(&mut t, 1).unwrap().pos_max, 2, "{arch}");
        let whole = t.state_get().unwrap().unwrap();
        let seq = t.seq_state(0).unwrap();
        let twin = t.twin().unwrap().unwrap();
        assert_eq!(twin.state_set(&whole).unwrap(), TRUE, "{arch}");
        assert_eq!(twin.state_get().unwrap().unwrap(), whole, "{arch}");
        assert_eq!(twin.set_seq_state(0, &seq).unwrap(), TRUE, "{arch}");
        assert_eq!(twin.seq_state(0).unwrap(), seq, "{arch}");
    }
}
