//! Checking a fix against a corpus: every file's trace run on the pin and on the pin with the
//! fix, as each file's expectation for the pin names the run (the target alone, against
//! another target, or against another configuration); the fix passes when each of its own
//! files fails on the pin and holds with the fix, and every other run ends exactly as on the
//! pin (the same first violation, or none, or the same unsupported step). A crash at or before
//! the file oracle's first violation is the run's outcome whatever the file's oracle: a crash
//! ends the run, so a fix that adds or removes one must show.
//!
//! The two builds are compared with each other, not with the recorded expectations: a file
//! that records nothing for the pin is still run on both, so a fix that changes what an
//! unrecorded trace does is caught too.

use std::fmt::Write as _;

use serde_json::Value;

use crate::base::error::Error;
use crate::base::op::SeqId;
use crate::oracles::{OracleId, Registry};
use crate::outputs::corpus::Corpus;
use crate::outputs::repro::{judge_entry, Expect, Repro, TargetExpectation};
use crate::running::judge::RunJudgement;
use crate::targets::registry::TargetSpec;

use super::Fix;

/// How one run of a file's trace ends, as far as the file's oracle says.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The oracle holds on every step.
    Holds,
    /// The oracle fails first here (`observed` only where it is evidence for the oracle).
    Fails {
        /// 1-based step.
        step: usize,
        /// The violation's kind.
        kind: String,
        /// Its sequence, if any.
        seq: Option<SeqId>,
        /// What was observed, where the oracle counts it as evidence.
        observed: Option<Value>,
    },
    /// A target said the op at this step is unsupported before the oracle failed.
    Unsupported {
        /// 1-based step (0: the setup).
        step: usize,
        /// Its reason.
        reason: String,
    },
    /// The target could not be built or driven: nothing was judged.
    Unavailable(String),
}

impl Outcome {
    /// The outcome of `repro`'s oracle in the judgement `j`.
    pub fn of(repro: &Repro, j: &RunJudgement) -> Outcome {
        let mut first = j.first(repro.oracle);
        // A crash ends the run: the file's own oracle is judged only up to it, so a crash at or
        // before the oracle's first violation is the outcome (a fix that adds or removes one
        // must show, whatever the file's oracle).
        if repro.oracle != OracleId::CRASH {
            if let Some(c) = j.first(OracleId::CRASH) {
                if !matches!(first, Some(v) if v.step < c.step) {
                    first = Some(c);
                }
            }
        }
        if let Some((step, reason)) = &j.unsupported {
            if !matches!(first, Some(v) if v.step < *step) {
                return Outcome::Unsupported {
                    step: *step,
                    reason: reason.clone(),
                };
            }
        }
        // (`Option::is_none_or` needs Rust 1.82; the crate's MSRV is 1.80.)
        #[allow(clippy::unnecessary_map_or)]
        let evidence = Registry::builtin()
            .get(repro.oracle)
            .map_or(true, |o| o.observed_is_evidence());
        match first {
            None => Outcome::Holds,
            Some(v) => Outcome::Fails {
                step: v.step,
                kind: if v.violation.oracle == repro.oracle {
                    v.violation.kind.clone()
                } else {
                    format!("{}: {}", v.violation.oracle, v.violation.kind)
                },
                seq: v.violation.seq,
                observed: (evidence && v.violation.oracle == repro.oracle)
                    .then(|| v.violation.observed.clone()),
            },
        }
    }

    /// Whether `self` and `other` are the same but for the line numbers of llama.cpp's source
    /// files in their texts: a patch that adds lines above an assert moves the line its
    /// message names (`llama-memory-recurrent.cpp:815` becomes `:823`), nothing else.
    pub fn same_but_source_lines(&self, other: &Outcome) -> bool {
        without_source_lines(&self.describe()) == without_source_lines(&other.describe())
    }

    /// One cell of a table.
    pub fn describe(&self) -> String {
        match self {
            Outcome::Holds => "holds".into(),
            Outcome::Fails {
                step,
                kind,
                seq,
                observed,
            } => {
                let seq = seq.map(|s| format!(", seq {s}")).unwrap_or_default();
                let observed = observed
                    .as_ref()
                    .map(|o| format!(" {o}"))
                    .unwrap_or_default();
                format!("fails at step {step} ({kind}{seq}){observed}")
            }
            Outcome::Unsupported { step, reason } => {
                format!("unsupported at step {step} ({reason})")
            }
            Outcome::Unavailable(why) => format!("unavailable: {why}"),
        }
    }
}

