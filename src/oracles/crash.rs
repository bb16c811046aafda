//! **Crash**: the target aborted, was killed by a signal or hung while running an op. Runners
//! report how a trial ended; a crash of the target is a finding of this oracle, never an error
//! of the harness (llama.cpp runs in a worker process, so its abort does not end the audit).
//!
//! A crash while *observing* an op that returned (the whole dump, the per-sequence dumps, the
//! twin round trip, the probe) is a class of its own, `observation crash (WHAT): ...`: the op is
//! not blamed, and the worker runs the trial again without that observation, so that the oracles
//! that do not read it still judge the trial ([`crate::running::runner::ObservationCrash`]).

use serde_json::json;

use super::{Oracle, OracleId, PositiveControl, Reads, Seen, Violation};
use crate::base::cache::Observation;

/// The oracle.
pub struct Crash;

/// What glibc's allocator prints when it finds its heap corrupted and aborts. Which of them a
/// given corruption trips depends on the heap's layout (another build of the same sources, a
/// longer string elsewhere), so they are one class.
const GLIBC_HEAP_ABORTS: [&str; 7] = [
    "double free or corruption",
    "free(): ",
    "malloc(): ",
    "realloc(): ",
    "corrupted size vs. prev_size",
    "corrupted double-linked list",
    "munmap_chunk(): invalid pointer",
];

/// The class of heap-corruption aborts ([`crash_kind`]).
pub const HEAP_CORRUPTION: &str = "SIGABRT: heap corruption (glibc's allocator aborted)";

/// The class of a crash message, for telling crash findings apart: its first line, at most 80
/// characters; every abort of glibc's allocator on a corrupted heap is one class,
/// [`HEAP_CORRUPTION`] (the exact message stays in the violation's `observed`).
pub fn crash_kind(message: &str) -> String {
    let first = message.lines().next().unwrap_or("crash");
    if let Some(rest) = first.strip_prefix("SIGABRT: ") {
        if GLIBC_HEAP_ABORTS.iter().any(|m| rest.starts_with(m)) {
            return HEAP_CORRUPTION.to_string();
        }
    }
    first.chars().take(80).collect()
}

/// How the kind of an observation crash starts.
pub const OBSERVATION_CRASH: &str = "observation crash";

/// The violation of a trial that crashed with `message`, while running its op, or while making
/// `observation` of what the op did.
pub fn crash_violation(message: &str, observation: Option<Observation>) -> Violation {
    match observation {
        None => Violation {
            oracle: OracleId::CRASH,
            kind: crash_kind(message),
            seq: None,
            observed: json!({ "crash": message }),
            expected: json!("the op returns"),
        },
        Some(what) => Violation {
            oracle: OracleId::CRASH,
            kind: format!(
                "{OBSERVATION_CRASH} ({}): {}",
                what.describe(),
                crash_kind(message)
            ),
            seq: None,
            observed: json!({ "crash": message, "observation": what.name() }),
            expected: json!("the op returns and is observed"),
        },
    }
}

impl Oracle for Crash {
    fn check_in_words(&self) -> &'static str {
        "the call returns"
    }

    fn c_check(&self) -> Option<super::c_check::CCheck> {
        Some(super::c_check::CRASH)
    }

    fn id(&self) -> OracleId {
        OracleId::CRASH
    }

    fn summary(&self) -> &'static str {
        "every op returns: no abort, no fatal signal, no hang"
    }

    fn reads(&self) -> Reads {
        Reads::Crash
    }

    fn kinds(&self) -> &'static [&'static str] {
        &[
            "the first line of the crash message*",
            "observation crash (what was observed): the first line of the crash message*",
        ]
    }

    fn positive_controls(&self) -> &'static [PositiveControl] {
        &[
            PositiveControl {
                fault: "+assert: llama.cpp's asserts compiled in",
                target: "llama.cpp@0.1.156+assert",
                seed_depth: Some(2),
                evidence: "llama/assert_build_repeated_seq_cp_0.1.156.json",
            },
            PositiveControl {
                fault: "a zero hang timeout",
                target: "llama.cpp@0.1.161",
                seed_depth: None,
                evidence: "llama/hang_0.1.161.json",
            },
            PositiveControl {
                fault: "a worker hook: every whole dump dies of SIGSEGV (KVAUDIT_TEST_CRASH_OBSERVING=whole)",
                target: "llama.cpp@0.1.161",
                seed_depth: None,
                evidence: "llama/observation_crash_whole_0.1.161.json",
            },
        ]
    }

    fn holds(&self, seen: &Seen<'_>) -> bool {
        !matches!(seen, Seen::Crash { .. })
    }

    fn observed_is_evidence(&self) -> bool {
        // The message of a heap-corruption abort varies with the heap's layout: its class (the
        // kind) and the step are what a replay compares.
        false
    }

    fn check(&self, seen: &Seen<'_>) -> Option<Violation> {
        match seen {
            Seen::Crash {
                message,
                observation,
                ..
            } => Some(crash_violation(message, *observation)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_corruption_aborts_are_one_class_and_other_crashes_keep_their_line() {
        for m in [
            "SIGABRT: double free or corruption (out)",
            "SIGABRT: free(): invalid next size (fast)",
            "SIGABRT: malloc(): corrupted top size",
        ] {
            assert_eq!(crash_kind(m), HEAP_CORRUPTION, "{m}");
        }
        let assert_line = "GGML_ASSERT(x) failed at llama-kv-cache.cpp:300";
        assert_eq!(crash_kind(assert_line), assert_line);
        assert_eq!(crash_kind("SIGSEGV"), "SIGSEGV");
    }
}
