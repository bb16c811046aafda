//! The memory a llama.cpp context gets from its model's architecture (`llama_model::create_memory`,
//! src/llama-model.cpp), behind one API as `llama_memory_i`: an attention cache ([`CellCache`]),
//! an iSWA pair of caches, a recurrent memory ([`RecurrentCache`]), or the hybrid of an attention
//! cache and a recurrent memory.
//!
//! - **iSWA** (`llama_kv_cache_iswa`, src/llama-kv-cache-iswa.cpp, the same in 0.1.156 and
//!   0.1.161): a full cache (`kv_base`) and a windowed one (`kv_swa`, [`CellCache::windowed`])
//!   of [`iswa_swa_size`] cells per stream. Every op goes to both, base first (:111-140);
//!   `seq_rm` returns the AND of both (:115-121); `seq_pos_min`/`seq_pos_max` are the windowed
//!   cache's (:142-149: "the base cache is a superset of the SWA cache"); a decode validates
//!   against those accessors, and both caches must find slots before either places a token
//!   (`init_batch` prepares both, :171-240). Dumps: the base cache's memory, then the windowed
//!   cache's (`state_write`, :254-260), each in the attention layout (`n_stream`, per stream the
//!   cells and the K/V section); the windowed part of a per-sequence dump leaves out the cells
//!   masked for the sequence's largest position.
//! - **Recurrent** (`llama_memory_recurrent`): see [`crate::recurrent`]. Dumps: the recurrent
//!   layout (no `n_stream`).
//! - **Hybrid** (`llama_memory_hybrid`, src/llama-memory-hybrid.cpp): an attention cache and a
//!   recurrent memory. `seq_rm` goes to the recurrent memory first and, only if it succeeded, to
//!   the attention cache (:143-150: false leaves both as they were); the other ops go to both,
//!   attention first (:152-170); `seq_pos_min` is the larger of the two minima and `seq_pos_max`
//!   the smaller of the two maxima (:172-180). Dumps: the attention memory, then the recurrent
//!   one (:190-195). A sequence load whose recurrent part fails empties the sequence from the
//!   attention cache too (0.1.161 :197-214; 0.1.156 leaves the attention part loaded).
//!
//! - **Hybrid-iSWA** (`llama_memory_hybrid_iswa`, src/llama-memory-hybrid-iswa.cpp, 0.1.161): the
//!   iSWA pair beside a recurrent memory. `seq_rm` goes to the recurrent memory first and, only
//!   if it succeeded, to the pair (whose answer is the AND of both caches'); the other ops go to
//!   the pair, then the recurrent memory; `seq_pos_min`/`seq_pos_max` are the larger minimum and
//!   the smaller maximum of the pair's (the windowed cache's) and the states'. A decode prepares
//!   the recurrent memory, then the base, then the windowed cache (`init_batch`). Dumps: the
//!   pair's, then the recurrent memory's (`state_write`); a load reads them in that order and,
//!   unlike the hybrid, undoes nothing when the recurrent part fails (`state_read`).
//! - **MSA** (`llama_kv_cache_msa`, src/llama-kv-cache-msa.cpp, 0.1.161): the K/V cache of every
//!   layer (`kv_base`) and the indexer key cache of the sparse layers (`kv_idx`), both of the
//!   same size. Every op goes to both, base first (:52-84); `seq_rm` returns the AND of both
//!   (:57-64); the accessors are the base cache's (:86-92); a decode prepares both before either
//!   places (`init_batch`, :102-144). Dumps: the base cache's memory, then the indexer cache's
//!   (:160-168), each in the attention layout (no window: the indexer cache dumps every cell).
//! - **Hybrid-idx** (`llama_memory_hybrid_idx`, src/llama-memory-hybrid-idx.cpp, 0.1.157 on;
//!   lines of 0.1.161): the hybrid, plus an indexer key cache (`mem_idx`) of the attention
//!   cache's size that takes every op after the hybrid's parts (`seq_rm` between the recurrent
//!   memory's and the attention cache's, :185-204; the others after both, :206-245) and, in a
//!   decode, the attention cache's own slots (`heads_idx = heads_attn`, `init_batch` :127-131).
//!   Its pooled-key staleness (`mem_idx_stale`) is graph input, not bookkeeping: not modelled.
//!   Dumps: the hybrid's, then the indexer cache's (:259-270; `PARTIAL_ONLY` leaves out both
//!   caches); the attention cache's cells carry a cell ext ([`CellCache::with_cell_ext`]), the
//!   indexer cache's do not, and neither writes K/V records (no rows), so the indexer cache
//!   is K-only as llama.cpp's MLA-shaped one is. A load reads them in that order and a failure drops the sequence from all three
//!   parts (`state_drop`, :272-329; a whole load clears the memory).
//! - **DSA** (`llama_kv_cache_dsa`, src/llama-kv-cache-dsa.cpp, 0.1.161): MSA's bookkeeping with
//!   the K-only MLA cache (`kv_mla`) and the lightning-indexer key cache (`kv_lid`): every op to
//!   both, MLA first (:59-90), `seq_rm` the AND (:62-69), the MLA cache's accessors (:92-98), both
//!   prepared per decode (`init_batch`, :104-145), dumps MLA then indexer (:163-166); a load whose
//!   indexer part fails clears the sequence (a whole load: the whole MLA cache) from the MLA
//!   cache again (`state_clear`, :168-180,
//!   since 0.1.160). The native caches carry no rows, so the dump has no K/V records at all.
//! - **DSA-iSWA** (`llama_kv_cache_dsa_iswa`, src/llama-kv-cache-dsa-iswa.cpp, 0.1.157 on, the
//!   same in 0.1.161): the DSA pair (`kv_dsa`: MLA and indexer caches) of the full-attention
//!   layers beside a windowed cache (`kv_swa`, [`CellCache::windowed`], of [`iswa_swa_size`]
//!   cells, :53). Every op goes to the DSA pair, then the windowed cache (:78-110); `seq_rm` the
//!   AND of the three; the accessors are the windowed cache's (:112-119), as an iSWA pair's; a
//!   decode prepares MLA, indexer and windowed caches before any places (`init_batch`,
//!   :129-220). Dumps: MLA, indexer, windowed (`state_write`, :236-242; `PARTIAL_ONLY` the
//!   windowed cache alone); a load reads them in that order, the DSA pair with its own undo,
//!   and undoes nothing when the windowed part fails (`state_read`, :244-250).
//!
//! Whole-context dumps start with the architecture name ([`crate::STATE_ARCH`]), per-sequence
//! dumps with the magic and the sequence id, as the attention cache's.

