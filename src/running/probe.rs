//! The logits probe: are a sequence's next-token logits what a fresh context gives for the
//! sequence's resident tokens? (The cache-invisible oracle, issue 10.)
//!
//! After a trial's last op, for each observed sequence with cells that the token model
//! ([`TokenModel::resident`]) can judge: decode [`PROBE_TOKEN`] right after the sequence's last
//! position in the audited cache and read its logits; then, in the target's twin (emptied),
//! decode the sequence's resident tokens at their positions and the same probe token, that
//! sequence alone (so a trace that decoded several sequences in one batch is compared with
//! decoding each on its own), and read those logits. For a recurrent memory the resident tokens
//! are those its state absorbed; the probe's own token stays in the state (a partial `seq_rm`
//! is refused), which that sequence's own logits do not see again (a decode gives a shared
//! state a cell of its own) but later sequences' probes may: on hybrid-idx the token's QSA
//! pool comes first in the pool order that `ggml_top_k` breaks ties by (D7), which is how the
//! `hybrid_idx+ple` group of docs/results.md differs. The probe records the largest absolute
//! difference. It changes the cache it
//! probes, so the runner hands it a cache whose trial is over (a fork, or the target after its
//! last observation); the twin is the one the round trip uses.
//!
//! The reload probe ([`probe_reloads`], the `round-trip-logits` and `save-load-invisible`
//! oracles, issue 23) needs no token model, so it judges every sequence with cells, whatever a
//! fresh decode would make of them: the state is saved right after the trial, whole and per
//! sequence; the probe token's logits of each sequence in the context as it is are the
//! reference; then the saved state is loaded into the emptied twin (whole, then each sequence
//! alone) and back into the context itself (whole; then, after the whole state again, each
//! sequence under its own id), and each sequence's probe logits after each load are compared
//! with the reference ([`Reload`]). The reference probes run between the save and the in-place
//! loads: a whole load replaces the context's memory (`llama_state_set_data`), so nothing they
//! left may survive it (a recurrent state keeps the probe's token, a partial `seq_rm` being
//! refused). When asked ([`crate::base::cache::Observe::partial`]), the partial loads follow
//! ([`probe_partial`]: a `PARTIAL_ONLY` checkpoint restored twice after one more decode).

pub use crate::base::cache::logits_distance;
use crate::base::cache::{
    probe_cache, v_summed_in_f16, CacheUnderTest, HarnessError, LogitsProbe, NextLogits, OpOutcome,
    Reload, ReloadProbe, SeqObservation, STATE_SEQ_FLAGS_PARTIAL_ONLY,
};
use crate::base::op::{Decode, Op, Pos, SeqId, Setup, Slot};
use crate::base::tokens::{Token, TokenModel, PROBE_TOKEN};

fn probe_decode(seq: SeqId, pos: Pos) -> Op {
    Op::Decode(Decode {
        seqs: vec![seq],
        n: 1,
        pos: Some(pos),
        tokens: Some(vec![PROBE_TOKEN]),
    })
}

/// Decodes `tokens` (by position, contiguous) into `seq` of `target` in batches of at most
/// `n_batch`, then the probe token; its logits, or `None` if a decode did not succeed.
fn fresh_logits(
    target: &mut dyn CacheUnderTest,
    seq: SeqId,
    tokens: &[(Pos, Token)],
    n_batch: usize,
) -> Result<Option<Vec<f32>>, HarnessError> {
    for chunk in tokens.chunks(n_batch.max(1)) {
        let d = Decode {
            seqs: vec![seq],
            n: chunk.len() as u32,
            pos: Some(chunk[0].0),
            tokens: Some(chunk.iter().map(|&(_, t)| t).collect()),
        };
        if target.apply(&Op::Decode(d))? != (OpOutcome::Decoded { rc: 0 }) {
            return Ok(None);
        }
    }
    let last = tokens.last().map_or(0, |&(p, _)| p + 1);
    if target.apply(&probe_decode(seq, last))? != (OpOutcome::Decoded { rc: 0 }) {
        return Ok(None);
    }
    target.last_logits()
}

