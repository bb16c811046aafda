//! `kvaudit hunt`: what to run on a build. The plan (`engines::hunt::plan`), spent within the
//! budget (`engines::hunt::run`), its groups classified against the corpus and the new ones
//! written out (`outputs::hunt`); the summary in the terminal, `DIR/summary.md` and
//! `DIR/summary.json`.
//!
//! What the end needs (the corpus, a writable `DIR`, a C compiler on a llama.cpp target) is
//! checked before the first trial; a failure after it still writes the summary, marked
//! partial, in `DIR` or, if `DIR` cannot be written any more, in a folder aside.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;

use super::audit::{shard_from, stop_on_signals};
use super::progress::duration;
use super::CliError;
use kvaudit::base::error::Error;
use kvaudit::base::exit;
use kvaudit::base::files::{check_writable_folder, read_text_limited, write_or_aside};
use kvaudit::engines::hunt::again::finish_stopped_shrinks;
use kvaudit::engines::hunt::budget::{plan_share, BudgetClock};
use kvaudit::engines::hunt::{
    allocate, merge_shards, plan, probe_or_refusal, run_hunt, shard_entries, HuntConfig, HuntEvent,
};
use kvaudit::engines::shrink::ShrinkConfig;
use kvaudit::outputs::c_repro::check::check_compilers;
use kvaudit::outputs::corpus::Corpus;
use kvaudit::outputs::hunt::by_fix::explain_by_fix;
use kvaudit::outputs::hunt::{
    checks_programs, classify, corpus_entries, decision_entries, write_new_groups,
};
use kvaudit::outputs::repro::{check_date, today_utc};
use kvaudit::records::hunt::{
    Budget, FuzzShare, HuntSummary, PlanEntry, Support, MAX_SUMMARY_BYTES,
};
use kvaudit::records::report::Shard;
use kvaudit::records::text::terminal_text;
use kvaudit::targets::registry::TargetSpec;

/// Arguments of `kvaudit hunt`.
#[derive(Debug, Args)]
pub struct HuntArgs {
    /// The build to hunt in: `llama.cpp@VERSION[+assert]`, `llama.cpp@src:PATH`, or `native`.
    #[arg(long, default_value = "native")]
    target: String,
    /// Faults to inject (native only): a positive control of the hunt itself.
    #[arg(long = "inject", value_delimiter = ',')]
    inject: Vec<String>,
    /// What the hunt may spend: wall time (`90`, `30s`, `5m`, `1h`; everything included, it
    /// ends within it plus 10%) or trials (`5000trials`: exhaustive trials and fuzz cases,
    /// deterministic for a seed).
    #[arg(long, default_value = "30m")]
    budget: String,
    /// The folder of the summary (`summary.md`, `summary.json`) and of the new groups' files
    /// (`new/`).
    #[arg(long, default_value = "hunt")]
    out: PathBuf,
    /// Print the plan with each entry's estimate (each entry's setup probed on the target) and
    /// exit.
    #[arg(long)]
    plan: bool,
    /// Continue the stopped hunt whose summary is in this folder (same target, budget, seed).
    #[arg(long, value_name = "DIR")]
    resume: Option<PathBuf>,
    /// Run shard K of M of the plan's entries (`K/M`; also from SLURM_ARRAY_TASK_ID and
    /// SLURM_ARRAY_TASK_COUNT, as `audit` reads them).
    #[arg(long)]
    shard: Option<String>,
    /// The fuzz seed: entry i of the plan fuzzes with seed + i.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Only these entries of the plan (comma-separated ids, as `--plan` lists them).
    #[arg(long, value_delimiter = ',')]
    entries: Vec<String>,
    /// The regression corpus the groups are classified against: the repro files of DIR instead
    /// of the corpus built into kvaudit (its source's `corpora/`).
    #[arg(long, value_name = "DIR")]
    corpus: Option<PathBuf>,
    /// Threads of each exhaustive run (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// The new repro files' `since` date, YYYY-MM-DD (default: today, UTC).
    #[arg(long, env = "KVAUDIT_DATE")]
    date: Option<String>,
    /// No progress on stderr.
    #[arg(long, short)]
    quiet: bool,
}

fn usage(e: kvaudit::base::error::Error) -> CliError {
    CliError::usage(e.message)
}

fn load_summary(dir: &Path) -> Result<HuntSummary, CliError> {
    let path = dir.join("summary.json");
    let text = read_text_limited(&path, MAX_SUMMARY_BYTES)
        .map_err(|e| CliError::usage(format!("{}: {e}", path.display())))?;
    HuntSummary::parse(&text).map_err(|e| CliError::usage(format!("{}: {e}", path.display())))
}

