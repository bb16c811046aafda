//! Tests of the contract oracle (`super`): each clause on hand-made observations.

use super::*;
use crate::base::op::Decode;

fn seqs(v: &[(SeqId, &[Pos])]) -> Vec<SeqObservation> {
    v.iter()
        .map(|&(seq, c)| SeqObservation {
            seq,
            pos_min: c.first().copied().unwrap_or(-1),
            pos_max: c.last().copied().unwrap_or(-1),
            cells: c.to_vec(),
            second_cells: None,
            third_cells: None,
        })
        .collect()
}

fn step(
    outcome: OpOutcome,
    before: &[(SeqId, &[Pos])],
    after: &[(SeqId, &[Pos])],
) -> StepObservation {
    let mut s = StepObservation::basic(outcome, seqs(after));
    s.before = Some(seqs(before));
    s
}

const DONE: OpOutcome = OpOutcome::Done { returned: None };

#[test]
fn a_failed_seq_rm_that_moved_an_accessor_is_a_breach() {
    // A recurrent state at position 4 (one cell); seq_rm(0, 3, -1) returned false but the
    // state went: the cells of the dump may still parse alike, the accessors do not.
    let rm = Op::SeqRm {
        seq: 0,
        p0: 3,
        p1: -1,
    };
    let refused = OpOutcome::Done {
        returned: Some(false),
    };
    let mut s = step(refused.clone(), &[(0, &[4])], &[(0, &[4])]);
    assert!(check_contract(&rm, &s, false, MemoryType::Kv).is_none());
    s.seqs[0].pos_min = -1;
    s.seqs[0].pos_max = -1;
    let v = check_contract(&rm, &s, false, MemoryType::Kv).expect("a breach");
    assert_eq!(
        (v.kind.as_str(), v.seq),
        ("seq_rm: failed removal changed the cache", Some(0))
    );
    assert!(
        check_contract(&rm, &s, true, MemoryType::Kv).is_none(),
        "llama.h is silent: advisory"
    );
}

#[test]
fn every_clause_kind_is_in_the_table_once() {
    let kinds: BTreeSet<_> = CLAUSES.iter().map(|c| c.kind).collect();
    assert_eq!(kinds.len(), CLAUSES.len());
}

#[test]
fn honest_ops_hold() {
    let keep = step(DONE, &[(0, &[0, 1]), (1, &[0])], &[(0, &[0, 1]), (1, &[])]);
    assert!(check_contract(&Op::SeqKeep { seq: 0 }, &keep, true, MemoryType::Kv).is_none());
    let cp = step(
        DONE,
        &[(0, &[0, 1, 2]), (1, &[])],
        &[(0, &[0, 1, 2]), (1, &[0, 1])],
    );
    assert!(check_contract(
        &Op::SeqCp {
            src: 0,
            dst: 1,
            p0: 0,
            p1: 2
        },
        &cp,
        true,
        MemoryType::Kv
    )
    .is_none());
    let dec = step(
        OpOutcome::Decoded { rc: 0 },
        &[(0, &[0, 1])],
        &[(0, &[0, 1, 2, 3])],
    );
    assert!(check_contract(&Op::Decode(Decode::next(0, 2)), &dec, true, MemoryType::Kv).is_none());
    let rm = step(
        OpOutcome::Done {
            returned: Some(true),
        },
        &[(0, &[0, 1, 2, 3])],
        &[(0, &[0, 3])],
    );
    assert!(check_contract(
        &Op::SeqRm {
            seq: 0,
            p0: 1,
            p1: 3
        },
        &rm,
        true,
        MemoryType::Kv
    )
    .is_none());
}

#[test]
fn forced_mismatches_are_caught() {
    let keep = step(DONE, &[(0, &[0, 1]), (1, &[0])], &[(0, &[0, 1]), (1, &[0])]);
    let v = check_contract(&Op::SeqKeep { seq: 0 }, &keep, true, MemoryType::Kv).unwrap();
    assert_eq!(v.kind, "seq_keep: other sequence kept");
    assert_eq!(v.seq, Some(1));
    let rm = step(
        OpOutcome::Done {
            returned: Some(false),
        },
        &[(0, &[0, 1])],
        &[(0, &[0, 1])],
    );
    let v = check_contract(
        &Op::SeqRm {
            seq: 0,
            p0: -1,
            p1: -1,
        },
        &rm,
        true,
        MemoryType::Kv,
    )
    .unwrap();
    assert_eq!(v.kind, "seq_rm: whole-sequence removal failed");
    let full = step(OpOutcome::Decoded { rc: 1 }, &[(0, &[0])], &[(0, &[0, 1])]);
    let v = check_contract(&Op::Decode(Decode::next(0, 1)), &full, true, MemoryType::Kv).unwrap();
    assert_eq!(v.kind, "decode: failed decode changed the cache");
}

#[test]
fn silent_clauses_are_questions_not_contract_findings() {
    // llama.cpp moves a shared cell for both sequences.
    let add = step(
        DONE,
        &[(0, &[0, 1]), (1, &[0, 1])],
        &[(0, &[2, 3]), (1, &[2, 3])],
    );
    let op = Op::SeqAdd {
        seq: 0,
        p0: 0,
        p1: -1,
        delta: 2,
    };
    assert!(check_contract(&op, &add, true, MemoryType::Kv).is_none());
    let q = check_contract(&op, &add, false, MemoryType::Kv).unwrap();
    assert_eq!(q.oracle, QUESTION_ID);
    assert_eq!(q.kind, "seq_add: shared cells moved another sequence");
}

#[test]
fn no_before_means_nothing_to_judge() {
    let s = StepObservation::basic(DONE, seqs(&[(0, &[0])]));
    assert!(check_contract(&Op::Clear, &s, true, MemoryType::Kv).is_none());
}

#[test]
fn the_kind_lists_are_the_clause_tables() {
    for (documented, kinds) in [(true, &DOCUMENTED_KINDS[..]), (false, &QUESTION_KINDS[..])] {
        let of_table: Vec<&str> = CLAUSES
            .iter()
            .filter(|c| c.documented == documented)
            .map(|c| c.kind)
            .collect();
        assert_eq!(kinds, &of_table[..], "documented: {documented}");
    }
}
