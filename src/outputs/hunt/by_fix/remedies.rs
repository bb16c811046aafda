//! Remedies: the changes of a hunt's target that each take one root cause out (a fix of the
//! corpus built for the pin, with the fixes it was checked on top of; an injected fault
//! removed), and how near each comes to a group (the order replays try them in).

use std::collections::BTreeSet;

use crate::outputs::fixes::Fix;
use crate::outputs::repro::{Expect, TargetExpectation};
use crate::outputs::versions::is_built;
use crate::records::finding::Finding;
use crate::records::group::Cause;
use crate::records::hunt::FixEvidence;
use crate::targets::llama::pins::Pin;
use crate::targets::registry::{TargetKind, TargetSpec};

use super::super::CorpusEntry;

/// One change of the hunt's target that takes one root cause out.
#[derive(Clone, Debug, PartialEq)]
pub struct Remedy {
    /// `fix NAME` or `fault NAME removed`.
    pub name: String,
    /// The root cause it is for (a fix's `R8`); none for a fault.
    pub root_cause: Option<String>,
    /// The remedied target's name (`llama.cpp@0.1.161+fix:NAME`, `native`).
    pub target: String,
    /// The remedied target's faults.
    pub faults: Vec<String>,
    /// The corpus files of its root cause in the corpus used: known when not empty.
    pub files: Vec<String>,
    /// The remedies applied with it (a fix checked on top of another: `fix NAME` of each of
    /// its `check_on`'s fixes): where one of them explains a group alone, it is that one's.
    pub with: Vec<String>,
}

impl Remedy {
    /// The remedied target's label, as replays name it (`native[b]`).
    pub(super) fn label(&self) -> String {
        TargetExpectation::new(
            &TargetSpec::new(&self.target, &self.faults),
            None,
            Expect::Holds,
        )
        .label()
    }

    /// `expectation` moved onto the remedied target, if it is on the hunt's `target` (a
    /// failure on the second side, the native model's own crash, is not the target's to fix).
    pub(super) fn applied(
        &self,
        expectation: &TargetExpectation,
        target: &TargetSpec,
    ) -> Option<TargetExpectation> {
        (expectation.target == target.name && expectation.faults == target.faults).then(|| {
            TargetExpectation {
                target: self.target.clone(),
                faults: self.faults.clone(),
                ..expectation.clone()
            }
        })
    }
}