/// Writes the summary into `dir`; if `dir` cannot be written, into a folder aside, and the
/// error says where it went.
fn write_summary(dir: &Path, s: &HuntSummary) -> Result<(), CliError> {
    let (json, markdown) = (dir.join("summary.json"), dir.join("summary.md"));
    write_or_aside(
        "hunt",
        &[
            (json.as_path(), &s.to_json()),
            (markdown.as_path(), &s.to_markdown()),
        ],
    )
    .map_err(CliError::from)
}

/// The summary written (aside if need be) after a failure `e` once the work began: marked
/// partial, and the error says so.
fn write_partial(dir: &Path, s: &mut HuntSummary, e: &Error) -> CliError {
    if s.failed.is_none() {
        s.failed = Some(e.message.clone());
    }
    let written = write_summary(dir, s);
    print!("{}", s.to_terminal());
    match written {
        Ok(()) => CliError::harness(format!(
            "{}; the partial summary is in {}",
            e.message,
            dir.join("summary.md").display()
        )),
        Err(aside) => CliError::harness(format!("{}; {}", e.message, aside.message)),
    }
}

/// Prints the plan with each entry's estimate; entries are probed on the target.
fn print_plan(
    target: &TargetSpec,
    entries: &[(usize, &PlanEntry)],
    budget: Budget,
) -> Result<(), CliError> {
    let mut memory: Vec<_> = entries.iter().map(|(_, e)| e.memory).collect();
    memory.sort();
    memory.dedup();
    let mut oracles: Vec<_> = entries
        .iter()
        .flat_map(|(_, e)| e.oracles.clone())
        .collect();
    oracles.sort();
    oracles.dedup();
    println!(
        "hunt plan of {}: {} entries, budget {}",
        terminal_text(&target.name),
        entries.len(),
        budget.describe()
    );
    println!(
        "memory types: {}",
        memory
            .iter()
            .map(|m| m.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "oracles: {}",
        oracles
            .iter()
            .map(|o| o.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let share = plan_share(budget, entries.len());
    for (_, e) in entries {
        let (support, per_trial) = probe_or_refusal(target, e).map_err(CliError::from)?;
        let est = allocate(e, support, per_trial, budget, share);
        let cost = match (&est.support, est.fuzz) {
            (Support::Unsupported { reason }, _) => format!("UNSUPPORTED: {reason}"),
            (Support::Runs, FuzzShare::Seconds(f)) => format!(
                "exhaustive depth {} ({} trials, {:.3} ms/trial), then fuzz {}; about {}",
                est.depth,
                est.exhaustive_trials,
                1e3 * est.seconds_per_trial.unwrap_or(0.0),
                duration(f),
                duration(est.share_s.unwrap_or(0.0))
            ),
            (Support::Runs, FuzzShare::Cases(n)) => format!(
                "exhaustive depth {} ({} trials), then {n} fuzz cases",
                est.depth, est.exhaustive_trials
            ),
        };
        println!(
            "{:<28} {:<9} {:<40} {} ops: {}\n    oracles: {}",
            terminal_text(&e.id),
            e.memory.name(),
            terminal_text(&e.pairing.label()),
            est.ops,
            terminal_text(&cost),
            e.oracles
                .iter()
                .map(|o| o.name())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

/// Classifies the summary's groups against `corpus` (its files, then its fixes and the
/// target's faults for the groups no file matched) and writes the new ones' files into `out`
/// (the summary is the caller's to write, whatever this returns).
fn finish(
    s: &mut HuntSummary,
    plan: &[PlanEntry],
    (corpus, out): (&Corpus, &Path),
    date: &str,
    check_until: Option<Instant>,
) -> Result<(), Error> {
    let entries = corpus_entries(corpus, s);
    s.corpus = Some(corpus.used());
    let decisions = decision_entries(corpus);
    classify(s, &entries, &decisions, plan, check_until);
    explain_by_fix(s, (&entries, &decisions), &corpus.fixes, plan, check_until);
    write_new_groups(s, plan, out, date, check_until)
}

/// What the end of a hunt or merge into `out` needs, checked before its first trial: the
/// corpus (`--corpus DIR`, else the built-in one), `out` made and writable, and on a
/// llama.cpp target a C compiler for the new groups' programs.
fn preconditions(
    corpus: Option<&Path>,
    out: &Path,
    target: &TargetSpec,
) -> Result<Corpus, CliError> {
    let corpus = Corpus::from_flag(corpus)?;
    check_writable_folder(out).map_err(|e| CliError::usage(format!("--out {e}")))?;
    std::fs::create_dir_all(out)
        .map_err(|e| CliError::usage(format!("--out {}: {e}", out.display())))?;
    if checks_programs(target) {
        check_compilers()?;
    }
    Ok(corpus)
}

/// Whether `path` names a hunt's folder (or its `summary.json`) for `kvaudit merge`: a folder,
/// or anything but an audit report's `.json` file.
pub fn is_hunt_summary(path: &Path) -> bool {
    path.is_dir()
        || path.file_name().is_some_and(|n| n == "summary.json")
        || !matches!(path.extension(), Some(e) if e == "json")
}

/// `kvaudit merge` of a hunt's shards: the summaries in `parts` (folders, or their
/// `summary.json`) merged into the folder `out`, grouped and classified against `corpus` again,
/// with the new groups' files (C programs checked on the target, with no deadline).
pub fn merge_shards_into(
    parts: &[PathBuf],
    out: &Path,
    corpus: Option<&Path>,
    date: Option<&str>,
    shrink_again: Option<u64>,
) -> Result<i32, CliError> {
    let date = match date {
        Some(d) => check_date(d).map_err(|e| CliError::usage(format!("--date: {e}")))?,
        None => today_utc(),
    };
    let summaries = parts
        .iter()
        .map(|p| {
            load_summary(if p.is_dir() {
                p
            } else {
                p.parent().unwrap_or(p)
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut whole = merge_shards(summaries).map_err(usage)?;
    let target = TargetSpec::new(&whole.target, &whole.faults);
    let corpus = preconditions(corpus, out, &target)?;
    let plan = plan(&target);
    if let Some(executions) = shrink_again {
        let cfg = ShrinkConfig {
            max_executions: executions,
            ..ShrinkConfig::default()
        };
        let done = finish_stopped_shrinks(&mut whole, &target, &plan, &cfg)?;
        eprintln!(
            "kvaudit merge: {} finding(s) shrunk again (stopped shrinks, groups' representatives): \
             {} to a fixed point, {} stopped again at {executions} executions, {} not failing \
             again, {} of an entry not in the plan",
            done.stopped, done.finished, done.still_stopped, done.not_reproduced, done.no_entry
        );
    }
    if let Err(e) = finish(&mut whole, &plan, (&corpus, out), &date, None) {
        return Err(write_partial(out, &mut whole, &e));
    }
    write_summary(out, &whole)?;
    print!("{}", whole.to_terminal());
    Ok(exit_code(&whole))
}

/// Runs the hunt.
pub fn run(mut a: HuntArgs) -> Result<i32, CliError> {
    let budget = Budget::parse(&a.budget)
        .map_err(|e| CliError::usage(format!("--budget: {}", e.message)))?;
    let date = match &a.date {
        Some(d) => check_date(d).map_err(|e| CliError::usage(format!("--date: {e}")))?,
        None => today_utc(),
    };
    let target = TargetSpec::new(&a.target, &a.inject);
    // A name or fault the target cannot take is refused before anything runs.
    target.factory().map(drop)?;
    let plan = plan(&target);
    if let Some(bad) = a
        .entries
        .iter()
        .find(|id| !plan.iter().any(|e| &e.id == *id))
    {
        return Err(CliError::usage(format!(
            "--entries: no entry '{bad}' in the plan (kvaudit hunt --plan lists them)"
        )));
    }
    let wanted = |e: &PlanEntry| a.entries.is_empty() || a.entries.contains(&e.id);
    let resume = match &a.resume {
        Some(dir) => {
            let r = load_summary(dir)?;
            a.out = dir.clone();
            Some(r)
        }
        None => None,
    };
    let mut shard = shard_from(a.shard.as_deref(), &|k| std::env::var(k).ok())?;
    if let Some(r) = resume.as_ref().filter(|_| shard == Shard::WHOLE) {
        shard = r.shard;
    }
    if a.plan {
        let mut entries = shard_entries(&plan, shard);
        entries.retain(|(_, e)| wanted(e));
        print_plan(&target, &entries, budget)?;
        return Ok(exit::CLEAN);
    }
    if let Some(r) = &resume {
        let blank = HuntSummary {
            target: target.name.clone(),
            faults: target.faults.clone(),
            budget,
            seed: a.seed,
            plan: plan.iter().map(|e| e.id.clone()).collect(),
            only: a.entries.clone(),
            ..r.clone()
        };
        if !r.same_hunt(&blank) || r.shard != shard {
            return Err(CliError::usage(
                "--resume: that summary is of another hunt (target, --inject, --budget, --seed, --shard or the plan differ)",
            ));
        }
    }
    let corpus = preconditions(a.corpus.as_deref(), &a.out, &target)?;
    let started = Instant::now();
    let spent_before = resume.as_ref().map_or(0.0, |r| r.elapsed_s);
    let stop = stop_on_signals()?;
    let cfg = HuntConfig {
        target: target.clone(),
        budget,
        seed: a.seed,
        shard,
        threads: a
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        plan: plan.clone(),
        only: a.entries.clone(),
        resume,
        stop: &stop,
    };
    if !a.quiet {
        eprintln!(
            "kvaudit hunt: {}{}, budget {}, seed {}, {} of {} plan entries",
            terminal_text(&target.name),
            target
                .faults
                .iter()
                .map(|f| format!("[{f}]"))
                .collect::<String>(),
            budget.describe(),
            a.seed,
            shard_entries(&plan, shard)
                .iter()
                .filter(|(_, e)| wanted(e))
                .count(),
            plan.len()
        );
    }
    let quiet = a.quiet;
    let mut show = |e: &HuntEvent<'_>| {
        if quiet {
            return;
        }
        match e {
            HuntEvent::EntryStart {
                index,
                of,
                entry,
                estimate,
                left_s,
            } => {
                let fuzz = match estimate.fuzz {
                    FuzzShare::Seconds(s) => format!("fuzz {}", duration(s)),
                    FuzzShare::Cases(n) => format!("{n} fuzz cases"),
                };
                let eta = match (estimate.share_s, left_s) {
                    (Some(s), Some(l)) => {
                        format!(", eta {} (hunt: {} left)", duration(s), duration(*l))
                    }
                    _ => String::new(),
                };
                eprintln!(
                    "[{index}/{of}] {} ({}, {}): depth {} ({} trials), then {fuzz}{eta}",
                    terminal_text(&entry.id),
                    entry.memory.name(),
                    terminal_text(&entry.pairing.label()),
                    estimate.depth,
                    estimate.exhaustive_trials
                );
            }
            HuntEvent::Unsupported { entry, reason } => eprintln!(
                "[-] {}: unsupported: {}",
                terminal_text(&entry.id),
                terminal_text(reason)
            ),
            HuntEvent::EntryDone(o) => eprintln!(
                "      {} trials, {} fuzz cases, {} repeats, {:.1} s{}",
                o.trials,
                o.fuzz_cases,
                o.repeats,
                o.elapsed_s,
                match o.not_reproduced.len() {
                    0 => String::new(),
                    n => format!(", {n} failure(s) not reproduced on replay"),
                }
            ),
            HuntEvent::Run(_) => {}
        }
    };
    let mut summary = run_hunt(&cfg, &mut show)?;
    if let Some(why) = summary.failed.clone() {
        return Err(write_partial(&a.out, &mut summary, &Error::harness(why)));
    }
    if summary.incomplete {
        write_summary(&a.out, &summary)?;
        print!("{}", summary.to_terminal());
        eprintln!(
            "kvaudit hunt: stopped; the summary in {} is partial: continue with --resume {}",
            a.out.display(),
            a.out.display()
        );
        return Ok(exit::INCOMPLETE);
    }
    // New groups. C programs are checked while the budget lasts (the part the entries leave,
    // `engines::hunt::budget`).
    let check_until = BudgetClock::start(budget, started, spent_before, 0).hunt_end();
    let finished = finish(&mut summary, &plan, (&corpus, &a.out), &date, check_until);
    summary.code_lines = super::coverage::total_lines(summary.code.as_ref());
    summary.elapsed_s = spent_before + started.elapsed().as_secs_f64();
    if let Err(e) = finished {
        return Err(write_partial(&a.out, &mut summary, &e));
    }
    write_summary(&a.out, &summary)?;
    print!("{}", summary.to_terminal());
    if !a.quiet {
        eprintln!(
            "kvaudit hunt: summary in {}",
            a.out.join("summary.md").display()
        );
    }
    Ok(exit_code(&summary))
}

/// Findings (exit 1) when a non-advisory group is new or regressed: known bugs of the build do
/// not fail its hunt.
fn exit_code(s: &HuntSummary) -> i32 {
    if s.failing_groups() > 0 {
        exit::FINDINGS
    } else {
        exit::CLEAN
    }
}
