//! A hunt's groups against the corpus, and the files of its new ones.
//!
//! Groups no file matches are then told by fix ([`by_fix`]: replayed with each fix of the corpus
//! and each injected fault removed), a separate step after [`classify`].
//!
//! Only the corpus files of the hunt target's engine ([`TargetKind::engine`]: a file is of the
//! engines its targets are of) are compared: a llama.cpp file says nothing of an mlx-lm group
//! whose oracle, kind and failing op happen to be the same, and the reverse.
//! Each corpus file's finding gets its root cause the way the hunt's findings get theirs
//! (`engines::root_cause::cause_of`, on the label of the file's expectation for the hunt's target,
//! else its first failing one). A group can be a corpus file's only when one of its findings is
//! of the file's class (`same_class`: oracle, kind with line numbers aside, memory type, stream
//! layout and, on iSWA memory, `swa_full`); then it is the file's when they share a cause
//! (`matched_by: cause`), or both are the native model's design (`design`), or, failing those,
//! when that finding fails at the file's op (`signature`: the shrinker may stop at another
//! minimal trace than the file's, and a crash's line moves between versions). Then its class
//! is *regressed* if the file records
//! that the finding holds on this target, else *known*; the group records the file's decision
//! (`decision`), which the summary's "What is broken" prints. A group that no file holds is
//! *decided* when a decision's class covers one of its findings (`decide_by_decision`, after the
//! file match: the corpus files' decisions with a `match` block in name order, then those of
//! `decisions/`; `repro::decision`). A corpus file that expects a failure on
//! this target, whose setup and oracle an entry judged, and that no group matched, is replayed:
//! if it now holds it is *fixed*. Every other group is *new*: its representative is written to
//! `new/` as a repro file with the program and bug report draft of its engine's renderer
//! (`reproducer.rs`: C over llama.h, Python over mlx-lm) and, while the budget lasts, the
//! program run on the target where it is a real engine's (a llama.cpp pin, an mlx-lm version)
//! and the picture drawn where `explain` applies (llama.cpp's engine); a file not written is
//! named in the group's files with why (`(no picture: ...)`).

pub mod by_fix;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::base::config::MemoryType;
use crate::base::error::Error;
use crate::engines::root_cause::cause_of;
use crate::oracles::{Reads, Registry};
use crate::records::finding::Finding;
use crate::records::group::Cause;
use crate::records::hunt::{
    FixedFinding, GroupClass, HuntFinding, HuntGroup, HuntSummary, Pairing, PlanEntry,
};
use crate::targets::registry::{Engine, TargetKind, TargetSpec};

use super::bug_report::CheckedProgram;
use super::c_repro::check::compile_and_run;
use super::corpus::Corpus;
use super::explain::{explain_repro, to_svg};
use super::repro::decision::{without_numbers, Decision, Seen};
use super::repro::{check, Status};
use super::repro::{safe_file_name, write_output, Expect, Repro, TargetExpectation};
use super::reproducer::{engines_of, no_picture, Language};

/// A corpus file, with the root cause of its finding.
pub struct CorpusEntry {
    /// Its file name.
    pub file: String,
    /// The repro.
    pub repro: Repro,
    /// Its finding's root cause.
    pub cause: Cause,
}

/// The files of `corpus` of the engine of the target `target` names (a file is of the engines
/// its targets are of).
fn engine_files<'c>(corpus: &'c [CorpusEntry], target: &str) -> Vec<&'c CorpusEntry> {
    let engine = TargetKind::of_label(target).map(TargetKind::engine);
    corpus
        .iter()
        .filter(|c| engine.is_some_and(|e| engines_of(&c.repro).contains(&e)))
        .collect()
}

/// The findings of the group `g`, of the hunt's `findings`.
fn members_of<'f>(findings: &'f [HuntFinding], g: &HuntGroup) -> Vec<&'f Finding> {
    g.group
        .findings
        .iter()
        .map(|&n| &findings[n - 1].finding)
        .collect()
}

/// The findings of group `g`, each with the configuration its entry of `plan` paired it with.
pub(crate) fn seen_of<'f>(
    findings: &'f [HuntFinding],
    plan: &'f [PlanEntry],
    g: &HuntGroup,
) -> Vec<Seen<'f>> {
    g.group
        .findings
        .iter()
        .map(|&n| {
            let hf = &findings[n - 1];
            let vs_config = plan
                .iter()
                .find(|e| e.id == hf.entry)
                .and_then(|e| match &e.pairing {
                    Pairing::Config { config } => Some(config.as_str()),
                    Pairing::Alone | Pairing::Native => None,
                });
            Seen {
                finding: &hf.finding,
                vs_config,
            }
        })
        .collect()
}

