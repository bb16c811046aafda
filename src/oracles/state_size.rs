//! **state-size**: the memory's size as the state calls give it (issue 24 item 3). llama.h
//! promises two things about sizes (include/llama.h:824-827 and :881-884 in 0.1.161):
//! `llama_state_get_size` "Returns the *actual* size in bytes of the state" and
//! `llama_state_seq_get_size` is "the exact size needed to copy the state of a single
//! sequence". So after every op:
//!
//! 1. each size call reports exactly the bytes its data call then writes into a buffer of that
//!    size: the whole dump, and each sequence's dump with flags 0 and with `PARTIAL_ONLY`
//!    (`llama_state_seq_get_size_ext`);
//! 2. a sequence's dump size is a function of that sequence's own content: two sequences whose
//!    dumps hold the same numbers of cells in each part ([`SIZE_LAW`], per memory type) have
//!    dumps of the same size, whatever the other sequences hold (a size that scales with other
//!    sequences' content or with `n_seq_max`, upstream #19559's class, breaks it).
//!
//! The per-type laws, measured on 0.1.156 and 0.1.161 (PREREG.md, "state sizes";
//! `reports/sizes/`), are the table [`SIZE_LAW`]: a new memory type is a row. What the memory
//! allocates (`llama_get_memory_breakdown`, C++ only, src/llama-ext.h) is not observed: see
//! docs/memory-types.md, "The memory's size".

use std::fmt::Write as _;

use serde_json::json;

use super::c_check::{nothing, CCheck};

use super::{Oracle, OracleId, PositiveControl, Reads, Seen, Violation};
use crate::base::cache::{DumpSize, Observe, SeqObservation, StepObservation};
use crate::base::op::MemoryType;

/// Its id.
pub const ID: OracleId = OracleId::builtin(17, "state-size");

/// The kind: the whole dump's size call against its data call.
pub const WHOLE_MISREPORTED: &str = "whole dump: reported size differs from the bytes written";
/// The kind: a sequence's size call against its data call (flags 0).
pub const SEQ_MISREPORTED: &str = "seq dump: reported size differs from the bytes written";
/// The kind: as [`SEQ_MISREPORTED`], with `PARTIAL_ONLY`.
pub const PARTIAL_MISREPORTED: &str =
    "seq dump (PARTIAL_ONLY): reported size differs from the bytes written";
/// The kind: two sequences of the same content counts with dumps of different sizes.
pub const SIZE_NOT_OWN: &str = "two sequences with the same cells have dumps of different sizes";

/// What a sequence's dump size is a function of, per memory type: the counts of the cells its
/// dump holds in each part (the rows a dump writes are per cell, and everything else in it is
/// fixed by the configuration: stream count, layer count, row sizes).
///
/// | memory | a sequence's dump size is a function of |
/// |---|---|
/// | kv | its cells (`4 + 4·n_stream`, then for the stream with cells its header and per cell position, sequence list and K/V rows: llama-kv-cache.cpp `state_write`) |
/// | iswa | its base cells and its windowed cells (each cache's dump as kv's) |
/// | recurrent | its state cells (per cell position, sequence list, r/s rows: llama-memory-recurrent.cpp `state_write`) |
/// | hybrid | its attention cells and its recurrent states |
/// | msa | its K/V cells and its indexer cells (each cache's dump as kv's; not measured yet) |
/// | hybrid_iswa | its base cells, its windowed cells and its recurrent states (the iSWA pair's dumps, then the states; not measured yet) |
/// | hybrid_idx | its attention cells, its indexer cells and its recurrent states (the hybrid's dump, then the indexer cache's: llama-memory-hybrid-idx.cpp:259-270) |
/// | dsv4 | its base cells, its windowed cells and its `seq_pos_max` (the raw pair's K-only dumps; the compressed caches' rows `(pos_max + 1) / ratio`; the compressor states a fixed size: llama-kv-cache-dsv4.cpp:1597-1629) |
/// | dsa | its MLA cells and its indexer cells (each cache's dump as kv's, K rows only: llama-kv-cache-dsa.cpp `state_write`) |
/// | dsa_iswa | its MLA cells, its windowed cells and its indexer cells (the DSA part's dumps, then the windowed cache's, K rows only: llama-kv-cache-dsa-iswa.cpp:236-242) |
pub const SIZE_LAW: [(MemoryType, &str); 10] = [
    (MemoryType::Kv, "its cells"),
    (MemoryType::Iswa, "its base cells and its windowed cells"),
    (MemoryType::Recurrent, "its state cells"),
    (
        MemoryType::Hybrid,
        "its attention cells and its recurrent states",
    ),
    (MemoryType::Msa, "its K/V cells and its indexer cells"),
    (
        MemoryType::HybridIswa,
        "its base cells, its windowed cells and its recurrent states",
    ),
    (
        MemoryType::HybridIdx,
        "its attention cells, its indexer cells and its recurrent states",
    ),
    (
        MemoryType::Dsv4,
        "its base cells, its windowed cells and its seq_pos_max",
    ),
    (MemoryType::Dsa, "its MLA cells and its indexer cells"),
    (
        MemoryType::DsaIswa,
        "its MLA cells, its windowed cells and its indexer cells",
    ),
];

