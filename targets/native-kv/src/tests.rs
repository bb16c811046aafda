//! Hand-worked cases from llama.cpp's source (src/llama-kv-cells.h, src/llama-kv-cache.cpp,
//! src/llama-batch.cpp) and from what was measured on real builds (shared/LLAMA-FACTS.md).

use super::*;

fn tok(seqs: &[SeqId]) -> BatchToken {
    BatchToken {
        token: 1,
        pos: None,
        seqs: seqs.to_vec(),
    }
}

fn cache_with(faults: Faults, n: usize) -> CellCache {
    let mut c = CellCache::new(CacheConfig {
        faults,
        ..CacheConfig::default()
    });
    let batch: Vec<BatchToken> = (0..n).map(|_| tok(&[0])).collect();
    c.decode(&batch).unwrap();
    c
}

fn positions(c: &CellCache, seq: SeqId) -> Vec<Pos> {
    let mut v: Vec<Pos> = c
        .resident_cells()
        .filter(|(_, _, s)| s & (1 << seq) != 0)
        .map(|(_, p, _)| p)
        .collect();
    v.sort();
    v
}

#[test]
fn decode_next_places_positions_from_zero() {
    let c = cache_with(Faults::default(), 7);
    assert_eq!(positions(&c, 0), (0..7).collect::<Vec<_>>());
    assert_eq!(
        (c.seq_pos_min(0).unwrap(), c.seq_pos_max(0).unwrap()),
        (0, 6)
    );
    assert_eq!(
        (c.seq_pos_min(1).unwrap(), c.seq_pos_max(1).unwrap()),
        (-1, -1)
    );
}

#[test]
fn interior_seq_rm_leaves_a_hole() {
    // LLAMA-FACTS: seq_rm(0,2,5) leaves {0,1,5,6} under min/max 0/6.
    let mut c = cache_with(Faults::default(), 7);
    c.seq_rm(0, 2, 5).unwrap();
    assert_eq!(positions(&c, 0), vec![0, 1, 5, 6]);
    assert_eq!(
        (c.seq_pos_min(0).unwrap(), c.seq_pos_max(0).unwrap()),
        (0, 6)
    );
}

#[test]
fn partial_seq_add_moves_cells() {
    // LLAMA-FACTS: seq_add(0,2,5,+10) gives {0,1,5,6,12,13,14}.
    let mut c = cache_with(Faults::default(), 7);
    c.seq_add(0, 2, 5, 10).unwrap();
    assert_eq!(positions(&c, 0), vec![0, 1, 5, 6, 12, 13, 14]);
    assert_eq!(c.seq_pos_max(0).unwrap(), 14);
}

#[test]
fn seq_div_merges_positions() {
    // LLAMA-FACTS: seq_div(0,0,4,2) gives two cells at 0 and two at 1.
    let mut c = cache_with(Faults::default(), 7);
    c.seq_div(0, 0, 4, 2).unwrap();
    assert_eq!(positions(&c, 0), vec![0, 0, 1, 1, 4, 5, 6]);
}

#[test]
fn seq_add_below_zero_removes_the_cell_for_every_sequence() {
    let mut c = cache_with(Faults::default(), 7);
    c.seq_cp(0, 1, 0, 3).unwrap();
    c.seq_add(1, 0, 2, -2).unwrap();
    // cells at 0 and 1 pushed below 0: gone for seq 0 too (they are shared).
    assert_eq!(positions(&c, 0), vec![2, 3, 4, 5, 6]);
    assert_eq!(positions(&c, 1), vec![2]);
    assert_eq!(c.seq_pos_min(0).unwrap(), 2);
}

#[test]
fn repeated_seq_cp_is_idempotent_without_faults() {
    let mut c = cache_with(Faults::default(), 7);
    c.seq_cp(0, 1, 0, 3).unwrap();
    c.seq_cp(0, 1, 0, 3).unwrap();
    c.seq_keep(0).unwrap();
    assert_eq!(positions(&c, 1), Vec::<Pos>::new());
    assert_eq!(c.seq_pos_max(1).unwrap(), -1);
}

