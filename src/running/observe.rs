//! The observation procedures: what a runner reads from a target after an op. The accessors
//! and per-sequence dumps of the observed sequences ([`observe`]), the sequences before an op
//! ([`observe_seqs`]), and, as [`Observe`] asks, the whole-context dump's cells and the round
//! trip into the target's twin ([`observe_with`]). Each tells the target what it observes
//! ([`CacheUnderTest::observing`]), so a crash inside is an observation crash, not the op's.
//! A sequence is observed by the target itself ([`CacheUnderTest::observe_seq`]: llama.cpp and
//! the native model from their own bytes, `targets::dump_cells`); nothing here knows a dump's
//! layout. On a target that keys its complete state, [`ObservationMemo`] makes each of these
//! once per distinct state.

use std::collections::HashMap;
use std::sync::Arc;

use crate::base::cache::{
    CacheUnderTest, Dump, HarnessError, Observation, Observe, OpOutcome, RoundTrip, SeqObservation,
    SeqRoundTrip, SeqSizes, StateSizes, StepObservation, STATE_SEQ_FLAGS_PARTIAL_ONLY,
};
use crate::base::op::{Op, SeqId};

/// Observes `seqs` on `target`: each sequence's cells and accessors.
pub fn observe(
    target: &mut dyn CacheUnderTest,
    seqs: &[SeqId],
    outcome: OpOutcome,
) -> Result<StepObservation, HarnessError> {
    let mut seqs_observed = Vec::with_capacity(seqs.len());
    observe_seqs_into(target, seqs, &mut seqs_observed)?;
    Ok(StepObservation::basic(outcome, seqs_observed))
}

/// The sequences `seqs` into `out`, whose buffers are filled again.
fn observe_seqs_into(
    target: &mut dyn CacheUnderTest,
    seqs: &[SeqId],
    out: &mut Vec<SeqObservation>,
) -> Result<(), HarnessError> {
    target.observing(Some(Observation::Sequences));
    out.truncate(seqs.len());
    for (i, &seq) in seqs.iter().enumerate() {
        if i == out.len() {
            out.push(SeqObservation::empty(seq));
        }
        target.observe_seq(seq, &mut out[i])?;
    }
    Ok(())
}

/// The sequences `seqs` as they are now: what [`StepObservation::before`] holds.
pub fn observe_seqs(
    target: &mut dyn CacheUnderTest,
    seqs: &[SeqId],
) -> Result<Vec<SeqObservation>, HarnessError> {
    target.observing(Some(Observation::Before));
    seqs.iter()
        .map(|&seq| SeqObservation::of(target, seq))
        .collect()
}

/// [`observe`], plus what `what` asks for and the target can give: the whole-context dump's
/// cells, and the round trip into a twin.
pub fn observe_with(
    target: &mut dyn CacheUnderTest,
    seqs: &[SeqId],
    outcome: OpOutcome,
    what: Observe,
) -> Result<StepObservation, HarnessError> {
    // Its outcome and parts are set by `observe_with_into`.
    let placeholder = OpOutcome::Done { returned: None };
    let mut obs = StepObservation::basic(placeholder, Vec::with_capacity(seqs.len()));
    observe_with_into(target, seqs, outcome, what, &mut obs)?;
    Ok(obs)
}

/// [`observe_with`] into `obs`, an observation no one else holds: its sequences' buffers are
/// filled again and every other part made anew. (A worker observes every trial into the
/// previous one's observation: nothing is allocated, moved or dropped whole per trial.)
pub fn observe_with_into(
    target: &mut dyn CacheUnderTest,
    seqs: &[SeqId],
    outcome: OpOutcome,
    what: Observe,
    obs: &mut StepObservation,
) -> Result<(), HarnessError> {
    obs.outcome = outcome;
    // Only what an earlier observation asked for is there to go. Part by part, not by making
    // the observation anew: dropping the old one whole ran its drop glue every trial (14 more
    // simulated instruction-cache misses per trial, docs/performance.md).
    if obs.whole.is_some() {
        obs.whole = None;
    }
    if obs.round_trip.is_some() {
        obs.round_trip = None;
    }
    if obs.before.is_some() {
        obs.before = None;
    }
    if obs.logits_probe.is_some() {
        obs.logits_probe = None;
    }
    if obs.next_logits.is_some() {
        obs.next_logits = None;
    }
    if obs.reload_probe.is_some() {
        obs.reload_probe = None;
    }
    if obs.sizes.is_some() {
        obs.sizes = None;
    }
    observe_seqs_into(target, seqs, &mut obs.seqs)?;
    if what.whole || what.round_trip {
        whole_and_round_trip(target, seqs, what, obs)?;
    }
    // Last: a dump that crashes is the whole dump's or the round trip's, as before sizes were
    // observed, where those are observed too.
    if what.sizes {
        target.observing(Some(Observation::Sizes));
        obs.sizes = sizes(target, seqs)?;
    }
    Ok(())
}

