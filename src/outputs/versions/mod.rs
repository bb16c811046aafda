//! A finding across an engine's versions (llama.cpp's pins, mlx-lm's versions): what a repro
//! file's trace does on one version ([`Outcome`]: holds, fails, crash, unsupported, unavailable
//! when the version cannot be built or driven, not applicable when the file is another
//! engine's), the table of every finding on every version (`matrix`), and the binary search
//! for the version where a finding appears or disappears (`bisect`, with the exit-code
//! contract of `git bisect run` for a llama.cpp source tree).
//!
//! Versions are target names of any kind with versions, through the registry
//! ([`TargetKind::version_of`], [`select_versions`]). Each is run through the replay's own path
//! ([`crate::outputs::repro::judge_on`]: the target registry, a crash-isolated worker, every
//! oracle on every step); this module only classifies the judgement, so a matrix cell and a
//! replay never disagree on what happened.

pub mod bisect;
pub mod matrix;

use serde::{Deserialize, Serialize};

use crate::base::cache::Observe;
use crate::base::error::Error;
use crate::oracles::{OracleId, Registry};
use crate::outputs::repro::{judge_on, Repro, Second};
use crate::outputs::reproducer::engines_of;
use crate::running::judge::RunJudgement;
use crate::targets::llama::build::{ensure_built, BuildSpec};
use crate::targets::llama::pins::{select, version_key, Pin, Variant};
use crate::targets::mlx::{MlxPin, PINS as MLX_PINS};
use crate::targets::registry::{TargetKind, TargetSpec};

/// What a finding's trace does on one version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub enum Outcome {
    /// The file's oracle holds on every step: the finding is absent.
    Holds,
    /// The file's oracle fails first at `step`: the finding is present.
    Fails {
        /// 1-based step of the first violation.
        step: usize,
        /// Its kind.
        kind: String,
    },
    /// The trial crashed (abort, signal, hang) at `step`, before the file's oracle failed:
    /// the finding's trace does not run through, which counts as present.
    Crash {
        /// 1-based step of the crash (0: the setup).
        step: usize,
        /// What ended the trial.
        kind: String,
    },
    /// The version cannot take the trace (an op or configuration it does not have) before the
    /// oracle could say anything: neither present nor absent.
    Unsupported {
        /// Why.
        reason: String,
    },
    /// The version could not be built or driven: the harness's failure, not the version's.
    Unavailable {
        /// Why.
        reason: String,
    },
    /// The file is of another engine than the version (a llama.cpp repro file on an mlx-lm
    /// version): not run, neither a failure nor a pass.
    #[serde(rename = "not-applicable")]
    NotApplicable {
        /// Why.
        reason: String,
    },
}

impl Outcome {
    /// A word for tables: `holds`, `FAILS`, `CRASH`, `unsupported`, `unavailable`, `n/a`.
    pub fn word(&self) -> &'static str {
        match self {
            Outcome::Holds => "holds",
            Outcome::Fails { .. } => "FAILS",
            Outcome::Crash { .. } => "CRASH",
            Outcome::Unsupported { .. } => "unsupported",
            Outcome::Unavailable { .. } => "unavailable",
            Outcome::NotApplicable { .. } => "n/a",
        }
    }

    /// One character for a dense table: `.` holds, `F` fails, `C` crash, `u` unsupported, `?`
    /// unavailable, `-` not applicable.
    pub fn mark(&self) -> char {
        match self {
            Outcome::Holds => '.',
            Outcome::Fails { .. } => 'F',
            Outcome::Crash { .. } => 'C',
            Outcome::Unsupported { .. } => 'u',
            Outcome::Unavailable { .. } => '?',
            Outcome::NotApplicable { .. } => '-',
        }
    }

    /// Whether the finding is present (fails or crash), absent (holds), or unknown here.
    pub fn present(&self) -> Option<bool> {
        match self {
            Outcome::Holds => Some(false),
            Outcome::Fails { .. } | Outcome::Crash { .. } => Some(true),
            Outcome::Unsupported { .. }
            | Outcome::Unavailable { .. }
            | Outcome::NotApplicable { .. } => None,
        }
    }

    /// The outcome in a sentence.
    pub fn detail(&self) -> String {
        match self {
            Outcome::Holds => "the oracle holds on every step".into(),
            Outcome::Fails { step, kind } => format!("fails first at step {step} ({kind})"),
            Outcome::Crash { step, kind } => format!("crashes at step {step} ({kind})"),
            Outcome::Unsupported { reason } => format!("unsupported: {reason}"),
            Outcome::Unavailable { reason } => format!("unavailable: {reason}"),
            Outcome::NotApplicable { reason } => format!("not applicable: {reason}"),
        }
    }
}

