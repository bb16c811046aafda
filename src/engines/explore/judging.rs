//! The oracles an exhaustive run asks, split by what they read, and the judging of one trial by
//! them: its last step's verdicts (remembered per shared observation), its crashes, and which
//! tracked oracles fail now, so that the explorer (and the state-space explorer) knows from a
//! trial's prefix whether a violation is fresh.

use crate::base::cache::TargetInfo;
use crate::base::op::Trace;
use crate::oracles::{Oracle, Reads, Registry, Seen};
use crate::records::tally::Tally;
use crate::running::judge::{step_verdicts, VerdictMemo};
use crate::running::runner::{StepVerdicts, TrialEnd, TrialRun};

/// A set of tracked oracles (a `RunOracles`' step and pair oracles), by index: one bit each.
pub type OracleBits = u64;

/// The oracles an exhaustive run asks, split by what they read. Step and pair oracles are
/// *tracked*: whether they failed at an earlier step of a trial is known from its prefix.
pub struct RunOracles {
    /// Tracked oracles (step oracles on A, then pair oracles), at most 64.
    tracked: Vec<&'static Oracle>,
    /// Crash oracles.
    crash: Vec<&'static Oracle>,
}

impl RunOracles {
    /// The oracles of `oracles` that judge a run with or without a second target.
    pub fn new(oracles: &Registry, with_vs: bool) -> RunOracles {
        let observing: Vec<_> = oracles.observing(with_vs).collect();
        let tracked: Vec<_> = observing
            .iter()
            .copied()
            .filter(|o| matches!(o.reads(), Reads::Step | Reads::Pair))
            .collect();
        assert!(tracked.len() <= 64, "at most 64 observation oracles");
        RunOracles {
            tracked,
            crash: observing
                .into_iter()
                .filter(|o| o.reads() == Reads::Crash)
                .collect(),
        }
    }

