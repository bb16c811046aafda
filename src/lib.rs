//! kvaudit: finds bugs in the KV caches of LLM inference engines by exhaustive, property-based
//! and differential testing of their sequence-operation algebra.
//!
//! See ARCHITECTURE.md for the map. In short: [`op`] is the language of traces, [`domain`] turns
//! a finite argument domain into ops, [`target`] is the [`target::CacheUnderTest`] trait that
//! every cache implements, [`state`] reads a cache's own serialized state, [`oracle`] judges
//! observations, [`runner`] runs traces, [`explore`] enumerates them, and [`report`] says what
//! was found.
#![warn(missing_docs)]

pub mod cli;
pub mod domain;
pub mod exit;
pub mod explore;
pub mod fuzz;
pub mod judge;
pub mod llama;
pub mod measure;
pub mod model;
pub mod native;
pub mod native_tensor;
pub mod op;
pub mod oracle;
pub mod prereg;
pub mod registry;
pub mod report;
pub mod repro;
pub mod repro_c;
pub mod runner;
pub mod shrink;
pub mod state;
pub mod target;
pub mod theorems;
