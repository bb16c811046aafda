//! Layer 3, records: what a run found, as plain data: reports, findings, counts, predictions.
//!
//! Records import the base and the oracles only: they never run anything.

pub mod code;
pub mod decision;
pub mod finding;
pub mod fuzz;
pub mod group;
pub mod hunt;
pub mod incomplete;
pub mod prereg;
pub mod report;
pub mod state_space;
pub mod tally;
pub mod text;
