//! `kvaudit bisect FILE --good V1 --bad V2`: the version where a finding appears or disappears,
//! among llama.cpp's pins (`0.1.112`, `llama.cpp@0.1.112`) or another engine's versions
//! (`mlx-lm@0.28.4`); `kvaudit bisect FILE --run [--tree DIR]`: one step of `git bisect run` on
//! a llama.cpp source tree.

use std::path::PathBuf;

use clap::Args;

use super::CliError;
use kvaudit::base::exit;
use kvaudit::outputs::repro::Repro;
use kvaudit::outputs::versions::bisect::{bisect, BisectAnswer, GitVerdict};
use kvaudit::outputs::versions::{build, outcome_on, prepare, versions_of, Outcome};
use kvaudit::targets::llama::pins::{known_versions, Pin, Variant};
use kvaudit::targets::registry::TargetKind;

/// Arguments of `kvaudit bisect`.
#[derive(Debug, Args)]
pub struct BisectArgs {
    /// The repro file whose finding to bisect.
    file: PathBuf,
    /// A version where the finding is absent (a llama.cpp version, or a target name with one:
    /// `mlx-lm@0.30.7`).
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
    let variant = if a.assert {
        Variant::ASSERT
    } else {
        Variant::RELEASE
    };
    // A bare version is llama.cpp's; a name (`llama.cpp@0.1.112`, `mlx-lm@0.30.7`) says whose.
    let kind_of = |v: &str| TargetKind::parse(v.trim()).unwrap_or(TargetKind::Llama);
    let (good, bad) = (
        a.good.as_deref().unwrap_or_default(),
        a.bad.as_deref().unwrap_or_default(),
    );
    let kind = kind_of(good);
    if kind_of(bad) != kind {
        return Err(CliError::usage(format!(
            "--good {good} and --bad {bad} are versions of two engines"
        )));
    }
    // Every candidate as (version, target name): llama.cpp's pins as `variant`, or the kind's
    // versions (an error for a kind without versions, or mlx-lm with --assert).
    let candidates: Vec<(String, String)> = match kind {
        TargetKind::Llama => known_versions()
            .map_err(|e| CliError::harness(format!("{e:#}")))?
            .into_iter()
            .map(|version| {
                let label = Pin {
                    version: version.clone(),
                    variant,
                    tree: None,
                    fixes: Vec::new(),
                }
                .label();
                (version, label)
            })
            .collect(),
        TargetKind::Native
        | TargetKind::NativeTensors
        | TargetKind::PythonRef
        | TargetKind::Mlx => versions_of(kind, variant)
            .map_err(CliError::from)?
            .into_iter()
            .map(|label| {
                let version = TargetKind::version_of(&label).unwrap_or(&label).to_string();
                (version, label)
            })
            .collect(),
    };
    let bare = |v: &str| {
        let v = v.trim();
        TargetKind::version_of(v).unwrap_or(v).to_string()
    };
    let (good, bad) = (bare(good), bare(bad));
    let label_of = |v: &str| {
        candidates
            .iter()
            .find(|(version, _)| version == v)
            .map_or_else(|| v.to_string(), |(_, label)| label.clone())
    };
    let versions: Vec<String> = candidates.iter().map(|(v, _)| v.clone()).collect();
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
            let label = label_of(v);
            match prepare(&label) {
                Ok(()) => outcome_on(&repro, &label),
                Err(e) => Outcome::Unavailable { reason: e.message },
            }
        },
        &mut |step| {
            n += 1;
            println!(
                "step {n}: {}: {} ({})",
                label_of(&step.version),
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
