//! **Crash**: the target aborted, was killed by a signal or hung while running an op. Runners
//! report how a trial ended; a crash of the target is a finding of this oracle, never an error
//! of the harness (llama.cpp runs in a worker process, so its abort does not end the audit).

use serde_json::json;

use super::{Oracle, OracleId, PositiveControl, Reads, Seen, Violation};

/// The oracle.
pub struct Crash;

/// The class of a crash message, for telling crash findings apart: its first line, at most 80
/// characters.
pub fn crash_kind(message: &str) -> String {
    let first = message.lines().next().unwrap_or("crash");
    first.chars().take(80).collect()
}

/// The violation of a trial that crashed with `message`.
pub fn crash_violation(message: &str) -> Violation {
    Violation {
        oracle: OracleId::CRASH,
        kind: crash_kind(message),
        seq: None,
        observed: json!({ "crash": message }),
        expected: json!("the op returns"),
    }
}

impl Oracle for Crash {
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
        &["the first line of the crash message*"]
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
        ]
    }

    fn holds(&self, seen: &Seen<'_>) -> bool {
        !matches!(seen, Seen::Crash { .. })
    }

    fn check(&self, seen: &Seen<'_>) -> Option<Violation> {
        match seen {
            Seen::Crash { message, .. } => Some(crash_violation(message)),
            _ => None,
        }
    }
}