/// `text` with the digits after each `FILE.cpp:`, `FILE.c:` or `FILE.h:` replaced by `#`.
fn without_source_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(':') {
        let (head, tail) = rest.split_at(i + 1);
        out.push_str(head);
        let names_a_source = [".cpp:", ".c:", ".h:"].iter().any(|e| head.ends_with(e));
        let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
        if names_a_source && digits > 0 {
            out.push('#');
            rest = &tail[digits..];
        } else {
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// What one run says of the fix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A file of the fix: fails on the pin, holds with the fix.
    Fixed,
    /// A file of the fix that does not go from failing to holding.
    NotFixed,
    /// Another file: the same outcome on both builds.
    Unchanged,
    /// Another file the fix declares it changes the observed value of (`observed_changes`):
    /// the same step, kind and sequence, another observed value.
    Declared,
    /// Another file the fix declares it makes hold too (`also_fixes`): fails on the pin,
    /// holds with the fix.
    AlsoFixed,
    /// Another file whose violation the fix declares it changes in kind (`kind_changes`):
    /// fails on both at the same step and sequence, with another kind.
    KindDeclared,
    /// Another file whose outcome the fix changed.
    Changed,
    /// A build could not be driven: nothing was compared.
    Unavailable,
}

impl Verdict {
    /// Whether the check can pass with this run.
    pub fn passed(self) -> bool {
        matches!(
            self,
            Verdict::Fixed
                | Verdict::Unchanged
                | Verdict::Declared
                | Verdict::AlsoFixed
                | Verdict::KindDeclared
        )
    }

    /// A short word for tables.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Fixed => "fixed",
            Verdict::NotFixed => "NOT FIXED",
            Verdict::Unchanged => "unchanged",
            Verdict::Declared => "observed value changed, as declared",
            Verdict::AlsoFixed => "also fixed, as declared",
            Verdict::KindDeclared => "kind changed, as declared",
            Verdict::Changed => "CHANGED",
            Verdict::Unavailable => "UNAVAILABLE",
        }
    }
}

/// One run of one file on both builds.
#[derive(Clone, Debug, PartialEq)]
pub struct RunCheck {
    /// The corpus file's name.
    pub file: String,
    /// The run, as the file's expectation for the pin labels it (`llama.cpp@0.1.161 vs ...`).
    pub run: String,
    /// Whether the file is one the fix is for.
    pub own: bool,
    /// Why the fix changes the file's observed value, where it declares so.
    pub declared: Option<String>,
    /// Why the fix makes the file hold too, where it declares so.
    pub also_fixed: Option<String>,
    /// Why the fix changes the kind of the file's violation, where it declares so.
    pub kind_changed: Option<String>,
    /// On the pin.
    pub before: Outcome,
    /// On the pin with the fix.
    pub after: Outcome,
}

impl RunCheck {
    /// The run in one line: file, run, verdict, both outcomes.
    pub fn line(&self) -> String {
        format!(
            "{} ({}): {}: before {}; with the fix {}",
            self.file,
            self.run,
            self.verdict().word(),
            self.before.describe(),
            self.after.describe()
        )
    }

    /// What the run says of the fix.
    pub fn verdict(&self) -> Verdict {
        let unavailable = |o: &Outcome| matches!(o, Outcome::Unavailable(_));
        if unavailable(&self.before) || unavailable(&self.after) {
            return Verdict::Unavailable;
        }
        match (self.own, &self.before, &self.after) {
            (true, Outcome::Fails { .. }, Outcome::Holds) => Verdict::Fixed,
            (true, _, _) => Verdict::NotFixed,
            (false, b, a) if b == a || b.same_but_source_lines(a) => Verdict::Unchanged,
            (false, b, a) if self.declared.is_some() && same_failure(b, a) => Verdict::Declared,
            (false, Outcome::Fails { .. }, Outcome::Holds) if self.also_fixed.is_some() => {
                Verdict::AlsoFixed
            }
            (false, b, a) if self.kind_changed.is_some() && same_step_and_seq(b, a) => {
                Verdict::KindDeclared
            }
            (false, _, _) => Verdict::Changed,
        }
    }
}

