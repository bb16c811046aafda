//! Layer 0, the base: the op algebra, argument domains, the [`cache::CacheUnderTest`] trait and
//! its observations, the one parser of serialized state, and exit codes.
//!
//! Nothing here imports from any other layer of kvaudit.

pub mod cache;
pub mod capabilities;
pub mod config;
pub mod domain;
pub mod error;
pub mod exit;
pub mod files;
pub mod op;
pub mod op_kind;
pub mod setting;
pub mod slots;
pub mod state;
pub mod tokens;
pub mod word_hash;
