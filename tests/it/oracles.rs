//! The oracle registry, from the outside: adding an oracle is one `Oracle` value and one
//! `Registry::with` (here, a dummy oracle registered in the test, judged by the exhaustive
//! explorer, the judge and the report like a built-in one), and every positive control the
//! registry lists is real: its evidence file is a test case naming the oracle, and the controls
//! that are seed-domain audits are run here and must fire at the stated depth. Every oracle that
//! judges a memory class issue 24 added has a control whose evidence runs on that class
//! (`controls_per_memory_type`, the matrix of docs/oracles.md), or a reason in
//! [`WITHOUT_CONTROL`].

use libtest_mimic::{Failed, Trial};

use kvaudit::base::config::MemoryType;
use kvaudit::base::domain::{Domain, DomainOverrides};
use kvaudit::base::op::Op;
use kvaudit::engines::explore::{run_exhaustive, ExhaustiveConfig};
use kvaudit::oracles::{
    Oracle, OracleId, PositiveControl, Reads, Registry, Seen, Violation, BUILTIN,
};
use kvaudit::outputs::repro::parse_label;
use kvaudit::records::report::{Report, Shard};
use kvaudit::running::judge::Judge;
use kvaudit::running::runner::RunnerFactory;

/// A made-up oracle: "no sequence reaches position 8" (the seed domain decodes 7 tokens into
/// seq 0, so one more decode or a `seq_add` past it violates it).
const BELOW_EIGHT: OracleId = OracleId::new("below-eight");

static BELOW_EIGHT_ORACLE: Oracle = Oracle {
    id: BELOW_EIGHT,
    summary: "no resident position reaches 8 (a test oracle)",
    reads: Reads::Step,
    kinds: &["position 8 or more"],
    positive_controls: &[],
    holds: Some(below_eight_holds),
    check: below_eight_violation,
    ..Oracle::DEFAULTS
};

fn below_eight_holds(seen: &Seen<'_>) -> bool {
    match seen {
        Seen::Step { after, .. } => after.seqs.iter().all(|s| s.cells.iter().all(|&p| p < 8)),
        _ => true,
    }
}

fn below_eight_violation(seen: &Seen<'_>) -> Option<Violation> {
    let Seen::Step { after, .. } = seen else {
        return None;
    };
    let s = after
        .seqs
        .iter()
        .find(|s| s.cells.iter().any(|&p| p >= 8))?;
    Some(Violation {
        oracle: BELOW_EIGHT,
        kind: "position 8 or more".into(),
        seq: Some(s.seq),
        observed: serde_json::json!({ "cells": s.cells }),
        expected: serde_json::json!("positions below 8"),
    })
}

fn factory(label: &str) -> Result<Box<RunnerFactory<'static>>, String> {
    Ok(parse_label(label)?.factory()?)
}

fn audit(oracles: Registry, a: &str, b: Option<&str>, depth: u32) -> Result<Report, String> {
    let fa = factory(a)?;
    let fb = b.map(factory).transpose()?;
    let cfg = ExhaustiveConfig {
        domain: Domain::preset("seed").ok_or("no seed preset")?,
        depth,
        shard: Shard::WHOLE,
        threads: 2,
        batch: 256,
        oracles,
    };
    run_exhaustive(&cfg, fa.as_ref(), fb.as_deref(), &mut |_| {}).map_err(|e| e.to_string())
}

fn a_registered_oracle_is_judged_everywhere() -> Result<(), String> {
    let registry = Registry::builtin().with(&BELOW_EIGHT_ORACLE);
    let report = audit(registry.clone(), "native", None, 2)?;
    let stats = report
        .oracles
        .get(&BELOW_EIGHT)
        .ok_or("the report's oracle table lacks the registered oracle")?;
    if stats.checked != report.trials - report.unsupported || stats.first_depth != Some(1) {
        return Err(format!("explorer: {stats:?} over {} trials", report.trials));
    }
    let finding = report
        .findings
        .iter()
        .find(|f| f.oracle == BELOW_EIGHT)
        .ok_or("no finding of the registered oracle")?;
    if !finding
        .trace
        .ops
        .iter()
        .any(|op| matches!(op, Op::Decode(_) | Op::SeqAdd { .. }))
    {
        return Err(format!("unexpected representative: {}", finding.trace));
    }
    // Reports with the oracle read back: its name is known once registered.
    let back: Report = serde_json::from_str(&report.to_json()).map_err(|e| e.to_string())?;
    if back.oracles.keys().last() != Some(&BELOW_EIGHT)
        || !report.to_markdown().contains("| below-eight |")
    {
        return Err("the oracle does not come back from JSON, or is not last in the table".into());
    }
    // The judge of fuzz runs, shrinks and replays asks it too.
    let fa = factory("native")?;
    let mut judge = Judge::new(fa.as_ref(), None)
        .map_err(|e| e.to_string())?
        .with_oracles(registry);
    let verdict = judge.run(&finding.trace).map_err(|e| e.to_string())?;
    match verdict.first(BELOW_EIGHT) {
        Some(v) if v.step == finding.step => Ok(()),
        other => Err(format!("judge: {other:?}")),
    }
}

