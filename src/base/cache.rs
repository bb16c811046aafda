//! `CacheUnderTest`: what every cache under audit implements, and what an observation holds.
//!
//! The trait is small and shaped like the domain (stateright's `Model`, proptest's `Strategy`):
//! reset to a setup, apply one op, observe a sequence (its cells, read where the target says,
//! and its accessors), and hand out its serialized state for the state ops and the round trip;
//! no llama.h call is a method (llama.cpp's dump parsing is its adapters', `targets::dump_cells`).
//! The rest is optional, each with a default that says "cannot" (a twin, logits, sizes). An op a
//! target cannot perform is [`OpOutcome::Unsupported`]: neither a pass nor a failure. `Err` means
//! the harness itself broke (a library failed to load, a worker died without a trace to blame).
//!
//! Beside the trait: what an observation holds ([`StepObservation`], per sequence
//! [`SeqObservation`], the twin's [`RoundTrip`], the probes' figures, the dumps' sizes
//! [`StateSizes`] and what the memory allocated [`Allocation`]), what a runner asks a target to
//! observe ([`Observe`]), the stage an observation crash names ([`Observation`], told to the
//! target by `CacheUnderTest::observing`), and the cache type the probes are judged by
//! ([`probe_cache`], [`v_summed_in_f16`]).

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::base::op::{CacheType, MemoryType, Op, Pos, SeqId, Setup};
use crate::base::state::{ParseError, StateFormat, WholeCell};

mod probes;
mod sizes;
pub use probes::{logits_distance, LogitsProbe, NextLogits, Reload, ReloadProbe};
pub use sizes::{
    AllocatedPart, Allocation, Dump, DumpSize, PartHolds, SeqSizes, StateSizes,
    STATE_SEQ_FLAGS_PARTIAL_ONLY,
};

/// Who a target is, for reports and repro files.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TargetInfo {
    /// Name as given on the command line, e.g. `native` or `llama.cpp@0.1.156+assert`.
    pub name: String,
    /// Version of the code under test.
    pub version: String,
    /// Faults injected on purpose (positive controls), if any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<String>,
    /// The model file a target that runs one loaded (llama.cpp targets), by file name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The state format the target writes.
    #[serde(skip)]
    pub state_format: StateFormat,
}

impl TargetInfo {
    /// `name` plus `+fault` for each injected fault: what reports print.
    pub fn label(&self) -> String {
        let mut s = self.name.clone();
        for f in &self.faults {
            s.push_str(&format!("[{f}]"));
        }
        s
    }

    /// Whether `other` writes its state byte for byte in this one's layout, so that a buffer
    /// cut or flipped at one offset is damaged at the same field in both: the same
    /// implementation (`llama.cpp`, `native`, `native+tensors`: llama.cpp's whole state has its
    /// output header and both llama.cpp's and `native+tensors`' dumps hold K/V rows, plain
    /// `native`'s neither) and the same [`StateFormat`] variant.
    ///
    /// A runner under another configuration is named `NAME (CONFIG)` (`--vs-config`): two
    /// configurations lay their dumps out alike only when they differ in no more than how a
    /// batch is split ([`LAYOUT_NEUTRAL_SETTINGS`]); one stream or one per sequence, the cache
    /// types, flash attention (V transposed or not), the context's size and the window all
    /// change where a byte of the dump lands.
    pub fn same_state_layout(&self, other: &TargetInfo) -> bool {
        let implementation = |t: &TargetInfo| {
            t.name
                .split(['@', ' '])
                .next()
                .unwrap_or_default()
                .to_string()
        };
        self.state_format == other.state_format
            && implementation(self) == implementation(other)
            && configurations_alike(&self.name, &other.name)
    }
}

/// Settings a configuration pair may differ in and still lay its dumps out alike: how a batch
/// is split into ubatches.
pub const LAYOUT_NEUTRAL_SETTINGS: [&str; 2] = ["n_ubatch", "n_batch"];

