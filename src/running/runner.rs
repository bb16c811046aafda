//! Running traces: reset, apply each op, observe after each op.
//!
//! [`TrialRunner`] is what explorers drive: a batch of traces in, one [`TrialRun`] per trace out.
//! [`LocalRunner`] runs a [`CacheUnderTest`] in this process. When the target can [`fork`]
//! itself exactly, the runner keeps the states after each op of the previous trace and resumes
//! the next trace from the longest shared prefix, so an exhaustive enumeration in lexicographic
//! order applies each op of the tree once. Targets that cannot fork are reset and replayed from
//! the start for every trace (never restored mid-trace: see [`CacheUnderTest::fork`]).
//!
//! A [`RunnerFactory`] makes one runner per thread. A runner observes what the run's oracles
//! declare (`LocalRunner::with_observe`), a replaying runner lends a judged trial's observation
//! to the next (`LocalRunner::recycle`), and [`Reconfigured`] runs every trace under another
//! configuration of its setup (`--vs-config`).
//!
//! [`fork`]: CacheUnderTest::fork

use std::sync::Arc;

use crate::base::cache::{
    CacheUnderTest, HarnessError, Observation, Observe, OpOutcome, SeqObservation, StepObservation,
    TargetInfo,
};
use crate::base::capabilities::Capabilities;
use crate::base::op::{Op, SeqId, Setup, Trace};
use crate::base::tokens::TokenModel;
pub use crate::running::batch::{
    enumerated_indices, BatchJudging, Enumerated, PreparedBatch, StartedBatch,
};
use crate::running::observe::{observe_seqs, observe_with_into, ObservationMemo, StateId};
use crate::running::probe::{probe_logits, probe_reloads};
pub use crate::running::trial::{
    keep_last, ObservationCrash, Skipped, StepVerdicts, TrialEnd, TrialRun,
};

/// Makes one runner per thread.
pub type RunnerFactory<'a> = dyn Fn() -> Result<Box<dyn TrialRunner>, HarnessError> + Sync + 'a;

/// Something that runs traces against one target and reports what it observed.
pub trait TrialRunner: Send {
    /// Who the target is.
    fn info(&self) -> TargetInfo;

    /// What the target declares it can do ([`Capabilities`]): explorers leave out the op kinds
    /// it lacks. By default everything (llama.cpp and the native caches: what one of their
    /// memory types refuses is its answer to the op).
    fn capabilities(&self) -> Capabilities {
        Capabilities::everything()
    }

    /// Runs each trace from its setup. A crash of the target is a [`TrialEnd::Crashed`], not an
    /// error; `Err` means the harness broke.
    fn run_batch(&mut self, traces: &[Trace]) -> Result<Vec<TrialRun>, HarnessError>;

    /// Like [`TrialRunner::run_batch`], but each completed run holds the observation after its
    /// last op only (a replaying target then serializes its state once per trial, not once per
    /// op). Exhaustive explorers, which know each prefix's verdict from the prefix's own trial,
    /// use this.
    fn run_batch_last(&mut self, traces: &[Trace]) -> Result<Vec<TrialRun>, HarnessError> {
        let mut runs = self.run_batch(traces)?;
        for r in &mut runs {
            keep_last(r);
        }
        Ok(runs)
    }

    /// The first of [`TrialRunner::run_batch_last`]'s three parts: `traces` made ready to hand
    /// over (a worker runner writes its request here), so that a caller can prepare the next
    /// batch while the previous one runs and hand it over the moment that one is finished.
    /// `judge`: what the runner may judge each completed trial's last step with where it
    /// observes it ([`BatchJudging`]). `enumerated`: the same traces named as a run of an
    /// exhaustive enumeration, which a runner may hand over instead of the traces themselves
    /// ([`Enumerated`]). By default nothing is prepared and every run keeps its steps.
    fn prepare_batch_last(
        &mut self,
        traces: Vec<Trace>,
        judge: BatchJudging,
        enumerated: Option<Enumerated<'_>>,
    ) -> PreparedBatch {
        let _ = (judge, enumerated);
        PreparedBatch {
            traces,
            request: None,
            judge: BatchJudging::default(),
            may_corrupt: None,
        }
    }

