//! Findings people act on (issue 13), over the corpus and the committed reports:
//!
//! - `findings::explain::<stem>`: `kvaudit explain` on every `corpora/*.json` draws an SVG that
//!   parses as XML, has a column per step the target ran and marks the finding's step; for an I1
//!   finding it shows the stale accessor (the file's observed `seq_pos_min`/`seq_pos_max`, not
//!   the truth) of the file's sequence at that step.
//! - `findings::report_bug::<stem>`: `kvaudit report-bug` on every corpus file writes Markdown
//!   whose C program, taken back out of the Markdown, compiles against the pin the report names
//!   and exits with the code the report states, and that code agrees with the file's
//!   expectation on that pin (1 or a signal where it fails, 0 where it holds); on an mlx-lm
//!   file, the exit code its Python program is stated to give agrees with the expectation.
//! - `findings::refcount_is_one_group::*`: the seed's refcount bug is one root-cause group, in
//!   a fresh audit of `native[refcount]` and in the committed depth-3 reports.

use std::path::Path;
use std::process::Command;

use libtest_mimic::Trial;

use kvaudit::outputs::bug_report::program_and_status;
use kvaudit::outputs::c_repro::check::compile_and_run;
use kvaudit::outputs::repro::{Expect, Repro};
use kvaudit::records::group::Cause;
use kvaudit::records::report::Report;

pub fn trials() -> Vec<Trial> {
    let mut trials = Vec::new();
    for (stem, path) in super::data_files(&super::root().join("corpora"), "json") {
        let p = path.clone();
        trials.push(Trial::test(
            format!("findings::explain::{stem}"),
            move || super::outcome(explain(&p)),
        ));
        trials.push(Trial::test(
            format!("findings::report_bug::{stem}"),
            move || super::outcome(report_bug(&path)),
        ));
    }
    trials.push(Trial::test(
        "findings::refcount_is_one_group::native_refcount_audit",
        || super::outcome(fresh_audit_groups()),
    ));
    for report in [
        "reports/native-refcount-seed-d3.json",
        "reports/llama.cpp@0.1.156-seed-d3.json",
    ] {
        trials.push(Trial::test(
            format!("findings::refcount_is_one_group::{report}"),
            move || super::outcome(committed_report_groups(&super::root().join(report))),
        ));
    }
    trials
}

fn kvaudit(args: &[&std::ffi::OsStr]) -> Result<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_kvaudit"))
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "kvaudit {:?} exited {:?}: {}",
            args,
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| e.to_string())
}

/// The attribute `name` of `n` as an integer.
fn int(n: &roxmltree::Node<'_, '_>, name: &str) -> Option<i64> {
    n.attribute(name).and_then(|v| v.parse().ok())
}

fn explain(path: &Path) -> Result<(), String> {
    let repro = Repro::load(path).map_err(|e| e.to_string())?;
    let svg = kvaudit(&["explain".as_ref(), path.as_os_str()])?;
    let doc = roxmltree::Document::parse(&svg).map_err(|e| format!("not XML: {e}"))?;
    let root = doc.root_element();
    if root.tag_name().name() != "svg" {
        return Err(format!("the root is <{}>", root.tag_name().name()));
    }
    if let Some(n) = doc.descendants().find(|n| {
        matches!(
            n.tag_name().name(),
            "script" | "foreignObject" | "image" | "a"
        )
    }) {
        return Err(format!("the picture holds a <{}>", n.tag_name().name()));
    }
    let has = |n: &roxmltree::Node<'_, '_>, class: &str| {
        n.attribute("class")
            .is_some_and(|c| c.split(' ').any(|w| w == class))
    };
    let columns = doc.descendants().filter(|n| has(n, "op")).count();
    let n_setup = repro.trace.setup.ops.len();
    let violating = (n_setup + repro.step - 1) as i64;
    // A crash too: the columns after it say why they have no observation.
    if columns != n_setup + repro.trace.ops.len() {
        return Err(format!(
            "{columns} columns for {} setup ops and {} ops",
            n_setup,
            repro.trace.ops.len()
        ));
    }
    if !doc
        .descendants()
        .any(|n| has(&n, "violation") && int(&n, "data-step") == Some(violating))
    {
        return Err(format!("no violation marked at column {violating}"));
    }
    if repro.oracle.name() == "I1" {
        let seq = repro.seq.ok_or("an I1 file names its sequence")? as i64;
        let want = |k: &str| repro.observed.get(k).and_then(|v| v.as_i64());
        let stale = doc.descendants().find(|n| {
            has(n, "accessor")
                && has(n, "stale")
                && int(n, "data-step") == Some(violating)
                && int(n, "data-seq") == Some(seq)
        });
        let stale = stale.ok_or(format!(
            "no stale accessor of seq {seq} at column {violating}"
        ))?;
        for (attr, key) in [("data-pos-min", "pos_min"), ("data-pos-max", "pos_max")] {
            if want(key).is_some() && int(&stale, attr) != want(key) {
                return Err(format!(
                    "the stale accessor shows {attr} = {:?}, the file observed {key} = {:?}",
                    stale.attribute(attr),
                    want(key)
                ));
            }
        }
        let text = stale.text().unwrap_or_default();
        if !text.contains("min") || !text.contains("max") {
            return Err(format!("the stale accessor reads {text:?}"));
        }
    }
    Ok(())
}

