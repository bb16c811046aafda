//! The tensor payload of the cell cache: per layer, one K row, one pre-RoPE K row and one V row
//! per cell, and the position each cell's K is rotated to.
//!
//! The layout is llama.cpp's: per layer a flat row-major buffer, row `cell` at
//! `[cell * w, (cell + 1) * w)` with `w = n_kv_heads * head_dim`, and within a row KV head `h` at
//! `[h * head_dim, (h + 1) * head_dim)` (`layer.k_stream` / `v_stream` in src/llama-kv-cache.cpp).
//! The pre-RoPE `Kraw` is this cache's own addition (llama.cpp keeps none): it is what lets
//! `seq_add`/`seq_div` re-derive a moved key with *one* rotation at its new absolute position, so
//! a moved key is bit-identical to a key decoded at that position (theorem T2 of the seed
//! document). llama.cpp instead rotates the stored key by the position delta (its K-shift), a
//! composed rotation that drifts in the last bits; [`Faults::seq_add_delta_rotation`] re-creates
//! that.
//!
//! The store does not compute K or V: whoever runs the model writes rows into placed cells
//! ([`crate::CellCache::write_rows`]) and reads back the cells a query may attend
//! ([`crate::CellCache::attention_cells`]). Attention masking is by the absolute position read
//! from the cell, never by index ([`window_lo`]), so it survives eviction and renumbering, and no
//! window is a true no-op.

use crate::rope::rope_row;
use crate::{Faults, Pos};

/// The shape of the payload: what one cell holds per layer, and how its keys rotate.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorShape {
    /// Number of layers (at most 64).
    pub n_layer: usize,
    /// Key/value heads per row.
    pub n_kv_heads: usize,
    /// Values per head (even: RoPE rotates pairs).
    pub head_dim: usize,
    /// RoPE base frequency.
    pub rope_freq_base: f32,
    /// The sliding window of each layer (`None`: full causal attention), one per layer.
    pub windows: Vec<Option<u32>>,
}

impl TensorShape {
    /// A shape with full causal attention on every layer.
    pub fn new(n_layer: usize, n_kv_heads: usize, head_dim: usize, rope_freq_base: f32) -> Self {
        TensorShape {
            n_layer,
            n_kv_heads,
            head_dim,
            rope_freq_base,
            windows: vec![None; n_layer],
        }
    }

    /// The same shape with `window` on every layer.
    pub fn with_window(mut self, window: Option<u32>) -> Self {
        self.windows = vec![window; self.n_layer];
        self
    }

    /// Values in one row: `n_kv_heads * head_dim`.
    pub fn width(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    fn check(&self) {
        assert!(
            (1..=64).contains(&self.n_layer),
            "tensor payload: n_layer {} not in 1..=64",
            self.n_layer
        );
        assert!(
            self.n_kv_heads > 0 && self.head_dim > 0 && self.head_dim % 2 == 0,
            "tensor payload: {} KV heads of dimension {} (need >= 1 head, even dimension)",
            self.n_kv_heads,
            self.head_dim
        );
        assert_eq!(
            self.windows.len(),
            self.n_layer,
            "tensor payload: one window per layer"
        );
        assert!(
            !self.windows.contains(&Some(0)),
            "tensor payload: a window of 0 hides every key"
        );
    }
}

/// Index of the first key a query at `query_pos` may attend under `window`, over keys sorted by
/// ascending absolute position: the first key whose position is `>= query_pos - W + 1` (0 without
/// a window). This is `llama_hparams::is_masked_swa` (`LLAMA_SWA_TYPE_STANDARD`: hidden iff
/// `p1 - p0 >= n_swa`) turned into a bound, and the seed document's `windowLo`: it reads
/// positions, not indices, so for positions `[0, 1, 2, 7, 8]`, `W = 3`, `p = 8` it is 3.
pub fn window_lo(positions: &[Pos], query_pos: Pos, window: Option<u32>) -> usize {
    match window {
        None => 0,
        Some(w) => {
            let lo = i64::from(query_pos) - i64::from(w) + 1;
            positions.partition_point(|&p| i64::from(p) < lo)
        }
    }
}

/// The index-keyed bound of [`Faults::window_index_keyed`]: `query_pos - W + 1` read as an index
/// into the `n_keys` keys (clamped), as if the keys sat at positions 0, 1, 2, ... Right until an
/// eviction leaves a gap; after one it hides keys inside the window.
pub fn window_lo_index_keyed(n_keys: usize, query_pos: Pos, window: Option<u32>) -> usize {
    match window {
        None => 0,
        Some(w) => (i64::from(query_pos) - i64::from(w) + 1).clamp(0, n_keys as i64) as usize,
    }
}

/// The narrower of two windows (both masks apply; `None` hides nothing).
pub fn narrower_window(a: Option<u32>, b: Option<u32>) -> Option<u32> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// The rows of one layer, `cell * width` apart.
#[derive(Clone, Debug, Default, PartialEq)]
struct LayerRows {
    k: Vec<f32>,
    k_raw: Vec<f32>,
    v: Vec<f32>,
}

/// The tensor payload of a cell cache. Storage grows to the highest cell placed, so a cache that
/// holds a few tokens is cheap to clone (the explorer forks targets per op).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorStore {
    shape: TensorShape,
    width: usize,
    faults: Faults,
    layers: Vec<LayerRows>,
    /// The position each cell's K is rotated to.
    pos: Vec<Pos>,
    /// Whether `k_raw` holds the cell's pre-RoPE key (not after a restore from serialized state,
    /// which carries rotated keys only).
    raw_valid: Vec<bool>,
    /// Bit `l`: layer slot `l` of the cell was written since the cell was placed.
    written: Vec<u64>,
}

