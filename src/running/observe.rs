//! The observation procedures: what a runner reads from a target after an op. The accessors
//! and per-sequence dumps of the observed sequences ([`observe`]), the sequences before an op
//! ([`observe_seqs`]), and, as [`Observe`] asks, the whole-context dump's cells and the round
//! trip into the target's twin ([`observe_with`]). Each tells the target what it observes
//! ([`CacheUnderTest::observing`]), so a crash inside is an observation crash, not the op's.
//! Cells come from the bytes, through `base/state/` (no target's bookkeeping is trusted). On a
//! target that keys its complete state, [`ObservationMemo`] makes each of these once per
//! distinct state; on any target a per-sequence dump is parsed once per distinct bytes in each
//! thread (`ParsedDumps`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use crate::base::cache::{
    CacheUnderTest, Dump, HarnessError, Observation, Observe, OpOutcome, RoundTrip, SeqObservation,
    SeqRoundTrip, SeqSizes, StateSizes, StepObservation, STATE_SEQ_FLAGS_PARTIAL_ONLY,
};
use crate::base::op::Pos;
use crate::base::op::{Op, SeqId};
use crate::base::state::{parse_seq_state, parse_whole_state, ParseError, StateFormat};
use crate::base::word_hash::BuildWordHasher;

/// Observes `seqs` on `target`: the accessors, and the cells from the serialized state.
pub fn observe(
    target: &mut dyn CacheUnderTest,
    format: StateFormat,
    seqs: &[SeqId],
    outcome: OpOutcome,
) -> Result<StepObservation, HarnessError> {
    let mut seqs_observed = Vec::with_capacity(seqs.len());
    observe_seqs_into(target, format, seqs, &mut seqs_observed)?;
    Ok(StepObservation::basic(outcome, seqs_observed))
}

/// The sequences `seqs` into `out`, whose buffers are filled again.
fn observe_seqs_into(
    target: &mut dyn CacheUnderTest,
    format: StateFormat,
    seqs: &[SeqId],
    out: &mut Vec<SeqObservation>,
) -> Result<(), HarnessError> {
    target.observing(Some(Observation::Sequences));
    out.truncate(seqs.len());
    for (i, &seq) in seqs.iter().enumerate() {
        if i == out.len() {
            out.push(unobserved(seq));
        }
        observe_seq_into(target, format, seq, &mut out[i])?;
    }
    Ok(())
}

/// The sequences `seqs` as they are now: what [`StepObservation::before`] holds.
pub fn observe_seqs(
    target: &mut dyn CacheUnderTest,
    format: StateFormat,
    seqs: &[SeqId],
) -> Result<Vec<SeqObservation>, HarnessError> {
    target.observing(Some(Observation::Before));
    seqs.iter()
        .map(|&seq| observe_seq(target, format, seq))
        .collect()
}

fn observe_seq(
    target: &mut dyn CacheUnderTest,
    format: StateFormat,
    seq: SeqId,
) -> Result<SeqObservation, HarnessError> {
    let mut out = unobserved(seq);
    observe_seq_into(target, format, seq, &mut out)?;
    Ok(out)
}

/// A sequence's observation before [`observe_seq_into`] fills it.
fn unobserved(seq: SeqId) -> SeqObservation {
    SeqObservation {
        seq,
        pos_min: -1,
        pos_max: -1,
        cells: Vec::new(),
        second_cells: None,
        third_cells: None,
    }
}

/// Observes `seq` into `out`, every field of it written (its buffers kept where large enough).
fn observe_seq_into(
    target: &mut dyn CacheUnderTest,
    format: StateFormat,
    seq: SeqId,
    out: &mut SeqObservation,
) -> Result<(), HarnessError> {
    out.seq = seq;
    out.pos_min = target.seq_pos_min(seq)?;
    out.pos_max = target.seq_pos_max(seq)?;
    // One buffer per thread for the dumps it observes: their bytes are looked up in the memo
    // below, and kept there only when new.
    let mut bytes = DUMP_BUFFER.take();
    let read = target.seq_state_into(seq, &mut bytes);
    let parsed = read.map(|()| {
        PARSED_DUMPS.with(|memo| {
            let mut memo = memo.borrow_mut();
            let p = memo.positions(&bytes, format)?;
            out.cells.clone_from(&p.cells);
            out.second_cells.clone_from(&p.second);
            out.third_cells.clone_from(&p.third);
            Ok(())
        })
    });
    DUMP_BUFFER.set(bytes);
    parsed?.map_err(|source| HarnessError::State {
        target: target.info().name,
        seq,
        source,
    })
}

