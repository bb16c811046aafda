//! `kvaudit report-bug FILE`: a Markdown bug report of a repro file's finding, for the engine's
//! tracker, with its reproducer run: a C program checked on a llama.cpp pin, or for a finding on
//! mlx-lm a Python program run with an mlx-lm environment.

use std::path::PathBuf;

use clap::Args;

use super::CliError;
use kvaudit::base::exit;
use kvaudit::outputs::bug_report::{bug_report, default_pin, CheckedProgram};
use kvaudit::outputs::c_repro::check::compile_and_run;
use kvaudit::outputs::c_repro::{emit_c, parse_input};
use kvaudit::outputs::repro::{write_output, Repro};
use kvaudit::outputs::reproducer::Language;

/// Arguments of `kvaudit report-bug`.
#[derive(Debug, Args)]
pub struct ReportBugArgs {
    /// A repro file (corpora/*.json).
    file: PathBuf,
    /// The pin to check the C program on (default: the first llama.cpp pin the file expects to
    /// fail, else the first it names); for a file on mlx-lm, the mlx-lm version to run the
    /// Python program with (default: likewise, among its mlx-lm targets).
    #[arg(long)]
    target: Option<String>,
    /// Do not compile and run the program (the report then says it was not run).
    #[arg(long)]
    no_check: bool,
    /// Model for the check (default: the generated tiny model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Write the report here (default: stdout).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Writes the report.
pub fn run(a: ReportBugArgs) -> Result<i32, CliError> {
    let repro = Repro::load(&a.file).map_err(CliError::usage)?;
    let value = serde_json::to_value(&repro).unwrap_or_default();
    if Language::of_input(&value) == Language::Python {
        return run_mlx(a, &repro);
    }
    let input = parse_input(&repro.to_text())
        .map_err(|e| CliError::usage(format!("{}: {e}", a.file.display())))?;
    // The reader runs it with their own model: no path of this machine in the program.
    let program = emit_c(&input);
    let pin = a.target.clone().or_else(|| default_pin(&repro));
    let checked = match (&pin, a.no_check) {
        (Some(pin), false) => {
            let model = match &a.model {
                Some(m) => m.clone(),
                None => kvaudit::model::tiny::try_arch_model_path(repro.trace.setup.arch)
                    .map_err(|e| CliError::harness(format!("tiny model: {e:#}")))?,
            };
            let run = compile_and_run(&program, pin, &model)?;
            Some(CheckedProgram {
                pin: pin.clone(),
                status: run.shell_status(),
            })
        }
        _ => None,
    };
    let md = bug_report(&repro, &program, checked.as_ref());
    match &a.out {
        Some(p) => write_output(p, &md).map_err(CliError::harness)?,
        None => print!("{md}"),
    }
    Ok(exit::CLEAN)
}

/// The report of a finding on mlx-lm: its Python program, run with the mlx-lm version asked
/// for (default: the first the file expects to fail, else the first it names).
fn run_mlx(a: ReportBugArgs, repro: &Repro) -> Result<i32, CliError> {
    use kvaudit::outputs::mlx_bug_report::{bug_report, default_version};
    use kvaudit::outputs::py_repro::{emit_py, parse_input, run_program};
    let input = parse_input(&repro.to_text())
        .map_err(|e| CliError::usage(format!("{}: {e}", a.file.display())))?;
    let program = emit_py(&input).map_err(CliError::usage)?;
    let version = a.target.clone().or_else(|| default_version(repro));
    let checked = match (&version, a.no_check) {
        (Some(version), false) => {
            let run = run_program(&program, version)?;
            Some(CheckedProgram {
                pin: version.clone(),
                status: run.code.unwrap_or(128 + run.signal.unwrap_or(0)),
            })
        }
        _ => None,
    };
    let md = bug_report(repro, &program, checked.as_ref());
    match &a.out {
        Some(p) => write_output(p, &md).map_err(CliError::harness)?,
        None => print!("{md}"),
    }
    Ok(exit::CLEAN)
}
