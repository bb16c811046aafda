//! Test hooks of the llama.cpp target: faults kvaudit's adapter injects around llama.cpp's calls
//! (`--inject` on a `llama.cpp@…` target, docs/usage.md), so that an oracle's positive control
//! can run on a memory class the native model does not model (DSV4) or for which it answers no
//! logits (MSA). llama.cpp itself is untouched: each fault drops, widens or alters one call or
//! one dump on kvaudit's side of the FFI, as the native fault of the same name does in
//! `targets/native-kv` (`faults.rs`), and the audit without it is the clean run.

use std::borrow::Cow;

use crate::base::cache::{Allocation, PartHolds};
use crate::base::error::Error;
use crate::base::op::{MemoryType, Op};
use crate::base::state::{parse_seq_state, StateFormat};

/// The faults a llama.cpp target can be given, each off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LlamaFaults {
    /// `seq_keep` returns without calling `llama_memory_seq_keep` (native's `keep_noop`):
    /// llama.h says it "removes all tokens that do not belong to the specified sequence", so the
    /// contract fires while the index stays consistent with the cells (I1 sees nothing).
    pub keep_noop: bool,
    /// With `kv_unified` off in the context's params, a `seq_rm` of one sequence is sent as the
    /// whole sequence's (`p0 = p1 = -1`; native's `streams_rm_whole`): the same trace unified and
    /// per-sequence differs, the configuration differential's reason to exist.
    pub streams_rm_whole: bool,
    /// A sequence's size call reports 4 bytes more per sequence beyond the first the context
    /// holds (`n_seq_max - 1`; native's fault of the same name): the size differs from the bytes
    /// the dump writes by an amount that scales with `n_seq_max` (upstream #19559's class).
    pub seq_size_scales_with_n_seq_max: bool,
    /// Every per-sequence dump (the `state_seq_save` op's and the observations' and probes'
    /// `llama_state_seq_get_data`) comes back with the first attention cache's V rows zeroed (K
    /// rows for a K-only cache): a save that writes the cells and not what the tokens built
    /// (native's `save_drops_state`, for an attention memory). Cells, positions and a dump of
    /// what a load gives back are unchanged, so I1 and round-trip see nothing; a decode after a
    /// load reads the zeros (cache-invisible after a load in the trace, round-trip-logits and
    /// save-load-invisible in the reload probe).
    pub save_drops_rows: bool,
    /// What the memory allocated is reported with each cache of the context's positions at the
    /// context's `n_ctx` cells per stream (native's fault of the same name): with one stream per
    /// sequence, `n_seq_max` times the context, upstream #19552's shape (the allocation oracle).
    pub attn_sized_by_n_ctx: bool,
}

/// The faults' names, as `--inject` takes them.
pub const NAMES: [&str; 5] = [
    "keep_noop",
    "streams_rm_whole",
    "seq_size_scales_with_n_seq_max",
    "save_drops_rows",
    "attn_sized_by_n_ctx",
];

impl LlamaFaults {
    /// The faults named, or which name is unknown.
    pub fn parse(names: &[String]) -> Result<Self, Error> {
        let mut f = LlamaFaults::default();
        for name in names {
            *f.flag(name).ok_or_else(|| {
                Error::input(format!(
                    "no fault '{name}' in the llama.cpp target (its test hooks: {})",
                    NAMES.join(", ")
                ))
            })? = true;
        }
        Ok(f)
    }

    fn flag(&mut self, name: &str) -> Option<&mut bool> {
        Some(match name {
            "keep_noop" => &mut self.keep_noop,
            "streams_rm_whole" => &mut self.streams_rm_whole,
            "seq_size_scales_with_n_seq_max" => &mut self.seq_size_scales_with_n_seq_max,
            "save_drops_rows" => &mut self.save_drops_rows,
            "attn_sized_by_n_ctx" => &mut self.attn_sized_by_n_ctx,
            _ => return None,
        })
    }

    /// The names of the faults that are on, in [`NAMES`] order.
    pub fn names(&self) -> Vec<String> {
        let mut copy = *self;
        NAMES
            .iter()
            .filter(|n| copy.flag(n).is_some_and(|on| *on))
            .map(|n| n.to_string())
            .collect()
    }

    /// Whether any fault is on.
    pub fn any(&self) -> bool {
        *self != LlamaFaults::default()
    }