/// Whether the configurations two runners' names carry (`NAME (a=1,b=2)`) differ only in
/// [`LAYOUT_NEUTRAL_SETTINGS`].
fn configurations_alike(a: &str, b: &str) -> bool {
    let settings = |name: &str| -> Vec<String> {
        let config = name
            .rsplit_once(" (")
            .map_or("", |(_, c)| c.trim_end_matches(')'));
        let mut v: Vec<String> = config
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        v.sort();
        v
    };
    let (a, b) = (settings(a), settings(b));
    a.iter()
        .filter(|s| !b.contains(s))
        .chain(b.iter().filter(|s| !a.contains(s)))
        .all(|s| {
            let key = s.split('=').next().unwrap_or_default().trim();
            LAYOUT_NEUTRAL_SETTINGS.contains(&key)
        })
}

/// The harness broke: not a finding.
#[derive(Debug, Error)]
pub enum HarnessError {
    /// The target could not be made or driven.
    #[error("target {target}: {message}")]
    Target {
        /// Which target.
        target: String,
        /// What went wrong.
        message: String,
    },
    /// The target's serialized state did not parse.
    #[error("target {target}: serialized state of seq {seq} does not parse: {source}")]
    State {
        /// Which target.
        target: String,
        /// Which sequence was dumped.
        seq: SeqId,
        /// The parse error.
        source: ParseError,
    },
    /// The target cannot take this configuration (e.g. a quantized V cache without flash
    /// attention on llama.cpp, more sequences than the native cache holds): the trial is
    /// unsupported, neither a pass nor a failure.
    #[error("target {target} cannot take this configuration: {reason}")]
    Unsupported {
        /// Which target.
        target: String,
        /// Why.
        reason: String,
    },
    /// The setup could not be built on this target.
    #[error("target {target}: setup failed at {op}: {message}")]
    Setup {
        /// Which target.
        target: String,
        /// The setup op that failed.
        op: String,
        /// Why.
        message: String,
    },
}

/// What applying one op did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum OpOutcome {
    /// A memory op ran (`seq_rm` reports its boolean too).
    Done {
        /// `llama_memory_seq_rm`'s return value, for `seq_rm`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        returned: Option<bool>,
    },
    /// A decode ran; `rc` is `llama_decode`'s return code (0 = success, -1 invalid batch,
    /// 1 no KV slot).
    Decoded {
        /// The return code.
        rc: i32,
    },
    /// The target refused the call as invalid without crashing (e.g. a native cache refusing a
    /// negative sequence id). Not a finding by itself.
    Refused {
        /// Why.
        reason: String,
    },
    /// The target does not implement this op or argument: the trial stops here, unjudged.
    Unsupported {
        /// Why.
        reason: String,
    },
}

impl OpOutcome {
    /// Whether the op took effect: a memory op that ran, or a decode that returned 0.
    pub fn took_effect(&self) -> bool {
        matches!(self, OpOutcome::Done { .. } | OpOutcome::Decoded { rc: 0 })
    }
}

/// Applies a setup's ops to a target that has just been emptied: the shared tail of every
/// `reset`. An op that does not take effect is a harness error, since the setup is not a trial.
pub fn apply_setup_ops(target: &mut dyn CacheUnderTest, setup: &Setup) -> Result<(), HarnessError> {
    for op in &setup.ops {
        let outcome = target.apply(op)?;
        if !outcome.took_effect() {
            return Err(HarnessError::Setup {
                target: target.info().name,
                op: op.to_string(),
                message: format!("{outcome:?}"),
            });
        }
    }
    Ok(())
}

/// Refuses a setup that names settings of another engine's own ([`Setup::engine`]): a target
/// that does not know a setting cannot take the setup, rather than run it as if it were not
/// there.
pub fn refuse_engine_settings(target: &str, setup: &Setup) -> Result<(), HarnessError> {
    match setup.engine.keys().next() {
        None => Ok(()),
        Some(key) => Err(HarnessError::Unsupported {
            target: target.to_string(),
            reason: format!("engine.{key} is another engine's setting"),
        }),
    }
}

