//! Layer 7, outputs: what kvaudit hands its users: repro files and their replay, and standalone
//! C reproducers.

pub mod c_repro;
pub mod repro;
