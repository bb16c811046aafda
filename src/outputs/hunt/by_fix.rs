//! Identity by fix: a hunt group no corpus file matched is the root cause whose remedy makes its
//! trace hold.
//!
//! A *remedy* is a change of the hunt's target that takes one root cause out: a fix of the
//! corpus (`corpora/fixes/NAME.patch`, the pin rebuilt as `llama.cpp@PIN+fix:NAME`) or, on a
//! target with injected faults (`native[a][b]`), one fault removed (`native[b]`). A group is
//! explained by a remedy when its representative's trace, replayed as the hunt found it (the
//! repro file `write_new_groups` would write, `representative_repro`), fails on the target and
//! holds with the remedy: the replay machinery's "fixed" (`repro::judge_expectation`), so a
//! crash group only when the remedied build does not crash, and another oracle's group not when
//! the remedied build crashes before that oracle's step. Every remedy is replayed, the likely
//! ones first (those whose corpus files share the group's memory type, oracle and failing op),
//! so a group two remedies explain names both.
//!
//! The class that follows: explained by a remedy whose root cause has files in the corpus
//! (a fix's `files` and `also_fixes`; for a fault, the files whose native cause is that fault,
//! or that record a failure under that fault alone) is *known by fix*; explained only by
//! remedies of root causes the corpus does not hold, *new*, with the evidence. Groups that end
//! with the same remedies explaining them are one group (one root cause reached through several
//! classes or shapes): merged into the largest, whose representative and evidence stay.
//!
//! What cannot be told is said, per group and in the summary: a source tree (fixes apply to a
//! pin's sources), a fix whose build is not in the cache (a hunt never builds one: minutes), a
//! fix not made for the pin, the hunt's deadline reached (replays are milliseconds, but a hunt
//! of 45 new groups and 19 fixes runs about 900). Groups a corpus file matched stay as they are:
//! class and native cause are the cheaper evidence.

use std::collections::BTreeSet;
use std::time::Instant;

use crate::oracles::OracleId;
use crate::outputs::fixes::Fix;
use crate::outputs::repro::decision::Decision;
use crate::outputs::repro::{judge_entry, judge_expectation, Repro, Status};
use crate::records::hunt::{
    ByFix, FixEvidence, FixReplays, GroupClass, HuntGroup, HuntSummary, PlanEntry,
};
use crate::targets::registry::{TargetKind, TargetSpec};

use super::{
    decided_by, engine_files, members_of, representative_repro, seen_of, CorpusEntry, DecisionEntry,
};
use crate::targets::registry::Engine;

mod remedies;

use remedies::{drop_what_a_remedy_needs_explains, nearness};
pub use remedies::{remedies_for, Remedy};

/// The step a run of `repro`'s trace fails at: its oracle's first violation, or a crash that
/// ended the run before it.
fn failing_step(repro: &Repro, j: &crate::running::judge::RunJudgement) -> Option<usize> {
    j.first(repro.oracle)
        .or_else(|| j.first(OracleId::CRASH))
        .map(|v| v.step)
}

/// What replaying one group found, and whether the deadline stopped it.
struct Replayed {
    by_fix: ByFix,
    cut_short: bool,
}

