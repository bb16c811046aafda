//! Finite argument domains: what an exhaustive audit enumerates.
//!
//! A [`Domain`] is a setup plus a list of argument choices; [`Domain::ops`] turns it into the
//! ordered list of ops. Presets are built in (`seed`, `wide`); a TOML file names a preset and
//! overrides fields; the command line overrides fields again. The order of the op list is part
//! of the contract: exhaustive audits enumerate traces lexicographically over it, so the first
//! violating trace of a kind is the smallest one in that order.
//!
//! A domain file may come from someone else: it is read up to [`MAX_DOMAIN_FILE_BYTES`], and
//! [`Domain::validate`] bounds the op list ([`MAX_DOMAIN_OPS`], counted before it is built) and the
//! setup ([`check_setup_limits`]) before anything allocates in proportion to them.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::base::error::Error;
use crate::base::files::{check_input_size, read_text_limited};
use crate::base::op::{Arch, CacheType, Decode, Op, OpKind, Pos, SeqId, Setup, Slot};

/// The largest domain file read (1 MiB; the presets are a few hundred bytes).
pub const MAX_DOMAIN_FILE_BYTES: u64 = 1 << 20;
/// Most ops a domain may enumerate (the `wide` preset has fewer than 100; an exhaustive audit
/// runs ops^depth traces, so a larger list is never what a user wants).
pub const MAX_DOMAIN_OPS: u64 = 10_000;
/// Most setup ops.
pub const MAX_SETUP_OPS: usize = 10_000;
/// Largest `n_ctx` a setup may ask for (cells a target allocates before the first op).
pub const MAX_N_CTX: u32 = 1 << 20;
/// Largest `n_seq_max` (llama.cpp's `LLAMA_MAX_SEQ` is 256).
pub const MAX_N_SEQ_MAX: u32 = 256;

/// Most dumps of other configurations a setup may start its slots with ([`Setup::foreign`]).
pub const MAX_FOREIGN_DUMPS: usize = 8;

/// Checks a setup read from a file (domain or repro) against [`MAX_N_CTX`], [`MAX_N_SEQ_MAX`] and
/// [`MAX_SETUP_OPS`], and each setup decode's token count against `n_ctx`.
pub fn check_setup_limits(s: &Setup) -> Result<(), Error> {
    if s.n_ctx == 0 || s.n_ctx > MAX_N_CTX {
        return Err(format!("setup.n_ctx {} is outside 1..={MAX_N_CTX}", s.n_ctx).into());
    }
    if s.n_seq_max == 0 || s.n_seq_max > MAX_N_SEQ_MAX {
        return Err(format!(
            "setup.n_seq_max {} is outside 1..={MAX_N_SEQ_MAX}",
            s.n_seq_max
        )
        .into());
    }
    if s.foreign.len() > MAX_FOREIGN_DUMPS {
        return Err(format!(
            "setup.foreign: {} dumps, more than the limit of {MAX_FOREIGN_DUMPS}",
            s.foreign.len()
        )
        .into());
    }
    for f in &s.foreign {
        let maker = f
            .maker(s)
            .map_err(|e| format!("setup.foreign, slot {}: {e}", f.slot))?;
        if maker.ops.len() > MAX_SETUP_OPS {
            return Err(format!(
                "setup.foreign, slot {}: {} ops with the setup's, more than the limit of {MAX_SETUP_OPS}",
                f.slot,
                maker.ops.len()
            )
            .into());
        }
        check_decodes_fit(&f.ops, maker.n_ctx, "setup.foreign op")?;
    }
    if s.ops.len() > MAX_SETUP_OPS {
        return Err(format!(
            "setup.ops: {} ops, more than the limit of {MAX_SETUP_OPS}",
            s.ops.len()
        )
        .into());
    }
    check_decodes_fit(&s.ops, s.n_ctx, "setup op")
}

/// Most ops a trace read from a file may hold (its setup counts apart, see
/// [`check_setup_limits`]).
pub const MAX_TRACE_OPS: usize = 100_000;