    /// The second part, so that a caller can judge the previous batch while a target in another
    /// process runs this one: this hands the prepared batch over and returns;
    /// [`TrialRunner::finish_batch_last`] waits for the results. One batch at a time: finish a
    /// batch before starting the next. By default nothing runs until the finish.
    fn start_batch_last(&mut self, batch: PreparedBatch) -> Result<StartedBatch, HarnessError> {
        Ok(StartedBatch {
            traces: batch.traces,
            sent: false,
            judge: batch.judge,
        })
    }

    /// The results of the batch [`TrialRunner::start_batch_last`] started, with its traces.
    fn finish_batch_last(
        &mut self,
        batch: StartedBatch,
    ) -> Result<(Vec<Trace>, Vec<TrialRun>), HarnessError> {
        let runs = self.run_batch_last(&batch.traces)?;
        Ok((batch.traces, runs))
    }
}

struct Frame {
    op: Op,
    state: Box<dyn CacheUnderTest + Send>,
    obs: Arc<StepObservation>,
    /// The token model after the op (for the logits probe; `None` when it is not asked for).
    tokens: Option<TokenModel>,
    /// The state after the op, where the target keys its states.
    id: Option<StateId>,
}

/// Runs a [`CacheUnderTest`] in this process.
pub struct LocalRunner {
    target: Box<dyn CacheUnderTest + Send>,
    info: TargetInfo,
    can_fork: bool,
    /// For forking targets: the setup the stack was built from, the state right after it, and
    /// the states after each op of the previous trace.
    base: Option<(Setup, Vec<SeqId>, Box<dyn CacheUnderTest + Send>)>,
    /// The token model right after the base's setup.
    base_tokens: Option<TokenModel>,
    stack: Vec<Frame>,
    observe: Observe,
    /// Observations left out of the next trials, each from its step on ([`LocalRunner::set_skipped`]).
    skipped: Skipped,
    /// The sequences right after the setup (what the first op's `before` is).
    base_obs: Vec<SeqObservation>,
    /// The state right after the setup, where the target keys its states.
    base_id: Option<StateId>,
    /// The forking path's observations per state (a target that keys its states).
    memo: ObservationMemo,
    /// A judged trial's observation, held by no one else: the next trial observes into its
    /// buffers and its allocation ([`LocalRunner::recycle`]); and its steps' vector.
    spare_obs: Option<Arc<StepObservation>>,
    spare_steps: Vec<Arc<StepObservation>>,
    /// The sequences the replayed trials observe ([`Trace::observed_seqs`]), kept between
    /// trials of the same setup size instead of collected for each.
    replay_seqs: Vec<SeqId>,
}

/// A trial that ends before its first op because the target cannot take the setup's
/// configuration ([`HarnessError::Unsupported`]).
fn unsupported_setup(e: HarnessError) -> Result<TrialRun, HarnessError> {
    match e {
        HarnessError::Unsupported { reason, .. } => Ok(TrialRun::new(
            Vec::new(),
            TrialEnd::Unsupported { step: 0, reason },
        )),
        other => Err(other),
    }
}

impl LocalRunner {
    /// A runner over `target`.
    pub fn new(target: Box<dyn CacheUnderTest + Send>) -> Self {
        let info = target.info();
        let can_fork = target.fork().is_some();
        LocalRunner {
            target,
            info,
            can_fork,
            base: None,
            base_tokens: None,
            stack: Vec::new(),
            observe: Observe::ALL,
            skipped: Vec::new(),
            base_obs: Vec::new(),
            base_id: None,
            memo: ObservationMemo::default(),
            spare_obs: None,
            spare_steps: Vec::new(),
            replay_seqs: Vec::new(),
        }
    }

