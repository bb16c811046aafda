//! The state key: every field of a memory that any later op, accessor or dump reads, written as
//! canonical bytes, so that two memories of one configuration have equal keys exactly when no
//! sequence of ops can tell them apart. A state-space explorer deduplicates by it.
//!
//! What it covers, per attention cache ([`CellCache`]): per stream the head (where the next slot
//! search starts), the used count and `used_max_p1`, every cell that is not empty (its index,
//! position and sequence bitset), and every sequence's position index (the derived `seq_pos`
//! maps that answer `seq_pos_min`/`seq_pos_max`, which a fault can let drift from the cells).
//!
//! What it leaves out, because nothing reads it: the pending shifts. In llama.cpp they drive the
//! K-shift of the rows at the next update; in this model only a tensor payload would read them
//! (its rows are re-rotated at the op itself), no op, accessor or dump does (a decode zeroes them,
//! a copy copies them), and a cache with a tensor payload has no key at all. Keeping them would
//! split one observable state into many (every `seq_add` leaves a different pending shift) for
//! nothing: at depth 4 of the seed domain, twice the states. Per recurrent memory: every cell (position, sequences, source, tail,
//! digest), the head, the used count and the pending rollbacks. The configuration is not
//! written: keys are compared within one configuration only.
//!
//! The encoding is injective: fixed-width fields, and each variable-length part is preceded by
//! its length or closed by a terminator no entry can start with.

use crate::{CellCache, Memory};

/// Which parts of the state a key covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KeyScope {
    /// Everything (see the module docs): the only sound key.
    #[default]
    Complete,
    /// Everything but the per-sequence position index. Unsound on purpose: it exists to show
    /// that a key which forgets derived state merges states that later ops tell apart (the
    /// index drifts from the cells under `Faults::refcount`), and so hides the bugs that live
    /// in that state. Never use it to explore.
    WithoutIndex,
}

/// Why a memory has no key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoKey;

impl std::fmt::Display for NoKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the cache carries a tensor payload, which the state key does not cover")
    }
}

pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_i32(out: &mut Vec<u8>, v: i32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

impl CellCache {
    /// Appends this cache's state key (see the module docs) to `out`. A cache with a tensor
    /// payload has none: its rows are state the key does not cover.
    pub fn write_state_key(&self, out: &mut Vec<u8>, scope: KeyScope) -> Result<(), NoKey> {
        if self.tensors.is_some() {
            return Err(NoKey);
        }
        put_u32(out, self.streams.len() as u32);
        for st in &self.streams {
            let c = &st.cells;
            put_u32(out, st.head);
            put_u32(out, c.used);
            put_u32(out, c.used_max_p1);
            put_u32(out, c.pos.len() as u32);
            // Every cell that is not empty: cells past `used_max_p1` are empty by construction,
            // but the key does not rely on it.
            for i in 0..c.pos.len() {
                if c.pos[i] != -1 || c.seq[i] != 0 {
                    put_u32(out, i as u32);
                    put_i32(out, c.pos[i]);
                    put_u64(out, c.seq[i]);
                }
            }
            put_u32(out, u32::MAX);
            if scope == KeyScope::Complete {
                put_u32(out, c.seq_pos.len() as u32);
                for index in &c.seq_pos {
                    index.write_key(out);
                }
            }
        }
        Ok(())
    }
}

impl Memory {
    /// Appends this memory's state key (see the module docs) to `out`: its parts in order.
    pub fn write_state_key(&self, out: &mut Vec<u8>, scope: KeyScope) -> Result<(), NoKey> {
        match self {
            Memory::Kv(c) => c.write_state_key(out, scope),
            Memory::Iswa { base, swa }
            | Memory::Msa { base, idx: swa }
            | Memory::Dsa { base, idx: swa } => {
                base.write_state_key(out, scope)?;
                swa.write_state_key(out, scope)
            }
            Memory::DsaIswa { base, idx, swa } => {
                base.write_state_key(out, scope)?;
                idx.write_state_key(out, scope)?;
                swa.write_state_key(out, scope)
            }
            Memory::Recurrent(r) => {
                r.write_state_key(out);
                Ok(())
            }
            Memory::Hybrid { attn, recr } => {
                attn.write_state_key(out, scope)?;
                recr.write_state_key(out);
                Ok(())
            }
            Memory::HybridIdx { attn, recr, idx } => {
                attn.write_state_key(out, scope)?;
                recr.write_state_key(out);
                idx.write_state_key(out, scope)
            }
            Memory::HybridIswa { base, swa, recr } => {
                base.write_state_key(out, scope)?;
                swa.write_state_key(out, scope)?;
                recr.write_state_key(out);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{BatchToken, CacheConfig, CellCache, Faults};

    fn cache(faults: Faults) -> CellCache {
        let mut c = CellCache::new(CacheConfig {
            faults,
            ..CacheConfig::default()
        });
        let batch: Vec<BatchToken> = (0..7)
            .map(|_| BatchToken {
                token: 1,
                pos: None,
                seqs: vec![0],
            })
            .collect();
        c.decode(&batch).unwrap();
        c
    }

    fn key(c: &CellCache, scope: super::KeyScope) -> Vec<u8> {
        let mut out = Vec::new();
        c.write_state_key(&mut out, scope).unwrap();
        out
    }

    /// The seed's setup, then `seq_cp(0, 1, 0, 3)` once and twice.
    fn copied_once_and_twice(faults: Faults) -> (CellCache, CellCache) {
        let mut once = cache(faults);
        once.seq_cp(0, 1, 0, 3).unwrap();
        let mut twice = once.clone();
        twice.seq_cp(0, 1, 0, 3).unwrap();
        (once, twice)
    }

    #[test]
    fn a_drifted_index_changes_the_complete_key_only() {
        use super::KeyScope::{Complete, WithoutIndex};
        let (once, twice) = copied_once_and_twice(Faults {
            refcount: true,
            ..Faults::default()
        });
        assert_ne!(key(&once, Complete), key(&twice, Complete));
        assert_eq!(key(&once, WithoutIndex), key(&twice, WithoutIndex));
        // Without the fault the second copy changes nothing, and the keys agree.
        let (once, twice) = copied_once_and_twice(Faults::default());
        assert_eq!(key(&once, Complete), key(&twice, Complete));
    }

    #[test]
    fn pending_shifts_are_not_keyed_and_positions_are() {
        let k = |c: &CellCache| key(c, super::KeyScope::Complete);
        // Decoded at 0..7 and moved up by 2 (a pending shift of 2 on every cell), against
        // decoded at 2..9 directly (no pending shift): the same cells, heads and index, so
        // nothing any op reads differs.
        let mut moved = cache(Faults::default());
        let before = k(&moved);
        moved.seq_add(0, 0, -1, 2).unwrap();
        assert_ne!(before, k(&moved));
        let mut direct = CellCache::new(CacheConfig::default());
        let batch: Vec<BatchToken> = (0..7)
            .map(|i| BatchToken {
                token: 1,
                pos: Some(2 + i),
                seqs: vec![0],
            })
            .collect();
        direct.decode(&batch).unwrap();
        // A shift that moves nothing: the head goes back to 0 as after any `seq_add`.
        direct.seq_add(0, 100, -1, 2).unwrap();
        assert_eq!(
            moved.resident_cells().collect::<Vec<_>>(),
            direct.resident_cells().collect::<Vec<_>>()
        );
        assert_eq!(k(&moved), k(&direct));
    }
}
