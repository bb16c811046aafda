//! Layer 6, engines: what decides which traces run and what to make of them: the exhaustive
//! [`explore`]r, the state-space search ([`states`]), the random [`fuzz`]er, the [`shrink`]er, the theorem checker
//! ([`theorem_check`]), root-cause [`group`]ing and the llama.cpp [`measure`]ments of T1-T3.

pub mod explore;
pub mod fuzz;
pub mod group;
pub mod hunt;
pub mod measure;
pub mod shrink;
pub mod states;
pub mod theorem_check;