/// The expectation `repro` records for the hunt's target (faults included), if any.
fn expectation_for<'r>(repro: &'r Repro, s: &HuntSummary) -> Option<&'r TargetExpectation> {
    repro
        .targets
        .iter()
        .find(|t| t.target == s.target && t.faults == s.faults)
}

/// The files of `corpus`, each with its finding's root cause.
pub fn corpus_entries(corpus: &Corpus, s: &HuntSummary) -> Vec<CorpusEntry> {
    corpus
        .files
        .iter()
        .map(|(file, repro)| {
            let label = expectation_for(repro, s)
                .or_else(|| repro.targets.iter().find(|t| t.expect == Expect::Fails))
                .map_or_else(|| s.target.clone(), |t| t.label());
            let finding = Finding {
                oracle: repro.oracle,
                kind: repro.kind.clone(),
                target: label,
                depth: repro.trace.ops.len() as u32,
                trial_index: 0,
                step: repro.step,
                seq: repro.seq,
                trace: repro.trace.clone(),
                observed: repro.observed.clone(),
                expected: repro.expected.clone(),
            };
            CorpusEntry {
                file: file.clone(),
                cause: cause_of(&finding),
                repro: repro.clone(),
            }
        })
        .collect()
}

/// A decision a group can be matched with: one with a `match` block, from a corpus file or a
/// file of `decisions/`.
pub struct DecisionEntry {
    /// Where it is: `decisions/NAME.json`, or the corpus file that carries it.
    pub evidence: String,
    /// The decision.
    pub decision: Decision,
}

/// The decisions of `corpus` that have a class to match: the corpus files' (in name order),
/// then those of `decisions/` (in name order); the first that matches a group decides it.
pub fn decision_entries(corpus: &Corpus) -> Vec<DecisionEntry> {
    let of_files = corpus
        .files
        .iter()
        .filter_map(|(file, r)| r.decision.as_ref().map(|d| (file, d)));
    of_files
        .chain(corpus.decisions.iter().map(|(name, d)| (name, d)))
        .filter(|(_, d)| d.class.is_some())
        .map(|(evidence, d)| DecisionEntry {
            evidence: evidence.clone(),
            decision: d.clone(),
        })
        .collect()
}

/// Whether `f` is of the class `repro` files: the same oracle, kind (line numbers aside),
/// memory type and configuration that selects llama.cpp's code paths for it (one stream or
/// one per sequence; on iSWA memory, whether the windowed cache evicts).
fn same_class(f: &Finding, repro: &Repro) -> bool {
    let (a, b) = (&f.trace.setup, &repro.trace.setup);
    let memory = a.arch.memory();
    f.oracle == repro.oracle
        && without_numbers(&f.kind) == without_numbers(&repro.kind)
        && memory == b.arch.memory()
        && a.kv_unified == b.kv_unified
        && (memory != MemoryType::Iswa || a.swa_full == b.swa_full)
}

