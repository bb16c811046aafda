//! What a trial gives back: how it ended ([`TrialEnd`]), its observations or, judged where it
//! was observed, its verdicts ([`TrialRun`], [`StepVerdicts`]), and an observation that crashed
//! the target ([`ObservationCrash`]). Runners make these ([`super::runner`]); explorers, judges
//! and reports read them.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::base::cache::{CodeCoverage, Observation, StepObservation};

/// How a trial ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "end", rename_all = "snake_case")]
pub enum TrialEnd {
    /// Every op ran and was observed.
    Completed,
    /// The target does not support the op at `step` (1-based); the trial is unjudged from there.
    Unsupported {
        /// 1-based step.
        step: usize,
        /// Why.
        reason: String,
    },
    /// The target crashed (abort, signal, hang) at `step` (1-based; 0 = during reset).
    Crashed {
        /// 1-based step.
        step: usize,
        /// Signal, exit status or message, and what the target printed last.
        message: String,
    },
}

/// The observations of one trial: one per op that ran, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrialRun {
    /// Observation after each op.
    pub steps: Vec<Arc<StepObservation>>,
    /// How the trial ended.
    pub end: TrialEnd,
    /// An observation that crashed the target after its op had returned, if one did: the
    /// trial was run again without it from that step on, so `steps` lack it there (the oracles
    /// that read it are not judged) and hold everything else. When it is
    /// [`Observation::Sequences`], which no step can do without, the trial ends
    /// [`TrialEnd::Crashed`] at that step instead, unobserved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation_crash: Option<Box<ObservationCrash>>,
    /// The points of the target's own code the trial's ops reached, on a target that records
    /// them (a `+cov` build of llama.cpp); `None` elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<Box<CodeCoverage>>,
    /// The verdicts on the last step, made where it was observed (a batch started with step
    /// oracles to judge there, [`BatchJudging`]), bit k for the k-th of those oracles; `steps`
    /// is then empty. Only what was known violated at an earlier step (the trace's prior bits)
    /// is violated: a step with a fresh violation comes whole, in `steps`, so that the finding
    /// has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judged: Option<StepVerdicts>,
}

impl TrialRun {
    /// A run of these steps that ended so, with no observation crash.
    pub fn new(steps: Vec<Arc<StepObservation>>, end: TrialEnd) -> TrialRun {
        TrialRun {
            steps,
            end,
            observation_crash: None,
            code: None,
            judged: None,
        }
    }

    /// A completed run whose last step the oracles judged where it was observed
    /// ([`TrialRun::judged`]).
    pub fn judged(verdicts: StepVerdicts) -> TrialRun {
        TrialRun {
            judged: Some(verdicts),
            ..TrialRun::new(Vec::new(), TrialEnd::Completed)
        }
    }

    /// The verdicts of a run that is nothing but them ([`TrialRun::judged`]): completed,
    /// without steps, crash or code.
    pub fn only_verdicts(&self) -> Option<StepVerdicts> {
        let plain = self.end == TrialEnd::Completed
            && self.steps.is_empty()
            && self.observation_crash.is_none()
            && self.code.is_none();
        self.judged.filter(|_| plain)
    }

    /// The crash a crash oracle judges: the observation crash if there was one (it came first:
    /// the run stopped or was run again there), else the op's own; as (1-based step, message,
    /// what was being observed).
    pub fn crash(&self) -> Option<(usize, &str, Option<Observation>)> {
        if let Some(c) = &self.observation_crash {
            return Some((c.step, c.message.as_str(), Some(c.observation)));
        }
        match &self.end {
            TrialEnd::Crashed { step, message } => Some((*step, message.as_str(), None)),
            _ => None,
        }
    }
}

/// What step oracles said of one step, one bit per oracle (bit k for the k-th of a list).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepVerdicts {
    /// The oracles that judged the step (it held what they read).
    pub judged: u64,
    /// The oracles it violated (a subset of `judged`).
    pub violated: u64,
}

/// The target crashed (or hung) while observing the result of an op that had returned: a
/// finding of its own class, not a crash of the op ([`TrialRun::observation_crash`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservationCrash {
    /// 1-based step of the op whose result was being observed.
    pub step: usize,
    /// What was being observed.
    pub observation: Observation,
    /// Signal or hang, and what the target printed last (as [`TrialEnd::Crashed`]'s).
    pub message: String,
}

/// Observations a runner leaves out of a trial: each from its 1-based step on (a worker runs a
/// trial again so after one of them crashed, [`ObservationCrash`]).
pub type Skipped = Vec<(usize, Observation)>;

/// Drops every observation but the last of a completed run.
pub fn keep_last(run: &mut TrialRun) {
    if run.end == TrialEnd::Completed && run.steps.len() > 1 {
        run.steps.drain(..run.steps.len() - 1);
    }
}
