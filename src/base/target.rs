//! `CacheUnderTest`: what every cache under audit implements, and what an observation holds.
//!
//! The trait is small and shaped like the domain (stateright's `Model`, proptest's `Strategy`):
//! reset to a setup, apply one op, and answer the accessors and the serialized state. An op a
//! target cannot perform is [`OpOutcome::Unsupported`]: neither a pass nor a failure. `Err` means
//! the harness itself broke (a library failed to load, a worker died without a trace to blame).

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::base::op::{Op, Pos, SeqId, Setup};
use crate::base::state::{parse_seq_state, ParseError, StateFormat};

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
    /// multiset: two cells may share a position).
    pub cells: Vec<Pos>,
}

/// What the cache looks like after one op.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepObservation {
    /// What the op did.
    pub outcome: OpOutcome,
    /// Every observed sequence, in ascending id order.
    pub seqs: Vec<SeqObservation>,
}

/// A KV cache under audit.
pub trait CacheUnderTest {
    /// Who this target is.
    fn info(&self) -> TargetInfo;

    /// Empties the cache and builds `setup` (shape, then setup ops).
    fn reset(&mut self, setup: &Setup) -> Result<(), HarnessError>;

    /// Applies one op.
    fn apply(&mut self, op: &Op) -> Result<OpOutcome, HarnessError>;

    /// `seq_pos_min(seq)` as the target answers it.
    fn seq_pos_min(&mut self, seq: SeqId) -> Result<Pos, HarnessError>;

    /// `seq_pos_max(seq)` as the target answers it.
    fn seq_pos_max(&mut self, seq: SeqId) -> Result<Pos, HarnessError>;

    /// The bytes of `llama_state_seq_get_data(seq)` (see [`crate::base::state`]).
    fn seq_state(&mut self, seq: SeqId) -> Result<Vec<u8>, HarnessError>;

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
    /// produced (T1's state round trip). `Done` when restored, `Refused` when the target rejected
    /// the bytes, `Unsupported` when it cannot restore at all.
    fn set_seq_state(&mut self, seq: SeqId, bytes: &[u8]) -> Result<OpOutcome, HarnessError> {
        let _ = (seq, bytes);
        Ok(OpOutcome::Unsupported {
            reason: format!("{} cannot restore a sequence state", self.info().name),
        })
    }
}

/// Observes `seqs` on `target`: the accessors, and the cells from the serialized state.
pub fn observe(
    target: &mut dyn CacheUnderTest,
    format: StateFormat,
    seqs: &[SeqId],
    outcome: OpOutcome,
) -> Result<StepObservation, HarnessError> {
    let mut out = Vec::with_capacity(seqs.len());
    for &seq in seqs {
        let pos_min = target.seq_pos_min(seq)?;
        let pos_max = target.seq_pos_max(seq)?;
        let bytes = target.seq_state(seq)?;
        let parsed = parse_seq_state(&bytes, format).map_err(|source| HarnessError::State {
            target: target.info().name,
            seq,
            source,
        })?;
        out.push(SeqObservation {
            seq,
            pos_min,
            pos_max,
            cells: parsed.resident_positions(),
        });
    }
    Ok(StepObservation { outcome, seqs: out })
}
