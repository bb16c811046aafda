//! Judging a whole run: every step of a trace, every oracle, the first violation of each.
//!
//! The exhaustive explorer judges a trial on its last step only, because every prefix of a trial
//! is a trial of its own there. A random trace, a trace being shrunk or a repro file has no such
//! prefixes: [`judge_run`] walks every step and returns, per oracle, the *first* step that
//! violates it, using the oracles of [`crate::oracles`] unchanged. [`Judge`] runs traces on a
//! target (and on a second one for the differential oracle) and counts the target executions
//! that took; the fuzzer, the shrinker and replay all go through it.
//!
//! A decode the target rejects (`rc != 0`) and an op it refuses are observations like any other:
//! they are findings only when an oracle says so. An unsupported op ends the judged prefix.
//!
//! [`step_verdicts`] gives the step oracles' verdicts on one step as bits: the exhaustive
//! explorer and a worker judging where it observes both call it. [`VerdictMemo`] shares them
//! between the trials that take the same (state, op) step, so an exhaustive audit judges each
//! step once.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

use serde::{Deserialize, Serialize};

use crate::base::cache::{HarnessError, LogitsProbe, ReloadProbe, StepObservation, TargetInfo};
use crate::base::op::{Arch, Op, Trace};
use crate::oracles::{Oracle, OracleId, Reads, Registry, Seen, Violation};
use crate::running::runner::{RunnerFactory, StepVerdicts, TrialEnd, TrialRun, TrialRunner};

/// An oracle's first violation in a trace, and where.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepViolation {
    /// 1-based step of the first violating op (0: the setup crashed).
    pub step: usize,
    /// What was violated there.
    pub violation: Violation,
    /// The violation is target B's own (B crashed), not A's nor the pair's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_vs: bool,
}

impl StepViolation {
    /// A violation of `oracle` at `step` with only its kind (no sequence, nothing observed or
    /// expected): what tests of the judging of runs need.
    pub fn of_kind(oracle: OracleId, step: usize, kind: &str) -> StepViolation {
        StepViolation {
            step,
            violation: Violation {
                oracle,
                kind: kind.to_string(),
                seq: None,
                observed: serde_json::Value::Null,
                expected: serde_json::Value::Null,
            },
            on_vs: false,
        }
    }
}

/// What the oracles say about one run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunJudgement {
    /// The first violation of each violated oracle, in [`OracleId`] order.
    pub violations: Vec<StepViolation>,
    /// Steps judged: the ops every target ran and was observed after.
    pub steps: usize,
    /// The step (1-based) and reason where a target said an op is unsupported, if one did.
    pub unsupported: Option<(usize, String)>,
    /// Oracles that read steps and could judge none of this trial's (their observation was
    /// missing on every step): not judged, never passed.
    pub unjudged: Vec<OracleId>,
    /// Target A's logits probes, over every step (their figures, whatever oracle judges them).
    pub logits_probes: Vec<LogitsProbe>,
    /// Target A's reload probes, over every step.
    pub reload_probes: Vec<ReloadProbe>,
}

impl RunJudgement {
    /// The first violation of `oracle`, if any.
    pub fn first(&self, oracle: OracleId) -> Option<&StepViolation> {
        self.violations
            .iter()
            .find(|v| v.violation.oracle == oracle)
    }

    /// True if no oracle was violated.
    pub fn holds(&self) -> bool {
        self.violations.is_empty()
    }
}

fn unsupported_at(run: &TrialRun) -> Option<(usize, String)> {
    match &run.end {
        TrialEnd::Unsupported { step, reason } => Some((*step, reason.clone())),
        _ => None,
    }
}