fn report_bug(path: &Path) -> Result<(), String> {
    let repro = Repro::load(path).map_err(|e| e.to_string())?;
    let md = kvaudit(&["report-bug".as_ref(), path.as_os_str()])?;
    // mlx-lm's report carries a Python program, run by the report's writer: its stated exit
    // code agrees with the file's expectation on the version it names.
    if let Some(checked) = md.lines().find(|l| l.starts_with("Checked: run with `")) {
        let pin = checked
            .split('`')
            .nth(1)
            .ok_or("no version in the Checked line")?;
        let status: i32 = checked
            .rsplit("exit code ")
            .next()
            .and_then(|c| c.trim_end_matches('.').parse().ok())
            .ok_or(format!("no exit code in {checked:?}"))?;
        return agrees(&repro, pin, status);
    }
    let pin = md
        .lines()
        .find(|l| l.starts_with("Checked: compiled against `"))
        .and_then(|l| l.split('`').nth(1))
        .ok_or("the report names no pin it was checked on")?
        .to_string();
    let (program, status) = program_and_status(&md).ok_or("no C program in the report")?;
    let status = status.ok_or("the report states no exit code")?;
    let model = kvaudit::model::tiny::try_arch_model_path(repro.trace.setup.arch)
        .map_err(|e| format!("{e:#}"))?;
    let run = compile_and_run(&program, &pin, &model).map_err(|e| e.to_string())?;
    if run.shell_status() != status {
        return Err(format!(
            "on {pin} the program exits {}, the report says {status}\n{}",
            run.shell_status(),
            run.stdout
        ));
    }
    agrees(&repro, &pin, status)?;
    for internal in ["kvaudit replay", "kvaudit repro ", "cargo ", "corpora/"] {
        if md.contains(internal) {
            return Err(format!("the report refers to {internal:?}"));
        }
    }
    Ok(())
}

/// A reproducer's exit `status` on `pin` agrees with the file's expectation there: 1 or a
/// signal where it fails, 0 where it holds.
fn agrees(repro: &Repro, pin: &str, status: i32) -> Result<(), String> {
    let expect = repro
        .targets
        .iter()
        .find(|t| t.target == pin)
        .map(|t| t.expect)
        .ok_or(format!("the file has no expectation on {pin}"))?;
    let agrees = match expect {
        Expect::Fails => status == 1 || status > 128,
        Expect::Holds => status == 0,
    };
    if agrees {
        Ok(())
    } else {
        Err(format!(
            "the file expects {expect:?} on {pin}, the program exits {status}"
        ))
    }
}

/// Every finding the native model explains with the refcount fault is in one group, and that
/// group holds every I1 finding.
fn one_refcount_group(report: &Report) -> Result<(), String> {
    let refcount = Cause::NativeFault {
        faults: vec!["refcount".into()],
    };
    let groups: Vec<_> = report
        .groups
        .iter()
        .filter(|g| g.cause == refcount)
        .collect();
    let [group] = groups[..] else {
        return Err(format!(
            "{} groups caused by refcount:\n{}",
            groups.len(),
            report.to_terminal()
        ));
    };
    let i1: Vec<usize> = (1..=report.findings.len())
        .filter(|&n| report.findings[n - 1].oracle.name() == "I1")
        .collect();
    if i1.is_empty() || !i1.iter().all(|n| group.findings.contains(n)) {
        return Err(format!(
            "I1 findings {i1:?}, the refcount group holds {:?}",
            group.findings
        ));
    }
    Ok(())
}

fn fresh_audit_groups() -> Result<(), String> {
    use kvaudit::base::domain::Domain;
    use kvaudit::engines::explore::{run_exhaustive, ExhaustiveConfig};
    use kvaudit::records::report::Shard;
    use kvaudit::targets::registry::TargetSpec;
    let a = TargetSpec::new("native", &["refcount".into()]).factory()?;
    let cfg = ExhaustiveConfig {
        domain: Domain::preset("seed").ok_or("no seed preset")?,
        depth: 3,
        shard: Shard::WHOLE,
        threads: 2,
        batch: 1024,
        oracles: kvaudit::oracles::Registry::builtin(),
    };
    let mut report =
        run_exhaustive(&cfg, a.as_ref(), None, &mut |_| {}).map_err(|e| e.to_string())?;
    kvaudit::engines::root_cause::group_report(&mut report);
    one_refcount_group(&report)
}

fn committed_report_groups(path: &Path) -> Result<(), String> {
    let report = Report::load(path).map_err(|e| e.to_string())?;
    one_refcount_group(&report)
}