/// Replays the group `g` with each remedy (likely ones first) until `until`; `replays` counts
/// the runs.
fn replay_group(
    s: &HuntSummary,
    plan: &[PlanEntry],
    g: &HuntGroup,
    (remedies, corpus): (&[Remedy], &[&CorpusEntry]),
    until: Option<Instant>,
    replays: &mut usize,
) -> Replayed {
    let target = TargetSpec::new(&s.target, &s.faults);
    let late = || until.is_some_and(|t| Instant::now() >= t);
    let said = |why: String, cut_short: bool| Replayed {
        by_fix: ByFix {
            not_told: vec![why],
            ..ByFix::default()
        },
        cut_short,
    };
    let cannot_tell = |why: String| said(format!("cannot tell by fix: {why}"), false);
    if late() {
        return said("not replayed: the hunt's deadline had passed".into(), true);
    }
    // The date is the file's `since`, which a replay does not read.
    let (repro, _) = match representative_repro(&s.findings, plan, &target, g, "2000-01-01") {
        Ok(r) => r,
        Err(e) => return cannot_tell(e.message),
    };
    let expectation = &repro.targets[0];
    if remedies
        .iter()
        .all(|r| r.applied(expectation, &target).is_none())
    {
        return cannot_tell(format!(
            "it fails on {}, which no remedy changes",
            expectation.label()
        ));
    }
    // Twice on the pin, and twice with a remedy before it counts (below): a trace whose
    // outcome varies between runs (a corrupted heap, an over-read) would otherwise be "made to
    // hold" by whatever remedy its lucky run came with.
    *replays += 2;
    let fails_at = |_| {
        judge_entry(&repro, expectation)
            .ok()
            .and_then(|j| failing_step(&repro, &j))
    };
    let (Some(fails_at), Some(_)) = (fails_at(0), fails_at(1)) else {
        return cannot_tell(format!(
            "its trace does not fail again on {} (two replays)",
            expectation.label()
        ));
    };
    let members = members_of(&s.findings, g);
    let mut order: Vec<&Remedy> = remedies.iter().collect();
    order.sort_by_key(|r| std::cmp::Reverse(nearness(r, corpus, &members)));
    let mut by_fix = ByFix::default();
    let mut cut_short = false;
    for (k, remedy) in order.iter().enumerate() {
        if late() {
            by_fix.not_told.push(format!(
                "cut short at the hunt's deadline after {k} of {} remedies",
                order.len()
            ));
            cut_short = true;
            break;
        }
        let Some(on) = remedy.applied(expectation, &target) else {
            continue;
        };
        by_fix.replayed += 1;
        let holds = || {
            judge_entry(&repro, &on)
                .is_ok_and(|j| matches!(judge_expectation(&repro, &on, &j), Status::Fixed(_)))
        };
        *replays += 1;
        let mut held = holds();
        if held {
            *replays += 1;
            held = holds();
        }
        if held {
            by_fix.explained.push(FixEvidence {
                remedy: remedy.name.clone(),
                root_cause: remedy.root_cause.clone(),
                replayed_on: remedy.label(),
                fails_at,
                files: remedy.files.clone(),
            });
        }
    }
    drop_what_a_remedy_needs_explains(&mut by_fix.explained, remedies);
    Replayed { by_fix, cut_short }
}

/// The class evidence `by_fix` gives: known by the remedies of root causes the corpus holds,
/// else new.
fn class_of(by_fix: &ByFix) -> GroupClass {
    let known: Vec<String> = by_fix
        .explained
        .iter()
        .filter(|e| !e.files.is_empty())
        .map(|e| e.remedy.clone())
        .collect();
    if known.is_empty() {
        GroupClass::New
    } else {
        GroupClass::KnownByFix { remedies: known }
    }
}

/// Merges the groups the same remedies explain into the first of them (the largest: groups are
/// ordered by size): its representative and evidence stay, the findings, oracles, memory
/// types and entries join, the first violation is the earliest.
fn merge_by_remedies(groups: &mut Vec<HuntGroup>) {
    // Only groups whose class is by fix: a group a file or decision matched keeps its match.
    let key = |g: &HuntGroup| -> BTreeSet<String> {
        if !matches!(g.class, GroupClass::New | GroupClass::KnownByFix { .. }) {
            return BTreeSet::new();
        }
        g.by_fix
            .iter()
            .flat_map(|b| b.explained.iter().map(|e| e.remedy.clone()))
            .collect()
    };
    let mut merged: Vec<HuntGroup> = Vec::with_capacity(groups.len());
    for g in groups.drain(..) {
        let k = key(&g);
        let into = merged
            .iter_mut()
            .find(|m| !k.is_empty() && m.by_fix.is_some() && key(m) == k);
        let Some(m) = into else {
            merged.push(g);
            continue;
        };
        m.group.findings.extend(g.group.findings);
        m.group.findings.sort_unstable();
        for o in g.group.oracles {
            if !m.group.oracles.contains(&o) {
                m.group.oracles.push(o);
            }
        }
        m.group.oracles.sort();
        for t in g.memory {
            if !m.memory.contains(&t) {
                m.memory.push(t);
            }
        }
        m.memory.sort();
        for e in g.entries {
            if !m.entries.contains(&e) {
                m.entries.push(e);
            }
        }
        m.first_violation_s = m.first_violation_s.min(g.first_violation_s);
        if let Some(b) = m.by_fix.as_mut() {
            b.merged += 1 + g.by_fix.map_or(0, |x| x.merged);
        }
    }
    *groups = merged;
}

