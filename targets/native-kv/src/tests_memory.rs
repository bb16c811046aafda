//! Hand-worked cases of the iSWA, recurrent, hybrid, MSA, DSA and DSA-iSWA memories
//! (src/llama-kv-cache-iswa.cpp, src/llama-memory-recurrent.cpp, src/llama-memory-hybrid.cpp,
//! src/llama-kv-cache-msa.cpp), and the faults that are their positive controls.

use super::*;
use crate::memory::STATE_SEQ_FLAGS_PARTIAL_ONLY;

fn tok(seqs: &[SeqId]) -> BatchToken {
    BatchToken {
        token: 1,
        pos: None,
        seqs: seqs.to_vec(),
    }
}

fn toks(n: usize, seq: SeqId) -> Vec<BatchToken> {
    (0..n).map(|_| tok(&[seq])).collect()
}

const N_SWA: u32 = 4;

fn iswa(faults: Faults, n_seq_max: u32) -> Memory {
    Memory::new(MemoryConfig {
        cache: CacheConfig {
            n_ctx: 512,
            n_seq_max,
            unified: true,
            faults,
        },
        kind: MemoryKind::Iswa {
            n_swa: N_SWA,
            swa_size: iswa_swa_size(512, N_SWA, true, n_seq_max, 1, false),
        },
    })
}

fn recurrent(faults: Faults, n_rs_seq: u32, shape: Option<RecurrentShape>) -> Memory {
    Memory::new(MemoryConfig {
        cache: CacheConfig {
            n_seq_max: 2,
            faults,
            ..CacheConfig::default()
        },
        kind: MemoryKind::Recurrent { n_rs_seq, shape },
    })
}

fn hybrid(faults: Faults) -> Memory {
    Memory::new(MemoryConfig {
        cache: CacheConfig {
            n_seq_max: 2,
            faults,
            ..CacheConfig::default()
        },
        kind: MemoryKind::Hybrid {
            n_rs_seq: 0,
            shape: None,
        },
    })
}

