//! A decision as data: what people decided a class of findings is, why (the contract clause
//! or the source line), on which pins, the fix where one exists, and the class it covers.
//!
//! A decision is either a corpus file's `decision` (the class of the file's finding) or a file
//! of its own under `corpora/decisions/` (a class with no reproducer of its own: a tolerance, a
//! by-design difference, a guard, an artifact of kvaudit). Its `match` block is the class
//! evidence a hunt's group is compared with (`outputs::hunt`): the engine, the oracles, and
//! optionally the kinds, memory types, ops and configuration; a group matched by it is reported
//! as that decision, not as new. A decision without a `match` block covers only its file's own
//! class (the file match). The word is one of [`DecisionKind`]; any other is an error.

use serde::{Deserialize, Serialize};

use crate::base::config::MemoryType;
use crate::base::error::Error;
use crate::base::op::{Op, Setup};
use crate::base::op_kind::OpKind;
use crate::oracles::OracleId;
use crate::records::decision::{DecisionKind, DecisionNote};
use crate::records::finding::Finding;
use crate::targets::registry::Engine;

/// A decision about a class of findings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    /// What it was decided to be.
    pub decision: DecisionKind,
    /// The root cause's id (notes/issue45/root-causes.md's numbering: `R…` real, `Q…`
    /// contract questions, `D…` by design and guards, `G…` guards that hold, `A…` artifacts
    /// and tolerances, `M…` mlx-lm's).
    pub root_cause: String,
    /// The root cause in one line.
    pub summary: String,
    /// The contract clause it was read against, where the decision rests on one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contract: Option<Clause>,
    /// Where the cause is in the engine's source (`src/llama-kv-cells.h:486`), in the newest pin
    /// decided on unless the line names another.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source: Vec<String>,
    /// When, on which pins and where it was decided.
    pub decided: Decided,
    /// The fix under `corpora/fixes/` (its name) that makes the class hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// The class a hunt's group is compared with: one block, or a list of them (a root cause
    /// reached through several memory types or oracles whose shapes differ).
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub class: Option<MatchBlocks>,
    /// The corpus files this decision covers beside its own (a file of `corpora/decisions/`
    /// names those that share it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
    /// Upstream issues or pull requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upstream: Vec<String>,
}

/// A clause of the engine's documented contract.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Clause {
    /// Where: `include/llama.h:767-775`.
    pub source: String,
    /// What it says, quoted or in short.
    pub text: String,
}

/// When and where a decision was made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decided {
    /// The pins (or ranges, `0.1.113..0.1.161`) it was decided on, by reading their source or
    /// running them.
    pub pins: Vec<String>,
    /// The day, `YYYY-MM-DD`.
    pub date: String,
    /// Where the decision is written (`docs/results.md` section, `notes/issue45/decisions.md`
    /// item).
    pub by: String,
}

/// The class a decision covers, as a hunt's group shows it: every field must match one finding
/// of the group (a list matches when it holds the finding's value; an empty list matches any).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchBlock {
    /// The engine of the hunt's target.
    pub engine: Engine,
    /// The finding's oracle (at least one).
    pub oracles: Vec<OracleId>,
    /// Texts the finding's kind holds one of, line numbers aside.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
    /// The memory type of the finding's setup.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memories: Vec<MemoryType>,
    /// Op kinds of which the finding's trace (its setup's ops and its own) holds one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<String>,
    /// A configuration as `--config` takes it (`kv_unified=false,swa_full=true`) that the
    /// finding's setup has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    /// The finding's trace acts on a sequence id at or above its setup's `n_seq_max`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub seq_at_or_above_n_seq_max: bool,
    /// The finding's trace loads a damaged buffer (`truncate`, `flip`) at or before its step.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub damaged_load: bool,
    /// The finding's trace decodes into a sequence other than the finding's own (a class that
    /// needs another sequence's cells: D7, whose pools shift hybrid-idx's top-k tie-break).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub other_sequence_decoded: bool,
    /// The configuration the finding's run was paired with (`--vs-config`, a hunt entry's
    /// `~CONFIG`), as `--config` takes it: the same settings, in any order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vs_config: Option<String>,
    /// The versions of the finding's target (`0.1.156` of `llama.cpp@0.1.156+assert`) the class
    /// is decided on: a root cause present on some pins only decides nothing on the others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pins: Vec<String>,
    /// The finding's observed `max_abs_diff` (a logits probe's) is below this: a tolerance's
    /// class, with the figure it was measured at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_abs_diff_below: Option<f64>,
    /// The finding's observed `max_abs_diff` is at least this (`3.4e38`: the probe's decode
    /// gave no logits, `f32::MAX`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_abs_diff_at_least: Option<f64>,
}