#[test]
fn refcount_fault_leaves_a_stale_maximum() {
    // The seed's reproducer (shared/seeds/004): 0.1.156 release gives pos_max(1) = 2.
    let mut c = cache_with(
        Faults {
            refcount: true,
            ..Faults::default()
        },
        7,
    );
    c.seq_cp(0, 1, 0, 3).unwrap();
    c.seq_cp(0, 1, 0, 3).unwrap();
    c.seq_keep(0).unwrap();
    assert_eq!(positions(&c, 1), Vec::<Pos>::new());
    assert_eq!(
        (c.seq_pos_min(1).unwrap(), c.seq_pos_max(1).unwrap()),
        (0, 2)
    );
    // ... and a decode into seq 1 at "next" position 3 is then refused, as on 0.1.156
    // ("inconsistent sequence positions") -- here it is accepted at pos 3 but the index says 0..3.
}

#[test]
fn seq_rm_off_by_one_removes_the_end() {
    let mut c = cache_with(
        Faults {
            seq_rm_off_by_one: true,
            ..Faults::default()
        },
        7,
    );
    c.seq_rm(0, 2, 5).unwrap();
    assert_eq!(positions(&c, 0), vec![0, 1, 6]);
}

#[test]
fn seq_add_stale_index_keeps_old_positions() {
    let mut c = cache_with(
        Faults {
            seq_add_stale_index: true,
            ..Faults::default()
        },
        7,
    );
    c.seq_add(0, 4, 7, 2).unwrap();
    assert_eq!(positions(&c, 0), vec![0, 1, 2, 3, 6, 7, 8]);
    assert_eq!(c.seq_pos_max(0).unwrap(), 6);
}

#[test]
fn decode_must_continue_from_pos_max() {
    let mut c = cache_with(Faults::default(), 7);
    let bad = BatchToken {
        token: 1,
        pos: Some(9),
        seqs: vec![0],
    };
    assert_eq!(c.decode(&[bad]).unwrap_err().return_code(), -1);
    let good = BatchToken {
        token: 1,
        pos: Some(7),
        seqs: vec![0],
    };
    c.decode(&[good]).unwrap();
    assert_eq!(c.seq_pos_max(0).unwrap(), 7);
}

#[test]
fn decode_next_after_a_hole_is_still_accepted() {
    let mut c = cache_with(Faults::default(), 7);
    c.seq_rm(0, 2, 5).unwrap();
    c.decode(&[tok(&[0])]).unwrap();
    assert_eq!(positions(&c, 0), vec![0, 1, 5, 6, 7]);
}

#[test]
fn full_cache_refuses_with_rc_1() {
    let mut c = CellCache::new(CacheConfig {
        n_ctx: 4,
        ..CacheConfig::default()
    });
    let batch: Vec<BatchToken> = (0..4).map(|_| tok(&[0])).collect();
    c.decode(&batch).unwrap();
    assert_eq!(c.decode(&[tok(&[0])]).unwrap_err(), DecodeError::NoSlot);
}

#[test]
fn invalid_ids_are_refused() {
    let mut c = cache_with(Faults::default(), 3);
    assert_eq!(c.seq_keep(-1), Err(CacheError::InvalidSeq(-1)));
    assert_eq!(c.seq_div(0, 0, 3, 0), Err(CacheError::ZeroDivisor));
    assert_eq!(c.seq_cp(0, 9, 0, 3), Err(CacheError::InvalidSeq(9)));
}

#[test]
fn seq_state_bytes_layout() {
    let mut c = cache_with(Faults::default(), 2);
    c.seq_cp(0, 1, 1, 2).unwrap();
    let b = c.state_seq_bytes(1).unwrap();
    let mut expect = Vec::new();
    for w in [0xaf14_3cd8u32, 1, 1, 1] {
        expect.extend_from_slice(&w.to_le_bytes());
    }
    // one cell: pos 1, one seq id: 1; then v_trans 0, n_layer 0
    for w in [1i32, 1, 1, 0, 0] {
        expect.extend_from_slice(&w.to_le_bytes());
    }
    assert_eq!(b, expect);
    let empty = c.state_seq_bytes(2).unwrap();
    assert_eq!(empty.len(), 16);
}

#[test]
fn coupled_sequences_must_agree() {
    let mut c = cache_with(Faults::default(), 3);
    // seq 1 is empty, seq 0 is not: a token for both diverged sequences is refused.
    let err = c.decode(&[tok(&[0, 1])]).unwrap_err();
    assert_eq!(err.return_code(), -1);
}
