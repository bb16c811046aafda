//! `kvaudit fixes`: the fixes built in (`corpora/fixes/`), and their check: each fix's build
//! (`llama.cpp@PIN+fix:NAME`) and the pin without it, every corpus file run on both and
//! compared (`kvaudit::outputs::fixes::check`), with a Markdown report per fix and the result
//! recorded in the fix's JSON.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::CliError;
use kvaudit::base::exit;
use kvaudit::outputs::corpus::Corpus;
use kvaudit::outputs::fixes::check::{check_fix, FixCheck};
use kvaudit::outputs::fixes::{Checked, Fix};
use kvaudit::outputs::repro::{today_utc, write_output};
use kvaudit::targets::llama::build::{ensure_built, BuildSpec, BuiltShim};
use kvaudit::targets::llama::fixes::EmbeddedFix;
use kvaudit::targets::llama::pins::Pin;

/// Arguments of `kvaudit fixes`.
#[derive(Debug, Args)]
pub struct FixesCmd {
    #[command(subcommand)]
    what: FixesWhat,
}

#[derive(Debug, Subcommand)]
enum FixesWhat {
    /// List the fixes: name, root cause, the pin each is checked on, its files, its last check.
    List,
    /// Build each fix's pin with and without it, run every corpus file on both, and require
    /// that the fix's files go from failing to holding and every other run ends as before.
    Check {
        /// Fix names (default with --all: every fix).
        names: Vec<String>,
        /// Every fix built in.
        #[arg(long, conflicts_with = "names")]
        all: bool,
        /// The corpus to run (default: the one built in).
        #[arg(long)]
        corpus: Option<PathBuf>,
        /// Write `NAME.md` here: every run on both builds.
        #[arg(long)]
        report_dir: Option<PathBuf>,
        /// Record the result in `NAME.json` under this folder (`corpora/fixes`).
        #[arg(long)]
        record: Option<PathBuf>,
    },
}

/// Runs `kvaudit fixes ...`.
pub fn run(c: FixesCmd) -> Result<i32, CliError> {
    let fixes = Fix::all().map_err(CliError::harness)?;
    match c.what {
        FixesWhat::List => {
            for (fix, embedded) in &fixes {
                let check = match fix.current_check(embedded) {
                    Some(c) => format!("checked {}: {}", c.date, c.result),
                    None => "not checked with this patch".to_string(),
                };
                println!(
                    "{} ({}, on {}): {}\n  files: {}\n  {check}",
                    fix.name,
                    fix.root_cause,
                    fix.check_on,
                    fix.cause,
                    fix.files.join(", ")
                );
            }
            Ok(exit::CLEAN)
        }
        FixesWhat::Check {
            names,
            all,
            corpus,
            report_dir,
            record,
        } => {
            if names.is_empty() && !all {
                return Err(CliError::usage(
                    "name the fixes to check, or --all".to_string(),
                ));
            }
            let corpus = Corpus::from_flag(corpus.as_deref()).map_err(CliError::usage)?;
            let chosen: Vec<&(Fix, &EmbeddedFix)> = if all {
                fixes.iter().collect()
            } else {
                names
                    .iter()
                    .map(|n| {
                        fixes.iter().find(|(f, _)| &f.name == n).ok_or_else(|| {
                            CliError::usage(format!("no fix `{n}` in corpora/fixes/"))
                        })
                    })
                    .collect::<Result<_, _>>()?
            };
            let mut all_passed = true;
            for (fix, embedded) in chosen {
                let (check, build) = check_one(fix, &corpus)?;
                println!("{}: {}", fix.name, check.result_line());
                for r in check.runs.iter().filter(|r| !r.verdict().passed()) {
                    println!("  {}", r.line());
                }
                all_passed &= check.passed();
                let report = report_dir
                    .as_ref()
                    .map(|d| d.join(format!("{}.md", fix.name)));
                if let Some(path) = &report {
                    let md = report_markdown(fix, embedded, &check, &build, corpus_name(&corpus));
                    write_output(path, &md).map_err(CliError::harness)?;
                }
                if let Some(dir) = &record {
                    let mut recorded = fix.clone();
                    recorded.checked = Some(Checked {
                        date: today_utc(),
                        patch_sha256: embedded.patch_sha256(),
                        target: check.target.clone(),
                        against: check.against.clone(),
                        result: check.result_line(),
                        passed: check.passed(),
                        report: report
                            .as_ref()
                            .map_or(String::new(), |p| p.display().to_string()),
                    });
                    let text = serde_json::to_string_pretty(&recorded)
                        .map_err(|e| CliError::harness(e.to_string()))?;
                    let path = dir.join(format!("{}.json", fix.name));
                    write_output(&path, &(text + "\n")).map_err(CliError::harness)?;
                }
            }
            Ok(if all_passed {
                exit::CLEAN
            } else {
                exit::FINDINGS
            })
        }
    }
}

/// Builds the fix's pin with and without it (the build with it described for the report),
/// then checks the corpus on both.
fn check_one(fix: &Fix, corpus: &Corpus) -> Result<(FixCheck, String), CliError> {
    let build = |label: &str| -> Result<BuiltShim, CliError> {
        let pin = Pin::parse(label).map_err(|e| CliError::usage(format!("{e:#}")))?;
        ensure_built(&BuildSpec::new(pin), true)
            .map_err(|e| CliError::harness(format!("building {label}: {e:#}")))
    };
    build(&fix.check_on)?;
    let built = build(&fix.target())?;
    let m = &built.manifest;
    let how = format!(
        "`{}`: {} of {} objects compiled, the others from the object cache; {:.0} s when built",
        m.pin,
        m.compiled,
        m.objects.len(),
        m.build_seconds
    );
    let mut n = 0;
    let check = check_fix(fix, corpus, &mut |_| n += 1).map_err(CliError::harness)?;
    Ok((check, how))
}

fn corpus_name(corpus: &Corpus) -> String {
    match &corpus.folder {
        Some(d) => format!("the {} files of {}", corpus.files.len(), d.display()),
        None => format!("the {} files of the corpus built in", corpus.files.len()),
    }
}

/// The report of one fix's check.
fn report_markdown(
    fix: &Fix,
    embedded: &EmbeddedFix,
    check: &FixCheck,
    build: &str,
    corpus: String,
) -> String {
    let mut s = format!(
        "# Fix `{}` ({}), checked on `{}`\n\n",
        fix.name, fix.root_cause, fix.check_on
    );
    let _ = writeln!(s, "Cause: {} (`{}`).\n", fix.cause, fix.source);
    if let Some(r) = &fix.revised {
        let _ = writeln!(s, "Revised from the draft: {r}\n");
    }
    let _ = writeln!(
        s,
        "- patch: `corpora/fixes/{}.patch`, sha256 `{}`",
        fix.name,
        embedded.patch_sha256()
    );
    let _ = writeln!(s, "- build: {build}");
    let _ = writeln!(
        s,
        "- command: `kvaudit fixes check {} --report-dir reports/fixes --record corpora/fixes` ({}), \
         run by `scripts/fixes-check.sh`",
        fix.name,
        today_utc()
    );
    let _ = writeln!(s, "- corpus: {corpus}, each run on both builds");
    let _ = writeln!(s, "- result: **{}**\n", check.result_line());
    s.push_str(&check.markdown_table());
    s
}