/// The remedies of `target`: the fixes of `fixes` made for its pin and built, then each of its
/// faults removed; with a sentence for each kind of remedy that cannot be tried there.
/// `corpus` is the engine's files, whose names tell which root causes the corpus holds.
pub fn remedies_for(
    target: &TargetSpec,
    fixes: &[Fix],
    corpus: &[&CorpusEntry],
) -> (Vec<Remedy>, Vec<String>) {
    let mut remedies = Vec::new();
    let mut unavailable = Vec::new();
    let in_corpus = |file: &String| corpus.iter().any(|c| &c.file == file);
    if TargetKind::of_label(&target.name) == Some(TargetKind::Llama) && !fixes.is_empty() {
        match Pin::parse(&target.name) {
            Err(e) => unavailable.push(format!("cannot tell by fix: {e}")),
            Ok(pin) if pin.tree.is_some() => unavailable.push(format!(
                "cannot tell by fix: fixes apply to a pin's sources, not to the source tree of {} \
                 (apply a fix's patch to the tree and hunt again)",
                target.name
            )),
            Ok(pin) => {
                let (mut not_made, mut not_built) = (Vec::new(), Vec::new());
                for fix in fixes.iter().filter(|f| !pin.fixes.contains(&f.name)) {
                    if !fix.applies_to.contains(&pin.version) {
                        not_made.push(fix.name.clone());
                        continue;
                    }
                    // With what the fix was checked on top of (its `check_on`'s fixes).
                    let mut fixed = pin.clone();
                    fixed.fixes.push(fix.name.clone());
                    let mut with = Vec::new();
                    for before in fix.prerequisites().unwrap_or_default() {
                        if !fixed.fixes.contains(&before) {
                            with.push(format!("fix {before}"));
                            fixed.fixes.push(before);
                        }
                    }
                    fixed.fixes.sort();
                    let label = fixed.label();
                    if !is_built(&label).unwrap_or(false) {
                        not_built.push(label);
                        continue;
                    }
                    let declared = fix.also_fixes.iter().map(|c| &c.file);
                    remedies.push(Remedy {
                        name: format!("fix {}", fix.name),
                        root_cause: Some(fix.root_cause.clone()),
                        target: label,
                        faults: target.faults.clone(),
                        files: fix
                            .files
                            .iter()
                            .chain(declared)
                            .filter(|f| in_corpus(f))
                            .cloned()
                            .collect(),
                        with,
                    });
                }
                if !not_made.is_empty() {
                    unavailable.push(format!(
                        "{} fix(es) not made for {} (their patches apply to other pins): {}",
                        not_made.len(),
                        pin.version,
                        not_made.join(", ")
                    ));
                }
                if !not_built.is_empty() {
                    unavailable.push(format!(
                        "{} fix build(s) not in the cache, not tried (`kvaudit target build LABEL` \
                         makes one): {}",
                        not_built.len(),
                        not_built.join(", ")
                    ));
                }
            }
        }
    }
    for fault in &target.faults {
        let files = corpus
            .iter()
            .filter(|c| {
                let by_cause =
                    matches!(&c.cause, Cause::NativeFault { faults } if faults.contains(fault));
                let recorded = c.repro.targets.iter().any(|t| {
                    t.target == target.name
                        && t.faults == std::slice::from_ref(fault)
                        && t.expect == Expect::Fails
                });
                by_cause || recorded
            })
            .map(|c| c.file.clone())
            .collect();
        remedies.push(Remedy {
            name: format!("fault {fault} removed"),
            root_cause: None,
            target: target.name.clone(),
            faults: target
                .faults
                .iter()
                .filter(|f| *f != fault)
                .cloned()
                .collect(),
            files,
            with: Vec::new(),
        });
    }
    (remedies, unavailable)
}

/// How near `remedy`'s corpus files come to the group's `members`: one point each for the
/// same memory type, oracle and failing op, the best file's; what orders the replays.
pub(super) fn nearness(remedy: &Remedy, corpus: &[&CorpusEntry], members: &[&Finding]) -> usize {
    corpus
        .iter()
        .filter(|c| remedy.files.contains(&c.file))
        .flat_map(|c| {
            let r = &c.repro;
            let op = r
                .trace
                .ops
                .get(r.step.max(1) - 1)
                .map_or("setup", |o| o.name());
            members.iter().map(move |f| {
                usize::from(f.trace.setup.arch.memory() == r.trace.setup.arch.memory())
                    + usize::from(f.oracle == r.oracle)
                    + usize::from(f.failing_op() == op)
            })
        })
        .max()
        .unwrap_or(0)
}

/// Drops from `explained` each remedy applied with another (`Remedy::with`) unless that other
/// is a remedy of its own that does not explain the group: where the other alone explains it,
/// the group is the other's root cause (R3's fix is built on R15's, and a group of R15 holds
/// with both); where the other is no remedy here (left out of the corpus), the replay cannot
/// tell the two apart.
pub(super) fn drop_what_a_remedy_needs_explains(
    explained: &mut Vec<FixEvidence>,
    remedies: &[Remedy],
) {
    let alone: BTreeSet<String> = explained.iter().map(|e| e.remedy.clone()).collect();
    let is_remedy = |name: &String| remedies.iter().any(|r| &r.name == name);
    explained.retain(|e| {
        let with = remedies
            .iter()
            .find(|r| r.name == e.remedy)
            .map_or(&[][..], |r| &r.with[..]);
        with.iter()
            .all(|before| is_remedy(before) && !alone.contains(before))
    });
}