use crate::batch::{check_batch, SeqRanges};
use crate::recurrent::{RecurrentCache, RecurrentConfig, RecurrentShape};
use crate::state::{read_arch, read_seq_header, StateReader};
mod dump;

use crate::{
    BatchToken, CacheConfig, CacheError, CellCache, DecodeError, Pos, RestoreError, SeqId,
};

/// `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY` (= `SWA_ONLY`, llama.h): a sequence's dump of the partial
/// states only (see [`Memory::state_seq_bytes_flags`]).
pub const STATE_SEQ_FLAGS_PARTIAL_ONLY: u32 = 1;

/// Which memory, with what its type adds to a [`CacheConfig`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryKind {
    /// `llama_kv_cache`.
    Kv,
    /// `llama_kv_cache_iswa`: the window and the windowed cache's cells per stream
    /// ([`iswa_swa_size`]).
    Iswa {
        /// The window (`n_swa`, > 0).
        n_swa: u32,
        /// Cells per stream of the windowed cache.
        swa_size: u32,
    },
    /// `llama_kv_cache_msa`: two caches of the [`CacheConfig`].
    Msa,
    /// `llama_kv_cache_dsa`: two caches of the [`CacheConfig`].
    Dsa,
    /// `llama_kv_cache_dsa_iswa`: the DSA pair of the [`CacheConfig`] and a windowed cache.
    DsaIswa {
        /// The window (`n_swa`, > 0).
        n_swa: u32,
        /// Cells per stream of the windowed cache.
        swa_size: u32,
    },
    /// `llama_memory_recurrent` with rollback depth `n_rs_seq`.
    Recurrent {
        /// `llama_context_params::n_rs_seq`.
        n_rs_seq: u32,
        /// The state rows a dump carries, if any.
        shape: Option<RecurrentShape>,
    },
    /// `llama_memory_hybrid_iswa`: the iSWA pair and a recurrent memory.
    HybridIswa {
        /// The window (`n_swa`, > 0).
        n_swa: u32,
        /// Cells per stream of the windowed cache.
        swa_size: u32,
        /// `llama_context_params::n_rs_seq`.
        n_rs_seq: u32,
        /// The recurrent state rows a dump carries, if any.
        shape: Option<RecurrentShape>,
    },
    /// `llama_memory_hybrid_idx`: an attention cache and an indexer key cache of the
    /// [`CacheConfig`] and a recurrent memory.
    HybridIdx {
        /// `llama_context_params::n_rs_seq`.
        n_rs_seq: u32,
        /// The recurrent state rows a dump carries, if any.
        shape: Option<RecurrentShape>,
    },
    /// `llama_memory_hybrid`: an attention cache of the [`CacheConfig`] and a recurrent memory.
    Hybrid {
        /// `llama_context_params::n_rs_seq`.
        n_rs_seq: u32,
        /// The recurrent state rows a dump carries, if any.
        shape: Option<RecurrentShape>,
    },
}

