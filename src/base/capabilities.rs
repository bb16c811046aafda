//! What a target declares it can do: its op kinds, where it reads a sequence's resident
//! positions from, and which observations it can make.
//!
//! A target says this once, up front (stateright's `Model` and proptest-state-machine's
//! `ReferenceStateMachine` are told what a system can do; they never probe for it). Explorers
//! leave out the op kinds a target lacks and reports list them with the target's reason, so an
//! op the engine does not have is never counted as a passing or an unsupported trial. An
//! observation a target cannot make leaves the oracles that read it unjudged
//! ([`crate::oracles::Oracle::judges`]).
//!
//! A worker in another process declares its capabilities in its `hello`
//! (docs/worker-protocol.md); the JSON form here is that declaration.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::base::cache::Observe;
use crate::base::op_kind::OpKind;

/// Where a target reads a sequence's resident positions from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CellSource {
    /// The engine's own serialized state (llama.cpp's `llama_state_seq_get_data` bytes): the
    /// oracles then compare the cache with what it says of itself.
    #[default]
    State,
    /// An accessor of the engine's.
    Accessor,
    /// The engine's internal fields, read by the adapter.
    Internals,
}

impl CellSource {
    /// What it means, for reports.
    pub fn describe(self) -> &'static str {
        match self {
            CellSource::State => "the engine's own serialized state",
            CellSource::Accessor => "an accessor of the engine's",
            CellSource::Internals => "the engine's internal fields",
        }
    }
}

/// An op kind a target lacks, and why (in the engine's words).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LeftOut {
    /// The op kind's JSON name (`seq_div`).
    pub op: String,
    /// Which target lacks it (its label).
    pub target: String,
    /// Why.
    pub reason: String,
}

/// What a target can do (see the module docs). The JSON form is the `capabilities` object of
/// a worker's `hello` (docs/worker-protocol.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    /// The op kinds the target has, by JSON name.
    #[serde(with = "kind_names")]
    pub ops: Vec<OpKind>,
    /// Why each kind it lacks is missing (a kind missing from `ops` without a reason here is
    /// reported as "not declared").
    #[serde(default)]
    pub lacks: BTreeMap<String, String>,
    /// Where a sequence's resident positions are read from.
    #[serde(default)]
    pub cells_from: CellSource,
    /// `pos_min`/`pos_max` are the engine's own answers (false: derived from the cells, and the
    /// accessor oracle has nothing of the engine's to judge).
    #[serde(default)]
    pub accessors: bool,
    /// The sequences right before each op ([`Observe::before`]).
    #[serde(default)]
    pub before: bool,
    /// The whole-state dump's cells ([`Observe::whole`]).
    #[serde(default)]
    pub whole: bool,
    /// The state round trip into an empty twin ([`Observe::round_trip`]).
    #[serde(default)]
    pub round_trip: bool,
    /// The logits probe after a trial's last op ([`Observe::logits`]).
    #[serde(default)]
    pub logits: bool,
    /// The sizes the state calls report against the bytes they write ([`Observe::sizes`]).
    #[serde(default)]
    pub sizes: bool,
    /// The most sequences a setup may ask for (`None`: no limit of the target's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_seqs: Option<u32>,
}

impl Capabilities {
    /// Every op kind and every observation, cells from the serialized state: what llama.cpp
    /// and the native caches declare (what a given memory type of theirs refuses is the
    /// target's answer per op, not a declaration).
    pub fn everything() -> Capabilities {
        Capabilities {
            ops: OpKind::ALL.to_vec(),
            lacks: BTreeMap::new(),
            cells_from: CellSource::State,
            accessors: true,
            before: true,
            whole: true,
            round_trip: true,
            logits: true,
            sizes: true,
            max_seqs: None,
        }
    }

    /// Whether the target has ops of `kind`.
    pub fn has(&self, kind: OpKind) -> bool {
        self.ops.contains(&kind)
    }

    /// The kinds this target lacks, each with its reason, labelled `target`.
    pub fn left_out(&self, target: &str) -> Vec<LeftOut> {
        OpKind::ALL
            .iter()
            .filter(|k| !self.has(**k))
            .map(|k| LeftOut {
                op: k.name().to_string(),
                target: target.to_string(),
                reason: self
                    .lacks
                    .get(k.name())
                    .cloned()
                    .unwrap_or_else(|| "not declared by the target".to_string()),
            })
            .collect()
    }

    /// `want` less what this target cannot observe.
    pub fn observable(&self, want: Observe) -> Observe {
        Observe {
            before: want.before && self.before,
            whole: want.whole && self.whole,
            round_trip: want.round_trip && self.round_trip,
            logits: want.logits && self.logits,
            next_logits: want.next_logits && self.logits,
            reload: want.reload && self.logits && self.round_trip,
            partial: want.partial && self.logits && self.round_trip,
            sizes: want.sizes && self.sizes,
        }
    }
}

/// Op kinds as their JSON names, an unknown name an error that names it.
mod kind_names {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::base::op_kind::OpKind;

    pub fn serialize<S: Serializer>(kinds: &[OpKind], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(kinds.iter().map(|k| k.name()))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<OpKind>, D::Error> {
        let names = Vec::<String>::deserialize(d)?;
        names
            .iter()
            .map(|n| {
                OpKind::from_name(n).ok_or_else(|| {
                    let known: Vec<&str> = OpKind::ALL.iter().map(|k| k.name()).collect();
                    serde::de::Error::custom(format!(
                        "unknown op kind '{}' (known: {})",
                        n.chars().take(32).collect::<String>(),
                        known.join(", ")
                    ))
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declaration_reads_back_and_lists_what_it_lacks() {
        let json = r#"{"ops":["seq_rm","decode"],"lacks":{"seq_div":"no division"},
            "cells_from":"state","accessors":true,"before":true}"#;
        let c: Capabilities = serde_json::from_str(json).unwrap();
        assert!(c.has(OpKind::SeqRm) && !c.has(OpKind::SeqDiv));
        let left = c.left_out("t");
        assert_eq!(left.len(), OpKind::ALL.len() - 2);
        let div = left.iter().find(|l| l.op == "seq_div").unwrap();
        assert_eq!(div.reason, "no division");
        let cp = left.iter().find(|l| l.op == "seq_cp").unwrap();
        assert_eq!(cp.reason, "not declared by the target");
        let seen = c.observable(Observe::ALL);
        assert!(seen.before && !seen.whole && !seen.round_trip && !seen.sizes);
        let back: Capabilities = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn an_unknown_op_kind_is_named() {
        let err = serde_json::from_str::<Capabilities>(r#"{"ops":["seq_twist"]}"#).unwrap_err();
        assert!(err.to_string().contains("seq_twist"), "{err}");
    }

    #[test]
    fn everything_lacks_nothing() {
        assert!(Capabilities::everything().left_out("t").is_empty());
    }
}
