//! The version matrix: every finding (repro file) on every version of one or more engines,
//! with the first version where each fails and the first where it is fixed, rendered for the
//! terminal, Markdown and JSON. A file runs on its own engine's versions only: its cells on
//! another engine's are not applicable (`-`), and a version no file applies to is not built.
//!
//! Versions run one after another, oldest first: a build uses both cores of the machines this
//! runs on, and one version's build, then its replays, keeps one worker alive at a time.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{not_applicable, outcome_on, prepare, Outcome};
use crate::outputs::repro::Repro;
use crate::records::report::terminal_text;
use crate::targets::registry::TargetKind;

/// One finding's row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MatrixRow {
    /// The repro file.
    pub file: PathBuf,
    /// Its oracle.
    pub oracle: String,
    /// One line: what the trace does.
    pub repro: String,
    /// One outcome per version of [`Matrix::versions`].
    pub outcomes: Vec<Outcome>,
    /// The oldest version where the finding is present (fails or crashes).
    pub first_failing: Option<String>,
    /// The oldest version, after the newest one where it is present, where it holds.
    pub first_fixed: Option<String>,
}

/// Every finding on every version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Matrix {
    /// The target labels, oldest first.
    pub versions: Vec<String>,
    /// One row per repro file, in the order given.
    pub rows: Vec<MatrixRow>,
}

/// The first failing and first fixed version of a row's outcomes.
pub fn first_failing_and_fixed(
    versions: &[String],
    outcomes: &[Outcome],
) -> (Option<String>, Option<String>) {
    let present: Vec<Option<bool>> = outcomes.iter().map(Outcome::present).collect();
    let first_failing = present.iter().position(|p| *p == Some(true));
    let last_failing = present.iter().rposition(|p| *p == Some(true));
    let first_fixed = last_failing.and_then(|last| {
        present[last + 1..]
            .iter()
            .position(|p| *p == Some(false))
            .map(|i| last + 1 + i)
    });
    (
        first_failing.map(|i| versions[i].clone()),
        first_fixed.map(|i| versions[i].clone()),
    )
}

/// Runs every repro on every version (`versions`: target names, each engine's oldest first),
/// making each ready first (a pin built, an environment made) where `skip` says nothing and a
/// file applies to it; a version that `skip` names a reason for is not run, and its column says
/// why (unavailable), so a table over some of the versions still shows the versions it left
/// out. `progress` hears each cell as it is known.
pub fn run_matrix(
    repros: &[(PathBuf, Repro)],
    versions: &[String],
    skip: &dyn Fn(&str) -> Option<String>,
    progress: &mut dyn FnMut(usize, &str, &std::path::Path, &Outcome),
) -> Matrix {
    let mut columns: Vec<Vec<Outcome>> = Vec::new();
    for (i, label) in versions.iter().enumerate() {
        let applies = repros
            .iter()
            .any(|(_, r)| not_applicable(r, label).is_none());
        let ready = match skip(label) {
            Some(reason) => Err(crate::base::error::Error::harness(reason)),
            None if applies => prepare(label),
            None => Ok(()),
        };
        let column = repros
            .iter()
            .map(|(path, repro)| {
                let outcome = match (&ready, not_applicable(repro, label)) {
                    (_, Some(reason)) => Outcome::NotApplicable { reason },
                    (Ok(()), None) => outcome_on(repro, label),
                    (Err(why), None) => Outcome::Unavailable {
                        reason: why.message.clone(),
                    },
                };
                progress(i, label, path, &outcome);
                outcome
            })
            .collect();
        columns.push(column);
    }
    let rows = repros
        .iter()
        .enumerate()
        .map(|(r, (path, repro))| {
            let outcomes: Vec<Outcome> = columns.iter().map(|c| c[r].clone()).collect();
            let (first_failing, first_fixed) = first_failing_and_fixed(versions, &outcomes);
            MatrixRow {
                file: path.clone(),
                oracle: repro.oracle.to_string(),
                repro: repro.repro.clone(),
                outcomes,
                first_failing,
                first_fixed,
            }
        })
        .collect();
    Matrix {
        versions: versions.to_vec(),
        rows,
    }
}

impl MatrixRow {
    /// The file's stem: how tables name the finding.
    pub fn name(&self) -> String {
        self.file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

const LEGEND: &str =
    ". holds, F fails, C crash, u unsupported, ? unavailable (not built or not driven), \
     - not applicable (a file of another engine)";

impl Matrix {
    /// The engines of its versions, each once, in order (`llama.cpp`, `mlx-lm`).
    fn engines(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = Vec::new();
        for v in &self.versions {
            let name = TargetKind::of_label(v).map_or("?", |k| k.engine().name());
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }

    /// A row's first failing and first fixed version as tables name them (`-`: none).
    fn bounds<'a>(&self, r: &'a MatrixRow) -> (&'a str, &'a str) {
        let name = |v: &'a Option<String>| v.as_deref().map_or("-", |v| self.short(v));
        (name(&r.first_failing), name(&r.first_fixed))
    }

    /// How tables name a version: without the target's name (`0.1.156`, `0.1.156+assert`)
    /// when every version is one engine's, else its whole name.
    fn short<'a>(&self, label: &'a str) -> &'a str {
        match self.engines().len() {
            0 | 1 => TargetKind::version_of(label).unwrap_or(label),
            _ => label,
        }
    }