/// Judges every step of `a` (and of `b`, the same trace on a second target) with every oracle
/// of `oracles` that observes: step oracles on `a`, pair oracles on the steps both ran, crash
/// oracles on a crash of either (the earlier one). `same_layout`: the two targets write their
/// states in one layout ([`TargetInfo::same_state_layout`]).
pub fn judge_run(
    oracles: &Registry,
    trace: &Trace,
    a: &TrialRun,
    b: Option<&TrialRun>,
    same_layout: bool,
) -> RunJudgement {
    let mut out = RunJudgement {
        steps: b.map_or(a.steps.len(), |b| a.steps.len().min(b.steps.len())),
        unsupported: unsupported_at(a).or_else(|| b.and_then(unsupported_at)),
        ..RunJudgement::default()
    };
    let crashes = std::iter::once((false, a)).chain(b.map(|b| (true, b)));
    let crash = crashes
        .filter_map(|(on_vs, run)| {
            let (step, message, observation) = run.crash()?;
            Some((step, on_vs, message, observation))
        })
        .min_by_key(|(step, ..)| *step);
    out.logits_probes = a
        .steps
        .iter()
        .flat_map(|s| s.logits_probe.iter().flatten().cloned())
        .collect();
    out.reload_probes = a
        .steps
        .iter()
        .flat_map(|s| s.reload_probe.iter().flatten().cloned())
        .collect();
    for oracle in oracles.observing(b.is_some()) {
        let judged_any = match oracle.reads() {
            Reads::Step => a.steps.iter().enumerate().any(|(i, after)| {
                oracle.judges(&Seen::Step {
                    op: &trace.ops[i],
                    after,
                    arch: trace.setup.arch,
                })
            }),
            Reads::Pair => b.is_some_and(|b| {
                a.steps.iter().zip(&b.steps).enumerate().any(|(i, (x, y))| {
                    oracle.judges(&Seen::Pair {
                        op: &trace.ops[i],
                        a: x,
                        b: y,
                        damaged_apart: !same_layout && trace.damaged_load_by(i + 1),
                    })
                })
            }),
            Reads::Crash | Reads::Runs => true,
        };
        // A crashed trial brings no observations back: an oracle that needs its own costly
        // observation judged nothing there either.
        if !judged_any && (out.steps > 0 || oracle.costly()) {
            out.unjudged.push(oracle.id());
        }
        let first = match oracle.reads() {
            Reads::Step => a.steps.iter().enumerate().find_map(|(i, after)| {
                let seen = Seen::Step {
                    op: &trace.ops[i],
                    after,
                    arch: trace.setup.arch,
                };
                (oracle.judges(&seen) && !oracle.holds(&seen))
                    .then(|| (i + 1, oracle.check(&seen), false))
            }),
            Reads::Pair => {
                let b = b.expect("pair oracles observe runs with a second target");
                a.steps
                    .iter()
                    .zip(&b.steps)
                    .enumerate()
                    .find_map(|(i, (x, y))| {
                        let seen = Seen::Pair {
                            op: &trace.ops[i],
                            a: x,
                            b: y,
                            damaged_apart: !same_layout && trace.damaged_load_by(i + 1),
                        };
                        (oracle.judges(&seen) && !oracle.holds(&seen))
                            .then(|| (i + 1, oracle.check(&seen), false))
                    })
            }
            Reads::Crash => crash.and_then(|(step, on_vs, message, observation)| {
                let op = step.checked_sub(1).and_then(|i| trace.ops.get(i));
                let seen = Seen::Crash {
                    op,
                    message,
                    observation,
                };
                (!oracle.holds(&seen)).then(|| (step, oracle.check(&seen), on_vs))
            }),
            Reads::Runs => None,
        };
        if let Some((step, violation, on_vs)) = first {
            out.violations.push(StepViolation {
                step,
                violation: violation.unwrap_or_else(|| {
                    panic!(
                        "oracle {} does not hold but reports no violation",
                        oracle.id()
                    )
                }),
                on_vs,
            });
        }
    }
    out
}

/// Runs traces on a target (and a second one, for the differential oracle) and judges them.
pub struct Judge {
    a: Box<dyn TrialRunner>,
    b: Option<Box<dyn TrialRunner>>,
    info_a: TargetInfo,
    info_b: Option<TargetInfo>,
    oracles: Registry,
    executions: u64,
}