impl TensorStore {
    /// An empty payload of `shape`; the tensor faults among `faults` apply.
    ///
    /// # Panics
    /// On a shape with no layers or more than 64, no heads, an odd head dimension, a window list
    /// of the wrong length or a window of 0.
    pub fn new(shape: TensorShape, faults: Faults) -> Self {
        shape.check();
        TensorStore {
            width: shape.width(),
            layers: vec![LayerRows::default(); shape.n_layer],
            shape,
            faults,
            pos: Vec::new(),
            raw_valid: Vec::new(),
            written: Vec::new(),
        }
    }

    /// The shape.
    pub fn shape(&self) -> &TensorShape {
        &self.shape
    }

    /// Values per row.
    pub fn width(&self) -> usize {
        self.width
    }

    fn grow_to(&mut self, cell: usize) {
        let n = cell + 1;
        if self.pos.len() >= n {
            return;
        }
        for l in &mut self.layers {
            l.k.resize(n * self.width, 0.0);
            l.k_raw.resize(n * self.width, 0.0);
            l.v.resize(n * self.width, 0.0);
        }
        self.pos.resize(n, -1);
        self.raw_valid.resize(n, false);
        self.written.resize(n, 0);
    }

    fn span(&self, cell: usize) -> std::ops::Range<usize> {
        assert!(
            cell < self.pos.len(),
            "tensor payload: cell {cell} was never placed"
        );
        cell * self.width..(cell + 1) * self.width
    }

    /// A token was placed in `cell` at `pos`: its rows are zeroed until the model writes them.
    pub(crate) fn place(&mut self, cell: usize, pos: Pos) {
        self.grow_to(cell);
        let r = self.span(cell);
        for l in &mut self.layers {
            l.k[r.clone()].fill(0.0);
            l.k_raw[r.clone()].fill(0.0);
            l.v[r.clone()].fill(0.0);
        }
        self.pos[cell] = pos;
        self.raw_valid[cell] = true;
        self.written[cell] = 0;
    }

    /// Stores the model's rows for `cell` and `layer`: the key before RoPE, the key rotated to the
    /// cell's position, and the value. Under [`Faults::kv_head_swap`] the rows land with KV heads 0
    /// and 1 exchanged; under [`Faults::kv_layer_swap`] in the slot of layer `n_layer - 1 - layer`.
    pub(crate) fn write(&mut self, cell: usize, layer: usize, k_raw: &[f32], k: &[f32], v: &[f32]) {
        let w = self.width;
        assert!(
            k_raw.len() == w && k.len() == w && v.len() == w,
            "tensor payload: rows of {}/{}/{} values, expected {w}",
            k_raw.len(),
            k.len(),
            v.len()
        );
        assert!(
            layer < self.shape.n_layer,
            "tensor payload: no layer {layer}"
        );
        let slot = if self.faults.kv_layer_swap {
            self.shape.n_layer - 1 - layer
        } else {
            layer
        };
        let r = self.span(cell);
        let hd = self.shape.head_dim;
        let swap = self.faults.kv_head_swap && self.shape.n_kv_heads >= 2;
        let rows = &mut self.layers[slot];
        for (dst, src) in [(&mut rows.k_raw, k_raw), (&mut rows.k, k), (&mut rows.v, v)] {
            let row = &mut dst[r.clone()];
            row.copy_from_slice(src);
            if swap {
                let (h0, rest) = row.split_at_mut(hd);
                h0.swap_with_slice(&mut rest[..hd]);
            }
        }
        self.written[cell] |= 1u64 << slot;
    }