/// Checks a trace read from a file (a repro, a report's finding): the setup within
/// [`check_setup_limits`], at most [`MAX_TRACE_OPS`] ops, no decode of more tokens than `n_ctx`.
/// Replaying, shrinking or emitting a trace allocates in proportion to these.
pub fn check_trace_limits(t: &crate::base::op::Trace) -> Result<(), Error> {
    check_setup_limits(&t.setup)?;
    if t.ops.len() > MAX_TRACE_OPS {
        return Err(format!(
            "{} ops, more than the limit of {MAX_TRACE_OPS}",
            t.ops.len()
        )
        .into());
    }
    check_decodes_fit(&t.ops, t.setup.n_ctx, "op")
}

/// Every decode in `ops` asks for at most `n_ctx` tokens (`what` names the list in the error).
pub fn check_decodes_fit(ops: &[Op], n_ctx: u32, what: &str) -> Result<(), Error> {
    for (i, op) in ops.iter().enumerate() {
        if let Op::Decode(d) = op {
            if d.n > n_ctx {
                return Err(format!(
                    "{what} {}: decode of {} tokens, more than n_ctx {n_ctx}",
                    i + 1,
                    d.n
                )
                .into());
            }
        }
    }
    Ok(())
}

/// A finite argument domain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Domain {
    /// Name, for reports.
    pub name: String,
    /// Where every trace starts.
    pub setup: Setup,
    /// Sequences the ops name.
    pub seqs: Vec<SeqId>,
    /// Position ranges `[p0, p1)`; negative ends are open, as in llama.h.
    pub ranges: Vec<[Pos; 2]>,
    /// Deltas for `seq_add`.
    pub deltas: Vec<Pos>,
    /// Divisors for `seq_div`.
    pub divisors: Vec<i32>,
    /// Include `seq_rm(-1, range)` (every sequence).
    pub rm_all: bool,
    /// Include `seq_cp` between every ordered pair of distinct sequences.
    pub copies: bool,
    /// Include `seq_keep(seq)` for each sequence.
    pub keep: bool,
    /// Include `clear`.
    pub clear: bool,
    /// For each n here, a decode of n tokens at "next" positions into each sequence.
    pub decode_next: Vec<u32>,
    /// The ranges `seq_cp` uses, when not `ranges` (llama-server copies whole sequences only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_ranges: Option<Vec<[Pos; 2]>>,
    /// Include a decode of one token into every sequence of `seqs` at once (`"seqs":[..]`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub decode_shared: bool,
    /// Sequence ids at or above `n_seq_max` to decode one token into and `seq_rm` whole
    /// (llama.cpp's unified cache accepts ids up to its internal maximum).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub beyond_seqs: Vec<SeqId>,
    /// Include the state ops: per sequence, `state_seq_save` into slot `a` and
    /// `state_seq_load` from it (into every sequence); the whole context into / from slot `s`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub state: bool,
    /// Non-zero `llama_state_seq_flags` values: each adds `_ext` saves and loads with them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_flags: Vec<u32>,
    /// Byte counts to truncate a loaded buffer to: damaged loads, per sequence and whole.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub load_truncate: Vec<u32>,
}

