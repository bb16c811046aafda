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

pub mod forward;
pub mod gguf;
pub mod rope;
pub mod tiny;
