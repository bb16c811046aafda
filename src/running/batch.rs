//! What a batch is handed to a [`TrialRunner`](crate::running::runner::TrialRunner) as:
//! made ready ([`PreparedBatch`]), then handed over ([`StartedBatch`]), and what may travel
//! with it: the step oracles the runner may judge with where it observes ([`BatchJudging`])
//! and the batch named by its place in an exhaustive enumeration ([`Enumerated`]).

use crate::base::op::{Op, Trace};
use crate::oracles::OracleId;

/// A batch made ready by
/// [`TrialRunner::prepare_batch_last`](crate::running::runner::TrialRunner::prepare_batch_last),
/// not handed over yet.
#[must_use = "start the batch with TrialRunner::start_batch_last"]
pub struct PreparedBatch {
    /// The traces, in order.
    pub traces: Vec<Trace>,
    /// What the runner will send its target, built ahead (a worker's request line).
    pub(crate) request: Option<Vec<u8>>,
    /// What the runner judges where it observes the trials ([`BatchJudging`]).
    pub(crate) judge: BatchJudging,
    /// Whether a trace of the batch may corrupt its target's memory (a worker then runs it in
    /// a child of its own), where that is known for the whole batch at once: an enumerated
    /// batch's traces are made of its ops and setup only.
    pub(crate) may_corrupt: Option<bool>,
}

/// Step oracles a runner may judge a batch's trials with where it observes them (a worker
/// process), and per trace which of them its earlier steps already violated: a trial whose
/// last step violates none of them afresh is answered with its verdicts
/// ([`TrialRun::judged`](crate::running::trial::TrialRun::judged)) instead of its step, which
/// then never crosses the pipe. Empty `oracles`: every run keeps its steps.
#[derive(Clone, Debug, Default)]
pub struct BatchJudging {
    /// Built-in step oracles, by id: bit k of the verdicts is the k-th.
    pub oracles: Vec<OracleId>,
    /// Per trace of the batch (in order; empty: none known), the oracles violated at an
    /// earlier step of it, as bits.
    pub prior: Vec<u64>,
}

impl BatchJudging {
    /// The part of this for traces `range` of the batch.
    pub fn slice(&self, range: std::ops::Range<usize>) -> BatchJudging {
        BatchJudging {
            oracles: self.oracles.clone(),
            prior: self
                .prior
                .get(range)
                .map(<[u64]>::to_vec)
                .unwrap_or_default(),
        }
    }

    /// The part of this for traces `picked` of the batch, in that order.
    pub fn pick(&self, picked: &[usize]) -> BatchJudging {
        BatchJudging {
            oracles: self.oracles.clone(),
            prior: match self.prior.is_empty() {
                true => Vec::new(),
                false => picked.iter().map(|&i| self.prior[i]).collect(),
            },
        }
    }
}

/// A batch's traces named by where they stand in an exhaustive enumeration (the explorer's
/// odometer): trials `from..from + len` of those with `depth` ops over `ops`, numbered in
/// lexicographic order (the first op the most significant digit), all of one setup. The batch's
/// traces are exactly these, in this order: a runner whose target is in another process sends
/// this instead of the traces themselves (a few numbers instead of an op list per trial), and
/// the other side makes the same traces from it.
#[derive(Clone, Copy, Debug)]
pub struct Enumerated<'a> {
    /// The domain's ops, in the enumeration's order.
    pub ops: &'a [Op],
    /// Ops per trace.
    pub depth: u32,
    /// The first trace's number among the traces of `depth` ops.
    pub from: u64,
}

/// Trial `number` among the traces of `depth` ops over `n` ops, as op indices into `digits`
/// (cleared first): the `depth` digits of `number` in base `n`, most significant first. What
/// [`Enumerated`] names, on either side of a worker's wire.
pub fn enumerated_indices(n: u64, depth: u32, number: u64, digits: &mut Vec<usize>) {
    digits.clear();
    digits.resize(depth as usize, 0);
    let mut rest = number;
    for d in digits.iter_mut().rev() {
        *d = (rest % n) as usize;
        rest /= n;
    }
}

/// A batch handed to a runner by
/// [`TrialRunner::start_batch_last`](crate::running::runner::TrialRunner::start_batch_last),
/// not finished yet.
#[must_use = "finish the batch with TrialRunner::finish_batch_last"]
pub struct StartedBatch {
    /// The traces, in order.
    pub traces: Vec<Trace>,
    /// Whether the runner has already sent them to its target (a worker process).
    pub(crate) sent: bool,
    /// What is judged where the trials are observed ([`BatchJudging`]).
    pub(crate) judge: BatchJudging,
}