/// An empty domain over the default setup: no sequences, no arguments, no ops. Callers fill
/// in what they enumerate (`Domain { seqs, copies: true, ..Domain::default() }`).
impl Default for Domain {
    fn default() -> Self {
        Domain {
            name: String::new(),
            setup: Setup::default(),
            seqs: Vec::new(),
            ranges: Vec::new(),
            deltas: Vec::new(),
            divisors: Vec::new(),
            rm_all: false,
            copies: false,
            keep: false,
            clear: false,
            decode_next: Vec::new(),
            copy_ranges: None,
            decode_shared: false,
            beyond_seqs: Vec::new(),
            state: false,
            state_flags: Vec::new(),
            load_truncate: Vec::new(),
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

mod presets;

pub use presets::{PRESETS, PRESET_SUMMARIES};

impl Domain {
    /// The ops of this domain, in enumeration order: `seq_rm`, `seq_cp`, `seq_keep`, `seq_add`,
    /// `seq_div`, `clear`, decode; within each, sequences then ranges then values in the order
    /// given.
    pub fn ops(&self) -> Vec<Op> {
        let mut ops = Vec::new();
        let rm_seqs = self.seqs.iter().copied().chain(self.rm_all.then_some(-1));
        for seq in rm_seqs {
            for &[p0, p1] in &self.ranges {
                ops.push(Op::SeqRm { seq, p0, p1 });
            }
        }
        if self.copies {
            let copy_ranges = self.copy_ranges.as_ref().unwrap_or(&self.ranges);
            for &src in &self.seqs {
                for &dst in self.seqs.iter().filter(|&&d| d != src) {
                    for &[p0, p1] in copy_ranges {
                        ops.push(Op::SeqCp { src, dst, p0, p1 });
                    }
                }
            }
        }
        if self.keep {
            ops.extend(self.seqs.iter().map(|&seq| Op::SeqKeep { seq }));
        }
        for &seq in &self.seqs {
            for &[p0, p1] in &self.ranges {
                for &delta in &self.deltas {
                    ops.push(Op::SeqAdd { seq, p0, p1, delta });
                }
            }
        }
        for &seq in &self.seqs {
            for &[p0, p1] in &self.ranges {
                for &d in &self.divisors {
                    ops.push(Op::SeqDiv { seq, p0, p1, d });
                }
            }
        }
        if self.clear {
            ops.push(Op::Clear);
        }
        for &n in &self.decode_next {
            ops.extend(
                self.seqs
                    .iter()
                    .map(|&seq| Op::Decode(Decode::next(seq, n))),
            );
        }
        if self.decode_shared && self.seqs.len() > 1 {
            ops.push(Op::Decode(Decode {
                seqs: self.seqs.clone(),
                ..Decode::next(self.seqs[0], 1)
            }));
        }
        for &seq in &self.beyond_seqs {
            ops.push(Op::Decode(Decode::next(seq, 1)));
            ops.push(Op::SeqRm {
                seq,
                p0: -1,
                p1: -1,
            });
        }
        if self.state {
            self.push_state_ops(&mut ops);
        }
        // The loads of the dumps saved under another configuration: a whole one, or a
        // sequence's into every sequence.
        for f in &self.setup.foreign {
            let load = |seq: Option<SeqId>| match seq {
                None => Op::StateLoad {
                    slot: f.slot.clone(),
                    truncate: None,
                    flip: None,
                },
                Some(seq) => Op::StateSeqLoad {
                    seq,
                    slot: f.slot.clone(),
                    flags: 0,
                    truncate: None,
                    flip: None,
                },
            };
            match f.seq {
                None => ops.push(load(None)),
                Some(_) => ops.extend(self.seqs.iter().map(|&seq| load(Some(seq)))),
            }
        }
        ops
    }

    /// The state ops of [`Domain::state`]: saves, then loads, then damaged loads; flags after.
    fn push_state_ops(&self, ops: &mut Vec<Op>) {
        let a = Slot::new("a").expect("a valid slot name");
        let s = Slot::new("s").expect("a valid slot name");
        for flags in std::iter::once(0).chain(self.state_flags.iter().copied()) {
            for &seq in &self.seqs {
                ops.push(Op::StateSeqSave {
                    seq,
                    slot: a.clone(),
                    flags,
                });
            }
            for &seq in &self.seqs {
                ops.push(Op::StateSeqLoad {
                    seq,
                    slot: a.clone(),
                    flags,
                    truncate: None,
                    flip: None,
                });
            }
        }
        ops.push(Op::StateSave { slot: s.clone() });
        ops.push(Op::StateLoad {
            slot: s.clone(),
            truncate: None,
            flip: None,
        });
        for &t in &self.load_truncate {
            for &seq in &self.seqs {
                ops.push(Op::StateSeqLoad {
                    seq,
                    slot: a.clone(),
                    flags: 0,
                    truncate: Some(t),
                    flip: None,
                });
            }
            ops.push(Op::StateLoad {
                slot: s.clone(),
                truncate: Some(t),
                flip: None,
            });
        }
    }

    /// Loads a domain file: TOML naming an optional `preset` (default `seed`) and overriding any
    /// field of it.
    pub fn from_file(path: &Path) -> Result<Domain, Error> {
        let text = read_text_limited(path, MAX_DOMAIN_FILE_BYTES)?;
        Self::from_toml(&text).map_err(|e| e.context(path.display()))
    }

    /// Parses domain TOML (see [`Domain::from_file`]).
    pub fn from_toml(text: &str) -> Result<Domain, Error> {
        check_input_size(text.len() as u64, MAX_DOMAIN_FILE_BYTES, "a domain file")?;
        let file: DomainOverrides = toml::from_str(text).map_err(|e| {
            let at = e
                .span()
                .map(|s| line_col(text, s.start))
                .unwrap_or_default();
            format!("{at}{}", e.message())
        })?;
        let preset = file.preset.as_deref().unwrap_or("seed");
        let mut d = Domain::preset(preset)
            .ok_or_else(|| format!("unknown preset '{preset}' (known: {})", PRESETS.join(", ")))?;
        file.apply(&mut d);
        d.validate()?;
        Ok(d)
    }

    /// How many ops [`Domain::ops`] lists at most, counted without building them (duplicate
    /// sequences make the real list shorter), saturating: the sum over the kinds.
    fn op_count_bound(&self) -> u64 {
        OpKind::ALL
            .iter()
            .map(|&k| self.kind_count_bound(k))
            .fold(0, u64::saturating_add)
    }

    /// How many ops of `kind` [`Domain::ops`] lists at most (exactly as many when the sequences
    /// are distinct), counted without building them, saturating: the kind's domain axis
    /// ([`OpKind::domain_fields`]) as a count.
    pub fn kind_count_bound(&self, kind: OpKind) -> u64 {
        let n = |v: usize| v as u64;
        let (seqs, ranges) = (n(self.seqs.len()), n(self.ranges.len()));
        let per_seq_range = |values: usize| seqs.saturating_mul(ranges).saturating_mul(n(values));
        let state = u64::from(self.state);
        let flag_sets = 1 + n(self.state_flags.len());
        let truncates = n(self.load_truncate.len());
        let beyond = n(self.beyond_seqs.len());
        let foreign_seq = n(self
            .setup
            .foreign
            .iter()
            .filter(|f| f.seq.is_some())
            .count());
        let foreign_whole = n(self.setup.foreign.len()) - foreign_seq;
        match kind {
            OpKind::SeqRm => (seqs + u64::from(self.rm_all))
                .saturating_mul(ranges)
                .saturating_add(beyond),
            OpKind::SeqCp => {
                let copy_ranges = self.copy_ranges.as_ref().map_or(ranges, |r| n(r.len()));
                let pairs = seqs.saturating_mul(seqs.saturating_sub(1));
                u64::from(self.copies).saturating_mul(pairs.saturating_mul(copy_ranges))
            }
            OpKind::SeqKeep => u64::from(self.keep) * seqs,
            OpKind::SeqAdd => per_seq_range(self.deltas.len()),
            OpKind::SeqDiv => per_seq_range(self.divisors.len()),
            OpKind::Clear => u64::from(self.clear),
            OpKind::Decode => seqs
                .saturating_mul(n(self.decode_next.len()))
                .saturating_add(u64::from(self.decode_shared && seqs > 1))
                .saturating_add(beyond),
            OpKind::StateSeqSave => state * seqs.saturating_mul(flag_sets),
            OpKind::StateSeqLoad => (state
                * seqs.saturating_mul(flag_sets.saturating_add(truncates)))
            .saturating_add(seqs.saturating_mul(foreign_seq)),
            OpKind::StateSave => state,
            OpKind::StateLoad => (state * (1 + truncates)).saturating_add(foreign_whole),
        }
    }

    /// Checks the size limits alone: the setup ([`check_setup_limits`]) and the op count
    /// ([`MAX_DOMAIN_OPS`]), without building the op list. A report read back checks its domain
    /// this way before rendering it.
    pub fn check_limits(&self) -> Result<(), Error> {
        check_setup_limits(&self.setup)?;
        if self.op_count_bound() > MAX_DOMAIN_OPS {
            return Err(format!(
                "the domain would list up to {} ops, more than the limit of {MAX_DOMAIN_OPS}",
                self.op_count_bound()
            )
            .into());
        }
        Ok(())
    }

    /// Checks that the domain makes sense before anything runs.
    pub fn validate(&self) -> Result<(), Error> {
        self.check_limits()?;
        if let Some(&n) = self.decode_next.iter().find(|&&n| n > self.setup.n_ctx) {
            return Err(Error::input(format!(
                "decode_next: {n} tokens, more than setup.n_ctx {}",
                self.setup.n_ctx
            )));
        }
        if self.seqs.is_empty() {
            return Err("seqs: at least one sequence is needed".into());
        }
        if let Some(s) = self
            .seqs
            .iter()
            .find(|&&s| s < 0 || s as u32 >= self.setup.n_seq_max)
        {
            return Err(format!(
                "seqs: {s} is outside 0..{} (setup.n_seq_max)",
                self.setup.n_seq_max
            )
            .into());
        }
        if let Some(s) = self
            .beyond_seqs
            .iter()
            .find(|&&s| (s as u32) < self.setup.n_seq_max || s < 0 || s >= MAX_N_SEQ_MAX as i32)
        {
            return Err(format!(
                "beyond_seqs: {s} is not in {}..{MAX_N_SEQ_MAX} (at or above setup.n_seq_max)",
                self.setup.n_seq_max
            )
            .into());
        }
        if self.divisors.contains(&0) {
            return Err(
                "divisors: 0 aborts llama.cpp (it divides by zero); leave it out of a domain"
                    .into(),
            );
        }
        if self.ops().is_empty() {
            return Err("the domain has no ops".into());
        }
        Ok(())
    }
}

fn line_col(text: &str, byte: usize) -> String {
    let before = text.get(..byte).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    format!("line {line}, column {col}: ")
}

/// Field overrides, shared by domain files and the command line.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainOverrides {
    /// The preset a domain file starts from (files only; default `seed`).
    pub preset: Option<String>,
    /// New name.
    pub name: Option<String>,
    /// New setup.
    pub setup: Option<Setup>,
    /// New sequences.
    pub seqs: Option<Vec<SeqId>>,
    /// New ranges.
    pub ranges: Option<Vec<[Pos; 2]>>,
    /// New deltas.
    pub deltas: Option<Vec<Pos>>,
    /// New divisors.
    pub divisors: Option<Vec<i32>>,
    /// Include `seq_rm(-1, ..)`.
    pub rm_all: Option<bool>,
    /// Include copies.
    pub copies: Option<bool>,
    /// Include keeps.
    pub keep: Option<bool>,
    /// Include clear.
    pub clear: Option<bool>,
    /// Decode-next token counts.
    pub decode_next: Option<Vec<u32>>,
    /// Ranges for copies.
    pub copy_ranges: Option<Vec<[Pos; 2]>>,
    /// Include the shared decode.
    pub decode_shared: Option<bool>,
    /// Sequence ids beyond n_seq_max.
    pub beyond_seqs: Option<Vec<SeqId>>,
    /// Include the state ops.
    pub state: Option<bool>,
    /// State flags.
    pub state_flags: Option<Vec<u32>>,
    /// Truncated loads.
    pub load_truncate: Option<Vec<u32>>,
}

impl DomainOverrides {
    /// Applies every field that is set.
    pub fn apply(self, d: &mut Domain) {
        let changed = self.seqs.is_some()
            || self.ranges.is_some()
            || self.deltas.is_some()
            || self.divisors.is_some()
            || self.setup.is_some()
            || self.decode_next.is_some();
        let explicit_setup = self.setup.is_some();
        if let Some(v) = self.setup {
            d.setup = v;
        }
        if let Some(v) = self.seqs {
            // More sequences need a context made for them, unless the setup says otherwise.
            let need = v.iter().copied().max().map_or(0, |m| m + 1).max(0) as u32;
            if !explicit_setup && need > d.setup.n_seq_max {
                d.setup.n_seq_max = need;
            }
            d.seqs = v;
        }
        if let Some(v) = self.ranges {
            d.ranges = v;
        }
        if let Some(v) = self.deltas {
            d.deltas = v;
        }
        if let Some(v) = self.divisors {
            d.divisors = v;
        }
        if let Some(v) = self.rm_all {
            d.rm_all = v;
        }
        if let Some(v) = self.copies {
            d.copies = v;
        }
        if let Some(v) = self.keep {
            d.keep = v;
        }
        if let Some(v) = self.clear {
            d.clear = v;
        }
        if let Some(v) = self.decode_next {
            d.decode_next = v;
        }
        let changed = changed
            || self.copy_ranges.is_some()
            || self.beyond_seqs.is_some()
            || self.state_flags.is_some()
            || self.load_truncate.is_some();
        if let Some(v) = self.copy_ranges {
            d.copy_ranges = Some(v);
        }
        if let Some(v) = self.decode_shared {
            d.decode_shared = v;
        }
        if let Some(v) = self.beyond_seqs {
            d.beyond_seqs = v;
        }
        if let Some(v) = self.state {
            d.state = v;
        }
        if let Some(v) = self.state_flags {
            d.state_flags = v;
        }
        if let Some(v) = self.load_truncate {
            d.load_truncate = v;
        }
        match self.name {
            Some(n) => d.name = n,
            None if changed => d.name = format!("{}+custom", d.name),
            None => {}
        }
    }
}

/// Parses a range written `P0:P1` (`0:3`), `P0:` (open end), `:P1` (open start) or `open`.
pub fn parse_range(s: &str) -> Result<[Pos; 2], String> {
    if s == "open" {
        return Ok([-1, -1]);
    }
    let (a, b) = s
        .split_once(':')
        .ok_or_else(|| format!("range '{s}': expected P0:P1, P0:, :P1 or open"))?;
    let end = |t: &str| -> Result<Pos, String> {
        if t.is_empty() {
            Ok(-1)
        } else {
            t.parse()
                .map_err(|_| format!("range '{s}': '{t}' is not a position"))
        }
    };
    Ok([end(a)?, end(b)?])
}

/// Number of trials of length `1..=depth` over `n` ops: sum of n^k.
pub fn total_trials(n: u64, depth: u32) -> u64 {
    (1..=depth)
        .map(|k| n.saturating_pow(k))
        .fold(0u64, u64::saturating_add)
}

/// Fuzz target `domain_toml` (`fuzz/fuzz_targets/domain_toml.rs`, and `tests/it/fuzz_seeds.rs`
/// over its seeds): any bytes either fail to parse with an error or give a domain that
/// validates and lists at most [`MAX_DOMAIN_OPS`] ops. Panics otherwise.
#[doc(hidden)]
pub fn fuzz_domain_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(d) = Domain::from_toml(text) {
        let ops = d.ops();
        assert!(!ops.is_empty() && ops.len() as u64 <= MAX_DOMAIN_OPS);
        assert_eq!(d.validate(), Ok(()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_preset_has_49_ops_in_documented_order() {
        let d = Domain::preset("seed").unwrap();
        let ops = d.ops();
        assert_eq!(ops.len(), 49);
        assert_eq!(
            ops[0],
            Op::SeqRm {
                seq: 0,
                p0: 0,
                p1: 3
            }
        );
        assert_eq!(
            ops[12],
            Op::SeqCp {
                src: 0,
                dst: 1,
                p0: 0,
                p1: 3
            }
        );
        assert_eq!(ops[20], Op::SeqKeep { seq: 0 });
        assert_eq!(ops[48], Op::Decode(Decode::next(1, 1)));
    }

    #[test]
    fn toml_overrides_a_preset() {
        let d =
            Domain::from_toml("preset = \"seed\"\nseqs = [0, 1, 2]\nranges = [[0, 2]]\n").unwrap();
        assert_eq!(d.seqs, vec![0, 1, 2]);
        assert_eq!(d.name, "seed+custom");
        assert!(d.ops().contains(&Op::SeqCp {
            src: 2,
            dst: 0,
            p0: 0,
            p1: 2
        }));
    }

    #[test]
    fn malformed_toml_names_line_and_field() {
        let e = Domain::from_toml("seqs = [0, 1]\nrangez = [[0, 2]]\n").unwrap_err();
        assert!(e.message.starts_with("line 2"), "{e}");
        assert!(e.message.contains("rangez"), "{e}");
        let e = Domain::from_toml("preset = \"nope\"").unwrap_err();
        assert!(e.message.contains("unknown preset"), "{e}");
        let e = Domain::from_toml("seqs = [0, -3]").unwrap_err();
        assert!(e.message.contains("outside"), "{e}");
    }

    #[test]
    fn ranges_parse() {
        assert_eq!(parse_range("0:3").unwrap(), [0, 3]);
        assert_eq!(parse_range("3:").unwrap(), [3, -1]);
        assert_eq!(parse_range("open").unwrap(), [-1, -1]);
        assert!(parse_range("3-4").is_err());
    }
}
