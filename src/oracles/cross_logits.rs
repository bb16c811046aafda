//! **Cross-logits**: two engines that run the same model on the same trace give the same
//! next-token logits for each sequence after the trace, within a tolerance measured first
//! (PREREG.md, issue 44). Each target's runner decodes the probe token right after each
//! sequence in its own cache, after the trial's last op (the logits probe, `running/probe.rs`),
//! and keeps the vector ([`Observe::next_logits`]); the oracle compares A's with B's, sequence
//! by sequence.
//!
//! It judges only where both sides carry a vector for a sequence, of a memory and cache type
//! with a measured tolerance, V rows not summed in F16 (flash attention over an F16 V cache
//! rounds by cell order) and no key moved by `seq_add`/`seq_div` (a rotation in place rounds
//! differently from a fresh one). The two engines must load one model: kvaudit's tiny GGUF
//! model, which llama.cpp targets load and the mlx-lm worker reads with `mx.load`
//! (docs/worker-protocol.md, the `models` option).
//!
//! The differential oracle compares the cells and accessors of the same pair; this one what a
//! user sees of them. It is costly (a probe decode per sequence, the logits across the wire),
//! so an exhaustive audit asks it when `--oracles` names it.

use serde_json::json;

use super::cache_invisible::unmeasured_f16_sum;
use super::{Oracle, OracleId, PositiveControl, Reads, Seen, Violation};
use crate::base::cache::{logits_distance, LogitsProbe, NextLogits, Observe, StepObservation};
use crate::base::op::{CacheType, MemoryType, Setup};

/// Its id.
pub const ID: OracleId = OracleId::builtin(21, "cross-logits");

/// The largest max |Δ| between two engines' next-token logits that still holds, per memory
/// and cache type (the coarser of K and V); `None`: not measured, not judged. Measured on
/// llama.cpp@0.1.161 against mlx-lm@0.32.2 over kvaudit's tiny llama (PREREG.md, issue 44
/// cross-engine batch; `tests/it/cross.rs` prints the figures).
pub fn tolerance(memory: MemoryType, cache: CacheType) -> Option<f32> {
    match (memory, cache) {
        // mlx-lm keeps K/V in the model's dtype (F32 here): against llama.cpp's F32 cache both
        // compute in F32 and differ by summation order only.
        (MemoryType::Kv, CacheType::F32) => Some(F32_TOLERANCE),
        // llama.cpp rounds K and V to F16 as it stores them, mlx-lm does not: that rounding.
        (MemoryType::Kv, CacheType::F16) => Some(F16_TOLERANCE),
        _ => None,
    }
}

/// See [`tolerance`].
const F32_TOLERANCE: f32 = 1e-4;
/// See [`tolerance`].
const F16_TOLERANCE: f32 = 5e-3;

/// Whether `probe` (A's logits probe of the sequence, which says how the setup caches) is of a
/// kind this oracle judges, and its tolerance.
fn judged_tolerance(probe: &LogitsProbe) -> Option<f32> {
    if unmeasured_f16_sum(probe.v_summed_in_f16, probe.memory) || probe.shifted {
        return None;
    }
    tolerance(probe.memory, probe.cache)
}

/// Each sequence both sides carry logits for and this oracle judges: its id, A's and B's
/// vectors and the tolerance.
fn pairs<'a>(
    a: &'a StepObservation,
    b: &'a StepObservation,
) -> impl Iterator<Item = (&'a NextLogits, &'a NextLogits, f32)> + 'a {
    let (va, vb) = (a.next_logits.as_deref(), b.next_logits.as_deref());
    va.into_iter().flatten().filter_map(move |x| {
        let y = vb?.iter().find(|y| y.seq == x.seq)?;
        let probe = a.logits_probe.as_deref()?.iter().find(|p| p.seq == x.seq)?;
        Some((x, y, judged_tolerance(probe)?))
    })
}

/// The first judged sequence whose two vectors differ by more than the tolerance, if any.
pub fn check_pair(a: &StepObservation, b: &StepObservation) -> Option<Violation> {
    let (x, y, tol, d) = pairs(a, b).find_map(|(x, y, tol)| {
        let d = logits_distance(&x.logits, &y.logits);
        (d > tol).then_some((x, y, tol, d))
    })?;
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .fold(None, |best: Option<(usize, f32)>, (i, &l)| match best {
                Some((_, m)) if m >= l => best,
                _ => Some((i, l)),
            })
            .map(|(i, _)| i)
    };
    Some(Violation {
        oracle: ID,
        kind: "next-token logits differ".into(),
        seq: Some(x.seq),
        observed: json!({
            "max_abs_diff": d,
            "vocab": [x.logits.len(), y.logits.len()],
            "argmax": [argmax(&x.logits), argmax(&y.logits)],
        }),
        expected: json!({ "max_abs_diff_at_most": tol }),
    })
}

