//! The built-in presets: their names and one-line summaries, and each preset's setup and argument
//! choices ([`Domain::preset`]). A preset is data the hunt's plan, the CLI's `--domain` and the
//! docs read; adding one is a name, a summary and an arm here.

use super::*;

/// The names of the built-in presets.
pub const PRESETS: [&str; 22] = [
    "seed",
    "wide",
    "streams",
    "state",
    "flags",
    "batch",
    "full",
    "flash",
    "quant",
    "seqids",
    "server",
    "iswa",
    "recurrent",
    "hybrid",
    "rollback",
    "hybrid_iswa",
    "msa",
    "hybrid_idx",
    "dsv4",
    "dsa",
    "dsa_full",
    "dsa_iswa",
];

/// One line per preset: what it exercises.
pub const PRESET_SUMMARIES: [(&str, &str); 22] = [
    ("seed", "the seed documents' domain: unified stream, 2 sequences, the six memory ops"),
    ("wide", "seed with 3 sequences and more ranges, deltas, divisors and decodes"),
    ("streams", "seed with one KV stream per sequence (kv_unified = false, llama.cpp's default)"),
    ("state", "seed plus state save/load of sequences and the whole context, with damaged loads"),
    ("flags", "state plus the _ext saves and loads with flags 1 (PARTIAL_ONLY) and 2 (ON_DEVICE)"),
    ("batch", "decodes split into ubatches (n_ubatch 2), one token into several sequences"),
    ("full", "a context that fills: a decode that does not fit returns 1"),
    ("flash", "seed with flash attention on"),
    ("quant", "seed with q8_0 K/V caches (and flash attention, which quantized V needs) on the llama model with heads 64 wide (llama_hd64), which llama.cpp quantizes and rotates (Hadamard)"),
    ("seqids", "sequence ids at and beyond n_seq_max (2 and 40), which a unified cache may accept"),
    ("server", "like llama-server with 4 slots: one stream per slot, whole-slot copies, slot save/restore, a filling context"),
    ("iswa", "gemma2's iSWA memory (window 4) with a full windowed cache, so decodes evict: ranges and shifts across the window, multi-sequence decodes, state save/load"),
    ("recurrent", "mamba's recurrent memory: partial and whole removals, copies, shifts, multi-sequence decodes, state save/load"),
    ("hybrid", "jamba's hybrid memory (recurrent + attention): the recurrent preset's ops on both parts"),
    ("rollback", "lfm2's hybrid memory with recurrent rollback (n_rs_seq 3): speculative decoding's multi-token decodes, partial seq_rm inside and beyond the snapshot window, decodes again, copies and state save/load"),
    ("hybrid_iswa", "lfm2_swa's hybrid-iSWA memory (short-convolution states + a windowed attention cache of window 4 that evicts): removals inside, across and below the window, refused partial removals, copies, shifts, multi-sequence decodes, state save/load with PARTIAL_ONLY"),
    ("msa", "minimax-m3's MSA memory (a K/V cache and an indexer key cache) with block selection on (flash attention, one stream per sequence): removals that free cells inside blocks, shifts that move positions across blocks, decodes into reused cells, copies, state save/load"),
    ("hybrid_idx", "qwen4exp's hybrid-idx memory (gated-delta-net states + an attention cache + the QSA indexer key cache that mirrors it, blocks of 2 pooled cells): two sequences at the same positions in a unified cache (the hunt adds one stream per sequence), removals that free whole and half blocks, refused partial removals, copies, multi-sequence decodes, state save/load with PARTIAL_ONLY; no shifts (M-RoPE cannot K-shift)"),
    ("dsv4", "deepseek4's DSV4 memory (a raw windowed K cache beside CSA, HCA and indexer compressed K caches and compressor states, one stream per sequence), both sequences past CSA blocks and one past the first HCA block: sequence loads beside another sequence's compressed rows, whole copies, whole saves and loads, refused partial removals, decodes across compression blocks"),
    ("dsa", "glm-dsa's DSA memory (a K-only MLA cache and a lightning-indexer key cache of the full indexer layer; top-4 selection over 7 tokens): removals, shifts (both caches' keys move), copies, multi-sequence decodes into reused cells, state save/load and a load cut inside the indexer part"),
    ("dsa_full", "the dsa preset on deepseek32 (an indexer key on every layer; the architecture 0.1.147, the first pin with llama_kv_cache_dsa, selects it for)"),
    ("dsa_iswa", "dots3note's DSA-iSWA memory (a K-only MLA cache and a lightning-indexer key cache of the full-attention layer beside a windowed K-only cache of window 4 that evicts): the iswa preset's removals inside, across and below the window, shifts, copies, multi-sequence decodes, state save/load with PARTIAL_ONLY, and loads cut inside the indexer part and inside the windowed part"),
];