    /// The terminal table: one line per version, one column per finding (numbered), then each
    /// finding's first failing and first fixed version.
    pub fn terminal(&self) -> String {
        let mut out = String::new();
        let width = self
            .versions
            .iter()
            .map(|v| self.short(v).len())
            .max()
            .unwrap_or(7);
        let header: String = (1..=self.rows.len()).map(|i| format!("{:>3}", i)).collect();
        out.push_str(&format!("{:width$} {header}\n", "version"));
        for (c, v) in self.versions.iter().enumerate() {
            let cells: String = self
                .rows
                .iter()
                .map(|r| format!("{:>3}", r.outcomes[c].mark()))
                .collect();
            out.push_str(&format!("{:width$} {cells}\n", self.short(v)));
        }
        out.push_str(&format!("({LEGEND})\n\n"));
        for (i, r) in self.rows.iter().enumerate() {
            let (failing, fixed) = self.bounds(r);
            out.push_str(&format!(
                "{:>3} {} ({}): first failing {failing}, first fixed {fixed}\n",
                i + 1,
                terminal_text(&r.name()),
                r.oracle,
            ));
        }
        out
    }

    /// The Markdown report: the summary per finding, then the table (versions as rows).
    pub fn markdown(&self) -> String {
        use crate::records::report::{markdown_code, markdown_text};
        let mut out = format!(
            "# Findings across {} versions\n\n",
            self.engines().join(" and ")
        );
        out.push_str(&format!(
            "{} finding(s) on {} version(s), `{}` to `{}`. Regenerated by its script, `scripts/matrix*.sh`.\n\n",
            self.rows.len(),
            self.versions.len(),
            self.versions.first().map(|v| self.short(v)).unwrap_or("-"),
            self.versions.last().map(|v| self.short(v)).unwrap_or("-"),
        ));
        let not_run: Vec<&str> = self
            .versions
            .iter()
            .enumerate()
            .filter(|(c, _)| {
                let cells = || self.rows.iter().map(|r| &r.outcomes[*c]);
                cells().any(|o| matches!(o, Outcome::Unavailable { .. }))
                    && cells().all(|o| {
                        matches!(
                            o,
                            Outcome::Unavailable { .. } | Outcome::NotApplicable { .. }
                        )
                    })
            })
            .map(|(_, v)| self.short(v))
            .collect();
        if !self.rows.is_empty() && !not_run.is_empty() {
            out.push_str(&format!(
                "{} version(s) were not run (`?` in every column a file applies to: not built or not driven): {}. \
                 A first failing or first fixed version is the first *run* version that fails or \
                 holds: the change lies between it and the version run before it.\n\n",
                not_run.len(),
                not_run.join(", ")
            ));
        }
        out.push_str(
            "| # | finding | oracle | first failing | first fixed |\n|---:|---|---|---|---|\n",
        );
        for (i, r) in self.rows.iter().enumerate() {
            let (failing, fixed) = self.bounds(r);
            out.push_str(&format!(
                "| {} | {}: {} | {} | {failing} | {fixed} |\n",
                i + 1,
                markdown_code(&r.name()),
                markdown_text(&r.repro),
                markdown_text(&r.oracle),
            ));
        }
        out.push_str(&format!("\n{LEGEND}.\n\n| version |"));
        for i in 1..=self.rows.len() {
            out.push_str(&format!(" {i} |"));
        }
        out.push_str("\n|---|");
        out.push_str(&":-:|".repeat(self.rows.len()));
        out.push('\n');
        for (c, v) in self.versions.iter().enumerate() {
            out.push_str(&format!("| {} |", self.short(v)));
            for r in &self.rows {
                out.push_str(&format!(" {} |", r.outcomes[c].mark()));
            }
            out.push('\n');
        }
        out
    }

    /// The JSON form (every outcome with its step, kind or reason).
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
            + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_failing_and_first_fixed_skip_what_cannot_be_judged() {
        let v: Vec<String> = ["a", "b", "c", "d", "e", "f"].map(String::from).to_vec();
        let fails = || Outcome::Fails {
            step: 3,
            kind: "k".into(),
        };
        let un = || Outcome::Unavailable { reason: "r".into() };
        let row = [Outcome::Holds, fails(), un(), fails(), un(), Outcome::Holds];
        assert_eq!(
            first_failing_and_fixed(&v, &row),
            (Some("b".into()), Some("f".into()))
        );
        let still = [Outcome::Holds, fails(), fails(), un(), un(), un()];
        assert_eq!(
            first_failing_and_fixed(&v, &still),
            (Some("b".into()), None)
        );
        let never = [Outcome::Holds, Outcome::Holds, un(), un(), un(), un()];
        assert_eq!(first_failing_and_fixed(&v, &never), (None, None));
    }
}