thread_local! {
    /// This thread's memo of parsed per-sequence dumps ([`ParsedDumps`]).
    static PARSED_DUMPS: RefCell<ParsedDumps> = RefCell::default();
    /// The buffer this thread reads per-sequence dumps into.
    static DUMP_BUFFER: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// How many bytes of dumps a [`ParsedDumps`] keeps as keys before it starts afresh.
const PARSED_DUMPS_BYTES: usize = 32 << 20;

/// The positions a per-sequence dump holds, by the dump's bytes: a dump is parsed once, and the
/// same bytes again (another trial that ends in the same cells) are answered from here. Parsing
/// is a function of the bytes and the format alone, so this changes no observation; it spares
/// a llama.cpp audit, whose states cannot be keyed ([`ObservationMemo`] keys only a target's
/// complete state), the parse and its allocations on every trial: the seed domain's depth-3
/// trials end in far fewer distinct dumps than the 240,198 a trial per sequence makes.
///
/// Dumps are looked up by a hash of their head and tail only ([`dump_hash`]), and the bytes of
/// each candidate are compared whole: hashing a whole dump (kilobytes of K/V rows) cost more
/// than parsing it, while two dumps with the same head (header, cells, first rows) and tail
/// that differ between them are rare and only cost a comparison more.
#[derive(Default)]
struct ParsedDumps {
    /// The format of every dump held (another one empties the memo).
    format: Option<StateFormat>,
    /// Bytes of the dumps held.
    held: usize,
    /// By [`dump_hash`]: the dumps of that hash and their positions.
    positions: HashMap<u64, Vec<(Box<[u8]>, DumpPositions)>, BuildWordHasher>,
}

/// How many bytes of a dump's head, and of its tail, [`dump_hash`] reads.
const DUMP_HASH_HEAD: usize = 512;
const DUMP_HASH_TAIL: usize = 64;

/// A hash of a dump's length, its first [`DUMP_HASH_HEAD`] bytes (the header and the cells'
/// positions and sequences come first) and its last [`DUMP_HASH_TAIL`].
fn dump_hash(bytes: &[u8]) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = BuildWordHasher.build_hasher();
    h.write_usize(bytes.len());
    if bytes.len() <= DUMP_HASH_HEAD + DUMP_HASH_TAIL {
        h.write(bytes);
    } else {
        h.write(&bytes[..DUMP_HASH_HEAD]);
        h.write(&bytes[bytes.len() - DUMP_HASH_TAIL..]);
    }
    h.finish()
}

/// What a per-sequence dump says of each part of the memory (`SeqObservation`'s cells).
#[derive(Clone)]
struct DumpPositions {
    cells: Vec<Pos>,
    second: Option<Vec<Pos>>,
    third: Option<Vec<Pos>>,
}

impl ParsedDumps {
    /// The positions in `bytes`, a per-sequence dump in `format`, parsed now or before.
    fn positions(
        &mut self,
        bytes: &[u8],
        format: StateFormat,
    ) -> Result<&DumpPositions, ParseError> {
        if self.format != Some(format) {
            self.positions.clear();
            self.held = 0;
            self.format = Some(format);
        }
        let hash = dump_hash(bytes);
        let known = self
            .positions
            .get(&hash)
            .and_then(|same_hash| same_hash.iter().position(|(b, _)| **b == *bytes));
        if let Some(at) = known {
            return Ok(&self.positions[&hash][at].1);
        }
        let parsed = parse_seq_state(bytes, format)?;
        let positions = DumpPositions {
            cells: parsed.resident_positions(),
            second: parsed.second_positions(),
            third: parsed.third_positions(),
        };
        if self.held + bytes.len() > PARSED_DUMPS_BYTES {
            self.positions.clear();
            self.held = 0;
        }
        self.held += bytes.len();
        let same_hash = self.positions.entry(hash).or_default();
        same_hash.push((bytes.into(), positions));
        Ok(&same_hash.last().expect("pushed").1)
    }
}

/// [`observe`], plus what `what` asks for and the target can give: the whole-context dump's
/// cells, and the round trip into a twin.
pub fn observe_with(
    target: &mut dyn CacheUnderTest,
    format: StateFormat,
    seqs: &[SeqId],
    outcome: OpOutcome,
    what: Observe,
) -> Result<StepObservation, HarnessError> {
    // Its outcome and parts are set by `observe_with_into`.
    let placeholder = OpOutcome::Done { returned: None };
    let mut obs = StepObservation::basic(placeholder, Vec::with_capacity(seqs.len()));
    observe_with_into(target, format, seqs, outcome, what, &mut obs)?;
    Ok(obs)
}

/// [`observe_with`] into `obs`, an observation no one else holds: its sequences' buffers are
/// filled again and every other part made anew. (A worker observes every trial into the
/// previous one's observation: nothing is allocated, moved or dropped whole per trial.)
pub fn observe_with_into(
    target: &mut dyn CacheUnderTest,
    format: StateFormat,
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
    observe_seqs_into(target, format, seqs, &mut obs.seqs)?;
    if what.whole || what.round_trip {
        whole_and_round_trip(target, format, seqs, what, obs)?;
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
    format: StateFormat,
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
        let cells = parse_whole_state(&whole, format).map_err(|source| HarnessError::State {
            target: target.info().name,
            seq: -1,
            source,
        })?;
        obs.whole = Some(cells);
    }
    if what.round_trip {
        target.observing(Some(Observation::RoundTrip));
        obs.round_trip = round_trip(target, format, seqs, &whole)?;
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
    format: StateFormat,
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
        whole_twin.push(observe_seq(twin, format, seq)?);
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
        let obs = observe_seq(twin, format, seq)?;
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
        format: StateFormat,
        seqs: &[SeqId],
        outcome: OpOutcome,
        what: Observe,
        id: Option<StateId>,
    ) -> Result<StepObservation, HarnessError> {
        let Some(index) = self.live(id).filter(|_| what == self.observe) else {
            return observe_with(target, format, seqs, outcome, what);
        };
        if let Some(known) = &self.states[index] {
            let mut obs = StepObservation::clone(known);
            obs.outcome = outcome;
            return Ok(obs);
        }
        let obs = observe_with(target, format, seqs, outcome, what)?;
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
