//! The op algebra: the calls of llama.cpp's memory API, plus decode, as values.
//!
//! An [`Op`] is one call; a [`Trace`] is a [`Setup`] (the cache shape and the ops that build the
//! initial state) plus a list of ops. Ops serialize to the JSON used by repro files and reports
//! (`{"op":"seq_cp","src":0,"dst":1,"p0":0,"p1":3}`) and display as the llama.h call they stand
//! for. Positions below 0 in a range mean an open end, as in llama.h.

use std::fmt;

use arbitrary::Arbitrary;
use serde::{Deserialize, Serialize};

pub use super::config::{Arch, CacheType, MemoryType};
pub use super::op_kind::{OpGroup, OpKind};
pub use setup::{ForeignDump, Setup};

mod setup;

/// A token position, as `llama_pos`.
pub type Pos = i32;
/// A sequence id, as `llama_seq_id`.
pub type SeqId = i32;

/// One call of the memory API, or a decode.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Arbitrary)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Op {
    /// `llama_memory_seq_rm(mem, seq, p0, p1)`; `seq == -1` matches every sequence.
    SeqRm {
        /// Sequence, or -1 for all.
        seq: SeqId,
        /// Range start (inclusive; < 0 means 0).
        p0: Pos,
        /// Range end (exclusive; < 0 means unbounded).
        p1: Pos,
    },
    /// `llama_memory_seq_cp(mem, src, dst, p0, p1)`.
    SeqCp {
        /// Source sequence.
        src: SeqId,
        /// Destination sequence.
        dst: SeqId,
        /// Range start.
        p0: Pos,
        /// Range end.
        p1: Pos,
    },
    /// `llama_memory_seq_keep(mem, seq)`.
    SeqKeep {
        /// The sequence to keep.
        seq: SeqId,
    },
    /// `llama_memory_seq_add(mem, seq, p0, p1, delta)`.
    SeqAdd {
        /// Sequence.
        seq: SeqId,
        /// Range start.
        p0: Pos,
        /// Range end.
        p1: Pos,
        /// Added to each position in range.
        delta: Pos,
    },
    /// `llama_memory_seq_div(mem, seq, p0, p1, d)`.
    SeqDiv {
        /// Sequence.
        seq: SeqId,
        /// Range start.
        p0: Pos,
        /// Range end.
        p1: Pos,
        /// Divisor.
        d: i32,
    },
    /// `llama_memory_clear(mem, true)`.
    Clear,
    /// `llama_decode` of a batch.
    Decode(Decode),
    /// `llama_state_seq_get_data(ctx, buf, size, seq)` (`_ext` with `flags` when non-zero) into
    /// the in-trace buffer `slot`, replacing what it held. Returns whether bytes were written.
    StateSeqSave {
        /// The sequence saved.
        seq: SeqId,
        /// The buffer written.
        slot: Slot,
        /// `llama_state_seq_flags` (0: the plain call).
        #[serde(default, skip_serializing_if = "is_zero")]
        flags: u32,
    },
    /// `llama_state_seq_set_data(ctx, buf, size, seq)` (`_ext` with `flags` when non-zero) of the
    /// bytes in `slot`, optionally damaged first (`truncate`, `flip`), into `seq`: possibly not
    /// the sequence it was saved from. Returns whether llama.cpp read the bytes (non-zero).
    StateSeqLoad {
        /// The destination sequence.
        seq: SeqId,
        /// The buffer read.
        slot: Slot,
        /// `llama_state_seq_flags` (0: the plain call).
        #[serde(default, skip_serializing_if = "is_zero")]
        flags: u32,
        /// Keep only the first `truncate` bytes before the load (a damaged buffer).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        truncate: Option<u32>,
        /// XOR the byte at this offset with 0xff before the load (ignored past the end).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        flip: Option<u32>,
    },
    /// `llama_state_get_data(ctx, buf, size)`: the whole context into the buffer `slot`.
    StateSave {
        /// The buffer written.
        slot: Slot,
    },
    /// `llama_state_set_data(ctx, buf, size)` of the bytes in `slot` (optionally damaged).
    StateLoad {
        /// The buffer read.
        slot: Slot,
        /// Keep only the first `truncate` bytes before the load (a damaged buffer).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        truncate: Option<u32>,
        /// XOR the byte at this offset with 0xff before the load (ignored past the end).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        flip: Option<u32>,
    },
}

/// An op or setup field that is not valid (a slot name, a configuration): the input's fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidOp(pub String);

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// The name of an in-trace state buffer: 1 to 16 characters from `[a-z0-9_]`, so that it is a
/// valid C identifier suffix in a generated reproducer and cannot carry anything else.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Slot(String);