/// Whether both fail at the same step with the same kind and sequence (observed aside).
fn same_failure(before: &Outcome, after: &Outcome) -> bool {
    let kind = |o: &Outcome| match o {
        Outcome::Fails { kind, .. } => Some(kind.clone()),
        _ => None,
    };
    same_step_and_seq(before, after) && kind(before) == kind(after)
}

/// Whether both fail at the same step and sequence (kind and observed aside).
fn same_step_and_seq(before: &Outcome, after: &Outcome) -> bool {
    match (before, after) {
        (
            Outcome::Fails { step, seq, .. },
            Outcome::Fails {
                step: s2, seq: q2, ..
            },
        ) => step == s2 && seq == q2,
        _ => false,
    }
}

/// A fix checked against a corpus.
#[derive(Clone, Debug, PartialEq)]
pub struct FixCheck {
    /// The fix's name.
    pub fix: String,
    /// The build with the fix.
    pub target: String,
    /// The pin without it.
    pub against: String,
    /// Every run, in the corpus's file order.
    pub runs: Vec<RunCheck>,
}

impl FixCheck {
    /// Whether every run passed (and the fix's files were all run).
    pub fn passed(&self) -> bool {
        self.runs.iter().any(|r| r.own) && self.runs.iter().all(|r| r.verdict().passed())
    }

    /// How many runs have `verdict`.
    pub fn count(&self, verdict: Verdict) -> usize {
        self.runs.iter().filter(|r| r.verdict() == verdict).count()
    }

    /// The result in one line.
    pub fn result_line(&self) -> String {
        let files = |own: bool| {
            let mut v: Vec<&str> = self
                .runs
                .iter()
                .filter(|r| r.own == own)
                .map(|r| r.file.as_str())
                .collect();
            v.dedup();
            v.len()
        };
        let mut line = format!(
            "{}: {} of {} run(s) of the fix's {} file(s) fixed (fail on {} and hold with the fix), \
             {} of {} run(s) of the other {} file(s) unchanged{}",
            if self.passed() { "passed" } else { "FAILED" },
            self.count(Verdict::Fixed),
            self.runs.iter().filter(|r| r.own).count(),
            files(true),
            self.against,
            self.count(Verdict::Unchanged)
                + self.count(Verdict::Declared)
                + self.count(Verdict::AlsoFixed)
                + self.count(Verdict::KindDeclared),
            self.runs.iter().filter(|r| !r.own).count(),
            files(false),
            declared_counts(
                self.count(Verdict::Declared),
                self.count(Verdict::AlsoFixed),
                self.count(Verdict::KindDeclared)
            )
        );
        for (verdict, what) in [
            (Verdict::NotFixed, "not fixed"),
            (Verdict::Changed, "changed"),
            (Verdict::Unavailable, "unavailable"),
        ] {
            let n = self.count(verdict);
            if n > 0 {
                let _ = write!(line, "; {n} {what}");
            }
        }
        line
    }

    /// The table of every run, Markdown: the runs that did not pass first.
    pub fn markdown_table(&self) -> String {
        let mut out = format!(
            "| file | run | {} | {} | verdict |\n|---|---|---|---|---|\n",
            self.against, self.target
        );
        let mut runs: Vec<&RunCheck> = self.runs.iter().collect();
        runs.sort_by_key(|r| (r.verdict().passed(), !r.own));
        for r in runs {
            let why = match r.verdict() {
                Verdict::Declared => r.declared.as_ref(),
                Verdict::AlsoFixed => r.also_fixed.as_ref(),
                Verdict::KindDeclared => r.kind_changed.as_ref(),
                _ => None,
            };
            let why = why.map(|w| format!(": {w}")).unwrap_or_default();
            let _ = writeln!(
                out,
                "| `{}`{} | {} | {} | {} | {}{} |",
                r.file.trim_end_matches(".json"),
                if r.own { " (the fix's)" } else { "" },
                cell(&r.run),
                cell(&r.before.describe()),
                cell(&r.after.describe()),
                r.verdict().word(),
                cell(&why)
            );
        }
        out
    }
}

