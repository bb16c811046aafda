//! What a state-space search (`audit --strategy states`, `engines::state_space`) covered: a report's
//! optional `state_space` section.

use serde::{Deserialize, Serialize};

/// What a state-space search covered (`engines::state_space`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateSpace {
    /// Distinct states reached, the setup's included.
    pub states: u64,
    /// Transitions judged: every op from every state expanded.
    pub transitions: u64,
    /// The deepest level expanded (the length of the longest shortest path judged).
    pub depth: u32,
    /// Whether the space closed: the transitions from level `depth` led to no new state, so every
    /// reachable state was judged, at every depth.
    pub closed: bool,
}
