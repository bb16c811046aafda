//! Tests of the state parser (`super`): every memory type's dump, per sequence and whole.

use super::*;

fn words(ws: &[u32]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_le_bytes()).collect()
}

#[test]
fn empty_sequence() {
    let b = words(&[STATE_SEQ_MAGIC, 1, 1, 0]);
    let s = parse_seq_state(&b, StateFormat::default()).unwrap();
    assert_eq!(s.seq_id, 1);
    assert_eq!(s.resident_positions(), Vec::<Pos>::new());
}

#[test]
fn cells_and_f32_rows() {
    // 2 cells (pos 3 and 1, seq 0), 1 layer, K rows of 8 bytes, V not transposed.
    let mut b = words(&[STATE_SEQ_MAGIC, 0, 1, 2, 3, 1, 0, 1, 1, 0, 0, 1]);
    b.extend(words(&[0])); // K type F32
    b.extend(8u64.to_le_bytes());
    b.extend([1u8; 16]);
    b.extend(words(&[0]));
    b.extend(8u64.to_le_bytes());
    b.extend([2u8; 16]);
    let s = parse_seq_state(&b, StateFormat::default()).unwrap();
    assert_eq!(s.resident_positions(), vec![1, 3]);
    let kv = s.caches[0][0].kv.as_ref().unwrap();
    assert_eq!(
        (kv.n_layer, kv.k[0].data.len(), kv.v[0].data[0]),
        (1, 16, 2)
    );
}

#[test]
fn rot_fields_and_transposed_v() {
    let mut b = words(&[STATE_SEQ_MAGIC, 0, 1, 1, 5, 1, 0, 1, 1, 7, 7]);
    b.extend(words(&[0]));
    b.extend(4u64.to_le_bytes());
    b.extend([9u8; 4]);
    b.extend(words(&[0, 4, 1])); // V type, element bytes, n_embd_v_gqa
    b.extend([8u8; 4]);
    let s = parse_seq_state(
        &b,
        StateFormat {
            rot_fields: true,
            ..Default::default()
        },
    )
    .unwrap();
    let kv = s.caches[0][0].kv.as_ref().unwrap();
    assert_eq!(kv.n_rot, Some((7, 7)));
    assert!(kv.v_trans);
    assert_eq!(kv.v[0].n_embd_v_gqa, 1);
}

#[test]
fn two_caches_are_read_in_turn() {
    let b = words(&[STATE_SEQ_MAGIC, 0, 1, 1, 4, 1, 0, 0, 0, 1, 0]);
    let iswa = StateFormat {
        memory: MemoryType::Iswa,
        ..StateFormat::default()
    };
    let s = parse_seq_state(&b, iswa).unwrap();
    assert_eq!(s.caches.len(), 2);
    assert_eq!(s.resident_positions(), vec![4]);
    assert_eq!(s.second_positions(), Some(vec![]));
    // The same bytes are not a plain cache's dump: an unknown layout is an error.
    let e = parse_seq_state(&b, StateFormat::default()).unwrap_err();
    assert!(e.expected.contains("kv memory"), "{e}");
}

#[test]
fn dsa_caches_have_k_records_only() {
    // Two K-only caches (MLA, then indexer), one cell at pos 2 each, one layer each, v_trans
    // 1 (no flash attention) but no V record: an MLA model keeps no V tensor.
    let cache = |row: u8| {
        let mut c = words(&[1, 1, 2, 1, 0, 1, 1]);
        c.extend(words(&[0]));
        c.extend(4u64.to_le_bytes());
        c.extend([row; 4]);
        c
    };
    let mut b = words(&[STATE_SEQ_MAGIC, 0]);
    b.extend(cache(1));
    b.extend(cache(2));
    let dsa = StateFormat {
        memory: MemoryType::Dsa,
        ..StateFormat::default()
    };
    let s = parse_seq_state(&b, dsa).unwrap();
    assert_eq!(s.resident_positions(), vec![2]);
    assert_eq!(s.second_positions(), Some(vec![2]));
    let kv = s.caches[1][0].kv.as_ref().unwrap();
    assert_eq!((kv.k[0].data, kv.v.len()), (&[2u8; 4][..], 0));
    // Read as MSA's (K and V records), the indexer cache's K record is taken for V.
    let msa = StateFormat {
        memory: MemoryType::Msa,
        ..StateFormat::default()
    };
    assert!(parse_seq_state(&b, msa).is_err());
}

#[test]
fn dsa_iswa_dump_is_mla_indexer_windowed_held_as_the_iswa_pair_then_the_indexer() {
    // Three K-only caches in dump order MLA (pos 1), indexer (pos 2), windowed (pos 3).
    let cache = |pos: u32| {
        let mut c = words(&[1, 1, pos, 1, 0, 1, 1]);
        c.extend(words(&[0]));
        c.extend(4u64.to_le_bytes());
        c.extend([pos as u8; 4]);
        c
    };
    let mut b = words(&[STATE_SEQ_MAGIC, 0]);
    for pos in [1, 2, 3] {
        b.extend(cache(pos));
    }
    let format = StateFormat {
        memory: MemoryType::DsaIswa,
        ..StateFormat::default()
    };
    let s = parse_seq_state(&b, format).unwrap();
    assert_eq!(s.resident_positions(), vec![1]);
    assert_eq!(s.second_positions(), Some(vec![3]));
    assert_eq!(s.third_positions(), Some(vec![2]));
    // A DSA memory's reader stops after two caches: the bytes do not end there.
    let dsa = StateFormat {
        memory: MemoryType::Dsa,
        ..StateFormat::default()
    };
    assert!(parse_seq_state(&b, dsa).is_err());
}