/// The whole-context dump's cells and the round trip into the twin, as `what` asks.
fn whole_and_round_trip(
    target: &mut dyn CacheUnderTest,
    seqs: &[SeqId],
    what: Observe,
    obs: &mut StepObservation,
) -> Result<(), HarnessError> {
    // The round trip loads the whole dump too: taken for it alone, a crash there is the round
    // trip's.
    target.observing(Some(if what.whole {
        Observation::Whole
    } else {
        Observation::RoundTrip
    }));
    let Some(whole) = target.state_get()? else {
        return Ok(());
    };
    if what.whole {
        obs.whole = target.whole_cells(&whole)?;
    }
    if what.round_trip {
        target.observing(Some(Observation::RoundTrip));
        obs.round_trip = round_trip(target, seqs, &whole)?;
    }
    Ok(())
}

/// The sizes of the whole dump and of each sequence's dump, with flags 0 and `PARTIAL_ONLY`
/// (never `ON_DEVICE`: it leaves rows in the context). `None` when the target answers no sizes.
fn sizes(
    target: &mut dyn CacheUnderTest,
    seqs: &[SeqId],
) -> Result<Option<StateSizes>, HarnessError> {
    let Some(whole) = target.state_size(Dump::Whole)? else {
        return Ok(None);
    };
    let mut out = Vec::with_capacity(seqs.len());
    for &seq in seqs {
        let Some(full) = target.state_size(Dump::Seq { seq, flags: 0 })? else {
            return Ok(None);
        };
        let partial = target.state_size(Dump::Seq {
            seq,
            flags: STATE_SEQ_FLAGS_PARTIAL_ONLY,
        })?;
        out.push(SeqSizes { seq, full, partial });
    }
    let allocated = target.allocation()?;
    Ok(Some(StateSizes {
        whole,
        seqs: out,
        allocated,
    }))
}

/// Loads `whole` (this target's whole-context dump) into the target's twin, then each
/// sequence's dump into the emptied twin, one at a time, and observes the twin. `None` when the target has no twin or the twin cannot
/// load state at all.
fn round_trip(
    target: &mut dyn CacheUnderTest,
    seqs: &[SeqId],
    whole: &[u8],
) -> Result<Option<RoundTrip>, HarnessError> {
    let mut seq_bytes = Vec::with_capacity(seqs.len());
    for &seq in seqs {
        seq_bytes.push(target.seq_state(seq)?);
    }
    let Some(twin) = target.twin()? else {
        return Ok(None);
    };
    let whole_loaded = match twin.state_set(whole)? {
        OpOutcome::Unsupported { .. } => return Ok(None),
        o => {
            o == OpOutcome::Done {
                returned: Some(true),
            }
        }
    };
    let mut whole_twin = Vec::with_capacity(seqs.len());
    for &seq in seqs {
        whole_twin.push(SeqObservation::of(twin, seq)?);
    }
    let whole_same_bytes = twin.state_get()?.as_deref() == Some(whole);
    // Each sequence goes into an emptied twin on its own: sequences that share cells in the
    // original (a `seq_cp`) are written out separately, so loaded together they can need more
    // cells than the cache has, which llama.h does not promise to hold.
    let mut per_seq = Vec::with_capacity(seqs.len());
    for (&seq, bytes) in seqs.iter().zip(&seq_bytes) {
        twin.apply(&Op::Clear)?;
        let loaded = match twin.set_seq_state(seq, bytes)? {
            OpOutcome::Unsupported { .. } => return Ok(None),
            o => {
                o == OpOutcome::Done {
                    returned: Some(true),
                }
            }
        };
        let obs = SeqObservation::of(twin, seq)?;
        let same_bytes = twin.seq_state(seq)? == *bytes;
        per_seq.push(SeqRoundTrip {
            loaded,
            twin: obs,
            same_bytes,
        });
    }
    Ok(Some(RoundTrip {
        whole_loaded,
        whole_twin,
        whole_same_bytes,
        seqs: per_seq,
    }))
}

/// The most transitions an [`ObservationMemo`] keeps before it starts afresh (each holds an
/// observation: a few hundred bytes to a few kilobytes).
const MEMO_TRANSITIONS: usize = 1 << 18;

