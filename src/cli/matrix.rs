//! `kvaudit matrix [--targets A..B | V1,V2,... | mlx-lm@all] FILE|DIR...`: every repro file on
//! every version of its engine, as a table for the terminal, Markdown and JSON.

use std::path::PathBuf;

use clap::Args;

use super::CliError;
use kvaudit::base::exit;
use kvaudit::base::files::write_or_aside;
use kvaudit::outputs::repro::{repro_files, Repro};
use kvaudit::outputs::versions::matrix::run_matrix;
use kvaudit::outputs::versions::{is_built, select_versions, Outcome};
use kvaudit::targets::llama::pins::Variant;

/// Arguments of `kvaudit matrix`.
#[derive(Debug, Args)]
pub struct MatrixArgs {
    /// Repro files, or folders of them (`*.json`).
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// The versions, comma-separated: llama.cpp's as `A..B` (every known version from A to B),
    /// `V1,V2,...` or `all`; another engine's by name (`mlx-lm@0.32.2`) or all of them
    /// (`mlx-lm@all`). A file runs on its own engine's versions only.
    #[arg(long, default_value = "all")]
    targets: String,
    /// The `+assert` builds of those versions (llama.cpp only).
    #[arg(long)]
    assert: bool,
    /// Only the versions the cache already holds (builds nothing).
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
    let versions = select_versions(&a.targets, variant).map_err(|e| CliError::usage(e.message))?;
    // With --built-only the versions the cache lacks stay in the table as unavailable columns:
    // a first failing or first fixed version is then a bound, and the table shows the gap.
    let built: Option<Vec<bool>> = if a.built_only {
        let built = versions
            .iter()
            .map(|v| is_built(v))
            .collect::<Result<Vec<bool>, _>>()
            .map_err(CliError::from)?;
        if !built.contains(&true) {
            return Err(CliError::usage(format!(
                "--targets {} --built-only: none of those versions is built",
                a.targets
            )));
        }
        Some(built)
    } else {
        None
    };
    let skip = |label: &str| {
        let at = versions.iter().position(|v| v == label)?;
        match &built {
            Some(b) if !b[at] => Some("not built (--built-only)".to_string()),
            _ => None,
        }
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
    let n = versions.len();
    let matrix = run_matrix(&repros, &versions, &skip, &mut |i, label, file, outcome| {
        eprintln!(
            "[{}/{n}] {label}: {}: {}",
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
        .any(|o| matches!(o, Outcome::Unavailable { .. }));
    Ok(if unavailable {
        exit::HARNESS
    } else {
        exit::CLEAN
    })
}