    /// Leaves each observation of `skipped` out of the trials that follow, from its 1-based
    /// step on (empty: observe everything again). A trial whose observation crashed the target
    /// is run again so ([`ObservationCrash`]).
    pub fn set_skipped(&mut self, skipped: &[(usize, Observation)]) {
        if self.skipped != skipped {
            // The stack's observations were made with the other set.
            self.stack.clear();
            self.base = None;
            self.skipped = skipped.to_vec();
        }
    }

    /// What to observe after the op at 1-based `step`.
    fn observe_at(&self, step: usize) -> Observe {
        self.skipped
            .iter()
            .filter(|(from, _)| *from <= step)
            .fold(self.observe, |o, (_, what)| o.without(*what).unwrap_or(o))
    }

    /// The same runner observing only `what` beyond the accessors and per-sequence dumps
    /// (default: everything the target can give).
    pub fn with_observe(mut self, what: Observe) -> Self {
        self.observe = what;
        self
    }

    /// Runs one trace, observing after every op.
    pub fn run(&mut self, trace: &Trace) -> Result<TrialRun, HarnessError> {
        if self.can_fork {
            self.run_forking(trace)
        } else {
            self.run_replay(trace, false)
        }
    }

    /// Runs one trace; the run holds the observation after the last op only.
    pub fn run_last(&mut self, trace: &Trace) -> Result<TrialRun, HarnessError> {
        let mut run = if self.can_fork {
            self.run_forking(trace)?
        } else {
            self.run_replay(trace, true)?
        };
        keep_last(&mut run);
        Ok(run)
    }

    /// Hands back a run whose steps no one needs any more (a worker's trial judged where it
    /// was observed): the next trial observes into its buffers instead of allocating new ones.
    pub fn recycle(&mut self, run: TrialRun) {
        let mut steps = run.steps;
        if let Some(mut last) = steps.pop() {
            if Arc::get_mut(&mut last).is_some() {
                self.spare_obs = Some(last);
            }
        }
        steps.clear();
        self.spare_steps = steps;
    }

    fn run_replay(&mut self, trace: &Trace, last_only: bool) -> Result<TrialRun, HarnessError> {
        let mut seqs = std::mem::take(&mut self.replay_seqs);
        if seqs.len() != trace.setup.n_seq_max as usize {
            seqs = trace.observed_seqs();
        }
        let run = self.replay_observing(trace, last_only, &seqs);
        self.replay_seqs = seqs;
        run
    }