/// The configuration of a [`Memory`]: the attention cache's (for a recurrent memory only
/// `n_seq_max` and the faults count) and the kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryConfig {
    /// The attention cache (iSWA: the base cache).
    pub cache: CacheConfig,
    /// Which memory.
    pub kind: MemoryKind,
}

/// The windowed cache's cells per stream, as `llama_kv_cache_iswa` sizes it
/// (src/llama-kv-cache-iswa.cpp:73-81, both pins): `pad(min(base, n_swa * (unified ? n_seq_max :
/// 1) + n_ubatch), 256)`, or `base` with `swa_full`.
pub fn iswa_swa_size(
    base: u32,
    n_swa: u32,
    unified: bool,
    n_seq_max: u32,
    n_ubatch: u32,
    swa_full: bool,
) -> u32 {
    if swa_full {
        return base;
    }
    let per = if unified { n_seq_max } else { 1 };
    let want = u64::from(n_swa) * u64::from(per) + u64::from(n_ubatch);
    let n = want.min(u64::from(base));
    (n.div_ceil(256) * 256) as u32
}

/// A memory of any kind (see the module docs).
#[derive(Clone, Debug)]
pub enum Memory {
    /// An attention cache.
    Kv(CellCache),
    /// A full and a windowed cache.
    Iswa {
        /// `kv_base`.
        base: CellCache,
        /// `kv_swa`.
        swa: CellCache,
    },
    /// The K/V cache and the indexer key cache of an MSA memory.
    Msa {
        /// `kv_base`.
        base: CellCache,
        /// `kv_idx`.
        idx: CellCache,
    },
    /// The MLA cache and the lightning-indexer key cache of a DSA memory.
    Dsa {
        /// `kv_mla`.
        base: CellCache,
        /// `kv_lid`.
        idx: CellCache,
    },
    /// The DSA pair and the windowed cache of a DSA-iSWA memory.
    DsaIswa {
        /// `kv_dsa`'s `kv_mla`.
        base: CellCache,
        /// `kv_dsa`'s `kv_lid`.
        idx: CellCache,
        /// `kv_swa`.
        swa: CellCache,
    },
    /// A recurrent memory.
    Recurrent(RecurrentCache),
    /// An attention cache and a recurrent memory.
    Hybrid {
        /// `mem_attn`.
        attn: CellCache,
        /// `mem_recr`.
        recr: RecurrentCache,
    },
    /// A hybrid memory and the indexer key cache that mirrors its attention cache.
    HybridIdx {
        /// `mem_attn`.
        attn: CellCache,
        /// `mem_recr`.
        recr: RecurrentCache,
        /// `mem_idx`.
        idx: CellCache,
    },
    /// The iSWA pair and a recurrent memory.
    HybridIswa {
        /// `mem_attn`'s `kv_base`.
        base: CellCache,
        /// `mem_attn`'s `kv_swa`.
        swa: CellCache,
        /// `mem_recr`.
        recr: RecurrentCache,
    },
}

impl Memory {
    /// An empty memory.
    ///
    /// # Panics
    /// As [`CellCache::new`].
    pub fn new(config: MemoryConfig) -> Self {
        let c = config.cache;
        let windowed = |n_ctx, n_swa| CellCache::windowed(CacheConfig { n_ctx, ..c }, n_swa);
        let recurrent = |n_rs_seq, shape| {
            RecurrentCache::new(RecurrentConfig {
                n_seq_max: c.n_seq_max,
                n_rs_seq,
                shape,
                faults: c.faults,
            })
        };
        match config.kind {
            MemoryKind::Kv => Memory::Kv(CellCache::new(c)),
            MemoryKind::Iswa { n_swa, swa_size } => Memory::Iswa {
                base: CellCache::new(c),
                swa: windowed(swa_size, n_swa),
            },
            MemoryKind::HybridIswa {
                n_swa,
                swa_size,
                n_rs_seq,
                shape,
            } => Memory::HybridIswa {
                base: CellCache::new(c),
                swa: windowed(swa_size, n_swa),
                recr: recurrent(n_rs_seq, shape),
            },
            MemoryKind::Msa => Memory::Msa {
                base: CellCache::new(c),
                idx: CellCache::new(c),
            },
            MemoryKind::Dsa => Memory::Dsa {
                base: CellCache::new(c),
                idx: CellCache::new(c),
            },
            MemoryKind::DsaIswa { n_swa, swa_size } => Memory::DsaIswa {
                base: CellCache::new(c),
                idx: CellCache::new(c),
                swa: windowed(swa_size, n_swa),
            },
            MemoryKind::Recurrent { n_rs_seq, shape } => {
                Memory::Recurrent(recurrent(n_rs_seq, shape))
            }
            MemoryKind::Hybrid { n_rs_seq, shape } => Memory::Hybrid {
                attn: CellCache::new(c),
                recr: recurrent(n_rs_seq, shape),
            },
            MemoryKind::HybridIdx { n_rs_seq, shape } => Memory::HybridIdx {
                // qwen4exp's IMRoPE cache writes cell exts; the indexer cache (rope type NONE,
                // llama-memory-hybrid-idx.cpp:60-62) does not.
                attn: CellCache::with_cell_ext(c),
                recr: recurrent(n_rs_seq, shape),
                idx: CellCache::new(c),
            },
        }
    }

