//! The observation procedures: what a runner reads from a target after an op. The accessors
//! and per-sequence dumps of the observed sequences ([`observe`]), the sequences before an op
//! ([`observe_seqs`]), and, as [`Observe`] asks, the whole-context dump's cells and the round
//! trip into the target's twin ([`observe_with`]). Each tells the target what it observes
//! ([`CacheUnderTest::observing`]), so a crash inside is an observation crash, not the op's.
//! Cells come from the bytes, through `base/state/` (no target's bookkeeping is trusted).

use crate::base::cache::{
    CacheUnderTest, Dump, HarnessError, Observation, Observe, OpOutcome, RoundTrip, SeqObservation,
    SeqRoundTrip, SeqSizes, StateSizes, StepObservation, STATE_SEQ_FLAGS_PARTIAL_ONLY,
};
use crate::base::op::{Op, SeqId};
use crate::base::state::{parse_seq_state, parse_whole_state, StateFormat};

/// Observes `seqs` on `target`: the accessors, and the cells from the serialized state.
pub fn observe(
    target: &mut dyn CacheUnderTest,
    format: StateFormat,
    seqs: &[SeqId],
    outcome: OpOutcome,
) -> Result<StepObservation, HarnessError> {
    target.observing(Some(Observation::Sequences));
    let mut out = Vec::with_capacity(seqs.len());
    for &seq in seqs {
        out.push(observe_seq(target, format, seq)?);
    }
    Ok(StepObservation::basic(outcome, out))
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
    let pos_min = target.seq_pos_min(seq)?;
    let pos_max = target.seq_pos_max(seq)?;
    let bytes = target.seq_state(seq)?;
    let parsed = parse_seq_state(&bytes, format).map_err(|source| HarnessError::State {
        target: target.info().name,
        seq,
        source,
    })?;
    Ok(SeqObservation {
        seq,
        pos_min,
        pos_max,
        cells: parsed.resident_positions(),
        second_cells: parsed.second_positions(),
    })
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
    let mut obs = observe(target, format, seqs, outcome)?;
    if what.whole || what.round_trip {
        whole_and_round_trip(target, format, seqs, what, &mut obs)?;
    }
    // Last: a dump that crashes is the whole dump's or the round trip's, as before sizes were
    // observed, where those are observed too.
    if what.sizes {
        target.observing(Some(Observation::Sizes));
        obs.sizes = sizes(target, seqs)?;
    }
    Ok(obs)
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
    Ok(Some(StateSizes { whole, seqs: out }))
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