/// What one sequence looks like after an op.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqObservation {
    /// The sequence.
    pub seq: SeqId,
    /// `seq_pos_min` as the target answers it.
    pub pos_min: Pos,
    /// `seq_pos_max` as the target answers it.
    pub pos_max: Pos,
    /// The positions of the sequence's cells in the target's own serialized state, sorted (a
    /// multiset: two cells may share a position). For a memory of two parts, the first part's:
    /// an iSWA memory's base (full) cache, a hybrid memory's attention cache; for a recurrent
    /// memory, its state cells (docs/memory-types.md).
    pub cells: Vec<Pos>,
    /// The cells of the memory's second part, sorted, when it has one: an iSWA or hybrid-iSWA
    /// memory's windowed cache, a hybrid memory's recurrent states.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub second_cells: Option<Vec<Pos>>,
    /// The cells of the memory's third part, sorted, when it has one: a hybrid-iSWA memory's
    /// recurrent states (its dump is the iSWA pair's, then the recurrent memory's); a DSA-iSWA
    /// memory's lightning-indexer key cache (base/state: its dump holds it between the MLA and
    /// the windowed caches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub third_cells: Option<Vec<Pos>>,
}

impl SeqObservation {
    /// An observation of `seq` before a target fills it (no cells, accessors -1).
    pub fn empty(seq: SeqId) -> Self {
        SeqObservation {
            seq,
            pos_min: -1,
            pos_max: -1,
            cells: Vec::new(),
            second_cells: None,
            third_cells: None,
        }
    }

    /// `target`'s observation of `seq` now.
    pub fn of(target: &mut dyn CacheUnderTest, seq: SeqId) -> Result<Self, HarnessError> {
        let mut out = SeqObservation::empty(seq);
        target.observe_seq(seq, &mut out)?;
        Ok(out)
    }

    /// The windowed cache's cells (iswa, hybrid_iswa), when the dump has them.
    pub fn windowed_cells(&self, memory: MemoryType) -> Option<&[Pos]> {
        if memory.has_window() {
            self.second_cells.as_deref()
        } else {
            None
        }
    }

    /// The lightning/sparse indexer key cache's cells of a memory with one (msa, dsa,
    /// hybrid_idx: the second part; dsa_iswa: the third), when the dump has them.
    pub fn indexer_cells(&self, memory: MemoryType) -> Option<&[Pos]> {
        match memory {
            MemoryType::Msa | MemoryType::Dsa | MemoryType::HybridIdx => {
                self.second_cells.as_deref()
            }
            MemoryType::DsaIswa => self.third_cells.as_deref(),
            MemoryType::Kv
            | MemoryType::Iswa
            | MemoryType::Recurrent
            | MemoryType::Hybrid
            | MemoryType::HybridIswa
            | MemoryType::Dsv4 => None,
        }
    }

    /// The recurrent states' cells of a memory with an attention part (hybrid: the second part,
    /// hybrid_iswa: the third), when the dump has them.
    pub fn recurrent_cells(&self, memory: MemoryType) -> Option<&[Pos]> {
        match memory {
            MemoryType::Hybrid => self.second_cells.as_deref(),
            // hybrid_idx: the second part is the indexer key cache (base/state/hybrid_idx.rs).
            MemoryType::HybridIswa | MemoryType::HybridIdx => self.third_cells.as_deref(),
            MemoryType::Kv
            | MemoryType::Iswa
            | MemoryType::Recurrent
            | MemoryType::Msa
            | MemoryType::Dsv4 => None,
            MemoryType::Dsa | MemoryType::DsaIswa => None,
        }
    }
}

/// The points of a target's own code that some ops reached, as a target that records them
/// gives them (a `+cov` build of llama.cpp: `targets/llama-cpp/shim/kvaudit_cov.c`): PCs as offsets
/// into the target's shared object (addr2line maps them to file:line), and edges (AFL's hash of
/// a PC and the one before it). Each list is distinct values, in the order first reached.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeCoverage {
    /// PC offsets (return addresses of the coverage callback, minus the load base).
    pub pcs: Vec<u32>,
    /// Edge hashes, each mixed with its hit-count class (AFL: 1, 2, 3, 4-7, ..., 128+ times).
    pub edges: Vec<u32>,
    /// PC offsets reached outside the trace's ops (the context's construction and the setup's
    /// decodes before a worker's first trial, resets, observations) that the worker had not
    /// reached before: each such point travels once per worker child, with the trial after
    /// which it was first seen, so the list is empty for most trials. Not part of the
    /// guided fuzzer's signal, which is what the ops did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outside: Vec<u32>,
}