fn check_control(oracle: &'static Oracle, c: &PositiveControl) -> Result<(), String> {
    let evidence = super::root().join("tests/data").join(c.evidence);
    let text = std::fs::read_to_string(&evidence)
        .map_err(|e| format!("{}: evidence {}: {e}", oracle.id(), evidence.display()))?;
    let name = oracle.id().name();
    if !text.contains(&format!("\"{name}\"")) && !text.contains(name) {
        return Err(format!(
            "{}: evidence {} never names the oracle",
            name, c.evidence
        ));
    }
    let Some(depth) = c.seed_depth else {
        return Ok(());
    };
    let (a, b) = match c.target.split_once(" vs ") {
        Some((a, b)) => (a, Some(b)),
        None => (c.target, None),
    };
    let report = audit(Registry::builtin(), a, b, depth)?;
    let first = report.oracles.get(&oracle.id()).and_then(|s| s.first_depth);
    if first != Some(depth) {
        return Err(format!(
            "{name} on {}: first violated at depth {first:?}, the registry says {depth}",
            c.target
        ));
    }
    Ok(())
}

/// The memory classes whose oracles must each have a positive control that fires on the class
/// itself (issue 24's done-when), with the preset that selects each.
const CLASSES: [(MemoryType, &str); 6] = [
    (MemoryType::HybridIswa, "hybrid_iswa"),
    (MemoryType::Msa, "msa"),
    (MemoryType::HybridIdx, "hybrid_idx"),
    (MemoryType::DsaIswa, "dsa_iswa"),
    (MemoryType::Dsa, "dsa"),
    (MemoryType::Dsv4, "dsv4"),
];

/// The oracles that judge a class's preset yet have no control on the class, and why. A pair
/// listed here that gains a control, or whose oracle no longer judges the class, fails the test.
const WITHOUT_CONTROL: &[(&str, MemoryType, &str)] = &[];

/// The memory type an evidence file's audit runs on: its preset under its overrides (`None`
/// for a file that is not an audit of a preset).
fn evidence_memory(evidence: &str) -> Result<Option<MemoryType>, String> {
    let path = super::root().join("tests/data").join(evidence);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{evidence}: {e}"))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{evidence}: {e}"))?;
    let Some(mut domain) = json["domain"].as_str().and_then(Domain::preset) else {
        return Ok(None);
    };
    if let Some(o) = json.get("overrides") {
        let o: DomainOverrides =
            serde_json::from_value(o.clone()).map_err(|e| format!("{evidence}: {e}"))?;
        o.apply(&mut domain);
    }
    Ok(Some(domain.setup.arch.memory()))
}

/// Every oracle that judges `class`'s preset has a positive control on `class`, or a reason in
/// [`WITHOUT_CONTROL`] (and no reason outlives its need).
fn controls_per_memory_type(class: MemoryType, preset: &str) -> Result<(), String> {
    let setup = Domain::preset(preset)
        .ok_or(format!("no preset {preset}"))?
        .setup;
    if setup.arch.memory() != class {
        return Err(format!("preset {preset} selects {}", setup.arch.memory()));
    }
    let judging: Vec<&Oracle> = BUILTIN
        .iter()
        .copied()
        .filter(|o| o.reads() != Reads::Runs && o.judges_setup(&setup))
        .collect();
    let mut problems = Vec::new();
    for o in &judging {
        let mut has = false;
        for c in o.positive_controls() {
            has |= evidence_memory(c.evidence)? == Some(class);
        }
        let exempt = WITHOUT_CONTROL
            .iter()
            .any(|(name, m, _)| *name == o.id().name() && *m == class);
        match (has, exempt) {
            (false, false) => problems.push(format!("{} has no control on {class}", o.id())),
            (true, true) => problems.push(format!(
                "{} has a control on {class}: drop it from WITHOUT_CONTROL",
                o.id()
            )),
            _ => {}
        }
    }
    for (name, m, _) in WITHOUT_CONTROL.iter().filter(|(_, m, _)| *m == class) {
        if !judging.iter().any(|o| o.id().name() == *name) {
            problems.push(format!(
                "{name} does not judge {m}: drop it from WITHOUT_CONTROL"
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

pub fn trials() -> Vec<Trial> {
    let mut out = vec![Trial::test(
        "oracles::a_registered_oracle_is_judged_everywhere",
        || a_registered_oracle_is_judged_everywhere().map_err(Failed::from),
    )];
    for (class, preset) in CLASSES {
        out.push(Trial::test(
            format!("oracles::controls_per_memory_type::{preset}"),
            move || controls_per_memory_type(class, preset).map_err(Failed::from),
        ));
    }
    for oracle in BUILTIN {
        for (k, c) in oracle.positive_controls().iter().enumerate() {
            out.push(Trial::test(
                format!(
                    "oracles::positive_control::{}::{k}::{}",
                    oracle.id(),
                    c.target
                ),
                move || check_control(oracle, c).map_err(Failed::from),
            ));
        }
    }
    out
}
