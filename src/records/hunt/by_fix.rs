//! A hunt group's evidence by fix (`outputs::hunt::by_fix` fills it): the remedies replayed on
//! its trace, the ones that made it hold, and what could not be told; and the hunt's account of
//! those replays.

use serde::{Deserialize, Serialize};

/// One remedy that makes a group's trace hold: the trace fails on the hunt's target and holds
/// on the target with the remedy applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixEvidence {
    /// The remedy: `fix seq-keep-all-streams` (a patch of `corpora/fixes/`), `fault refcount
    /// removed` (an injected fault taken out).
    pub remedy: String,
    /// The root cause the remedy is for (`R8`), when it names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_cause: Option<String>,
    /// The target the trace was replayed on (`llama.cpp@0.1.161+fix:seq-keep-all-streams`,
    /// `native[keep_noop]`).
    pub replayed_on: String,
    /// The step at which the group's oracle fails first on the hunt's target, replayed.
    pub fails_at: usize,
    /// The corpus files of the remedy's root cause that the corpus used holds; none: the root
    /// cause is not the corpus's, and the group is new.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
}

impl FixEvidence {
    /// `R8 by fix seq-keep-all-streams: replayed on llama.cpp@0.1.161+fix:seq-keep-all-streams,
    /// fails at step 3 -> holds` for a root cause the corpus holds, `by fix NAME (R8): ...`
    /// for one it lacks (free text inside: escape it for where it goes).
    pub fn describe(&self) -> String {
        let by = match (&self.root_cause, self.files.is_empty()) {
            (Some(r), false) => format!("{r} by {}", self.remedy),
            (Some(r), true) => format!("by {} ({r})", self.remedy),
            (None, _) => format!("by {}", self.remedy),
        };
        format!(
            "{by}: replayed on {}, fails at step {} -> holds",
            self.replayed_on, self.fails_at
        )
    }
}

/// What replaying a group with each remedy found (identity by fix, `outputs::hunt::by_fix`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByFix {
    /// Every remedy whose replay holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub explained: Vec<FixEvidence>,
    /// The remedies replayed on it.
    pub replayed: usize,
    /// Why it was not replayed with every remedy, each a sentence: `cannot tell by fix: ...`,
    /// `cut short at the hunt's deadline after 3 of 18 remedies`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_told: Vec<String>,
    /// Other groups merged into this one, explained by the same remedies (one root cause).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub merged: usize,
    /// For a group a corpus file or a decision matched by class: why that match is not its
    /// root cause (the root cause's own fix leaves its trace failing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contradicts: Option<String>,
}

impl ByFix {
    /// What follows the group's class in the summary: ` R8 by fix NAME: replayed on ..., fails
    /// at step 3 -> holds` for a known one, ` (made to hold by ...; no corpus file of its root
    /// cause)` or ` (no remedy makes it hold: 18 replayed)` for a new one, with what was not
    /// told (free text inside: escape it for where it goes).
    pub fn describe(&self) -> String {
        let known: Vec<String> = self
            .explained
            .iter()
            .filter(|e| !e.files.is_empty())
            .map(FixEvidence::describe)
            .collect();
        let unknown: Vec<String> = self
            .explained
            .iter()
            .filter(|e| e.files.is_empty())
            .map(FixEvidence::describe)
            .collect();
        let mut s = String::new();
        if !known.is_empty() {
            s.push_str(&format!(" {}", known.join("; and ")));
        }
        let mut notes: Vec<String> = self.contradicts.iter().cloned().collect();
        if !unknown.is_empty() {
            notes.push(format!(
                "made to hold {}; no corpus file of its root cause",
                unknown.join("; and ")
            ));
        }
        if self.explained.is_empty() && self.replayed > 0 {
            notes.push(format!(
                "no remedy makes it hold: {} replayed",
                self.replayed
            ));
        }
        notes.extend(self.not_told.iter().cloned());
        if self.merged > 0 {
            notes.push(format!(
                "{} more group(s) merged into it by the same remedies",
                self.merged
            ));
        }
        if !notes.is_empty() {
            s.push_str(&format!(" ({})", notes.join("; ")));
        }
        s
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The hunt's identity-by-fix pass as a whole: what it could replay and what it could not.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixReplays {
    /// The remedies it had for the target, each `fix NAME` or `fault NAME removed`.
    pub remedies: Vec<String>,
    /// Groups no corpus file matched, replayed with them.
    pub groups: usize,
    /// Trace replays run (on the target itself and with each remedy).
    pub replays: usize,
    /// Why other remedies could not be tried here, each a sentence (a fix not built, a source
    /// tree), free text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<String>,
    /// Stopped at the hunt's deadline before every group was replayed with every remedy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut_short: bool,
    /// Groups a corpus file or decision matched by class whose root cause has a remedy here,
    /// replayed with it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub class_matches_checked: usize,
    /// Of those, the ones the remedy left failing (their evidence says which).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub class_matches_contradicted: usize,
}

impl FixReplays {
    /// `identity by fix: 4 group(s) replayed with 18 remedies (76 replays)...` (free text
    /// inside: escape it for where it goes).
    pub fn describe(&self) -> String {
        let mut s = format!(
            "identity by fix: {} group(s) no corpus file matched, replayed with {} remedies ({} replays)",
            self.groups,
            self.remedies.len(),
            self.replays
        );
        if self.class_matches_checked > 0 {
            s.push_str(&format!(
                "; {} class match(es) checked by their root cause's fix, {} contradicted",
                self.class_matches_checked, self.class_matches_contradicted
            ));
        }
        if self.cut_short {
            s.push_str("; CUT SHORT at the hunt's deadline (the groups say which were not replayed with every remedy)");
        }
        for why in &self.unavailable {
            s.push_str(&format!("; {why}"));
        }
        s
    }
}
