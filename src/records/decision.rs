//! What people decided a class of findings is, as plain data: the word of a decision
//! ([`DecisionKind`]: a real defect, a contract question, by design, a guard, kvaudit's artifact,
//! a tolerance) and what a hunt's group records of the decision that covers it
//! ([`DecisionNote`]). The decisions themselves live in the corpus (`outputs::repro::decision`);
//! a hunt's summary names them so that it can say what is broken before what was run.

use serde::{Deserialize, Serialize};

/// What a class of findings was decided to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// A defect of the engine: a fix belongs upstream.
    Real,
    /// A contract question: the engine's documentation (llama.h) does not say, and the
    /// behaviour is one reading of it.
    Question,
    /// By design: the engine does it on purpose, documented or evident from its source.
    Design,
    /// A guard: the engine refuses on purpose (often by an assert) an input it does not
    /// support; also a corpus file that holds and pins behaviour decided correct
    /// (notes/issue45/root-causes.md's `G1`).
    Guard,
    /// kvaudit's own artifact: a harness or oracle mistake, not the engine's.
    Artifact,
    /// A tolerance: a difference within the rounding the engine's arithmetic allows.
    Tolerance,
}

impl DecisionKind {
    /// Every word, in the order a summary and the decision tables list them: defects first.
    pub const ALL: [DecisionKind; 6] = [
        DecisionKind::Real,
        DecisionKind::Question,
        DecisionKind::Design,
        DecisionKind::Guard,
        DecisionKind::Artifact,
        DecisionKind::Tolerance,
    ];

    /// The word as files write it: `real`, `question`, `design`, `guard`, `artifact`,
    /// `tolerance`.
    pub fn word(self) -> &'static str {
        match self {
            DecisionKind::Real => "real",
            DecisionKind::Question => "question",
            DecisionKind::Design => "design",
            DecisionKind::Guard => "guard",
            DecisionKind::Artifact => "artifact",
            DecisionKind::Tolerance => "tolerance",
        }
    }

    /// A heading for the decisions of this word.
    pub fn heading(self) -> &'static str {
        match self {
            DecisionKind::Real => "Real defects",
            DecisionKind::Question => "Contract questions",
            DecisionKind::Design => "By design",
            DecisionKind::Guard => "Guards",
            DecisionKind::Artifact => "kvaudit's artifacts",
            DecisionKind::Tolerance => "Tolerances",
        }
    }
}

/// The decision that covers a hunt's group, as its summary prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionNote {
    /// The root cause's id (`R3`, `Q1`, `D2`: notes/issue45/root-causes.md's numbering).
    pub root_cause: String,
    /// What it was decided to be.
    pub decision: DecisionKind,
    /// The root cause in one line.
    pub summary: String,
    /// The fix under `corpora/fixes/` that makes its files hold, if one exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// Orders root-cause ids as people count them: the letters, then the number, then the rest
/// (`R2` before `R10`, `R6a` after `R6`).
pub fn root_cause_order(id: &str) -> (String, u64, String) {
    let letters: String = id.chars().take_while(|c| c.is_ascii_alphabetic()).collect();
    let rest = &id[letters.len()..];
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    let number = digits.parse().unwrap_or(u64::MAX);
    (letters, number, rest[digits.len()..].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_causes_sort_by_their_number() {
        let mut ids = vec!["R10", "Q1", "R6a", "R2", "R6", "D1"];
        ids.sort_by_key(|id| root_cause_order(id));
        assert_eq!(ids, ["D1", "Q1", "R2", "R6", "R6a", "R10"]);
    }

    #[test]
    fn every_word_parses_back() {
        for k in DecisionKind::ALL {
            let json = format!("\"{}\"", k.word());
            assert_eq!(serde_json::from_str::<DecisionKind>(&json).unwrap(), k);
        }
        assert!(serde_json::from_str::<DecisionKind>("\"maybe\"").is_err());
    }
}
