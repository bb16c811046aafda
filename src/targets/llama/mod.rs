//! The llama.cpp target: which versions kvaudit audits, how it builds them, and how it calls them.
//!
//! - [`pins`]: the pins recorded in `targets/llama.cpp/pins.toml` and the labels that name them
//!   (`llama.cpp@0.1.156`, `llama.cpp@0.1.156+assert`, `llama.cpp@src:PATH` for a tree).
//! - [`shim`]: the C shim as both the build and the loader know it (its sources, ABI number, and
//!   what a finished build is); below both, so neither imports the other.
//! - [`build`]: fetches a pin's sources through cargo (the crates.io crate `llama-cpp-sys-2`
//!   vendors llama.cpp), compiles them without cmake together with the C shim
//!   `targets/llama.cpp/kvaudit_shim.c` into one `libkvaudit_shim.so` per pin and variant, and
//!   caches the result outside the repository, verified before each use.
//! - [`ffi`]: the only place kvaudit calls into llama.cpp: loads a built shim with `libloading`,
//!   checks its ABI number, and offers a safe handle API ([`ffi::LlamaShim`],
//!   [`ffi::LlamaContext`]).
//! - [`target`]: [`target::LlamaTarget`], the `CacheUnderTest` over one context.
//! - [`tree`]: what a llama.cpp source tree says about itself (its root, versions, state
//!   format), for `llama.cpp@src:PATH`.
//! - [`worker`]: crash isolation, a fork server in a child process and its line protocol.
//! - [`sys`]: every libc call (file locks, fork, signals, waitpid, mallopt) behind a safe
//!   function.
//! - [`error`]: [`error::LlamaError`] and its parts, the one error style of this module.
//!
//! Invariants: nothing outside [`ffi`] calls foreign code, and the compiler's memory-safety
//! checks are waived in [`ffi`] and [`sys`] only (a test in `sys` scans `src/` for it); the shim never aborts by itself, but llama.cpp does (GGML_ASSERT,
//! and `assert` in `+assert` builds), so callers that must survive that run the context in a
//! child process with `GGML_NO_BACKTRACE=1` set.

pub mod build;
pub mod error;
pub mod ffi;
pub mod pins;
pub mod shim;
pub mod sys;
pub mod target;
pub mod tree;
pub mod worker;
