//! Tests of the token model: attention cells, recurrent states, hybrids and iSWA.

use super::*;
use crate::base::op::Decode;

fn setup(unified: bool) -> Setup {
    Setup {
        kv_unified: unified,
        ops: vec![Op::Decode(Decode::next(0, 7))],
        ..Setup::default()
    }
}

fn done() -> OpOutcome {
    OpOutcome::Done { returned: None }
}

fn seq0(m: &TokenModel, cells: &[Pos]) -> Option<Vec<(Pos, Token)>> {
    m.attention_resident(0, cells).map(|(v, _)| v)
}

#[test]
fn a_fresh_prefix_and_a_tail_removal_are_judged() {
    let mut m = TokenModel::after_setup(&setup(true));
    let all: Vec<Pos> = (0..7).collect();
    let r = seq0(&m, &all).unwrap();
    assert_eq!(r.len(), 7);
    assert_eq!(r[0], (0, crate::base::op::default_token(0)));
    m.apply(
        &Op::SeqRm {
            seq: 0,
            p0: 4,
            p1: -1,
        },
        &OpOutcome::Done {
            returned: Some(true),
        },
    );
    assert!(seq0(&m, &[0, 1, 2, 3]).is_some());
    // The target's cells must agree with the model's.
    assert!(seq0(&m, &[0, 1, 2]).is_none());
}

#[test]
fn stale_histories_are_not_judged() {
    let mut m = TokenModel::after_setup(&setup(true));
    m.apply(
        &Op::SeqRm {
            seq: 0,
            p0: 2,
            p1: 5,
        },
        &OpOutcome::Done {
            returned: Some(true),
        },
    );
    // Cells 5 and 6 attended to 2..5 when they were decoded.
    assert!(seq0(&m, &[0, 1, 5, 6]).is_none());
    let mut m = TokenModel::after_setup(&setup(true));
    m.apply(
        &Op::SeqAdd {
            seq: 0,
            p0: 4,
            p1: -1,
            delta: 2,
        },
        &done(),
    );
    assert!(seq0(&m, &[0, 1, 2, 3, 6, 7, 8]).is_none());
    // Open ends on both sides: every cell moves (position 0 goes below 0 and is freed).
    let mut m = TokenModel::after_setup(&setup(true));
    m.apply(
        &Op::SeqAdd {
            seq: 0,
            p0: -1,
            p1: -1,
            delta: -1,
        },
        &done(),
    );
    assert!(seq0(&m, &(0..6).collect::<Vec<_>>()).is_none());
    // A shift of the whole sequence keeps every relative position.
    let mut m = TokenModel::after_setup(&setup(true));
    m.apply(
        &Op::SeqAdd {
            seq: 0,
            p0: -1,
            p1: -1,
            delta: 3,
        },
        &done(),
    );
    assert!(
        m.attention_resident(0, &(3..10).collect::<Vec<_>>())
            .unwrap()
            .1
    );
}

#[test]
fn copies_share_cells_when_unified_and_not_across_streams() {
    let cp = Op::SeqCp {
        src: 0,
        dst: 1,
        p0: -1,
        p1: -1,
    };
    let add = Op::SeqAdd {
        seq: 0,
        p0: -1,
        p1: -1,
        delta: 2,
    };
    let mut m = TokenModel::after_setup(&setup(true));
    m.apply(&cp, &done());
    m.apply(&add, &done());
    let moved: Vec<Pos> = (2..9).collect();
    assert!(m.attention_resident(1, &moved).is_some());
    let mut m = TokenModel::after_setup(&setup(false));
    m.apply(&cp, &done());
    m.apply(&add, &done());
    assert!(m
        .attention_resident(1, &(0..7).collect::<Vec<_>>())
        .is_some());
    assert!(m.attention_resident(0, &moved).is_some());
}

#[test]
fn loads_follow_the_slots_and_damage_is_unknown() {
    let slot = Slot::new("a").unwrap();
    let yes = OpOutcome::Done {
        returned: Some(true),
    };
    let mut m = TokenModel::after_setup(&setup(true));
    m.apply(
        &Op::StateSeqSave {
            seq: 0,
            slot: slot.clone(),
            flags: 0,
        },
        &yes,
    );
    let load = |truncate| Op::StateSeqLoad {
        seq: 1,
        slot: slot.clone(),
        flags: 0,
        truncate,
        flip: None,
    };
    m.apply(&load(None), &yes);
    let all: Vec<Pos> = (0..7).collect();
    assert_eq!(
        m.attention_resident(1, &all).map(|(v, _)| v),
        seq0(&m, &all)
    );
    m.apply(
        &load(Some(10)),
        &OpOutcome::Done {
            returned: Some(false),
        },
    );
    assert!(m.attention_resident(1, &[]).is_none());
    m.apply(&Op::Clear, &done());
    assert_eq!(m.attention_resident(1, &[]), Some((Vec::new(), false)));
}

