//! Layer 4, running: the layer that drives targets. Trial runners (traces in, observations
//! out), the observation procedures ([`observe`]: accessors, dumps, the twin round trip) and the
//! probes after a trial ([`probe`]), and the judge that runs traces and asks the oracles about
//! every step.
//!
//! Nothing here names a target type: targets come in as [`runner::TrialRunner`]s, or, for a
//! state-space search, as [`state_runner::KeyedTarget`]s.

pub mod batch;
pub mod judge;
pub mod observe;
pub mod probe;
pub mod runner;
pub mod state_runner;
pub mod trial;
