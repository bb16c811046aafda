//! `kvaudit explain FILE`: a picture of a repro file's finding, as a self-contained SVG.

use std::path::PathBuf;

use clap::Args;

use super::CliError;
use kvaudit::base::exit;
use kvaudit::outputs::explain::{default_target, explain_repro, to_svg};
use kvaudit::outputs::repro::{parse_label, write_output, Repro, TargetExpectation};

/// Arguments of `kvaudit explain`.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// A repro file (corpora/*.json).
    file: PathBuf,
    /// The target to draw the trace on (default: the first native target the file expects to
    /// fail, else the first it expects to fail), e.g. `native[refcount]`, `llama.cpp@0.1.156`.
    #[arg(long)]
    target: Option<String>,
    /// Write the SVG here (default: stdout).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Draws the picture.
pub fn run(a: ExplainArgs) -> Result<i32, CliError> {
    let repro = Repro::load(&a.file).map_err(CliError::usage)?;
    let label = match &a.target {
        Some(t) => t.clone(),
        // A pair's first target alone: the picture is of one target's cells.
        None => default_target(&repro)
            .map(|t| {
                TargetExpectation {
                    vs: None,
                    vs_faults: Vec::new(),
                    vs_config: None,
                    ..t.clone()
                }
                .label()
            })
            .ok_or_else(|| {
                CliError::usage(format!(
                    "{}: no target expects the finding; name one with --target",
                    a.file.display()
                ))
            })?,
    };
    let spec = parse_label(&label).map_err(CliError::usage)?;
    let picture = explain_repro(&repro, &spec)?;
    let svg = to_svg(&picture);
    match &a.out {
        Some(p) => write_output(p, &svg).map_err(CliError::harness)?,
        None => print!("{svg}"),
    }
    Ok(exit::CLEAN)
}