/// The counts a sequence's dump size is a function of ([`SIZE_LAW`]).
pub fn size_key(memory: MemoryType, s: &SeqObservation) -> (usize, usize, usize) {
    let second = s.second_cells.as_ref().map_or(0, Vec::len);
    let third = s.third_cells.as_ref().map_or(0, Vec::len);
    match memory {
        MemoryType::Kv | MemoryType::Recurrent => (s.cells.len(), 0, 0),
        MemoryType::Iswa | MemoryType::Hybrid | MemoryType::Msa => (s.cells.len(), second, 0),
        MemoryType::HybridIswa | MemoryType::HybridIdx => (s.cells.len(), second, third),
        // The compressed caches write the rows `seq_pos_max` implies, `(pos_max + 1) / ratio`
        // (`dsv4_state_n_used_k_rows`, llama-kv-cache-dsv4.cpp:41-49), not cells.
        MemoryType::Dsv4 => (s.cells.len(), second, (s.pos_max + 1).max(0) as usize),
        MemoryType::Dsa => (s.cells.len(), second, 0),
        MemoryType::DsaIswa => (s.cells.len(), second, third),
    }
}

fn misreported(kind: &str, seq: Option<i32>, d: &DumpSize) -> Violation {
    Violation {
        oracle: ID,
        kind: kind.into(),
        seq,
        observed: json!({ "reported": d.reported, "written": d.written }),
        expected: json!({ "reported": d.written }),
    }
}

/// The first breach of the size laws in `after`, if any (`None` also when it holds no sizes).
pub fn check_sizes(memory: MemoryType, after: &StepObservation) -> Option<Violation> {
    let sizes = after.sizes.as_ref()?;
    if sizes.whole.reported != sizes.whole.written {
        return Some(misreported(WHOLE_MISREPORTED, None, &sizes.whole));
    }
    for s in &sizes.seqs {
        if s.full.reported != s.full.written {
            return Some(misreported(SEQ_MISREPORTED, Some(s.seq), &s.full));
        }
        if let Some(p) = s.partial.filter(|p| p.reported != p.written) {
            return Some(misreported(PARTIAL_MISREPORTED, Some(s.seq), &p));
        }
    }
    let keyed: Vec<((usize, usize, usize), &crate::base::cache::SeqSizes)> = sizes
        .seqs
        .iter()
        .filter_map(|z| {
            let s = after.seqs.iter().find(|s| s.seq == z.seq)?;
            Some((size_key(memory, s), z))
        })
        .collect();
    for (i, (ka, a)) in keyed.iter().enumerate() {
        if let Some((_, b)) = keyed[..i]
            .iter()
            .find(|(kb, b)| kb == ka && b.full.written != a.full.written)
        {
            return Some(Violation {
                oracle: ID,
                kind: SIZE_NOT_OWN.into(),
                seq: Some(a.seq),
                observed: json!({
                    "cells": [ka.0, ka.1],
                    "seq": a.seq, "written": a.full.written,
                    "other_seq": b.seq, "other_written": b.full.written,
                }),
                expected: json!({ "written": b.full.written }),
            });
        }
    }
    None
}

