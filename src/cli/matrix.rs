//! `kvaudit matrix [--targets A..B | V1,V2,...] FILE|DIR...`: every repro file on every
//! version, as a table for the terminal, Markdown and JSON.

use std::path::PathBuf;

use clap::Args;

use super::CliError;
use kvaudit::base::exit;
use kvaudit::base::files::write_or_aside;
use kvaudit::outputs::repro::{repro_files, Repro};
use kvaudit::outputs::versions::matrix::run_matrix;
use kvaudit::targets::llama::pins::{select, Variant};

/// Arguments of `kvaudit matrix`.
#[derive(Debug, Args)]
pub struct MatrixArgs {
    /// Repro files, or folders of them (`*.json`).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// The versions: `A..B` (every known version from A to B), `V1,V2,...`, or `all`.
    #[arg(long, default_value = "all")]
    targets: String,
    /// The `+assert` builds of those versions.
    #[arg(long)]
    assert: bool,
    /// Only the versions the cache already holds a build of (builds nothing).
    #[arg(long)]
    built_only: bool,
    /// Write the Markdown table here.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Write the JSON form here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Runs the matrix.
pub fn run(a: MatrixArgs) -> Result<i32, CliError> {
    let variant = if a.assert {
        Variant::ASSERT
    } else {
        Variant::RELEASE
    };
    let pins = select(&a.targets, variant).map_err(|e| CliError::usage(format!("{e:#}")))?;
    // With --built-only the versions the cache lacks stay in the table as unavailable columns:
    // a first failing or first fixed version is then a bound, and the table shows the gap.
    let built = if a.built_only {
        let built = kvaudit::targets::llama::build::cached_labels(None)
            .map_err(|e| CliError::harness(format!("{e:#}")))?;
        if !pins.iter().any(|p| built.contains_key(&p.label())) {
            return Err(CliError::usage(format!(
                "--targets {} --built-only: none of those versions is built",
                a.targets
            )));
        }
        Some(built)
    } else {
        None
    };
    let skip = |p: &kvaudit::targets::llama::pins::Pin| match &built {
        Some(b) if !b.contains_key(&p.label()) => Some("not built (--built-only)".to_string()),
        _ => None,
    };
    // Where the end writes, checked before the first version runs.
    super::args::writable_out("--markdown", a.markdown.as_deref())?;
    super::args::writable_out("--json", a.json.as_deref())?;
    let mut repros = Vec::new();
    for p in &a.paths {
        for file in repro_files(p).map_err(CliError::from)? {
            let repro = Repro::load(&file)
                .map_err(|e| CliError::usage(format!("{}: {e}", file.display())))?;
            repros.push((file, repro));
        }
    }
    let n = pins.len();
    let matrix = run_matrix(&repros, &pins, &skip, &mut |i, pin, file, outcome| {
        eprintln!(
            "[{}/{n}] {pin}: {}: {}",
            i + 1,
            file.display(),
            outcome.detail()
        );
    });
    print!("{}", matrix.terminal());
    let (markdown, json) = (matrix.markdown(), matrix.json());
    let files: Vec<(&std::path::Path, &str)> = [(&a.markdown, &markdown), (&a.json, &json)]
        .into_iter()
        .filter_map(|(path, text)| Some((path.as_deref()?, text.as_str())))
        .collect();
    write_or_aside("matrix", &files)?;
    let unavailable = matrix
        .rows
        .iter()
        .flat_map(|r| &r.outcomes)
        .any(|o| matches!(o, kvaudit::outputs::versions::Outcome::Unavailable { .. }));
    Ok(if unavailable {
        exit::HARNESS
    } else {
        exit::CLEAN
    })
}