/// What `j` says about the finding of `repro`: the earlier of the file's oracle's first
/// violation and a crash, else unsupported if the target stopped first, else holds.
pub fn classify(repro: &Repro, j: &RunJudgement) -> Outcome {
    let first = j.first(repro.oracle);
    let crash = j.first(OracleId::CRASH);
    let earliest = [crash, first].into_iter().flatten().min_by_key(|v| v.step);
    if let Some((step, reason)) = &j.unsupported {
        if !matches!(earliest, Some(v) if v.step < *step) {
            return Outcome::Unsupported {
                reason: format!("step {step}: {reason}"),
            };
        }
    }
    match earliest {
        None => Outcome::Holds,
        Some(v) if v.violation.oracle == OracleId::CRASH => Outcome::Crash {
            step: v.step,
            kind: v.violation.kind.clone(),
        },
        Some(v) => Outcome::Fails {
            step: v.step,
            kind: v.violation.kind.clone(),
        },
    }
}

/// Why `repro` does not apply to the version `label`, if it does not: the file is of another
/// engine (running a llama.cpp trace on mlx-lm says nothing of either).
pub fn not_applicable(repro: &Repro, label: &str) -> Option<String> {
    let engine = TargetKind::of_label(label)?.engine();
    let engines = engines_of(repro);
    (!engines.contains(&engine)).then(|| {
        let names: Vec<&str> = engines.iter().map(|e| e.name()).collect();
        format!(
            "a repro file of {} (its targets), not of {}",
            if names.is_empty() {
                "no engine".to_string()
            } else {
                names.join(" and ")
            },
            engine.name()
        )
    })
}

/// The second side of a pair oracle's repro on a version of kind `kind`: the `vs` or the
/// `vs_config` of the file's first expectation on a target of that kind that has one.
fn pair_of(repro: &Repro, kind: Option<TargetKind>) -> Option<PairSide> {
    repro
        .targets
        .iter()
        .filter(|e| TargetKind::of_label(&e.target) == kind)
        .find_map(|e| match (&e.vs_config, e.specs().1) {
            (Some(config), _) => Some(PairSide::Config(config.clone())),
            (None, Some(vs)) => Some(PairSide::Target(vs)),
            (None, None) => None,
        })
}

/// The second side a version runs a pair oracle's trace beside.
enum PairSide {
    /// Another target (`vs`).
    Target(TargetSpec),
    /// The version itself under another configuration (`vs_config`).
    Config(String),
}

/// What a version is observed for on `repro`'s trace: what the file's oracle reads, no more.
/// An observation the finding does not need (a whole-context dump for an I1 finding) must not
/// decide its verdict: 0.1.109-0.1.112 crash in `llama_state_get_data` after any op
/// (docs/versions.md), which says nothing about whether their `seq_pos` goes stale. A crash
/// finding is observed as a replay observes it: a corrupted heap aborts at whatever allocates
/// next, an observation included (`crash_decode_next_pos_seq_id_out_of_range` on 0.1.161).
fn observe_for(repro: &Repro) -> Observe {
    if repro.oracle == OracleId::CRASH {
        return Observe::ALL_WITH_PROBE;
    }
    Registry::builtin()
        .get(repro.oracle)
        .map(|o| Observe::BASIC.union(o.observes()))
        .unwrap_or(Observe::ALL_WITH_PROBE)
}

