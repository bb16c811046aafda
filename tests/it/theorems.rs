//! Numerical-oracle cases (T1-T3, shared/seeds/000): each file in `tests/data/theorems/` names a
//! witness of the seed document, a negative control or an injected fault, runs one check on the
//! `native+tensors` target and states the verdict it must reach and the max |Δ| it must measure.

use std::path::Path;
use std::sync::Arc;

use libtest_mimic::Trial;
use serde::Deserialize;

use kvaudit::base::op::{SeqId, Trace};
use kvaudit::model::forward::Model;
use kvaudit::oracles::theorems::t3::BoundRow;
use kvaudit::oracles::theorems::{
    check_pair, check_pair_on, t1, t2, t3, Continuation, Pair, Theorem, TheoremJudgement, Tolerance,
};
use kvaudit::targets::native::parse_faults;
use kvaudit::targets::native_tensor::NativeTensorTarget;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    #[allow(dead_code)]
    about: String,
    /// The seed witness this case re-creates, if any.
    #[allow(dead_code)]
    #[serde(default)]
    seed: Option<String>,
    theorem: Theorem,
    /// The sliding window of the target (and of the reference).
    #[serde(default)]
    window: Option<u32>,
    /// Faults injected into the target.
    #[serde(default)]
    inject: Vec<String>,
    check: Check,
    expect: Expect,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum Check {
    /// T1 placement after every op of the trace.
    Placement { trace: Trace },
    /// T2's reposition invariant (placement, judged as T2) after every op of the trace.
    Reposition { trace: Trace },
    /// T1 state round trip of `seq`, then `probe` decoded on both sides.
    RoundTrip {
        trace: Trace,
        seq: SeqId,
        probe: u32,
    },
    /// Several paths to the same sequence, each against the cacheless reference.
    Paths { traces: Vec<Trace>, seq: SeqId },
    /// A metamorphic pair; `right` is a trace or the name of a derivation.
    Pair {
        left: Trace,
        right: Partner,
        /// The right side's window when it differs from the left's (`"none"` or a number).
        #[serde(default)]
        right_window: Option<WindowSpec>,
        #[serde(default)]
        rows: Vec<(SeqId, SeqId)>,
        #[serde(default)]
        last_logits: bool,
        #[serde(default)]
        continuation: Option<Continuation>,
    },
    /// T3's visible-key bound table, through the native cache.
    WindowBound { rows: Vec<BoundRow> },
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Partner {
    /// `never_saw`, `prefix` or `out_of_window`: derived from `left`.
    Derived(String),
    Trace(Trace),
}

#[derive(Clone, Copy, Deserialize)]
#[serde(untagged)]
enum WindowSpec {
    Width(u32),
    /// `"none"`.
    Unset(#[allow(dead_code)] Unset),
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Unset {
    None,
}

impl WindowSpec {
    fn window(self) -> Option<u32> {
        match self {
            WindowSpec::Width(w) => Some(w),
            WindowSpec::Unset(_) => None,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    holds: bool,
    /// The max |Δ| measured, exactly (0 for every positive witness on the native target).
    #[serde(default)]
    max_abs_delta: Option<f64>,
    /// A floor the max |Δ| must exceed (negative controls and faults).
    #[serde(default)]
    max_abs_delta_above: Option<f64>,
}

pub fn trials() -> Vec<Trial> {
    super::data_files(&super::root().join("tests/data/theorems"), "json")
        .into_iter()
        .map(|(name, path)| {
            Trial::test(format!("theorems::{name}"), move || {
                super::outcome(check(&path))
            })
        })
        .collect()
}

fn model(window: Option<u32>) -> Result<Arc<Model>, String> {
    NativeTensorTarget::default_model(window).map_err(|e| e.to_string())
}

fn run(case: &Case) -> Result<TheoremJudgement, String> {
    let faults = parse_faults(&case.inject)?;
    let target_model = model(case.window)?;
    // The oracle's reference model is loaded on its own: it shares no state with the target.
    let reference = model(case.window)?;
    let hd = reference.hparams().head_dim;
    let mut target = NativeTensorTarget::new(target_model, faults);
    let exact = Tolerance::EXACT;
    let harness = |e: kvaudit::base::cache::HarnessError| e.to_string();
    match &case.check {
        Check::Placement { trace } => {
            t1::check_placement(&mut target, trace, &reference, exact).map_err(harness)
        }
        Check::Reposition { trace } => {
            t2::check_reposition(&mut target, trace, &reference, exact).map_err(harness)
        }
        Check::RoundTrip { trace, seq, probe } => {
            t1::check_round_trip(&mut target, trace, *seq, *probe, exact, hd).map_err(harness)
        }
        Check::Paths { traces, seq } => {
            t1::check_paths(&mut target, traces, *seq, &reference, case.theorem, exact)
                .map_err(harness)
        }
        Check::WindowBound { rows } => Ok(TheoremJudgement::Judged(t3::check_window_bounds(
            faults, rows,
        ))),
        Check::Pair {
            left,
            right,
            right_window,
            rows,
            last_logits,
            continuation,
        } => {
            let pair = match right {
                Partner::Trace(t) => Pair {
                    theorem: case.theorem,
                    left: left.clone(),
                    right: t.clone(),
                    rows: rows.clone(),
                    last_logits: *last_logits,
                    continuation: continuation.clone(),
                },
                Partner::Derived(how) => {
                    if !rows.is_empty() || *last_logits || continuation.is_some() {
                        return Err("a derived pair takes rows, logits and continuation from its derivation".into());
                    }
                    let derived = match how.as_str() {
                        "never_saw" => t2::never_saw_pair(left),
                        "prefix" => t3::prefix_pair(left),
                        "out_of_window" => {
                            let w = case.window.ok_or("out_of_window needs a window")?;
                            t3::out_of_window_pair(left, w)
                        }
                        other => return Err(format!("unknown derivation {other:?}")),
                    };
                    derived.ok_or(format!("no {how} partner derives from the left trace"))?
                }
            };
            if pair.theorem != case.theorem {
                return Err(format!(
                    "the pair witnesses {}, the case says {}",
                    pair.theorem, case.theorem
                ));
            }
            match right_window {
                None => check_pair(&mut target, &pair, exact, hd).map_err(harness),
                Some(w) => {
                    let mut right = NativeTensorTarget::new(model(w.window())?, faults);
                    check_pair_on(&mut target, &mut right, &pair, exact, hd).map_err(harness)
                }
            }
        }
    }
}

fn check(path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let case: Case = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let verdict = match run(&case)? {
        TheoremJudgement::Judged(v) => v,
        TheoremJudgement::Unsupported { reason } => return Err(format!("unsupported: {reason}")),
    };
    if verdict.theorem != case.theorem {
        return Err(format!(
            "verdict for {}, case for {}",
            verdict.theorem, case.theorem
        ));
    }
    let d = verdict.measurement.max_abs_delta();
    if verdict.holds != case.expect.holds {
        return Err(format!(
            "expected holds = {}, got: {verdict}",
            case.expect.holds
        ));
    }
    if let Some(want) = case.expect.max_abs_delta {
        if d != want {
            return Err(format!("max|Δ| {d:e}, expected {want:e}: {verdict}"));
        }
    }
    if let Some(floor) = case.expect.max_abs_delta_above {
        if d.is_nan() || d <= floor {
            return Err(format!("max|Δ| {d:e} is not above {floor:e}: {verdict}"));
        }
    }
    if std::env::var_os("KVAUDIT_THEOREMS_SHOW").is_some() {
        println!("{}: {verdict}", path.file_stem().unwrap().to_string_lossy());
    }
    Ok(())
}