    /// The attention cache, for a plain KV memory.
    pub fn as_kv(&self) -> Option<&CellCache> {
        match self {
            Memory::Kv(c) => Some(c),
            _ => None,
        }
    }

    /// `Ok` when `s` names a sequence of this memory.
    pub fn check_seq(&self, s: SeqId) -> Result<(), CacheError> {
        match self {
            Memory::Kv(c)
            | Memory::Iswa { base: c, .. }
            | Memory::Msa { base: c, .. }
            | Memory::Dsa { base: c, .. }
            | Memory::DsaIswa { base: c, .. }
            | Memory::Hybrid { attn: c, .. }
            | Memory::HybridIdx { attn: c, .. }
            | Memory::HybridIswa { base: c, .. } => c.check_seq(s),
            Memory::Recurrent(r) => r.check_seq(s),
        }
    }

    /// `llama_memory_clear`.
    pub fn clear(&mut self) {
        match self {
            Memory::Kv(c) => c.clear(),
            Memory::Iswa { base, swa }
            | Memory::Msa { base, idx: swa }
            | Memory::Dsa { base, idx: swa } => {
                base.clear();
                swa.clear();
            }
            Memory::Recurrent(r) => r.clear(),
            Memory::Hybrid { attn, recr } => {
                attn.clear();
                recr.clear();
            }
            Memory::HybridIswa { base, swa, recr } => {
                base.clear();
                swa.clear();
                recr.clear();
            }
            Memory::DsaIswa { base, idx, swa } => {
                base.clear();
                idx.clear();
                swa.clear();
            }
            Memory::HybridIdx { attn, recr, idx } => {
                attn.clear();
                recr.clear();
                idx.clear();
            }
        }
    }

    /// `llama_memory_seq_rm`.
    pub fn seq_rm(&mut self, seq: SeqId, p0: Pos, p1: Pos) -> Result<bool, CacheError> {
        match self {
            Memory::Kv(c) => c.seq_rm(seq, p0, p1),
            Memory::Iswa { base, swa }
            | Memory::Msa { base, idx: swa }
            | Memory::Dsa { base, idx: swa } => {
                let a = base.seq_rm(seq, p0, p1)?;
                let b = swa.seq_rm(seq, p0, p1)?;
                Ok(a & b)
            }
            Memory::DsaIswa { base, idx, swa } => {
                let a = base.seq_rm(seq, p0, p1)?;
                let b = idx.seq_rm(seq, p0, p1)?;
                let c = swa.seq_rm(seq, p0, p1)?;
                Ok(a & b & c)
            }
            Memory::Recurrent(r) => Ok(r.seq_rm(seq, p0, p1)),
            Memory::Hybrid { attn, recr } => {
                if seq >= 0 {
                    attn.check_seq(seq)?;
                }
                if !attn.config().faults.hybrid_rm_one_side && !recr.seq_rm(seq, p0, p1) {
                    return Ok(false);
                }
                attn.seq_rm(seq, p0, p1)
            }
            Memory::HybridIswa { base, swa, recr } => {
                if seq >= 0 {
                    base.check_seq(seq)?;
                }
                if !base.config().faults.hybrid_rm_one_side && !recr.seq_rm(seq, p0, p1) {
                    return Ok(false);
                }
                let a = base.seq_rm(seq, p0, p1)?;
                let b = swa.seq_rm(seq, p0, p1)?;
                Ok(a & b)
            }
            Memory::HybridIdx { attn, recr, idx } => {
                if seq >= 0 {
                    attn.check_seq(seq)?;
                }
                if !attn.config().faults.hybrid_rm_one_side && !recr.seq_rm(seq, p0, p1) {
                    return Ok(false);
                }
                idx.seq_rm(seq, p0, p1)?;
                attn.seq_rm(seq, p0, p1)
            }
        }
    }

