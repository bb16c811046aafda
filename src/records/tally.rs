//! Counts and findings of part of a run, merged by addition and minimum, so any split of the
//! work (threads, shards) merges to the same result.

use std::collections::BTreeMap;

use crate::base::op::Trace;
use crate::oracles::{OracleId, Violation};
use crate::records::code::CodeGather;
use crate::records::finding::{Finding, FindingKey, OracleStats};

/// Counts and findings of part of a run; merged by addition and minimum.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Trials run.
    pub trials: u64,
    /// Trials stopped by an unsupported op.
    pub unsupported: u64,
    /// Per oracle.
    pub oracles: BTreeMap<OracleId, OracleStats>,
    /// Best representative per finding.
    pub findings: BTreeMap<FindingKey, Finding>,
    /// The target's own code the trials reached, on a target that records it (`+cov`).
    pub code: Option<CodeGather>,
}

impl Tally {
    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: Tally) {
        self.trials += other.trials;
        self.unsupported += other.unsupported;
        for (id, s) in other.oracles {
            self.oracles.entry(id).or_default().merge(&s);
        }
        for (key, f) in other.findings {
            self.offer(key, f);
        }
        if let Some(code) = other.code {
            self.code
                .get_or_insert_with(CodeGather::default)
                .merge(code);
        }
    }

    /// Keeps `f` as the representative of `key` unless an earlier trial (by depth, then
    /// enumeration index) already represents it.
    pub fn offer(&mut self, key: FindingKey, f: Finding) {
        match self.findings.get(&key) {
            Some(old) if (old.depth, old.trial_index) <= (f.depth, f.trial_index) => {}
            _ => {
                self.findings.insert(key, f);
            }
        }
    }

    /// Lists `oracles` in the counts even where no trial asked them (a run of zero trials, a
    /// crash oracle on a target that never crashed): a report names every oracle of its run.
    pub fn asked(&mut self, oracles: impl IntoIterator<Item = OracleId>) {
        for o in oracles {
            self.oracles.entry(o).or_default();
        }
    }

    /// Counts one evaluation of `oracle` on a trial of `depth`.
    /// Notes that `oracle` could not judge a trial (its observation was missing): the oracle is
    /// listed, with nothing checked.
    pub fn unjudged(&mut self, oracle: OracleId) {
        self.oracles.entry(oracle).or_default();
    }

    /// Counts one trial judged by `oracle`.
    pub fn count(&mut self, oracle: OracleId, depth: u32, violated: bool) {
        self.count_many(oracle, depth, violated, 1);
    }

    /// Counts `n` trials judged alike by `oracle`.
    pub fn count_many(&mut self, oracle: OracleId, depth: u32, violated: bool, n: u64) {
        let s = self.oracles.entry(oracle).or_default();
        s.checked += n;
        if violated && n > 0 {
            s.violations += n;
            s.first_depth = Some(s.first_depth.map_or(depth, |d| d.min(depth)));
        }
    }

    /// Records violation `v` of trial `index` (`trace`, violated at 1-based `step`) on the
    /// target labelled `target`, unless an earlier trial already represents the same finding.
    pub fn record(&mut self, trace: &Trace, index: u64, step: usize, target: &str, v: &Violation) {
        let op = trace.ops[step - 1].name();
        let depth = trace.ops.len() as u32;
        // Most violations a run records are of a finding an earlier trial represents already:
        // that is found among the oracle's findings (keys sort by oracle first) without
        // building a key.
        let first_of_oracle = FindingKey::new(v.oracle, "", "", "");
        let represented = self
            .findings
            .range(first_of_oracle..)
            .take_while(|(k, _)| k.oracle == v.oracle)
            .find(|(k, _)| {
                k.target == target && k.kind == v.kind && k.op == op && k.shape.is_empty()
            })
            .is_some_and(|(_, old)| (old.depth, old.trial_index) <= (depth, index));
        if represented {
            return;
        }
        let key = FindingKey::new(v.oracle, target, &v.kind, op);
        let f = Finding {
            oracle: v.oracle,
            kind: v.kind.clone(),
            target: target.to_string(),
            depth,
            trial_index: index,
            step,
            seq: v.seq,
            trace: trace.clone(),
            observed: v.observed.clone(),
            expected: v.expected.clone(),
        };
        self.offer(key, f);
    }
}