impl Judge {
    /// A judge over one runner from each factory.
    pub fn new(a: &RunnerFactory<'_>, b: Option<&RunnerFactory<'_>>) -> Result<Self, HarnessError> {
        let a = a()?;
        let b = b.map(|f| f()).transpose()?;
        Ok(Self::from_runners(a, b))
    }

    /// A judge over these runners.
    pub fn from_runners(a: Box<dyn TrialRunner>, b: Option<Box<dyn TrialRunner>>) -> Self {
        let (info_a, info_b) = (a.info(), b.as_ref().map(|b| b.info()));
        Judge {
            a,
            b,
            info_a,
            info_b,
            oracles: Registry::builtin(),
            executions: 0,
        }
    }

    /// This judge, asking `oracles` instead of the built-in ones.
    pub fn with_oracles(mut self, oracles: Registry) -> Self {
        self.oracles = oracles;
        self
    }

    /// The oracles this judge asks.
    pub fn oracles(&self) -> &Registry {
        &self.oracles
    }

    /// Target A.
    pub fn target(&self) -> &TargetInfo {
        &self.info_a
    }

    /// Target B, if any.
    pub fn vs(&self) -> Option<&TargetInfo> {
        self.info_b.as_ref()
    }

    /// `A`, or `A vs B`: the label findings carry.
    pub fn label(&self) -> String {
        match &self.info_b {
            Some(b) => format!("{} vs {}", self.info_a.label(), b.label()),
            None => self.info_a.label(),
        }
    }

    /// The target(s) a violation belongs to: the pair for the differential oracle, B for B's
    /// own crash, A otherwise (I1 and I2 judge A only).
    pub fn label_of(&self, v: &StepViolation) -> String {
        let pair = self
            .oracles
            .get(v.violation.oracle)
            .is_some_and(|o| o.reads() == Reads::Pair);
        match (&self.info_b, pair, v.on_vs) {
            (Some(_), true, _) => self.label(),
            (Some(b), _, true) => b.label(),
            _ => self.info_a.label(),
        }
    }

    /// Target executions so far: one per trace per target.
    pub fn executions(&self) -> u64 {
        self.executions
    }

    /// Runs `trace` on every target and judges every step.
    pub fn run(&mut self, trace: &Trace) -> Result<RunJudgement, HarnessError> {
        Ok(self.run_observed(trace)?.0)
    }

    /// [`Judge::run`], also handing back target A's run (its observation after each op) to a
    /// caller that reads more than the oracles do (the fuzzer's coverage).
    pub fn run_observed(
        &mut self,
        trace: &Trace,
    ) -> Result<(RunJudgement, TrialRun), HarnessError> {
        let traces = std::slice::from_ref(trace);
        let a = self.a.run_batch(traces)?.pop().expect("one run per trace");
        self.executions += 1;
        let b = match &mut self.b {
            Some(b) => {
                self.executions += 1;
                Some(b.run_batch(traces)?.pop().expect("one run per trace"))
            }
            None => None,
        };
        let same_layout = self
            .info_b
            .as_ref()
            .map_or(true, |b| self.info_a.same_state_layout(b));
        let judgement = judge_run(&self.oracles, trace, &a, b.as_ref(), same_layout);
        Ok((judgement, a))
    }
}