/// The version of a target label (`llama.cpp@0.1.156+assert` -> `0.1.156`; `native` -> none).
fn version_of(target: &str) -> Option<&str> {
    let v = crate::targets::registry::TargetKind::version_of(target)?;
    Some(v.split(['+', ' ', '[']).next().unwrap_or(v))
}

/// A finding as a class is matched against it: the finding, and the configuration its run
/// was paired with, if any (`--vs-config`).
#[derive(Clone, Copy, Debug)]
pub struct Seen<'f> {
    /// The finding.
    pub finding: &'f Finding,
    /// Its run's `--vs-config`.
    pub vs_config: Option<&'f str>,
}

/// The settings of a configuration (`a=1,b=2`), sorted: two spellings of one configuration
/// compare equal.
fn settings(config: &str) -> Vec<&str> {
    let mut v: Vec<&str> = config
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    v.sort_unstable();
    v
}

/// A decision's class: one [`MatchBlock`] or several, written as one object or a list; a
/// finding is of the class when it is of one of them.
#[derive(Clone, Debug, PartialEq)]
pub struct MatchBlocks(pub Vec<MatchBlock>);

impl Serialize for MatchBlocks {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.as_slice() {
            [one] => one.serialize(s),
            many => many.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for MatchBlocks {
    /// One object or a list of them; the error of a block is its own (an unknown field named).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let v = serde_json::Value::deserialize(d)?;
        let blocks = match v {
            serde_json::Value::Array(items) => items
                .into_iter()
                .map(serde_json::from_value)
                .collect::<Result<Vec<MatchBlock>, _>>(),
            one => serde_json::from_value(one).map(|b| vec![b]),
        };
        let blocks = blocks.map_err(D::Error::custom)?;
        if blocks.is_empty() {
            return Err(D::Error::custom("\"match\": an empty list"));
        }
        Ok(MatchBlocks(blocks))
    }
}

impl MatchBlocks {
    /// Whether `seen`, a finding of a hunt on `engine`, is of one of the blocks.
    pub fn matches(&self, seen: Seen<'_>, engine: Engine) -> bool {
        self.0.iter().any(|m| m.matches(seen, engine))
    }

