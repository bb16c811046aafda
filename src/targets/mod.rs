//! Layer 6, targets: the caches under audit ([`native`], [`native_tensor`], [`llama`], the Python
//! workers of [`python`] and [`mlx`]), how those that write llama.cpp's state layout are observed
//! ([`dump_cells`]), and the
//! [`registry`] that turns a target's name into runners.
//!
//! Only [`llama::ffi`] calls foreign code.

pub mod dump_cells;
pub mod llama;
pub mod mlx;
pub mod native;
pub mod native_tensor;
pub mod python;
pub mod registry;
