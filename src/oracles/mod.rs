//! Layer 2, oracles: what decides that a cache is wrong. An oracle is a value in a [`Registry`]:
//! its id, what it reads ([`Reads`]), its check, the kinds of violation it reports and its
//! positive controls (faults it is known to catch). Engines, the judge, reports, PREREG and the
//! command line iterate the registry; none of them names an oracle, so adding one is one file
//! (an [`Oracle`] value) and one line in [`BUILTIN`].
//!
//! The observation oracles ([`i1`], [`i2`], [`differential`], [`crash`]) never drive a target:
//! they read observations only. The theorems T1-T3 ([`theorems`]) are registered as oracles that
//! [`Reads::Runs`]: they run metamorphic partner traces themselves, through
//! [`crate::base::cache::CacheUnderTest`] only.

pub mod allocation;
pub mod c_check;
pub mod cache_invisible;
pub mod config_differential;
pub mod conservation;
pub mod contract;
pub mod crash;
pub mod cross_logits;
pub mod differential;
pub mod failed_restore;
pub mod i1;
pub mod i2;
pub mod memory;
pub mod metamorphic;
pub mod partial_restore;
pub mod rollback;
pub mod round_trip;
pub mod round_trip_logits;
pub mod save_load_invisible;
pub mod state_size;
pub mod swa_window;
pub mod theorems;

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Mutex;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::base::cache::{Observation, Observe, StepObservation};
use crate::base::op::{Arch, Op, SeqId, Setup};

/// An oracle's name: what reports, repro files, PREREG.md and `--oracles` call it. Ordered as
/// the built-in registry lists oracles (report order), other names after them by name. The rank
/// is carried in the id, so that comparing ids (the explorer counts per oracle on every trial)
/// compares two numbers first.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OracleId {
    rank: u16,
    name: &'static str,
}

impl OracleId {
    /// I1, accessor exactness ([`i1`]).
    pub const I1: OracleId = OracleId::builtin(0, "I1");
    /// I2, contiguity ([`i2`]).
    pub const I2: OracleId = OracleId::builtin(1, "I2");
    /// Two targets agree ([`differential`]).
    pub const DIFFERENTIAL: OracleId = OracleId::builtin(2, "differential");
    /// The target crashed ([`crash`]).
    pub const CRASH: OracleId = OracleId::builtin(3, "crash");

    /// The id of a built-in oracle: `rank` is its place in [`BUILTIN`] (checked by a test).
    pub(crate) const fn builtin(rank: u16, name: &'static str) -> OracleId {
        OracleId { rank, name }
    }

    /// An id for a new oracle (a `const` in the oracle's own file).
    pub const fn new(name: &'static str) -> OracleId {
        OracleId {
            rank: u16::MAX,
            name,
        }
    }

    /// The name used in reports and files.
    pub fn name(self) -> &'static str {
        self.name
    }

    /// An advisory oracle (its name ends in `?`) asks a person a question (llama.h is silent
    /// and the reference behaviour differs): its findings are reported, never a failure.
    pub fn advisory(self) -> bool {
        self.name.ends_with('?')
    }

    /// The id of the oracle called `name` (any case), among the built-in oracles and those
    /// registered in this process ([`Registry::with`]); `None` for a name kvaudit does not know.
    pub fn known(name: &str) -> Option<OracleId> {
        if let Some(o) = BUILTIN
            .iter()
            .find(|o| o.id().name.eq_ignore_ascii_case(name))
        {
            return Some(o.id());
        }
        let names = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
        names
            .iter()
            .find(|n| n.eq_ignore_ascii_case(name))
            .map(|n| OracleId::new(n))
    }
}

/// Names of oracles registered at run time besides the built-in ones, so that files naming them
/// read back.
static REGISTERED: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());

impl PartialOrd for OracleId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OracleId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.rank, self.name).cmp(&(other.rank, other.name))
    }
}

impl fmt::Display for OracleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

impl fmt::Debug for OracleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

impl Serialize for OracleId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name)
    }
}

