//! The command line: one clap-derive `Command` enum, one file per subcommand.
//!
//! Every subcommand returns an exit code (see [`kvaudit::base::exit`]) or a [`CliError`] that carries
//! its own code, so `main` stays tiny and nothing panics on bad input.

mod args;
mod audit;
mod bisect;
mod corpus;
mod coverage;
mod domain;
mod explain;
mod fixes;
mod fuzz;
mod hunt;
mod matrix;
mod measure;
mod merge;
mod model;
mod oracles;
mod progress;
mod replay;
mod report_bug;
mod repro;
mod shrink;
mod sizes;
mod target_cmd;

use clap::{Parser, Subcommand};

use kvaudit::base::exit;

/// kvaudit: audits the KV caches of LLM inference engines.
#[derive(Debug, Parser)]
#[command(name = "kvaudit", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// What to run on a build: a plan of every memory type, preset, configuration and oracle
    /// the target can run, spent within a budget; findings shrunk, grouped by root cause and
    /// classified against the corpus (known, regressed, fixed, new).
    Hunt(hunt::HuntArgs),
    /// Exhaustive audit: every op sequence of length 1..=depth over a domain.
    Audit(audit::AuditArgs),
    /// Print a domain's ops, in enumeration order, and their count.
    Domain(domain::DomainCmd),
    /// List the oracles: what each checks and reads, and the positive controls that show it fires.
    Oracles(oracles::OraclesArgs),
    /// Merge shard reports (JSON) into the report of the whole run.
    Merge(merge::MergeArgs),
    /// Random traces, every oracle after every op; each failure shrunk to a repro file.
    Fuzz(fuzz::FuzzArgs),
    /// Shrink a failing trace or repro file to a minimal repro.
    Shrink(shrink::ShrinkArgs),
    /// Replay repro files and say whether each recorded expectation still holds.
    Replay(replay::ReplayArgs),
    /// Write a standalone reproducer for a finding (C over llama.h, Python over mlx-lm); `--check` runs it.
    Repro(repro::ReproArgs),
    /// Draw a repro file's finding: the cells over the steps, as a self-contained SVG.
    Explain(explain::ExplainArgs),
    /// Write a Markdown bug report of a repro file's finding for the engine's tracker.
    ReportBug(report_bug::ReportBugArgs),
    /// Write the tiny GGUF model kvaudit runs an architecture on (what a C reproducer needs).
    Model(model::ModelArgs),
    /// Measure the numerical oracles T1-T3 on a llama.cpp pin against PREREG.md's predictions.
    Measure(measure::MeasureArgs),
    /// The memory's dump sizes over a grid of configurations (n_ctx, n_seq_max, streams,
    /// cells, n_rs_seq), as a Markdown table.
    Sizes(sizes::SizesArgs),
    /// Replay repro files on many llama.cpp versions: a table per finding per version.
    Matrix(matrix::MatrixArgs),
    /// Find the llama.cpp version (or, with --run under `git bisect run`, the commit) where a
    /// finding appears or disappears.
    Bisect(bisect::BisectArgs),
    /// The memory code of a `+cov` build that runs reached: a table per file, and with --out
    /// the Markdown, the unreached lines and an annotated HTML page per file.
    Coverage(coverage::CoverageArgs),
    /// Build and inspect targets (`kvaudit target build llama.cpp@0.1.156`).
    Target(target_cmd::TargetCmd),
    /// The fixes of known root causes (`corpora/fixes/`), and their check: a pin built with
    /// each (`llama.cpp@0.1.161+fix:NAME`), the corpus run on it and on the pin without it.
    Fixes(fixes::FixesCmd),
    /// What the regression corpus holds beside its repro files: `decisions` prints the
    /// decision tables (a row per root cause) that docs/results.md holds.
    Corpus(corpus::CorpusCmd),
}

/// A failure with the exit code it maps to.
#[derive(Debug)]
pub struct CliError {
    /// Exit code.
    pub code: i32,
    /// One line saying what failed.
    pub message: String,
}

impl CliError {
    /// Bad input: exit code [`exit::USAGE`].
    pub fn usage(message: impl Into<String>) -> Self {
        CliError {
            code: exit::USAGE,
            message: message.into(),
        }
    }

    /// The harness broke: exit code [`exit::HARNESS`].
    pub fn harness(message: impl Into<String>) -> Self {
        CliError {
            code: exit::HARNESS,
            message: message.into(),
        }
    }
}

impl From<kvaudit::base::error::Error> for CliError {
    fn from(e: kvaudit::base::error::Error) -> Self {
        CliError {
            code: e.exit_code(),
            message: e.message,
        }
    }
}

impl From<kvaudit::base::cache::HarnessError> for CliError {
    fn from(e: kvaudit::base::cache::HarnessError) -> Self {
        CliError::harness(e.to_string())
    }
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<i32, CliError> {
    match cli.command {
        Command::Hunt(h) => hunt::run(h),
        Command::Audit(a) => audit::run(a),
        Command::Domain(d) => domain::run(d),
        Command::Merge(m) => merge::run(m),
        Command::Coverage(c) => coverage::run(c),
        Command::Fixes(f) => fixes::run(f),
        Command::Corpus(c) => corpus::run(c),
        Command::Oracles(o) => oracles::run(o),
        Command::Fuzz(f) => fuzz::run(f),
        Command::Shrink(s) => shrink::run(s),
        Command::Replay(r) => replay::run(r),
        Command::Target(t) => target_cmd::run(t),
        Command::Repro(r) => repro::run(r),
        Command::Explain(e) => explain::run(e),
        Command::ReportBug(r) => report_bug::run(r),
        Command::Model(m) => model::run(m),
        Command::Sizes(a) => sizes::run(a),
        Command::Measure(m) => measure::run(m),
        Command::Matrix(m) => matrix::run(m),
        Command::Bisect(b) => bisect::run(b),
    }
}
