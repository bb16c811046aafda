//! Streams (one per sequence when not unified), whole-context state, restore failure paths and
//! the faults that are positive controls for the state and configuration oracles. Each case
//! cites the llama.cpp code it mirrors (src/llama-kv-cache.cpp of llama-cpp-sys-2 0.1.161).

use super::*;

fn tok(seqs: &[SeqId]) -> BatchToken {
    BatchToken {
        token: 1,
        pos: None,
        seqs: seqs.to_vec(),
    }
}

fn cache(unified: bool, faults: Faults) -> CellCache {
    CellCache::new(CacheConfig {
        n_ctx: 16,
        n_seq_max: 3,
        unified,
        faults,
    })
}

fn decode(c: &mut CellCache, seq: SeqId, n: usize) {
    let batch: Vec<BatchToken> = (0..n).map(|_| tok(&[seq])).collect();
    c.decode(&batch).unwrap();
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

/// (position, sequences) of every cell of a whole dump, in dump order.
fn whole_cells(c: &CellCache) -> Vec<(Pos, Vec<SeqId>)> {
    let b = c.state_bytes();
    let mut at = 4 + STATE_ARCH.len();
    let word = |at: &mut usize| {
        let w = i32::from_le_bytes(b[*at..*at + 4].try_into().unwrap());
        *at += 4;
        w
    };
    let n_stream = word(&mut at);
    let mut out = Vec::new();
    for _ in 0..n_stream {
        let n = word(&mut at);
        if n == 0 {
            continue;
        }
        for _ in 0..n {
            let p = word(&mut at);
            let k = word(&mut at);
            out.push((p, (0..k).map(|_| word(&mut at)).collect()));
        }
        at += 8; // v_trans, n_layer 0
    }
    assert_eq!(at, b.len());
    out
}

#[test]
fn each_sequence_has_its_own_stream_of_n_ctx_cells() {
    let mut c = cache(false, Faults::default());
    decode(&mut c, 0, 16);
    decode(&mut c, 1, 16);
    // The same cell index in two streams: numbered s * n_ctx + i.
    let cells: Vec<usize> = c.resident_cells().map(|(g, _, _)| g).collect();
    assert_eq!(cells[16], 16);
    // Stream 0 is full: rc 1 for seq 0; seq 2's stream is free.
    assert_eq!(c.decode(&[tok(&[0])]).unwrap_err(), DecodeError::NoSlot);
    decode(&mut c, 2, 1);
    // A token of two sequences cannot be placed in two streams (split_equal, sequential).
    let mut d = cache(false, Faults::default());
    assert_eq!(d.decode(&[tok(&[0, 1])]).unwrap_err(), DecodeError::NoSlot);
    // Unified, the same 32 tokens do not fit 16 cells.
    let mut u = cache(true, Faults::default());
    decode(&mut u, 0, 16);
    assert_eq!(u.decode(&[tok(&[1])]).unwrap_err(), DecodeError::NoSlot);
}

#[test]
fn per_stream_ops_touch_only_their_stream() {
    let mut c = cache(false, Faults::default());
    decode(&mut c, 0, 4);
    decode(&mut c, 1, 4);
    // seq_keep(0) leaves stream 1 alone (llama_kv_cache::seq_keep works on seq_to_stream[0]).
    c.seq_keep(0).unwrap();
    assert_eq!(positions(&c, 1), vec![0, 1, 2, 3]);
    c.seq_add(1, 0, -1, 10).unwrap();
    assert_eq!(positions(&c, 0), vec![0, 1, 2, 3]);
    assert_eq!(c.seq_pos_max(1), Ok(13));
    // seq_rm(-1, ..) goes over every stream.
    c.seq_rm(-1, 2, -1).unwrap();
    assert_eq!(positions(&c, 0), vec![0, 1]);
    assert_eq!(positions(&c, 1), Vec::<Pos>::new());
    c.clear();
    assert_eq!(c.used_cells(), 0);
}

#[test]
fn cross_stream_seq_cp_copies_the_stream_or_is_refused() {
    let mut c = cache(false, Faults::default());
    decode(&mut c, 0, 4);
    decode(&mut c, 1, 2);
    // Partial: GGML_ASSERT(is_full) in llama.cpp; refused here, nothing changes.
    let err = c.seq_cp(0, 1, 1, 3).unwrap_err();
    assert!(matches!(err, CacheError::PartialCrossStreamCopy { .. }));
    assert!(err.to_string().contains("GGML_ASSERT"), "{err}");
    assert_eq!(positions(&c, 1), vec![0, 1]);
    // "Full" as llama.cpp computes it: each end <= 0 or >= n_ctx - 1.
    c.seq_cp(0, 1, 0, 15).unwrap();
    assert_eq!(positions(&c, 1), vec![0, 1, 2, 3]);
    assert_eq!(c.seq_pos_max(1), Ok(3));
    // Same cell indices in the destination stream, holding dst only.
    let cells: Vec<(usize, u64)> = c.resident_cells().map(|(g, _, s)| (g, s)).collect();
    assert_eq!(cells[4..], [(16, 2), (17, 2), (18, 2), (19, 2)]);
    // Unified, the same partial copy is a metadata copy.
    let mut u = cache(true, Faults::default());
    decode(&mut u, 0, 4);
    u.seq_cp(0, 1, 1, 3).unwrap();
    assert_eq!(positions(&u, 1), vec![1, 2]);
}

#[test]
fn dumps_list_every_stream() {
    let mut c = cache(false, Faults::default());
    decode(&mut c, 1, 2);
    let b = c.state_seq_bytes(1).unwrap();
    // magic, seq 1, n_stream 3, stream 0: 0 cells, stream 1: 2 cells ..., stream 2: 0 cells.
    let words: Vec<i32> = b
        .chunks(4)
        .map(|w| i32::from_le_bytes(w.try_into().unwrap()))
        .collect();
    assert_eq!(words[1..], [1, 3, 0, 2, 0, 1, 1, 1, 1, 1, 0, 0, 0]);
    assert_eq!(whole_cells(&c), vec![(0, vec![1]), (1, vec![1])]);
}

#[test]
fn whole_state_round_trips_in_both_modes() {
    for unified in [true, false] {
        let mut c = cache(unified, Faults::default());
        decode(&mut c, 0, 3);
        decode(&mut c, 1, 2);
        if unified {
            c.seq_cp(0, 2, 0, 2).unwrap();
        }
        c.seq_rm(0, 1, 2).unwrap();
        let whole = c.state_bytes();
        let mut twin = cache(unified, Faults::default());
        decode(&mut twin, 2, 5); // replaced by the load
        assert_eq!(twin.state_set_bytes(&whole), Ok(whole.len()));
        assert_eq!(twin.state_bytes(), whole);
        for s in 0..3 {
            assert_eq!(
                positions(&twin, s),
                positions(&c, s),
                "unified {unified}, seq {s}"
            );
            assert_eq!(twin.seq_pos_max(s), c.seq_pos_max(s));
        }
        // The other mode's dump has another stream count: refused, the cache unchanged.
        let other = cache(!unified, Faults::default()).state_bytes();
        let before = twin.state_bytes();
        assert!(twin
            .state_set_bytes(&other)
            .unwrap_err()
            .message
            .contains("n_stream"));
        assert_eq!(twin.state_bytes(), before);
    }
}

#[test]
fn whole_load_failures_leave_what_llama_cpp_leaves() {
    let mut c = cache(true, Faults::default());
    decode(&mut c, 0, 3);
    decode(&mut c, 1, 2);
    let whole = c.state_bytes();
    let target = || {
        let mut t = cache(true, Faults::default());
        decode(&mut t, 2, 4);
        t
    };
    // A wrong architecture name: unchanged.
    let mut bad = whole.clone();
    bad[4] ^= 0xff;
    let mut t = target();
    assert!(t
        .state_set_bytes(&bad)
        .unwrap_err()
        .message
        .contains("arch"));
    assert_eq!(positions(&t, 2), vec![0, 1, 2, 3]);
    // A sequence id out of range: state_clear(-1), everything gone.
    let mut bad = whole.clone();
    let seq_of_first_cell = 4 + STATE_ARCH.len() + 8 + 8;
    bad[seq_of_first_cell..seq_of_first_cell + 4].copy_from_slice(&7i32.to_le_bytes());
    let mut t = target();
    assert!(t
        .state_set_bytes(&bad)
        .unwrap_err()
        .message
        .contains("seq id"));
    assert_eq!(t.used_cells(), 0);
    // Cut inside the cells: the read throws past the cleanup; the cells read so far stay.
    let mut t = target();
    let cut = seq_of_first_cell + 4 + 8; // the first cell and the second's pos and n_seq_id
    assert!(t.state_set_bytes(&whole[..cut]).is_err());
    assert_eq!(whole_cells(&t), vec![(0, vec![0]), (1, vec![])]);
    // Cut in the data section: state_clear(-1).
    let mut t = target();
    assert!(t.state_set_bytes(&whole[..whole.len() - 2]).is_err());
    assert_eq!(t.used_cells(), 0);
}

#[test]
fn seq_load_into_a_sequence_that_has_cells_replaces_them() {
    let mut c = cache(true, Faults::default());
    decode(&mut c, 0, 3);
    let bytes = c.state_seq_bytes(0).unwrap();
    decode(&mut c, 1, 5);
    // Into seq 1 (5 cells): seq_rm(1) first, then the 3 cells of seq 0 as seq 1.
    assert_eq!(c.state_seq_set_bytes(1, &bytes), Ok(bytes.len()));
    assert_eq!(positions(&c, 1), vec![0, 1, 2]);
    assert_eq!(positions(&c, 0), vec![0, 1, 2]);
    // Truncated after the cells: seq_rm on the destination.
    assert!(c.state_seq_set_bytes(1, &bytes[..bytes.len() - 1]).is_err());
    assert_eq!(positions(&c, 1), Vec::<Pos>::new());
    // Truncated before any cell count: unchanged.
    decode(&mut c, 1, 2);
    assert!(c.state_seq_set_bytes(1, &bytes[..10]).is_err());
    assert_eq!(positions(&c, 1), vec![0, 1]);
    // A corrupt n_seq_id: seq_rm on the destination.
    let mut bad = bytes.clone();
    bad[20] = 2;
    assert!(c
        .state_seq_set_bytes(1, &bad)
        .unwrap_err()
        .message
        .contains("seq_id-agnostic"));
    assert_eq!(positions(&c, 1), Vec::<Pos>::new());
    // Multi-stream: the cells go to the destination's stream.
    let mut m = cache(false, Faults::default());
    decode(&mut m, 0, 3);
    let bytes = m.state_seq_bytes(0).unwrap();
    assert_eq!(m.state_seq_set_bytes(2, &bytes), Ok(bytes.len()));
    assert_eq!(positions(&m, 2), vec![0, 1, 2]);
    assert!(m.resident_cells().any(|(g, _, _)| g == 32));
}

#[test]
fn restore_drops_last_cell_loses_one_cell_per_load() {
    let faults = Faults {
        restore_drops_last_cell: true,
        ..Faults::default()
    };
    let mut c = cache(true, faults);
    decode(&mut c, 0, 3);
    decode(&mut c, 1, 2);
    let whole = c.state_bytes();
    let seq0 = c.state_seq_bytes(0).unwrap();
    let mut t = cache(true, faults);
    assert_eq!(t.state_set_bytes(&whole), Ok(whole.len()));
    assert_eq!(positions(&t, 1), vec![0]);
    assert_eq!(positions(&t, 0), vec![0, 1, 2]);
    assert_eq!(
        t.seq_pos_max(1),
        Ok(0),
        "the index follows: invisible to I1"
    );
    assert_eq!(t.state_seq_set_bytes(2, &seq0), Ok(seq0.len()));
    assert_eq!(positions(&t, 2), vec![0, 1]);
}

#[test]
fn orphan_cell_stays_used_with_no_sequence() {
    let faults = Faults {
        orphan_cell: true,
        ..Faults::default()
    };
    let mut c = cache(true, faults);
    decode(&mut c, 0, 3);
    c.seq_rm(0, 1, 2).unwrap();
    assert_eq!(positions(&c, 0), vec![0, 2]);
    assert_eq!((c.seq_pos_min(0), c.seq_pos_max(0)), (Ok(0), Ok(2)));
    assert_eq!(c.used_cells(), 3);
    assert_eq!(
        whole_cells(&c),
        vec![(0, vec![0]), (1, vec![]), (2, vec![0])]
    );
    // The per-sequence dump does not show it.
    let mut ok = cache(true, Faults::default());
    decode(&mut ok, 0, 3);
    ok.seq_rm(0, 1, 2).unwrap();
    assert_eq!(c.state_seq_bytes(0), ok.state_seq_bytes(0));
    // seq_rm(-1) and clear remove it.
    c.seq_rm(-1, -1, -1).unwrap();
    assert_eq!(c.used_cells(), 0);
}

#[test]
fn keep_noop_keeps_other_sequences() {
    let faults = Faults {
        keep_noop: true,
        ..Faults::default()
    };
    let mut c = cache(true, faults);
    decode(&mut c, 0, 2);
    decode(&mut c, 1, 2);
    c.seq_keep(0).unwrap();
    assert_eq!(positions(&c, 1), vec![0, 1]);
    let mut ok = cache(true, Faults::default());
    decode(&mut ok, 0, 2);
    decode(&mut ok, 1, 2);
    ok.seq_keep(0).unwrap();
    assert_eq!(positions(&ok, 1), Vec::<Pos>::new());
}

#[test]
fn streams_rm_whole_only_without_unified() {
    let faults = Faults {
        streams_rm_whole: true,
        ..Faults::default()
    };
    for (unified, left) in [(true, vec![0, 3]), (false, vec![])] {
        let mut c = cache(unified, faults);
        decode(&mut c, 0, 4);
        c.seq_rm(0, 1, 3).unwrap();
        assert_eq!(positions(&c, 0), left, "unified {unified}");
        assert_eq!(c.seq_pos_max(0), Ok(*left.last().unwrap_or(&-1)));
    }
}

#[test]
fn fault_names_round_trip() {
    for name in Faults::NAMES {
        let mut f = Faults::default();
        assert!(f.enable(name));
        assert_eq!(f.enabled(), vec![name]);
    }
}