/// A judge of the native target with `faults`, for tests.
#[cfg(test)]
pub(crate) fn native_judge(faults: &[&str]) -> Judge {
    let faults: Vec<String> = faults.iter().map(|s| s.to_string()).collect();
    let f = crate::targets::registry::TargetSpec::new("native", &faults)
        .factory()
        .unwrap();
    Judge::new(f.as_ref(), None).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::op::{Decode, Op, Setup};
    use crate::targets::registry::TargetSpec;

    use super::native_judge as judge;

    fn seed_trace(ops: Vec<Op>) -> Trace {
        Trace {
            setup: Setup {
                ops: vec![Op::Decode(Decode::next(0, 7))],
                ..Setup::default()
            },
            ops,
        }
    }

    #[test]
    fn every_step_is_judged_and_the_first_violation_kept() {
        let cp = Op::SeqCp {
            src: 0,
            dst: 1,
            p0: 0,
            p1: 3,
        };
        let rm = Op::SeqRm {
            seq: 0,
            p0: 2,
            p1: 5,
        };
        // I2 breaks at step 1 and stays broken; I1 breaks at step 4 (after the double copy and
        // the keep), and stays broken at step 5.
        let trace = seed_trace(vec![
            rm,
            cp.clone(),
            cp,
            Op::SeqKeep { seq: 0 },
            Op::Decode(Decode::next(2, 1)),
        ]);
        let j = judge(&["refcount"]).run(&trace).unwrap();
        assert_eq!(j.steps, 5);
        assert_eq!(j.first(OracleId::I2).unwrap().step, 1);
        let i1 = j.first(OracleId::I1).unwrap();
        assert_eq!(i1.step, 4);
        assert_eq!(i1.violation.seq, Some(1));
    }

    #[test]
    fn a_rejected_decode_is_an_observation_not_a_finding() {
        // Seq 0 ends at position 6; an explicit decode at 20 fails batch validation (rc -1),
        // and a context of 256 cells has no room for 300 tokens (rc 1).
        let trace = seed_trace(vec![
            Op::Decode(Decode {
                pos: Some(20),
                ..Decode::next(0, 1)
            }),
            Op::Decode(Decode::next(1, 300)),
        ]);
        let mut j = judge(&[]);
        let verdict = j.run(&trace).unwrap();
        assert!(verdict.holds(), "{:?}", verdict.violations);
        assert_eq!(j.executions(), 1);
    }

    #[test]
    fn differential_names_the_first_diverging_step() {
        let fa = TargetSpec::new("native", &[]).factory().unwrap();
        let fb = TargetSpec::new("native", &["seq_rm_off_by_one".into()])
            .factory()
            .unwrap();
        let mut j = Judge::new(fa.as_ref(), Some(fb.as_ref())).unwrap();
        let trace = seed_trace(vec![
            Op::SeqKeep { seq: 0 },
            Op::SeqRm {
                seq: 0,
                p0: 0,
                p1: 3,
            },
        ]);
        let v = j.run(&trace).unwrap();
        assert_eq!(v.first(OracleId::DIFFERENTIAL).unwrap().step, 2);
        assert_eq!(j.executions(), 2);
        assert_eq!(j.label(), "native vs native[seq_rm_off_by_one]");
    }

    #[test]
    fn the_differential_does_not_judge_after_a_damaged_load_of_two_layouts() {
        use crate::base::cache::OpOutcome;
        use crate::running::runner::LocalRunner;
        // The hunt's trace (reports/hunt/llama.cpp@0.1.161, entry `state`): llama.cpp refuses
        // the sequence load cut at byte 36 of its dump where the native model, whose dump has
        // no K/V rows, takes the first 36 bytes of its own: two different loads.
        let ops: Vec<Op> = serde_json::from_str(
            r#"[{"op":"decode","seq":1,"n":1},{"op":"state_seq_save","seq":1,"slot":"a"},
                {"op":"state_seq_load","seq":0,"slot":"a","truncate":36}]"#,
        )
        .unwrap();
        let trace = seed_trace(ops);
        assert!(!trace.damaged_load_by(2) && trace.damaged_load_by(3));
        let mut runner = LocalRunner::new(Box::new(crate::targets::native::NativeTarget::new(
            native_kv::Faults::default(),
        )));
        let b = runner.run(&trace).unwrap();
        let mut a = b.clone();
        let mut refused = (*a.steps[2]).clone();
        refused.outcome = OpOutcome::Refused {
            reason: "llama_state_seq_set_data read 0 bytes".into(),
        };
        a.steps[2] = std::sync::Arc::new(refused);
        let registry = Registry::builtin();
        let apart = judge_run(&registry, &trace, &a, Some(&b), false);
        assert!(apart.first(OracleId::DIFFERENTIAL).is_none());
        // One layout (the same cut of the same bytes): the load is judged.
        let alike = judge_run(&registry, &trace, &a, Some(&b), true);
        assert_eq!(alike.first(OracleId::DIFFERENTIAL).map(|v| v.step), Some(3));
        // Steps before the damaged load are judged whatever the layouts.
        let mut early = b.clone();
        early.steps[0] = a.steps[2].clone();
        let before = judge_run(&registry, &trace, &early, Some(&b), false);
        assert_eq!(
            before.first(OracleId::DIFFERENTIAL).map(|v| v.step),
            Some(1)
        );
        // Which pairs lay their states out alike.
        let info = |name: &str| TargetInfo {
            name: name.into(),
            version: String::new(),
            faults: Vec::new(),
            model: None,
            state_format: Default::default(),
        };
        let llama = info("llama.cpp@0.1.161");
        assert!(!llama.same_state_layout(&info("native")));
        assert!(!info("native").same_state_layout(&info("native+tensors")));
        assert!(info("native").same_state_layout(&info("native")));
        assert!(llama.same_state_layout(&info("llama.cpp@0.1.161 (n_ubatch=1)")));
        // One stream per sequence lays a dump out otherwise (the regenerated hunt's group 89:
        // a config-differential after a cut whole load, 2026-12-07).
        assert!(!llama.same_state_layout(&info("llama.cpp@0.1.161 (kv_unified=false)")));
        assert!(!info("llama.cpp@0.1.161 (n_ubatch=1)")
            .same_state_layout(&info("llama.cpp@0.1.161 (n_ubatch=1,flash_attn=on)")));
        assert!(info("llama.cpp@0.1.161 (n_ubatch=1)")
            .same_state_layout(&info("llama.cpp@0.1.161 (n_batch=8,n_ubatch=1)")));
    }

    #[test]
    fn an_observation_crash_is_its_own_class_and_judges_the_other_oracles() {
        use crate::base::cache::Observation;
        use crate::running::runner::{LocalRunner, ObservationCrash};
        let trace = seed_trace(vec![
            Op::SeqRm {
                seq: 0,
                p0: 2,
                p1: 5,
            },
            Op::SeqKeep { seq: 0 },
        ]);
        // The run a worker hands back after the whole dump crashed at step 1: run again
        // without it from step 1 on.
        let mut runner = LocalRunner::new(Box::new(crate::targets::native::NativeTarget::new(
            native_kv::Faults::default(),
        )));
        runner.set_skipped(&[(1, Observation::Whole)]);
        let mut run = runner.run(&trace).unwrap();
        assert!(run
            .steps
            .iter()
            .all(|s| s.whole.is_none() && s.round_trip.is_some()));
        run.observation_crash = Some(Box::new(ObservationCrash {
            step: 1,
            observation: Observation::Whole,
            message: "SIGSEGV".into(),
        }));
        let j = judge_run(&Registry::builtin(), &trace, &run, None, true);
        let crash = j.first(OracleId::CRASH).expect("a crash finding");
        assert_eq!(crash.step, 1);
        assert_eq!(
            crash.violation.kind,
            "observation crash (the whole dump): SIGSEGV"
        );
        // Conservation reads the whole dump: not judged. I2 is judged (and finds the hole).
        assert!(j.unjudged.contains(&crate::oracles::conservation::ID));
        assert!(!j.unjudged.contains(&OracleId::I2));
        assert_eq!(j.first(OracleId::I2).map(|v| v.step), Some(1));
        assert_eq!(j.steps, 2);
        // Without the skip, every step has the whole dump again.
        runner.set_skipped(&[]);
        assert!(runner
            .run(&trace)
            .unwrap()
            .steps
            .iter()
            .all(|s| s.whole.is_some()));
    }
}