    /// `llama_memory_seq_cp`.
    pub fn seq_cp(&mut self, src: SeqId, dst: SeqId, p0: Pos, p1: Pos) -> Result<(), CacheError> {
        match self {
            Memory::Kv(c) => c.seq_cp(src, dst, p0, p1),
            Memory::Iswa { base, swa } => {
                base.seq_cp(src, dst, p0, p1)?;
                swa.seq_cp(src, dst, p0, p1)
            }
            Memory::Msa { base, idx } => {
                base.seq_cp(src, dst, p0, p1)?;
                if base.config().faults.msa_idx_skips_seq_cp {
                    return Ok(());
                }
                idx.seq_cp(src, dst, p0, p1)
            }
            Memory::Dsa { base, idx } => dsa_seq_cp(base, idx, src, dst, p0, p1),
            Memory::DsaIswa { base, idx, swa } => {
                dsa_seq_cp(base, idx, src, dst, p0, p1)?;
                swa.seq_cp(src, dst, p0, p1)
            }
            Memory::Recurrent(r) => r.seq_cp(src, dst, p0, p1),
            Memory::Hybrid { attn, recr } => {
                attn.seq_cp(src, dst, p0, p1)?;
                recr.seq_cp(src, dst, p0, p1)
            }
            Memory::HybridIswa { base, swa, recr } => {
                base.seq_cp(src, dst, p0, p1)?;
                swa.seq_cp(src, dst, p0, p1)?;
                recr.seq_cp(src, dst, p0, p1)
            }
            Memory::HybridIdx { attn, recr, idx } => {
                attn.seq_cp(src, dst, p0, p1)?;
                recr.seq_cp(src, dst, p0, p1)?;
                if attn.config().faults.hybrid_idx_skips_seq_cp {
                    return Ok(());
                }
                idx.seq_cp(src, dst, p0, p1)
            }
        }
    }

    /// `llama_memory_seq_keep`.
    pub fn seq_keep(&mut self, seq: SeqId) -> Result<(), CacheError> {
        match self {
            Memory::Kv(c) => c.seq_keep(seq),
            Memory::Iswa { base, swa }
            | Memory::Msa { base, idx: swa }
            | Memory::Dsa { base, idx: swa } => {
                base.seq_keep(seq)?;
                swa.seq_keep(seq)
            }
            Memory::DsaIswa { base, idx, swa } => {
                base.seq_keep(seq)?;
                idx.seq_keep(seq)?;
                swa.seq_keep(seq)
            }
            Memory::Recurrent(r) => r.seq_keep(seq),
            Memory::Hybrid { attn, recr } => {
                attn.seq_keep(seq)?;
                recr.seq_keep(seq)
            }
            Memory::HybridIswa { base, swa, recr } => {
                base.seq_keep(seq)?;
                swa.seq_keep(seq)?;
                recr.seq_keep(seq)
            }
            Memory::HybridIdx { attn, recr, idx } => {
                attn.seq_keep(seq)?;
                recr.seq_keep(seq)?;
                idx.seq_keep(seq)
            }
        }
    }

    /// `llama_memory_seq_add`.
    pub fn seq_add(&mut self, seq: SeqId, p0: Pos, p1: Pos, delta: Pos) -> Result<(), CacheError> {
        match self {
            Memory::Kv(c) => c.seq_add(seq, p0, p1, delta),
            Memory::Iswa { base, swa }
            | Memory::Msa { base, idx: swa }
            | Memory::Dsa { base, idx: swa } => {
                base.seq_add(seq, p0, p1, delta)?;
                swa.seq_add(seq, p0, p1, delta)
            }
            Memory::DsaIswa { base, idx, swa } => {
                base.seq_add(seq, p0, p1, delta)?;
                idx.seq_add(seq, p0, p1, delta)?;
                swa.seq_add(seq, p0, p1, delta)
            }
            Memory::Recurrent(r) => r.seq_add(seq, p0, p1, delta),
            Memory::Hybrid { attn, recr } => {
                attn.seq_add(seq, p0, p1, delta)?;
                recr.seq_add(seq, p0, p1, delta)
            }
            Memory::HybridIswa { base, swa, recr } => {
                base.seq_add(seq, p0, p1, delta)?;
                swa.seq_add(seq, p0, p1, delta)?;
                recr.seq_add(seq, p0, p1, delta)
            }
            Memory::HybridIdx { attn, recr, idx } => {
                attn.seq_add(seq, p0, p1, delta)?;
                recr.seq_add(seq, p0, p1, delta)?;
                idx.seq_add(seq, p0, p1, delta)
            }
        }
    }

