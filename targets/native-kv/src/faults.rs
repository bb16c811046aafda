//! Known bug classes, re-created on purpose: the positive controls of a checker pointed at
//! the cache. A plain struct of bools, one per fault, so that adding one is one field, one name.

/// Known bug classes, re-created on purpose. All off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Faults {
    /// `seq_cp` adds the destination to a cell and increments its position count without
    /// checking that the cell already holds the destination: llama.cpp's behaviour from PR 14339
    /// (reference counts, 2025-06) to PR 28040 (2026-08) in release builds, where the
    /// `assert(!seq[i].test(seq_id))` of `llama_kv_cells::seq_add` is compiled out.
    pub refcount: bool,
    /// `seq_rm` treats a closed range end as inclusive (`[p0, p1]` instead of `[p0, p1)`).
    pub seq_rm_off_by_one: bool,
    /// `seq_add` moves cells without re-indexing them: the position index keeps the old
    /// positions (a stale derived index).
    pub seq_add_stale_index: bool,
    /// Tensor payload: `seq_add`/`seq_div` re-rotate a moved key by the position delta (a rotation
    /// composed onto the already rotated key, as llama.cpp's K-shift does) instead of once from its
    /// pre-RoPE row. Caught by T2.
    pub seq_add_delta_rotation: bool,
    /// Tensor payload: the sliding-window bound is read as an index into the sequence's keys
    /// instead of from the positions the cells hold ([`tensors::window_lo_index_keyed`]). Right
    /// until an eviction leaves a gap in the positions. Caught by T3.
    pub window_index_keyed: bool,
    /// Tensor payload: K/V rows land with KV heads 0 and 1 exchanged. Caught by T1.
    pub kv_head_swap: bool,
    /// Tensor payload: the rows of layer `l` land in the slot of layer `n_layer - 1 - l`. Caught
    /// by T1.
    pub kv_layer_swap: bool,
    /// Whole-context and per-sequence loads ([`CellCache::state_set_bytes`],
    /// [`CellCache::state_seq_set_bytes`]) lose the last cell they read, and still report
    /// success. Positive control for the round-trip oracle: a dump loaded into an empty twin no
    /// longer equals the original. Invisible to I1/I2 on one target (the index follows the
    /// removal, no trace op loads state unless it asks to).
    pub restore_drops_last_cell: bool,
    /// When `seq_rm` removes a cell's last sequence, the cell stays used with no sequence (the
    /// model of a `seq_rm` that forgets `used.erase`). Per-sequence dumps and accessors are
    /// unaffected (I1, I2 see nothing); the whole-context dump lists a cell with no sequence.
    /// Positive control for the conservation oracle.
    pub orphan_cell: bool,
    /// `seq_keep` does nothing. Positive control for the contract oracle: llama.h says
    /// `llama_memory_seq_keep` "removes all tokens that do not belong to the specified sequence";
    /// the index stays consistent with the cells, so I1/I2 see nothing.
    pub keep_noop: bool,
    /// Only with one stream per sequence (`kv_unified = false`): a partial `seq_rm` of one
    /// sequence removes the whole sequence. Positive control for the configuration-differential
    /// oracle: the same trace unified and per-sequence differs, while each configuration on its
    /// own stays consistent (I1/I2).
    pub streams_rm_whole: bool,
    /// Tensor payload: a cross-stream `seq_cp` copies the K/V rows of the wrong cells
    /// ([`crate::tensors::TensorStore`]); cells and accessors are right. Caught by cache-invisible.
    pub stream_copy_wrong_rows: bool,
    /// iSWA: the windowed cache's slot search takes a cell as masked one position too early
    /// (`seq_pos_max + 2` where llama.cpp has `seq_pos_max + 1`, src/llama-kv-cache.cpp:1075), so
    /// a decode evicts the oldest position the next token still attends. Positive control for the
    /// `swa eviction` oracle.
    pub swa_window_off_by_one: bool,
    /// Recurrent: a partial `seq_rm` that llama.cpp refuses (returns false, nothing changed)
    /// empties the sequence's state and still returns false. Positive control for the contract
    /// clause "a failed seq_rm changed nothing".
    pub recurrent_rm_false_changes: bool,
    /// Hybrid: `seq_rm` removes from the attention cache only, leaving the recurrent state
    /// (llama.cpp removes from the recurrent memory first and from the attention cache only if
    /// that succeeded, src/llama-memory-hybrid.cpp:143-150).
    pub hybrid_rm_one_side: bool,
    /// Recurrent (and a hybrid's recurrent half): a token that belongs to several sequences is
    /// folded into their shared state once per sequence, as if each sequence's copy of the batch
    /// landed in the one state (llama.cpp folds it once: the sequence set is one state,
    /// `find_slot`, src/llama-memory-recurrent.cpp). Positions and cells are right; only the
    /// state's content differs from decoding each sequence alone. Caught by cache-invisible.
    pub batch_mixes_states: bool,
    /// Recurrent (and a hybrid's recurrent half): a partial `seq_rm` that is refused (false: no
    /// rollback depth) still restores the state's rollback snapshot, which with no depth is the
    /// empty state, and keeps the cell and its position (llama.cpp changes nothing,
    /// src/llama-memory-recurrent.cpp:201-216). Accessors, dumps' cells and the return value
    /// are right. Caught by cache-invisible.
    pub refused_rm_resets_state: bool,
    /// Recurrent (and a hybrid's recurrent half): state saves, whole and per sequence, write
    /// each state as the empty state (the model of a save that writes the cells' metadata and
    /// not the state rows the tokens built). Cells, positions and sequences are right, and a
    /// dump of what a load gives back is the same bytes again, so I1 and round-trip see
    /// nothing; the next token's logits after a load differ from the context's. Positive
    /// control for round-trip-logits and save-load-invisible.
    pub save_drops_state: bool,
    /// Recurrent with a rollback depth (`n_rs_seq` > 0): an accepted rollback of `d` tokens
    /// restores snapshot plane `d` as llama.cpp 0.1.161 keeps its planes: a decode writes only
    /// the planes of its own last `min(n_tokens, n_rs_seq + 1)` tokens (`n_written`,
    /// src/models/lfm2.cpp:209 and mamba-base.cpp), so after a single-token decode, or when the
    /// rollback takes back the whole last decode, plane `d` is stale (upstream #29117, #26695).
    /// Positions, cells and the return value are right. Positive control for rollback.
    pub rollback_reads_stale_plane: bool,
    /// Every memory: a sequence's size call (`llama_state_seq_get_size`) reports 4 bytes more
    /// per sequence beyond the first that the context holds (`n_seq_max - 1`), as a size that
    /// counts a field per possible sequence would; the dump itself is right. Positive control
    /// for state-size: the reported size differs from the bytes written, and by an amount that
    /// scales with `n_seq_max` (upstream #19559's class: a size that scales with what it
    /// should not).
    pub seq_size_scales_with_n_seq_max: bool,
    /// Every memory: a sequence load that fails empties the whole memory (its failure path
    /// clears every sequence, as a `state_clear(-1)` of the whole-context path would) and
    /// still returns 0. Positive control for failed-restore: another sequence changed.
    pub failed_seq_load_clears_all: bool,
    /// MSA (`llama_kv_cache_msa`): `seq_cp` copies in the K/V cache only, so the destination's
    /// indexer keys are missing (the class of upstream #27941, "seq_cp lost the indexer keys",
    /// reported for `llama_memory_hybrid_idx`; `llama_kv_cache_msa::seq_cp` sends it to both,
    /// llama-kv-cache-msa.cpp:66-69). Accessors (the K/V cache's) are right. Positive control
    /// for the contract on the indexer cache and for the differential.
    pub msa_idx_skips_seq_cp: bool,
    /// hybrid_idx (`llama_memory_hybrid_idx`): `seq_cp` copies in the attention cache and the
    /// recurrent memory only, so the destination's indexer keys are missing (upstream #27941;
    /// 0.1.161 sends it to the indexer cache too, llama-memory-hybrid-idx.cpp:206-215).
    /// Accessors (the attention cache's and the states') are right. Positive control for the
    /// contract on the indexer cache and for the differential.
    pub hybrid_idx_skips_seq_cp: bool,
    /// hybrid_idx: a sequence's dump leaves the indexer cache out (upstream #27813, "state_write
    /// drops the indexer cache"; 0.1.161 appends it, llama-memory-hybrid-idx.cpp:259-270), and a
    /// load (of a sequence or the whole context) reads none, so a restored sequence has no
    /// indexer keys: the hybrid's own layout and load. The dump parser reads the missing suffix
    /// as an indexer cache without cells (`base/state/hybrid_idx.rs`). Positive control for the
    /// contract on the indexer cache (`tests/data/oracles/contract_hybrid_idx_state_drops_indexer.json`).
    pub hybrid_idx_state_drops_indexer: bool,
    /// DSA (`llama_kv_cache_dsa`): `seq_cp` copies in the MLA cache only, so the destination
    /// has no indexer keys (upstream #27941's class, "seq_cp lost the indexer keys";
    /// `llama_kv_cache_dsa::seq_cp` sends it to both, llama-kv-cache-dsa.cpp:71-74). Accessors
    /// (the MLA cache's) are right. Positive control for the contract on the indexer cache.
    pub dsa_lid_skips_seq_cp: bool,
    /// DSA: a sequence load whose indexer part fails keeps the MLA part it already restored
    /// (0.1.147-0.1.159's `llama_kv_cache_dsa::state_read`, which had no `state_clear` undo;
    /// upstream #27530/#27068, "a failed restore leaves data behind"). Positive control for
    /// failed-restore on a DSA memory.
    pub dsa_failed_read_keeps_mla: bool,
    /// Recurrent (and a hybrid's recurrent part): a `PARTIAL_ONLY` sequence load restores the
    /// state's cell and position from the bytes and keeps the state's rows the sequence had
    /// before the load (the class of upstream #18552: a partial restore whose next decodes
    /// differ from those after the save). Cells, positions, accessors and plain loads are
    /// right. Positive control for partial-restore.
    pub partial_load_keeps_states: bool,
    /// Recurrent (and a hybrid's recurrent part): `seq_cp` adds the destination to the source's
    /// state cell and leaves it in the cell it had (the model of a `seq_cp` that forgets
    /// `cell_dst.seq_id.erase(seq_id_dst)`, src/llama-memory-recurrent.cpp:277-288 in 0.1.161),
    /// so the destination is in two state cells: its dump lists both and its accessors span
    /// both. The attention cells are right. Positive control for I2 on the hybrid memories, the
    /// only way their present positions (the attention cells within the states' range) can
    /// have a hole.
    pub recurrent_seq_cp_keeps_old_state: bool,
    /// Every memory with a cache of the context's positions: what the memory allocated is
    /// reported with each such cache at the context's `n_ctx` cells per stream, so with one
    /// stream per sequence `n_seq_max` times the context (upstream #19552, fixed by #19559:
    /// `llama_memory_hybrid`'s attention cache made with `cparams.n_ctx` where each stream takes
    /// `n_ctx_seq`, src/llama-model.cpp `attn_kv_size` in 0.1.135). The cells themselves are
    /// right. Positive control for the allocation oracle.
    pub attn_sized_by_n_ctx: bool,
}