/// Identity by fix over the groups of `s` still new after the corpus match (`classify`):
/// each replayed with the remedies of its target (the `fixes` of the corpus, its faults)
/// until `replay_until`, classified by what holds, and those the same remedies explain merged.
/// Records what it could not try in `s.fix_replays`.
pub fn explain_by_fix(
    s: &mut HuntSummary,
    (corpus, decisions): (&[CorpusEntry], &[DecisionEntry]),
    fixes: &[Fix],
    plan: &[PlanEntry],
    replay_until: Option<Instant>,
) {
    let corpus = engine_files(corpus, &s.target);
    let target = TargetSpec::new(&s.target, &s.faults);
    let (remedies, unavailable) = remedies_for(&target, fixes, &corpus);
    if remedies.is_empty() && unavailable.is_empty() {
        s.fix_replays = None;
        return;
    }
    let (mut replays, mut groups, mut cut_short) = (0, 0, false);
    let (mut checked, mut contradicted) = (0, 0);
    let mut redecided: Vec<(usize, &DecisionEntry)> = Vec::new();
    let engine = TargetKind::of_label(&s.target).map_or(Engine::LlamaCpp, TargetKind::engine);
    let mut by_group: Vec<Option<(ByFix, bool)>> = Vec::with_capacity(s.groups.len());
    for g in &s.groups {
        if g.class != GroupClass::New {
            // A class match whose root cause has a remedy here is checked by it: the fix of
            // the root cause a file or decision names must make the group's trace hold.
            let Some(expected) = expected_remedy(&g.class, &remedies, &corpus) else {
                by_group.push(None);
                continue;
            };
            checked += 1;
            // With the remedies it is built on, which must not explain the group alone.
            let one: Vec<Remedy> = remedies
                .iter()
                .filter(|r| r.name == expected.name || expected.with.contains(&r.name))
                .cloned()
                .collect();
            let r = replay_group(s, plan, g, (&one, &corpus), replay_until, &mut replays);
            cut_short |= r.cut_short;
            if !r.by_fix.explained.is_empty() || r.by_fix.replayed == 0 {
                // Confirmed, or it could not be told (said in its evidence).
                by_group.push(Some((r.by_fix, false)));
                continue;
            }
            contradicted += 1;
            let r = replay_group(s, plan, g, (&remedies, &corpus), replay_until, &mut replays);
            cut_short |= r.cut_short;
            let mut by_fix = r.by_fix;
            by_fix.contradicts = Some(format!(
                "its class match is not its root cause: {} leaves its trace failing",
                expected.name
            ));
            // No remedy shows its root cause: the next decided class that covers it and that
            // no remedy here contradicts.
            let other = (class_of(&by_fix) == GroupClass::New)
                .then(|| {
                    let seen = seen_of(&s.findings, plan, g);
                    decisions.iter().find(|d| {
                        d.decision.root_cause != expected.root_cause.clone().unwrap_or_default()
                            && Some(&d.decision.root_cause)
                                != root_cause_of(&g.class, &corpus).as_ref()
                            && !remedies
                                .iter()
                                .any(|r| r.root_cause.as_ref() == Some(&d.decision.root_cause))
                            && d.decision
                                .class
                                .as_ref()
                                .is_some_and(|m| seen.iter().any(|&f| m.matches(f, engine)))
                    })
                })
                .flatten();
            if let Some(d) = other {
                by_fix.contradicts = by_fix.contradicts.map(|c| {
                    format!(
                        "{c}; decided as {} by {} instead",
                        d.decision.root_cause, d.evidence
                    )
                });
                redecided.push((by_group.len(), d));
            }
            by_group.push(Some((by_fix, true)));
            continue;
        }
        groups += 1;
        if remedies.is_empty() {
            // Nothing to replay with: the group says why (a source tree, no fix built).
            let by_fix = ByFix {
                not_told: unavailable.clone(),
                ..ByFix::default()
            };
            by_group.push(Some((by_fix, true)));
            continue;
        }
        let r = replay_group(s, plan, g, (&remedies, &corpus), replay_until, &mut replays);
        cut_short |= r.cut_short;
        by_group.push(Some((r.by_fix, true)));
    }
    for (at, d) in redecided {
        decided_by(&mut s.groups[at], d);
    }
    for (g, by_fix) in s.groups.iter_mut().zip(by_group) {
        let Some((by_fix, reclassify)) = by_fix else {
            continue;
        };
        let class = class_of(&by_fix);
        // A new group takes what its replays say; a contradicted class match only a root
        // cause a remedy shows (else it stays matched, flagged).
        if reclassify && (g.class == GroupClass::New || class != GroupClass::New) {
            g.class = class;
            // A group known by fix is of the root cause its remedy's files are: their decision
            // (the summary's "what is broken" lists it under that root cause).
            g.decision = by_fix
                .explained
                .iter()
                .flat_map(|e| &e.files)
                .find_map(|f| corpus.iter().find(|c| &c.file == f))
                .and_then(|c| c.repro.decision.as_ref().map(Decision::note));
        }
        g.by_fix = Some(by_fix);
    }
    merge_by_remedies(&mut s.groups);
    s.fix_replays = Some(FixReplays {
        remedies: remedies.iter().map(|r| r.name.clone()).collect(),
        groups,
        replays,
        unavailable,
        cut_short,
        class_matches_checked: checked,
        class_matches_contradicted: contradicted,
    });
}