impl Slot {
    /// The most characters a slot name may have.
    pub const MAX_LEN: usize = 16;

    /// A slot named `name`, or why the name is not one.
    pub fn new(name: &str) -> Result<Slot, InvalidOp> {
        let ok = !name.is_empty()
            && name.len() <= Self::MAX_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if ok {
            Ok(Slot(name.to_string()))
        } else {
            Err(InvalidOp(format!(
                "slot name {name:?}: use 1 to {} characters from [a-z0-9_]",
                Self::MAX_LEN
            )))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Slot {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Slot::new(&s).map_err(|e| e.to_string())
    }
}

impl From<Slot> for String {
    fn from(s: Slot) -> String {
        s.0
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'a> Arbitrary<'a> for Slot {
    fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Slot(["a", "b", "s"][u.int_in_range(0..=2)?].to_string()))
    }
}

/// `bytes` as a damaged-buffer load sees them: cut to `truncate` bytes, then the byte at `flip`
/// XORed with 0xff (ignored past the end). A failed load must leave the cache as llama.h
/// documents, and these are the ways to make one fail.
pub fn damaged(bytes: &[u8], truncate: Option<u32>, flip: Option<u32>) -> Vec<u8> {
    let mut out = bytes.to_vec();
    if let Some(n) = truncate {
        out.truncate(n as usize);
    }
    if let Some(b) = flip.and_then(|at| out.get_mut(at as usize)) {
        *b ^= 0xff;
    }
    out
}

/// How damage reads in a display: empty, or ` (truncated to N bytes, byte K flipped)`.
fn describe_damage(truncate: Option<u32>, flip: Option<u32>) -> String {
    let mut parts = Vec::new();
    if let Some(n) = truncate {
        parts.push(format!("truncated to {n} bytes"));
    }
    if let Some(at) = flip {
        parts.push(format!("byte {at} flipped"));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

/// A decode of `n` tokens into one or more sequences.
///
/// JSON: `{"op":"decode","seq":0,"n":7}` (one sequence, "next" positions),
/// `{"op":"decode","seqs":[0,1],"n":2}` (each token in both), `{"op":"decode","seq":0,"n":2,"pos":5}`
/// (explicit positions 5, 6), optionally `"tokens":[..]` (default: [`default_token`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "DecodeJson", into = "DecodeJson")]
pub struct Decode {
    /// The sequences every token belongs to (non-empty; the first one decides "next").
    pub seqs: Vec<SeqId>,
    /// Number of tokens.
    pub n: u32,
    /// Explicit position of the first token (the rest follow), or `None`: "next" positions
    /// chosen by the target the way llama.cpp's batch allocator does, from its own
    /// `seq_pos_max + 1`.
    pub pos: Option<Pos>,
    /// Token ids, or `None` for the default ids.
    pub tokens: Option<Vec<i32>>,
}

impl<'a> Arbitrary<'a> for Decode {
    fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        let n_seqs = u.int_in_range(1..=2)?;
        let mut seqs = Vec::new();
        for _ in 0..n_seqs {
            let s = u.int_in_range(0..=3)?;
            if !seqs.contains(&s) {
                seqs.push(s);
            }
        }
        let n = u.int_in_range(1..=4)?;
        let pos = if u.ratio(1, 4)? {
            Some(u.int_in_range(0..=16)?)
        } else {
            None
        };
        Ok(Decode {
            seqs,
            n,
            pos,
            tokens: None,
        })
    }
}

/// The default token id of the `i`-th token of a decode: deterministic, below 64 so it fits the
/// generated tiny model's vocabulary.
pub fn default_token(i: u32) -> i32 {
    ((i * 37 + 11) % 63 + 1) as i32
}

impl Decode {
    /// A decode of `n` tokens into `seq` at "next" positions.
    pub fn next(seq: SeqId, n: u32) -> Self {
        Decode {
            seqs: vec![seq],
            n,
            pos: None,
            tokens: None,
        }
    }

    /// A decode of the given token ids into `seq` at "next" positions.
    pub fn tokens(seq: SeqId, tokens: &[i32]) -> Self {
        Decode {
            seqs: vec![seq],
            n: tokens.len() as u32,
            pos: None,
            tokens: Some(tokens.to_vec()),
        }
    }

    /// The token ids this decode feeds.
    pub fn token_ids(&self) -> Vec<i32> {
        match &self.tokens {
            Some(t) => t.clone(),
            None => (0..self.n).map(default_token).collect(),
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecodeJson {
    #[serde(skip_serializing_if = "Option::is_none")]
    seq: Option<SeqId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seqs: Option<Vec<SeqId>>,
    n: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pos: Option<Pos>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tokens: Option<Vec<i32>>,
}

impl TryFrom<DecodeJson> for Decode {
    type Error = String;
    fn try_from(j: DecodeJson) -> Result<Self, String> {
        let seqs = match (j.seq, j.seqs) {
            (Some(s), None) => vec![s],
            (None, Some(v)) if !v.is_empty() => v,
            (None, Some(_)) => return Err("decode: \"seqs\" must not be empty".into()),
            (Some(_), Some(_)) => return Err("decode: give \"seq\" or \"seqs\", not both".into()),
            (None, None) => return Err("decode: missing \"seq\" (or \"seqs\")".into()),
        };
        if j.n == 0 {
            return Err("decode: \"n\" must be at least 1".into());
        }
        if let Some(t) = &j.tokens {
            if t.len() != j.n as usize {
                return Err(format!("decode: {} tokens given for n = {}", t.len(), j.n));
            }
        }
        Ok(Decode {
            seqs,
            n: j.n,
            pos: j.pos,
            tokens: j.tokens,
        })
    }
}

impl From<Decode> for DecodeJson {
    fn from(d: Decode) -> Self {
        let (seq, seqs) = if d.seqs.len() == 1 {
            (Some(d.seqs[0]), None)
        } else {
            (None, Some(d.seqs))
        };
        DecodeJson {
            seq,
            seqs,
            n: d.n,
            pos: d.pos,
            tokens: d.tokens,
        }
    }
}

impl Op {
    /// The op's kind: the one match from ops to their declaration ([`OpKind::info`]).
    pub const fn kind(&self) -> OpKind {
        match self {
            Op::SeqRm { .. } => OpKind::SeqRm,
            Op::SeqCp { .. } => OpKind::SeqCp,
            Op::SeqKeep { .. } => OpKind::SeqKeep,
            Op::SeqAdd { .. } => OpKind::SeqAdd,
            Op::SeqDiv { .. } => OpKind::SeqDiv,
            Op::Clear => OpKind::Clear,
            Op::Decode(_) => OpKind::Decode,
            Op::StateSeqSave { .. } => OpKind::StateSeqSave,
            Op::StateSeqLoad { .. } => OpKind::StateSeqLoad,
            Op::StateSave { .. } => OpKind::StateSave,
            Op::StateLoad { .. } => OpKind::StateLoad,
        }
    }

    /// The decode, if the op is one.
    pub fn as_decode(&self) -> Option<&Decode> {
        if let Op::Decode(d) = self {
            Some(d)
        } else {
            None
        }
    }

    /// The in-trace state buffer the op saves into or loads from, if it is a state op.
    pub fn slot(&self) -> Option<&Slot> {
        match self {
            Op::StateSeqSave { slot, .. }
            | Op::StateSeqLoad { slot, .. }
            | Op::StateSave { slot }
            | Op::StateLoad { slot, .. } => Some(slot),
            Op::SeqRm { .. }
            | Op::SeqCp { .. }
            | Op::SeqKeep { .. }
            | Op::SeqAdd { .. }
            | Op::SeqDiv { .. }
            | Op::Clear
            | Op::Decode(_) => None,
        }
    }

    /// Whether it loads a damaged buffer (a `state_load` or `state_seq_load` with `truncate` or
    /// `flip`).
    pub fn loads_damaged(&self) -> bool {
        if let Op::StateLoad { truncate, flip, .. } | Op::StateSeqLoad { truncate, flip, .. } = self
        {
            return truncate.is_some() || flip.is_some();
        }
        false
    }

    /// The op's name as in its JSON `op` field.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// Whether the op saves or loads state (the `state_*` ops).
    pub fn is_state_op(&self) -> bool {
        self.kind().group() == OpGroup::State
    }

    /// Calls `f` with each sequence id the op names (not -1).
    pub fn for_each_seq(&self, mut f: impl FnMut(SeqId)) {
        let mut g = |s: SeqId| {
            if s >= 0 {
                f(s)
            }
        };
        match self {
            Op::SeqRm { seq, .. }
            | Op::SeqKeep { seq }
            | Op::SeqAdd { seq, .. }
            | Op::SeqDiv { seq, .. }
            | Op::StateSeqSave { seq, .. }
            | Op::StateSeqLoad { seq, .. } => g(*seq),
            Op::SeqCp { src, dst, .. } => {
                g(*src);
                g(*dst);
            }
            Op::Clear | Op::StateSave { .. } | Op::StateLoad { .. } => {}
            Op::Decode(d) => d.seqs.iter().for_each(|&s| g(s)),
        }
    }

    /// The op as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("ops always serialize")
    }
}

fn range(p0: Pos, p1: Pos) -> String {
    format!("{p0}, {p1}")
}

impl fmt::Display for Op {
    /// The llama.h call the op stands for.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let call = self.kind().llama_fn();
        match self {
            Op::SeqRm { seq, p0, p1 } => write!(f, "{call}(mem, {seq}, {})", range(*p0, *p1)),
            Op::SeqCp { src, dst, p0, p1 } => {
                write!(f, "{call}(mem, {src}, {dst}, {})", range(*p0, *p1))
            }
            Op::SeqKeep { seq } => write!(f, "{call}(mem, {seq})"),
            Op::SeqAdd { seq, p0, p1, delta } => {
                write!(f, "{call}(mem, {seq}, {}, {delta})", range(*p0, *p1))
            }
            Op::SeqDiv { seq, p0, p1, d } => {
                write!(f, "{call}(mem, {seq}, {}, {d})", range(*p0, *p1))
            }
            Op::Clear => write!(f, "{call}(mem, true)"),
            Op::StateSeqSave { seq, slot, flags } => match flags {
                0 => write!(f, "{slot} = {call}(ctx, .., {seq})"),
                _ => write!(f, "{slot} = {call}_ext(ctx, .., {seq}, {flags})"),
            },
            Op::StateSeqLoad {
                seq,
                slot,
                flags,
                truncate,
                flip,
            } => {
                let d = describe_damage(*truncate, *flip);
                match flags {
                    0 => write!(f, "{call}(ctx, {slot}{d}, {seq})"),
                    _ => write!(f, "{call}_ext(ctx, {slot}{d}, {seq}, {flags})"),
                }
            }
            Op::StateSave { slot } => write!(f, "{slot} = {call}(ctx, ..)"),
            Op::StateLoad {
                slot,
                truncate,
                flip,
            } => {
                let d = describe_damage(*truncate, *flip);
                write!(f, "{call}(ctx, {slot}{d})")
            }
            Op::Decode(d) => {
                let seqs = d
                    .seqs
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join(",");
                match d.pos {
                    None => write!(
                        f,
                        "{call}(ctx, {} token(s) into seq {{{seqs}}} at next pos)",
                        d.n
                    ),
                    Some(p) => write!(
                        f,
                        "{call}(ctx, {} token(s) into seq {{{seqs}}} at pos {p}..{})",
                        d.n,
                        p + d.n as Pos - 1
                    ),
                }
            }
        }
    }
}

/// A setup plus the ops under test.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trace {
    /// Where the trace starts.
    pub setup: Setup,
    /// The ops under test, in order.
    pub ops: Vec<Op>,
}

impl Trace {
    /// Makes this trace's ops `ops`, cloning only those that differ from what it holds: a
    /// runner or explorer that fills one trace after another (an odometer turns the last op)
    /// then allocates nothing per trial.
    pub fn refill_ops<'a>(&mut self, ops: impl IntoIterator<Item = &'a Op>) {
        let mut len = 0;
        for (at, op) in ops.into_iter().enumerate() {
            match self.ops.get_mut(at) {
                Some(held) if held == op => {}
                Some(held) => held.clone_from(op),
                None => self.ops.push(op.clone()),
            }
            len = at + 1;
        }
        self.ops.truncate(len);
    }

    /// Makes this trace's ops `ops[k]` for each index `k` of `wanted`, where it holds `ops[h]`
    /// for each `h` of `held` (empty: not known): only the ops whose index changed are copied,
    /// none compared (an explorer's consecutive traces differ in their last op or so). With
    /// `held` unknown or of another length, [`Trace::refill_ops`].
    pub fn refill_indexed(&mut self, ops: &[Op], held: &[usize], wanted: &[usize]) {
        if held.len() != wanted.len() || self.ops.len() != wanted.len() {
            return self.refill_ops(wanted.iter().map(|&k| &ops[k]));
        }
        for ((op, &h), &k) in self.ops.iter_mut().zip(held).zip(wanted) {
            if h != k {
                op.clone_from(&ops[k]);
            }
        }
    }

    /// Whether a load of a damaged buffer ([`Op::loads_damaged`]) is among the first `step`
    /// ops: from there on two targets whose states are laid out differently
    /// ([`crate::base::cache::TargetInfo::same_state_layout`]) have made different loads.
    pub fn damaged_load_by(&self, step: usize) -> bool {
        self.ops.iter().take(step).any(Op::loads_damaged)
    }

    /// The sequences observed after each op: every sequence of the context (`0..n_seq_max`),
    /// so that every trace over one setup is observed the same way.
    pub fn observed_seqs(&self) -> Vec<SeqId> {
        (0..self.setup.n_seq_max as SeqId).collect()
    }
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for op in &self.setup.ops {
            writeln!(f, "  (setup) {op}")?;
        }
        for (i, op) in self.ops.iter().enumerate() {
            writeln!(f, "  {:>2}. {op}", i + 1)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_architecture_is_part_of_the_setup_and_left_out_when_llama() {
        let plain = Setup::default();
        let json = serde_json::to_string(&plain).unwrap();
        assert!(
            !json.contains("arch") && !json.contains("swa_full"),
            "{json}"
        );
        let gemma = plain.with_config("arch=gemma2,swa_full=off").unwrap();
        assert_eq!(gemma.arch.memory(), MemoryType::Iswa);
        let json = serde_json::to_string(&gemma).unwrap();
        assert!(json.contains(r#""arch":"gemma2""#) && json.contains(r#""swa_full":false"#));
        assert_eq!(serde_json::from_str::<Setup>(&json).unwrap(), gemma);
        assert!(gemma.config_label().contains("iswa memory (gemma2)"));
        let err = plain.with_config("arch=gpt2").unwrap_err();
        assert!(err.to_string().contains("unknown architecture"), "{err}");
    }

    #[test]
    fn op_json_matches_the_documented_form() {
        let cases: [(Op, &str); 7] = [
            (
                Op::SeqCp {
                    src: 0,
                    dst: 1,
                    p0: 0,
                    p1: 3,
                },
                r#"{"op":"seq_cp","src":0,"dst":1,"p0":0,"p1":3}"#,
            ),
            (
                Op::SeqRm {
                    seq: 0,
                    p0: 2,
                    p1: 5,
                },
                r#"{"op":"seq_rm","seq":0,"p0":2,"p1":5}"#,
            ),
            (Op::SeqKeep { seq: 0 }, r#"{"op":"seq_keep","seq":0}"#),
            (
                Op::SeqAdd {
                    seq: 0,
                    p0: 4,
                    p1: 7,
                    delta: 2,
                },
                r#"{"op":"seq_add","seq":0,"p0":4,"p1":7,"delta":2}"#,
            ),
            (
                Op::SeqDiv {
                    seq: 0,
                    p0: 0,
                    p1: 4,
                    d: 2,
                },
                r#"{"op":"seq_div","seq":0,"p0":0,"p1":4,"d":2}"#,
            ),
            (Op::Clear, r#"{"op":"clear"}"#),
            (
                Op::Decode(Decode::next(0, 7)),
                r#"{"op":"decode","seq":0,"n":7}"#,
            ),
        ];
        for (op, json) in cases {
            assert_eq!(op.to_json(), json);
            assert_eq!(serde_json::from_str::<Op>(json).unwrap(), op);
        }
    }

    #[test]
    fn multi_sequence_decode_round_trips() {
        let json = r#"{"op":"decode","seqs":[0,1],"n":2,"pos":5}"#;
        let op: Op = serde_json::from_str(json).unwrap();
        assert_eq!(op.to_json(), json);
        assert_eq!(
            op.to_string(),
            "llama_decode(ctx, 2 token(s) into seq {0,1} at pos 5..6)"
        );
    }

    #[test]
    fn malformed_ops_are_refused() {
        for bad in [
            r#"{"op":"seq_cp","src":0,"dst":1,"p0":0}"#,
            r#"{"op":"seq_rm","seq":0,"p0":2,"p1":5,"extra":1}"#,
            r#"{"op":"decode","n":2}"#,
            r#"{"op":"decode","seq":0,"n":0}"#,
            r#"{"op":"frobnicate"}"#,
        ] {
            assert!(
                serde_json::from_str::<Op>(bad).is_err(),
                "{bad} was accepted"
            );
        }
    }

    #[test]
    fn display_prints_the_llama_call() {
        assert_eq!(
            Op::SeqCp {
                src: 0,
                dst: 1,
                p0: 0,
                p1: 3
            }
            .to_string(),
            "llama_memory_seq_cp(mem, 0, 1, 0, 3)"
        );
        assert_eq!(Op::Clear.to_string(), "llama_memory_clear(mem, true)");
    }
}