/// Runs `repro`'s trace on the target `label` (a version of any engine, or
/// `llama.cpp@src:PATH`), observing what the file's oracle reads, and classifies it; a file of
/// another engine is not run ([`Outcome::NotApplicable`]). Building is the caller's (see
/// [`prepare`]); a target that cannot be driven is [`Outcome::Unavailable`].
pub fn outcome_on(repro: &Repro, label: &str) -> Outcome {
    if let Some(reason) = not_applicable(repro, label) {
        return Outcome::NotApplicable { reason };
    }
    let observe = observe_for(repro);
    let target = TargetSpec::new(label, &[]).with_observe(observe);
    let pair = pair_of(repro, TargetKind::of_label(label));
    let vs = match &pair {
        Some(PairSide::Target(vs)) => Some(vs.clone().with_observe(observe)),
        Some(PairSide::Config(_)) | None => None,
    };
    let second = match (&pair, &vs) {
        (Some(PairSide::Config(config)), _) => Second::Config(config),
        (_, Some(vs)) => Second::Target(vs),
        _ => Second::None,
    };
    match judge_on(repro, &target, second) {
        Ok(j) => classify(repro, &j),
        Err(e) => Outcome::Unavailable { reason: e.message },
    }
}

/// Builds `pin` if the cache lacks it (with progress on stderr): `Err` is why it cannot be.
pub fn build(pin: &Pin) -> Result<(), Error> {
    ensure_built(&BuildSpec::new(pin.clone()), true)
        .map(drop)
        .map_err(|e| Error::harness(format!("cannot build {pin}: {e:#}")))
}

/// Makes the version `label` ready to run, if the cache lacks it (progress on stderr): a
/// llama.cpp pin built, an mlx-lm environment made. `Err` is why it cannot be.
pub fn prepare(label: &str) -> Result<(), Error> {
    match TargetKind::parse(label)? {
        TargetKind::Llama => build(&Pin::parse(label).map_err(|e| Error::input(format!("{e:#}")))?),
        TargetKind::Mlx => MlxPin::parse(label)?
            .ensure_built()
            .map(drop)
            .map_err(|e| Error::harness(format!("cannot make {label}: {}", e.message))),
        TargetKind::Native | TargetKind::NativeTensors | TargetKind::PythonRef => Ok(()),
    }
}

/// Whether the version `label` is ready to run without building anything (`--built-only`).
pub fn is_built(label: &str) -> Result<bool, Error> {
    match TargetKind::parse(label)? {
        TargetKind::Llama => {
            let built = crate::targets::llama::build::cached_labels(None)
                .map_err(|e| Error::harness(format!("{e:#}")))?;
            Ok(built.contains_key(label))
        }
        TargetKind::Mlx => Ok(MlxPin::parse(label)?.built()?.is_some()),
        TargetKind::Native | TargetKind::NativeTensors | TargetKind::PythonRef => Ok(true),
    }
}

/// Every version of `kind`, oldest first, as target names: llama.cpp's pins (as `variant`),
/// mlx-lm's versions; `Err` (bad input) for a kind without versions.
pub fn versions_of(kind: TargetKind, variant: Variant) -> Result<Vec<String>, Error> {
    match kind {
        TargetKind::Llama => Ok(select("all", variant)
            .map_err(|e| Error::input(format!("{e:#}")))?
            .iter()
            .map(Pin::label)
            .collect()),
        TargetKind::Mlx if variant != Variant::RELEASE => Err(Error::input(format!(
            "mlx-lm has no {} builds: its versions are installed, not built",
            variant.suffix()
        ))),
        TargetKind::Mlx => {
            let mut pins: Vec<MlxPin> = MLX_PINS
                .iter()
                .map(|(v, m)| MlxPin {
                    mlx_lm: v.to_string(),
                    mlx: m.to_string(),
                })
                .collect();
            pins.sort_by_key(|p| version_key(&p.mlx_lm));
            Ok(pins.iter().map(MlxPin::label).collect())
        }
        TargetKind::Native | TargetKind::NativeTensors | TargetKind::PythonRef => {
            Err(Error::input(format!("{} has no versions", kind.pattern())))
        }
    }
}