    /// Stores rows read back from serialized state (rotated K and V; no pre-RoPE K exists there).
    pub(crate) fn restore(
        &mut self,
        cell: usize,
        layer: usize,
        k: Option<&[f32]>,
        v: Option<&[f32]>,
    ) {
        let r = self.span(cell);
        let rows = &mut self.layers[layer];
        if let Some(k) = k {
            rows.k[r.clone()].copy_from_slice(k);
        }
        if let Some(v) = v {
            rows.v[r].copy_from_slice(v);
        }
        self.raw_valid[cell] = false;
        self.written[cell] |= 1u64 << layer;
    }

    /// Copies the rows and rotation of cell `from` into cell `to` (a cross-stream `seq_cp`, which
    /// llama.cpp performs as a buffer copy of the whole stream at the next update).
    pub(crate) fn copy_cell(&mut self, from: usize, to: usize) {
        // The fault reads the rows of the neighbouring cell (0 <-> 1, 2 <-> 3, ...).
        let rows_from = if self.faults.stream_copy_wrong_rows {
            from ^ 1
        } else {
            from
        };
        self.grow_to(rows_from.max(from).max(to));
        let (a, b) = (self.span(rows_from), self.span(to));
        for l in &mut self.layers {
            l.k.copy_within(a.clone(), b.start);
            l.k_raw.copy_within(a.clone(), b.start);
            l.v.copy_within(a.clone(), b.start);
        }
        self.pos[to] = self.pos[from];
        self.raw_valid[to] = self.raw_valid[from];
        self.written[to] = self.written[from];
    }

    /// Re-positions the key of `cell` from `old_pos` to `new_pos` on every layer: one rotation of
    /// its pre-RoPE row at `new_pos`, never a rotation of the rotated row by the delta. A cell
    /// restored from serialized state has no pre-RoPE row, and only the composed form is possible
    /// for it (llama.cpp's K-shift); so is it under [`Faults::seq_add_delta_rotation`].
    pub fn reposition(&mut self, cell: usize, old_pos: Pos, new_pos: Pos) {
        let r = self.span(cell);
        debug_assert_eq!(self.pos[cell], old_pos, "cell {cell} was rotated elsewhere");
        let (h, hd, base) = (
            self.shape.n_kv_heads,
            self.shape.head_dim,
            self.shape.rope_freq_base,
        );
        let single = self.raw_valid[cell] && !self.faults.seq_add_delta_rotation;
        for rows in &mut self.layers {
            let LayerRows { k, k_raw, .. } = rows;
            let key = &mut k[r.clone()];
            if single {
                key.copy_from_slice(&k_raw[r.clone()]);
                rope_row(key, h, hd, new_pos, base);
            } else {
                rope_row(key, h, hd, new_pos - old_pos, base);
            }
        }
        self.pos[cell] = new_pos;
    }

    /// Forgets every row (all cells are empty).
    pub(crate) fn clear(&mut self) {
        for l in &mut self.layers {
            l.k.clear();
            l.k_raw.clear();
            l.v.clear();
        }
        self.pos.clear();
        self.raw_valid.clear();
        self.written.clear();
    }

    /// The rotated K row of `cell` in layer slot `layer`.
    pub fn k(&self, cell: usize, layer: usize) -> &[f32] {
        &self.layers[layer].k[self.span(cell)]
    }

    /// The pre-RoPE K row of `cell` in layer slot `layer` (zeros after a restore: see
    /// [`TensorStore::raw_valid`]).
    pub fn k_raw(&self, cell: usize, layer: usize) -> &[f32] {
        &self.layers[layer].k_raw[self.span(cell)]
    }

