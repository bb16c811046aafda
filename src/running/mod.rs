//! Layer 4, running: trial runners (traces in, observations out) and the judge that runs traces
//! and asks the oracles about every step.
//!
//! Nothing here names a target type: targets come in as [`runner::TrialRunner`]s, or, for a
//! state-space search, as [`states::KeyedTarget`]s.

pub mod judge;
pub mod runner;
pub mod states;
