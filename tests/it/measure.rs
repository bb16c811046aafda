//! Numerical measurements on llama.cpp (`tests/data/measure/*.json`): each file names a pin, runs
//! `kvaudit::engines::measure::measure_pin` on it (building the pin first if it is not built; a pin that
//! cannot be built fails the test, saying why) and states bounds on the figures, in the form of
//! PREREG.md's `[[measurement]]` entries (`equal`, `max_le`, `min_gt`).

use libtest_mimic::Trial;
use serde::Deserialize;

use kvaudit::engines::measure::measure_pin;
use kvaudit::records::prereg::MeasurementPrediction;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    #[allow(dead_code)]
    about: String,
    target: String,
    /// Every figure must also be within the tolerance the report states for it.
    #[serde(default)]
    all_within_tolerance: bool,
    expect: Vec<Bound>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Bound {
    quantity: String,
    #[serde(default)]
    equal: Option<bool>,
    #[serde(default)]
    max_le: Option<f64>,
    #[serde(default)]
    min_gt: Option<f64>,
}

pub fn trials() -> Vec<Trial> {
    super::data_files(&super::root().join("tests/data/measure"), "json")
        .into_iter()
        .map(|(name, path)| {
            Trial::test(format!("measure::{name}"), move || {
                super::outcome(check(&path))
            })
        })
        .collect()
}

fn check(path: &std::path::Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let case: Case = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let report = measure_pin(&case.target, None).map_err(|e| e.to_string())?;
    let mut failures = Vec::new();
    for b in &case.expect {
        let p = MeasurementPrediction {
            target: case.target.clone(),
            quantity: b.quantity.clone(),
            equal: b.equal,
            max_le: b.max_le,
            min_gt: b.min_gt,
        };
        match report.figure(&b.quantity) {
            None => failures.push(format!("{}: not measured", b.quantity)),
            Some(f) if !p.holds(f.value) => failures.push(format!(
                "{} = {:e} breaks equal {:?} max_le {:?} min_gt {:?} ({})",
                b.quantity,
                f.value,
                b.equal,
                b.max_le,
                b.min_gt,
                f.detail.as_deref().unwrap_or("")
            )),
            Some(_) => {}
        }
    }
    if case.all_within_tolerance {
        for f in report.outside_tolerance() {
            failures.push(format!(
                "{} = {:e} is outside its stated tolerance {:?} ({})",
                f.quantity,
                f.value,
                f.tolerance,
                f.detail.as_deref().unwrap_or("")
            ));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}