/// The oracle, as a value ([`Oracle`]).
pub static STATE_SIZE: Oracle = Oracle {
    id: ID,
    summary: "each state size call reports the bytes its dump writes, and a sequence's size depends on its own cells only",
    reads: Reads::Step,
    kinds: &[
        WHOLE_MISREPORTED,
        SEQ_MISREPORTED,
        PARTIAL_MISREPORTED,
        SIZE_NOT_OWN,
    ],
    positive_controls: &[
        PositiveControl {
            fault: "seq_size_scales_with_n_seq_max",
            target: "native[seq_size_scales_with_n_seq_max]",
            seed_depth: Some(1),
            evidence: "oracles/state_size_scales_with_n_seq_max.json",
        },
        PositiveControl {
            fault: "seq_size_scales_with_n_seq_max",
            target: "native[seq_size_scales_with_n_seq_max] (arch=lfm2_swa)",
            seed_depth: None,
            evidence: "oracles/state_size_scales_with_n_seq_max_hybrid_iswa.json",
        },
        PositiveControl {
            fault: "seq_size_scales_with_n_seq_max",
            target: "native[seq_size_scales_with_n_seq_max] (arch=minimax-m3)",
            seed_depth: None,
            evidence: "oracles/state_size_scales_with_n_seq_max_msa.json",
        },
        PositiveControl {
            fault: "seq_size_scales_with_n_seq_max",
            target: "native[seq_size_scales_with_n_seq_max] (arch=qwen4exp)",
            seed_depth: None,
            evidence: "oracles/state_size_scales_with_n_seq_max_hybrid_idx.json",
        },
        PositiveControl {
            fault: "seq_size_scales_with_n_seq_max",
            target: "native[seq_size_scales_with_n_seq_max] (domain dsa_iswa)",
            seed_depth: None,
            evidence: "oracles/state_size_scales_with_n_seq_max_dsa_iswa.json",
        },
        PositiveControl {
            fault: "seq_size_scales_with_n_seq_max",
            target: "native[seq_size_scales_with_n_seq_max] (arch=glm-dsa)",
            seed_depth: None,
            evidence: "oracles/state_size_scales_with_n_seq_max_dsa.json",
        },
        PositiveControl {
            fault: "seq_size_scales_with_n_seq_max: the llama.cpp target's test hook",
            target: "llama.cpp@0.1.161[seq_size_scales_with_n_seq_max] (domain dsv4)",
            seed_depth: None,
            evidence: "oracles/state_size_scales_with_n_seq_max_dsv4.json",
        },
    ],
    observes: Observe {
        sizes: true,
        ..Observe::BASIC
    },
    check: violation_on,
    ..Oracle::DEFAULTS
};

fn violation_on(seen: &Seen<'_>) -> Option<Violation> {
    match seen {
        Seen::Step { after, arch, .. } => check_sizes(arch.memory(), after),
        _ => None,
    }
}

