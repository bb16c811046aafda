//! Serialization of a [`CellCache`] in llama.cpp's state formats, and restore from them.
//!
//! - Per sequence (`llama_state_seq_get_data` / `_set_data`, src/llama-context.cpp
//!   `state_seq_get_data` and src/llama-kv-cache.cpp `state_write` / `state_read`): u32 magic,
//!   i32 seq id, then the memory.
//! - Whole context (`llama_state_get_data` / `_set_data`, `state_write_data` /
//!   `state_read_data`): u32 length and the architecture name ([`STATE_ARCH`]), then the memory
//!   with every cell and all its sequences.
//! - The memory: u32 `n_stream`; per stream u32 `cell_count` (0: nothing more for the stream);
//!   per cell i32 pos, u32 `n_seq_id`, in a cache with cell exts ([`CellCache::with_cell_ext`])
//!   12 bytes of `llama_kv_cell_ext`, the seq ids; u32 `v_trans` (0), u32 `n_layer`, then per
//!   layer K (i32 type F32, u64 row bytes, the rows), then per layer V likewise. Without a tensor
//!   payload `n_layer` is 0. No `n_rot_k`/`n_rot_v` (the `LLAMA_STATE_SEQ_VERSION` 2 layout).
//!
//! Restores follow llama.cpp's failure paths, which leave the cache in different states
//! depending on where the bytes go wrong (see [`CellCache::state_set_bytes`] and
//! [`CellCache::state_seq_set_bytes`]).

use crate::tensors::TensorStore;
use crate::{CellCache, RestoreError, SeqId, STATE_SEQ_MAGIC};

/// The architecture name the whole-context dump starts with (llama.cpp writes the model's,
/// e.g. `llama`; a load checks it first).
pub const STATE_ARCH: &str = "native";

/// The sequence id in the header of a sequence state (`llama_state_seq_get_data`), when the
/// bytes start with the magic and hold the id.
pub fn state_seq_header(bytes: &[u8]) -> Option<SeqId> {
    let mut r = StateReader { bytes, at: 0 };
    (r.u32("magic").ok()? == STATE_SEQ_MAGIC).then_some(())?;
    r.i32("seq id").ok()
}

