//! A [`Memory`]'s dumps and loads (llama.h's `llama_state_*` on each memory type): the layout of
//! each type's dump is in the module docs of [`super`]; a load that fails undoes what the type's
//! llama.cpp counterpart undoes.

use super::*;

impl Memory {
    /// The memory's dump; `partial` (`LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`) leaves out the parts
    /// that are not partial states: an iSWA pair's base cache (src/llama-kv-cache-iswa.cpp
    /// `state_write`), a hybrid's attention cache (src/llama-memory-hybrid.cpp:190-195); an
    /// attention cache and a recurrent memory ignore the flag (`GGML_UNUSED(flags)`).
    fn write_memory(&self, seq: SeqId, partial: bool, out: &mut Vec<u8>) {
        match self {
            Memory::Kv(c) => c.write_memory(seq, out),
            // The indexer cache is no partial state: MSA dumps both caches whatever the flags.
            Memory::Msa { base, idx } | Memory::Dsa { base, idx } => {
                base.write_memory(seq, out);
                idx.write_memory(seq, out);
            }
            Memory::Iswa { base, swa } => {
                if !partial {
                    base.write_memory(seq, out);
                }
                swa.write_memory(seq, out);
            }
            Memory::DsaIswa { base, idx, swa } => {
                if !partial {
                    base.write_memory(seq, out);
                    idx.write_memory(seq, out);
                }
                swa.write_memory(seq, out);
            }
            Memory::Recurrent(r) => r.write_memory(seq, out),
            Memory::Hybrid { attn, recr } => {
                if !partial {
                    attn.write_memory(seq, out);
                }
                recr.write_memory(seq, out);
            }
            Memory::HybridIswa { base, swa, recr } => {
                if !partial {
                    base.write_memory(seq, out);
                }
                swa.write_memory(seq, out);
                recr.write_memory(seq, out);
            }
            Memory::HybridIdx { attn, recr, idx } => {
                if !partial {
                    attn.write_memory(seq, out);
                }
                recr.write_memory(seq, out);
                if !partial && !attn.config().faults.hybrid_idx_state_drops_indexer {
                    idx.write_memory(seq, out);
                }
            }
        }
    }

    /// `llama_state_seq_get_data(ctx, seq)`: magic, `seq`, then the memory (see the module docs).
    pub fn state_seq_bytes(&self, seq: SeqId) -> Result<Vec<u8>, CacheError> {
        self.state_seq_bytes_flags(seq, 0)
    }

    /// `llama_state_seq_get_data_ext(ctx, seq, flags)`: [`Memory::state_seq_bytes`], without
    /// the parts `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY` leaves out (`write_memory`).
    pub fn state_seq_bytes_flags(&self, seq: SeqId, flags: u32) -> Result<Vec<u8>, CacheError> {
        if seq != -1 {
            self.check_seq(seq)?;
        }
        let partial = flags & STATE_SEQ_FLAGS_PARTIAL_ONLY != 0;
        Ok(crate::state::seq_dump(seq, |out| {
            self.write_memory(seq, partial, out)
        }))
    }

    /// `llama_state_get_data(ctx)`: the architecture name, then the whole memory.
    pub fn state_bytes(&self) -> Vec<u8> {
        crate::state::whole_dump(|out| self.write_memory(-1, false, out))
    }

    /// `llama_state_seq_set_data(ctx, bytes, seq)`: every part of the memory reads its part of
    /// the bytes, in dump order. Returns the bytes read; on `Err` llama.cpp returns 0 and the
    /// memory is as its parts leave it (iSWA: a base part already loaded stays; hybrid: see the
    /// module docs).
    pub fn state_seq_set_bytes(&mut self, seq: SeqId, bytes: &[u8]) -> Result<usize, RestoreError> {
        self.state_seq_set_bytes_flags(seq, bytes, 0)
    }