    /// `llama_memory_seq_div`.
    pub fn seq_div(&mut self, seq: SeqId, p0: Pos, p1: Pos, d: i32) -> Result<(), CacheError> {
        match self {
            Memory::Kv(c) => c.seq_div(seq, p0, p1, d),
            Memory::Iswa { base, swa }
            | Memory::Msa { base, idx: swa }
            | Memory::Dsa { base, idx: swa } => {
                base.seq_div(seq, p0, p1, d)?;
                swa.seq_div(seq, p0, p1, d)
            }
            Memory::DsaIswa { base, idx, swa } => {
                base.seq_div(seq, p0, p1, d)?;
                idx.seq_div(seq, p0, p1, d)?;
                swa.seq_div(seq, p0, p1, d)
            }
            Memory::Recurrent(r) => r.seq_div(seq, p0, p1, d),
            Memory::Hybrid { attn, recr } => {
                attn.seq_div(seq, p0, p1, d)?;
                recr.seq_div(seq, p0, p1, d)
            }
            Memory::HybridIswa { base, swa, recr } => {
                base.seq_div(seq, p0, p1, d)?;
                swa.seq_div(seq, p0, p1, d)?;
                recr.seq_div(seq, p0, p1, d)
            }
            Memory::HybridIdx { attn, recr, idx } => {
                attn.seq_div(seq, p0, p1, d)?;
                recr.seq_div(seq, p0, p1, d)?;
                idx.seq_div(seq, p0, p1, d)
            }
        }
    }

    /// `llama_memory_seq_pos_min`.
    pub fn seq_pos_min(&self, seq: SeqId) -> Result<Pos, CacheError> {
        self.check_seq(seq)?;
        Ok(self.seq_range(seq).0)
    }

    /// `llama_memory_seq_pos_max`.
    pub fn seq_pos_max(&self, seq: SeqId) -> Result<Pos, CacheError> {
        self.check_seq(seq)?;
        Ok(self.seq_range(seq).1)
    }

    /// `llama_decode`, metadata side: validation against this memory's accessors, slots in every
    /// attention cache (all or nothing), then placement. On error the memory is unchanged.
    pub fn decode(&mut self, batch: &[BatchToken]) -> Result<(), DecodeError> {
        if let Memory::Kv(c) = self {
            return c.decode(batch).map(|_| ());
        }
        let pos = check_batch(self, batch)?;
        match self {
            Memory::Kv(_) => unreachable!("handled above"),
            Memory::Iswa { base, swa }
            | Memory::Msa { base, idx: swa }
            | Memory::Dsa { base, idx: swa } => {
                let a = base.find_slots(batch)?;
                let b = swa.find_slots(batch)?;
                base.place(batch, &pos, &a);
                swa.place(batch, &pos, &b);
                base.forget_shifts();
                swa.forget_shifts();
            }
            Memory::DsaIswa { base, idx, swa } => {
                let a = base.find_slots(batch)?;
                let b = idx.find_slots(batch)?;
                let c = swa.find_slots(batch)?;
                for (cache, slots) in [(base, a), (idx, b), (swa, c)] {
                    cache.place(batch, &pos, &slots);
                    cache.forget_shifts();
                }
            }
            Memory::Recurrent(r) => {
                r.find_slots(batch.iter().map(|t| t.seqs.as_slice()))?;
                let seqs: Vec<Vec<SeqId>> = batch.iter().map(|t| t.seqs.clone()).collect();
                let tokens: Vec<i32> = batch.iter().map(|t| t.token).collect();
                r.place(&seqs, &pos, &tokens);
            }
            Memory::Hybrid { attn, recr } => {
                let a = attn.find_slots(batch)?;
                recr.find_slots(batch.iter().map(|t| t.seqs.as_slice()))?;
                attn.place(batch, &pos, &a);
                attn.forget_shifts();
                let seqs: Vec<Vec<SeqId>> = batch.iter().map(|t| t.seqs.clone()).collect();
                let tokens: Vec<i32> = batch.iter().map(|t| t.token).collect();
                recr.place(&seqs, &pos, &tokens);
            }
            Memory::HybridIdx { attn, recr, idx } => {
                recr.find_slots(batch.iter().map(|t| t.seqs.as_slice()))?;
                let a = attn.find_slots(batch)?;
                attn.place(batch, &pos, &a);
                attn.forget_shifts();
                // The indexer adopts the attention cache's slots.
                idx.place(batch, &pos, &a);
                idx.forget_shifts();
                let seqs: Vec<Vec<SeqId>> = batch.iter().map(|t| t.seqs.clone()).collect();
                let tokens: Vec<i32> = batch.iter().map(|t| t.token).collect();
                recr.place(&seqs, &pos, &tokens);
            }
            Memory::HybridIswa { base, swa, recr } => {
                recr.find_slots(batch.iter().map(|t| t.seqs.as_slice()))?;
                let a = base.find_slots(batch)?;
                let b = swa.find_slots(batch)?;
                base.place(batch, &pos, &a);
                swa.place(batch, &pos, &b);
                base.forget_shifts();
                swa.forget_shifts();
                let seqs: Vec<Vec<SeqId>> = batch.iter().map(|t| t.seqs.clone()).collect();
                let tokens: Vec<i32> = batch.iter().map(|t| t.token).collect();
                recr.place(&seqs, &pos, &tokens);
            }
        }
        Ok(())
    }

