//! A reference llama model in plain f32 Rust: the numerical oracle for KV-cache audits.
//!
//! The audit needs an answer that does not come from the engine under test: what the logits of a
//! sequence are when nothing was cached, evicted or re-positioned. This module provides it, for the
//! `llama` architecture as llama.cpp runs it:
//!
//! - [`gguf`]: a GGUF v3 reader and writer (F32 tensors; F16/BF16 read as a bonus).
//! - [`tiny`]: a deterministic tiny llama model that llama.cpp loads without any download, and a
//!   cache-directory path to it.
//! - [`rope`]: RoPE computed the way ggml-cpu computes it (`LLAMA_ROPE_TYPE_NORM`).
//! - [`forward`]: the forward pass over a caller-owned [`forward::KvStore`], and a cacheless
//!   reference ([`forward::Model::forward_sequence`]) that recomputes everything from scratch.
//!
//! Architecture invariant: nothing here calls into llama.cpp; the reference is independent of the
//! targets it judges.

use std::path::PathBuf;

use thiserror::Error;

pub mod forward;
pub mod gguf;
pub mod kv_store;
pub mod rope;
pub mod tiny;

/// Why a model could not be read, generated or cached.
///
/// Exit codes depend on where the model came from, so callers choose them: a model file the user
/// named (`--model`) that does not load ([`ModelError::Gguf`], [`ModelError::Invalid`],
/// [`ModelError::Load`]) is bad input, exit 2 (`USAGE`); the generated tiny model failing
/// ([`ModelError::Spec`]) or not being cached ([`ModelError::Write`]), or a model a harness
/// loads by itself not loading, is the harness breaking, exit 3 (`HARNESS`).
#[derive(Debug, Error)]
pub enum ModelError {
    /// The GGUF file does not read or parse.
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    /// A GGUF file, but not a llama model this reference runs (architecture, shapes, tensors).
    #[error("{0}")]
    Invalid(String),
    /// Loading the model at `path` failed.
    #[error("loading model {}: {source}", path.display())]
    Load {
        /// The file.
        path: PathBuf,
        /// Why.
        source: Box<ModelError>,
    },
    /// A tiny model spec whose shape llama.cpp or the forward pass cannot run.
    #[error("{0}")]
    Spec(String),
    /// The generated model could not be written.
    #[error("writing {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}
