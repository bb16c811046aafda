//! The attention state a forward pass reads and writes ([`KvStore`]), owned by the caller: a KV
//! cache under audit plugs in by implementing it; [`VecKvStore`] is the obviously-correct one.
//! `forward.rs` re-exports these beside the model that uses them. [`key_visible`] is the one
//! mask: whether a key at one position is visible to a query at another, under a window.

/// One resident K/V entry as the attention reads it.
#[derive(Clone, Copy, Debug)]
pub struct KvEntry<'a> {
    /// Absolute position the key was rotated to.
    pub pos: i32,
    /// The rotated K row (`n_head_kv * head_dim`, head-major).
    pub k: &'a [f32],
    /// The V row (`n_head_kv * head_dim`, head-major).
    pub v: &'a [f32],
}

/// The attention state a forward pass reads and writes, owned by the caller.
///
/// The model calls `append` once per layer for each token, before attending, and then reads
/// `visible` for the same layer. The attention accumulates keys in the order `visible` yields them;
/// bit-identity with `Model::forward_sequence` (`forward.rs`) needs ascending storage (append) order.
pub trait KvStore {
    /// Stores one token's rows for `layer`: the key before RoPE (`k_raw`, which lets a cache
    /// re-position it later with one rotation), the key rotated to `pos`, and the value.
    fn append(&mut self, layer: usize, pos: i32, k_raw: &[f32], k_rotated: &[f32], v: &[f32]);

    /// The entries of `layer` visible to a query at `query_pos` under `window` (see
    /// [`key_visible`]), oldest first.
    fn visible<'a>(
        &'a self,
        layer: usize,
        query_pos: i32,
        window: Option<u32>,
    ) -> Box<dyn Iterator<Item = KvEntry<'a>> + 'a>;
}

/// The rows of one layer of a [`VecKvStore`].
#[derive(Clone, Debug, Default, PartialEq)]
struct VecKvLayer {
    pos: Vec<i32>,
    k_raw: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

/// The plainest [`KvStore`]: per layer, append-only flat rows (`k[j*w .. (j+1)*w]` is entry `j`),
/// in append order, filtered by [`key_visible`].
#[derive(Clone, Debug, PartialEq)]
pub struct VecKvStore {
    width: usize,
    layers: Vec<VecKvLayer>,
}

impl VecKvStore {
    /// An empty store for `n_layer` layers of rows of `kv_width` values.
    pub fn new(n_layer: usize, kv_width: usize) -> Self {
        VecKvStore {
            width: kv_width,
            layers: vec![VecKvLayer::default(); n_layer],
        }
    }

    /// Number of entries in `layer`.
    pub fn len(&self, layer: usize) -> usize {
        self.layers[layer].pos.len()
    }

    /// Whether every layer is empty.
    pub fn is_empty(&self) -> bool {
        self.layers.iter().all(|l| l.pos.is_empty())
    }

    /// Positions of the entries of `layer`, in storage order.
    pub fn positions(&self, layer: usize) -> &[i32] {
        &self.layers[layer].pos
    }

    /// The pre-RoPE key of entry `j` of `layer`.
    pub fn k_raw(&self, layer: usize, j: usize) -> &[f32] {
        &self.layers[layer].k_raw[j * self.width..(j + 1) * self.width]
    }

    /// The rotated key of entry `j` of `layer`.
    pub fn k(&self, layer: usize, j: usize) -> &[f32] {
        &self.layers[layer].k[j * self.width..(j + 1) * self.width]
    }

    /// The value of entry `j` of `layer`.
    pub fn v(&self, layer: usize, j: usize) -> &[f32] {
        &self.layers[layer].v[j * self.width..(j + 1) * self.width]
    }

    /// Removes every entry.
    pub fn clear(&mut self) {
        for l in &mut self.layers {
            *l = VecKvLayer::default();
        }
    }
}

impl KvStore for VecKvStore {
    fn append(&mut self, layer: usize, pos: i32, k_raw: &[f32], k_rotated: &[f32], v: &[f32]) {
        let w = self.width;
        assert!(
            k_raw.len() == w && k_rotated.len() == w && v.len() == w,
            "VecKvStore: rows must have {w} values"
        );
        let l = &mut self.layers[layer];
        l.pos.push(pos);
        l.k_raw.extend_from_slice(k_raw);
        l.k.extend_from_slice(k_rotated);
        l.v.extend_from_slice(v);
    }

    fn visible<'a>(
        &'a self,
        layer: usize,
        query_pos: i32,
        window: Option<u32>,
    ) -> Box<dyn Iterator<Item = KvEntry<'a>> + 'a> {
        let l = &self.layers[layer];
        let w = self.width;
        Box::new(
            l.pos
                .iter()
                .enumerate()
                .filter(move |&(_, &p)| key_visible(p, query_pos, window))
                .map(move |(j, &p)| KvEntry {
                    pos: p,
                    k: &l.k[j * w..(j + 1) * w],
                    v: &l.v[j * w..(j + 1) * w],
                }),
        )
    }
}

/// Whether a key at `key_pos` is visible to a query at `query_pos`: causal by position
/// (`key_pos <= query_pos`) and, with a window `W`, `key_pos >= query_pos - W + 1`. This is the
/// one definition of the mask; [`VecKvStore`] and the reference both use it.
pub fn key_visible(key_pos: i32, query_pos: i32, window: Option<u32>) -> bool {
    if key_pos > query_pos {
        return false;
    }
    match window {
        None => true,
        // i64: no overflow for any i32 positions or u32 window.
        Some(w) => i64::from(query_pos) - i64::from(key_pos) < i64::from(w),
    }
}