    /// The digest of `seq`'s recurrent state (recurrent and hybrid memories; see
    /// [`crate::recurrent`]), `None` when it holds none or the memory has no states.
    pub fn state_digest(&self, seq: SeqId) -> Option<u64> {
        match self {
            Memory::Recurrent(r)
            | Memory::Hybrid { recr: r, .. }
            | Memory::HybridIdx { recr: r, .. }
            | Memory::HybridIswa { recr: r, .. } => r.state_digest(seq),
            _ => None,
        }
    }

    /// The positions of `seq`'s cells in the attention cache at or below `pos`, sorted (a
    /// hybrid memory's attention part; empty for other memories).
    pub fn attention_positions(&self, seq: SeqId, pos: Pos) -> Vec<Pos> {
        match self {
            Memory::Hybrid { attn, .. }
            | Memory::HybridIdx { attn, .. }
            | Memory::HybridIswa { base: attn, .. } => {
                let mut v: Vec<Pos> = attn
                    .seq_positions(seq)
                    .into_iter()
                    .filter(|&p| p <= pos)
                    .collect();
                v.sort_unstable();
                v
            }
            _ => Vec::new(),
        }
    }

    /// The faults the memory was made with.
    pub fn faults(&self) -> crate::Faults {
        match self {
            Memory::Kv(c)
            | Memory::Iswa { base: c, .. }
            | Memory::Msa { base: c, .. }
            | Memory::Dsa { base: c, .. }
            | Memory::DsaIswa { base: c, .. }
            | Memory::HybridIswa { base: c, .. }
            | Memory::HybridIdx { attn: c, .. }
            | Memory::Hybrid { attn: c, .. } => c.config().faults,
            Memory::Recurrent(m) => m.config().faults,
        }
    }
}

impl SeqRanges for Memory {
    /// The hybrid-idx memory is qwen4exp's, which ropes with IMRoPE (`n_pos_per_embd` 4).
    fn positions_may_jump(&self) -> bool {
        matches!(self, Memory::HybridIdx { .. })
    }

    fn n_seq(&self) -> usize {
        match self {
            Memory::Kv(c)
            | Memory::Iswa { base: c, .. }
            | Memory::Msa { base: c, .. }
            | Memory::Dsa { base: c, .. }
            | Memory::DsaIswa { base: c, .. }
            | Memory::Hybrid { attn: c, .. }
            | Memory::HybridIdx { attn: c, .. }
            | Memory::HybridIswa { base: c, .. } => c.n_seq(),
            Memory::Recurrent(r) => r.n_seq(),
        }
    }

    fn seq_range(&self, s: SeqId) -> (Pos, Pos) {
        match self {
            Memory::Kv(c) | Memory::Msa { base: c, .. } | Memory::Dsa { base: c, .. } => {
                c.seq_range(s)
            }
            Memory::Iswa { swa, .. } | Memory::DsaIswa { swa, .. } => swa.seq_range(s),
            Memory::Recurrent(r) => r.seq_range(s),
            Memory::Hybrid { attn: a, recr }
            | Memory::HybridIdx { attn: a, recr, .. }
            | Memory::HybridIswa { swa: a, recr, .. } => {
                let (a, b) = (a.seq_range(s), recr.seq_range(s));
                (a.0.max(b.0), a.1.min(b.1))
            }
        }
    }
}

/// `llama_kv_cache_dsa::seq_cp` (llama-kv-cache-dsa.cpp:71-74): the MLA cache, then the indexer
/// cache (which the fault `dsa_lid_skips_seq_cp` leaves out).
fn dsa_seq_cp(
    base: &mut CellCache,
    idx: &mut CellCache,
    src: SeqId,
    dst: SeqId,
    p0: Pos,
    p1: Pos,
) -> Result<(), CacheError> {
    base.seq_cp(src, dst, p0, p1)?;
    if base.config().faults.dsa_lid_skips_seq_cp {
        return Ok(());
    }
    idx.seq_cp(src, dst, p0, p1)
}