    fn validate(&self) -> Result<(), String> {
        self.0.iter().try_for_each(MatchBlock::validate)
    }
}

/// A logits finding's observed `max_abs_diff`.
fn max_abs_diff(f: &Finding) -> Option<f64> {
    f.observed
        .get("max_abs_diff")
        .and_then(serde_json::Value::as_f64)
}

/// Whether `trace` acts on a sequence id at or above its setup's `n_seq_max` (any id an op
/// names, `Op::for_each_seq`; a negative id is "every sequence", not one beyond).
fn seq_at_or_above_n_seq_max(trace: &crate::base::op::Trace) -> bool {
    let n = i64::from(trace.setup.n_seq_max);
    trace.setup.ops.iter().chain(&trace.ops).any(|op| {
        let mut beyond = false;
        op.for_each_seq(|s| beyond |= i64::from(s) >= n);
        beyond
    })
}

/// Whether `f`'s trace (setup and ops) decodes into a sequence other than `f.seq` (none: a
/// finding of no one sequence has no other).
fn other_sequence_decoded(f: &Finding) -> bool {
    f.seq.is_some_and(|own| {
        f.trace
            .setup
            .ops
            .iter()
            .chain(&f.trace.ops)
            .filter_map(Op::as_decode)
            .any(|d| d.seqs.iter().any(|&s| s != own))
    })
}

/// A kind without its digits: a crash's kind names its source line, which moves between
/// versions while the assertion stays (`llama-kv-cache.cpp:502` on 0.1.156 is `:524` on
/// 0.1.161).
pub fn without_numbers(kind: &str) -> String {
    kind.chars().filter(|c| !c.is_ascii_digit()).collect()
}

impl MatchBlock {
    /// Whether `seen`, a finding of a hunt on `engine`, is of this class.
    pub fn matches(&self, seen: Seen<'_>, engine: Engine) -> bool {
        let f = seen.finding;
        let setup = &f.trace.setup;
        let kind = without_numbers(&f.kind);
        let in_trace = |name: &String| {
            setup
                .ops
                .iter()
                .chain(&f.trace.ops)
                .any(|op| op.name() == name)
        };
        // A configuration the setup has is one that applying changes nothing.
        let configured = |c: &String| setup.with_config(c).is_ok_and(|s| s == *setup);
        self.engine == engine
            && self.oracles.contains(&f.oracle)
            && (self.kinds.is_empty()
                || self
                    .kinds
                    .iter()
                    .any(|k| kind.contains(&without_numbers(k))))
            && (self.memories.is_empty() || self.memories.contains(&setup.arch.memory()))
            && (self.ops.is_empty() || self.ops.iter().any(in_trace))
            && self.config.as_ref().map_or(true, configured)
            && (!self.seq_at_or_above_n_seq_max || seq_at_or_above_n_seq_max(&f.trace))
            && (!self.damaged_load || f.trace.damaged_load_by(f.step))
            && (!self.other_sequence_decoded || other_sequence_decoded(f))
            && self.vs_config.as_ref().map_or(true, |c| {
                seen.vs_config.is_some_and(|v| settings(v) == settings(c))
            })
            && (self.pins.is_empty()
                || version_of(&f.target).is_some_and(|v| self.pins.iter().any(|p| p == v)))
            && self
                .max_abs_diff_below
                .map_or(true, |x| max_abs_diff(f).is_some_and(|d| d < x))
            && self
                .max_abs_diff_at_least
                .map_or(true, |x| max_abs_diff(f).is_some_and(|d| d >= x))
    }

    /// What the schema cannot check: an oracle at least, known op kinds, a configuration
    /// `--config` takes.
    fn validate(&self) -> Result<(), String> {
        if self.oracles.is_empty() {
            return Err(
                "\"match\": no oracle (a class of every oracle would decide anything)".into(),
            );
        }
        if let Some(op) = self
            .ops
            .iter()
            .find(|o| !OpKind::ALL.iter().any(|k| k.name() == o.as_str()))
        {
            return Err(format!("\"match\": {op:?} is not an op kind"));
        }
        if let Some(c) = &self.config {
            Setup::default()
                .with_config(c)
                .map_err(|e| format!("\"match\": config {c:?}: {e}"))?;
        }
        Ok(())
    }
}

impl Decision {
    /// What the schema cannot check: the one-line fields and the match block.
    pub fn validate(&self) -> Result<(), Error> {
        let one_line = [
            ("root_cause", &self.root_cause),
            ("summary", &self.summary),
            ("decided.date", &self.decided.date),
            ("decided.by", &self.decided.by),
        ];
        for (field, text) in one_line {
            if text.trim().is_empty() {
                return Err(format!("\"decision\": \"{field}\" is empty").into());
            }
            if text.chars().any(char::is_control) {
                return Err(format!("\"decision\": \"{field}\" holds a control character").into());
            }
        }
        match &self.class {
            Some(m) => m.validate().map_err(Error::from),
            None => Ok(()),
        }
    }

    /// Parses a file of `corpora/decisions/`; an error says what is wrong (the caller names
    /// the file).
    pub fn parse(text: &str) -> Result<Decision, Error> {
        let d: Decision = serde_json::from_str(text).map_err(|e| Error::from(e.to_string()))?;
        d.validate()?;
        Ok(d)
    }

    /// What a hunt's group records of it.
    pub fn note(&self) -> DecisionNote {
        DecisionNote {
            root_cause: self.root_cause.clone(),
            decision: self.decision,
            summary: self.summary.clone(),
            fix: self.fix.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(word: &str) -> String {
        format!(
            r#"{{"decision": "{word}", "root_cause": "Q9", "summary": "s",
                "decided": {{"pins": ["0.1.161"], "date": "2026-12-07", "by": "a test"}},
                "match": {{"engine": "llama.cpp", "oracles": ["I1"], "ops": ["seq_add"],
                          "memories": ["recurrent"], "config": "kv_unified=false"}}}}"#
        )
    }