/// The most verdicts a [`VerdictMemo`] keeps before it starts afresh.
const MEMO_VERDICTS: usize = 1 << 18;

/// The step oracles' verdicts on step observations a runner shares between trials (the same
/// `Arc`: `running::observe::ObservationMemo` hands out one per (state, op) transition), so
/// that a trial whose last step another trial already took is not judged again. A verdict is
/// a function of what a step oracle reads, [`Seen::Step`]'s op, observation and architecture:
/// an entry is used only for the same op and architecture and an observation that is still
/// the one judged (held by a `Weak`, so its allocation is not reused while the entry lives,
/// and its contents cannot change while it is shared).
#[derive(Default)]
pub struct VerdictMemo {
    verdicts: HashMap<usize, Verdict>,
}

struct Verdict {
    obs: Weak<StepObservation>,
    op: Op,
    arch: Arch,
    /// Per tracked oracle (by index), whether it judged the step, and whether it was violated.
    judged: u64,
    violated: u64,
    /// The violations found on the step so far, by the oracle's index
    /// ([`VerdictMemo::violation`]).
    found: Vec<(usize, Violation)>,
}

impl VerdictMemo {
    /// The (judged, violated) bits of the tracked oracles on `obs` after `op`, if judged before.
    pub fn get(&self, obs: &Arc<StepObservation>, op: &Op, arch: Arch) -> Option<(u64, u64)> {
        let v = self.verdicts.get(&(Arc::as_ptr(obs) as usize))?;
        (v.obs.as_ptr() == Arc::as_ptr(obs)
            && v.obs.strong_count() > 0
            && v.arch == arch
            && v.op == *op)
            .then_some((v.judged, v.violated))
    }

