//! Python reproducers for mlx-lm (`kvaudit repro --emit py`, `kvaudit report-bug` of a file on
//! mlx-lm): each repro file of `tests/data/py_repro/` made into its program and run with the
//! mlx-lm environment of each mlx-lm target it records (made here when it is not: `.ci/run`
//! makes it first); the program exits 1 where the file records `fails` and 0 where `holds`.
//! Its bug report quotes mlx-lm, not llama.h, and carries the program and its exit code.

use libtest_mimic::Trial;

use std::path::Path;

use kvaudit::outputs::c_repro::check::ProgramRun;
use kvaudit::outputs::mlx_bug_report::{bug_report, program_and_status};
use kvaudit::outputs::py_repro::{emit_py, read_input, run_program};
use kvaudit::outputs::repro::{Expect, Repro};

pub fn trials() -> Vec<Trial> {
    let dir = super::root().join("tests/data/py_repro");
    super::data_files(&dir, "json")
        .into_iter()
        .map(|(name, path)| {
            Trial::test(format!("py_repro::{name}"), move || {
                super::outcome(check(&path))
            })
        })
        .collect()
}

fn shown(run: &ProgramRun) -> String {
    format!("stdout:\n{}\nstderr:\n{}", run.stdout, run.stderr)
}

/// The logit differences a program printed ("... to a fresh prefill 0.309481, tolerance ...").
fn printed_differences(stdout: &str) -> Vec<f64> {
    stdout
        .lines()
        .filter_map(|l| l.split("to a fresh prefill ").nth(1))
        .filter_map(|rest| rest.split(',').next()?.trim().parse().ok())
        .collect()
}

fn check(path: &Path) -> Result<(), String> {
    let repro = Repro::load(path).map_err(|e| e.to_string())?;
    let input = read_input(path).map_err(|e| e.to_string())?;
    let program = emit_py(&input).map_err(|e| e.to_string())?;
    // Standalone: the standard library, mlx and mlx_lm, never kvaudit's worker.
    for line in program
        .lines()
        .filter(|l| l.starts_with("import ") || l.starts_with("from "))
    {
        let module = line.split_whitespace().nth(1).unwrap_or_default();
        let root = module.split('.').next().unwrap_or_default();
        if ![
            "copy",
            "dataclasses",
            "os",
            "sys",
            "tempfile",
            "traceback",
            "mlx",
            "mlx_lm",
        ]
        .contains(&root)
        {
            return Err(format!("the program imports {module}"));
        }
    }
    let mut ran = 0;
    for t in &repro.targets {
        let Ok(pin) = kvaudit::targets::mlx::MlxPin::parse(&t.target) else {
            continue;
        };
        let run = run_program(&program, &pin.label()).map_err(|e| e.to_string())?;
        let want = if t.expect == Expect::Fails { 1 } else { 0 };
        if run.code != Some(want) {
            return Err(format!(
                "on {}: exit {:?}, the file records {:?} (exit {want})\n{}",
                t.target,
                run.code,
                t.expect,
                shown(&run)
            ));
        }
        // The same model as the worker's: where the finding measured the logits, the program
        // prints the same difference on the target the finding was made on (and on each where
        // the file records it fails, for the same cause).
        if let Some(want) = repro.observed.get("max_abs_diff").and_then(|v| v.as_f64()) {
            if t.expect == Expect::Fails {
                let printed = printed_differences(&run.stdout);
                if !printed
                    .iter()
                    .any(|d| (d - want).abs() <= 1e-5 * want.abs().max(1.0))
                {
                    return Err(format!(
                        "on {}: the finding measured max |delta| {want}, the program printed {printed:?}\n{}",
                        t.target,
                        shown(&run)
                    ));
                }
            }
        }
        let says_bug = run.stdout.lines().any(|l| l.starts_with("BUG: "));
        if says_bug != (want == 1) {
            return Err(format!(
                "on {}: BUG lines do not match the exit code\n{}",
                t.target,
                shown(&run)
            ));
        }
        // The report: the program as it was run, its exit code, mlx-lm's words only.
        let checked = kvaudit::outputs::bug_report::CheckedProgram {
            pin: t.target.clone(),
            status: want,
        };
        let md = bug_report(&repro, &program, Some(&checked));
        if program_and_status(&md) != Some((program.clone(), Some(want))) {
            return Err(format!(
                "the report does not carry the program and its exit code:\n{md}"
            ));
        }
        let prose = md.replace(&program, "");
        if let Some(line) = prose
            .lines()
            .find(|l| l.contains("llama.h") || l.contains("llama.cpp"))
        {
            return Err(format!("the report names llama.cpp: {line}"));
        }
        ran += 1;
    }
    if ran == 0 {
        return Err("the file records no mlx-lm target".into());
    }
    Ok(())
}