/// What the cache looks like after one op.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepObservation {
    /// What the op did.
    pub outcome: OpOutcome,
    /// Every observed sequence, in ascending id order.
    pub seqs: Vec<SeqObservation>,
    /// The cells of the whole-context dump (`llama_state_get_data`), when [`Observe::whole`]
    /// asked for them and the target has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub whole: Option<Vec<WholeCell>>,
    /// The state round trip into a twin context, when [`Observe::round_trip`] asked for it and
    /// the target can make a twin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round_trip: Option<RoundTrip>,
    /// Every observed sequence right before the op, when [`Observe::before`] asked for it (the
    /// contract oracles compare before and after).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<Vec<SeqObservation>>,
    /// The next-token logits probe of each sequence the token model can judge, when
    /// [`Observe::logits`] asked for it and the target computes logits: after the last op of a
    /// trial only (`running/probe.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logits_probe: Option<Vec<LogitsProbe>>,
    /// Each probed sequence's next-token logits in the audited cache (the logits probe's own
    /// decode of the probe token), when [`Observe::next_logits`] asked for them: after the last
    /// op of a trial only. Two engines' vectors are what the `cross-logits` oracle compares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_logits: Option<Vec<NextLogits>>,
    /// The reload probe of each sequence with cells, when [`Observe::reload`] asked for it and
    /// the target computes logits and can load state: after the last op of a trial only
    /// ([`crate::running::probe::probe_reloads`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reload_probe: Option<Vec<ReloadProbe>>,
    /// The sizes the state calls report against the bytes their dumps write, when
    /// [`Observe::sizes`] asked for them and the target answers them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sizes: Option<StateSizes>,
}

impl StepObservation {
    /// An observation of the accessors and per-sequence dumps only.
    pub fn basic(outcome: OpOutcome, seqs: Vec<SeqObservation>) -> Self {
        StepObservation {
            outcome,
            seqs,
            whole: None,
            round_trip: None,
            before: None,
            logits_probe: None,
            next_logits: None,
            reload_probe: None,
            sizes: None,
        }
    }
}

/// What became of the cache's state saved and loaded into a fresh twin context of the same
/// configuration (llama.h: `llama_state_get_data` / `llama_state_set_data`, and per sequence
/// `llama_state_seq_get_data` / `llama_state_seq_set_data`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoundTrip {
    /// The whole-context load into the empty twin succeeded (returned non-zero).
    pub whole_loaded: bool,
    /// The twin's observation of every observed sequence after the whole-context load.
    pub whole_twin: Vec<SeqObservation>,
    /// The twin's whole-context dump is byte-identical to the one it was loaded from.
    pub whole_same_bytes: bool,
    /// Per observed sequence: its dump loaded into the emptied twin under the same id.
    pub seqs: Vec<SeqRoundTrip>,
}

/// One sequence's round trip (see [`RoundTrip`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqRoundTrip {
    /// The load succeeded (returned non-zero).
    pub loaded: bool,
    /// The twin's observation of the sequence after it alone was loaded into the emptied twin.
    pub twin: SeqObservation,
    /// The twin's dump of the sequence is byte-identical to the one it was loaded from.
    pub same_bytes: bool,
}

/// What `running::observe` looks at beyond the accessors and the per-sequence dumps. Oracles say what
/// they need ([`crate::oracles::Oracle::observes`]); observing less is faster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Observe {
    /// The whole-context dump's cells ([`StepObservation::whole`]).
    pub whole: bool,
    /// The round trip into a twin ([`StepObservation::round_trip`]).
    pub round_trip: bool,
    /// The sequences right before the op ([`StepObservation::before`]).
    pub before: bool,
    /// The logits probe after a trial's last op ([`StepObservation::logits_probe`]). Not part
    /// of [`Observe::ALL`]: it costs decodes per sequence, and is asked for by the oracle that
    /// reads it.
    #[serde(default)]
    pub logits: bool,
    /// The logits probe keeps each probed sequence's vector ([`StepObservation::next_logits`]);
    /// implies nothing without [`Observe::logits`]. Off, the probe carries its figures only.
    #[serde(default)]
    pub next_logits: bool,
    /// The reload probe after a trial's last op ([`StepObservation::reload_probe`]): like the
    /// logits probe, decodes per sequence, not part of [`Observe::ALL`].
    #[serde(default)]
    pub reload: bool,
    /// The dumps' sizes ([`StepObservation::sizes`]).
    #[serde(default)]
    pub sizes: bool,
    /// The reload probe's partial loads too ([`Reload::partial`]); implies nothing without
    /// [`Observe::reload`].
    #[serde(default)]
    pub partial: bool,
}