/// What the unchanged count includes of the declared changes, for the result line.
fn declared_counts(observed: usize, also_fixed: usize, kind_changed: usize) -> String {
    let mut parts = Vec::new();
    if observed > 0 {
        parts.push(format!("{observed} with another observed value"));
    }
    if also_fixed > 0 {
        parts.push(format!("{also_fixed} fixed too"));
    }
    if kind_changed > 0 {
        parts.push(format!("{kind_changed} with another kind"));
    }
    if parts.is_empty() {
        return String::new();
    }
    format!(" or changed as the fix declares ({})", parts.join(", "))
}

/// `text` as one Markdown table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// Runs every file of `corpus` on `fix.check_on` and on it with the fix, and compares.
/// `progress` is told each file's name as it starts.
pub fn check_fix(
    fix: &Fix,
    corpus: &Corpus,
    progress: &mut dyn FnMut(&str),
) -> Result<FixCheck, Error> {
    let against = fix.check_on.clone();
    let bare = fix.check_on_bare()?;
    let target = fix.target();
    let mut runs = Vec::new();
    for (file, repro) in &corpus.files {
        progress(file);
        let own = fix.files.iter().any(|f| f == file);
        let why_of = |changes: &[super::DeclaredChange]| {
            changes
                .iter()
                .find(|c| &c.file == file)
                .map(|c| c.why.clone())
        };
        let declared = why_of(&fix.observed_changes);
        let also_fixed = why_of(&fix.also_fixes);
        let kind_changed = why_of(&fix.kind_changes);
        let mut entries: Vec<TargetExpectation> = repro
            .targets
            .iter()
            .filter(|e| e.target == against)
            .cloned()
            .collect();
        if entries.is_empty() && bare != against {
            // A fix checked on the pin with another fix (`check_on` with `+fix:`): the runs the
            // bare pin's expectations name, against the same partner or configuration.
            entries = repro
                .targets
                .iter()
                .filter(|e| e.target == bare)
                .map(|e| TargetExpectation {
                    target: against.clone(),
                    ..e.clone()
                })
                .collect();
        }
        if entries.is_empty() {
            // Nothing recorded for the pin: the trace on the pin alone.
            let spec = TargetSpec::new(&against, &[]);
            entries.push(TargetExpectation::new(&spec, None, Expect::Holds));
        }
        for entry in entries {
            let outcome = |e: &TargetExpectation| match judge_entry(repro, e) {
                Ok(j) => Outcome::of(repro, &j),
                Err(err) => Outcome::Unavailable(err.message),
            };
            let with_fix = TargetExpectation {
                target: target.clone(),
                ..entry.clone()
            };
            runs.push(RunCheck {
                file: file.clone(),
                run: entry.label(),
                own,
                declared: declared.clone(),
                also_fixed: also_fixed.clone(),
                kind_changed: kind_changed.clone(),
                before: outcome(&entry),
                after: outcome(&with_fix),
            });
        }
    }
    for file in fix
        .files
        .iter()
        .chain(fix.declared_changes().map(|c| &c.file))
    {
        if !corpus.files.iter().any(|(n, _)| n == file) {
            return Err(Error::input(format!(
                "fix `{}`: its file {file} is not in the corpus",
                fix.name
            )));
        }
    }
    Ok(FixCheck {
        fix: fix.name.clone(),
        target,
        against,
        runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(own: bool, before: Outcome, after: Outcome) -> RunCheck {
        RunCheck {
            file: "f.json".into(),
            run: "llama.cpp@0.1.161".into(),
            own,
            declared: None,
            also_fixed: None,
            kind_changed: None,
            before,
            after,
        }
    }

    #[test]
    fn a_fix_passes_only_when_its_files_go_from_failing_to_holding_and_nothing_else_moves() {
        let fails = |step| Outcome::Fails {
            step,
            kind: "k".into(),
            seq: Some(0),
            observed: None,
        };
        assert_eq!(
            run(true, fails(2), Outcome::Holds).verdict(),
            Verdict::Fixed
        );
        assert_eq!(run(true, fails(2), fails(3)).verdict(), Verdict::NotFixed);
        // A file of the fix that already holds on the pin shows nothing about the fix.
        assert_eq!(
            run(true, Outcome::Holds, Outcome::Holds).verdict(),
            Verdict::NotFixed
        );
        assert_eq!(run(false, fails(2), fails(2)).verdict(), Verdict::Unchanged);
        assert_eq!(
            run(false, fails(2), Outcome::Holds).verdict(),
            Verdict::Changed
        );
        assert_eq!(
            run(false, Outcome::Holds, fails(1)).verdict(),
            Verdict::Changed
        );
        // Another observed value passes only where the fix declares it, and only that.
        let observed = |x: f64| Outcome::Fails {
            step: 1,
            kind: "k".into(),
            seq: Some(0),
            observed: Some(serde_json::json!(x)),
        };
        let declared = |before, after| RunCheck {
            declared: Some("why".into()),
            ..run(false, before, after)
        };
        assert_eq!(
            run(false, observed(0.2), observed(0.1)).verdict(),
            Verdict::Changed
        );
        assert_eq!(
            declared(observed(0.2), observed(0.1)).verdict(),
            Verdict::Declared
        );
        assert_eq!(
            declared(observed(0.2), fails(2)).verdict(),
            Verdict::Changed
        );
        assert_eq!(
            declared(observed(0.2), Outcome::Holds).verdict(),
            Verdict::Changed
        );
        let also = |before, after| RunCheck {
            also_fixed: Some("why".into()),
            ..run(false, before, after)
        };
        assert_eq!(also(fails(2), Outcome::Holds).verdict(), Verdict::AlsoFixed);
        assert!(Verdict::AlsoFixed.passed() && Verdict::Declared.passed());
        assert_eq!(also(fails(2), fails(3)).verdict(), Verdict::Changed);
        assert_eq!(also(Outcome::Holds, fails(3)).verdict(), Verdict::Changed);
        // Another kind at the same step and sequence passes only where the fix declares it
        // (one of a file's two root causes removed), and nothing else does.
        let kind = |kind: &str, step, seq| Outcome::Fails {
            step,
            kind: kind.into(),
            seq: Some(seq),
            observed: None,
        };
        let kind_changed = |before, after| RunCheck {
            kind_changed: Some("why".into()),
            ..run(false, before, after)
        };
        assert_eq!(
            run(false, kind("a", 2, 0), kind("b", 2, 0)).verdict(),
            Verdict::Changed
        );
        assert_eq!(
            kind_changed(kind("a", 2, 0), kind("b", 2, 0)).verdict(),
            Verdict::KindDeclared
        );
        assert!(Verdict::KindDeclared.passed());
        for after in [kind("b", 3, 0), kind("b", 2, 1), Outcome::Holds] {
            assert_eq!(
                kind_changed(kind("a", 2, 0), after).verdict(),
                Verdict::Changed
            );
        }
        // An assert whose line a patch moved is the same abort; another line of another text is
        // not.
        let abort = |kind: &str| Outcome::Fails {
            step: 2,
            kind: kind.into(),
            seq: None,
            observed: None,
        };
        let moved = run(
            false,
            abort("SIGABRT: llama-memory-recurrent.cpp:815: x"),
            abort("SIGABRT: llama-memory-recurrent.cpp:823: x"),
        );
        assert_eq!(moved.verdict(), Verdict::Unchanged);
        let other = run(
            false,
            abort("SIGABRT: a.cpp:815: x"),
            abort("SIGABRT: a.cpp:815: y"),
        );
        assert_eq!(other.verdict(), Verdict::Changed);
        assert_eq!(
            without_source_lines("at a.h:12, step 3: b.c:7"),
            "at a.h:#, step 3: b.c:#"
        );
        let down = Outcome::Unavailable("no build".into());
        assert_eq!(
            run(false, down.clone(), down).verdict(),
            Verdict::Unavailable
        );
        let check = |runs| FixCheck {
            fix: "x".into(),
            target: "t".into(),
            against: "a".into(),
            runs,
        };
        assert!(check(vec![
            run(true, fails(2), Outcome::Holds),
            run(false, fails(1), fails(1))
        ])
        .passed());
        assert!(
            !check(vec![run(false, fails(1), fails(1))]).passed(),
            "no file of the fix ran"
        );
        let failed = check(vec![
            run(true, fails(2), Outcome::Holds),
            run(false, Outcome::Holds, fails(1)),
        ]);
        assert!(!failed.passed());
        assert!(
            failed.result_line().starts_with("FAILED")
                && failed.result_line().ends_with("; 1 changed")
        );
        assert!(failed
            .markdown_table()
            .lines()
            .nth(2)
            .unwrap()
            .ends_with("| CHANGED |"));
    }
}
