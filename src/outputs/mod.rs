//! Layer 8, outputs: what kvaudit hands its users: repro files and their replay, standalone
//! reproducers (C over llama.h, Python over mlx-lm), pictures of findings and bug reports for an engine's tracker.

pub mod bug_report;
pub mod c_repro;
pub mod corpus;
pub mod coverage;
pub mod decisions;
pub mod explain;
pub mod fixes;
pub mod hunt;
pub mod llama_h;
pub mod mlx_bug_report;
pub mod py_repro;
pub mod repro;
pub mod reproducer;
pub mod versions;
pub mod xml;
