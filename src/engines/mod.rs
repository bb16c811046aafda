//! Layer 7, engines: what decides which traces run and what to make of them: the [`audit`] as a
//! job, the exhaustive [`explore`]r, the state-space search ([`state_space`]), the random [`fuzz`]er, the [`shrink`]er, the theorem checker
//! ([`theorem_check`]), the [`hunt`] for a build's bugs, the evidence of root causes ([`root_cause`]) and the llama.cpp [`measure`]ments of T1-T3.

pub mod audit;
pub mod explore;
pub mod fuzz;
pub mod hunt;
pub mod measure;
pub mod root_cause;
pub mod shrink;
pub mod state_space;
pub mod theorem_check;
