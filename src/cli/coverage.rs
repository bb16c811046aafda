//! `kvaudit coverage RUN...`: the memory code of a `+cov` build that runs reached. Each RUN is a
//! fuzz report (JSON, `fuzz.code`), an audit's report (`code`) or a hunt's summary
//! (`summary.json` or its folder, `code`, by part `code_parts`); their points (the ops' and
//! those outside the ops) are joined per build and mapped to lines on the build (found in, or
//! made through, the content-keyed cache) by `objdump` and `addr2line`. Prints a table per
//! file and the lines each part of each run reached; with `--out DIR`, writes `coverage.md`
//! (both tables), `coverage.json` (the figures), `unreached.md` (the instrumented lines no run
//! reached, as runs of lines) and an annotated HTML page per file (`index.html` links them).

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

/// The code set a run file holds, and its parts (a hunt's `exhaustive` and `fuzz`; a report is
/// one part, named by its kind).
fn code_of(path: &Path) -> Result<Option<(CodeSet, Vec<(String, CodeSet)>)>, CliError> {
    let file = if path.is_dir() {
        path.join("summary.json")
    } else {
        path.to_path_buf()
    };
    let text = read_text_limited(&file, MAX_REPORT_BYTES).map_err(CliError::usage)?;
    if let Ok(report) = serde_json::from_str::<Report>(&text) {
        let (part, code) = match report.fuzz {
            Some(f) => ("fuzz", f.code),
            None => ("exhaustive", report.code),
        };
        return Ok(code.map(|c| (c.clone(), vec![(part.to_string(), c)])));
    }
    let summary = HuntSummary::parse(&text).map_err(|e| {
        CliError::usage(format!(
            "{}: neither a report nor a hunt summary: {e}",
            file.display()
        ))
    })?;
    Ok(summary
        .code
        .map(|c| (c, summary.code_parts.into_iter().collect())))
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
        let files = lines_reached(&map, &code.all()).map_err(|e| e.to_string())?;
        Ok(total(&figures(&files)))
    })();
    mapped
        .map_err(|e| eprintln!("kvaudit hunt: the memory code reached is not mapped to lines: {e}"))
        .ok()
}

/// The file whose share of reachable lines the goal names (docs/performance.md).
const KV_CACHE: &str = "src/llama-kv-cache.cpp";

/// The lines one part of a run reached: all points and the ops' alone, in every file and in
/// [`KV_CACHE`].
struct PartLines {
    part: String,
    all: FileCoverage,
    all_kv: FileCoverage,
    ops: FileCoverage,
    ops_kv: FileCoverage,
}

fn part_lines<'a>(
    map: &CodeMap,
    parts: impl Iterator<Item = &'a (String, CodeSet)>,
) -> Result<Vec<PartLines>, CliError> {
    let kv = |files: &BTreeMap<String, _>| {
        figures(files)
            .into_iter()
            .find(|f| f.file == KV_CACHE)
            .unwrap_or_default()
    };
    parts
        .map(|(part, c)| {
            let all = lines_reached(map, &c.all())?;
            let ops = lines_reached(map, &c.pcs)?;
            Ok(PartLines {
                part: part.clone(),
                all: total(&figures(&all)),
                all_kv: kv(&all),
                ops: total(&figures(&ops)),
                ops_kv: kv(&ops),
            })
        })
        .collect()
}

impl PartLines {
    /// The row's cells: the part's name and its four figures.
    fn cells(&self, name: String) -> [String; 5] {
        [
            name,
            self.all.lines_reached.to_string(),
            self.all_kv.lines_reached.to_string(),
            self.ops.lines_reached.to_string(),
            self.ops_kv.lines_reached.to_string(),
        ]
    }
}

fn terminal_parts(parts: &[PartLines]) -> String {
    let row = |c: [String; 5]| {
        format!(
            "{:<44} {:>7} {:>9} {:>7} {:>9}\n",
            c[0], c[1], c[2], c[3], c[4]
        )
    };
    let head = ["part", "lines", "kv-cache", "ops", "kv (ops)"].map(String::from);
    std::iter::once(row(head))
        .chain(
            parts
                .iter()
                .map(|p| row(p.cells(kvaudit::records::text::terminal_text(&p.part)))),
        )
        .collect()
}

fn markdown_parts(parts: &[PartLines]) -> String {
    let mut s = format!(
        "| part | lines | `{KV_CACHE}` | lines (ops) | `{KV_CACHE}` (ops) |\n|---|---:|---:|---:|---:|\n"
    );
    for p in parts {
        s.push_str(&format!(
            "| {} |\n",
            p.cells(kvaudit::records::text::markdown_code(&p.part))
                .join(" | ")
        ));
    }
    s
}

/// Maps, prints and writes.
pub fn run(a: CoverageArgs) -> Result<i32, CliError> {
    // The points of every run, joined per build, and each run's parts.
    let mut builds: BTreeMap<String, CodeSet> = BTreeMap::new();
    let mut parts: Vec<(String, CodeSet)> = Vec::new();
    for p in &a.runs {
        let Some((code, run_parts)) = code_of(p)? else {
            return Err(CliError::usage(format!(
                "{}: the run recorded no coverage (run it on a `+cov` build, e.g. llama.cpp@0.1.161+cov)",
                p.display()
            )));
        };
        builds
            .entry(code.build.clone())
            .or_insert_with(|| CodeSet::new(&code.build))
            .join(&code);
        parts.extend(
            run_parts
                .into_iter()
                .map(|(part, c)| (format!("{}: {part}", p.display()), c)),
        );
    }
    for (build, set) in &builds {
        let pin = Pin::parse(build).map_err(|e| CliError::usage(e.to_string()))?;
        let built = ensure_built(&BuildSpec::new(pin), true)
            .map_err(|e| CliError::harness(e.to_string()))?;
        let map = CodeMap::of_build(&built).map_err(|e| CliError::harness(e.to_string()))?;
        let all = set.all();
        let files = lines_reached(&map, &all)?;
        let table = figures(&files);
        println!(
            "memory code of {build} reached by {} run(s): {} points ({} by the ops, {} outside them)",
            a.runs.len(),
            all.len(),
            set.pcs.len(),
            set.outside.len()
        );
        print!("{}", terminal_table(&table));
        let by_part = part_lines(&map, parts.iter().filter(|(_, c)| &c.build == build))?;
        print!("{}", terminal_parts(&by_part));
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
                "# Memory code of `{build}` reached\n\nBy {}: {} coverage points (basic blocks) reached, {} by the trace's ops and {} outside them (the context's construction, the setup, resets, observations). A line is instrumented when a coverage point maps to it (`addr2line`), reached when a reached point does.\n\n{}\n## By part\n\nThe lines each part of each run reached, in all files and in `{KV_CACHE}`; \"ops\" are the trace's ops alone.\n\n{}",
                runs.iter().map(|r| format!("`{r}`")).collect::<Vec<_>>().join(", "),
                all.len(),
                set.pcs.len(),
                set.outside.len(),
                markdown_table(&table),
                markdown_parts(&by_part)
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
