//! Fixes as kvaudit knows them: each `corpora/fixes/NAME.json` beside its patch (built into
//! the crate `llama-cpp-target`, which applies the patch when a label says `+fix:NAME`), read
//! as a [`Fix`]: the root cause it fixes, the corpus files it makes hold, the pin it is checked
//! on, and the result of its last check ([`check`]), which a bug report quotes.

pub mod check;

use serde::{Deserialize, Serialize};

use crate::base::error::Error;
use crate::targets::llama::fixes::{EmbeddedFix, FIXES};
use crate::targets::llama::pins::Pin;

/// A fix: a patch to a pin's llama.cpp sources and what it is for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fix {
    /// The name after `+fix:`, and the file stem under `corpora/fixes/`.
    pub name: String,
    /// The root cause it fixes (`R2`: notes/issue45/root-causes.md's numbering).
    pub root_cause: String,
    /// The cause, in one line.
    pub cause: String,
    /// Where the cause is, in the pin it is checked on (`src/llama-kv-cells.h:486`).
    pub source: String,
    /// The corpus files (file names under `corpora/`) whose oracle the fix makes hold.
    pub files: Vec<String>,
    /// The pin label it is checked on, without the fix (`llama.cpp@0.1.161`; `+assert` where
    /// the cause shows only as an `assert`).
    pub check_on: String,
    /// The crate versions whose sources the patch applies to exactly.
    pub applies_to: Vec<String>,
    /// An upstream issue or pull request, if one exists.
    #[serde(default)]
    pub upstream: Option<String>,
    /// Other corpus files whose observed value the fix changes, each with why: a run of one of
    /// them passes the check when it fails at the same step, with the same kind and sequence,
    /// and only the observed value differs (a logits difference of another size).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub observed_changes: Vec<DeclaredChange>,
    /// Other corpus files the fix makes hold too, each with why (the same cause reached
    /// another way, which the file's own decision does not say yet): a run of one of them
    /// passes the check when it fails on the pin and holds with the fix.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also_fixes: Vec<DeclaredChange>,
    /// Other corpus files whose violation the fix changes in kind, each with why: a file that
    /// shows two root causes at one step, of which the fix removes one. A run of one of them
    /// passes the check when it fails on both builds at the same step and sequence with another
    /// kind (what is left is the other root cause's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kind_changes: Vec<DeclaredChange>,
    /// How the patch differs from the first draft (`notes/issue45/patches/`), if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revised: Option<String>,
    /// The last check's result, written by `kvaudit fixes check --record`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked: Option<Checked>,
}

/// A corpus file outside a fix's own whose outcome the fix declares it changes, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeclaredChange {
    /// The corpus file's name.
    pub file: String,
    /// Why the fix changes it, in one line.
    pub why: String,
}

/// What the last check of a fix found (`kvaudit fixes check --record`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checked {
    /// The day of the check, `YYYY-MM-DD` (UTC).
    pub date: String,
    /// sha256 of the patch that was checked: a changed patch is unchecked until checked again.
    pub patch_sha256: String,
    /// The build with the fix and the one it was compared with.
    pub target: String,
    /// The pin without the fix.
    pub against: String,
    /// The result in one line: the fix's files that hold, the others unchanged.
    pub result: String,
    /// Whether every condition of the check held.
    pub passed: bool,
    /// The report with every file's outcome on both builds.
    pub report: String,
}

impl Fix {
    /// Every fix built in, in name order; `Err` names a JSON file that does not parse or does
    /// not name its own patch.
    pub fn all() -> Result<Vec<(Fix, &'static EmbeddedFix)>, Error> {
        FIXES
            .iter()
            .map(|e| {
                let fix: Fix = serde_json::from_str(e.json).map_err(|err| {
                    Error::harness(format!("corpora/fixes/{}.json: {err}", e.name))
                })?;
                if fix.name != e.name {
                    return Err(Error::harness(format!(
                        "corpora/fixes/{}.json: \"name\" is {:?}",
                        e.name, fix.name
                    )));
                }
                Ok((fix, e))
            })
            .collect()
    }

    /// The fix called `name`.
    pub fn named(name: &str) -> Result<(Fix, &'static EmbeddedFix), Error> {
        Fix::all()?
            .into_iter()
            .find(|(f, _)| f.name == name)
            .ok_or_else(|| {
                Error::input(format!(
                    "no fix `{name}` in corpora/fixes/ (`kvaudit fixes list` lists them)"
                ))
            })
    }

    /// The fixes whose files include the corpus file `file_name` (`NAME.json`).
    pub fn of_file(file_name: &str) -> Result<Vec<(Fix, &'static EmbeddedFix)>, Error> {
        Ok(Fix::all()?
            .into_iter()
            .filter(|(f, _)| f.files.iter().any(|x| x == file_name))
            .collect())
    }

    /// Every corpus file the fix declares it changes, of the three sorts.
    pub fn declared_changes(&self) -> impl Iterator<Item = &DeclaredChange> {
        self.observed_changes
            .iter()
            .chain(&self.also_fixes)
            .chain(&self.kind_changes)
    }

    /// The fixes `check_on` builds in before this one (`kshift-without-layers` for a fix
    /// checked on `llama.cpp@0.1.161+fix:kshift-without-layers`): what the fix needs applied
    /// with it, in a check and as a hunt's remedy.
    pub fn prerequisites(&self) -> Result<Vec<String>, Error> {
        Ok(self.check_on_pin()?.fixes)
    }

    /// `check_on` without its fixes: the pin whose recorded expectations name the runs.
    pub fn check_on_bare(&self) -> Result<String, Error> {
        let mut pin = self.check_on_pin()?;
        pin.fixes.clear();
        Ok(pin.label())
    }

    fn check_on_pin(&self) -> Result<Pin, Error> {
        Pin::parse(&self.check_on).map_err(|e| {
            Error::input(format!(
                "corpora/fixes/{}.json: check_on {}: {e}",
                self.name, self.check_on
            ))
        })
    }

    /// The label of the build with this fix: `check_on` with `+fix:NAME`.
    pub fn target(&self) -> String {
        format!("{}+fix:{}", self.check_on, self.name)
    }

    /// The last check's result, if it was of this patch (`None` when unchecked, or checked
    /// with other patch bytes).
    pub fn current_check(&self, embedded: &EmbeddedFix) -> Option<&Checked> {
        self.checked
            .as_ref()
            .filter(|c| c.patch_sha256 == embedded.patch_sha256())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fix_parses_names_corpus_files_and_was_checked_with_its_patch() {
        let corpus = crate::outputs::corpus::Corpus::built_in().unwrap();
        let fixes = Fix::all().unwrap();
        assert!(!fixes.is_empty());
        for (fix, embedded) in &fixes {
            assert!(!fix.files.is_empty(), "{}: no file", fix.name);
            let declared = fix.declared_changes().map(|c| &c.file);
            for file in fix.files.iter().chain(declared) {
                assert!(
                    corpus.files.iter().any(|(n, _)| n == file),
                    "{}: {file} is not a corpus file",
                    fix.name
                );
            }
            crate::targets::llama::pins::Pin::parse(&fix.target()).unwrap();
            // Only checked fixes are kept, and a changed patch must be checked again.
            let checked = fix.current_check(embedded);
            assert!(
                checked.is_some_and(|c| c.passed),
                "{}: not checked with this patch (scripts/fixes-check.sh)",
                fix.name
            );
        }
    }
}