impl<'de> Deserialize<'de> for OracleId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A visitor, so that a JSON error names the position of the string itself.
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = OracleId;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an oracle name")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<OracleId, E> {
                OracleId::known(name).ok_or_else(|| {
                    let known: Vec<&str> = BUILTIN.iter().map(|o| o.id().name()).collect();
                    E::custom(format!(
                        "unknown oracle '{}' (known: {})",
                        name.chars().take(64).collect::<String>(),
                        known.join(", ")
                    ))
                })
            }
        }
        d.deserialize_str(Name)
    }
}

/// One violated property at one step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Violation {
    /// Which oracle.
    pub oracle: OracleId,
    /// A short class of the violation, used to tell findings apart (e.g. `pos_max stale`).
    pub kind: String,
    /// The sequence concerned, where there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<SeqId>,
    /// What the target said.
    pub observed: Value,
    /// What the oracle expected.
    pub expected: Value,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.oracle, self.kind)?;
        if let Some(s) = self.seq {
            write!(f, " (seq {s})")?;
        }
        write!(f, ": observed {} expected {}", self.observed, self.expected)
    }
}

/// What an oracle reads, and so when an engine can ask it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reads {
    /// One target's observation after an op: the op's outcome, the accessors, and the cells of
    /// the target's own serialized state.
    Step,
    /// Two targets' observations after the same op (needs a second target, `--vs`).
    Pair,
    /// How a trial ended: the target aborted, was killed by a signal or hung.
    Crash,
    /// Nothing observed: the oracle runs traces itself (metamorphic partners on a target with
    /// K/V rows and logits, `native+tensors`); engines hand it whole traces.
    Runs,
}

impl Reads {
    /// Whether an engine judging `with_vs` (two targets or one) can ask an oracle that reads
    /// this, from observations (oracles that run traces are asked by the theorem checker).
    pub fn observed(self, with_vs: bool) -> bool {
        match self {
            Reads::Step | Reads::Crash => true,
            Reads::Pair => with_vs,
            Reads::Runs => false,
        }
    }

    /// What this means, for the oracle table.
    pub fn describe(self) -> &'static str {
        match self {
            Reads::Step => "accessors and serialized state after each op",
            Reads::Pair => "two targets' observations after each op",
            Reads::Crash => "how the trial ended",
            Reads::Runs => "K/V rows and logits of partner traces it runs",
        }
    }
}

/// What an oracle is shown, matching its [`Reads`].
#[derive(Clone, Copy, Debug)]
pub enum Seen<'a> {
    /// One target after `op`.
    Step {
        /// The op just applied.
        op: &'a Op,
        /// The observation after it.
        after: &'a StepObservation,
        /// The setup's architecture: which memory type the observation is of (what its cells
        /// mean, [`memory`]).
        arch: Arch,
    },
    /// Target A (`a`) and target B (`b`) after the same `op`.
    Pair {
        /// The op just applied.
        op: &'a Op,
        /// Target A's observation.
        a: &'a StepObservation,
        /// Target B's observation.
        b: &'a StepObservation,
        /// A load of a damaged buffer (`truncate`, `flip`) ran at this step or before it
        /// ([`Trace::damaged_load_by`]), and the two targets lay their states out differently
        /// ([`TargetInfo::same_state_layout`]): the same offset cuts or flips another field of
        /// each, so the two targets made different loads.
        ///
        /// [`Trace::damaged_load_by`]: crate::base::op::Trace::damaged_load_by
        /// [`TargetInfo::same_state_layout`]: crate::base::cache::TargetInfo::same_state_layout
        damaged_apart: bool,
    },
    /// The trial ended with a crash while running `op`, or while observing what `op` did.
    Crash {
        /// The op that did not return (`None`: the setup crashed), or whose result was being
        /// observed.
        op: Option<&'a Op>,
        /// What the runner saw (signal, abort message, hang).
        message: &'a str,
        /// What was being observed when the target crashed after `op` had returned (`None`: the
        /// op itself crashed).
        observation: Option<Observation>,
    },
}

