//! `kvaudit repro FILE [--emit c|py] [--check]`: a standalone reproducer for a finding, in the
//! language of the engine it was found on (C over llama.h, Python over mlx-lm).

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::CliError;
use kvaudit::base::exit;
use kvaudit::base::files::read_text_limited;
use kvaudit::outputs::c_repro::{emit_c, read_input};
use kvaudit::outputs::repro::{write_output, MAX_REPRO_BYTES};
use kvaudit::outputs::reproducer::{target_names, Language};

/// What to emit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Emit {
    /// A C program over llama.h.
    C,
    /// A Python program over mlx and mlx_lm.
    Py,
}

/// Arguments of `kvaudit repro`.
#[derive(Debug, Args)]
pub struct ReproArgs {
    /// A repro file (corpora/*.json) or a finding (any JSON object with `oracle` and `trace`).
    file: PathBuf,
    /// Output language (default: the engine's of the file's first target: `py` for mlx-lm,
    /// else `c`).
    #[arg(long, value_enum)]
    emit: Option<Emit>,
    /// Write the program here (default: stdout).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run the program (C: compiled against a llama.cpp pin; Python: with an mlx-lm
    /// environment's interpreter): says whether the finding reproduces outside kvaudit (exit 1
    /// if it does, 0 if not).
    #[arg(long)]
    check: bool,
    /// The target for --check (e.g. llama.cpp@0.1.156, mlx-lm@0.32.2; Python: default the
    /// file's first mlx-lm target).
    #[arg(long)]
    target: Option<String>,
    /// Model for --check of a C program (default: the generated tiny model of the setup's
    /// architecture, as `kvaudit model` writes it).
    #[arg(long)]
    model: Option<PathBuf>,
}

/// Writes (and optionally checks) the reproducer.
pub fn run(a: ReproArgs) -> Result<i32, CliError> {
    let emit = match a.emit {
        Some(e) => e,
        None => {
            let text = read_text_limited(&a.file, MAX_REPRO_BYTES).map_err(CliError::usage)?;
            let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            match Language::of_input(&value) {
                Language::C => Emit::C,
                Language::Python => Emit::Py,
            }
        }
    };
    match emit {
        Emit::C => run_c(a),
        Emit::Py => run_py(a),
    }
}

fn run_c(a: ReproArgs) -> Result<i32, CliError> {
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

fn run_py(a: ReproArgs) -> Result<i32, CliError> {
    use kvaudit::outputs::py_repro::{emit_py, parse_input, run_program};
    let text = read_text_limited(&a.file, MAX_REPRO_BYTES).map_err(CliError::usage)?;
    let input =
        parse_input(&text).map_err(|e| CliError::usage(format!("{}: {e}", a.file.display())))?;
    if input.trace.ops.is_empty() {
        return Err(CliError::usage(format!(
            "{}: the trace has no ops",
            a.file.display()
        )));
    }
    let program = emit_py(&input).map_err(CliError::usage)?;
    match &a.out {
        Some(p) => write_output(p, &program).map_err(CliError::harness)?,
        None if !a.check => print!("{program}"),
        None => {}
    }
    if !a.check {
        return Ok(exit::CLEAN);
    }
    let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    use kvaudit::targets::registry::TargetKind;
    let label = a
        .target
        .clone()
        .or_else(|| {
            target_names(&value)
                .into_iter()
                .find(|t| TargetKind::parse(t).ok() == Some(TargetKind::Mlx))
        })
        .ok_or_else(|| {
            CliError::usage(
                "--check needs --target mlx-lm@VERSION (the file names no mlx-lm target)",
            )
        })?;
    let out = run_program(&program, &label)?;
    print!("{}", out.stdout);
    let reproduces = match out.code {
        Some(1) => true,
        Some(0) => false,
        Some(c) => {
            return Err(CliError::harness(format!(
                "the reproducer could not replay the trace (exit {c}): {}",
                out.stdout.lines().last().unwrap_or_default().trim()
            )))
        }
        None => {
            return Err(CliError::harness(format!(
                "the reproducer was killed (signal {}): {}",
                out.signal.unwrap_or(-1),
                out.stderr.trim()
            )))
        }
    };
    // What the file records for this target, if anything: "fails" means the program exits 1.
    let recorded = value
        .get("targets")
        .and_then(serde_json::Value::as_array)
        .and_then(|ts| {
            ts.iter()
                .find(|t| t.get("target").and_then(serde_json::Value::as_str) == Some(&label))
        })
        .and_then(|t| t.get("expect").and_then(serde_json::Value::as_str))
        .map(|e| e == "fails");
    println!(
        "reproduces outside kvaudit on {label}: {}{}",
        if reproduces { "yes" } else { "no" },
        match recorded {
            Some(r) if r == reproduces => " (as the file records)",
            Some(true) => " (the file records that it fails there)",
            Some(false) => " (the file records that it holds there)",
            None => "",
        }
    );
    Ok(if reproduces {
        exit::FINDINGS
    } else {
        exit::CLEAN
    })
}