/// Probes every sequence of `seqs` (the observation after the last op) that `tokens` can judge,
/// on `target`, a cache whose trial is over. `None`: the target computes no logits or has no
/// twin (the oracle cannot judge it: "not judged", never a pass). Sequences the model cannot
/// judge, and sequences where a probe decode does not succeed, are left out. `vectors`: each
/// probed sequence's logits in the audited cache are pushed there too
/// ([`crate::base::cache::Observe::next_logits`]).
pub fn probe_logits(
    target: &mut dyn CacheUnderTest,
    setup: &Setup,
    tokens: &TokenModel,
    seqs: &[SeqObservation],
    mut vectors: Option<&mut Vec<NextLogits>>,
) -> Result<Option<Vec<LogitsProbe>>, HarnessError> {
    let n_batch = setup.n_batch.unwrap_or(setup.n_ctx) as usize;
    let memory = setup.arch.memory();
    let cache = probe_cache(setup);
    let mut out = Vec::new();
    for s in seqs {
        let Some(&last) = s.cells.last() else {
            continue;
        };
        let Some((resident, shifted)) = tokens.resident(s) else {
            continue;
        };
        // Only a contiguous run of positions can be decoded fresh (llama_batch_allocr).
        if resident.windows(2).any(|w| w[1].0 != w[0].0 + 1) {
            continue;
        }
        if target.apply(&probe_decode(s.seq, last + 1))? != (OpOutcome::Decoded { rc: 0 }) {
            continue;
        }
        let Some(audited) = target.last_logits()? else {
            return Ok(None);
        };
        if let Some(v) = vectors.as_deref_mut() {
            v.push(NextLogits {
                seq: s.seq,
                logits: audited.clone(),
            });
        }
        // The probe's cell goes again: the next sequence's probe sees the cache as it was.
        target.apply(&Op::SeqRm {
            seq: s.seq,
            p0: last + 1,
            p1: -1,
        })?;
        let Some(twin) = target.twin()? else {
            return Ok(None);
        };
        let Some(fresh) = fresh_logits(twin, s.seq, &resident, n_batch)? else {
            continue;
        };
        out.push(LogitsProbe {
            seq: s.seq,
            max_abs_diff: logits_distance(&audited, &fresh),
            n_tokens: resident.len() as u32,
            cache,
            shifted,
            memory,
            rolled_back: tokens.rolled_back(s.seq),
            v_summed_in_f16: v_summed_in_f16(setup),
        });
    }
    Ok(Some(out))
}

/// What one probe decode gave.
enum Probed {
    /// The probe token's logits.
    Logits(Vec<f32>),
    /// The decode did not succeed.
    Failed,
    /// The target computes no logits.
    NoLogits,
}

/// Decodes the probe token into `seq` at `pos` and reads its logits, then removes the probe's
/// cell again (a recurrent memory refuses the partial removal and keeps the token).
fn probe_at(target: &mut dyn CacheUnderTest, seq: SeqId, pos: Pos) -> Result<Probed, HarnessError> {
    if target.apply(&probe_decode(seq, pos))? != (OpOutcome::Decoded { rc: 0 }) {
        return Ok(Probed::Failed);
    }
    let logits = target.last_logits()?;
    target.apply(&Op::SeqRm {
        seq,
        p0: pos,
        p1: -1,
    })?;
    Ok(logits.map_or(Probed::NoLogits, Probed::Logits))
}

/// Whether a load op returned non-zero; `None` when the target cannot load state at all.
fn load_result(outcome: OpOutcome) -> Option<bool> {
    match outcome {
        OpOutcome::Unsupported { .. } => None,
        o => Some(
            o == OpOutcome::Done {
                returned: Some(true),
            },
        ),
    }
}

/// A sequence a reload probe compares: one with cells whose reference probe decoded, the
/// position right after its last cell, its reference logits and its saved state.
struct Reference {
    seq: SeqId,
    pos: Pos,
    logits: Vec<f32>,
    bytes: Vec<u8>,
}

/// The reload probe (module docs) of every sequence of `seqs` (the observation after the last
/// op) with cells, on `target`, a cache whose trial is over. `None`: the target computes no
/// logits, or has no whole-state dump (the oracles cannot judge it: "not judged"). Loads the
/// target cannot make (no twin, no loads) are left out; a sequence whose reference probe
/// decode fails is left out. `partial`: the partial loads too ([`probe_partial`]).
pub fn probe_reloads(
    target: &mut dyn CacheUnderTest,
    setup: &Setup,
    seqs: &[SeqObservation],
    partial: bool,
) -> Result<Option<Vec<ReloadProbe>>, HarnessError> {
    let Some(whole) = target.state_get()? else {
        return Ok(None);
    };
    let mut saved = Vec::with_capacity(seqs.len());
    for s in seqs {
        if let Some(&last) = s.cells.last() {
            saved.push((s.seq, last + 1, target.seq_state(s.seq)?));
        }
    }
    let mut refs = Vec::with_capacity(saved.len());
    for (seq, pos, bytes) in saved {
        match probe_at(target, seq, pos)? {
            Probed::Logits(logits) => refs.push(Reference {
                seq,
                pos,
                logits,
                bytes,
            }),
            Probed::Failed => {}
            Probed::NoLogits => return Ok(None),
        }
    }
    let (cache, memory) = (probe_cache(setup), setup.arch.memory());
    let mut out = Vec::with_capacity(refs.len() * Reload::ALL.len());
    let mut push = |seq: SeqId, load: Reload, loaded: bool, max_abs_diff: f32| {
        out.push(ReloadProbe {
            seq,
            load,
            loaded,
            max_abs_diff,
            cache,
            memory,
            v_summed_in_f16: v_summed_in_f16(setup),
        })
    };
    // One sequence after one load: its probe's logits against the reference.
    let mut compare = |target: &mut dyn CacheUnderTest,
                       r: &Reference,
                       load: Reload,
                       loaded: bool|
     -> Result<(), HarnessError> {
        let max_abs_diff = if !loaded {
            0.0
        } else {
            distance(&r.logits, probe_at(target, r.seq, r.pos)?)
        };
        push(r.seq, load, loaded, max_abs_diff);
        Ok(())
    };
    if let Some(twin) = target.twin()? {
        if let Some(loaded) = load_result(twin.state_set(&whole)?) {
            for r in &refs {
                compare(twin, r, Reload::WholeTwin, loaded)?;
            }
        }
        for r in &refs {
            twin.apply(&Op::Clear)?;
            let Some(loaded) = load_result(twin.set_seq_state(r.seq, &r.bytes)?) else {
                break;
            };
            compare(twin, r, Reload::SeqTwin, loaded)?;
        }
    }
    if let Some(loaded) = load_result(target.state_set(&whole)?) {
        for r in &refs {
            compare(target, r, Reload::WholeInPlace, loaded)?;
        }
        // Each sequence's own state back under its id, in the context as the trial left it.
        if loaded && load_result(target.state_set(&whole)?) == Some(true) {
            for r in &refs {
                let Some(loaded) = load_result(target.set_seq_state(r.seq, &r.bytes)?) else {
                    break;
                };
                compare(target, r, Reload::SeqInPlace, loaded)?;
            }
        }
    }
    if partial {
        probe_partial(target, &whole, &refs, &mut push)?;
    }
    Ok(Some(out))
}

