//! kvaudit: finds bugs in the KV caches of LLM inference engines by exhaustive, property-based
//! and differential testing of their sequence-operation algebra.
//!
//! The crate is layered; each layer imports only from the layers above it in this list (checked
//! by `tests/it/tidy.rs`, see ARCHITECTURE.md):
//!
//! 0. [`base`]: the op algebra, domains, the [`CacheUnderTest`] trait, observations, the state
//!    parser, exit codes.
//! 1. [`model`]: the reference llama model (GGUF, tiny models, RoPE, forward pass).
//! 2. [`oracles`]: the oracle registry (I1, I2, differential, crash) and the theorems T1-T3.
//! 3. [`records`]: reports, findings, tallies, predictions: plain data.
//! 4. [`running`]: trial runners and the judge.
//! 5. [`isolation`]: targets in worker processes of their own; the JSON-lines worker protocol.
//! 6. [`targets`]: the native caches and llama.cpp, and the registry of target names.
//! 7. [`engines`]: the exhaustive explorer, the fuzzer, the shrinker, measurements.
//! 8. [`outputs`]: repro files and their replay, C reproducers.
//!
//! The command line is not part of the library: it lives in the `kvaudit` binary.
#![warn(missing_docs)]

pub mod base;
pub mod engines;
pub mod isolation;
pub mod model;
pub mod oracles;
pub mod outputs;
pub mod records;
pub mod running;
pub mod targets;

pub use base::cache::{CacheUnderTest, HarnessError, OpOutcome, StepObservation, TargetInfo};
pub use base::domain::Domain;
pub use base::op::{Decode, Op, Pos, SeqId, Setup, Trace};
pub use engines::explore::{run_exhaustive, ExhaustiveConfig};
pub use oracles::{OracleId, Violation};
pub use records::report::{Finding, Report};
pub use running::judge::{Judge, RunJudgement};
pub use targets::registry::TargetSpec;
