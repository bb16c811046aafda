//! `kvaudit bisect FILE --good V1 --bad V2`: the version where a finding appears or disappears;
//! `kvaudit bisect FILE --run [--tree DIR]`: one step of `git bisect run` on a source tree.

use std::path::PathBuf;

use clap::Args;

use super::CliError;
use kvaudit::base::exit;
use kvaudit::outputs::repro::Repro;
use kvaudit::outputs::versions::bisect::{bisect, BisectAnswer, GitVerdict};
use kvaudit::outputs::versions::{build, outcome_on, Outcome};
use kvaudit::targets::llama::pins::{known_versions, Pin, Variant};
use kvaudit::targets::registry::TargetKind;

/// Arguments of `kvaudit bisect`.
#[derive(Debug, Args)]
pub struct BisectArgs {
    /// The repro file whose finding to bisect.
    file: PathBuf,
    /// A version where the finding is absent.
    #[arg(long, required_unless_present = "run", conflicts_with = "run")]
    good: Option<String>,
    /// A version where the finding is present (fails or crashes).
    #[arg(long, required_unless_present = "run", conflicts_with = "run")]
    bad: Option<String>,
    /// Probe the `+assert` builds.
    #[arg(long)]
    assert: bool,
    /// One step of `git bisect run` on the source tree at --tree: exit 0 if the finding is
    /// absent, 1 if present, 125 if the tree cannot be built or take the trace, 128 if kvaudit
    /// broke.
    #[arg(long)]
    run: bool,
    /// The llama.cpp checkout for --run.
    #[arg(long, default_value = ".", requires = "run")]
    tree: PathBuf,
    /// With --run: bisect for the fix (exit 0 if the finding is present, 1 if absent).
    #[arg(long, requires = "run")]
    fix: bool,
}

/// Runs the bisection, or one step of it.
pub fn run(a: BisectArgs) -> Result<i32, CliError> {
    let repro =
        Repro::load(&a.file).map_err(|e| CliError::usage(format!("{}: {e}", a.file.display())))?;
    let suffix = if a.assert {
        Variant::ASSERT.suffix()
    } else {
        String::new()
    };
    if a.run {
        return Ok(git_step(&repro, &a, &suffix).exit_code());
    }
    let versions = known_versions().map_err(|e| CliError::harness(format!("{e:#}")))?;
    // A version given as a pin's name (`llama.cpp@0.1.112`) is that pin's version.
    let bare = |v: &str| {
        let v = v.trim();
        match TargetKind::parse(v) {
            Ok(TargetKind::Llama) => TargetKind::version_of(v).unwrap_or(v).to_string(),
            Ok(
                TargetKind::Native
                | TargetKind::NativeTensors
                | TargetKind::PythonRef
                | TargetKind::Mlx,
            )
            | Err(_) => v.to_string(),
        }
    };
    let (good, bad) = (
        bare(a.good.as_deref().unwrap_or_default()),
        bare(a.bad.as_deref().unwrap_or_default()),
    );
    println!(
        "bisecting {} ({}) between good {good} and bad {bad}",
        a.file.display(),
        repro.oracle
    );
    let mut n = 0;
    let result = bisect(
        &versions,
        &good,
        &bad,
        &mut |v| {
            let pin = Pin {
                version: v.to_string(),
                variant: if a.assert {
                    Variant::ASSERT
                } else {
                    Variant::RELEASE
                },
                tree: None,
                fixes: Vec::new(),
            };
            match build(&pin) {
                Ok(()) => outcome_on(&repro, &pin.label()),
                Err(e) => Outcome::Unavailable { reason: e.message },
            }
        },
        &mut |step| {
            n += 1;
            println!(
                "step {n}: llama.cpp@{}{suffix}: {} ({})",
                step.version,
                step.outcome.word(),
                step.outcome.detail()
            );
        },
    )
    .map_err(CliError::from)?;
    println!("{}", result.answer.sentence());
    Ok(match result.answer {
        BisectAnswer::Changed { .. } => exit::CLEAN,
        BisectAnswer::Ambiguous { .. } => exit::HARNESS,
    })
}

/// One `git bisect run` step: build the tree (skip if it does not build), replay, verdict.
fn git_step(repro: &Repro, a: &BisectArgs, suffix: &str) -> GitVerdict {
    let label = format!("llama.cpp@src:{}{suffix}", a.tree.display());
    let pin = match Pin::parse(&label) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("skip: {e:#}");
            return GitVerdict::Skip;
        }
    };
    if let Err(why) = build(&pin) {
        eprintln!("skip: {}", why.message);
        return GitVerdict::Skip;
    }
    let outcome = outcome_on(repro, &pin.label());
    let verdict = match &outcome {
        // Built, then not driven: kvaudit's failure, not the commit's.
        Outcome::Unavailable { .. } => GitVerdict::Abort,
        o => GitVerdict::of(o, a.fix),
    };
    println!(
        "{}: {} ({}): exit {}",
        pin.label(),
        outcome.word(),
        outcome.detail(),
        verdict.exit_code()
    );
    verdict
}