/// The largest absolute difference of `reference` and what a probe decode gave
/// ([`logits_distance`]; `f32::MAX` when it gave no logits).
fn distance(reference: &[f32], probed: Probed) -> f32 {
    match probed {
        Probed::Logits(l) => logits_distance(reference, &l),
        Probed::Failed | Probed::NoLogits => f32::MAX,
    }
}

/// The partial loads of the reload probe ([`Reload::partial`], the `partial-restore` oracle),
/// as upstream #18552 restores a checkpoint: per sequence, from the whole state the trial left
/// (loaded again first), its partial state is saved (`llama_state_seq_get_data_ext` with
/// `PARTIAL_ONLY`); the probe token is decoded after it (one more decode) and its logits are
/// the reference; then twice: the partial bytes are loaded back under the sequence's id
/// (`_set_data_ext`, `PARTIAL_ONLY`), the probe's cell is removed (`seq_rm(seq, pos, -1)`:
/// after the load, as llama-server does, since a recurrent part refuses it before) and the
/// probe token is decoded again, its logits against the reference. Each load's probe is
/// `push`ed; a load that fails ends the sequence's loads, and so does a refused `seq_rm`
/// (nothing pushed: the checkpoint cannot be taken up).
fn probe_partial(
    target: &mut dyn CacheUnderTest,
    whole: &[u8],
    refs: &[Reference],
    push: &mut dyn FnMut(SeqId, Reload, bool, f32),
) -> Result<(), HarnessError> {
    let slot = Slot::new("partial_probe").expect("a valid slot name");
    let decoded = OpOutcome::Decoded { rc: 0 };
    for r in refs {
        if load_result(target.state_set(whole)?) != Some(true) {
            return Ok(());
        }
        let save = Op::StateSeqSave {
            seq: r.seq,
            slot: slot.clone(),
            flags: STATE_SEQ_FLAGS_PARTIAL_ONLY,
        };
        let saved = target.apply(&save)?
            == OpOutcome::Done {
                returned: Some(true),
            };
        if !saved || target.apply(&probe_decode(r.seq, r.pos))? != decoded {
            continue;
        }
        let Some(reference) = target.last_logits()? else {
            return Ok(());
        };
        for load in [Reload::SeqPartialInPlace, Reload::SeqPartialAgain] {
            let op = Op::StateSeqLoad {
                seq: r.seq,
                slot: slot.clone(),
                flags: STATE_SEQ_FLAGS_PARTIAL_ONLY,
                truncate: None,
                flip: None,
            };
            let Some(loaded) = load_result(target.apply(&op)?) else {
                return Ok(());
            };
            if !loaded {
                push(r.seq, load, false, 0.0);
                break;
            }
            let rm = Op::SeqRm {
                seq: r.seq,
                p0: r.pos,
                p1: -1,
            };
            if target.apply(&rm)?
                != (OpOutcome::Done {
                    returned: Some(true),
                })
            {
                // The loaded state lies past the probe's position (a partial copy of a
                // state: its position is the source's), so the tail cannot be removed and
                // the checkpoint cannot be taken up as llama-server does: not judged.
                break;
            }
            let probed = if target.apply(&probe_decode(r.seq, r.pos))? == decoded {
                target
                    .last_logits()?
                    .map_or(Probed::NoLogits, Probed::Logits)
            } else {
                Probed::Failed
            };
            push(r.seq, load, true, distance(&reference, probed));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances_are_always_comparable_numbers() {
        assert_eq!(logits_distance(&[1.0, 2.0], &[1.0, 2.5]), 0.5);
        assert_eq!(logits_distance(&[1.0], &[1.0, 2.0]), f32::MAX);
        assert_eq!(logits_distance(&[f32::NAN], &[1.0]), f32::MAX);
        assert_eq!(logits_distance(&[], &[]), 0.0);
    }
}