/// The `llama_memory_*` and state calls every memory answers, so that one adapter drives an
/// attention cache ([`CellCache`], with or without a tensor payload) and a [`Memory`] alike.
pub trait MemoryOps {
    /// `Ok` when `s` names a sequence.
    fn check_seq(&self, s: SeqId) -> Result<(), CacheError>;
    /// `llama_memory_clear`.
    fn clear(&mut self);
    /// `llama_memory_seq_rm`.
    fn seq_rm(&mut self, seq: SeqId, p0: Pos, p1: Pos) -> Result<bool, CacheError>;
    /// `llama_memory_seq_cp`.
    fn seq_cp(&mut self, src: SeqId, dst: SeqId, p0: Pos, p1: Pos) -> Result<(), CacheError>;
    /// `llama_memory_seq_keep`.
    fn seq_keep(&mut self, seq: SeqId) -> Result<(), CacheError>;
    /// `llama_memory_seq_add`.
    fn seq_add(&mut self, seq: SeqId, p0: Pos, p1: Pos, delta: Pos) -> Result<(), CacheError>;
    /// `llama_memory_seq_div`.
    fn seq_div(&mut self, seq: SeqId, p0: Pos, p1: Pos, d: i32) -> Result<(), CacheError>;
    /// `llama_state_seq_get_data`.
    fn state_seq_bytes(&self, seq: SeqId) -> Result<Vec<u8>, CacheError>;
    /// `llama_state_get_data`.
    fn state_bytes(&self) -> Vec<u8>;
    /// `llama_state_seq_set_data`.
    fn state_seq_set_bytes(&mut self, seq: SeqId, bytes: &[u8]) -> Result<usize, RestoreError>;
    /// `llama_state_seq_get_data_ext` with `flags` (an attention cache ignores them).
    fn state_seq_bytes_flags(&self, seq: SeqId, flags: u32) -> Result<Vec<u8>, CacheError>;
    /// `llama_state_seq_set_data_ext` with `flags` (an attention cache ignores them).
    fn state_seq_set_bytes_flags(
        &mut self,
        seq: SeqId,
        bytes: &[u8],
        flags: u32,
    ) -> Result<usize, RestoreError>;
    /// `llama_state_set_data`.
    fn state_set_bytes(&mut self, bytes: &[u8]) -> Result<usize, RestoreError>;
}

macro_rules! memory_ops_by_inherent_methods {
    ($t:ty) => {
        impl MemoryOps for $t {
            fn check_seq(&self, s: SeqId) -> Result<(), CacheError> {
                <$t>::check_seq(self, s)
            }
            fn clear(&mut self) {
                <$t>::clear(self)
            }
            fn seq_rm(&mut self, seq: SeqId, p0: Pos, p1: Pos) -> Result<bool, CacheError> {
                <$t>::seq_rm(self, seq, p0, p1)
            }
            fn seq_cp(
                &mut self,
                src: SeqId,
                dst: SeqId,
                p0: Pos,
                p1: Pos,
            ) -> Result<(), CacheError> {
                <$t>::seq_cp(self, src, dst, p0, p1)
            }
            fn seq_keep(&mut self, seq: SeqId) -> Result<(), CacheError> {
                <$t>::seq_keep(self, seq)
            }
            fn seq_add(
                &mut self,
                seq: SeqId,
                p0: Pos,
                p1: Pos,
                delta: Pos,
            ) -> Result<(), CacheError> {
                <$t>::seq_add(self, seq, p0, p1, delta)
            }
            fn seq_div(&mut self, seq: SeqId, p0: Pos, p1: Pos, d: i32) -> Result<(), CacheError> {
                <$t>::seq_div(self, seq, p0, p1, d)
            }
            fn state_seq_bytes(&self, seq: SeqId) -> Result<Vec<u8>, CacheError> {
                <$t>::state_seq_bytes(self, seq)
            }
            fn state_bytes(&self) -> Vec<u8> {
                <$t>::state_bytes(self)
            }
            fn state_seq_set_bytes(
                &mut self,
                seq: SeqId,
                bytes: &[u8],
            ) -> Result<usize, RestoreError> {
                <$t>::state_seq_set_bytes(self, seq, bytes)
            }
            fn state_set_bytes(&mut self, bytes: &[u8]) -> Result<usize, RestoreError> {
                <$t>::state_set_bytes(self, bytes)
            }
            fn state_seq_bytes_flags(&self, seq: SeqId, flags: u32) -> Result<Vec<u8>, CacheError> {
                <$t>::state_seq_bytes_flags(self, seq, flags)
            }
            fn state_seq_set_bytes_flags(
                &mut self,
                seq: SeqId,
                bytes: &[u8],
                flags: u32,
            ) -> Result<usize, RestoreError> {
                <$t>::state_seq_set_bytes_flags(self, seq, bytes, flags)
            }
        }
    };
}

impl CellCache {
    /// `llama_state_seq_get_data_ext`: the flags change nothing of an attention cache's dump
    /// (`GGML_UNUSED(flags)` in `llama_kv_cache::state_write`).
    pub fn state_seq_bytes_flags(&self, seq: SeqId, _flags: u32) -> Result<Vec<u8>, CacheError> {
        self.state_seq_bytes(seq)
    }

    /// `llama_state_seq_set_data_ext`: the flags change nothing of an attention cache's load.
    pub fn state_seq_set_bytes_flags(
        &mut self,
        seq: SeqId,
        bytes: &[u8],
        _flags: u32,
    ) -> Result<usize, RestoreError> {
        self.state_seq_set_bytes(seq, bytes)
    }
}

memory_ops_by_inherent_methods!(CellCache);
memory_ops_by_inherent_methods!(Memory);