/// A fault that an oracle is known to catch: a positive control, so that "no violations" means
/// something. `tests/it/oracles.rs` checks every listed control: that its evidence file exists
/// and is a test case naming the oracle, and, for the controls with a `seed_depth`, runs the
/// exhaustive seed-domain audit of `target` itself and checks the oracle first fires there.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct PositiveControl {
    /// What is wrong in the target: a native fault as `--inject` names it, or what the build
    /// does (`+assert`: llama.cpp's own asserts compiled in).
    pub fault: &'static str,
    /// The audited target, as reports label it: `native[refcount]`,
    /// `native vs native[seq_rm_off_by_one]`, `llama.cpp@0.1.156+assert`.
    pub target: &'static str,
    /// The depth at which the oracle first fires in an exhaustive audit of the `seed` domain, for
    /// controls that are such an audit.
    pub seed_depth: Option<u32>,
    /// The test data file (under `tests/data/`) that shows the oracle firing.
    pub evidence: &'static str,
}

/// An oracle as a value, as stateright's `Property` is: what it is called and checks, what it
/// reads and observes, the kinds of violation it reports, its positive controls, and its check
/// as functions of what it is shown. One file defines one (a `static`), one line of [`BUILTIN`]
/// registers it; nothing of an engine's language is here (llama.h's words for an oracle, its C
/// check, are the llama.cpp outputs': `outputs::llama_h`).
pub struct Oracle {
    /// Its name.
    pub id: OracleId,
    /// One line: what it checks.
    pub summary: &'static str,
    /// What it reads.
    pub reads: Reads,
    /// The kinds of violation it reports (the `kind` of its [`Violation`]s; `*` ends a prefix).
    pub kinds: &'static [&'static str],
    /// Faults it is known to catch.
    pub positive_controls: &'static [PositiveControl],
    /// What the runner must observe beyond accessors and per-sequence dumps for it to judge (a
    /// target that cannot give it leaves the oracle with nothing to judge: it holds).
    pub observes: Observe,
    /// Whether what it observes costs more than a trial (decodes per sequence): an exhaustive
    /// audit asks such an oracle only when `--oracles` names it; fuzz runs ask it by default.
    pub costly: bool,
    /// Whether a violation's `observed` is part of what a repro file expects (a replay compares
    /// it); false where it varies between equally failing runs and the kind carries the class.
    pub observed_is_evidence: bool,
    /// Whether the property holds on what is seen. Cheap and allocation-free: the exhaustive
    /// explorer asks it on every trial. `true` for what the oracle does not read. `None`: where
    /// `check` finds no violation (an oracle whose check is as cheap as a yes or no).
    pub holds: Option<fn(&Seen<'_>) -> bool>,
    /// The violation, when `holds` is false; `None` when it holds.
    pub check: fn(&Seen<'_>) -> Option<Violation>,
    /// Whether `seen` holds what it needs to judge (a target that cannot give it gives nothing).
    /// A step it cannot judge is not counted as checked, so an oracle a target cannot take shows
    /// as unjudged, never as passing. `None`: where `seen` holds all that `observes` asks for
    /// ([`seen_has`]).
    pub judges: Option<fn(&Seen<'_>) -> bool>,
    /// Whether any step of a trace from a setup can be judged: false where the oracle has no
    /// reading or no measured tolerance for the setup's memory type or cache types, so that
    /// every trial from it would be "not judged" (a hunt's plan leaves such oracles out of the
    /// entry, `engines::hunt::plan`).
    pub judges_setup: fn(&Setup) -> bool,
}

impl Oracle {
    /// The defaults of the optional parts, for `..Oracle::DEFAULTS` after an oracle's own: it
    /// observes the basic observation only, is cheap, its `observed` is evidence, and it judges
    /// every step that holds what it observes and every setup. Its id, summary, kinds and controls are placeholders that
    /// every oracle gives (`tests::every_builtin_oracle_has_a_distinct_id_kinds_and_a_positive_control`
    /// fails on a registered one that keeps them), as are `holds` and `check`.
    pub const DEFAULTS: Oracle = Oracle {
        id: OracleId::new("(no id)"),
        summary: "",
        reads: Reads::Step,
        kinds: &[],
        positive_controls: &[],
        observes: Observe::BASIC,
        costly: false,
        observed_is_evidence: true,
        holds: None,
        check: |_| None,
        judges: None,
        judges_setup: |_| true,
    };

    /// Its name.
    #[inline]
    pub fn id(&self) -> OracleId {
        self.id
    }
    /// One line: what it checks.
    pub fn summary(&self) -> &'static str {
        self.summary
    }
    /// What it reads.
    #[inline]
    pub fn reads(&self) -> Reads {
        self.reads
    }
    /// The kinds of violation it reports.
    pub fn kinds(&self) -> &'static [&'static str] {
        self.kinds
    }
    /// Faults it is known to catch.
    pub fn positive_controls(&self) -> &'static [PositiveControl] {
        self.positive_controls
    }
    /// Whether the property holds on `seen` (the field `holds`).
    #[inline]
    pub fn holds(&self, seen: &Seen<'_>) -> bool {
        match self.holds {
            Some(holds) => holds(seen),
            None => (self.check)(seen).is_none(),
        }
    }
    /// The violation on `seen`, if any (the field `check`).
    #[inline]
    pub fn check(&self, seen: &Seen<'_>) -> Option<Violation> {
        (self.check)(seen)
    }
    /// What it observes beyond the basic observation.
    #[inline]
    pub fn observes(&self) -> Observe {
        self.observes
    }
    /// Whether it can judge `seen` (the field `judges`).
    #[inline]
    pub fn judges(&self, seen: &Seen<'_>) -> bool {
        match self.judges {
            Some(judges) => judges(seen),
            None => seen_has(seen, self.observes),
        }
    }
    /// Whether it can judge any step from `setup` (the field `judges_setup`).
    pub fn judges_setup(&self, setup: &Setup) -> bool {
        (self.judges_setup)(setup)
    }
    /// Whether what it observes costs more than a trial.
    pub fn costly(&self) -> bool {
        self.costly
    }
    /// Whether a violation's `observed` is part of what a repro file expects.
    pub fn observed_is_evidence(&self) -> bool {
        self.observed_is_evidence
    }
}