    #[test]
    fn every_word_parses_and_another_is_an_error() {
        for k in DecisionKind::ALL {
            assert_eq!(Decision::parse(&decision(k.word())).unwrap().decision, k);
        }
        let e = Decision::parse(&decision("wontfix")).unwrap_err().message;
        assert!(e.contains("unknown variant `wontfix`"), "{e}");
    }

    #[test]
    fn a_match_block_needs_an_oracle_and_known_op_kinds() {
        let no_oracle = decision("real").replace(r#"["I1"]"#, "[]");
        assert!(Decision::parse(&no_oracle)
            .unwrap_err()
            .message
            .contains("no oracle"));
        let bad_op = decision("real").replace("seq_add", "seq_shove");
        assert!(Decision::parse(&bad_op)
            .unwrap_err()
            .message
            .contains("seq_shove"));
        let bad_config = decision("real").replace("kv_unified=false", "kv_unified=maybe");
        assert!(Decision::parse(&bad_config).is_err());
    }

    #[test]
    fn a_finding_matches_only_its_class() {
        let d = Decision::parse(&decision("question")).unwrap();
        let m = d.class.unwrap();
        let trace = r#"{"setup": {"n_ctx": 256, "n_seq_max": 2, "arch": "mamba", "kv_unified": false,
                                  "ops": [{"op":"decode","seq":0,"n":1}]},
                        "ops": [{"op":"seq_add","seq":0,"p0":0,"p1":-1,"delta":-2}]}"#;
        let f = Finding {
            oracle: OracleId::I1,
            kind: "pos_max disagree with the cells".into(),
            target: "llama.cpp@0.1.161".into(),
            depth: 1,
            trial_index: 0,
            step: 1,
            seq: Some(0),
            trace: serde_json::from_str(trace).unwrap(),
            observed: serde_json::Value::Null,
            expected: serde_json::Value::Null,
        };
        let seen = |f| Seen {
            finding: f,
            vs_config: None,
        };
        assert!(m.matches(seen(&f), Engine::LlamaCpp));
        assert!(!m.matches(seen(&f), Engine::MlxLm), "another engine");
        let mut other = f.clone();
        other.oracle = OracleId::I2;
        assert!(!m.matches(seen(&other), Engine::LlamaCpp), "another oracle");
        let mut unified = f.clone();
        unified.trace.setup.kv_unified = true;
        assert!(
            !m.matches(seen(&unified), Engine::LlamaCpp),
            "another configuration"
        );
        let mut no_shift = f.clone();
        no_shift.trace.ops.clear();
        assert!(
            !m.matches(seen(&no_shift), Engine::LlamaCpp),
            "no op of the class"
        );
        // A class that needs another sequence's cells: only a trace that decodes into one.
        let others = MatchBlock {
            other_sequence_decoded: true,
            ..m.0[0].clone()
        };
        assert!(!others.matches(seen(&f), Engine::LlamaCpp), "seq 0 alone");
        let mut two = f.clone();
        two.trace
            .setup
            .ops
            .push(serde_json::from_str(r#"{"op":"decode","seq":1,"n":1}"#).unwrap());
        assert!(
            others.matches(seen(&two), Engine::LlamaCpp),
            "seq 1 decoded too"
        );
        // A sequence id at or above n_seq_max (2 here): 2 is, 1 and -1 ("every") are not.
        let beyond = MatchBlock {
            seq_at_or_above_n_seq_max: true,
            ..m.0[0].clone()
        };
        assert!(!beyond.matches(seen(&two), Engine::LlamaCpp), "seq 1 < 2");
        let mut every = f.clone();
        every
            .trace
            .ops
            .push(serde_json::from_str(r#"{"op":"seq_rm","seq":-1,"p0":0,"p1":-1}"#).unwrap());
        assert!(
            !beyond.matches(seen(&every), Engine::LlamaCpp),
            "-1 is every sequence"
        );
        let mut past = every.clone();
        past.trace
            .setup
            .ops
            .push(serde_json::from_str(r#"{"op":"decode","seq":2,"n":1}"#).unwrap());
        assert!(beyond.matches(seen(&past), Engine::LlamaCpp), "seq 2 >= 2");
        let mut no_seq = two.clone();
        no_seq.seq = None;
        assert!(
            !others.matches(seen(&no_seq), Engine::LlamaCpp),
            "no own sequence"
        );
    }
}
