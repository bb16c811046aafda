//! Running a target state by state, for a state-space explorer: the capability a target offers
//! when its *complete* state can be keyed ([`KeyedTarget`]), and [`StateRunner`], which takes one
//! op from a state, observes the result as a trial's last step is observed, and keys the new
//! state.
//!
//! Deduplicating by a key is sound only when the key covers everything any later op, accessor,
//! dump or oracle's observation reads: two states with equal keys must be indistinguishable by
//! every continuation. A target whose state is partly hidden (llama.cpp: its bookkeeping can
//! only be seen through its accessors and dumps, and a dump is exactly what a stale derived
//! index is *not* in) cannot promise that, and does not implement [`KeyedTarget`]
//! (docs/usage.md, `--strategy states`).
//!
//! What the runner adds to the target's state: nothing. The observed sequences come from the
//! setup, the "before" cells of a step are the observation of the state it starts from, and the
//! one piece of per-trial state a [`super::runner::LocalRunner`] carries beside the target, the
//! token model, is read only by the logits probe, which a state runner refuses
//! ([`StateRunner::new`]): the token model numbers cells by the order they were made in, so two
//! paths to one cache state give it different values, and no canonical key of it exists.

use std::sync::Arc;

use crate::base::cache::{
    CacheUnderTest, HarnessError, Observe, OpOutcome, SeqObservation, TargetInfo,
};
use crate::base::op::{Op, SeqId, Setup};
use crate::running::observe::{observe_seqs, observe_with};
use crate::running::runner::{TrialEnd, TrialRun};

/// Which parts of a state a key covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeyScope {
    /// Everything any later op or observation reads: the only sound key.
    #[default]
    Complete,
    /// Everything but the per-sequence position index (a derived structure). Unsound on
    /// purpose, for the test that shows a key must be complete: with it the state-space search
    /// merges states that differ only in a drifted index, and misses the bugs that live there.
    WithoutIndex,
}

/// A target whose complete state can be copied and keyed.
pub trait KeyedTarget: CacheUnderTest + Send {
    /// An exact in-memory copy, derived state included (as [`CacheUnderTest::fork`]).
    fn fork_keyed(&self) -> Box<dyn KeyedTarget>;

    /// Appends the canonical bytes of the state `scope` covers to `out`: with
    /// [`KeyScope::Complete`], two states of one setup have equal keys exactly when no sequence
    /// of ops and observations can tell them apart. Equal keys are compared byte for byte, so
    /// no two states are ever merged by a collision.
    fn write_state_key(&self, out: &mut Vec<u8>, scope: KeyScope);
}

/// Makes one state runner per thread.
pub type StateRunnerFactory<'a> = dyn Fn() -> Result<StateRunner, HarnessError> + Sync + 'a;

/// A state of a search: the target in it, and its sequences as observed (the "before" of every
/// step from it).
pub struct State {
    target: Box<dyn KeyedTarget>,
    seqs: Vec<SeqObservation>,
}

/// One op taken from a state: what a trial ending in it would observe, and the key of the state
/// it leads to (`None` when the op was unsupported: the trial stops, no state follows).
pub struct Step {
    /// The observation after the op (one step), or how the trial ended.
    pub run: TrialRun,
    /// The key of the new state.
    pub key: Option<Vec<u8>>,
}

/// Takes ops from states of one [`KeyedTarget`] and keys the results.
pub struct StateRunner {
    target: Box<dyn KeyedTarget>,
    info: TargetInfo,
    observe: Observe,
    scope: KeyScope,
}

impl StateRunner {
    /// A runner over `target`, observing `observe` after each op. The logits probe cannot be
    /// asked for (see the module docs): `Err(Unsupported)`.
    pub fn new(target: Box<dyn KeyedTarget>, observe: Observe) -> Result<Self, HarnessError> {
        let info = target.info();
        if observe.logits {
            return Err(HarnessError::Unsupported {
                target: info.name,
                reason: "the logits probe reads the token model, which has no canonical key: \
                         a state-space search cannot judge it"
                    .into(),
            });
        }
        Ok(StateRunner {
            target,
            info,
            observe,
            scope: KeyScope::Complete,
        })
    }

    /// The same runner keying `scope` (tests only ever need [`KeyScope::WithoutIndex`]).
    pub fn with_scope(mut self, scope: KeyScope) -> Self {
        self.scope = scope;
        self
    }

    /// Who the target is.
    pub fn info(&self) -> TargetInfo {
        self.info.clone()
    }

    /// The state after `setup` and then `path` (ops that were each taken before, so none is
    /// unsupported), or `None` when the target cannot take the setup's configuration.
    pub fn state_at(&mut self, setup: &Setup, path: &[Op]) -> Result<Option<State>, HarnessError> {
        match self.target.reset(setup) {
            Ok(()) => {}
            Err(HarnessError::Unsupported { .. }) => return Ok(None),
            Err(e) => return Err(e),
        }
        let mut target = self.target.fork_keyed();
        for op in path {
            if let OpOutcome::Unsupported { reason } = target.apply(op)? {
                return Err(HarnessError::Target {
                    target: self.info.name.clone(),
                    message: format!("{op} was taken before and is unsupported now: {reason}"),
                });
            }
        }
        let seqs = observe_seqs(target.as_mut(), &observed(setup))?;
        Ok(Some(State { target, seqs }))
    }

    /// The key of `state`.
    pub fn key(&self, state: &State) -> Vec<u8> {
        let mut key = Vec::new();
        state.target.write_state_key(&mut key, self.scope);
        key
    }

    /// Takes `op` from `state` (which stays as it was): the observation after it, as a trial
    /// ending in it observes, and the key of the state it leads to.
    pub fn step(&self, state: &State, setup: &Setup, op: &Op) -> Result<Step, HarnessError> {
        let mut target = state.target.fork_keyed();
        let outcome = target.apply(op)?;
        if let OpOutcome::Unsupported { reason } = outcome {
            return Ok(Step {
                run: TrialRun::new(Vec::new(), TrialEnd::Unsupported { step: 1, reason }),
                key: None,
            });
        }
        let mut obs = observe_with(target.as_mut(), &observed(setup), outcome, self.observe)?;
        if self.observe.before {
            obs.before = Some(state.seqs.clone());
        }
        let mut key = Vec::new();
        target.write_state_key(&mut key, self.scope);
        Ok(Step {
            run: TrialRun::new(vec![Arc::new(obs)], TrialEnd::Completed),
            key: Some(key),
        })
    }
}

/// The sequences every step observes (as [`crate::base::op::Trace::observed_seqs`]).
fn observed(setup: &Setup) -> Vec<SeqId> {
    (0..setup.n_seq_max as SeqId).collect()
}