/// state-size: each size call against the bytes its data call writes into a buffer of that
/// size (the whole dump before the loop; each sequence's with flags 0 and, on a `PARTIAL_ONLY`
/// finding, with flags 1), then the sequences' sizes against their cell counts: two sequences
/// with as many cells (the reader's, the memory's first part) and dumps of different sizes.
pub const C_CHECK: CCheck = CCheck {
    before_last_op: nothing,
    before_seqs: |s, _| {
        let _ = writeln!(s, "    {{ size_t r = llama_state_get_size(ctx); uint8_t *b = malloc(r ? r : 1); size_t w = llama_state_get_data(ctx, b, r); free(b);");
        let _ = writeln!(
            s,
            "      printf(\"whole dump: llama_state_get_size %zu, llama_state_get_data wrote %zu\\n\", r, w);"
        );
        let _ = writeln!(s, "      if (r != w) {{ printf(\"state-size violated: whole dump: reported size differs from the bytes written\\n\"); reproduced = 1; }} }}");
        let _ = writeln!(
            s,
            "    size_t sz_written[64]; int sz_cells[64]; int sz_n = 0;"
        );
    },
    seq: |s, input| {
        let _ = writeln!(s, "        (void)tmin; (void)tmax;");
        let _ = writeln!(s, "        {{ size_t r = llama_state_seq_get_size(ctx, sq); uint8_t *b = malloc(r ? r : 1); size_t w = llama_state_seq_get_data(ctx, b, r, sq); free(b);");
        let _ = writeln!(s, "          printf(\"  seq %d: llama_state_seq_get_size %zu, llama_state_seq_get_data wrote %zu\\n\", sq, r, w);");
        let _ = writeln!(s, "          if (r != w) {{ printf(\"state-size violated: seq dump: reported size differs from the bytes written\\n\"); reproduced = 1; }}");
        let _ = writeln!(
            s,
            "          if (sz_n < 64) {{ sz_written[sz_n] = w; sz_cells[sz_n] = n; sz_n++; }} }}"
        );
        if input.kind == Some(PARTIAL_MISREPORTED) {
            let _ = writeln!(s, "        {{ size_t r = llama_state_seq_get_size_ext(ctx, sq, 1); uint8_t *b = malloc(r ? r : 1); size_t w = llama_state_seq_get_data_ext(ctx, b, r, sq, 1); free(b);");
            let _ = writeln!(s, "          printf(\"  seq %d, PARTIAL_ONLY: llama_state_seq_get_size_ext %zu, llama_state_seq_get_data_ext wrote %zu\\n\", sq, r, w);");
            let _ = writeln!(s, "          if (r != w) {{ printf(\"state-size violated: seq dump (PARTIAL_ONLY): reported size differs from the bytes written\\n\"); reproduced = 1; }} }}");
        }
    },
    after_seqs: |s, input| {
        if input.kind != Some(SIZE_NOT_OWN) {
            let _ = writeln!(s, "    (void)sz_written; (void)sz_cells;");
            return;
        }
        let _ = writeln!(s, "    for (int i = 0; i < sz_n; i++) for (int j = 0; j < i; j++) if (sz_cells[i] == sz_cells[j] && sz_written[i] != sz_written[j]) {{");
        let _ = writeln!(s, "        printf(\"state-size violated: two sequences with the same cells have dumps of different sizes (%d cells: %zu and %zu bytes)\\n\", sz_cells[i], sz_written[j], sz_written[i]); reproduced = 1; }}");
    },
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::cache::{OpOutcome, SeqSizes, StateSizes};

    fn step(seqs: &[(i32, usize, u64, u64)]) -> StepObservation {
        let mut s = StepObservation::basic(
            OpOutcome::Done { returned: None },
            seqs.iter()
                .map(|&(seq, n, _, _)| SeqObservation {
                    seq,
                    pos_min: if n > 0 { 0 } else { -1 },
                    pos_max: n as i32 - 1,
                    cells: (0..n as i32).collect(),
                    second_cells: None,
                    third_cells: None,
                })
                .collect(),
        );
        s.sizes = Some(StateSizes {
            whole: DumpSize {
                reported: 10,
                written: 10,
            },
            seqs: seqs
                .iter()
                .map(|&(seq, _, reported, written)| SeqSizes {
                    seq,
                    full: DumpSize { reported, written },
                    partial: None,
                })
                .collect(),
            allocated: None,
        });
        s
    }

    #[test]
    fn exact_sizes_of_own_content_hold() {
        let s = step(&[(0, 2, 50, 50), (1, 2, 50, 50), (2, 0, 12, 12)]);
        assert!(check_sizes(MemoryType::Kv, &s).is_none());
    }

    #[test]
    fn forced_breaches_are_caught() {
        let s = step(&[(0, 2, 54, 50)]);
        assert_eq!(
            check_sizes(MemoryType::Kv, &s).unwrap().kind,
            SEQ_MISREPORTED
        );
        let s = step(&[(0, 2, 50, 50), (1, 2, 54, 54)]);
        let v = check_sizes(MemoryType::Kv, &s).unwrap();
        assert_eq!((v.kind.as_str(), v.seq), (SIZE_NOT_OWN, Some(1)));
        let mut s = step(&[(0, 1, 5, 5)]);
        s.sizes.as_mut().unwrap().whole.reported = 11;
        assert_eq!(
            check_sizes(MemoryType::Kv, &s).unwrap().kind,
            WHOLE_MISREPORTED
        );
    }

    #[test]
    fn every_memory_type_has_a_size_law() {
        for a in crate::base::op::Arch::ALL {
            assert!(SIZE_LAW.iter().any(|(m, _)| *m == a.memory()), "{a:?}");
        }
    }
}