impl Observe {
    /// Accessors and per-sequence dumps only.
    pub const BASIC: Observe = Observe {
        whole: false,
        round_trip: false,
        before: false,
        logits: false,
        next_logits: false,
        reload: false,
        sizes: false,
        partial: false,
    };
    /// Every observation after every op (not the probes: see [`Observe::logits`]).
    pub const ALL: Observe = Observe {
        whole: true,
        round_trip: true,
        before: true,
        logits: false,
        next_logits: false,
        reload: false,
        sizes: true,
        partial: false,
    };

    /// Every observation after every op, and the logits probe after the last: what one trace
    /// replayed or shrunk observes (its cost does not matter there). Not the reload probe,
    /// which loads state into the audited context after the trial: a replay asks for it when
    /// its oracle reads it ([`crate::oracles::Registry::observe`]).
    pub const ALL_WITH_PROBE: Observe = Observe {
        logits: true,
        ..Observe::ALL
    };

    /// What either asks for.
    pub fn union(self, other: Observe) -> Observe {
        Observe {
            whole: self.whole || other.whole,
            round_trip: self.round_trip || other.round_trip,
            before: self.before || other.before,
            logits: self.logits || other.logits,
            next_logits: self.next_logits || other.next_logits,
            reload: self.reload || other.reload,
            sizes: self.sizes || other.sizes,
            partial: self.partial || other.partial,
        }
    }
}

/// How the kind of an observation crash starts (`observation crash (WHAT): ...`, WHAT an
/// [`Observation::describe`]): the crash oracle writes it and the C check of a crash reads it.
pub const OBSERVATION_CRASH: &str = "observation crash";

/// One of the observations a runner makes after an op: the stage an observation crash names
/// (the op ran and returned; this, observing its result, did not).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Observation {
    /// The accessors and per-sequence dumps (`seq_pos_min/max`, `llama_state_seq_get_data`):
    /// what every step oracle reads, so a crash here leaves the step unobserved.
    Sequences,
    /// The sequences right before the op ([`Observe::before`]).
    Before,
    /// The whole-context dump (`llama_state_get_data`, [`Observe::whole`]).
    Whole,
    /// The round trip into the twin ([`Observe::round_trip`]).
    RoundTrip,
    /// The logits probe after the trial's last op ([`Observe::logits`]).
    Probe,
    /// The reload probe after the trial's last op ([`Observe::reload`]).
    Reload,
    /// The dumps' sizes ([`Observe::sizes`]).
    Sizes,
}

impl Observation {
    /// Every observation, in the order a step makes them (the code of each is its index).
    pub const ALL: [Observation; 7] = [
        Observation::Sequences,
        Observation::Before,
        Observation::Whole,
        Observation::RoundTrip,
        Observation::Probe,
        Observation::Reload,
        Observation::Sizes,
    ];

    /// What it is, for people: reports name the observation that crashed with it.
    pub fn describe(self) -> &'static str {
        match self {
            Observation::Sequences => "the per-sequence dumps",
            Observation::Before => "the cells before the op",
            Observation::Whole => "the whole dump",
            Observation::RoundTrip => "the twin round trip",
            Observation::Probe => "the logits probe",
            Observation::Reload => "the reload probe",
            Observation::Sizes => "the dumps' sizes",
        }
    }

    /// Its name on the command line and in test hooks (`whole`, `round-trip`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Observation::Sequences => "sequences",
            Observation::Before => "before",
            Observation::Whole => "whole",
            Observation::RoundTrip => "round-trip",
            Observation::Probe => "probe",
            Observation::Reload => "reload",
            Observation::Sizes => "sizes",
        }
    }

    /// The observation called `name` ([`Observation::name`]).
    pub fn from_name(name: &str) -> Option<Observation> {
        Observation::ALL.into_iter().find(|o| o.name() == name)
    }

    /// A small number for the worker's signal report (1-based; 0 there means "running the op").
    pub fn code(self) -> usize {
        Observation::ALL
            .iter()
            .position(|&o| o == self)
            .expect("listed")
            + 1
    }

    /// The observation of a signal report's code ([`Observation::code`]).
    pub fn from_code(code: usize) -> Option<Observation> {
        code.checked_sub(1)
            .and_then(|i| Observation::ALL.get(i))
            .copied()
    }
}