    /// [`LocalRunner::run_replay`] observing `seqs`.
    fn replay_observing(
        &mut self,
        trace: &Trace,
        last_only: bool,
        seqs: &[SeqId],
    ) -> Result<TrialRun, HarnessError> {
        if let Err(e) = self.target.reset(&trace.setup) {
            return unsupported_setup(e);
        }
        let mut steps = std::mem::take(&mut self.spare_steps);
        steps.reserve(if last_only { 1 } else { trace.ops.len() });
        // The token model serves the logits probe only: built when the probe is asked for (it
        // decodes the setup's tokens: a hundredth of a llama.cpp trial otherwise spent for nothing).
        let mut tokens = self
            .observe
            .logits
            .then(|| TokenModel::after_setup(&trace.setup));
        for (i, op) in trace.ops.iter().enumerate() {
            let observed = !last_only || i + 1 == trace.ops.len();
            let observe = self.observe_at(i + 1);
            self.target.observing(None);
            let before = if observe.before && observed {
                Some(observe_seqs(self.target.as_mut(), seqs)?)
            } else {
                None
            };
            let next = if self.observe.logits {
                next_pos(self.target.as_mut(), &trace.setup, op)?
            } else {
                None
            };
            self.target.observing(None);
            let outcome = self.target.apply(op)?;
            if let Some(tokens) = tokens.as_mut() {
                tokens.apply_after(op, &outcome, next);
            }
            if last_only
                && i + 1 < trace.ops.len()
                && !matches!(outcome, OpOutcome::Unsupported { .. })
            {
                continue;
            }
            if let OpOutcome::Unsupported { reason } = &outcome {
                return Ok(TrialRun::new(
                    steps,
                    TrialEnd::Unsupported {
                        step: i + 1,
                        reason: reason.clone(),
                    },
                ));
            }
            // Observed into the spare observation (its allocation and buffers), if there is one.
            let mut held = self.spare_obs.take().unwrap_or_else(|| {
                Arc::new(StepObservation::basic(
                    OpOutcome::Done { returned: None },
                    Vec::new(),
                ))
            });
            let obs = Arc::get_mut(&mut held).expect("a spare observation is held by no one");
            observe_with_into(self.target.as_mut(), seqs, outcome, observe, obs)?;
            obs.before = before;
            let last = i + 1 == trace.ops.len();
            if let Some(tokens) = tokens.as_ref().filter(|_| last && observe.logits) {
                // The trial is over: the probe may change the target (the next trial resets it).
                self.target.observing(Some(Observation::Probe));
                let mut vectors = observe.next_logits.then(Vec::new);
                obs.logits_probe = probe_logits(
                    self.target.as_mut(),
                    &trace.setup,
                    tokens,
                    &obs.seqs,
                    vectors.as_mut(),
                )?;
                if obs.logits_probe.is_some() {
                    obs.next_logits = vectors;
                }
            }
            if last && observe.reload {
                if observe.logits {
                    // The logits probe changed the target: the trial again, from its setup.
                    self.target.observing(None);
                    self.target.reset(&trace.setup)?;
                    for op in &trace.ops {
                        self.target.apply(op)?;
                    }
                }
                self.target.observing(Some(Observation::Reload));
                obs.reload_probe = probe_reloads(
                    self.target.as_mut(),
                    &trace.setup,
                    &obs.seqs,
                    observe.partial,
                )?;
            }
            steps.push(held);
        }
        Ok(TrialRun::new(steps, TrialEnd::Completed))
    }

    fn run_forking(&mut self, trace: &Trace) -> Result<TrialRun, HarnessError> {
        let seqs = trace.observed_seqs();
        let same_base =
            matches!(&self.base, Some((setup, s, _)) if *setup == trace.setup && *s == seqs);
        if !same_base {
            if let Err(e) = self.target.reset(&trace.setup) {
                self.base = None;
                return unsupported_setup(e);
            }
            let state = self.target.fork().expect("target forked before");
            self.base_obs = if self.observe.before {
                observe_seqs(self.target.as_mut(), &seqs)?
            } else {
                Vec::new()
            };
            self.memo.reset(self.observe);
            self.base_id = self.memo.id(state.as_ref());
            self.base = Some((trace.setup.clone(), seqs.clone(), state));
            self.base_tokens = self
                .observe
                .logits
                .then(|| TokenModel::after_setup(&trace.setup));
            self.stack.clear();
        }
        let shared = self
            .stack
            .iter()
            .zip(&trace.ops)
            .take_while(|(f, op)| f.op == **op)
            .count();
        self.stack.truncate(shared.min(trace.ops.len()));
        for (i, op) in trace.ops.iter().enumerate().skip(self.stack.len()) {
            let parent = match self.stack.last() {
                Some(f) => &f.state,
                None => &self.base.as_ref().expect("base set above").2,
            };
            let observe = self.observe_at(i + 1);
            let from = match self.stack.last() {
                Some(f) => f.id,
                None => self.base_id,
            };
            let known = self.memo.step(from, op, observe);
            let mut state = parent.fork().expect("forking target");
            let mut tokens = match self.stack.last() {
                Some(f) => f.tokens.clone(),
                None => self.base_tokens.clone(),
            };
            let next = if self.observe.logits {
                next_pos(state.as_mut(), &trace.setup, op)?
            } else {
                None
            };
            state.observing(None);
            let outcome = state.apply(op)?;
            if let Some(tokens) = tokens.as_mut() {
                tokens.apply_after(op, &outcome, next);
            }
            if let OpOutcome::Unsupported { reason } = &outcome {
                let steps = self.stack.iter().map(|f| f.obs.clone()).collect();
                return Ok(TrialRun::new(
                    steps,
                    TrialEnd::Unsupported {
                        step: i + 1,
                        reason: reason.clone(),
                    },
                ));
            }
            let (id, obs) = match known {
                // The same op from the same state: the same step, observed before.
                Some((id, obs)) if obs.outcome == outcome => (Some(id), obs),
                _ => {
                    let before = observe.before.then(|| match self.stack.last() {
                        Some(f) => f.obs.seqs.clone(),
                        None => self.base_obs.clone(),
                    });
                    let id = self.memo.id(state.as_ref());
                    let mut obs =
                        self.memo
                            .observe_with(state.as_mut(), &seqs, outcome, observe, id)?;
                    obs.before = before;
                    let obs = Arc::new(obs);
                    self.memo.remember(from, op, observe, id, &obs);
                    (id, obs)
                }
            };
            self.stack.push(Frame {
                op: op.clone(),
                state,
                obs,
                tokens,
                id,
            });
        }
        let observe = self.observe_at(trace.ops.len());
        if observe.logits || observe.reload {
            self.probe_last(&trace.setup, trace.ops.len(), observe)?;
        }
        let steps = self
            .stack
            .iter()
            .take(trace.ops.len())
            .map(|f| f.obs.clone())
            .collect();
        Ok(TrialRun::new(steps, TrialEnd::Completed))
    }
}

