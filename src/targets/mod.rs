//! Layer 5, targets: the caches under audit ([`native`], [`native_tensor`], [`llama`]) and the
//! [`registry`] that turns a target's name into runners.
//!
//! Only [`llama::ffi`] calls foreign code.

pub mod llama;
pub mod native;
pub mod native_tensor;
pub mod registry;
