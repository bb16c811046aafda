//! `kvaudit hunt`: one command that goes looking for the bugs of a build. [`plan`] makes the
//! plan from what the target can run (memory types, presets and the caches users run into,
//! configurations, oracles of the registry, pairings); [`run`] spends the budget over it
//! (exhaustive to the depth each entry's share allows, then fuzzing), shrinks every new
//! violation and groups the hunt's findings by root cause. Classifying the groups against the
//! corpus and writing the new ones' files is `outputs::hunt`'s. [`again`] shrinks a summary's
//! representatives again: a local minimum comes back unchanged. [`budget`] is the budget's
//! policy: every share, cut and shrink limit.

pub mod again;
pub mod budget;
pub mod plan;
pub mod run;

pub use budget::allocate;
pub use plan::{plan, probe};
pub use run::{
    merge_shards, probe_or_refusal, regroup, run_hunt, shard_entries, HuntConfig, HuntEvent,
};
