//! The llama.cpp target: which versions can be audited, how they are built, and how they are
//! called, in llama.h's own vocabulary (calls with sequence ids and positions, settings as
//! (key, value) pairs of `llama_context_params`, state as raw bytes). It depends on nothing of
//! kvaudit; kvaudit adapts it to its `CacheUnderTest` (`src/targets/llama/`).
//!
//! - [`pins`]: the pins recorded in `pins.toml` and the labels that name them
//!   (`llama.cpp@0.1.156`, `llama.cpp@0.1.156+assert`, `llama.cpp@src:PATH` for a tree).
//! - [`fixes`]: patches to a pin's sources (`corpora/fixes/`, built in), applied exactly by a
//!   build whose label names them (`llama.cpp@0.1.161+fix:NAME`).
//! - [`shim`]: the C shim as both the build and the loader know it (its sources under `shim/`,
//!   its ABI number, and what a finished build is); below both, so neither imports the other.
//! - [`build`]: fetches a pin's sources through cargo (the crates.io crate `llama-cpp-sys-2`
//!   vendors llama.cpp), compiles them without cmake together with the C shim
//!   `shim/kvaudit_shim.c` into one `libkvaudit_shim.so` per pin and variant, and caches the
//!   result outside the repository, verified before each use.
//! - [`ffi`]: the only place that calls into llama.cpp: loads a built shim with `libloading`,
//!   checks its ABI number, and offers a safe handle API ([`ffi::LlamaShim`],
//!   [`ffi::LlamaContext`]).
//! - [`tree`]: what a llama.cpp source tree says about itself (its root, versions, state
//!   format), for `llama.cpp@src:PATH`.
//! - [`sys`]: every libc call (file locks, fork, signals, waitpid, mallopt) behind a safe
//!   function, for the build cache and for kvaudit's crash-isolating worker.
//! - [`files`]: atomic writes and sha256, the one copy of each.
//! - [`startup`]: `KVAUDIT_TRACE_STARTUP`, a timeline of a run's start across its processes.
//! - [`error`]: [`error::LlamaError`] and its parts, the one error style of this crate.
//!
//! Invariants: nothing outside [`ffi`] calls foreign code, and the compiler's memory-safety
//! checks are waived in [`ffi`] and [`sys`] only (kvaudit's `tidy::unsafe_code` reads this
//! crate too); the shim never aborts by itself, but llama.cpp does (GGML_ASSERT, and `assert` in
//! `+assert` builds), so callers that must survive that run the context in a child process with
//! `GGML_NO_BACKTRACE=1` set.

pub mod build;
pub mod error;
pub mod ffi;
pub mod files;
pub mod fixes;
pub mod pins;
pub mod shim;
pub mod startup;
pub mod sys;
pub mod tree;