/// Decides a group that no corpus file holds by the first of `decisions` whose class one of
/// its findings (`members`) is of, on the hunt's `engine`: the group becomes that decision.
fn decide_by_decision(
    g: &mut HuntGroup,
    members: &[Seen<'_>],
    decisions: &[DecisionEntry],
    engine: Engine,
) {
    let hit = decisions.iter().find(|d| {
        d.decision
            .class
            .as_ref()
            .is_some_and(|m| members.iter().any(|&f| m.matches(f, engine)))
    });
    if let Some(d) = hit {
        decided_by(g, d);
    }
}

/// `g` becomes the decision `d`.
pub(crate) fn decided_by(g: &mut HuntGroup, d: &DecisionEntry) {
    g.class = GroupClass::Decided {
        decision: d.decision.decision,
        root_cause: d.decision.root_cause.clone(),
        evidence: d.evidence.clone(),
    };
    g.matched_by = "decision".into();
    g.decision = Some(d.decision.note());
}

/// Classifies every group of `s` against the files of `corpus` of its target's engine, then
/// the groups no file holds against `decisions`, and finds the corpus findings that the plan
/// reached and that no longer fail (replayed on the target, until `replay_until`).
pub fn classify(
    s: &mut HuntSummary,
    corpus: &[CorpusEntry],
    decisions: &[DecisionEntry],
    plan: &[PlanEntry],
    replay_until: Option<Instant>,
) {
    let engine = TargetKind::of_label(&s.target).map(TargetKind::engine);
    let corpus = engine_files(corpus, &s.target);
    let mut matched: BTreeSet<String> = BTreeSet::new();
    let holds_here: Vec<bool> = corpus
        .iter()
        .map(|c| expectation_for(&c.repro, s).is_some_and(|t| t.expect == Expect::Holds))
        .collect();
    for g in &mut s.groups {
        let members = members_of(&s.findings, g);
        // Every match needs a finding of the group of the file's class: its oracle, kind (line
        // numbers aside), memory type and stream layout; a cause or a design shared alone
        // says too little (one fault or one model design shows in many oracles and setups).
        let of_class = |c: &CorpusEntry| members.iter().any(|f| same_class(f, &c.repro));
        let by_cause = corpus
            .iter()
            .find(|c| c.cause == g.group.cause && of_class(c));
        let by_signature = || {
            corpus.iter().find(|c| {
                members.iter().any(|f| {
                    same_class(f, &c.repro)
                        && f.failing_op()
                            == c.repro
                                .trace
                                .ops
                                .get(c.repro.step.max(1) - 1)
                                .map_or("setup", |o| o.name())
                })
            })
        };
        // The model's design (the native model without faults shows both): the same
        // violation of the same oracle on the same memory type and layout, whatever trace
        // reached it.
        let by_design = || {
            corpus.iter().find(|c| {
                matches!(c.cause, Cause::NativeModel { .. })
                    && matches!(g.group.cause, Cause::NativeModel { .. })
                    && of_class(c)
            })
        };
        let (hit, how) = match (by_cause, by_design()) {
            (Some(c), _) => (Some(c), "cause"),
            (None, Some(c)) => (Some(c), "design"),
            (None, None) => (by_signature(), "signature"),
        };
        let Some(c) = hit else {
            if let Some(engine) = engine {
                let seen = seen_of(&s.findings, plan, g);
                decide_by_decision(g, &seen, decisions, engine);
            }
            continue;
        };
        matched.insert(c.file.clone());
        g.decision = c.repro.decision.as_ref().map(Decision::note);
        g.matched_by = how.into();
        let at = corpus.iter().position(|x| x.file == c.file).unwrap_or(0);
        g.class = if holds_here[at] {
            GroupClass::Regressed {
                file: c.file.clone(),
            }
        } else {
            GroupClass::Known {
                file: c.file.clone(),
            }
        };
    }
    s.fixed.clear();
    for c in corpus.iter().filter(|c| !matched.contains(&c.file)) {
        let Some(expect) = expectation_for(&c.repro, s).filter(|t| t.expect == Expect::Fails)
        else {
            continue;
        };
        // Reached: an entry that ran, on the file's setup, and judged its oracle.
        let reached = plan.iter().find(|e| {
            e.domain.setup == c.repro.trace.setup
                && s.entries.iter().any(|o| {
                    o.id == e.id
                        && o.oracles
                            .get(&c.repro.oracle)
                            .is_some_and(|st| st.checked > 0)
                })
        });
        let Some(entry) = reached else {
            continue;
        };
        if replay_until.is_some_and(|t| Instant::now() >= t) {
            break;
        }
        if let Status::Fixed(detail) = check(&c.repro, expect).status {
            s.fixed.push(FixedFinding {
                file: c.file.clone(),
                oracle: c.repro.oracle,
                entry: entry.id.clone(),
                detail,
            });
        }
    }
}

/// Whether a new group's C program is compiled and run on `target` ([`write_new_groups`]): on
/// a llama.cpp target, which a job then needs a C compiler for.
pub fn checks_programs(target: &TargetSpec) -> bool {
    TargetKind::of_label(&target.name) == Some(TargetKind::Llama)
}

/// Runs a new group's `program` (in `language`) on `runs_on` where it is a real engine's: a C
/// program compiled against a llama.cpp pin with the tiny model of the setup's architecture,
/// a Python program with an mlx-lm version's environment; `None` on the models of a cache
/// (no engine to run it on) or when it cannot be run.
fn check_program(
    language: Language,
    program: &str,
    runs_on: &TargetSpec,
    arch: crate::base::config::Arch,
) -> Result<Option<CheckedProgram>, Error> {
    let checked = |status: i32| CheckedProgram {
        pin: runs_on.name.clone(),
        status,
    };
    Ok(match (language, runs_on.kind()?) {
        (Language::C, TargetKind::Llama) => {
            let model = crate::model::tiny::try_arch_model_path(arch)
                .map_err(|e| Error::harness(format!("tiny model: {e:#}")))?;
            compile_and_run(program, &runs_on.name, &model)
                .ok()
                .map(|run| checked(run.shell_status()))
        }
        (Language::Python, TargetKind::Mlx) => {
            crate::outputs::py_repro::run_program(program, &runs_on.name)
                .ok()
                .map(|run| checked(run.code.unwrap_or(128 + run.signal.unwrap_or(0))))
        }
        (
            Language::C | Language::Python,
            TargetKind::Native
            | TargetKind::NativeTensors
            | TargetKind::PythonRef
            | TargetKind::Llama
            | TargetKind::Mlx,
        ) => None,
    })
}

/// A group's representative as a repro file, and the target it runs on: the side it fails on
/// (under a configuration pair, the target with the entry's configuration for that side's own
/// crash; beside the native model, the model for its own crash), expected to fail there, the
/// native model as the second side of a pair oracle judged against it. `findings` are the
/// hunt's, `target` the hunt's target; `date` is the file's `since`.
pub(crate) fn representative_repro(
    findings: &[HuntFinding],
    plan: &[PlanEntry],
    target: &TargetSpec,
    g: &HuntGroup,
    date: &str,
) -> Result<(Repro, TargetSpec), Error> {
    let hf = &findings[g.group.representative - 1];
    let f = &hf.finding;
    let pairing = plan
        .iter()
        .find(|e| e.id == hf.entry)
        .map_or(Pairing::Alone, |e| e.pairing.clone());
    let is_pair = Registry::builtin()
        .get(f.oracle)
        .is_some_and(|o| o.reads() == Reads::Pair);
    let vs = match (&pairing, is_pair) {
        (Pairing::Native, true) => Some(TargetSpec::new("native", &[])),
        _ => None,
    };
    // A step oracle's violation on the second side (its own crash, `Judge::label_of`) is
    // that side's alone: under a configuration pair, the target with the entry's
    // configuration (the repro's setup carries it, as `n_ubatch=1` of
    // `rollback~n_ubatch=1`); against the native model, the model.
    let on_second =
        !is_pair && f.target != TargetExpectation::new(target, None, Expect::Holds).label();
    let mut f = f.clone();
    let runs_on = match (&pairing, on_second) {
        (Pairing::Config { config }, true) => {
            f.trace.setup = f
                .trace
                .setup
                .with_config(config)
                .map_err(|e| Error::harness(format!("entry {}: {e}", hf.entry)))?;
            target.clone()
        }
        (Pairing::Native, true) => TargetSpec::new("native", &[]),
        _ => target.clone(),
    };
    let mut expectation = TargetExpectation::new(&runs_on, vs.as_ref(), Expect::Fails);
    if let (Pairing::Config { config }, true) = (&pairing, is_pair) {
        expectation.vs_config = Some(config.clone());
    }
    let mut repro = Repro::from_finding(&f, date, vec![expectation], None);
    repro.postmortem = format!(
        "Found by kvaudit hunt (entry {}); root cause: {}.",
        hf.entry,
        g.group.cause.describe_with(&hf.finding.trace)
    );
    Ok((repro, runs_on))
}

/// Writes each new group's files into `dir/new/` (a repro file, its program and bug report
/// draft in its engine's language, its picture where `explain` applies) and records their
/// names in the group, and what was not written with why. The program is run on a real
/// engine's target until `check_until`; after it, written unchecked. `date` is the repro
/// files' `since`.
pub fn write_new_groups(
    s: &mut HuntSummary,
    plan: &[PlanEntry],
    dir: &Path,
    date: &str,
    check_until: Option<Instant>,
) -> Result<(), Error> {
    let new_dir = dir.join("new");
    let target = TargetSpec::new(&s.target, &s.faults);
    let mut used: BTreeSet<String> = BTreeSet::new();
    let findings = s.findings.clone();
    for g in s.groups.iter_mut().filter(|g| g.class == GroupClass::New) {
        let (repro, runs_on) = representative_repro(&findings, plan, &target, g, date)?;
        let f = &findings[g.group.representative - 1].finding;
        let base = safe_file_name(&repro.file_name());
        let stem0 = base.trim_end_matches(".json").to_string();
        let mut stem = stem0.clone();
        let mut k = 2;
        while !used.insert(stem.clone()) {
            stem = format!("{stem0}_{k}");
            k += 1;
        }
        let path = |ext: &str| -> (PathBuf, String) {
            let name = format!("new/{stem}.{ext}");
            (dir.join(&name), name)
        };
        let (json, name) = path("json");
        write_output(&json, &repro.to_text())?;
        g.files.push(name);
        let engine = runs_on.kind()?.engine();
        let language = Language::of_engine(engine);
        // The program's check and the picture run the target: both only while the budget
        // lasts.
        let in_time = check_until.map_or(true, |t| Instant::now() < t);
        match language.program(&repro) {
            Err(e) => g
                .files
                .push(format!("(no {} program: {})", language.name(), e.message)),
            Ok(p) => {
                let checked = if in_time {
                    check_program(language, &p, &runs_on, f.trace.setup.arch)?
                } else {
                    None
                };
                let (program, name) = path(language.extension());
                write_output(&program, &p)?;
                g.files.push(name);
                let (md, name) = path("md");
                write_output(&md, &language.bug_report(&repro, &p, checked.as_ref()))?;
                g.files.push(name);
            }
        }
        // Off llama.cpp the picture runs a model of its cache: drawn whatever the clock says.
        let picture = match no_picture(engine) {
            Some(why) => {
                g.files.push(format!("(no picture: {why})"));
                None
            }
            None => (in_time || !checks_programs(&runs_on))
                .then(|| explain_repro(&repro, &runs_on).ok())
                .flatten(),
        };
        if let Some(picture) = picture {
            let (svg, name) = path("svg");
            write_output(&svg, &to_svg(&picture))?;
            g.files.push(name);
        }
    }
    let _ = std::fs::create_dir_all(&new_dir);
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::records::decision::DecisionKind;
    use crate::records::finding::Finding;
    use crate::records::group::FindingGroup;
    use crate::records::hunt::{Budget, HuntFinding, HuntGroup};
    use crate::records::report::Shard;

    /// A summary of one group of one finding: `file`'s finding with its setup changed by
    /// `config`, caused by the native model's design.
    pub(crate) fn summary_of(repro: &Repro, config: &str) -> HuntSummary {
        let mut trace = repro.trace.clone();
        trace.setup = trace.setup.with_config(config).unwrap();
        let finding = Finding {
            oracle: repro.oracle,
            kind: repro.kind.clone(),
            target: "llama.cpp@0.1.161".into(),
            depth: trace.ops.len() as u32,
            trial_index: 0,
            step: repro.step,
            seq: repro.seq,
            trace,
            observed: repro.observed.clone(),
            expected: repro.expected.clone(),
        };
        HuntSummary {
            kvaudit: String::new(),
            target: "llama.cpp@0.1.161".into(),
            faults: Vec::new(),
            budget: Budget::Trials(1),
            seed: 1,
            shard: Shard::WHOLE,
            plan: Vec::new(),
            only: Vec::new(),
            unsupported: Vec::new(),
            entries: Vec::new(),
            skipped: Vec::new(),
            findings: vec![HuntFinding {
                memory: finding.trace.setup.arch.memory(),
                finding,
                entry: "seed".into(),
                found_at_s: 0.0,
                shrink_stopped_after: None,
            }],
            groups: vec![HuntGroup {
                group: FindingGroup {
                    cause: Cause::NativeModel {
                        shape: "another trace".into(),
                    },
                    oracles: vec![repro.oracle],
                    representative: 1,
                    findings: vec![1],
                },
                memory: Vec::new(),
                entries: Vec::new(),
                class: GroupClass::New,
                matched_by: String::new(),
                first_violation_s: 0.0,
                decision: None,
                by_fix: None,
                files: Vec::new(),
            }],
            fixed: Vec::new(),
            fix_replays: None,
            elapsed_s: 0.0,
            incomplete: false,
            code: None,
            code_parts: Default::default(),
            code_lines: None,
            corpus: None,
            failed: None,
        }
    }

    #[test]
    fn a_corpus_file_of_another_engine_makes_no_group_known() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpora");
        let file = "contract_streams_seq_keep_leaves_other_streams.json";
        let repro = Repro::load(&dir.join(file)).unwrap();
        let corpus_of = |repro: Repro| {
            vec![CorpusEntry {
                file: file.into(),
                repro,
                cause: Cause::NativeModel {
                    shape: "the file's trace".into(),
                },
            }]
        };
        // The same file recorded on mlx-lm: its oracle, kind, trace and cause, another engine.
        let mut on_mlx = repro.clone();
        for t in &mut on_mlx.targets {
            t.target = "mlx-lm@0.32.2".into();
            t.vs = None;
        }
        let mut s = summary_of(&repro, "");
        classify(&mut s, &corpus_of(on_mlx.clone()), &[], &[], None);
        assert_eq!(s.groups[0].class, GroupClass::New);
        // An mlx-lm hunt's group against the llama.cpp file, and against the mlx-lm one.
        let mut s = summary_of(&repro, "");
        s.target = "mlx-lm@0.32.2".into();
        classify(&mut s, &corpus_of(repro.clone()), &[], &[], None);
        assert_eq!(s.groups[0].class, GroupClass::New);
        classify(&mut s, &corpus_of(on_mlx), &[], &[], None);
        assert_eq!(s.groups[0].class, GroupClass::Known { file: file.into() });
    }

    #[test]
    fn a_decision_decides_only_what_no_file_holds_and_the_summary_says_what_is_broken() {
        let corpus = Corpus::built_in().unwrap();
        let file = "i1_recurrent_seq_add_below_zero.json";
        let (_, repro) = corpus.files.iter().find(|(f, _)| f == file).unwrap();
        let entry = |repro: &Repro| CorpusEntry {
            file: file.into(),
            repro: repro.clone(),
            cause: Cause::NativeModel {
                shape: "the file's trace".into(),
            },
        };
        let decisions = decision_entries(&corpus);
        // The file's own class: known by the file, with its decision (a question) noted.
        let mut s = summary_of(repro, "");
        classify(&mut s, &[entry(repro)], &decisions, &[], None);
        assert_eq!(s.groups[0].class, GroupClass::Known { file: file.into() });
        assert_eq!(s.groups[0].decision.as_ref().unwrap().root_cause, "Q4");
        // On hybrid memory no file is of its class: its decision's class decides it, and
        // without the decisions it is new.
        let mut s = summary_of(repro, "arch=jamba");
        classify(&mut s, &[entry(repro)], &[], &[], None);
        assert_eq!(s.groups[0].class, GroupClass::New);
        classify(&mut s, &[entry(repro)], &decisions, &[], None);
        assert_eq!(
            s.groups[0].class,
            GroupClass::Decided {
                decision: DecisionKind::Question,
                root_cause: "Q4".into(),
                evidence: file.into(),
            }
        );
        assert_eq!(s.failing_groups(), 0, "a decided group fails no hunt");
        // What is broken: a new group first, then the decided question.
        let mut new = s.groups[0].clone();
        new.class = GroupClass::New;
        new.decision = None;
        new.first_violation_s = 2.5;
        s.groups.push(new);
        let lines = s.what_is_broken();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].starts_with("new: group 2: I1 "), "{lines:?}");
        assert!(lines[0].ends_with("first violation at 2.5 s"), "{lines:?}");
        assert!(lines[1].starts_with("question Q4: "), "{lines:?}");
        assert!(s
            .to_markdown()
            .contains("## What is broken\n\n- new: group 2"));
    }

    #[test]
    fn a_design_finding_is_known_only_on_the_files_memory_type_and_layout() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpora");
        let file = "contract_streams_seq_keep_leaves_other_streams.json";
        let repro = Repro::load(&dir.join(file)).unwrap();
        let corpus = vec![CorpusEntry {
            file: file.into(),
            repro: repro.clone(),
            cause: Cause::NativeModel {
                shape: "the file's trace".into(),
            },
        }];
        // The file's own class (one stream per sequence, kv memory): known by design.
        let mut same = summary_of(&repro, "");
        classify(&mut same, &corpus, &[], &[], None);
        assert_eq!(
            same.groups[0].class,
            GroupClass::Known { file: file.into() }
        );
        assert_eq!(same.groups[0].matched_by, "design");
        // The same oracle and kind in a unified cache, or on iSWA memory: not the file's.
        for other in ["kv_unified=true", "arch=gemma2"] {
            let mut s = summary_of(&repro, other);
            classify(&mut s, &corpus, &[], &[], None);
            assert_eq!(s.groups[0].class, GroupClass::New, "{other}");
        }
    }
}