impl Faults {
    /// Every fault by name, for command lines and reports.
    pub const NAMES: [&'static str; 29] = [
        "refcount",
        "seq_rm_off_by_one",
        "seq_add_stale_index",
        "seq_add_delta_rotation",
        "window_index_keyed",
        "kv_head_swap",
        "kv_layer_swap",
        "restore_drops_last_cell",
        "orphan_cell",
        "keep_noop",
        "streams_rm_whole",
        "stream_copy_wrong_rows",
        "swa_window_off_by_one",
        "recurrent_rm_false_changes",
        "hybrid_rm_one_side",
        "batch_mixes_states",
        "refused_rm_resets_state",
        "save_drops_state",
        "rollback_reads_stale_plane",
        "seq_size_scales_with_n_seq_max",
        "failed_seq_load_clears_all",
        "msa_idx_skips_seq_cp",
        "hybrid_idx_skips_seq_cp",
        "hybrid_idx_state_drops_indexer",
        "dsa_lid_skips_seq_cp",
        "dsa_failed_read_keeps_mla",
        "partial_load_keeps_states",
        "recurrent_seq_cp_keeps_old_state",
        "attn_sized_by_n_ctx",
    ];

    fn flag_mut(&mut self, name: &str) -> Option<&mut bool> {
        Some(match name {
            "refcount" => &mut self.refcount,
            "seq_rm_off_by_one" => &mut self.seq_rm_off_by_one,
            "seq_add_stale_index" => &mut self.seq_add_stale_index,
            "seq_add_delta_rotation" => &mut self.seq_add_delta_rotation,
            "window_index_keyed" => &mut self.window_index_keyed,
            "kv_head_swap" => &mut self.kv_head_swap,
            "kv_layer_swap" => &mut self.kv_layer_swap,
            "restore_drops_last_cell" => &mut self.restore_drops_last_cell,
            "orphan_cell" => &mut self.orphan_cell,
            "keep_noop" => &mut self.keep_noop,
            "streams_rm_whole" => &mut self.streams_rm_whole,
            "stream_copy_wrong_rows" => &mut self.stream_copy_wrong_rows,
            "swa_window_off_by_one" => &mut self.swa_window_off_by_one,
            "recurrent_rm_false_changes" => &mut self.recurrent_rm_false_changes,
            "hybrid_rm_one_side" => &mut self.hybrid_rm_one_side,
            "batch_mixes_states" => &mut self.batch_mixes_states,
            "refused_rm_resets_state" => &mut self.refused_rm_resets_state,
            "save_drops_state" => &mut self.save_drops_state,
            "rollback_reads_stale_plane" => &mut self.rollback_reads_stale_plane,
            "seq_size_scales_with_n_seq_max" => &mut self.seq_size_scales_with_n_seq_max,
            "failed_seq_load_clears_all" => &mut self.failed_seq_load_clears_all,
            "msa_idx_skips_seq_cp" => &mut self.msa_idx_skips_seq_cp,
            "hybrid_idx_skips_seq_cp" => &mut self.hybrid_idx_skips_seq_cp,
            "hybrid_idx_state_drops_indexer" => &mut self.hybrid_idx_state_drops_indexer,
            "dsa_lid_skips_seq_cp" => &mut self.dsa_lid_skips_seq_cp,
            "dsa_failed_read_keeps_mla" => &mut self.dsa_failed_read_keeps_mla,
            "partial_load_keeps_states" => &mut self.partial_load_keeps_states,
            "recurrent_seq_cp_keeps_old_state" => &mut self.recurrent_seq_cp_keeps_old_state,
            "attn_sized_by_n_ctx" => &mut self.attn_sized_by_n_ctx,
            _ => return None,
        })
    }

    /// Turns on the fault called `name`; `false` if there is no such fault.
    pub fn enable(&mut self, name: &str) -> bool {
        match self.flag_mut(name) {
            Some(f) => {
                *f = true;
                true
            }
            None => false,
        }
    }

    /// The names of the faults that are on.
    pub fn enabled(&self) -> Vec<&'static str> {
        let mut probe = *self;
        Self::NAMES
            .iter()
            .filter(|name| probe.flag_mut(name).is_some_and(|f| *f))
            .copied()
            .collect()
    }
}