fn arch_setup(arch: crate::base::op::Arch) -> Setup {
    Setup {
        n_seq_max: 3,
        arch,
        ..setup(true)
    }
}

fn obs(seq: SeqId, pos_min: Pos, cells: &[Pos], second: Option<&[Pos]>) -> SeqObservation {
    SeqObservation {
        seq,
        pos_min,
        pos_max: cells.last().copied().unwrap_or(-1),
        cells: cells.to_vec(),
        second_cells: second.map(<[Pos]>::to_vec),
        third_cells: None,
    }
}

fn returned(b: bool) -> OpOutcome {
    OpOutcome::Done { returned: Some(b) }
}

fn rm(seq: SeqId, p0: Pos, p1: Pos) -> Op {
    Op::SeqRm { seq, p0, p1 }
}

fn cp(src: SeqId, dst: SeqId, p0: Pos, p1: Pos) -> Op {
    Op::SeqCp { src, dst, p0, p1 }
}

#[test]
fn a_recurrent_state_is_every_token_it_absorbed() {
    use crate::base::op::Arch;
    let mut m = TokenModel::after_setup(&arch_setup(Arch::Mamba));
    let all = m.resident(&obs(0, 6, &[6], None)).unwrap().0;
    assert_eq!(all.len(), 7);
    // A refused partial removal changed nothing: all seven tokens, the cell still at 6.
    m.apply(&rm(0, 4, -1), &returned(false));
    assert_eq!(m.resident(&obs(0, 6, &[6], None)).unwrap().0, all);
    // The dump must agree: one cell at the last absorbed position.
    assert!(m.resident(&obs(0, 3, &[3], None)).is_none());
    // A copy gives the whole state whatever the range; a decode then folds into the copy.
    m.apply(&cp(0, 1, 5, 6), &done());
    assert_eq!(m.resident(&obs(1, 6, &[6], None)).unwrap().0, all);
    m.apply_after(
        &Op::Decode(Decode::next(1, 1)),
        &OpOutcome::Decoded { rc: 0 },
        Some(7),
    );
    assert_eq!(m.resident(&obs(1, 7, &[7], None)).unwrap().0.len(), 8);
    assert_eq!(m.resident(&obs(0, 6, &[6], None)).unwrap().0, all);
    // A removal that returned true while naming absorbed tokens but not the state's
    // position: llama.cpp kept them, the model cannot say.
    m.apply(&rm(0, 0, 3), &returned(true));
    assert!(m.resident(&obs(0, 6, &[6], None)).is_none());
    // A whole removal empties the state.
    m.apply(&rm(1, -1, -1), &returned(true));
    assert_eq!(
        m.resident(&obs(1, -1, &[], None)),
        Some((Vec::new(), false))
    );
}

#[test]
fn a_shift_of_a_shared_state_is_unknown_in_every_sharer() {
    use crate::base::op::Arch;
    let mut m = TokenModel::after_setup(&arch_setup(Arch::Mamba));
    m.apply(&cp(0, 1, -1, -1), &done());
    let add = Op::SeqAdd {
        seq: 0,
        p0: 6,
        p1: 7,
        delta: 1,
    };
    m.apply(&add, &done());
    assert!(m.resident(&obs(0, 7, &[7], None)).is_none());
    assert!(m.resident(&obs(1, 7, &[7], None)).is_none());
    // An unknown state stays unknown through a whole removal (a state moved below 0
    // survives it), and is known again after a clear.
    m.apply(&rm(0, -1, -1), &returned(true));
    assert!(m.resident(&obs(0, -1, &[], None)).is_none());
    m.apply(&Op::Clear, &done());
    assert!(m.resident(&obs(0, -1, &[], None)).is_some());
}

#[test]
fn a_batch_into_several_sequences_is_judged_when_they_held_one_state() {
    use crate::base::op::Arch;
    let mut m = TokenModel::new(&arch_setup(Arch::Mamba));
    let both = Op::Decode(Decode {
        seqs: vec![0, 1],
        n: 2,
        pos: None,
        tokens: Some(vec![3, 4]),
    });
    m.apply_after(&both, &OpOutcome::Decoded { rc: 0 }, Some(0));
    let want = vec![(0, 3), (1, 4)];
    assert_eq!(m.resident(&obs(0, 1, &[1], None)).unwrap().0, want);
    assert_eq!(m.resident(&obs(1, 1, &[1], None)).unwrap().0, want);
    // Different states coupled in one batch: not judged.
    m.apply_after(
        &Op::Decode(Decode::next(0, 1)),
        &OpOutcome::Decoded { rc: 0 },
        Some(2),
    );
    m.apply_after(&both, &OpOutcome::Decoded { rc: 0 }, Some(3));
    assert!(m.resident(&obs(1, 4, &[4], None)).is_none());
}