fn range(m: &Memory, s: SeqId) -> (Pos, Pos) {
    (m.seq_pos_min(s).unwrap(), m.seq_pos_max(s).unwrap())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

#[test]
fn iswa_windowed_cache_is_sized_as_llama_cpp_sizes_it() {
    // pad(min(base, n_swa * n_seq_max + n_ubatch), 256); with swa_full the base size.
    assert_eq!(iswa_swa_size(1024, 4, true, 1, 32, false), 256);
    assert_eq!(iswa_swa_size(1024, 200, true, 2, 512, false), 1024);
    assert_eq!(iswa_swa_size(1024, 200, true, 2, 100, false), 512);
    assert_eq!(iswa_swa_size(1024, 200, false, 2, 100, false), 512);
    assert_eq!(iswa_swa_size(1024, 4, true, 1, 32, true), 1024);
}

/// Seq 1 decodes 6 tokens, then seq 0 fills the windowed cache (256 cells); the next decode of
/// seq 0 has to overwrite cells. Seq 1's cells come first in the slot search.
fn full_windowed_cache(faults: Faults) -> Memory {
    let mut m = iswa(faults, 2);
    m.decode(&toks(6, 1)).unwrap();
    m.decode(&toks(250, 0)).unwrap();
    assert_eq!(range(&m, 1), (0, 5));
    m
}

#[test]
fn iswa_evicts_only_cells_masked_for_their_sequences_next_token() {
    let mut m = full_windowed_cache(Faults::default());
    m.decode(&toks(4, 0)).unwrap();
    // Seq 1 (largest position 5, next 6): positions 0..=2 are masked (6 - p >= 4), 3 is not; the
    // fourth token takes seq 0's position 0. The accessors are the windowed cache's.
    assert_eq!(range(&m, 1), (3, 5));
    assert_eq!(range(&m, 0), (1, 253));
    let Memory::Iswa { base, swa } = &m else {
        unreachable!()
    };
    // The full cache keeps everything.
    assert_eq!(
        (base.seq_pos_min(1).unwrap(), base.seq_pos_min(0).unwrap()),
        (0, 0)
    );
    assert_eq!(swa.used_cells(), 256);
}

#[test]
fn swa_window_off_by_one_evicts_a_position_the_next_token_attends() {
    let mut m = full_windowed_cache(Faults {
        swa_window_off_by_one: true,
        ..Faults::default()
    });
    m.decode(&toks(4, 0)).unwrap();
    // Position 3 of seq 1 is still in the window of its next token (6 - 3 < 4): evicted.
    assert_eq!(range(&m, 1), (4, 5));
}

#[test]
fn iswa_dump_is_base_then_windowed_and_the_windowed_part_leaves_out_masked_cells() {
    let mut m = iswa(Faults::default(), 2);
    m.decode(&toks(10, 0)).unwrap();
    let b = m.state_seq_bytes(0).unwrap();
    // magic, seq; base: n_stream 1, 10 cells (pos, n_seq 1, seq) + v_trans + n_layer.
    assert_eq!(u32_at(&b, 8), 1);
    assert_eq!(u32_at(&b, 12), 10);
    let swa_at = 16 + 10 * 12 + 8;
    assert_eq!(u32_at(&b, swa_at), 1);
    // Windowed: only positions 6..=9 (9 - p < 4).
    assert_eq!(u32_at(&b, swa_at + 4), 4);
    assert_eq!(u32_at(&b, swa_at + 8), 6);
    assert_eq!(b.len(), swa_at + 8 + 4 * 12 + 8);
    // The whole dump lists every cell of both caches.
    let w = m.state_bytes();
    let head = 4 + STATE_ARCH.len();
    assert_eq!(u32_at(&w, head + 4), 10);
    assert_eq!(u32_at(&w, head + 8 + 10 * 12 + 8 + 4), 10);
}

#[test]
fn iswa_state_round_trips_into_an_empty_twin() {
    let mut m = iswa(Faults::default(), 2);
    m.decode(&toks(10, 0)).unwrap();
    m.decode(&toks(3, 1)).unwrap();
    let mut twin = iswa(Faults::default(), 2);
    let whole = m.state_bytes();
    assert_eq!(twin.state_set_bytes(&whole), Ok(whole.len()));
    assert_eq!(twin.state_bytes(), whole);
    let mut twin = iswa(Faults::default(), 2);
    let seq = m.state_seq_bytes(0).unwrap();
    assert_eq!(twin.state_seq_set_bytes(0, &seq), Ok(seq.len()));
    // The windowed part came back with the window only: the accessors say so.
    assert_eq!(range(&twin, 0), (6, 9));
}

#[test]
fn recurrent_memory_holds_one_state_per_sequence() {
    let mut m = recurrent(Faults::default(), 0, None);
    m.decode(&toks(5, 0)).unwrap();
    assert_eq!(range(&m, 0), (4, 4));
    // A partial removal of the tail is refused without rollback depth, and changes nothing.
    assert_eq!(m.seq_rm(0, 3, -1), Ok(false));
    assert_eq!(range(&m, 0), (4, 4));
    // A range that does not reach the state's position changes nothing and succeeds.
    assert_eq!(m.seq_rm(0, 1, 3), Ok(true));
    assert_eq!(range(&m, 0), (4, 4));
    // From 0 past the position: the sequence goes.
    assert_eq!(m.seq_rm(0, 0, 10), Ok(true));
    assert_eq!(range(&m, 0), (-1, -1));
    // seq_id -1 is refused (0.1.161: (uint32_t) -1 >= n_seq_max).
    m.decode(&toks(2, 1)).unwrap();
    assert_eq!(m.seq_rm(-1, -1, -1), Ok(false));
    assert_eq!(range(&m, 1), (1, 1));
}

#[test]
fn recurrent_rollback_within_the_depth_is_accepted_once_until_the_next_decode() {
    let mut m = recurrent(Faults::default(), 2, None);
    m.decode(&toks(5, 0)).unwrap();
    assert_eq!(m.seq_rm(0, 3, -1), Ok(true));
    assert_eq!(range(&m, 0), (2, 2));
    // Pending: a second rollback is refused (0.1.161).
    assert_eq!(m.seq_rm(0, 2, -1), Ok(false));
    m.decode(&toks(1, 0)).unwrap();
    assert_eq!(range(&m, 0), (3, 3));
    // Deeper than n_rs_seq: refused.
    assert_eq!(m.seq_rm(0, 1, -1), Ok(false));
}

#[test]
fn a_decode_that_finds_no_free_state_fails_instead_of_panicking() {
    // recurrent_seq_cp_keeps_old_state leaves seq 1 in its own cell and in seq 0's: both cells
    // used, and seq 0 no longer owns its cell alone, so its next decode needs an empty cell and
    // there is none (a hunt's root-cause evidence reached this and the model panicked). It
    // fails as llama.cpp's find_slot does (rc 1), and leaves the memory as it was.
    let faults = Faults {
        recurrent_seq_cp_keeps_old_state: true,
        ..Faults::default()
    };
    for mut m in [recurrent(faults, 0, None), hybrid(faults)] {
        m.decode(&toks(5, 0)).unwrap();
        m.decode(&toks(1, 1)).unwrap();
        m.seq_cp(0, 1, -1, -1).unwrap();
        let before = (range(&m, 0), range(&m, 1));
        assert_eq!(m.decode(&toks(1, 0)).map_err(|e| e.return_code()), Err(1));
        assert_eq!((range(&m, 0), range(&m, 1)), before);
    }
}

#[test]
fn recurrent_copy_shares_the_state_and_shift_moves_it() {
    let mut m = recurrent(Faults::default(), 0, None);
    m.decode(&toks(5, 0)).unwrap();
    m.seq_cp(0, 1, 0, 1).unwrap(); // the range is ignored
    assert_eq!(range(&m, 1), (4, 4));
    m.seq_add(0, 0, -1, 10).unwrap();
    assert_eq!((range(&m, 0), range(&m, 1)), ((14, 14), (14, 14)));
    // The next decode of seq 1 gives it a cell of its own, starting from the shared position.
    m.decode(&[tok(&[1])]).unwrap();
    assert_eq!((range(&m, 0), range(&m, 1)), ((14, 14), (15, 15)));
    m.seq_div(1, 0, -1, 2).unwrap();
    assert_eq!(range(&m, 1), (7, 7));
    m.seq_keep(1).unwrap();
    assert_eq!(range(&m, 0), (-1, -1));
}

#[test]
fn recurrent_dump_layout_and_round_trip() {
    let shape = RecurrentShape {
        n_layer: 2,
        r_row_bytes: 3 * 32 * 4,
        s_row_bytes: 8 * 32 * 4,
    };
    let mut m = recurrent(Faults::default(), 0, Some(shape));
    m.decode(&toks(3, 0)).unwrap();
    let b = m.state_seq_bytes(0).unwrap();
    // magic, seq, cell_count 1, pos 2, n_seq_id 0, s_trans, n_layer 2, R x2, S x2.
    assert_eq!((u32_at(&b, 8), u32_at(&b, 12), u32_at(&b, 16)), (1, 2, 0));
    assert_eq!((u32_at(&b, 20), u32_at(&b, 24)), (0, 2));
    assert_eq!(b.len(), 28 + 2 * (12 + 384) + 2 * (12 + 1024));
    let mut twin = recurrent(Faults::default(), 0, Some(shape));
    assert_eq!(twin.state_seq_set_bytes(1, &b), Ok(b.len()));
    assert_eq!(range(&twin, 1), (2, 2));
    let w = m.state_bytes();
    let mut twin = recurrent(Faults::default(), 0, Some(shape));
    assert_eq!(twin.state_set_bytes(&w), Ok(w.len()));
    assert_eq!(twin.state_bytes(), w);
}

#[test]
fn recurrent_rm_false_changes_empties_the_state_of_a_refused_removal() {
    let mut m = recurrent(
        Faults {
            recurrent_rm_false_changes: true,
            ..Faults::default()
        },
        0,
        None,
    );
    m.decode(&toks(5, 0)).unwrap();
    assert_eq!(m.seq_rm(0, 3, -1), Ok(false));
    assert_eq!(range(&m, 0), (-1, -1));
}

#[test]
fn hybrid_accessors_combine_both_parts_and_a_refused_removal_touches_neither() {
    let mut m = hybrid(Faults::default());
    m.decode(&toks(5, 0)).unwrap();
    // min: max of (0, 4); max: min of (4, 4).
    assert_eq!(range(&m, 0), (4, 4));
    assert_eq!(m.seq_rm(0, 3, -1), Ok(false));
    let Memory::Hybrid { attn, .. } = &m else {
        unreachable!()
    };
    assert_eq!(attn.used_cells(), 5);
    assert_eq!(m.seq_rm(0, -1, -1), Ok(true));
    assert_eq!(range(&m, 0), (-1, -1));
    // Dump: the attention memory (n_stream ...), then the recurrent one (cell_count ...).
    m.decode(&toks(2, 1)).unwrap();
    let b = m.state_seq_bytes(1).unwrap();
    let recr_at = 8 + 4 + 4 + 2 * 12 + 8;
    assert_eq!((u32_at(&b, 8), u32_at(&b, 12)), (1, 2));
    assert_eq!((u32_at(&b, recr_at), u32_at(&b, recr_at + 4)), (1, 1));
    let mut twin = hybrid(Faults::default());
    assert_eq!(twin.state_seq_set_bytes(1, &b), Ok(b.len()));
    assert_eq!(twin.state_seq_bytes(1).unwrap(), b);
}

fn hybrid_iswa() -> Memory {
    Memory::new(MemoryConfig {
        cache: CacheConfig {
            n_ctx: 512,
            n_seq_max: 2,
            unified: true,
            faults: Faults::default(),
        },
        kind: MemoryKind::HybridIswa {
            n_swa: N_SWA,
            swa_size: iswa_swa_size(512, N_SWA, true, 2, 1, false),
            n_rs_seq: 0,
            shape: None,
        },
    })
}

#[test]
fn hybrid_iswa_answers_the_window_and_the_states_and_a_partial_dump_leaves_out_the_base() {
    let mut m = hybrid_iswa();
    m.decode(&toks(6, 0)).unwrap();
    assert_eq!(range(&m, 0), (5, 5));
    // A refused partial removal (the recurrent part first) touches no part.
    assert_eq!(m.seq_rm(0, 5, -1), Ok(false));
    let Memory::HybridIswa { base, swa, .. } = &m else {
        unreachable!()
    };
    assert_eq!((base.used_cells(), swa.used_cells()), (6, 6));
    // Dumps: base, windowed, states; PARTIAL_ONLY drops the base cache's section, and a load
    // with the flag reads the windowed cache and the states back.
    let full = m.state_seq_bytes(0).unwrap();
    let partial = m
        .state_seq_bytes_flags(0, STATE_SEQ_FLAGS_PARTIAL_ONLY)
        .unwrap();
    assert!(partial.len() < full.len());
    let mut twin = hybrid_iswa();
    assert_eq!(
        twin.state_seq_set_bytes_flags(1, &partial, STATE_SEQ_FLAGS_PARTIAL_ONLY),
        Ok(partial.len())
    );
    let Memory::HybridIswa { base, swa, .. } = &twin else {
        unreachable!()
    };
    assert_eq!((base.used_cells(), swa.used_cells()), (0, 4));
    assert_eq!(twin.state_seq_set_bytes(0, &full), Ok(full.len()));
    assert_eq!(twin.state_seq_bytes(0).unwrap(), full);
}

#[test]
fn hybrid_rm_one_side_removes_from_the_attention_cache_only() {
    let mut m = hybrid(Faults {
        hybrid_rm_one_side: true,
        ..Faults::default()
    });
    m.decode(&toks(5, 0)).unwrap();
    // llama.cpp refuses (the recurrent part cannot) and keeps both; the fault removes 3..=4 of
    // the attention cache and reports success.
    assert_eq!(m.seq_rm(0, 3, -1), Ok(true));
    assert_eq!(range(&m, 0), (4, 2));
}

/// The iSWA eviction rule, as an oracle would judge it from the accessors around a decode: a
/// decode overwrites only cells masked for their sequence's next token (`seq_pos_max + 1 - pos >=
/// n_swa`) and purges below them, so a sequence's `seq_pos_min` moves at most to
/// `seq_pos_max before + 2 - n_swa`. Returns the first sequence that breaks it over a fixed
/// schedule of decodes into two sequences (and removals, which may legitimately expose evicted
/// positions, and are not judged).
fn first_eviction_breach(faults: Faults) -> Option<(usize, SeqId)> {
    let mut m = iswa(faults, 2);
    for step in 0..200usize {
        let before: Vec<(Pos, Pos)> = (0..2).map(|s| range(&m, s)).collect();
        let seq = if step % 7 < 2 { 1 } else { 0 };
        if step % 50 == 49 {
            m.seq_rm(seq, before[seq as usize].1 - 1, -1).unwrap();
            continue;
        }
        m.decode(&toks(1 + step % 3, seq)).unwrap();
        for s in 0..2 {
            let (min0, max0) = before[s as usize];
            let min1 = range(&m, s).0;
            if max0 >= 0 && min1 > min0.max(max0 + 2 - N_SWA as Pos) {
                return Some((step, s));
            }
        }
    }
    None
}

#[test]
fn iswa_eviction_follows_positions_and_the_off_by_one_breaks_it() {
    assert_eq!(first_eviction_breach(Faults::default()), None);
    let caught = first_eviction_breach(Faults {
        swa_window_off_by_one: true,
        ..Faults::default()
    });
    assert!(caught.is_some(), "the fault is caught by the rule");
}

#[test]
fn a_rollback_restores_the_state_of_the_kept_tokens_and_the_fault_a_stale_plane() {
    // The state after 0..=4 decoded alone: what a rollback to 4 must give back.
    let mut fresh = recurrent(Faults::default(), 3, None);
    fresh.decode(&toks(5, 0)).unwrap();
    let want = fresh.state_digest(0);
    for (fault, same) in [(false, true), (true, false)] {
        let faults = Faults {
            rollback_reads_stale_plane: fault,
            ..Faults::default()
        };
        let mut m = recurrent(faults, 3, None);
        m.decode(&toks(7, 0)).unwrap();
        // One ubatch of 7 wrote planes 0..=3: a rollback of 2 is exact either way.
        assert_eq!(m.seq_rm(0, 5, -1), Ok(true));
        assert_eq!(m.state_digest(0), want);
        // Decodes of 2 and 1 tokens rewrite planes 0..=1 and 0; a rollback of 2 then reads
        // plane 2, which still holds the first decode's state after 0..=4 (0..=5 is wanted).
        m.decode(&toks(2, 0)).unwrap();
        m.decode(&toks(1, 0)).unwrap();
        assert_eq!(range(&m, 0), (7, 7));
        assert_eq!(m.seq_rm(0, 6, -1), Ok(true));
        let mut fresh6 = recurrent(Faults::default(), 3, None);
        fresh6.decode(&toks(6, 0)).unwrap();
        assert_eq!(
            m.state_digest(0) == fresh6.state_digest(0),
            same,
            "fault {fault}"
        );
    }
}

/// An MSA or DSA memory (two caches of one configuration) of 2 sequences.
fn indexed(kind: MemoryKind, faults: Faults) -> Memory {
    Memory::new(MemoryConfig {
        cache: CacheConfig {
            n_seq_max: 2,
            faults,
            ..CacheConfig::default()
        },
        kind,
    })
}

fn msa(faults: Faults) -> Memory {
    indexed(MemoryKind::Msa, faults)
}

fn dsa(faults: Faults) -> Memory {
    indexed(MemoryKind::Dsa, faults)
}

/// The indexer cache's positions of `s` in an MSA or DSA memory, sorted.
fn msa_idx_positions(m: &Memory, s: SeqId) -> Vec<Pos> {
    let (Memory::Msa { idx, .. } | Memory::Dsa { idx, .. }) = m else {
        panic!("an MSA or DSA memory")
    };
    let mut v = idx.seq_positions(s);
    v.sort_unstable();
    v
}

#[test]
fn msa_ops_reach_both_caches_and_the_dump_is_kv_then_indexer() {
    let mut m = msa(Faults::default());
    m.decode(&toks(6, 0)).unwrap();
    assert_eq!(m.seq_rm(0, 5, -1), Ok(true));
    m.seq_cp(0, 1, -1, -1).unwrap();
    assert_eq!(range(&m, 1), (0, 4));
    assert_eq!(msa_idx_positions(&m, 1), vec![0, 1, 2, 3, 4]);
    // The dump carries both caches: a twin loaded from it has the indexer cells too.
    let b = m.state_seq_bytes(1).unwrap();
    let mut twin = msa(Faults::default());
    assert_eq!(twin.state_seq_set_bytes(1, &b), Ok(b.len()));
    assert_eq!(twin.state_seq_bytes(1).unwrap(), b);
    assert_eq!(msa_idx_positions(&twin, 1), vec![0, 1, 2, 3, 4]);
}

#[test]
fn msa_idx_skips_seq_cp_leaves_the_indexer_cache_behind() {
    let mut m = msa(Faults {
        msa_idx_skips_seq_cp: true,
        ..Faults::default()
    });
    m.decode(&toks(6, 0)).unwrap();
    m.seq_cp(0, 1, -1, -1).unwrap();
    // The accessors are the K/V cache's: they see the copy.
    assert_eq!(range(&m, 1), (0, 5));
    assert!(msa_idx_positions(&m, 1).is_empty());
}

#[test]
fn dsa_ops_reach_both_caches_and_a_load_failing_in_the_indexer_part_undoes_the_mla_part() {
    let mut m = dsa(Faults::default());
    m.decode(&toks(6, 0)).unwrap();
    assert_eq!(m.seq_rm(0, 5, -1), Ok(true));
    m.seq_cp(0, 1, -1, -1).unwrap();
    assert_eq!(range(&m, 1), (0, 4));
    assert_eq!(msa_idx_positions(&m, 1), vec![0, 1, 2, 3, 4]);
    // The dump carries both caches: MLA (16 + 12 per cell after the 8-byte header), then the
    // indexer's. Cut 4 bytes into the indexer part, the load fails after the MLA part was read
    // and clears it again (llama-kv-cache-dsa.cpp:168-180 since 0.1.160).
    let b = m.state_seq_bytes(0).unwrap();
    let mla_end = 8 + 16 + 12 * 5;
    assert_eq!(b.len(), mla_end + 16 + 12 * 5);
    let mut twin = dsa(Faults::default());
    assert!(twin.state_seq_set_bytes(1, &b[..mla_end + 8]).is_err());
    assert_eq!(range(&twin, 1), (-1, -1));
    assert!(msa_idx_positions(&twin, 1).is_empty());
    assert_eq!(twin.state_seq_set_bytes(1, &b), Ok(b.len()));
    assert_eq!(msa_idx_positions(&twin, 1), vec![0, 1, 2, 3, 4]);
}

#[test]
fn dsa_faults_leave_the_indexer_cache_behind() {
    let mut m = dsa(Faults {
        dsa_lid_skips_seq_cp: true,
        ..Faults::default()
    });
    m.decode(&toks(6, 0)).unwrap();
    m.seq_cp(0, 1, -1, -1).unwrap();
    // The accessors are the MLA cache's: they see the copy.
    assert_eq!(range(&m, 1), (0, 5));
    assert!(msa_idx_positions(&m, 1).is_empty());

    let b = m.state_seq_bytes(0).unwrap();
    let mut old = dsa(Faults {
        dsa_failed_read_keeps_mla: true,
        ..Faults::default()
    });
    assert!(old
        .state_seq_set_bytes(1, &b[..8 + 16 + 12 * 6 + 8])
        .is_err());
    // 0.1.147-0.1.159: the MLA part stays, the indexer part is emptied.
    assert_eq!(range(&old, 1), (0, 5));
    assert!(msa_idx_positions(&old, 1).is_empty());
}

/// A DSA-iSWA memory of 2 sequences (the DSA pair of 512 cells, a windowed cache of window
/// [`N_SWA`]).
fn dsa_iswa(faults: Faults) -> Memory {
    indexed(
        MemoryKind::DsaIswa {
            n_swa: N_SWA,
            swa_size: iswa_swa_size(512, N_SWA, true, 2, 1, false),
        },
        faults,
    )
}

/// The MLA, indexer and windowed caches' positions of `s` in a DSA-iSWA memory, each sorted.
fn dsa_iswa_positions(m: &Memory, s: SeqId) -> [Vec<Pos>; 3] {
    let Memory::DsaIswa { base, idx, swa } = m else {
        panic!("a DSA-iSWA memory")
    };
    [base, idx, swa].map(|c| {
        let mut v = c.seq_positions(s);
        v.sort_unstable();
        v
    })
}

#[test]
fn dsa_iswa_ops_reach_all_three_caches_and_a_load_failing_in_the_windowed_part_keeps_the_dsa_part()
{
    let mut m = dsa_iswa(Faults::default());
    m.decode(&toks(6, 0)).unwrap();
    m.seq_cp(0, 1, -1, -1).unwrap();
    let all: Vec<Pos> = (0..6).collect();
    assert_eq!(range(&m, 1), (0, 5));
    assert_eq!(
        dsa_iswa_positions(&m, 1),
        [all.clone(), all.clone(), all.clone()]
    );
    // The dump: MLA and indexer (16 + 12 per cell each, after the 8-byte header), then the
    // windowed cache's 4 cells of the window (2..=5).
    let b = m.state_seq_bytes(0).unwrap();
    let dsa_end = 8 + 2 * (16 + 12 * 6);
    assert_eq!(b.len(), dsa_end + 16 + 12 * 4);
    // PARTIAL_ONLY: the windowed cache alone.
    let partial = m
        .state_seq_bytes_flags(0, STATE_SEQ_FLAGS_PARTIAL_ONLY)
        .unwrap();
    assert_eq!(partial.len(), 8 + 16 + 12 * 4);
    // Cut inside the windowed part: the DSA part stays loaded, the accessors (the windowed
    // cache's) say the sequence is empty (llama-kv-cache-dsa-iswa.cpp:244-250 undoes nothing).
    let mut twin = dsa_iswa(Faults::default());
    assert!(twin.state_seq_set_bytes(1, &b[..dsa_end + 8]).is_err());
    assert_eq!(range(&twin, 1), (-1, -1));
    assert_eq!(dsa_iswa_positions(&twin, 1), [all.clone(), all, Vec::new()]);
    // Cut inside the indexer part: the DSA pair's undo empties the MLA cache again.
    let mut twin = dsa_iswa(Faults::default());
    assert!(twin
        .state_seq_set_bytes(1, &b[..8 + 16 + 12 * 6 + 8])
        .is_err());
    assert_eq!(dsa_iswa_positions(&twin, 1), [vec![], vec![], vec![]]);
    // The DSA faults reach the DSA pair of a DSA-iSWA memory too.
    let mut f = dsa_iswa(Faults {
        dsa_lid_skips_seq_cp: true,
        ..Faults::default()
    });
    f.decode(&toks(6, 0)).unwrap();
    f.seq_cp(0, 1, -1, -1).unwrap();
    assert!(dsa_iswa_positions(&f, 1)[1].is_empty());
}