/// The oracle, as a value ([`Oracle`]).
pub static CROSS_LOGITS: Oracle = Oracle {
    id: ID,
    summary: "two engines running one model give each sequence the same next-token logits after a trace (within a measured tolerance)",
    reads: Reads::Pair,
    kinds: &["next-token logits differ"],
    positive_controls: &[PositiveControl {
        fault: "rope_halves",
        target: "llama.cpp@0.1.161 vs mlx-lm@0.32.2[rope_halves]",
        seed_depth: None,
        evidence: "audits/cross_rope_halves_d1.json",
    }],
    observes: Observe {
        logits: true,
        next_logits: true,
        ..Observe::BASIC
    },
    costly: true,
    observed_is_evidence: false,
    holds: Some(holds_on),
    check: violation_on,
    judges: Some(judges_on),
    judges_setup: judges_setup_of,
    ..Oracle::DEFAULTS
};

fn holds_on(seen: &Seen<'_>) -> bool {
    match seen {
        Seen::Pair { a, b, .. } => {
            pairs(a, b).all(|(x, y, tol)| logits_distance(&x.logits, &y.logits) <= tol)
        }
        _ => true,
    }
}

fn violation_on(seen: &Seen<'_>) -> Option<Violation> {
    match seen {
        Seen::Pair { a, b, .. } => check_pair(a, b),
        _ => None,
    }
}

fn judges_on(seen: &Seen<'_>) -> bool {
    match seen {
        Seen::Pair { a, b, .. } => pairs(a, b).next().is_some(),
        _ => false,
    }
}

fn judges_setup_of(setup: &Setup) -> bool {
    let memory = setup.arch.memory();
    !unmeasured_f16_sum(crate::base::cache::v_summed_in_f16(setup), memory)
        && tolerance(memory, crate::base::cache::probe_cache(setup)).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::cache::OpOutcome;

    fn step(cache: CacheType, logits: &[f32]) -> StepObservation {
        let mut s = StepObservation::basic(OpOutcome::Decoded { rc: 0 }, Vec::new());
        s.logits_probe = Some(vec![LogitsProbe {
            seq: 0,
            max_abs_diff: 0.0,
            n_tokens: 3,
            cache,
            shifted: false,
            memory: MemoryType::Kv,
            rolled_back: false,
            v_summed_in_f16: false,
        }]);
        s.next_logits = Some(vec![NextLogits {
            seq: 0,
            logits: logits.to_vec(),
        }]);
        s
    }

    #[test]
    fn judges_where_both_carry_logits_and_compares_them_within_the_tolerance() {
        let a = step(CacheType::F32, &[0.5, 1.0]);
        let seen = |b| Seen::Pair {
            op: &crate::base::op::Op::Clear,
            a: &a,
            b,
            damaged_apart: false,
        };
        let near = step(CacheType::F32, &[0.5, 1.0 + F32_TOLERANCE / 2.0]);
        assert!(CROSS_LOGITS.judges(&seen(&near)) && CROSS_LOGITS.holds(&seen(&near)));
        let far = step(CacheType::F32, &[0.5, 1.2]);
        assert!(!CROSS_LOGITS.holds(&seen(&far)));
        let v = CROSS_LOGITS.check(&seen(&far)).unwrap();
        assert_eq!(
            (v.kind.as_str(), v.seq),
            ("next-token logits differ", Some(0))
        );
        assert_eq!(v.observed["argmax"], json!([1, 1]));
        let mut none = far.clone();
        none.next_logits = None;
        assert!(!CROSS_LOGITS.judges(&seen(&none)) && CROSS_LOGITS.holds(&seen(&none)));
        let quantized = step(CacheType::Q8_0, &[0.5, 1.0]);
        let q_seen = Seen::Pair {
            op: &crate::base::op::Op::Clear,
            a: &quantized,
            b: &far,
            damaged_apart: false,
        };
        assert!(!CROSS_LOGITS.judges(&q_seen) && CROSS_LOGITS.holds(&q_seen));
    }
}