/// A state an [`ObservationMemo`] has seen: its index, valid in the memo's current generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateId {
    generation: u32,
    index: u32,
}

/// Observations of one runner's states, for a target whose complete state can be keyed
/// ([`CacheUnderTest::observation_key`]): each distinct state is observed once, and each
/// (state, op) transition's step observation is made once and shared (the same `Arc`) by every
/// trial that takes it, so a judge may remember its verdict on it
/// (`running::judge::VerdictMemo`). An exhaustive audit of the seed domain at depth 4 runs
/// 5,884,900 trials through 243,383 distinct steps between 53,573 states (`--strategy states`): without the memo, the whole
/// dump and the twin round trip were made 5.9 million times.
///
/// Sound because the key is complete: two states with equal keys answer every accessor, dump
/// and round trip alike. Valid for one setup, one set of observed sequences and one
/// [`Observe`]: the runner calls [`ObservationMemo::reset`] when any of them changes.
#[derive(Default)]
pub struct ObservationMemo {
    generation: u32,
    observe: Observe,
    scratch: Vec<u8>,
    ids: HashMap<Box<[u8]>, u32>,
    /// Per state index: its observation as [`observe_with`] made it (no `before`, no probes).
    states: Vec<Option<Arc<StepObservation>>>,
    /// Per state index: the ops taken from it, each to its state and step observation.
    steps: Vec<HashMap<Op, (u32, Arc<StepObservation>)>>,
    transitions: usize,
}

impl ObservationMemo {
    /// Forgets every state: the next ones are of a new setup, sequences or `observe`.
    pub fn reset(&mut self, observe: Observe) {
        self.generation = self.generation.wrapping_add(1);
        self.observe = observe;
        self.ids.clear();
        self.states.clear();
        self.steps.clear();
        self.transitions = 0;
    }

    /// The state `target` is in, or `None` when it cannot be keyed.
    pub fn id(&mut self, target: &dyn CacheUnderTest) -> Option<StateId> {
        self.scratch.clear();
        if !target.observation_key(&mut self.scratch) {
            return None;
        }
        let next = self.ids.len() as u32;
        let index = match self.ids.get(self.scratch.as_slice()) {
            Some(&i) => i,
            None => {
                self.ids.insert(self.scratch.as_slice().into(), next);
                self.states.push(None);
                self.steps.push(Default::default());
                next
            }
        };
        Some(StateId {
            generation: self.generation,
            index,
        })
    }

    fn live(&self, id: Option<StateId>) -> Option<usize> {
        id.filter(|id| id.generation == self.generation)
            .map(|id| id.index as usize)
    }

    /// The step observation of `op` taken from `from` with `observe`, if made before, and
    /// the state it led to.
    pub fn step(
        &self,
        from: Option<StateId>,
        op: &Op,
        observe: Observe,
    ) -> Option<(StateId, Arc<StepObservation>)> {
        let from = self.live(from).filter(|_| observe == self.observe)?;
        let (to, obs) = self.steps[from].get(op)?;
        Some((
            StateId {
                generation: self.generation,
                index: *to,
            },
            obs.clone(),
        ))
    }

    /// [`observe_with`] on `target`, in state `id`: the state's observation is made once,
    /// then copied with this step's `outcome`.
    pub fn observe_with(
        &mut self,
        target: &mut dyn CacheUnderTest,
        seqs: &[SeqId],
        outcome: OpOutcome,
        what: Observe,
        id: Option<StateId>,
    ) -> Result<StepObservation, HarnessError> {
        let Some(index) = self.live(id).filter(|_| what == self.observe) else {
            return observe_with(target, seqs, outcome, what);
        };
        if let Some(known) = &self.states[index] {
            let mut obs = StepObservation::clone(known);
            obs.outcome = outcome;
            return Ok(obs);
        }
        let obs = observe_with(target, seqs, outcome, what)?;
        self.states[index] = Some(Arc::new(obs.clone()));
        Ok(obs)
    }

    /// Remembers that `op` from `from` led to `to`, observed as `obs`.
    pub fn remember(
        &mut self,
        from: Option<StateId>,
        op: &Op,
        observe: Observe,
        to: Option<StateId>,
        obs: &Arc<StepObservation>,
    ) {
        let (Some(from), Some(to)) = (self.live(from), self.live(to)) else {
            return;
        };
        if observe != self.observe {
            return;
        }
        if self.transitions >= MEMO_TRANSITIONS {
            // Bounded: start afresh (the states in the runner's stack turn unknown).
            self.reset(self.observe);
            return;
        }
        self.transitions += 1;
        self.steps[from].insert(op.clone(), (to as u32, obs.clone()));
    }
}