/// For a decode at "next" positions into a sequence the target answers accessors for (ids
/// `0..n_seq_max`; llama.cpp aborts on others), where it will start: the target's own
/// `seq_pos_max + 1`, which the token model must follow even when it is stale.
fn next_pos(
    target: &mut dyn CacheUnderTest,
    setup: &Setup,
    op: &Op,
) -> Result<Option<i32>, HarnessError> {
    match op.as_decode() {
        Some(d) if d.pos.is_none() && (0..setup.n_seq_max as SeqId).contains(&d.seqs[0]) => {
            Ok(Some(target.next_pos(d.seqs[0])?))
        }
        _ => Ok(None),
    }
}

impl LocalRunner {
    /// Adds the probes asked for to the observation after op `len` of the stack, if it has
    /// none yet (it may have been an inner step of an earlier trace), each probing a fork of
    /// its own: the stack's states are prefixes of later traces.
    fn probe_last(
        &mut self,
        setup: &Setup,
        len: usize,
        observe: Observe,
    ) -> Result<(), HarnessError> {
        let Some(frame) = len.checked_sub(1).and_then(|i| self.stack.get_mut(i)) else {
            return Ok(());
        };
        if let Some(tokens) = frame
            .tokens
            .as_ref()
            .filter(|_| observe.logits && frame.obs.logits_probe.is_none())
        {
            let mut scratch = frame.state.fork().expect("forking target");
            scratch.observing(Some(Observation::Probe));
            let mut vectors = observe.next_logits.then(Vec::new);
            let probe = probe_logits(
                scratch.as_mut(),
                setup,
                tokens,
                &frame.obs.seqs,
                vectors.as_mut(),
            )?;
            if probe.is_some() {
                let obs = Arc::make_mut(&mut frame.obs);
                obs.logits_probe = probe;
                obs.next_logits = vectors;
            }
        }
        if observe.reload && frame.obs.reload_probe.is_none() {
            let mut scratch = frame.state.fork().expect("forking target");
            scratch.observing(Some(Observation::Reload));
            let probe = probe_reloads(scratch.as_mut(), setup, &frame.obs.seqs, observe.partial)?;
            if probe.is_some() {
                Arc::make_mut(&mut frame.obs).reload_probe = probe;
            }
        }
        Ok(())
    }
}

impl TrialRunner for LocalRunner {
    fn info(&self) -> TargetInfo {
        self.info.clone()
    }

    fn run_batch(&mut self, traces: &[Trace]) -> Result<Vec<TrialRun>, HarnessError> {
        traces.iter().map(|t| self.run(t)).collect()
    }