impl Observe {
    /// This, without `what` (the accessors and per-sequence dumps cannot be left out: `None`).
    pub fn without(self, what: Observation) -> Option<Observe> {
        let mut o = self;
        match what {
            Observation::Sequences => return None,
            Observation::Before => o.before = false,
            Observation::Whole => o.whole = false,
            Observation::RoundTrip => o.round_trip = false,
            Observation::Probe => {
                o.logits = false;
                o.next_logits = false;
            }
            Observation::Reload => {
                o.reload = false;
                o.partial = false;
            }
            Observation::Sizes => o.sizes = false,
        }
        Some(o)
    }
}

/// A KV cache under audit.
pub trait CacheUnderTest {
    /// Who this target is.
    fn info(&self) -> TargetInfo;

    /// Empties the cache and builds `setup` (shape, then setup ops).
    fn reset(&mut self, setup: &Setup) -> Result<(), HarnessError>;

    /// Applies one op.
    fn apply(&mut self, op: &Op) -> Result<OpOutcome, HarnessError>;

    /// Observes sequence `seq` into `out`, every field written (its buffers reused): the
    /// positions of the sequence's cells, read where the target's capabilities say
    /// ([`crate::base::capabilities::CellSource`]: its own serialized state by default), and its
    /// accessors' answers (`pos_min`, `pos_max`). llama.cpp and the native model read their
    /// cells from their own per-sequence dump (`targets::dump_cells`).
    fn observe_seq(&mut self, seq: SeqId, out: &mut SeqObservation) -> Result<(), HarnessError>;

    /// Where a decode at "the next position" of `seq` starts on this target (on llama.cpp its
    /// `seq_pos_max + 1`, which a token model must follow even when it is stale).
    fn next_pos(&mut self, seq: SeqId) -> Result<Pos, HarnessError>;

    /// The target's serialized state of one sequence (llama.cpp:
    /// `llama_state_seq_get_data(seq)`, laid out as [`crate::base::state`] reads it).
    fn seq_state(&mut self, seq: SeqId) -> Result<Vec<u8>, HarnessError>;

    /// [`CacheUnderTest::seq_state`] into `into` (its bytes replaced): a target that can write
    /// into a buffer the caller keeps spares an allocation per observed sequence.
    fn seq_state_into(&mut self, seq: SeqId, into: &mut Vec<u8>) -> Result<(), HarnessError> {
        *into = self.seq_state(seq)?;
        Ok(())
    }

    /// An exact in-memory copy of the whole target, derived state included, if the target can
    /// make one. Explorers use it to share trace prefixes. A target whose only way to copy
    /// itself is serialize-and-restore must return `None`: a restore rebuilds derived state and
    /// would hide the stale-state bugs I1 looks for (shared/LLAMA-FACTS.md, 0.1.156).
    fn fork(&self) -> Option<Box<dyn CacheUnderTest + Send>> {
        None
    }

    /// The logits of the last token of the last successful decode, for targets that run a model
    /// (the numerical oracles T1-T3, [`crate::oracles::theorems`]). `None`: the target computes none.
    fn last_logits(&mut self) -> Result<Option<Vec<f32>>, HarnessError> {
        Ok(None)
    }

    /// `llama_state_seq_set_data(bytes, seq)`: restores a sequence from bytes [`Self::seq_state`]
    /// produced (T1's state round trip). `Done { returned: Some(loaded) }` with `loaded` false
    /// when the target rejected the bytes (llama.cpp returned 0), `Unsupported` when it cannot
    /// restore at all.
    fn set_seq_state(&mut self, seq: SeqId, bytes: &[u8]) -> Result<OpOutcome, HarnessError> {
        let _ = (seq, bytes);
        Ok(OpOutcome::Unsupported {
            reason: format!("{} cannot restore a sequence state", self.info().name),
        })
    }