    /// Every oracle asked, tracked then crash: what a report lists ([`Tally::asked`]).
    pub fn ids(&self) -> impl Iterator<Item = crate::oracles::OracleId> + '_ {
        self.tracked.iter().chain(&self.crash).map(|o| o.id())
    }

    /// The tracked oracles' ids, in bit order: what a runner may judge a trial's last step with
    /// where it observes it (`TrialRunner::prepare_batch_last`).
    pub fn tracked_ids(&self) -> Vec<crate::oracles::OracleId> {
        self.tracked.iter().map(|o| o.id()).collect()
    }

    /// How many oracles are tracked (one "violated at some step" bit each).
    pub fn tracked_count(&self) -> usize {
        self.tracked.len()
    }

    /// Records `n` trials of `depth` alone on one target, each judged where it was observed
    /// with the verdicts `v` and none violated afresh ([`TrialRun::only_verdicts`]): what
    /// [`RunOracles::judge`] records for each of them, `n` times over. (A worker sends a run of
    /// such trials as one reply; this is most of an audit's trials.)
    pub fn record_judged(&self, tally: &mut Tally, depth: u32, v: StepVerdicts, n: u64) {
        tally.trials += n;
        for oracle in &self.crash {
            tally.count_many(oracle.id(), depth, false, n);
        }
        for (k, oracle) in self.tracked.iter().enumerate() {
            if oracle.reads() == Reads::Pair {
                continue;
            }
            if v.judged & (1 << k) == 0 {
                tally.unjudged(oracle.id());
            } else {
                tally.count_many(oracle.id(), depth, v.violated & (1 << k) != 0, n);
            }
        }
    }

    /// Judges one trial (and its partner on a second target, if any) on the observation after
    /// its last op, and records the result in `tally`. `prior` says which tracked oracles
    /// already failed at an earlier step (then a violation now is counted but is not a new
    /// finding). Returns which tracked oracles fail now, or `None` when the trial was not
    /// judged (crash, unsupported op). A step judged before (the same shared observation,
    /// [`VerdictMemo`]) takes the step oracles' verdicts from `verdicts`.
    #[allow(clippy::too_many_arguments)]
    pub fn judge(
        &self,
        verdicts: &mut VerdictMemo,
        tally: &mut Tally,
        trace: &Trace,
        index: u64,
        a: (&TargetInfo, &TrialRun),
        b: Option<(&TargetInfo, &TrialRun)>,
        prior: OracleBits,
    ) -> Option<OracleBits> {
        let depth = trace.ops.len() as u32;
        if let (None, Some(v)) = (b, a.1.only_verdicts()) {
            if v.violated & !prior == 0 {
                self.record_judged(tally, depth, v, 1);
                return Some(v.violated & v.judged);
            }
        }
        tally.trials += 1;
        let mut judged = true;
        let mut crashed = false;
        for (info, run) in std::iter::once(a).chain(b) {
            match &run.end {
                TrialEnd::Completed => {}
                TrialEnd::Unsupported { .. } | TrialEnd::Crashed { .. } => judged = false,
            }
            // An observation crash leaves a completed run (run again without that
            // observation): the other oracles still judge it below.
            let Some((step, message, observation)) = run.crash() else {
                continue;
            };
            crashed = true;
            // Steps after a crash do not run, so a crash is fresh only at the trace's last op;
            // longer traces through the same crash are counted, not recorded. (A trial observed
            // after its last op only crashes observing there.)
            if step == trace.ops.len() {
                let op = step.checked_sub(1).and_then(|i| trace.ops.get(i));
                let seen = Seen::Crash {
                    op,
                    message,
                    observation,
                };
                for oracle in &self.crash {
                    if let Some(v) = oracle.check(&seen) {
                        tally.record(trace, index, step, &info.label(), &v);
                    }
                }
            }
        }
        for oracle in &self.crash {
            tally.count(oracle.id(), depth, crashed);
        }
        if !judged {
            let unsupported = [Some(a), b]
                .into_iter()
                .flatten()
                .any(|(_, r)| matches!(r.end, TrialEnd::Unsupported { .. }));
            tally.unsupported += u64::from(unsupported);
            return None;
        }
        let (info_a, run_a) = a;
        let op = trace.ops.last().expect("a trial has at least one op");
        let arch = trace.setup.arch;
        // A run judged where it was observed has no step: only its verdicts (violated only
        // where its prefix was already).
        let last = run_a.steps.last();
        let last_b = b.map(|(info_b, run_b)| {
            let step = run_b
                .steps
                .last()
                .expect("a completed trial has its last observation");
            (info_b, step)
        });
        // Alone, a trial's verdicts are a function of its last step: made where it was
        // observed, or remembered per shared observation, or made here (a pair's are made
        // oracle by oracle below).
        let mut fresh = false;
        let known = match (b, run_a.judged) {
            (None, Some(v)) => Some((v.judged, v.violated)),
            (None, None) => {
                let last = last.expect("a completed trial has its last observation");
                Some(verdicts.get(last, op, arch).unwrap_or_else(|| {
                    fresh = true;
                    let v = step_verdicts(&self.tracked, op, last, arch);
                    (v.judged, v.violated)
                }))
            }
            (Some(_), _) => None,
        };
        let mut now: OracleBits = 0;
        let mut judged_bits: OracleBits = 0;
        for (k, oracle) in self.tracked.iter().enumerate() {
            let seen = || {
                let after = last.expect("a freshly violated step comes whole");
                match (oracle.reads(), last_b) {
                    (Reads::Pair, Some((info_b, step_b))) => Seen::Pair {
                        op,
                        a: after,
                        b: step_b,
                        damaged_apart: !info_a.same_state_layout(info_b)
                            && trace.damaged_load_by(trace.ops.len()),
                    },
                    _ => Seen::Step { op, after, arch },
                }
            };
            if oracle.reads() == Reads::Pair && last_b.is_none() {
                continue;
            }
            let (judges, violated) = match known {
                Some((judged, violated)) => (judged & (1 << k) != 0, violated & (1 << k) != 0),
                None => {
                    let seen = seen();
                    let judges = oracle.judges(&seen);
                    (judges, judges && !oracle.holds(&seen))
                }
            };
            if !judges {
                tally.unjudged(oracle.id());
                continue;
            }
            judged_bits |= 1 << k;
            tally.count(oracle.id(), depth, violated);
            if violated {
                now |= 1 << k;
                if prior & (1 << k) == 0 {
                    // Alone, the violation found on a shared step is remembered with its
                    // verdicts: the next trial through it records the same.
                    let v = match (last, last_b) {
                        (Some(step), None) => {
                            verdicts.violation(step, op, arch, k, || oracle.check(&seen()))
                        }
                        _ => oracle.check(&seen()).map(std::borrow::Cow::Owned),
                    };
                    let v = v.unwrap_or_else(|| {
                        panic!(
                            "oracle {} does not hold but reports no violation",
                            oracle.id()
                        )
                    });
                    // Labels are built only here: most trials record nothing.
                    let label = match last_b {
                        Some((info_b, _)) if oracle.reads() == Reads::Pair => {
                            format!("{} vs {}", info_a.label(), info_b.label())
                        }
                        _ => info_a.label(),
                    };
                    tally.record(trace, index, trace.ops.len(), &label, &v);
                }
            }
        }
        if fresh {
            let last = last.expect("judged here from its step");
            verdicts.put(last, op, arch, (judged_bits, now));
        }
        Some(now)
    }
}