/// The root cause a class match names: its file's decision's, or the decision's.
fn root_cause_of(class: &GroupClass, corpus: &[&CorpusEntry]) -> Option<String> {
    match class {
        GroupClass::Known { file } | GroupClass::Regressed { file } => corpus
            .iter()
            .find(|c| &c.file == file)
            .and_then(|c| c.repro.decision.as_ref())
            .map(|d| d.root_cause.clone()),
        GroupClass::Decided { root_cause, .. } => Some(root_cause.clone()),
        GroupClass::KnownByFix { .. } | GroupClass::New => None,
    }
}

/// The remedy of the root cause a class match names: for a corpus file, the remedy whose files
/// hold it (a fix, a fault removed); for a decision, the fix of its root cause. None when no such remedy is here.
fn expected_remedy<'a>(
    class: &GroupClass,
    remedies: &'a [Remedy],
    corpus: &[&CorpusEntry],
) -> Option<&'a Remedy> {
    match class {
        GroupClass::Known { file } => {
            if let Some(r) = remedies.iter().find(|r| r.files.contains(file)) {
                return Some(r);
            }
        }
        GroupClass::Decided { .. } => {}
        // A regressed group holds on the pin as its file records: nothing for a fix to show.
        GroupClass::Regressed { .. } | GroupClass::KnownByFix { .. } | GroupClass::New => {
            return None
        }
    }
    let root_cause = root_cause_of(class, corpus)?;
    remedies
        .iter()
        .find(|r| r.root_cause.as_deref() == Some(root_cause.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outputs::repro::{Expect, TargetExpectation};
    use crate::records::group::Cause;

    #[test]
    fn a_remedy_built_on_another_does_not_claim_what_the_other_explains_alone() {
        let remedy = |name: &str, with: &[&str]| Remedy {
            name: name.into(),
            root_cause: None,
            target: "llama.cpp@0.1.161".into(),
            faults: Vec::new(),
            files: vec!["f.json".into()],
            with: with.iter().map(|w| w.to_string()).collect(),
        };
        let remedies = [
            remedy("fix a", &[]),
            remedy("fix b", &["fix a"]),
            remedy("fix c", &[]),
        ];
        let evidence = |name: &str| FixEvidence {
            remedy: name.into(),
            root_cause: None,
            replayed_on: String::new(),
            fails_at: 1,
            files: vec!["f.json".into()],
        };
        let names = |v: &[FixEvidence]| v.iter().map(|e| e.remedy.clone()).collect::<Vec<_>>();
        // b is built on a: where a alone explains the group, the group is a's.
        let mut both = vec![evidence("fix a"), evidence("fix b")];
        drop_what_a_remedy_needs_explains(&mut both, &remedies);
        assert_eq!(names(&both), ["fix a"]);
        // Where a alone does not, b's replay is the evidence.
        let mut b_only = vec![evidence("fix b"), evidence("fix c")];
        drop_what_a_remedy_needs_explains(&mut b_only, &remedies);
        assert_eq!(names(&b_only), ["fix b", "fix c"]);
        // Where a is no remedy here (its fix left out of the corpus), b's replay cannot tell
        // the two apart.
        let mut without_a = vec![evidence("fix b")];
        drop_what_a_remedy_needs_explains(&mut without_a, &remedies[1..]);
        assert!(without_a.is_empty());
    }
    use crate::outputs::corpus::Corpus;
    use crate::outputs::hunt::tests::summary_of;
    use crate::outputs::hunt::{classify, corpus_entries};

    fn corpus_file(name: &str) -> (String, Repro) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpora");
        (name.to_string(), Repro::load(&dir.join(name)).unwrap())
    }

    /// The corpus of `files` (and no fix) as the hunt `s` reads it.
    fn corpus_of(files: &[&str], s: &HuntSummary) -> Vec<CorpusEntry> {
        let corpus = Corpus {
            folder: None,
            files: files.iter().map(|f| corpus_file(f)).collect(),
            decisions: Vec::new(),
            fixes: Vec::new(),
        };
        corpus_entries(&corpus, s)
    }

    /// A hunt of `native` with `faults` that found the refcount fault's I1 finding of
    /// `i1_seq_cp_twice_stale_max.json` (stale positions after two copies, at step 3), in a
    /// group of its own.
    fn refcount_hunt(faults: &[&str]) -> HuntSummary {
        let (_, repro) = corpus_file("i1_seq_cp_twice_stale_max.json");
        let mut s = summary_of(&repro, "");
        s.target = "native".into();
        s.faults = faults.iter().map(|f| f.to_string()).collect();
        let label =
            TargetExpectation::new(&TargetSpec::new("native", &s.faults), None, Expect::Fails)
                .label();
        s.findings[0].finding.target = label;
        s
    }

    #[test]
    fn a_group_no_file_matches_is_known_by_the_fault_whose_removal_makes_it_hold() {
        let mut s = refcount_hunt(&["refcount", "swa_window_off_by_one"]);
        // The refcount fault's I2 file: of another class (oracle), so no file matches.
        let corpus = corpus_of(&["i2_interior_seq_rm_hole.json"], &s);
        classify(&mut s, &corpus, &[], &[], None);
        assert_eq!(s.groups[0].class, GroupClass::New);
        explain_by_fix(&mut s, (&corpus, &[]), &[], &[], None);
        let g = &s.groups[0];
        assert_eq!(
            g.class,
            GroupClass::KnownByFix {
                remedies: vec!["fault refcount removed".into()]
            },
            "{:?} {:?}",
            g.by_fix,
            s.fix_replays
        );
        // The window fault's removal leaves it failing: only refcount's explains it.
        let by_fix = g.by_fix.as_ref().unwrap();
        assert_eq!(by_fix.replayed, 2);
        assert_eq!(by_fix.explained.len(), 1);
        let e = &by_fix.explained[0];
        assert_eq!(
            (e.fails_at, e.replayed_on.as_str()),
            (3, "native[swa_window_off_by_one]")
        );
        assert_eq!(e.files, vec!["i2_interior_seq_rm_hole.json".to_string()]);
        assert!(s.to_markdown().contains(
            "known by fault refcount removed: replayed on native\\[swa\\_window\\_off\\_by\\_one\\], fails at step 3 -&gt; holds"
        ));
        let replays = s.fix_replays.as_ref().unwrap();
        // Twice on the target, twice with the remedy that holds, once with the one that fails.
        assert_eq!(
            (replays.groups, replays.replays, replays.cut_short),
            (1, 5, false)
        );
    }

    #[test]
    fn a_class_match_its_remedy_confirms_keeps_its_file_with_the_evidence() {
        let mut s = refcount_hunt(&["refcount", "swa_window_off_by_one"]);
        let corpus = corpus_of(&["i1_seq_cp_twice_stale_max.json"], &s);
        classify(&mut s, &corpus, &[], &[], None);
        let file = GroupClass::Known {
            file: "i1_seq_cp_twice_stale_max.json".into(),
        };
        assert_eq!(s.groups[0].class, file);
        explain_by_fix(&mut s, (&corpus, &[]), &[], &[], None);
        let g = &s.groups[0];
        assert_eq!(g.class, file);
        let by_fix = g.by_fix.as_ref().unwrap();
        // Only the file's own remedy is replayed, and it holds.
        assert_eq!(by_fix.replayed, 1);
        assert_eq!(by_fix.explained[0].remedy, "fault refcount removed");
        assert_eq!(by_fix.contradicts, None);
        let replays = s.fix_replays.as_ref().unwrap();
        assert_eq!(
            (
                replays.class_matches_checked,
                replays.class_matches_contradicted
            ),
            (1, 0)
        );
    }

    #[test]
    fn a_class_match_its_remedy_leaves_failing_is_the_root_cause_another_remedy_shows() {
        let mut s = refcount_hunt(&["refcount", "swa_window_off_by_one"]);
        let mut corpus = corpus_of(
            &[
                "i2_interior_seq_rm_hole.json",
                "swa_window_full_windowed_cache_evicts_masked_only.json",
            ],
            &s,
        );
        // A class match to a file of the window fault (as if its class were the group's).
        corpus[1].cause = Cause::NativeFault {
            faults: vec!["swa_window_off_by_one".into()],
        };
        s.groups[0].class = GroupClass::Known {
            file: corpus[1].file.clone(),
        };
        explain_by_fix(&mut s, (&corpus, &[]), &[], &[], None);
        let g = &s.groups[0];
        assert_eq!(
            g.class,
            GroupClass::KnownByFix {
                remedies: vec!["fault refcount removed".into()]
            }
        );
        let by_fix = g.by_fix.as_ref().unwrap();
        assert!(by_fix
            .contradicts
            .as_ref()
            .is_some_and(|c| c.contains("fault swa_window_off_by_one removed leaves")));
        assert!(s
            .to_markdown()
            .contains("its class match is not its root cause"));
        let replays = s.fix_replays.as_ref().unwrap();
        assert_eq!(
            (
                replays.class_matches_checked,
                replays.class_matches_contradicted
            ),
            (1, 1)
        );
        // Without a remedy that shows another root cause, the match stays, flagged.
        let mut s = refcount_hunt(&["refcount", "swa_window_off_by_one"]);
        let corpus = vec![corpus.remove(1)];
        s.groups[0].class = GroupClass::Known {
            file: corpus[0].file.clone(),
        };
        explain_by_fix(&mut s, (&corpus, &[]), &[], &[], None);
        let g = &s.groups[0];
        assert_eq!(
            g.class,
            GroupClass::Known {
                file: corpus[0].file.clone()
            }
        );
        assert!(g.by_fix.as_ref().unwrap().contradicts.is_some());
        // A decided class that covers it, of a root cause no remedy here rules out, decides it.
        let mut s = refcount_hunt(&["refcount", "swa_window_off_by_one"]);
        s.groups[0].class = GroupClass::Known {
            file: corpus[0].file.clone(),
        };
        let decision = Decision::parse(
            r#"{"decision": "question", "root_cause": "Q9", "summary": "s",
                "decided": {"pins": ["0.1.161"], "date": "2026-12-07", "by": "a test"},
                "match": {"engine": "llama.cpp", "oracles": ["I1"]}}"#,
        )
        .unwrap();
        let decisions = [DecisionEntry {
            evidence: "decisions/q9.json".into(),
            decision,
        }];
        explain_by_fix(&mut s, (&corpus, &decisions), &[], &[], None);
        let g = &s.groups[0];
        assert!(matches!(&g.class, GroupClass::Decided { root_cause, .. } if root_cause == "Q9"));
        assert!(g
            .by_fix
            .as_ref()
            .unwrap()
            .contradicts
            .as_ref()
            .is_some_and(|c| c.ends_with("decided as Q9 by decisions/q9.json instead")));
    }

    #[test]
    fn a_remedy_of_a_root_cause_the_corpus_lacks_leaves_the_group_new_with_its_evidence() {
        let mut s = refcount_hunt(&["refcount"]);
        let corpus = corpus_of(&[], &s);
        classify(&mut s, &corpus, &[], &[], None);
        explain_by_fix(&mut s, (&corpus, &[]), &[], &[], None);
        let g = &s.groups[0];
        assert_eq!(g.class, GroupClass::New);
        let by_fix = g.by_fix.as_ref().unwrap();
        assert_eq!(by_fix.explained[0].remedy, "fault refcount removed");
        assert!(by_fix
            .describe()
            .contains("no corpus file of its root cause"));
    }

    #[test]
    fn replays_stop_at_the_deadline_and_say_so() {
        let mut s = refcount_hunt(&["refcount"]);
        let corpus = corpus_of(&["i2_interior_seq_rm_hole.json"], &s);
        explain_by_fix(&mut s, (&corpus, &[]), &[], &[], Some(Instant::now()));
        let g = &s.groups[0];
        assert_eq!(g.class, GroupClass::New);
        let by_fix = g.by_fix.as_ref().unwrap();
        assert_eq!(by_fix.replayed, 0);
        assert_eq!(
            by_fix.not_told,
            vec!["not replayed: the hunt's deadline had passed".to_string()]
        );
        let replays = s.fix_replays.as_ref().unwrap();
        assert!(replays.cut_short);
        assert!(s.to_terminal().contains("CUT SHORT at the hunt's deadline"));
    }

    #[test]
    fn a_target_without_remedies_is_not_replayed() {
        // No fault to remove and no fix: nothing is said, the group stays as classified.
        let mut s = refcount_hunt(&[]);
        let corpus = corpus_of(&["i2_interior_seq_rm_hole.json"], &s);
        explain_by_fix(&mut s, (&corpus, &[]), &[], &[], None);
        assert_eq!(
            (s.groups[0].class.clone(), &s.fix_replays),
            (GroupClass::New, &None)
        );
        assert_eq!(s.groups[0].by_fix, None);
    }

    #[test]
    fn groups_the_same_remedy_explains_are_one() {
        let mut s = refcount_hunt(&["refcount"]);
        // A second finding of the same fault, another trace, in a group of its own.
        let (_, other) = corpus_file("i1_seq_cp_twice_seq_rm_stale_max.json");
        let mut f = s.findings[0].clone();
        f.finding.trace = other.trace.clone();
        f.finding.step = other.step;
        f.finding.seq = other.seq;
        f.finding.observed = other.observed.clone();
        f.finding.expected = other.expected.clone();
        f.found_at_s = 0.5;
        s.findings.push(f);
        s.groups[0].entries = vec!["seed".into()];
        let mut g = s.groups[0].clone();
        g.group.representative = 2;
        g.group.findings = vec![2];
        g.entries = vec!["state".into()];
        s.groups.push(g);
        let corpus = corpus_of(&[], &s);
        explain_by_fix(&mut s, (&corpus, &[]), &[], &[], None);
        assert_eq!(s.groups.len(), 1, "{}", s.to_terminal());
        let g = &s.groups[0];
        assert_eq!(g.group.findings, vec![1, 2]);
        assert_eq!(g.by_fix.as_ref().unwrap().merged, 1);
        assert_eq!(g.entries, vec!["seed".to_string(), "state".into()]);
    }

    #[test]
    fn a_source_tree_cannot_be_told_by_fix_and_says_so() {
        // The newest pin's own sources as a developer's tree (found or fetched, not built:
        // nothing here runs it).
        let pins = crate::targets::llama::pins::known_pins().unwrap();
        let info = &pins["0.1.161"];
        let cache = crate::targets::llama::build::cache_root().unwrap();
        let tree = crate::targets::llama::build::locate_or_fetch(info, &cache, false).unwrap();
        let target = TargetSpec::new(&format!("llama.cpp@src:{}", tree.display()), &[]);
        let fixes: Vec<Fix> = Fix::all().unwrap().into_iter().map(|(f, _)| f).collect();
        let (remedies, unavailable) = remedies_for(&target, &fixes, &[]);
        assert!(remedies.is_empty());
        assert_eq!(unavailable.len(), 1);
        assert!(
            unavailable[0].starts_with("cannot tell by fix: fixes apply to a pin's sources"),
            "{unavailable:?}"
        );
        // A new group of such a hunt says it, unreplayed.
        let (_, repro) = corpus_file("contract_streams_seq_keep_leaves_other_streams.json");
        let mut s = summary_of(&repro, "");
        s.target = target.name.clone();
        explain_by_fix(&mut s, (&[], &[]), &fixes, &[], None);
        assert_eq!(s.groups[0].class, GroupClass::New);
        assert_eq!(s.groups[0].by_fix.as_ref().unwrap().not_told, unavailable);
        assert_eq!(s.fix_replays.as_ref().unwrap().replays, 0);
    }

    #[test]
    fn fixes_not_made_for_a_pin_are_said_not_tried() {
        let fixes: Vec<Fix> = Fix::all().unwrap().into_iter().map(|(f, _)| f).collect();
        let old = fixes
            .iter()
            .filter(|f| !f.applies_to.contains(&"0.1.156".to_string()));
        let (remedies, unavailable) =
            remedies_for(&TargetSpec::new("llama.cpp@0.1.156", &[]), &fixes, &[]);
        assert!(remedies.is_empty());
        assert!(
            unavailable[0].starts_with(&format!("{} fix(es) not made for 0.1.156", old.count())),
            "{unavailable:?}"
        );
    }
}