/// Whether the observations in `seen` carry what `what` asks for.
pub fn seen_has(seen: &Seen<'_>, what: Observe) -> bool {
    let has = |s: &StepObservation| {
        (!what.whole || s.whole.is_some())
            && (!what.round_trip || s.round_trip.is_some())
            && (!what.before || s.before.is_some())
            && (!what.logits || s.logits_probe.is_some())
            && (!what.next_logits || s.next_logits.is_some())
            && (!what.reload || s.reload_probe.is_some())
            && (!what.sizes || s.sizes.is_some())
    };
    match seen {
        Seen::Step { after, .. } => has(after),
        Seen::Pair { a, b, .. } => has(a) && has(b),
        Seen::Crash { .. } => true,
    }
}

/// Every oracle kvaudit ships, in report order. Adding an oracle: one file, one line here.
pub static BUILTIN: [&Oracle; 22] = [
    &i1::I1,
    &i2::I2,
    &differential::DIFFERENTIAL,
    &crash::CRASH,
    &metamorphic::T1,
    &metamorphic::T2,
    &metamorphic::T3,
    &conservation::CONSERVATION,
    &round_trip::ROUND_TRIP,
    &contract::CONTRACT,
    &contract::CONTRACT_QUESTION,
    &config_differential::CONFIG_DIFFERENTIAL,
    &cache_invisible::CACHE_INVISIBLE,
    &swa_window::SWA_WINDOW,
    &round_trip_logits::ROUND_TRIP_LOGITS,
    &save_load_invisible::SAVE_LOAD_INVISIBLE,
    &rollback::ROLLBACK,
    &state_size::STATE_SIZE,
    &failed_restore::FAILED_RESTORE,
    &partial_restore::PARTIAL_RESTORE,
    &allocation::ALLOCATION,
    &cross_logits::CROSS_LOGITS,
];

/// The oracles a run asks, in report order: the built-in ones, plus any a caller registers.
#[derive(Clone)]
pub struct Registry {
    oracles: Vec<&'static Oracle>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::builtin()
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.oracles.iter().map(|o| o.id()))
            .finish()
    }
}

impl Registry {
    /// The built-in oracles.
    pub fn builtin() -> Registry {
        Registry {
            oracles: BUILTIN.to_vec(),
        }
    }