    /// The target's serialized state of the whole context (llama.cpp: `llama_state_get_data`).
    /// `None`: the target has no such dump.
    fn state_get(&mut self) -> Result<Option<Vec<u8>>, HarnessError> {
        Ok(None)
    }

    /// The cells of `whole`, a dump [`Self::state_get`] wrote, read in the target's own layout
    /// (llama.cpp's and the native model's: [`crate::base::state::parse_whole_state`]).
    /// `None`: the target cannot read its whole dump's cells.
    fn whole_cells(&mut self, whole: &[u8]) -> Result<Option<Vec<WholeCell>>, HarnessError> {
        let _ = whole;
        Ok(None)
    }

    /// The size `dump`'s size call reports and the bytes its data call writes ([`DumpSize`]).
    /// `None`: the target answers no sizes (or no such flags).
    fn state_size(&mut self, dump: Dump) -> Result<Option<DumpSize>, HarnessError> {
        let _ = dump;
        Ok(None)
    }

    /// What the memory allocated when the context of the last [`Self::reset`] was made.
    /// `None`: the target cannot say.
    fn allocation(&mut self) -> Result<Option<Allocation>, HarnessError> {
        Ok(None)
    }

    /// `llama_state_set_data(bytes)`: as [`Self::set_seq_state`], for the whole context.
    fn state_set(&mut self, bytes: &[u8]) -> Result<OpOutcome, HarnessError> {
        let _ = bytes;
        Ok(OpOutcome::Unsupported {
            reason: format!("{} cannot restore a whole state", self.info().name),
        })
    }

    /// An empty twin of this target: the same configuration as the last [`Self::reset`], no
    /// cells, sharing nothing with this one. The round trip loads this target's dumps into it.
    /// `None`: the target cannot make one.
    fn twin(&mut self) -> Result<Option<&mut dyn CacheUnderTest>, HarnessError> {
        Ok(None)
    }

    /// Appends a key of the target's complete state to `out` and returns true, when it has
    /// one: two states with equal keys answer every accessor, dump and twin round trip alike,
    /// so a runner observes each distinct state once ([`crate::running::observe::ObservationMemo`]).
    /// False (the default) for a target whose state is partly hidden (llama.cpp: a stale
    /// derived index is exactly what its dumps do not show).
    fn observation_key(&self, out: &mut Vec<u8>) -> bool {
        let _ = out;
        false
    }

    /// Told which observation the calls that follow make (`None`: the next op's own calls),
    /// so that a crash inside them can be told from a crash of the op: the llama.cpp worker
    /// writes it into its fatal-signal report. Observing nothing by itself.
    fn observing(&mut self, what: Option<Observation>) {
        let _ = what;
    }
}

/// The coarser of two cache types (fewer bits per value).
pub fn coarser(a: CacheType, b: CacheType) -> CacheType {
    let bits = |t: CacheType| match t {
        CacheType::F32 => 32,
        CacheType::F16 => 16,
        CacheType::Q8_0 => 8,
        CacheType::Q4_0 => 4,
    };
    if bits(a) <= bits(b) {
        a
    } else {
        b
    }
}

/// The cache type a probe of `setup` is judged by: the coarser of K and V, and F32 for a
/// recurrent memory, which keeps no K/V: its states are F32 whatever the K/V types
/// (llama_model::create_memory, src/llama-model.cpp:2677-2685 in 0.1.161).
pub fn probe_cache(setup: &Setup) -> CacheType {
    match setup.arch.memory() {
        MemoryType::Recurrent => CacheType::F32,
        _ => coarser(setup.type_k, setup.type_v),
    }
}

/// Whether a logits probe of `setup` sums V rows in F16: flash attention over an F16 or F32 V
/// cache on a memory with attention ([`LogitsProbe::v_summed_in_f16`]). An F32 K or V is cast
/// to F16 before `ggml_flash_attn_ext` (src/llama-graph.cpp:2727-2733 in 0.1.161), so an F32
/// cache is summed as an F16 one there; a quantized V keeps its own path.
pub fn v_summed_in_f16(setup: &Setup) -> bool {
    setup.flash_attn
        && matches!(setup.type_v, CacheType::F16 | CacheType::F32)
        && setup.arch.memory() != MemoryType::Recurrent
}
