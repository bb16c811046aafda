//! PREREG.md: predictions written before an audit, read back to print prediction vs outcome.
//!
//! The file is Markdown with fenced `toml` blocks: `[[prediction]]` tables, each naming an audit
//! run (`target`, optional `vs`, `domain`, `depth`) and, per oracle, `{ violated, first_depth }`;
//! and `[[measurement]]` tables, each a bound on one measured quantity of the numerical oracles.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::base::error::Error;
use crate::oracles::{OracleId, Registry};

/// What was predicted for one oracle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OraclePrediction {
    /// Will the oracle be violated?
    pub violated: bool,
    /// At which depth first (when violated).
    #[serde(default)]
    pub first_depth: Option<u32>,
}

/// One `[[prediction]]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prediction {
    /// Target label.
    pub target: String,
    /// Second target, for the differential oracle.
    #[serde(default)]
    pub vs: Option<String>,
    /// Domain name.
    pub domain: String,
    /// Depth.
    pub depth: u32,
    /// Per oracle, by its name (`I1 = { violated = false }`): any oracle of the registry.
    #[serde(flatten)]
    pub oracles: BTreeMap<String, OraclePrediction>,
}

impl Prediction {
    /// The prediction for `oracle`, if there is one.
    pub fn of(&self, oracle: OracleId) -> Option<&OraclePrediction> {
        self.oracles.get(oracle.name())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PredictionFile {
    #[serde(default)]
    prediction: Vec<Prediction>,
    #[serde(default)]
    measurement: Vec<MeasurementPrediction>,
}

/// A prediction about one measured quantity (numerical oracles on a real target).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasurementPrediction {
    /// Target label.
    pub target: String,
    /// The quantity's name, as the measurement report spells it (e.g. `T2.logits_max_abs`).
    pub quantity: String,
    /// For yes/no quantities: the predicted answer.
    #[serde(default)]
    pub equal: Option<bool>,
    /// Predicted upper bound (inclusive).
    #[serde(default)]
    pub max_le: Option<f64>,
    /// Predicted strict lower bound.
    #[serde(default)]
    pub min_gt: Option<f64>,
}

impl MeasurementPrediction {
    /// Whether a measured value bears the prediction out (`yes/no` quantities measure 1 or 0).
    pub fn holds(&self, value: f64) -> bool {
        self.equal.is_none_or(|e| (value != 0.0) == e)
            && self.max_le.is_none_or(|m| value <= m)
            && self.min_gt.is_none_or(|m| value > m)
    }
}

/// Reads the measurement predictions of every ```toml block of a PREREG.md text.
pub fn parse_measurements(text: &str) -> Result<Vec<MeasurementPrediction>, Error> {
    Ok(toml_blocks(text)?
        .into_iter()
        .flat_map(|f| f.measurement)
        .collect())
}

fn toml_blocks(text: &str) -> Result<Vec<PredictionFile>, String> {
    let mut out = Vec::new();
    let mut rest_at = 0;
    while let Some(start) = text[rest_at..].find("```toml").map(|i| i + rest_at) {
        let body_at = start + "```toml".len();
        let end = text[body_at..]
            .find("```")
            .ok_or("a ```toml block is not closed")?
            + body_at;
        let first_line = text[..body_at].matches('\n').count() + 1;
        let body = &text[body_at..end];
        let file: PredictionFile = toml::from_str(body).map_err(|e| {
            let line = e
                .span()
                .map(|s| first_line + body[..s.start].matches('\n').count())
                .unwrap_or(first_line);
            format!("line {line}: {}", e.message())
        })?;
        out.push(file);
        rest_at = end + 3;
    }
    if out.is_empty() {
        return Err("no ```toml block of predictions".into());
    }
    Ok(out)
}

/// One row of prediction vs outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PredictionCheck {
    /// Oracle.
    pub oracle: OracleId,
    /// What was predicted.
    pub predicted: OraclePrediction,
    /// What happened.
    pub outcome: OraclePrediction,
    /// Whether the prediction held.
    pub confirmed: bool,
}

/// Reads the predictions in a PREREG.md.
pub fn read(path: &Path) -> Result<Vec<Prediction>, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    parse(&text).map_err(|e| e.context(path.display()))
}

/// Parses the audit predictions of every ```toml block of a PREREG.md text. Every key of a
/// prediction besides its run names an oracle of the registry.
pub fn parse(text: &str) -> Result<Vec<Prediction>, Error> {
    let predictions: Vec<Prediction> = toml_blocks(text)?
        .into_iter()
        .flat_map(|f| f.prediction)
        .collect();
    let registry = Registry::builtin();
    for p in &predictions {
        if let Some(name) = p
            .oracles
            .keys()
            .find(|n| OracleId::known(n).and_then(|o| registry.get(o)).is_none())
        {
            return Err(format!(
                "prediction for {} (domain {}, depth {}): unknown oracle '{name}' (known: {})",
                p.target,
                p.domain,
                p.depth,
                registry.names().join(", ")
            )
            .into());
        }
    }
    Ok(predictions)
}

/// The run a report is of, as predictions name it.
pub struct RunName<'a> {
    /// Target label.
    pub target: &'a str,
    /// Second target's label.
    pub vs: Option<&'a str>,
    /// Domain name.
    pub domain: &'a str,
    /// Depth.
    pub depth: u32,
}

/// The prediction for `run`, checked against its outcome: `outcome` gives, per oracle the run
/// asked, whether it was violated and first at which depth.
pub fn check(
    predictions: &[Prediction],
    run: &RunName<'_>,
    outcome: impl Fn(OracleId) -> Option<OraclePrediction>,
) -> Vec<PredictionCheck> {
    // Every prediction for the run: a later batch adds the oracles an earlier one left out (an
    // oracle predicted twice keeps the first batch's prediction).
    let matching = predictions.iter().filter(|p| {
        p.target == run.target
            && p.vs.as_deref() == run.vs
            && p.domain == run.domain
            && p.depth == run.depth
    });
    let mut rows: Vec<PredictionCheck> = Vec::new();
    for (name, pred) in matching.flat_map(|p| &p.oracles) {
        let Some(oracle) = OracleId::known(name) else {
            continue;
        };
        if rows.iter().any(|r| r.oracle == oracle) {
            continue;
        }
        let Some(outcome) = outcome(oracle) else {
            continue;
        };
        let confirmed = pred.violated == outcome.violated
            && (pred.first_depth.is_none() || pred.first_depth == outcome.first_depth);
        rows.push(PredictionCheck {
            oracle,
            predicted: pred.clone(),
            outcome,
            confirmed,
        });
    }
    rows.sort_by_key(|r| r.oracle);
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_prereg_parses() {
        let text = include_str!("../../PREREG.md");
        let ps = parse(text).unwrap();
        assert!(ps
            .iter()
            .any(|p| p.target == "llama.cpp@0.1.156"
                && p.of(OracleId::I1).is_some_and(|o| o.violated)));
        let ms = parse_measurements(text).unwrap();
        assert!(ms
            .iter()
            .any(|m| m.quantity == "T2.greedy32_token_flips" && m.holds(0.0) && !m.holds(1.0)));
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse("# x\n\n```toml\n[[prediction]]\ntarget = 1\n```\n").unwrap_err();
        assert!(e.message.starts_with("line 5"), "{e}");
    }
}