    /// The op sent to llama.cpp in place of `op` (`None`: none is sent, the op "succeeds"):
    /// `keep_noop` drops a `seq_keep`, `streams_rm_whole` widens a one-sequence `seq_rm` when
    /// `unified()` is false. Borrowed when it is `op` itself (every op without a hook: no clone
    /// per op); `unified` is asked only when a hook needs it.
    pub fn op_sent<'a>(&self, op: &'a Op, unified: impl Fn() -> bool) -> Option<Cow<'a, Op>> {
        if self.keep_noop {
            if let Op::SeqKeep { .. } = op {
                return None;
            }
        }
        if self.streams_rm_whole && !unified() {
            if let Op::SeqRm { seq, .. } = *op {
                if seq >= 0 {
                    return Some(Cow::Owned(Op::SeqRm {
                        seq,
                        p0: -1,
                        p1: -1,
                    }));
                }
            }
        }
        Some(Cow::Borrowed(op))
    }

    /// The size a sequence's size call reports under `seq_size_scales_with_n_seq_max`, from the
    /// size llama.cpp reported.
    pub fn seq_size_reported(&self, reported: u64, n_seq_max: u32) -> u64 {
        if self.seq_size_scales_with_n_seq_max {
            reported + 4 * u64::from(n_seq_max.saturating_sub(1))
        } else {
            reported
        }
    }

    /// What the memory allocated as `attn_sized_by_n_ctx` reports it: each cache of the
    /// context's positions at `n_ctx` cells per stream.
    pub fn allocation(&self, allocated: &mut Allocation) {
        if self.attn_sized_by_n_ctx {
            for p in &mut allocated.parts {
                if p.holds == PartHolds::Context {
                    p.cells = allocated.n_ctx;
                }
            }
        }
    }

    /// A per-sequence dump as `save_drops_rows` hands it back: the first attention cache's V
    /// rows (K rows where the cache writes no V) zeroed, every stream and layer. A dump that does
    /// not parse is handed back as it is (the observation that parses it reports why).
    pub fn seq_dump(&self, mut bytes: Vec<u8>, format: StateFormat, memory: MemoryType) -> Vec<u8> {
        self.seq_dump_in_place(&mut bytes, format, memory);
        bytes
    }

    /// [`LlamaFaults::seq_dump`] on bytes in place.
    pub fn seq_dump_in_place(&self, bytes: &mut [u8], format: StateFormat, memory: MemoryType) {
        if !self.save_drops_rows {
            return;
        }
        let format = StateFormat { memory, ..format };
        let base = bytes.as_ptr() as usize;
        let ranges: Vec<std::ops::Range<usize>> = match parse_seq_state(bytes, format) {
            Ok(state) => state
                .caches
                .first()
                .into_iter()
                .flatten()
                .filter_map(|stream| stream.kv.as_ref())
                .flat_map(|kv| if kv.v.is_empty() { &kv.k } else { &kv.v })
                .map(|rows| {
                    let at = rows.data.as_ptr() as usize - base;
                    at..at + rows.data.len()
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        for r in ranges {
            bytes[r].fill(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        let all: Vec<String> = NAMES.iter().map(|n| n.to_string()).collect();
        let f = LlamaFaults::parse(&all).unwrap();
        assert_eq!(f.names(), all);
        assert_eq!(LlamaFaults::parse(&[]).unwrap(), LlamaFaults::default());
        let err = LlamaFaults::parse(&["refcount".into()]).unwrap_err();
        assert!(
            err.message.contains("no fault 'refcount'"),
            "{}",
            err.message
        );
    }

    #[test]
    fn ops_sent() {
        let keep = Op::SeqKeep { seq: 0 };
        let rm = Op::SeqRm {
            seq: 1,
            p0: 4,
            p1: -1,
        };
        let none = LlamaFaults::default();
        assert_eq!(none.op_sent(&keep, || true).as_deref(), Some(&keep));
        assert_eq!(none.op_sent(&rm, || false).as_deref(), Some(&rm));
        let f = LlamaFaults::parse(&["keep_noop".into(), "streams_rm_whole".into()]).unwrap();
        assert_eq!(f.op_sent(&keep, || true).as_deref(), None);
        assert_eq!(f.op_sent(&rm, || true).as_deref(), Some(&rm));
        assert_eq!(
            f.op_sent(&rm, || false).as_deref(),
            Some(&Op::SeqRm {
                seq: 1,
                p0: -1,
                p1: -1
            })
        );
        let all = Op::SeqRm {
            seq: -1,
            p0: 4,
            p1: -1,
        };
        assert_eq!(f.op_sent(&all, || false).as_deref(), Some(&all));
    }

    #[test]
    fn sizes() {
        let f = LlamaFaults::parse(&["seq_size_scales_with_n_seq_max".into()]).unwrap();
        assert_eq!(f.seq_size_reported(100, 1), 100);
        assert_eq!(f.seq_size_reported(100, 3), 108);
        assert_eq!(LlamaFaults::default().seq_size_reported(100, 3), 100);
    }

    #[test]
    fn a_dump_that_does_not_parse_is_unchanged() {
        let f = LlamaFaults::parse(&["save_drops_rows".into()]).unwrap();
        let bytes = vec![1u8, 2, 3];
        assert_eq!(
            f.seq_dump(bytes.clone(), StateFormat::default(), MemoryType::Kv),
            bytes
        );
    }
}