    fn run_batch_last(&mut self, traces: &[Trace]) -> Result<Vec<TrialRun>, HarnessError> {
        traces.iter().map(|t| self.run_last(t)).collect()
    }
}

/// A runner that runs every trace under another configuration of its setup
/// ([`Setup::with_config`]): the second side of a configuration differential (`--vs-config`).
pub struct Reconfigured {
    inner: Box<dyn TrialRunner>,
    config: String,
}

/// A factory of `inner`'s runners, each under `config` ([`Reconfigured`]): the second side of a
/// configuration pair (`--vs-config`).
pub fn reconfigured_factory(
    inner: Box<RunnerFactory<'static>>,
    config: String,
) -> Box<RunnerFactory<'static>> {
    Box::new(move || {
        let r = Reconfigured::new(inner()?, &config)?;
        Ok(Box::new(r) as Box<dyn TrialRunner>)
    })
}

impl Reconfigured {
    /// `inner` with every setup changed by `config` (`kv_unified=false,n_ubatch=1`); the spec
    /// is checked now.
    pub fn new(inner: Box<dyn TrialRunner>, config: &str) -> Result<Self, HarnessError> {
        Setup::default()
            .with_config(config)
            .map_err(|message| HarnessError::Target {
                target: inner.info().name,
                message: message.to_string(),
            })?;
        Ok(Reconfigured {
            inner,
            config: config.to_string(),
        })
    }

    fn rewrite(&self, traces: &[Trace]) -> Vec<Trace> {
        traces
            .iter()
            .map(|t| Trace {
                setup: t
                    .setup
                    .with_config(&self.config)
                    .expect("checked in Reconfigured::new"),
                ops: t.ops.clone(),
            })
            .collect()
    }
}