    /// The built-in oracles for a run of one target, or of two (`pair`), or of one target under
    /// two configurations (`config_pair`): a configuration pair is judged by
    /// `config-differential`, which knows the documented differences between configurations,
    /// and not by `differential`; two different targets the other way round.
    pub fn for_run(config_pair: bool) -> Registry {
        Registry::builtin().only(move |o| {
            if config_pair {
                o.id() != OracleId::DIFFERENTIAL
            } else {
                o.id() != config_differential::ID
            }
        })
    }

    /// This registry plus `oracle` (after the others). Panics on a duplicate id: two oracles
    /// of one name would make reports ambiguous.
    pub fn with(mut self, oracle: &'static Oracle) -> Registry {
        assert!(
            self.get(oracle.id()).is_none(),
            "oracle {} is registered twice",
            oracle.id()
        );
        REGISTERED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(oracle.id().name);
        self.oracles.push(oracle);
        self
    }

    /// Only the oracles that `keep` accepts.
    pub fn only(mut self, keep: impl Fn(&Oracle) -> bool) -> Registry {
        self.oracles.retain(|o| keep(*o));
        self
    }

    /// Every oracle, in report order.
    pub fn iter(&self) -> impl Iterator<Item = &'static Oracle> + '_ {
        self.oracles.iter().copied()
    }

    /// The oracle called `id`.
    pub fn get(&self, id: OracleId) -> Option<&'static Oracle> {
        self.iter().find(|o| o.id() == id)
    }

    /// The oracle of this name (any case).
    pub fn find(&self, name: &str) -> Option<&'static Oracle> {
        self.iter()
            .find(|o| o.id().name().eq_ignore_ascii_case(name))
    }

    /// The oracles that judge observations of a run with or without a second target, in
    /// report order.
    pub fn observing(&self, with_vs: bool) -> impl Iterator<Item = &'static Oracle> + '_ {
        self.iter().filter(move |o| o.reads().observed(with_vs))
    }

    /// What the runner must observe for every oracle here.
    pub fn observe(&self) -> Observe {
        self.iter()
            .fold(Observe::BASIC, |acc, o| acc.union(o.observes()))
    }

    /// Every name, for error messages.
    pub fn names(&self) -> Vec<&'static str> {
        self.iter().map(|o| o.id().name()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_order_as_the_registry_and_round_trip_through_json() {
        let mut ids = vec![
            OracleId::CRASH,
            OracleId::new("zeta"),
            OracleId::DIFFERENTIAL,
            OracleId::I2,
            OracleId::I1,
        ];
        ids.sort();
        let names: Vec<&str> = ids.iter().map(|i| i.name()).collect();
        assert_eq!(names, ["I1", "I2", "differential", "crash", "zeta"]);
        let json = serde_json::to_string(&OracleId::DIFFERENTIAL).unwrap();
        assert_eq!(json, "\"differential\"");
        assert_eq!(
            serde_json::from_str::<OracleId>(&json).unwrap(),
            OracleId::DIFFERENTIAL
        );
        assert_eq!(OracleId::known("i1"), Some(OracleId::I1));
        let e = serde_json::from_str::<OracleId>("\"I9\"").unwrap_err();
        assert!(e.to_string().starts_with("unknown oracle 'I9'"), "{e}");
    }

    #[test]
    fn builtin_ranks_are_their_places_in_the_registry() {
        for (i, o) in BUILTIN.iter().enumerate() {
            assert_eq!(usize::from(o.id().rank), i, "{}", o.id());
        }
    }

    #[test]
    fn every_builtin_oracle_has_a_distinct_id_kinds_and_a_positive_control() {
        let names = Registry::builtin().names();
        let distinct: BTreeSet<_> = names.iter().collect();
        assert_eq!(distinct.len(), names.len());
        for o in BUILTIN {
            assert!(!o.kinds().is_empty(), "{} lists no violation kind", o.id());
            // The placeholders of `Oracle::DEFAULTS` are not an oracle's own.
            assert_ne!(
                o.id(),
                Oracle::DEFAULTS.id,
                "an oracle keeps the default id"
            );
            assert!(!o.summary().is_empty(), "{} has no summary", o.id());
            assert!(
                !o.positive_controls().is_empty(),
                "{} has no positive control",
                o.id()
            );
        }
    }
}