    /// `llama_state_seq_set_data_ext(ctx, bytes, seq, flags)`: [`Memory::state_seq_set_bytes`],
    /// reading only the parts `LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY` writes (the windowed cache
    /// and the states; src/llama-kv-cache-iswa.cpp `state_read`, src/llama-memory-hybrid.cpp:
    /// 197-214, src/llama-memory-hybrid-iswa.cpp:200-203).
    pub fn state_seq_set_bytes_flags(
        &mut self,
        seq: SeqId,
        bytes: &[u8],
        flags: u32,
    ) -> Result<usize, RestoreError> {
        let read = self.load_seq(seq, bytes, flags);
        if read.is_err() && self.faults().failed_seq_load_clears_all {
            self.clear();
        }
        read
    }

    /// [`Memory::state_seq_set_bytes_flags`] without the faults of its own.
    fn load_seq(&mut self, seq: SeqId, bytes: &[u8], flags: u32) -> Result<usize, RestoreError> {
        if let Memory::Kv(c) = self {
            return c.state_seq_set_bytes(seq, bytes);
        }
        let partial = flags & STATE_SEQ_FLAGS_PARTIAL_ONLY != 0;
        if let Err(e) = self.check_seq(seq) {
            return Err(RestoreError {
                offset: 0,
                message: e.to_string(),
            });
        }
        let mut r = StateReader { bytes, at: 0 };
        read_seq_header(&mut r)?;
        match self {
            Memory::Kv(_) => unreachable!("handled above"),
            Memory::Msa { base, idx } => {
                base.read_seq_memory(seq, &mut r)?;
                idx.read_seq_memory(seq, &mut r)?;
            }
            // DSA undoes the MLA part when the indexer part fails (`kv_mla->state_clear`,
            // llama-kv-cache-dsa.cpp:168-180 in 0.1.160 and later; before, nothing was undone:
            // the fault dsa_failed_read_keeps_mla).
            Memory::Dsa { base, idx } => read_dsa_seq(base, idx, seq, &mut r)?,
            // DSA-iSWA: the DSA pair as above, then the windowed cache, whose failure undoes
            // nothing (llama-kv-cache-dsa-iswa.cpp:244-250).
            Memory::DsaIswa { base, idx, swa } => {
                if !partial {
                    read_dsa_seq(base, idx, seq, &mut r)?;
                }
                swa.read_seq_memory(seq, &mut r)?;
            }
            Memory::Iswa { base, swa } => {
                if !partial {
                    base.read_seq_memory(seq, &mut r)?;
                }
                swa.read_seq_memory(seq, &mut r)?;
            }
            Memory::Recurrent(m) if partial => m.read_seq_memory_partial(seq, &mut r)?,
            Memory::Recurrent(m) => m.read_seq_memory(seq, &mut r)?,
            Memory::Hybrid { attn, recr } => {
                if !partial {
                    attn.read_seq_memory(seq, &mut r)?;
                }
                let read = if partial {
                    recr.read_seq_memory_partial(seq, &mut r)
                } else {
                    recr.read_seq_memory(seq, &mut r)
                };
                if let Err(e) = read {
                    if !partial {
                        attn.seq_rm(seq, -1, -1).expect("seq checked");
                    }
                    return Err(e);
                }
            }
            Memory::HybridIswa { base, swa, recr } => {
                if !partial {
                    base.read_seq_memory(seq, &mut r)?;
                }
                swa.read_seq_memory(seq, &mut r)?;
                if partial {
                    recr.read_seq_memory_partial(seq, &mut r)?;
                } else {
                    recr.read_seq_memory(seq, &mut r)?;
                }
            }
            Memory::HybridIdx { attn, recr, idx } => {
                let drops = attn.config().faults.hybrid_idx_state_drops_indexer;
                let read = (|| {
                    if !partial {
                        attn.read_seq_memory(seq, &mut r)?;
                    }
                    recr.read_seq_memory(seq, &mut r)?;
                    if !partial && !drops {
                        idx.read_seq_memory(seq, &mut r)?;
                    }
                    Ok(())
                })();
                if let Err(e) = read {
                    // `state_drop`: the sequence leaves all three parts.
                    attn.seq_rm(seq, -1, -1).expect("seq checked");
                    recr.seq_rm(seq, -1, -1);
                    idx.seq_rm(seq, -1, -1).expect("seq checked");
                    return Err(e);
                }
            }
        }
        Ok(r.at)
    }