    /// Remembers the verdict on a shared observation (one no other owner holds is never
    /// judged again: not worth keeping).
    pub fn put(
        &mut self,
        obs: &Arc<StepObservation>,
        op: &Op,
        arch: Arch,
        (judged, violated): (u64, u64),
    ) {
        if Arc::strong_count(obs) < 2 {
            return;
        }
        if self.verdicts.len() >= MEMO_VERDICTS {
            self.verdicts.clear();
        }
        self.verdicts.insert(
            Arc::as_ptr(obs) as usize,
            Verdict {
                obs: Arc::downgrade(obs),
                op: op.clone(),
                arch,
                judged,
                violated,
                found: Vec::new(),
            },
        );
    }

    /// The violation of the `k`-th tracked oracle on `obs` after `op`: `check`'s, made the
    /// first time it is asked for a step whose verdict is remembered, and kept with it (a run
    /// finds the same violation on a shared step again and again: most trials through it
    /// record nothing new, and a violation's values cost more to build than to look up).
    /// `None` when `check` finds none.
    pub fn violation(
        &mut self,
        obs: &Arc<StepObservation>,
        op: &Op,
        arch: Arch,
        k: usize,
        check: impl FnOnce() -> Option<Violation>,
    ) -> Option<Cow<'_, Violation>> {
        if self.get(obs, op, arch).is_none() {
            return check().map(Cow::Owned);
        }
        let verdict = self
            .verdicts
            .get_mut(&(Arc::as_ptr(obs) as usize))
            .expect("looked up above");
        let at = match verdict.found.iter().position(|(j, _)| *j == k) {
            Some(at) => at,
            None => {
                verdict.found.push((k, check()?));
                verdict.found.len() - 1
            }
        };
        Some(Cow::Borrowed(&verdict.found[at].1))
    }
}

/// The verdicts of `oracles` on one target's observation `after` of `op`: bit k for the k-th
/// oracle. Only step oracles judge here; any other (a pair
/// oracle, which needs a second target) sets no bit. What the exhaustive explorer asks of every
/// trial alone, in its own thread or in the worker that observed the step
/// ([`TrialRun::judged`]): both sides call this, so both judge alike.
pub fn step_verdicts(
    oracles: &[&'static Oracle],
    op: &Op,
    after: &StepObservation,
    arch: Arch,
) -> StepVerdicts {
    let seen = Seen::Step { op, after, arch };
    let (mut judged, mut violated) = (0u64, 0u64);
    for (k, oracle) in oracles.iter().enumerate() {
        if oracle.reads() != Reads::Step || !oracle.judges(&seen) {
            continue;
        }
        judged |= 1 << k;
        if !oracle.holds(&seen) {
            violated |= 1 << k;
        }
    }
    StepVerdicts { judged, violated }
}