    /// The V row of `cell` in layer slot `layer`.
    pub fn v(&self, cell: usize, layer: usize) -> &[f32] {
        &self.layers[layer].v[self.span(cell)]
    }

    /// The position the K rows of `cell` are rotated to (-1: never placed).
    pub fn rotated_to(&self, cell: usize) -> Pos {
        self.pos.get(cell).copied().unwrap_or(-1)
    }

    /// Whether `cell` holds its pre-RoPE key.
    pub fn raw_valid(&self, cell: usize) -> bool {
        self.raw_valid.get(cell).copied().unwrap_or(false)
    }

    /// Whether layer slot `layer` of `cell` was written since the cell was placed.
    pub fn written(&self, cell: usize, layer: usize) -> bool {
        self.written
            .get(cell)
            .is_some_and(|w| w & (1u64 << layer) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rope::rope_rotated;

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    fn raw_row(w: usize, seed: u32) -> Vec<f32> {
        (0..w)
            .map(|i| {
                (((i as u32 + 1).wrapping_mul(2_654_435_761) ^ seed) % 2000) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    fn store(faults: Faults) -> TensorStore {
        TensorStore::new(TensorShape::new(2, 2, 8, 10000.0), faults)
    }

    fn write_token(s: &mut TensorStore, cell: usize, pos: Pos, seed: u32) -> Vec<f32> {
        s.place(cell, pos);
        let raw = raw_row(16, seed);
        for l in 0..2 {
            let k = rope_rotated(&raw, 2, 8, pos, 10000.0);
            s.write(cell, l, &raw, &k, &raw_row(16, seed + 100));
        }
        raw
    }

    #[test]
    fn window_bound_table() {
        // (positions, query, window, first visible index): the seed's TestSWAWindowMasksOldKeys.
        let table: [(&[Pos], Pos, Option<u32>, usize); 7] = [
            (&[0, 1, 2, 3, 4, 5], 5, Some(1), 5),
            (&[0, 1, 2, 3, 4, 5], 5, Some(3), 3),
            (&[0, 1, 2, 3, 4, 5], 5, None, 0),
            (&[0, 1, 2, 3, 4, 5], 5, Some(6), 0),
            (&[0, 1, 2, 3, 4, 5], 5, Some(100), 0),
            (&[0, 1, 2, 7, 8], 8, Some(3), 3),
            (&[], 8, Some(3), 0),
        ];
        for (pos, q, w, lo) in table {
            assert_eq!(window_lo(pos, q, w), lo, "{pos:?} q {q} w {w:?}");
        }
        // The index-keyed bound agrees while positions are 0, 1, 2, ... and not after a gap.
        assert_eq!(window_lo_index_keyed(6, 5, Some(3)), 3);
        assert_eq!(window_lo_index_keyed(5, 8, Some(3)), 5);
        assert_eq!(narrower_window(Some(3), None), Some(3));
        assert_eq!(narrower_window(Some(3), Some(2)), Some(2));
        assert_eq!(narrower_window(None, None), None);
    }

    #[test]
    fn reposition_is_one_rotation_from_the_raw_row() {
        let mut s = store(Faults::default());
        let raw = write_token(&mut s, 0, 7, 1);
        s.reposition(0, 7, 4);
        for l in 0..2 {
            assert_eq!(bits(s.k(0, l)), bits(&rope_rotated(&raw, 2, 8, 4, 10000.0)));
        }
        // Back and forth is exact too.
        s.reposition(0, 4, 9);
        s.reposition(0, 9, 7);
        assert_eq!(bits(s.k(0, 1)), bits(&rope_rotated(&raw, 2, 8, 7, 10000.0)));
        assert_eq!(s.rotated_to(0), 7);
    }

    #[test]
    fn delta_rotation_fault_composes_and_drifts() {
        let faults = Faults {
            seq_add_delta_rotation: true,
            ..Faults::default()
        };
        let mut s = store(faults);
        let raw = write_token(&mut s, 0, 4, 3);
        s.reposition(0, 4, 7);
        s.reposition(0, 7, 4);
        let exact = rope_rotated(&raw, 2, 8, 4, 10000.0);
        assert_ne!(bits(s.k(0, 0)), bits(&exact), "composition was exact");
    }

    #[test]
    fn head_and_layer_swaps_move_rows() {
        let mut ok = store(Faults::default());
        let mut heads = store(Faults {
            kv_head_swap: true,
            ..Faults::default()
        });
        let mut layers = store(Faults {
            kv_layer_swap: true,
            ..Faults::default()
        });
        for s in [&mut ok, &mut heads, &mut layers] {
            s.place(0, 0);
            s.write(0, 0, &raw_row(16, 1), &raw_row(16, 1), &raw_row(16, 2));
            s.write(0, 1, &raw_row(16, 3), &raw_row(16, 3), &raw_row(16, 4));
        }
        assert_eq!(bits(&heads.v(0, 0)[..8]), bits(&ok.v(0, 0)[8..]));
        assert_eq!(bits(&heads.v(0, 0)[8..]), bits(&ok.v(0, 0)[..8]));
        assert_eq!(bits(layers.k(0, 0)), bits(ok.k(0, 1)));
        assert!(layers.written(0, 0) && layers.written(0, 1));
    }

    #[test]
    fn placement_zeroes_and_clear_forgets() {
        let mut s = store(Faults::default());
        write_token(&mut s, 2, 5, 1);
        assert!(s.written(2, 0) && s.raw_valid(2));
        s.place(2, 6);
        assert!(!s.written(2, 0));
        assert!(s.k(2, 1).iter().all(|&x| x == 0.0));
        s.clear();
        assert_eq!(s.rotated_to(2), -1);
        assert!(!s.written(2, 0));
    }

    // The payload inside the cell cache: hooks on decode, seq_add, seq_div, clear, and the
    // serialized K/V section.

    use crate::{BatchToken, CacheConfig, CellCache, SeqId};

    fn cache(faults: Faults, window: Option<u32>) -> CellCache {
        CellCache::with_tensors(
            CacheConfig {
                faults,
                ..CacheConfig::default()
            },
            TensorShape::new(2, 2, 8, 10000.0).with_window(window),
        )
    }

    /// Decodes `n` tokens into `seq` and writes synthetic rows (raw row seeded by the token).
    fn decode(c: &mut CellCache, seq: SeqId, tokens: &[i32]) -> Vec<usize> {
        let batch: Vec<BatchToken> = tokens
            .iter()
            .map(|&token| BatchToken {
                token,
                pos: None,
                seqs: vec![seq],
            })
            .collect();
        let idxs = c.decode(&batch).unwrap();
        for (&cell, &t) in idxs.iter().zip(tokens) {
            let pos = c.cell_pos(cell).unwrap();
            let raw = raw_row(16, t as u32);
            for l in 0..2 {
                let k = rope_rotated(&raw, 2, 8, pos, 10000.0);
                c.write_rows(cell, l, &raw, &k, &raw_row(16, t as u32 + 7));
            }
        }
        idxs
    }

    #[test]
    fn seq_add_and_seq_div_rotate_moved_keys_once() {
        let mut c = cache(Faults::default(), None);
        decode(&mut c, 0, &[10, 11, 12, 13, 14, 15, 16]);
        c.seq_rm(0, 2, 5).unwrap();
        c.seq_add(0, 5, -1, -3).unwrap();
        c.seq_div(0, 0, -1, 2).unwrap();
        let t = c.tensors().unwrap();
        for (cell, pos, _) in c.resident_cells() {
            assert_eq!(t.rotated_to(cell), pos);
            let raw = raw_row(16, 10 + cell as u32);
            for l in 0..2 {
                assert_eq!(
                    bits(t.k(cell, l)),
                    bits(&rope_rotated(&raw, 2, 8, pos, 10000.0))
                );
            }
        }
    }

    #[test]
    fn attention_follows_positions_and_windows() {
        // The seed's eviction case: positions [0, 1, 2, 7, 8], W = 3, query at 8 sees 7 and 8.
        let mut c = cache(Faults::default(), Some(3));
        decode(&mut c, 0, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        c.seq_rm(0, 3, 7).unwrap();
        let pos_of = |c: &CellCache, cells: Vec<usize>| -> Vec<Pos> {
            cells.into_iter().map(|i| c.cell_pos(i).unwrap()).collect()
        };
        assert_eq!(
            pos_of(&c, c.attention_cells(0, 8, 0, None).unwrap()),
            vec![7, 8]
        );
        assert_eq!(
            pos_of(&c, c.attention_cells(0, 8, 1, Some(1)).unwrap()),
            vec![8]
        );
        assert_eq!(
            pos_of(&c, c.attention_cells(0, 2, 0, None).unwrap()),
            vec![0, 1, 2]
        );
        // Index-keyed, the same query sees nothing: index 6 is past the 5 keys.
        let mut f = cache(
            Faults {
                window_index_keyed: true,
                ..Faults::default()
            },
            Some(3),
        );
        decode(&mut f, 0, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(
            pos_of(&f, f.attention_cells(0, 8, 0, None).unwrap()),
            vec![6, 7, 8]
        );
        f.seq_rm(0, 3, 7).unwrap();
        assert!(f.attention_cells(0, 8, 0, None).unwrap().is_empty());
        // Unwritten rows (a token placed but not yet computed) are not attended.
        let mut p = cache(Faults::default(), None);
        decode(&mut p, 0, &[1, 2]);
        let placed = p
            .decode(&[BatchToken {
                token: 3,
                pos: None,
                seqs: vec![0],
            }])
            .unwrap();
        assert_eq!(p.attention_cells(0, 2, 0, None).unwrap().len(), 2);
        let raw = raw_row(16, 3);
        p.write_rows(placed[0], 0, &raw, &raw, &raw);
        assert_eq!(p.attention_cells(0, 2, 0, None).unwrap().len(), 3);
        assert_eq!(p.attention_cells(0, 2, 1, None).unwrap().len(), 2);
    }

    #[test]
    fn state_bytes_carry_rows_and_restore_round_trips() {
        let mut c = cache(Faults::default(), None);
        decode(&mut c, 1, &[5, 6]);
        decode(&mut c, 0, &[1, 2, 3]);
        let bytes = c.state_seq_bytes(0).unwrap();
        // header 16, 3 cells x 12, v_trans + n_layer 8, 2 x 2 layers x (12 + 3 rows x 64 bytes)
        assert_eq!(bytes.len(), 16 + 36 + 8 + 4 * (12 + 3 * 64));
        let mut fresh = cache(Faults::default(), None);
        assert_eq!(fresh.state_seq_set_bytes(0, &bytes), Ok(bytes.len()));
        assert_eq!(fresh.state_seq_bytes(0).unwrap(), bytes);
        assert!(!fresh.tensors().unwrap().raw_valid(0));
        // Into another sequence: the same cells, now listing that sequence.
        assert_eq!(fresh.state_seq_set_bytes(2, &bytes), Ok(bytes.len()));
        assert_eq!((fresh.seq_pos_min(2), fresh.seq_pos_max(2)), (Ok(0), Ok(2)));
        // Broken bytes are refused and leave the sequence empty.
        let mut bad = bytes.clone();
        bad.truncate(bytes.len() - 1);
        let err = fresh.state_seq_set_bytes(2, &bad).unwrap_err();
        assert!(err.message.contains("V row"), "{err}");
        assert_eq!(fresh.seq_pos_max(2), Ok(-1));
        // A metadata-only cache writes no rows and refuses a state that has some.
        let mut meta = CellCache::new(CacheConfig::default());
        assert!(meta
            .state_seq_set_bytes(0, &bytes)
            .unwrap_err()
            .message
            .contains("layers"));
        let b = [1u32, 0, 1, 0].iter().flat_map(|w| w.to_le_bytes());
        let mut empty: Vec<u8> = crate::STATE_SEQ_MAGIC.to_le_bytes().to_vec();
        empty.extend(b.skip(4));
        assert_eq!(meta.state_seq_set_bytes(0, &empty), Ok(16));
    }

    #[test]
    fn clear_empties_the_payload() {
        let mut c = cache(Faults::default(), None);
        decode(&mut c, 0, &[1, 2, 3]);
        c.clear();
        assert_eq!(c.tensors().unwrap().rotated_to(0), -1);
        decode(&mut c, 0, &[4]);
        assert_eq!(c.tensors().unwrap().rotated_to(0), 0);
    }
}