    /// `llama_state_set_data(ctx, bytes)`: the whole memory from a whole-context dump.
    pub fn state_set_bytes(&mut self, bytes: &[u8]) -> Result<usize, RestoreError> {
        if let Memory::Kv(c) = self {
            return c.state_set_bytes(bytes);
        }
        let mut r = StateReader { bytes, at: 0 };
        read_arch(&mut r)?;
        match self {
            Memory::Kv(_) => unreachable!("handled above"),
            Memory::Iswa { base, swa } | Memory::Msa { base, idx: swa } => {
                base.read_whole_memory(&mut r)?;
                swa.read_whole_memory(&mut r)?;
            }
            // As a sequence load: `kv_mla->state_clear(-1)` when the indexer part fails.
            Memory::Dsa { base, idx } => read_dsa_whole(base, idx, &mut r)?,
            Memory::DsaIswa { base, idx, swa } => {
                read_dsa_whole(base, idx, &mut r)?;
                swa.read_whole_memory(&mut r)?;
            }
            Memory::Recurrent(m) => m.read_whole_memory(&mut r)?,
            Memory::Hybrid { attn, recr } => {
                attn.read_whole_memory(&mut r)?;
                if let Err(e) = recr.read_whole_memory(&mut r) {
                    attn.clear();
                    return Err(e);
                }
            }
            Memory::HybridIswa { base, swa, recr } => {
                base.read_whole_memory(&mut r)?;
                swa.read_whole_memory(&mut r)?;
                recr.read_whole_memory(&mut r)?;
            }
            Memory::HybridIdx { attn, recr, idx } => {
                // Under hybrid_idx_state_drops_indexer the load is the hybrid's too (#27813: the
                // class overrode neither `state_write` nor `state_read`).
                let drops = attn.config().faults.hybrid_idx_state_drops_indexer;
                let read = attn
                    .read_whole_memory(&mut r)
                    .and_then(|()| recr.read_whole_memory(&mut r))
                    .and_then(|()| {
                        if drops {
                            Ok(())
                        } else {
                            idx.read_whole_memory(&mut r)
                        }
                    });
                if let Err(e) = read {
                    // `state_drop(-1)`: `clear(true)`.
                    attn.clear();
                    recr.clear();
                    idx.clear();
                    return Err(e);
                }
            }
        }
        Ok(r.at)
    }
}

/// A DSA pair's part of a sequence load: the MLA cache, then the indexer cache, whose failure
/// clears the sequence from the MLA cache again (`kv_mla->state_clear`, llama-kv-cache-dsa.cpp:
/// 168-180 in 0.1.160 and later; before, nothing was undone: the fault
/// dsa_failed_read_keeps_mla).
fn read_dsa_seq(
    base: &mut CellCache,
    idx: &mut CellCache,
    seq: SeqId,
    r: &mut StateReader<'_>,
) -> Result<(), RestoreError> {
    base.read_seq_memory(seq, r)?;
    if let Err(e) = idx.read_seq_memory(seq, r) {
        if !base.config().faults.dsa_failed_read_keeps_mla {
            base.seq_rm(seq, -1, -1).expect("seq checked");
        }
        return Err(e);
    }
    Ok(())
}

/// A DSA pair's part of a whole load: as [`read_dsa_seq`], `kv_mla->state_clear(-1)` when the
/// indexer part fails.
fn read_dsa_whole(
    base: &mut CellCache,
    idx: &mut CellCache,
    r: &mut StateReader<'_>,
) -> Result<(), RestoreError> {
    base.read_whole_memory(r)?;
    if let Err(e) = idx.read_whole_memory(r) {
        if !base.config().faults.dsa_failed_read_keeps_mla {
            base.clear();
        }
        return Err(e);
    }
    Ok(())
}
