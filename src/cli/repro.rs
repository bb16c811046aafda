//! `kvaudit repro FILE --emit c [--check]`: a standalone C reproducer for a finding.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::CliError;
use kvaudit::base::exit;
use kvaudit::outputs::c_repro::{emit_c, read_input};
use kvaudit::outputs::repro::write_output;

/// What to emit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Emit {
    /// A C program over llama.h.
    C,
}

/// Arguments of `kvaudit repro`.
#[derive(Debug, Args)]
pub struct ReproArgs {
    /// A repro file (corpora/*.json) or a finding (any JSON object with `oracle` and `trace`).
    file: PathBuf,
    /// Output language.
    #[arg(long, value_enum, default_value = "c")]
    emit: Emit,
    /// Write the program here (default: stdout).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Compile the program against a llama.cpp pin and run it: says whether the finding
    /// reproduces outside kvaudit (exit 1 if it does, 0 if not).
    #[arg(long)]
    check: bool,
    /// The pin for --check (e.g. llama.cpp@0.1.156).
    #[arg(long)]
    target: Option<String>,
    /// Model for --check (default: the generated tiny model of the setup's architecture, as
    /// `kvaudit model` writes it).
    #[arg(long)]
    model: Option<PathBuf>,
}

/// Writes (and optionally checks) the reproducer.
pub fn run(a: ReproArgs) -> Result<i32, CliError> {
    let input = read_input(&a.file).map_err(CliError::usage)?;
    if input.trace.ops.is_empty() {
        return Err(CliError::usage(format!(
            "{}: the trace has no ops",
            a.file.display()
        )));
    }
    let model = match &a.model {
        Some(m) => m.clone(),
        None => kvaudit::model::tiny::try_arch_model_path(input.trace.setup.arch)
            .map_err(|e| CliError::harness(format!("tiny model: {e:#}")))?,
    };
    let Emit::C = a.emit;
    let program = emit_c(&input);
    match &a.out {
        Some(p) => write_output(p, &program).map_err(CliError::harness)?,
        None if !a.check => print!("{program}"),
        None => {}
    }
    if !a.check {
        return Ok(exit::CLEAN);
    }
    let label = a
        .target
        .clone()
        .ok_or_else(|| CliError::usage("--check needs --target llama.cpp@VERSION[+assert]"))?;
    let out = kvaudit::outputs::c_repro::check::compile_and_run(&program, &label, &model)?;
    print!("{}", out.stdout);
    let reproduces = match (out.code, out.signal) {
        (Some(1), _) => true,
        (Some(0), _) => false,
        (_, Some(sig)) => {
            println!("the program was killed by signal {sig}");
            true
        }
        (Some(c), _) => {
            return Err(CliError::harness(format!(
                "the reproducer could not set up (exit {c}): {}",
                out.stderr.trim()
            )))
        }
        (None, None) => return Err(CliError::harness("the reproducer ended without a status")),
    };
    println!(
        "reproduces outside kvaudit on {label}: {}",
        if reproduces { "yes" } else { "no" }
    );
    Ok(if reproduces {
        exit::FINDINGS
    } else {
        exit::CLEAN
    })
}
