//! `kvaudit measure --target llama.cpp@VERSION`: the numerical oracles T1-T3 measured on a real
//! llama.cpp build ([`kvaudit::engines::measure`]), each figure with its stated tolerance, and the
//! `[[measurement]]` predictions of PREREG.md checked against them.
//!
//! Exit codes: 0 every prediction held, 1 a prediction was falsified, 2 bad command line or
//! PREREG file, 3 the harness broke (the pin does not build, a context does not open).

use std::path::PathBuf;

use clap::Args;

use super::args::{emit, Format, Rendered};
use super::CliError;
use kvaudit::base::exit;
use kvaudit::engines::measure::{measure_pin, MeasureReport};
use kvaudit::targets::registry::TargetKind;

/// Arguments of `kvaudit measure`.
#[derive(Debug, Args)]
pub struct MeasureArgs {
    /// The llama.cpp pin, e.g. `llama.cpp@0.1.161` (built first if needed).
    #[arg(long)]
    target: String,
    /// A GGUF model instead of the generated tiny model.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Predictions to compare the figures with (default: ./PREREG.md if present).
    #[arg(long)]
    prereg: Option<PathBuf>,
    /// Write the report to this file (atomically); format from --format, or from the extension
    /// (.json, .md).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Report format (on stdout, or in --out).
    #[arg(long, value_enum, default_value = "terminal")]
    format: Format,
}

/// Measures, prints or writes the report, and maps the predictions to an exit code.
pub fn run(a: MeasureArgs) -> Result<i32, CliError> {
    match TargetKind::parse(&a.target) {
        Ok(TargetKind::Llama) => {}
        Ok(
            TargetKind::Native
            | TargetKind::NativeTensors
            | TargetKind::PythonRef
            | TargetKind::Mlx,
        )
        | Err(_) => {
            return Err(CliError::usage(format!(
                "--target {}: measure runs on llama.cpp pins only (llama.cpp@VERSION[+assert])",
                a.target
            )))
        }
    }
    kvaudit::targets::llama::pins::Pin::parse(&a.target)
        .map_err(|e| CliError::usage(format!("{e:#}")))?;
    if let Some(m) = &a.model {
        if !m.is_file() {
            return Err(CliError::usage(format!(
                "--model {}: no such file",
                m.display()
            )));
        }
        // The native reference must run the model too: a file it cannot read is bad input.
        kvaudit::model::forward::Model::load(m)
            .map_err(|e| CliError::usage(format!("--model {}: {e:#}", m.display())))?;
    }
    let prereg_text = match &a.prereg {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .map_err(|e| CliError::usage(format!("{}: cannot read: {e}", p.display())))?,
        ),
        None => std::fs::read_to_string("PREREG.md").ok(),
    };
    let predictions = match &prereg_text {
        Some(text) => kvaudit::records::prereg::parse_measurements(text).map_err(|e| {
            let name = a
                .prereg
                .as_ref()
                .map_or("PREREG.md".into(), |p| p.display().to_string());
            CliError::usage(format!("{name}: {e}"))
        })?,
        None => Vec::new(),
    };
    let mut report = measure_pin(&a.target, a.model.as_deref()).map_err(|e| CliError {
        code: e.exit_code(),
        message: e.to_string(),
    })?;
    report.check_predictions(&predictions);
    emit(&report, a.format, a.out.as_deref(), false)?;
    let falsified: Vec<&str> = report
        .predictions
        .iter()
        .filter(|p| !p.confirmed)
        .map(|p| p.quantity.as_str())
        .collect();
    if falsified.is_empty() {
        if report.predictions.is_empty() {
            eprintln!(
                "kvaudit measure: no PREREG.md prediction names {}",
                report.target
            );
        }
        Ok(exit::CLEAN)
    } else {
        eprintln!(
            "kvaudit measure: {} of {} predictions FALSIFIED: {}",
            falsified.len(),
            report.predictions.len(),
            falsified.join(", ")
        );
        Ok(exit::FINDINGS)
    }
}

impl Rendered for MeasureReport {
    fn to_terminal(&self) -> String {
        MeasureReport::to_terminal(self)
    }
    fn to_json(&self) -> String {
        MeasureReport::to_json(self)
    }
    fn to_markdown(&self) -> String {
        MeasureReport::to_markdown(self)
    }
}