impl TrialRunner for Reconfigured {
    fn info(&self) -> TargetInfo {
        let mut info = self.inner.info();
        info.name = format!("{} ({})", info.name, self.config);
        info
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn run_batch(&mut self, traces: &[Trace]) -> Result<Vec<TrialRun>, HarnessError> {
        let t = self.rewrite(traces);
        self.inner.run_batch(&t)
    }

    fn run_batch_last(&mut self, traces: &[Trace]) -> Result<Vec<TrialRun>, HarnessError> {
        let t = self.rewrite(traces);
        self.inner.run_batch_last(&t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::op::Decode;
    use crate::targets::native::NativeTarget;

    fn seed_setup() -> Setup {
        Setup {
            ops: vec![Op::Decode(Decode::next(0, 7))],
            ..Setup::default()
        }
    }

    /// A native target that cannot fork, to drive the replay path.
    struct NoFork(NativeTarget);

    impl CacheUnderTest for NoFork {
        fn info(&self) -> TargetInfo {
            self.0.info()
        }
        fn reset(&mut self, setup: &Setup) -> Result<(), HarnessError> {
            self.0.reset(setup)
        }
        fn apply(&mut self, op: &Op) -> Result<OpOutcome, HarnessError> {
            self.0.apply(op)
        }
        fn observe_seq(
            &mut self,
            seq: SeqId,
            out: &mut crate::base::cache::SeqObservation,
        ) -> Result<(), HarnessError> {
            self.0.observe_seq(seq, out)
        }
        fn next_pos(&mut self, seq: SeqId) -> Result<i32, HarnessError> {
            self.0.next_pos(seq)
        }
        fn whole_cells(
            &mut self,
            whole: &[u8],
        ) -> Result<Option<Vec<crate::base::state::WholeCell>>, HarnessError> {
            self.0.whole_cells(whole)
        }
        fn seq_state(&mut self, seq: SeqId) -> Result<Vec<u8>, HarnessError> {
            self.0.seq_state(seq)
        }
        fn set_seq_state(&mut self, seq: SeqId, bytes: &[u8]) -> Result<OpOutcome, HarnessError> {
            self.0.set_seq_state(seq, bytes)
        }
        fn state_get(&mut self) -> Result<Option<Vec<u8>>, HarnessError> {
            self.0.state_get()
        }
        fn state_set(&mut self, bytes: &[u8]) -> Result<OpOutcome, HarnessError> {
            self.0.state_set(bytes)
        }
        fn state_size(
            &mut self,
            dump: crate::base::cache::Dump,
        ) -> Result<Option<crate::base::cache::DumpSize>, HarnessError> {
            self.0.state_size(dump)
        }
        fn allocation(&mut self) -> Result<Option<crate::base::cache::Allocation>, HarnessError> {
            self.0.allocation()
        }
        fn twin(&mut self) -> Result<Option<&mut dyn CacheUnderTest>, HarnessError> {
            self.0.twin()
        }
    }

    /// A native target that forks but keys no state: the forking path without the memo.
    struct Unkeyed(NativeTarget);

    impl CacheUnderTest for Unkeyed {
        fn info(&self) -> TargetInfo {
            self.0.info()
        }
        fn reset(&mut self, setup: &Setup) -> Result<(), HarnessError> {
            self.0.reset(setup)
        }
        fn apply(&mut self, op: &Op) -> Result<OpOutcome, HarnessError> {
            self.0.apply(op)
        }
        fn observe_seq(
            &mut self,
            seq: SeqId,
            out: &mut crate::base::cache::SeqObservation,
        ) -> Result<(), HarnessError> {
            self.0.observe_seq(seq, out)
        }
        fn next_pos(&mut self, seq: SeqId) -> Result<i32, HarnessError> {
            self.0.next_pos(seq)
        }
        fn whole_cells(
            &mut self,
            whole: &[u8],
        ) -> Result<Option<Vec<crate::base::state::WholeCell>>, HarnessError> {
            self.0.whole_cells(whole)
        }
        fn seq_state(&mut self, seq: SeqId) -> Result<Vec<u8>, HarnessError> {
            self.0.seq_state(seq)
        }
        fn set_seq_state(&mut self, seq: SeqId, bytes: &[u8]) -> Result<OpOutcome, HarnessError> {
            self.0.set_seq_state(seq, bytes)
        }
        fn state_get(&mut self) -> Result<Option<Vec<u8>>, HarnessError> {
            self.0.state_get()
        }
        fn state_set(&mut self, bytes: &[u8]) -> Result<OpOutcome, HarnessError> {
            self.0.state_set(bytes)
        }
        fn state_size(
            &mut self,
            dump: crate::base::cache::Dump,
        ) -> Result<Option<crate::base::cache::DumpSize>, HarnessError> {
            self.0.state_size(dump)
        }
        fn allocation(&mut self) -> Result<Option<crate::base::cache::Allocation>, HarnessError> {
            self.0.allocation()
        }
        fn twin(&mut self) -> Result<Option<&mut dyn CacheUnderTest>, HarnessError> {
            self.0.twin()
        }
        fn fork(&self) -> Option<Box<dyn CacheUnderTest + Send>> {
            Some(Box::new(Unkeyed(self.0.clone())))
        }
    }

    #[test]
    fn observations_per_state_key_are_the_observations_and_are_shared() {
        // Every depth-2 trace of the seed domain, with a fault that makes states drift: the
        // memo's observations (each state observed once) are exactly the unkeyed runner's.
        let faults = native_kv::Faults {
            refcount: true,
            ..Default::default()
        };
        let d = crate::base::domain::Domain::preset("seed").unwrap();
        let ops = d.ops();
        let traces: Vec<Trace> = ops
            .iter()
            .flat_map(|a| {
                ops.iter().map(|b| Trace {
                    setup: d.setup.clone(),
                    ops: vec![a.clone(), b.clone()],
                })
            })
            .collect();
        let mut keyed = LocalRunner::new(Box::new(NativeTarget::new(faults)));
        let mut unkeyed = LocalRunner::new(Box::new(Unkeyed(NativeTarget::new(faults))));
        let a = keyed.run_batch_last(&traces).unwrap();
        let b = unkeyed.run_batch_last(&traces).unwrap();
        assert_eq!(a, b);
        // Trials whose first op changed nothing (a `seq_keep` of the one sequence, a `seq_rm`
        // of a range without cells) are back in the setup's state: their last steps are one
        // (state, op) transition, made once and shared (one `Arc`, which judges remember).
        let noop = |t: &Trace| t.ops[0].name() == "seq_keep" || t.ops[0].name() == "seq_rm";
        let shared = (0..traces.len())
            .filter(|&i| noop(&traces[i]))
            .flat_map(|i| (0..traces.len()).map(move |j| (i, j)))
            .filter(|&(i, j)| i < j && traces[i].ops[1] == traces[j].ops[1])
            .filter(|&(i, j)| Arc::ptr_eq(&a[i].steps[0], &a[j].steps[0]))
            .count();
        assert!(shared > 0, "no step was shared between trials");
        let unshared = (0..traces.len())
            .flat_map(|i| (0..traces.len()).map(move |j| (i, j)))
            .filter(|&(i, j)| i < j && Arc::ptr_eq(&b[i].steps[0], &b[j].steps[0]))
            .count();
        assert_eq!(unshared, 0, "the unkeyed runner shares nothing");
    }

    #[test]
    fn forking_and_replay_give_the_same_observations() {
        let faults = native_kv::Faults {
            refcount: true,
            ..Default::default()
        };
        let mut fork = LocalRunner::new(Box::new(NativeTarget::new(faults)));
        let mut replay = LocalRunner::new(Box::new(NoFork(NativeTarget::new(faults))));
        let cp = Op::SeqCp {
            src: 0,
            dst: 1,
            p0: 0,
            p1: 3,
        };
        let traces: Vec<Trace> = [
            vec![cp.clone()],
            vec![cp.clone(), cp.clone()],
            vec![cp.clone(), cp.clone(), Op::SeqKeep { seq: 0 }],
            vec![cp.clone(), Op::SeqKeep { seq: 0 }],
            vec![Op::Clear, cp.clone(), cp.clone(), Op::SeqKeep { seq: 0 }],
        ]
        .into_iter()
        .map(|ops| Trace {
            setup: seed_setup(),
            ops,
        })
        .collect();
        assert_eq!(
            fork.run_batch(&traces).unwrap(),
            replay.run_batch(&traces).unwrap()
        );
        let last = fork.run(&traces[2]).unwrap();
        let seq1 = &last.steps[2].seqs[1];
        assert_eq!((seq1.pos_min, seq1.pos_max, seq1.cells.len()), (0, 2, 0));
    }

    /// A run handed back (`recycle`, as a worker does with a trial judged where it was
    /// observed) lends its observation's buffers to the next trial, which observes what a
    /// fresh runner observes: nothing of the recycled one is left in it (its sequences had
    /// other cells, and the next trial's are fewer, more or none).
    #[test]
    fn a_recycled_observation_leaves_nothing_in_the_next() {
        let mut fresh = LocalRunner::new(Box::new(NoFork(NativeTarget::new(Default::default()))));
        let mut recycling =
            LocalRunner::new(Box::new(NoFork(NativeTarget::new(Default::default()))));
        let cp = Op::SeqCp {
            src: 0,
            dst: 1,
            p0: 0,
            p1: 5,
        };
        let traces: Vec<Trace> = [
            vec![cp.clone()],
            vec![Op::Clear],
            vec![
                cp.clone(),
                Op::SeqRm {
                    seq: 0,
                    p0: 2,
                    p1: 4,
                },
            ],
            vec![Op::SeqKeep { seq: 1 }],
            vec![cp, Op::SeqKeep { seq: 0 }],
        ]
        .into_iter()
        .map(|ops| Trace {
            setup: seed_setup(),
            ops,
        })
        .collect();
        for t in &traces {
            let expected = fresh.run_last(t).unwrap();
            let got = recycling.run_last(t).unwrap();
            assert_eq!(got, expected, "{t:?}");
            recycling.recycle(got);
            assert!(recycling.spare_obs.is_some(), "the observation is lent on");
        }
    }
}