#[test]
fn a_hybrid_is_judged_when_both_parts_agree_and_a_refused_removal_keeps_both() {
    use crate::base::op::Arch;
    let mut m = TokenModel::after_setup(&arch_setup(Arch::Jamba));
    let all: Vec<Pos> = (0..7).collect();
    assert_eq!(m.resident(&obs(0, 6, &all, Some(&[6]))).unwrap().0.len(), 7);
    m.apply(&rm(0, 4, -1), &returned(false));
    assert_eq!(m.resident(&obs(0, 6, &all, Some(&[6]))).unwrap().0.len(), 7);
    // A partial copy: the attention part copies the range, the state all of it.
    m.apply(&cp(0, 1, 0, 3), &done());
    assert!(m.resident(&obs(1, 2, &[0, 1, 2], Some(&[6]))).is_none());
}

#[test]
fn a_hybrid_decode_over_parts_that_differ_is_not_judged() {
    use crate::base::op::Arch;
    let mut m = TokenModel::after_setup(&arch_setup(Arch::Jamba));
    let ok = OpOutcome::Decoded { rc: 0 };
    // Seq 1 gets seq 0's state and no attention cell, then decodes 3 tokens at 0..2 (its
    // seq_pos_max is the smaller of the two parts': -1).
    m.apply(&cp(0, 1, 7, 8), &done());
    m.apply_after(&Op::Decode(Decode::next(1, 3)), &ok, Some(0));
    // Seq 2 decodes the same tokens from nothing; its state goes to seq 1, whose parts then
    // hold the same tokens at the same positions: still not judged, the attention rows of
    // seq 1 were computed over seq 0's state.
    let mut seq2 = TokenModel::after_setup(&arch_setup(Arch::Jamba));
    seq2.apply_after(&Op::Decode(Decode::next(2, 3)), &ok, Some(0));
    assert!(seq2.resident(&obs(2, 0, &[0, 1, 2], Some(&[2]))).is_some());
    m.apply_after(&Op::Decode(Decode::next(2, 3)), &ok, Some(0));
    m.apply(&cp(2, 1, 5, 6), &done());
    assert!(m.resident(&obs(1, 0, &[0, 1, 2], Some(&[2]))).is_none());
}

#[test]
fn iswa_is_judged_while_the_windowed_cache_holds_the_lowest_position() {
    use crate::base::op::Arch;
    let m = TokenModel::after_setup(&arch_setup(Arch::Gemma2));
    let all: Vec<Pos> = (0..7).collect();
    assert!(m.resident(&obs(0, 0, &all, Some(&[3, 4, 5, 6]))).is_some());
    assert!(m.resident(&obs(0, 2, &all, Some(&[3, 4, 5, 6]))).is_none());
}

#[test]
fn an_accepted_rollback_keeps_the_state_of_the_kept_tokens_and_marks_the_sequence() {
    use crate::base::op::Arch;
    let mut s = arch_setup(Arch::Lfm2);
    s.n_rs_seq = 3;
    let mut m = TokenModel::after_setup(&s);
    assert!(!m.rolled_back(0));
    // Two tokens back: attention keeps 0..=4, the state absorbed 0..=4.
    m.apply(&rm(0, 5, -1), &returned(true));
    let kept: Vec<Pos> = (0..5).collect();
    let r = m.resident(&obs(0, 4, &kept, Some(&[4]))).unwrap().0;
    assert_eq!(r.len(), 5);
    assert!(m.rolled_back(0));
    // A copy carries the mark; a whole removal clears it.
    m.apply(&cp(0, 1, -1, -1), &done());
    assert!(m.rolled_back(1));
    m.apply(&rm(0, -1, -1), &returned(true));
    assert!(!m.rolled_back(0) && m.rolled_back(1));
    // Without a rollback depth an accepted partial removal leaves the state unknown.
    let mut m = TokenModel::after_setup(&arch_setup(Arch::Jamba));
    m.apply(&rm(0, 5, -1), &returned(true));
    assert!(m.resident(&obs(0, 4, &kept, Some(&[4]))).is_none());
    assert!(!m.rolled_back(0));
}
