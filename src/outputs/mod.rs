//! Layer 8, outputs: what kvaudit hands its users: repro files and their replay, standalone
//! C reproducers, pictures of findings and bug reports for an engine's tracker.

pub mod bug_report;
pub mod c_repro;
pub mod corpus;
pub mod coverage;
pub mod explain;
pub mod hunt;
pub mod repro;
pub mod versions;
pub mod xml;
