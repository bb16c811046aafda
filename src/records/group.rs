//! Root-cause groups: findings that are the same bug, as one group with a representative (the
//! smallest trace) and a count. Plain data; the evidence that decides sameness is gathered by
//! `engines::root_cause` (it runs traces) and stored here as a [`Cause`].
//!
//! Sameness is decided by evidence, not by the failing op's name: findings that the native model
//! reproduces exactly with the same known fault injected (and not without it) are one bug; crashes
//! at the same source site are one bug; anything else is the same bug only if its minimal trace is
//! the same up to renaming ([`canonical_trace`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::base::op::Trace;
use crate::oracles::OracleId;
use crate::records::finding::Finding;

/// Why findings are the same bug: the evidence a group rests on.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum Cause {
    /// The native model with these known faults injected gives the same violation (same step,
    /// sequence, observed and expected values), and without them it does not.
    NativeFault {
        /// The faults (native-kv `Faults` names), each of which alone reproduces it.
        faults: Vec<String>,
    },
    /// The target aborted at this source site (`file:line` of the assertion, or the signal).
    CrashSite {
        /// The site.
        site: String,
    },
    /// The native model without faults gives the same violation (llama.cpp's design as modelled,
    /// not a known fault); grouped by the minimal trace on the model, canonicalised.
    NativeModel {
        /// [`canonical_trace`] of the trace shrunk on the native model.
        shape: String,
    },
    /// No known fault explains it; grouped by the minimal trace, canonicalised.
    MinimalTrace {
        /// [`canonical_trace`] of the (shrunk) trace.
        shape: String,
    },
}

impl Cause {
    /// The evidence in plain words (free text inside: escape it for where it goes).
    pub fn describe(&self) -> String {
        match self {
            Cause::NativeFault { faults } => format!(
                "the native model reproduces each with fault {} injected, and not without",
                faults.join(" or ")
            ),
            Cause::CrashSite { site } => format!("crash at {site}"),
            Cause::NativeModel { shape } => {
                format!("the native model without faults shows it too; minimal trace {shape}")
            }
            Cause::MinimalTrace { shape } => format!("minimal trace {shape}"),
        }
    }

    /// [`Cause::describe`] with `trace` (the group's representative) written out where the
    /// evidence is a canonical shape: the shape names positions and sequences by rank (`p0`,
    /// `s1`), which groups findings but cannot be run; the representative's own values can.
    pub fn describe_with(&self, trace: &Trace) -> String {
        match self {
            Cause::NativeFault { .. } | Cause::CrashSite { .. } => self.describe(),
            Cause::NativeModel { .. } => format!(
                "the native model without faults shows it too; minimal trace {}",
                trace_text(trace, |_| {})
            ),
            Cause::MinimalTrace { .. } => format!("minimal trace {}", trace_text(trace, |_| {})),
        }
    }
}

/// Findings that are one bug.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FindingGroup {
    /// The evidence.
    pub cause: Cause,
    /// The oracles its findings violate, in order.
    pub oracles: Vec<OracleId>,
    /// 1-based number of the representative finding in the report (the smallest trace).
    pub representative: usize,
    /// 1-based numbers of every finding of the group, the representative included.
    pub findings: Vec<usize>,
}

impl FindingGroup {
    /// How many findings the group holds.
    pub fn count(&self) -> usize {
        self.findings.len()
    }
}

/// The groups of `findings`, given each one's cause (same order): one group per distinct cause,
/// ordered by largest first, then by first finding; the representative is the member with the
/// fewest ops (then the earliest in the report).
pub fn build_groups(findings: &[Finding], causes: Vec<Cause>) -> Vec<FindingGroup> {
    let mut by_cause: BTreeMap<Cause, Vec<usize>> = BTreeMap::new();
    for (i, cause) in causes.into_iter().enumerate().take(findings.len()) {
        by_cause.entry(cause).or_default().push(i);
    }
    let mut groups: Vec<FindingGroup> = by_cause
        .into_iter()
        .map(|(cause, members)| {
            let rep = *members
                .iter()
                .min_by_key(|&&i| (findings[i].trace.ops.len(), i))
                .expect("a group has members");
            let mut oracles: Vec<OracleId> = members.iter().map(|&i| findings[i].oracle).collect();
            oracles.sort();
            oracles.dedup();
            FindingGroup {
                cause,
                oracles,
                representative: rep + 1,
                findings: members.iter().map(|i| i + 1).collect(),
            }
        })
        .collect();
    groups.sort_by_key(|g| (std::cmp::Reverse(g.count()), g.findings[0]));
    groups
}

/// The crash site of a crash finding's `observed` value: the `file:line` of a failed assertion
/// (`llama-kv-cells.h:312`) with the assertion's text, or the signal alone when there is none.
pub fn crash_site(observed: &Value) -> String {
    let text = observed
        .get("crash")
        .and_then(Value::as_str)
        .unwrap_or_default();
    // "SIGABRT: prog: file.h:312: function: Assertion `x' failed." -> "file.h:312 (Assertion ...)"
    let signal = text.split(':').next().unwrap_or_default().trim();
    let site = text.split(": ").find(|part| {
        part.rsplit_once(':').is_some_and(|(file, line)| {
            file.contains('.') && !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit())
        })
    });
    let assertion = text
        .split(": ")
        .find(|p| p.starts_with("Assertion"))
        .map(|a| format!(" ({a})"))
        .unwrap_or_default();
    match site {
        Some(site) => format!("{signal} at {site}{assertion}"),
        None if signal.is_empty() => "a crash".into(),
        None => signal.into(),
    }
}