/// The versions a `--targets` argument names, as target names: llama.cpp's forms (`A..B`,
/// `V1,V2,...`, `all`; a version bare or as `llama.cpp@V`) as [`select`] reads them, with
/// `variant`; and, in the same list, versions of other engines by name (`mlx-lm@0.32.2`) or
/// all of one engine's (`mlx-lm@all`). Each engine's versions oldest first, llama.cpp's first.
pub fn select_versions(spec: &str, variant: Variant) -> Result<Vec<String>, Error> {
    let mut llama: Vec<&str> = Vec::new();
    let mut others: Vec<String> = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        match TargetKind::parse(item) {
            Ok(TargetKind::Llama) | Err(_) => llama.push(item),
            Ok(kind) => {
                let known = versions_of(kind, variant)?;
                if TargetKind::version_of(item) == Some("all") {
                    others.extend(known);
                } else if known.iter().any(|k| k == item) {
                    others.push(item.to_string());
                } else {
                    return Err(Error::input(format!(
                        "--targets {spec:?}: `{item}` is not a known version (known: {}, or all)",
                        known.join(", ")
                    )));
                }
            }
        }
    }
    let mut out: Vec<String> = if llama.is_empty() {
        Vec::new()
    } else {
        select(&llama.join(","), variant)
            .map_err(|e| Error::input(format!("{e:#}")))?
            .iter()
            .map(Pin::label)
            .collect()
    };
    others.sort_by_key(|l| version_key(TargetKind::version_of(l).unwrap_or(l)));
    others.dedup();
    out.extend(others);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::running::judge::StepViolation;

    fn violation(oracle: OracleId, step: usize, kind: &str) -> StepViolation {
        StepViolation::of_kind(oracle, step, kind)
    }

    #[test]
    fn versions_are_target_names_and_a_file_runs_on_its_own_engines_only() {
        let mlx = versions_of(TargetKind::Mlx, Variant::RELEASE).unwrap();
        assert!(mlx.len() >= 3, "{mlx:?}");
        let mut both = vec!["llama.cpp@0.1.160".to_string()];
        both.extend(mlx.iter().cloned());
        assert_eq!(
            select_versions("0.1.160,mlx-lm@all", Variant::RELEASE).unwrap(),
            both
        );
        // Named in any order, oldest first.
        let (newest, oldest) = (&mlx[mlx.len() - 1], &mlx[0]);
        assert_eq!(
            select_versions(&format!("{newest},{oldest}"), Variant::RELEASE).unwrap(),
            [oldest.clone(), newest.clone()]
        );
        for bad in ["mlx-lm@9.9.9", "native", "python-ref"] {
            assert!(select_versions(bad, Variant::RELEASE).is_err(), "{bad}");
        }
        assert!(select_versions("mlx-lm@all", Variant::ASSERT).is_err());
        let load = |name: &str| {
            Repro::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(name)).unwrap()
        };
        let llama = load("corpora/i1_seq_cp_twice_stale_max.json");
        let on_mlx = load("corpora/i1_mlx_concatenate_trim_keeps_the_rows.json");
        assert_eq!(not_applicable(&llama, "llama.cpp@0.1.161"), None);
        assert_eq!(not_applicable(&on_mlx, newest), None);
        assert!(not_applicable(&llama, newest).is_some());
        assert!(not_applicable(&on_mlx, "llama.cpp@0.1.161").is_some());
    }

    #[test]
    fn a_judgement_is_classified_by_what_happened_first() {
        let repro = Repro::load(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/corpora/i1_seq_cp_twice_stale_max.json"
        )))
        .unwrap();
        let mut j = RunJudgement::default();
        assert_eq!(classify(&repro, &j), Outcome::Holds);
        j.unsupported = Some((2, "no such op".into()));
        assert!(matches!(classify(&repro, &j), Outcome::Unsupported { .. }));
        j.violations.push(violation(repro.oracle, 1, "stale"));
        assert!(matches!(
            classify(&repro, &j),
            Outcome::Fails { step: 1, .. }
        ));
        j.violations.push(violation(OracleId::CRASH, 1, "SIGABRT"));
        assert!(matches!(
            classify(&repro, &j),
            Outcome::Crash { step: 1, .. }
        ));
        assert_eq!(Outcome::Holds.present(), Some(false));
        assert_eq!(
            Outcome::Unavailable {
                reason: String::new()
            }
            .present(),
            None
        );
    }
}