/// Where the `state` and `server` presets cut a dump before they load it (issue 45: a cut at 12
/// bytes alone ends inside the header on most architectures, so the load failed before it
/// changed anything and the failed-restore predictions on gemma2 and jamba tested nothing). A
/// whole dump starts with the architecture's name (u32 length + 4 to 10 bytes), then the first
/// part's `n_stream` and its first stream's `cell_count`; a sequence dump has no name. 12: the
/// header (on lfm2 alone it ends after `n_stream`, past 0.1.161's clear). 200: inside the first
/// part's K rows, past every cell of the presets' setups, so the first part's own load fails
/// after its clear on every pin and what a memory of several parts does with the others shows
/// (measured with `kvaudit replay` on llama, gemma2, mamba, jamba and lfm2, 0.1.156 and 0.1.161:
/// docs/results.md). A cut inside the cells (40) is left out: there every attention cache keeps
/// the cells read (`failed_restore_truncated_whole_load_keeps_the_cells_read`, the native model
/// too), a known cause the presets' clean runs would then report on every architecture.
const DAMAGED_LOAD_CUTS: [u32; 2] = [12, 200];

/// The iswa preset's setup (gemma2; hybrid_iswa runs it on lfm2_swa): a windowed cache of 256
/// cells that the two sequences fill.
fn preset_iswa_setup() -> Setup {
    Setup {
        n_ctx: 512,
        n_seq_max: 2,
        arch: Arch::Gemma2,
        swa_full: false,
        n_ubatch: Some(16),
        ops: vec![
            Op::Decode(Decode::next(1, 6)),
            Op::Decode(Decode::next(0, 250)),
        ],
        ..Setup::default()
    }
}
impl Domain {
    /// A built-in preset by name.
    pub fn preset(name: &str) -> Option<Domain> {
        let seed = Domain {
            name: "seed".into(),
            setup: Setup {
                n_ctx: 256,
                n_seq_max: 2,
                ops: vec![Op::Decode(Decode::next(0, 7))],
                ..Setup::default()
            },
            seqs: vec![0, 1],
            ranges: vec![[0, 3], [2, 5], [4, 7], [-1, -1]],
            deltas: vec![2, -2],
            divisors: vec![2],
            rm_all: true,
            copies: true,
            keep: true,
            clear: true,
            decode_next: vec![1],
            ..Domain::default()
        };
        let named = |name: &str, setup: Setup| Domain {
            name: name.into(),
            setup,
            ..seed.clone()
        };
        match name {
            "seed" => Some(seed),
            "wide" => Some(Domain {
                name: "wide".into(),
                setup: Setup {
                    n_seq_max: 3,
                    ..seed.setup.clone()
                },
                seqs: vec![0, 1, 2],
                ranges: vec![[0, 3], [2, 5], [4, 7], [3, -1], [-1, -1]],
                deltas: vec![2, -2, -4],
                divisors: vec![2, 3],
                decode_next: vec![1, 2],
                ..seed
            }),
            "streams" => Some(named(
                "streams",
                Setup {
                    kv_unified: false,
                    ..seed.setup.clone()
                },
            )),
            "state" => Some(Domain {
                state: true,
                load_truncate: DAMAGED_LOAD_CUTS.to_vec(),
                ..named("state", seed.setup.clone())
            }),
            "flags" => Some(Domain {
                state: true,
                state_flags: vec![1, 2],
                ..named("flags", seed.setup.clone())
            }),
            "batch" => Some(Domain {
                ranges: vec![[0, 3], [-1, -1]],
                decode_next: vec![1, 5],
                decode_shared: true,
                ..named(
                    "batch",
                    Setup {
                        n_batch: Some(8),
                        n_ubatch: Some(2),
                        ..seed.setup.clone()
                    },
                )
            }),
            "full" => Some(Domain {
                ranges: vec![[0, 3], [-1, -1]],
                decode_next: vec![1, 250],
                ..named("full", seed.setup.clone())
            }),
            "flash" => Some(named(
                "flash",
                Setup {
                    flash_attn: true,
                    ..seed.setup.clone()
                },
            )),
            "quant" => Some(named(
                "quant",
                Setup {
                    arch: Arch::LlamaHd64,
                    flash_attn: true,
                    type_k: CacheType::Q8_0,
                    type_v: CacheType::Q8_0,
                    ..seed.setup.clone()
                },
            )),
            "seqids" => Some(Domain {
                beyond_seqs: vec![2, 40],
                ..named("seqids", seed.setup.clone())
            }),
            "server" => Some(Domain {
                name: "server".into(),
                setup: Setup {
                    n_ctx: 256,
                    n_seq_max: 4,
                    kv_unified: false,
                    n_batch: Some(64),
                    n_ubatch: Some(16),
                    ops: vec![
                        Op::Decode(Decode::next(0, 7)),
                        Op::Decode(Decode::next(1, 5)),
                    ],
                    ..Setup::default()
                },
                seqs: vec![0, 1, 2],
                ranges: vec![[0, 3], [3, -1], [-1, -1]],
                deltas: vec![-2],
                divisors: vec![2],
                rm_all: true,
                copies: true,
                copy_ranges: Some(vec![[-1, -1]]),
                keep: true,
                clear: true,
                decode_next: vec![1, 20, 60],
                decode_shared: false,
                beyond_seqs: Vec::new(),
                state: true,
                state_flags: Vec::new(),
                load_truncate: DAMAGED_LOAD_CUTS.to_vec(),
            }),
            "iswa" => Some(Domain {
                name: "iswa".into(),
                // With swa_full off (llama.cpp's default is on: a windowed cache as large as the
                // base one, which never has to evict) the windowed cache has
                // pad(min(512, 4 * 2 + 16), 256) = 256 cells; the setup
                // fills them (seq 1: 0..5, seq 0: 0..249), so every decode overwrites cells
                // masked for their sequence's next token (src/llama-kv-cache.cpp:1075).
                setup: preset_iswa_setup(),
                // Seq 1's window is 2..5, seq 0's 246..249: ranges inside, across and below.
                ranges: vec![[0, 3], [2, 5], [244, 248], [-1, -1]],
                decode_next: vec![1, 4],
                decode_shared: true,
                state: true,
                ..seed.clone()
            }),
            "recurrent" | "hybrid" => Some(Domain {
                name: name.into(),
                setup: Setup {
                    arch: if name == "recurrent" {
                        Arch::Mamba
                    } else {
                        Arch::Jamba
                    },
                    ..seed.setup.clone()
                },
                // The state sits at position 6: [0, 3) misses it (returns true, nothing moves),
                // [4, 7) is a partial removal (refused: no rollback depth), [0, 7) and
                // [-1, -1) remove it, [7, -1) is beyond it.
                ranges: vec![[0, 3], [4, 7], [0, 7], [7, -1], [-1, -1]],
                decode_next: vec![1, 3],
                decode_shared: true,
                state: true,
                ..seed
            }),
            "hybrid_iswa" => Some(Domain {
                name: "hybrid_iswa".into(),
                // lfm2 with a sliding window: llama_memory_hybrid_iswa (src/llama-model.cpp:2730
                // in 0.1.161). As the iswa preset, the windowed cache (pad(min(512, 4 * 2 + 16),
                // 256) = 256 cells) is filled by the setup (seq 1: 0..5, seq 0: 0..249), so every
                // decode overwrites masked cells; the states sit at 5 and 249.
                setup: Setup {
                    arch: Arch::Lfm2Swa,
                    ..preset_iswa_setup()
                },
                // Seq 1's window is 2..5, seq 0's 246..249. [0, 3) misses both states (true),
                // [2, 5) and [244, 248) cut a window and miss its state, [248, -1) cuts seq 0's
                // state (refused: no rollback depth), [-1, -1) removes the sequence.
                ranges: vec![[0, 3], [2, 5], [244, 248], [248, -1], [-1, -1]],
                decode_next: vec![1, 4],
                decode_shared: true,
                state: true,
                // #18552: PARTIAL_ONLY restores on iSWA and hybrid memories.
                state_flags: vec![1],
                ..seed.clone()
            }),
            "rollback" => Some(Domain {
                name: "rollback".into(),
                // lfm2 is the architecture kvaudit writes whose states roll back on 0.1.161
                // (llm_arch_supports_rs_rollback; mamba and jamba clamp n_rs_seq to 0). The
                // setup decodes 0..=6 in one ubatch, which writes snapshot planes 0..=3.
                setup: Setup {
                    arch: Arch::Lfm2,
                    n_rs_seq: 3,
                    ..seed.setup.clone()
                },
                // From the state at 6: [6, -1), [5, -1) and [4, -1) roll back 1, 2 and 3 tokens
                // (accepted), [3, -1) four (deeper than n_rs_seq: refused), [0, 3) misses the
                // state, [-1, -1) removes the sequence. After a decode of 1 or 3 more tokens the
                // same ranges take back more.
                ranges: vec![[6, -1], [5, -1], [4, -1], [3, -1], [0, 3], [-1, -1]],
                copy_ranges: Some(vec![[-1, -1]]),
                deltas: Vec::new(),
                divisors: Vec::new(),
                rm_all: false,
                clear: false,
                decode_next: vec![1, 3],
                state: true,
                ..seed
            }),
            "msa" => Some(Domain {
                name: "msa".into(),
                // Block selection runs with flash attention on and one stream per sequence
                // (`msa_enabled`, src/models/minimax-m3.cpp); F32 K/V so that the logits probes
                // are judged with flash attention on (an F16 V summed in F16 is not:
                // `v_summed_in_f16`). 14 tokens fill blocks 0..=3 of 4 positions, so the top 2
                // blocks (the local one and the best other) leave two out: selection matters.
                setup: Setup {
                    arch: Arch::MinimaxM3,
                    flash_attn: true,
                    kv_unified: false,
                    type_k: CacheType::F32,
                    type_v: CacheType::F32,
                    ops: vec![Op::Decode(Decode::next(0, 14))],
                    ..seed.setup.clone()
                },
                // #26338 (block selection was tied to cell indices, right only for append-only
                // streams): a removal of a whole block [4, 8), one across a block edge [2, 5)
                // and the tail [12, -1) free cells the next decode reuses at other positions;
                // shifts by a whole block and half of one move positions across blocks.
                ranges: vec![[4, 8], [2, 5], [12, -1], [-1, -1]],
                deltas: vec![4, -2],
                divisors: vec![2],
                decode_next: vec![1, 5],
                decode_shared: true,
                state: true,
                ..seed
            }),
            "hybrid_idx" => Some(Domain {
                name: "hybrid_idx".into(),
                // qwen4exp: llama_memory_hybrid_idx (src/llama-model.cpp:2694-2730 in 0.1.161).
                // #27994 and #27752 (with kv_unified, the indexer's blocks were keyed by
                // position only, so sequences collided): a unified cache with both sequences
                // at positions 0..=7 (blocks of KPOOL = 2 cells: four full blocks each); the
                // hunt pairs the preset with one stream per sequence (`PAIRS_EVERYWHERE`).
                setup: Setup {
                    arch: Arch::Qwen4exp,
                    kv_unified: true,
                    ops: vec![
                        Op::Decode(Decode::next(0, 8)),
                        Op::Decode(Decode::next(1, 8)),
                    ],
                    ..seed.setup.clone()
                },
                // The states sit at 7: [0, 2) and [2, 5) miss them (a whole block and a block
                // and a half freed), [4, 8) is a partial removal (refused: no rollback depth),
                // [8, -1) is beyond them, [-1, -1) removes the sequence. #27941 (seq_cp lost the
                // indexer keys) and #27813 (state_write dropped the indexer cache): copies and
                // state round trips, judged on the indexer cache by contract.
                ranges: vec![[0, 2], [2, 5], [4, 8], [8, -1], [-1, -1]],
                // M-RoPE cannot K-shift (`get_can_shift`, src/llama-kv-cache.cpp:1213-1215):
                // a seq_add or seq_div would abort the next decode's update.
                deltas: Vec::new(),
                divisors: Vec::new(),
                decode_next: vec![1, 3],
                decode_shared: true,
                state: true,
                state_flags: vec![1],
                ..seed
            }),
            "dsv4" => Some(Domain {
                name: "dsv4".into(),
                // F32 K so that the logits probes are judged; one stream per sequence, which the
                // cache keeps whatever `kv_unified` says (llama-kv-cache-dsv4.cpp:1244-1245).
                // Sequence 1 holds 6 tokens (one CSA block of 4 compressed, two in the
                // compressor state) and sequence 0 130 (past the first HCA block of 128: #26063
                // diverged from 129 tokens on).
                setup: Setup {
                    arch: Arch::Deepseek4,
                    kv_unified: false,
                    type_k: CacheType::F32,
                    type_v: CacheType::F32,
                    ops: vec![
                        Op::Decode(Decode::next(1, 6)),
                        Op::Decode(Decode::next(0, 130)),
                    ],
                    ..seed.setup.clone()
                },
                // #25588 / #26063 / #26790: the removals dsv4 takes are whole ones and those
                // past the end ([200, -1]); a partial one is refused without `n_rs_seq`
                // ([4, -1]) and so is any with p1 >= 0 ([0, 3]) (`seq_rm`, :1462-1513). Copies
                // are whole only: a partial one aborts (`seq_cp`, :1515-1516), and shifts are
                // left out: the memory cannot shift (`get_can_shift`, :1451-1455).
                ranges: vec![[-1, -1], [200, -1], [4, -1], [0, 3]],
                copy_ranges: Some(vec![[-1, -1]]),
                deltas: Vec::new(),
                divisors: Vec::new(),
                decode_next: vec![1, 4],
                state: true,
                ..seed
            }),
            "dsa" | "dsa_full" => Some(Domain {
                name: name.into(),
                // F32 K/V (an MLA cache's K and V types must agree, llama-context.cpp:3838), so
                // the dump sizes below are exact. 7 tokens: the indexer's top 4 leave 3 out.
                setup: Setup {
                    arch: if name == "dsa" {
                        Arch::GlmDsa
                    } else {
                        Arch::Deepseek32
                    },
                    type_k: CacheType::F32,
                    type_v: CacheType::F32,
                    ops: vec![Op::Decode(Decode::next(0, 7))],
                    ..seed.setup.clone()
                },
                // Upstream's indexer-cache threads are about seq_cp (#27941, #25588) and state
                // (#27813, #26790): copies of every range, removals inside and at the tail that
                // free cells the next decode reuses, shifts (the indexer keys are roped too:
                // `hparams_lid.rope_type`, llama-kv-cache-dsa.cpp:47), decodes into two
                // sequences at once.
                ranges: vec![[2, 5], [4, -1], [-1, -1]],
                deltas: vec![3, -2],
                divisors: vec![2],
                decode_next: vec![1, 5],
                decode_shared: true,
                state: true,
                // A sequence dump is the MLA part (56 + 108·c bytes with the header, c cells)
                // then the indexer part (36 + 268·c on glm-dsa, 48 + 524·c on deepseek32): cut
                // at 820 bytes, a dump of 2 to 7 cells fails inside the indexer part, after the
                // MLA part was restored (#27530's class: what does the failed load leave?). The
                // native memory's dumps carry no rows (24 + 12·c, then 16 + 12·c): cut at 120,
                // a dump of 4 to 7 cells fails there (llama.cpp's, inside the MLA part).
                load_truncate: vec![120, 820],
                ..seed
            }),
            "dsa_iswa" => Some(Domain {
                name: "dsa_iswa".into(),
                // dots3note: llama_kv_cache_dsa_iswa (src/llama-model.cpp:2543-2595 in 0.1.161).
                // As the iswa preset, the windowed cache (pad(min(512, 4 * 2 + 16), 256) = 256
                // cells, llama-kv-cache-dsa-iswa.cpp:53) is filled by the setup (seq 1: 0..5,
                // seq 0: 0..249), so every decode overwrites masked cells; the DSA part holds 512.
                // F32 K (the MLA cache's K and V types must agree), so the dump sizes are exact.
                setup: Setup {
                    arch: Arch::Dots3note,
                    type_k: CacheType::F32,
                    type_v: CacheType::F32,
                    ..preset_iswa_setup()
                },
                // Seq 1's window is 2..5, seq 0's 246..249: ranges inside, across and below.
                ranges: vec![[0, 3], [2, 5], [244, 248], [-1, -1]],
                decode_next: vec![1, 4],
                decode_shared: true,
                state: true,
                // #18552: PARTIAL_ONLY (the windowed cache alone, :236-250).
                state_flags: vec![1],
                // A sequence dump is the MLA part (44 + 60·c bytes with the header, c cells),
                // the indexer part (36 + 268·c) and the windowed part (36 + 60·w, w <= 4 cells
                // of the window): seq 1's 6 cells give 404, 2048 and 2324 bytes. Cut at 1000, a
                // dump of 3 to 6 cells fails inside the indexer part (0.1.160 on undoes the MLA
                // part, 0.1.157 does not); cut at 2200, one of 6 cells fails inside the windowed
                // part, after the whole DSA part was restored (`state_read` undoes nothing there).
                load_truncate: vec![1000, 2200],
                ..seed
            }),
            _ => None,
        }
    }
}