/// `trace` up to renaming: sequence ids and slots renamed in order of first appearance (setup
/// first), positions (`p0`, `p1`, `pos`; not deltas or divisors, which are amounts) renamed by
/// rank among the trace's non-negative positions. Two traces with the same canonical form are
/// the same steps on other arguments.
pub fn canonical_trace(trace: &Trace) -> String {
    let ops = op_values(trace);
    let mut positions: Vec<i64> = Vec::new();
    for op in &ops {
        for key in ["p0", "p1", "pos"] {
            if let Some(p) = op.get(key).and_then(Value::as_i64).filter(|p| *p >= 0) {
                positions.push(p);
            }
        }
    }
    positions.sort();
    positions.dedup();
    let mut seqs: Vec<i64> = Vec::new();
    let mut slots: Vec<String> = Vec::new();
    let mut rename_seq = |v: &Value| {
        let s = v.as_i64().unwrap_or(-1);
        let i = seqs.iter().position(|x| *x == s).unwrap_or_else(|| {
            seqs.push(s);
            seqs.len() - 1
        });
        Value::from(format!("s{i}"))
    };
    trace_text(trace, |op| {
        let Some(map) = op.as_object_mut() else {
            return;
        };
        for (key, v) in map.iter_mut() {
            match key.as_str() {
                "seq" | "src" | "dst" => *v = rename_seq(v),
                "seqs" => {
                    if let Some(a) = v.as_array_mut() {
                        for s in a.iter_mut() {
                            *s = rename_seq(s);
                        }
                    }
                }
                "slot" => {
                    let name = v.as_str().unwrap_or_default().to_string();
                    let i = slots.iter().position(|x| *x == name).unwrap_or_else(|| {
                        slots.push(name);
                        slots.len() - 1
                    });
                    *v = Value::from(format!("slot{i}"));
                }
                "p0" | "p1" | "pos" => {
                    if let Some(i) = v
                        .as_i64()
                        .and_then(|p| positions.iter().position(|x| *x == p))
                    {
                        *v = Value::from(format!("p{i}"));
                    }
                }
                _ => {}
            }
        }
    })
}

/// `trace`'s ops (the setup's marked `setup`) as JSON objects in a list, each edited by `edit`
/// first.
fn trace_text(trace: &Trace, mut edit: impl FnMut(&mut Value)) -> String {
    let out: Vec<String> = op_values(trace)
        .into_iter()
        .enumerate()
        .map(|(n, mut op)| {
            edit(&mut op);
            if n < trace.setup.ops.len() {
                format!("setup {op}")
            } else {
                op.to_string()
            }
        })
        .collect();
    format!("[{}]", out.join(", "))
}

/// `trace`'s ops as JSON values, the setup's first.
fn op_values(trace: &Trace) -> Vec<Value> {
    trace
        .setup
        .ops
        .iter()
        .chain(&trace.ops)
        .map(|op| serde_json::from_str(&op.to_json()).expect("op JSON parses"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn trace(ops: &str) -> Trace {
        serde_json::from_str(&format!(
            r#"{{"setup":{{"n_ctx":64,"n_seq_max":4,"ops":[{{"op":"decode","seq":0,"n":7}}]}},"ops":{ops}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn renamed_arguments_give_the_same_canonical_trace() {
        let a =
            trace(r#"[{"op":"seq_cp","src":0,"dst":1,"p0":0,"p1":3},{"op":"seq_keep","seq":0}]"#);
        let b =
            trace(r#"[{"op":"seq_cp","src":0,"dst":2,"p0":1,"p1":5},{"op":"seq_keep","seq":0}]"#);
        let c =
            trace(r#"[{"op":"seq_cp","src":0,"dst":1,"p0":0,"p1":3},{"op":"seq_keep","seq":1}]"#);
        assert_eq!(canonical_trace(&a), canonical_trace(&b));
        assert_ne!(canonical_trace(&a), canonical_trace(&c));
    }

    #[test]
    fn a_crash_site_is_the_assertion_line() {
        let o = json!({"crash": "SIGABRT: kvaudit: llama-kv-cells.h:312: void llama_kv_cells::seq_add(uint32_t, llama_seq_id): Assertion `!seq[i].test(seq_id)' failed."});
        assert_eq!(
            crash_site(&o),
            "SIGABRT at llama-kv-cells.h:312 (Assertion `!seq[i].test(seq_id)' failed.)"
        );
        assert_eq!(crash_site(&json!({"crash": "SIGSEGV"})), "SIGSEGV");
    }

    #[test]
    fn equal_causes_make_one_group_represented_by_the_shortest_trace() {
        let f = |ops: &str| Finding {
            oracle: OracleId::I1,
            kind: "k".into(),
            target: "t".into(),
            depth: 1,
            trial_index: 0,
            step: 1,
            seq: None,
            trace: trace(ops),
            observed: Value::Null,
            expected: Value::Null,
        };
        let long = f(r#"[{"op":"clear"},{"op":"clear"}]"#);
        let short = f(r#"[{"op":"clear"}]"#);
        let fault = Cause::NativeFault {
            faults: vec!["refcount".into()],
        };
        let other = Cause::CrashSite { site: "x".into() };
        let groups = build_groups(
            &[long.clone(), short.clone(), long],
            vec![fault.clone(), fault.clone(), other],
        );
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].cause, fault);
        assert_eq!(groups[0].findings, vec![1, 2]);
        assert_eq!(groups[0].representative, 2);
        assert_eq!(groups[1].count(), 1);
    }
}
