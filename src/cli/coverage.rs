//! `kvaudit coverage RUN...`: the memory code of a `+cov` build that runs reached. Each RUN is a
//! fuzz report (JSON, `fuzz.code`) or a hunt's summary (`summary.json` or its folder, `code`);
//! their points are joined per build and mapped to lines on the build (found in, or made
//! through, the content-keyed cache) by `objdump` and `addr2line`. Prints a table per file;
//! with `--out DIR`, writes `coverage.md`, `coverage.json` (the figures), `unreached.md` (the
//! instrumented lines no run reached, as runs of lines) and an annotated HTML page per file
//! (`index.html` links them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args;

use super::CliError;
use kvaudit::base::exit;
use kvaudit::base::files::{read_text_limited, write_atomically};
use kvaudit::outputs::coverage::{
    figures, html_index, html_page, lines_reached, page_name, unreached_runs,
};
use kvaudit::records::code::{markdown_table, terminal_table, total, CodeSet, FileCoverage};
use kvaudit::records::hunt::HuntSummary;
use kvaudit::records::report::{Report, MAX_REPORT_BYTES};
use kvaudit::targets::llama::build::cov::CodeMap;
use kvaudit::targets::llama::build::{ensure_built, BuildSpec};
use kvaudit::targets::llama::pins::Pin;

/// Arguments of `kvaudit coverage`.
#[derive(Debug, Args)]
pub struct CoverageArgs {
    /// Fuzz reports (JSON) or hunt summaries (`summary.json`, or the hunt's folder) of runs on a
    /// `+cov` build.
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// Write the Markdown table, the figures as JSON, the unreached lines and the HTML pages
    /// into this folder.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The code set a run file holds.
fn code_of(path: &Path) -> Result<Option<CodeSet>, CliError> {
    let file = if path.is_dir() {
        path.join("summary.json")
    } else {
        path.to_path_buf()
    };
    let text = read_text_limited(&file, MAX_REPORT_BYTES).map_err(CliError::usage)?;
    if let Ok(report) = serde_json::from_str::<Report>(&text) {
        return Ok(report.fuzz.and_then(|f| f.code));
    }
    let summary = HuntSummary::parse(&text).map_err(|e| {
        CliError::usage(format!(
            "{}: neither a report nor a hunt summary: {e}",
            file.display()
        ))
    })?;
    Ok(summary.code)
}

/// The line coverage of `code` over its build's memory sources, all files together (a hunt's
/// summary carries it); `None` without code points, or when the build cannot be mapped (said
/// on stderr: the summary keeps the points, `kvaudit coverage` maps them later).
pub fn total_lines(code: Option<&CodeSet>) -> Option<FileCoverage> {
    let code = code?;
    let mapped = (|| -> Result<FileCoverage, String> {
        let pin = Pin::parse(&code.build).map_err(|e| e.to_string())?;
        let built = ensure_built(&BuildSpec::new(pin), false).map_err(|e| e.to_string())?;
        let map = CodeMap::of_build(&built).map_err(|e| e.to_string())?;
        let files = lines_reached(&map, &code.pcs).map_err(|e| e.to_string())?;
        Ok(total(&figures(&files)))
    })();
    mapped
        .map_err(|e| eprintln!("kvaudit hunt: the memory code reached is not mapped to lines: {e}"))
        .ok()
}

/// Maps, prints and writes.
pub fn run(a: CoverageArgs) -> Result<i32, CliError> {
    // The points of every run, joined per build.
    let mut builds: BTreeMap<String, CodeSet> = BTreeMap::new();
    for p in &a.runs {
        let Some(code) = code_of(p)? else {
            return Err(CliError::usage(format!(
                "{}: the run recorded no coverage (run it on a `+cov` build, e.g. llama.cpp@0.1.161+cov)",
                p.display()
            )));
        };
        let set = builds
            .entry(code.build.clone())
            .or_insert_with(|| CodeSet::new(&code.build));
        set.pcs.extend(code.pcs);
        set.edges = set.edges.max(code.edges);
    }
    for (build, set) in &builds {
        let pin = Pin::parse(build).map_err(|e| CliError::usage(e.to_string()))?;
        let built = ensure_built(&BuildSpec::new(pin), true)
            .map_err(|e| CliError::harness(e.to_string()))?;
        let map = CodeMap::of_build(&built).map_err(|e| CliError::harness(e.to_string()))?;
        let files = lines_reached(&map, &set.pcs)?;
        let table = figures(&files);
        println!(
            "memory code of {build} reached by {} run(s): {} points",
            a.runs.len(),
            set.pcs.len()
        );
        print!("{}", terminal_table(&table));
        let Some(dir) = &a.out else { continue };
        let dir = if builds.len() > 1 {
            dir.join(build.replace(['/', ':'], "_"))
        } else {
            dir.clone()
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| CliError::harness(format!("creating {}: {e}", dir.display())))?;
        let write = |name: &str, text: &str| {
            write_atomically(&dir.join(name), text).map_err(|e| {
                CliError::harness(format!("writing {}: {e}", dir.join(name).display()))
            })
        };
        let runs: Vec<String> = a.runs.iter().map(|p| p.display().to_string()).collect();
        write(
            "coverage.md",
            &format!(
                "# Memory code of `{build}` reached\n\nBy {}: {} coverage points (basic blocks) reached. A line is instrumented when a coverage point maps to it (`addr2line`), reached when a reached point does.\n\n{}",
                runs.iter().map(|r| format!("`{r}`")).collect::<Vec<_>>().join(", "),
                set.pcs.len(),
                markdown_table(&table)
            ),
        )?;
        write(
            "coverage.json",
            &serde_json::to_string_pretty(&table).expect("figures serialize"),
        )?;
        let mut unreached = format!("# Instrumented lines of `{build}` no run reached\n\n");
        for (file, lines) in &files {
            let runs = unreached_runs(lines);
            if runs.is_empty() {
                continue;
            }
            let list: Vec<String> = runs
                .iter()
                .map(|&(a, b)| {
                    if a == b {
                        a.to_string()
                    } else {
                        format!("{a}..={b}")
                    }
                })
                .collect();
            unreached.push_str(&format!("- `{file}`: {}\n", list.join(", ")));
        }
        write("unreached.md", &unreached)?;
        write("index.html", &html_index(build, &table))?;
        for (file, lines) in &files {
            let source = std::fs::read_to_string(map.tree.join(file)).unwrap_or_default();
            write(&page_name(file), &html_page(file, build, &source, lines))?;
        }
        println!("wrote {}", dir.display());
    }
    Ok(exit::CLEAN)
}