#[test]
fn recurrent_and_hybrid_sections() {
    // One state cell at pos 6 (a per-sequence dump writes no seq ids), s_trans 0, 2 layers,
    // one recurrent layer: R rows of 4 bytes, S rows of 8.
    let mut rec = words(&[1, 6, 0, 0, 2]);
    rec.extend(words(&[0]));
    rec.extend(4u64.to_le_bytes());
    rec.extend([1u8; 4]);
    rec.extend(words(&[0]));
    rec.extend(8u64.to_le_bytes());
    rec.extend([2u8; 8]);
    let recurrent = StateFormat {
        memory: MemoryType::Recurrent,
        ..StateFormat::default()
    };
    let mut b = words(&[STATE_SEQ_MAGIC, 0]);
    b.extend(&rec);
    let s = parse_seq_state(&b, recurrent).unwrap();
    assert_eq!(s.resident_positions(), vec![6]);
    assert_eq!(s.second_positions(), None);
    let r = s.recurrent.as_ref().unwrap();
    assert_eq!((r.r.len(), r.s.len(), r.s[0].row_bytes), (1, 1, 8));
    // Hybrid: an attention cache (one stream, no cells) first.
    let mut h = words(&[STATE_SEQ_MAGIC, 0, 1, 0]);
    h.extend(&rec);
    let hybrid = StateFormat {
        memory: MemoryType::Hybrid,
        ..StateFormat::default()
    };
    let s = parse_seq_state(&h, hybrid).unwrap();
    assert_eq!(s.resident_positions(), Vec::<Pos>::new());
    assert_eq!(s.second_positions(), Some(vec![6]));
    // An odd number of records is not R and S per layer.
    let e = parse_seq_state(&b[..b.len() - 20], recurrent).unwrap_err();
    assert!(e.offset <= b.len(), "{e}");
    // Hybrid-iSWA: the iSWA pair (a base cache with cell 4 and no layer, an empty windowed
    // cache), then the states: three parts.
    let mut hi = words(&[STATE_SEQ_MAGIC, 0, 1, 1, 4, 1, 0, 0, 0, 1, 0]);
    hi.extend(&rec);
    let hybrid_iswa = StateFormat {
        memory: MemoryType::HybridIswa,
        ..StateFormat::default()
    };
    let s = parse_seq_state(&hi, hybrid_iswa).unwrap();
    assert_eq!(s.resident_positions(), vec![4]);
    assert_eq!(s.second_positions(), Some(vec![]));
    assert_eq!(s.third_positions(), Some(vec![6]));
    // Without the windowed cache's section it is a hybrid's dump, not this layout.
    assert!(parse_seq_state(&h, hybrid_iswa).is_err());
}

#[test]
fn broken_bytes_name_the_offset() {
    let e = parse_seq_state(&words(&[0xdead_beef, 0]), StateFormat::default()).unwrap_err();
    assert_eq!(e.offset, 0);
    assert!(e.expected.contains("magic"));
    let e = parse_seq_state(
        &words(&[STATE_SEQ_MAGIC, 0, 1, 2, 0, 1]),
        StateFormat::default(),
    )
    .unwrap_err();
    assert_eq!(e.offset, 24);
    let e = parse_seq_state(
        &words(&[STATE_SEQ_MAGIC, 0, 1, 1, 0, 1, 0, 2]),
        StateFormat::default(),
    )
    .unwrap_err();
    assert!(e.expected.contains("v_trans"), "{e}");
    let e = parse_seq_state(
        &words(&[STATE_SEQ_MAGIC, 0, 1, 1, 0, 1, 0, 0, 1, 0]),
        StateFormat::default(),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("row bytes") || e.to_string().contains("K"),
        "{e}"
    );
}

#[test]
fn half_floats_decode_exactly() {
    for (h, f) in [
        (0x3c00u16, 1.0f32),
        (0xc000, -2.0),
        (0x0001, 2f32.powi(-24)),
        (0x7bff, 65504.0),
        (0x8000, -0.0),
    ] {
        assert_eq!(f16_to_f32(h).to_bits(), f.to_bits(), "{h:#x}");
    }
    assert!(f16_to_f32(0x7e00).is_nan());
}

#[test]
fn rows_decode_per_cell_and_undo_transposed_v() {
    // 2 cells at 0 and 1, 1 layer; K F16 rows of 2 elements; V transposed F32, 2 elements.
    let mut b = words(&[STATE_SEQ_MAGIC, 0, 1, 2, 0, 1, 0, 1, 1, 0, 1, 1]);
    b.extend(words(&[1])); // K type F16
    b.extend(4u64.to_le_bytes());
    for h in [0x3c00u16, 0xc000, 0x0000, 0x7bff] {
        b.extend(h.to_le_bytes());
    }
    b.extend(words(&[0, 4, 2])); // V type F32, element bytes, n_embd_v_gqa
    for x in [1.0f32, 2.0, 3.0, 4.0] {
        b.extend(x.to_le_bytes());
    }
    let r = parse_seq_rows(&b, StateFormat::default()).unwrap();
    assert_eq!(r.n_layer, 1);
    assert_eq!(r.cells[0].k, [vec![1.0, -2.0]]);
    assert_eq!(r.cells[1].k, [vec![0.0, 65504.0]]);
    assert_eq!(
        (&r.cells[0].v, &r.cells[1].v),
        (&vec![vec![1.0, 3.0]], &vec![vec![2.0, 4.0]])
    );
    let mut q = b.clone();
    q[48..52].copy_from_slice(&2i32.to_le_bytes()); // K type Q4_0
    assert_eq!(
        parse_seq_rows(&q, StateFormat::default()).unwrap_err(),
        RowError::UnreadType(2)
    );
}