/// The layer count and K/V rows of `cells` (`state_write_data` with `v_trans` 0): per layer K
/// (type F32, row bytes, rows), then per layer V. Out of line, so that the metadata-only
/// serializer of the exhaustive audits' hot path stays as it was.
#[inline(never)]
fn write_rows_section(t: &TensorStore, cells: &[usize], out: &mut Vec<u8>) {
    let n_layer = t.shape().n_layer;
    let row_bytes = (t.width() * 4) as u64;
    out.reserve(4 + 2 * n_layer * (12 + cells.len() * row_bytes as usize));
    out.extend_from_slice(&(n_layer as u32).to_le_bytes());
    for rows_of in [TensorStore::k, TensorStore::v] {
        for l in 0..n_layer {
            out.extend_from_slice(&0i32.to_le_bytes()); // GGML_TYPE_F32
            out.extend_from_slice(&row_bytes.to_le_bytes());
            for &i in cells {
                for x in rows_of(t, i, l) {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
    }
}

/// Reads the header of a whole-context dump: u32 length and [`STATE_ARCH`] (a load checks the
/// architecture first).
pub(crate) fn read_arch(r: &mut StateReader<'_>) -> Result<(), RestoreError> {
    let len = r.u32("architecture name length")? as usize;
    let Some(name) = r.bytes.get(r.at..r.at.saturating_add(len)) else {
        return r.fail(format!("an architecture name of {len} bytes"));
    };
    if name != STATE_ARCH.as_bytes() {
        return r.fail(format!(
            "architecture '{STATE_ARCH}', found '{}' (wrong model arch)",
            String::from_utf8_lossy(name)
        ));
    }
    r.at += len;
    Ok(())
}

/// Reads the header of a sequence dump: the magic, then the sequence id (ignored, as llama.cpp
/// ignores it).
pub(crate) fn read_seq_header(r: &mut StateReader<'_>) -> Result<(), RestoreError> {
    let magic = r.u32("magic")?;
    if magic != STATE_SEQ_MAGIC {
        r.at = 0;
        return r.fail(format!(
            "magic 0x{STATE_SEQ_MAGIC:08x}, found 0x{magic:08x}"
        ));
    }
    r.i32("seq id")?;
    Ok(())
}

/// A little-endian reader over state bytes.
pub(crate) struct StateReader<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) at: usize,
}

impl StateReader<'_> {
    pub(crate) fn fail<T>(&self, message: String) -> Result<T, RestoreError> {
        Err(RestoreError {
            offset: self.at,
            message,
        })
    }

    fn take<const N: usize>(&mut self, what: &str) -> Result<[u8; N], RestoreError> {
        match self.bytes.get(self.at..self.at + N) {
            Some(b) => {
                self.at += N;
                Ok(b.try_into().expect("N bytes"))
            }
            None => self.fail(format!(
                "{what}: {N} bytes, found {}",
                self.bytes.len() - self.at
            )),
        }
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, RestoreError> {
        self.take::<4>(what).map(u32::from_le_bytes)
    }

    pub(crate) fn i32(&mut self, what: &str) -> Result<i32, RestoreError> {
        self.take::<4>(what).map(i32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, RestoreError> {
        self.take::<8>(what).map(u64::from_le_bytes)
    }

    fn f32_rows(&mut self, n: usize, what: &str) -> Result<Vec<f32>, RestoreError> {
        let Some(b) = self.bytes.get(self.at..self.at + n * 4) else {
            return self.fail(format!("{what}: {n} f32 values"));
        };
        self.at += n * 4;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect())
    }
}

impl CellCache {
    /// The bytes `llama_state_seq_get_data(ctx, seq)` would produce for this cache: the header
    /// (magic, seq id), then the memory ([`crate::state`]): every stream, the cells of `seq` in
    /// cell order (each listing only `seq`, as `state_write_meta` does for a specific sequence),
    /// then the K/V section of those cells. `seq == -1` gives the whole memory, every cell with
    /// all its sequences.
    pub fn state_seq_bytes(&self, seq: SeqId) -> Result<Vec<u8>, crate::CacheError> {
        if seq != -1 {
            self.check_seq(seq)?;
        }
        Ok(seq_dump(seq, |out| self.write_memory(seq, out)))
    }

    /// The bytes `llama_state_get_data(ctx)` would produce: u32 name length, [`STATE_ARCH`], then
    /// the memory with every cell and all its sequences (a cell of no sequence lists none).
    pub fn state_bytes(&self) -> Vec<u8> {
        whole_dump(|out| self.write_memory(-1, out))
    }

    /// `llama_kv_cache::state_write`.
    pub(crate) fn write_memory(&self, seq: SeqId, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.streams.len() as u32).to_le_bytes());
        for (s, st) in self.streams.iter().enumerate() {
            let cells = &st.cells;
            let idxs: Vec<usize> = (0..cells.used_max_p1 as usize)
                .filter(|&i| !cells.is_empty(i) && (seq == -1 || cells.seq_has(i, seq)))
                // A windowed cache leaves out the cells of `seq` masked for its last position
                // (`is_masked_swa(n_swa, pos, seq_pos_max(seq))`, src/llama-kv-cache.cpp:2097-2103).
                .filter(|&i| {
                    seq == -1
                        || self.n_swa == 0
                        || cells.seq_pos[seq as usize].max() - cells.pos[i] < self.n_swa as i32
                })
                .collect();
            out.extend_from_slice(&(idxs.len() as u32).to_le_bytes());
            if idxs.is_empty() {
                continue;
            }
            for &i in &idxs {
                let p = cells.pos[i];
                out.extend_from_slice(&p.to_le_bytes());
                let bits = if seq == -1 { cells.seq[i] } else { 1u64 << seq };
                out.extend_from_slice(&bits.count_ones().to_le_bytes());
                if self.cell_ext {
                    // x, y (a text token's position in both), LLAMA_TOKEN_NULL: see with_cell_ext.
                    for v in [p, p, -1] {
                        out.extend_from_slice(&v.to_le_bytes());
                    }
                }
                crate::cells::Cells::for_each_seq(bits, |q| {
                    out.extend_from_slice(&q.to_le_bytes())
                });
            }
            out.extend_from_slice(&0u32.to_le_bytes()); // v_trans
            match &self.tensors {
                None => out.extend_from_slice(&0u32.to_le_bytes()), // n_layer: no tensor payload
                Some(t) => {
                    let global: Vec<usize> = idxs.iter().map(|&i| self.global(s, i)).collect();
                    write_rows_section(t, &global, out)
                }
            }
        }
    }

    /// `llama_state_seq_set_data(ctx, bytes, seq)`: restores the cells (and rows) of one
    /// sequence's dump, from any sequence, into `seq`, as `llama_kv_cache::state_read` does.
    /// Returns the number of bytes read. On `Err` llama.cpp returns 0, and the cache is as
    /// llama.cpp leaves it:
    ///
    /// - bad magic, truncated header, a different stream count: unchanged;
    /// - for each stream in the bytes with cells (they all go to `seq`'s stream): more cells than
    ///   a stream holds: `seq` emptied; otherwise `seq` is emptied first, then every cell must list
    ///   exactly one sequence (read and ignored), the cells are placed by the decode slot search
    ///   and take `seq`, and the K/V section must match this cache's (same `v_trans`, layer count,
    ///   type, row size). Any failure from there: `seq` emptied (`state_clear` -> `seq_rm`).
    ///   Bytes that end in the middle of a later stream's count keep what earlier streams
    ///   restored.
    ///
    /// A dump with no cells leaves `seq` as it is. Restored keys have no pre-RoPE row, so a later
    /// `seq_add` can only compose a rotation onto them ([`TensorStore::reposition`]). Under
    /// [`crate::Faults::restore_drops_last_cell`] the last cell read is dropped after a success.
    pub fn state_seq_set_bytes(&mut self, seq: SeqId, bytes: &[u8]) -> Result<usize, RestoreError> {
        let refuse = |message: String| RestoreError { offset: 0, message };
        if seq < 0 {
            return Err(refuse(format!(
                "restoring the whole memory through a sequence load (seq {seq}) is not modelled"
            )));
        }
        self.check_seq(seq).map_err(|e| refuse(e.to_string()))?;
        let mut r = StateReader { bytes, at: 0 };
        read_seq_header(&mut r)?;
        self.read_seq_memory(seq, &mut r)?;
        Ok(r.at)
    }

    /// The memory part of [`CellCache::state_seq_set_bytes`] (`llama_kv_cache::state_read` for
    /// `seq`), read from `r`.
    pub(crate) fn read_seq_memory(
        &mut self,
        seq: SeqId,
        r: &mut StateReader<'_>,
    ) -> Result<(), RestoreError> {
        self.check_n_stream(r)?;
        let strm = self.stream_of(seq);
        let mut last: Option<usize> = None;
        for _ in 0..self.streams.len() {
            let cell_count = r.u32("cell_count")?;
            if cell_count == 0 {
                continue;
            }
            let res = self.restore_seq_stream(seq, strm, cell_count, r);
            match res {
                Ok(l) => last = Some(l),
                Err(e) => {
                    self.seq_rm(seq, -1, -1).expect("seq checked");
                    return Err(e);
                }
            }
        }
        if let (Some(i), true) = (last, self.config.faults.restore_drops_last_cell) {
            self.streams[strm].cells.rm(i);
        }
        Ok(())
    }

    fn check_n_stream(&self, r: &mut StateReader<'_>) -> Result<(), RestoreError> {
        let at = r.at;
        let n_stream = r.u32("n_stream")?;
        if n_stream as usize != self.streams.len() {
            r.at = at;
            return r.fail(format!(
                "n_stream {}, found {n_stream} (n_stream mismatch)",
                self.streams.len()
            ));
        }
        Ok(())
    }

    /// One stream of a sequence load (`state_read_meta` for a destination sequence, then
    /// `state_read_data`). Returns the index of the last cell placed. The caller empties `seq`
    /// on failure.
    fn restore_seq_stream(
        &mut self,
        seq: SeqId,
        strm: usize,
        cell_count: u32,
        r: &mut StateReader<'_>,
    ) -> Result<usize, RestoreError> {
        if cell_count as usize > self.size() {
            return r.fail(format!(
                "{cell_count} cells do not fit the {} of a stream (not enough cells in kv cache)",
                self.size()
            ));
        }
        self.seq_rm(seq, -1, -1).expect("seq checked");
        let mut pos = Vec::with_capacity(cell_count as usize);
        for _ in 0..cell_count {
            let p = r.i32("cell pos")?;
            let n_seq = r.u32("cell n_seq_id")?;
            if n_seq != 1 {
                return r.fail(format!(
                    "a cell with exactly one sequence id, found {n_seq} (invalid seq_id-agnostic kv cell)"
                ));
            }
            self.read_cell_ext(r)?;
            r.i32("cell seq id")?;
            if p == -1 {
                // llama.cpp would place a cell at -1 (its empty marker) and break its own
                // bookkeeping; this model refuses instead.
                return r.fail("a cell position other than -1 (the empty marker)".into());
            }
            pos.push(p);
        }
        let at = r.at;
        let idxs = self.streams[strm]
            .find_slot(pos.len(), self.slot_window())
            .ok_or_else(|| RestoreError {
                offset: at,
                message: format!("failed to find {cell_count} available cells"),
            })?;
        let global: Vec<usize> = idxs.iter().map(|&i| self.global(strm, i)).collect();
        let tokens: Vec<crate::BatchToken> = pos
            .iter()
            .map(|&p| crate::BatchToken {
                token: 0,
                pos: Some(p),
                seqs: vec![seq],
            })
            .collect();
        self.place(&tokens, &pos, &global);
        self.restore_rows(&global, r)?;
        Ok(*idxs.last().expect("cell_count > 0"))
    }

    /// `llama_state_set_data(ctx, bytes)`: replaces the whole cache with a whole-context dump
    /// ([`CellCache::state_bytes`]). Returns the number of bytes read. On `Err` llama.cpp returns
    /// 0, and the cache is as llama.cpp leaves it:
    ///
    /// - a truncated or different architecture name, a truncated or different stream count:
    ///   unchanged (these fail before the memory is touched);
    /// - from there the cache is emptied and each stream is filled from cell 0. A stream with
    ///   more cells than it holds, a sequence id outside `0..n_seq_max`, or a bad K/V section:
    ///   the whole cache emptied (`state_clear(-1)`). Bytes that end inside a stream's count or
    ///   cells (llama.cpp's read throws past the cleanup): what was read so far stays, down to a
    ///   cell placed with only some of its sequences.
    ///
    /// Every stream's head goes to 0. Under [`crate::Faults::restore_drops_last_cell`] the last
    /// cell read is dropped after a success.
    pub fn state_set_bytes(&mut self, bytes: &[u8]) -> Result<usize, RestoreError> {
        let mut r = StateReader { bytes, at: 0 };
        read_arch(&mut r)?;
        self.read_whole_memory(&mut r)?;
        Ok(r.at)
    }

    /// The memory part of [`CellCache::state_set_bytes`] (`llama_kv_cache::state_read` for the
    /// whole memory), read from `r`.
    pub(crate) fn read_whole_memory(
        &mut self,
        r: &mut StateReader<'_>,
    ) -> Result<(), RestoreError> {
        self.check_n_stream(r)?;
        self.clear();
        let mut last: Option<(usize, usize)> = None;
        for s in 0..self.streams.len() {
            let cell_count = r.u32("cell_count")?;
            if cell_count == 0 {
                continue;
            }
            match self.restore_whole_stream(s, cell_count, r) {
                Ok(()) => last = Some((s, cell_count as usize - 1)),
                Err((e, clear)) => {
                    if clear {
                        self.clear();
                    }
                    return Err(e);
                }
            }
        }
        if let (Some((s, i)), true) = (last, self.config.faults.restore_drops_last_cell) {
            self.streams[s].cells.rm(i);
        }
        Ok(())
    }

    /// One stream of a whole-context load (`state_read_meta` for `dest_seq_id == -1`, then
    /// `state_read_data`). `Err((e, true))`: llama.cpp's `state_clear(-1)` runs (the cache is
    /// emptied); `Err((e, false))`: the read threw past it (what was placed stays).
    fn restore_whole_stream(
        &mut self,
        s: usize,
        cell_count: u32,
        r: &mut StateReader<'_>,
    ) -> Result<(), (RestoreError, bool)> {
        let thrown = |e: RestoreError| (e, false);
        if cell_count as usize > self.size() {
            return Err((
                RestoreError {
                    offset: r.at,
                    message: format!(
                        "{cell_count} cells do not fit the {} of a stream (not enough cells in kv cache)",
                        self.size()
                    ),
                },
                true,
            ));
        }
        let n_seq_max = self.config.n_seq_max;
        for i in 0..cell_count as usize {
            let p = r.i32("cell pos").map_err(thrown)?;
            let n_seq = r.u32("cell n_seq_id").map_err(thrown)?;
            if p == -1 {
                // See restore_seq_stream: llama.cpp's empty marker.
                let e = r.fail::<()>("a cell position other than -1 (the empty marker)".into());
                return Err((e.unwrap_err(), true));
            }
            self.read_cell_ext(r).map_err(thrown)?;
            let cells = &mut self.streams[s].cells;
            cells.pos_set(i, p);
            for _ in 0..n_seq {
                let q = r.i32("cell seq id").map_err(thrown)?;
                if q < 0 || q as u32 >= n_seq_max {
                    let e = r.fail::<()>(format!(
                        "a seq id in [0, {n_seq_max}), found {q} (invalid seq_id)"
                    ));
                    return Err((e.unwrap_err(), true));
                }
                let cells = &mut self.streams[s].cells;
                if !cells.seq_has(i, q) {
                    cells.seq_add(i, q);
                }
            }
        }
        self.streams[s].head = 0;
        let global: Vec<usize> = (0..cell_count as usize)
            .map(|i| self.global(s, i))
            .collect();
        if let Some(t) = &mut self.tensors {
            let cells = &self.streams[s].cells;
            for (i, &g) in global.iter().enumerate() {
                t.place(g, cells.pos[i]);
            }
        }
        self.restore_rows(&global, r).map_err(|e| (e, true))
    }

    /// A cell's `llama_kv_cell_ext`, in a cache whose dumps carry one ([`CellCache::with_cell_ext`]):
    /// read and dropped.
    fn read_cell_ext(&self, r: &mut StateReader<'_>) -> Result<(), RestoreError> {
        if self.cell_ext {
            r.take::<12>("cell ext (x, y, token)")?;
        }
        Ok(())
    }

    /// `state_read_data` for the cells `global` (numbered across streams), in order: the K/V
    /// section must match this cache's, and its rows are copied in.
    fn restore_rows(
        &mut self,
        global: &[usize],
        r: &mut StateReader<'_>,
    ) -> Result<(), RestoreError> {
        let v_trans = r.u32("v_trans")?;
        let n_layer = r.u32("n_layer")? as usize;
        let (want_layers, width) = self
            .tensors
            .as_ref()
            .map_or((0, 0), |t| (t.shape().n_layer, t.width()));
        if n_layer != want_layers {
            return r.fail(format!(
                "{want_layers} layers (this cache), found {n_layer}"
            ));
        }
        if v_trans != 0 {
            return r.fail(format!("v_trans 0 (this cache), found {v_trans}"));
        }
        for is_k in [true, false] {
            let what = if is_k { "K" } else { "V" };
            for l in 0..n_layer {
                let ty = r.i32(&format!("{what} type"))?;
                if ty != 0 {
                    return r.fail(format!("{what} type 0 (F32) in layer {l}, found {ty}"));
                }
                let row_bytes = r.u64(&format!("{what} row bytes"))?;
                if row_bytes != (width * 4) as u64 {
                    return r.fail(format!(
                        "{what} rows of {} bytes in layer {l}, found {row_bytes}",
                        width * 4
                    ));
                }
                for &g in global {
                    let row = r.f32_rows(width, &format!("{what} row"))?;
                    let t = self.tensors.as_mut().expect("n_layer > 0 means tensors");
                    if is_k {
                        t.restore(g, l, Some(&row), None);
                    } else {
                        t.restore(g, l, None, Some(&row));
                    }
                }
            }
        }
        Ok(())
    }
}

/// A per-sequence dump: [`STATE_SEQ_MAGIC`], `seq`, then what `write_memory` writes (every memory
/// type frames its part the same way).
pub(crate) fn seq_dump(seq: SeqId, write_memory: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&STATE_SEQ_MAGIC.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    write_memory(&mut out);
    out
}

/// A whole-context dump: u32 name length, [`STATE_ARCH`], then what `write_memory` writes.
pub(crate) fn whole_dump(write_memory: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&(STATE_ARCH.len() as u32).to_le_bytes());
    out.extend_from_slice(STATE_ARCH.as_bytes());
    write_memory(&mut out);
    out
}
