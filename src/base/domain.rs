//! Finite argument domains: what an exhaustive audit enumerates.
//!
//! A [`Domain`] is a setup plus a list of argument choices; [`Domain::ops`] turns it into the
//! ordered list of ops. Presets are built in (`seed`, `wide`); a TOML file names a preset and
//! overrides fields; the command line overrides fields again. The order of the op list is part
//! of the contract: exhaustive audits enumerate traces lexicographically over it, so the first
//! violating trace of a kind is the smallest one in that order.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::base::error::Error;
use crate::base::op::{Decode, Op, Pos, SeqId, Setup};

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
}

/// The names of the built-in presets.
pub const PRESETS: [&str; 2] = ["seed", "wide"];

impl Domain {
    /// A built-in preset by name.
    pub fn preset(name: &str) -> Option<Domain> {
        let seed = Domain {
            name: "seed".into(),
            setup: Setup {
                n_ctx: 256,
                n_seq_max: 2,
                ops: vec![Op::Decode(Decode::next(0, 7))],
            },
            seqs: vec![0, 1],
            ranges: vec![[0, 3], [2, 5], [4, 7], [-1, -1]],
            deltas: vec![2, -2],
            divisors: vec![2],
            rm_all: true,
            copies: true,
            keep: true,
            clear: true,
            decode_next: vec![1],
        };
        match name {
            "seed" => Some(seed),
            "wide" => Some(Domain {
                name: "wide".into(),
                setup: Setup {
                    n_seq_max: 3,
                    ..seed.setup.clone()
                },
                seqs: vec![0, 1, 2],
                ranges: vec![[0, 3], [2, 5], [4, 7], [3, -1], [-1, -1]],
                deltas: vec![2, -2, -4],
                divisors: vec![2, 3],
                decode_next: vec![1, 2],
                ..seed
            }),
            _ => None,
        }
    }

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
            for &src in &self.seqs {
                for &dst in self.seqs.iter().filter(|&&d| d != src) {
                    for &[p0, p1] in &self.ranges {
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
        ops
    }

    /// Loads a domain file: TOML naming an optional `preset` (default `seed`) and overriding any
    /// field of it.
    pub fn from_file(path: &Path) -> Result<Domain, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
        Self::from_toml(&text).map_err(|e| e.context(path.display()))
    }

    /// Parses domain TOML (see [`Domain::from_file`]).
    pub fn from_toml(text: &str) -> Result<Domain, Error> {
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

    /// Checks that the domain makes sense before anything runs.
    pub fn validate(&self) -> Result<(), Error> {
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
    let before = &text[..byte.min(text.len())];
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
