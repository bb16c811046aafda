//! PREREG.md: predictions written before an audit, read back to print prediction vs outcome.
//!
//! The file is Markdown with fenced `toml` blocks: `[[prediction]]` tables, each naming an audit
//! run (`target`, optional `vs`, `domain`, `depth`) and, per oracle, `{ violated, first_depth }`;
//! and `[[measurement]]` tables, each a bound on one measured quantity of the numerical oracles.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::oracles::OracleId;
use crate::records::report::Report;

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
#[serde(deny_unknown_fields)]
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
    /// I1.
    #[serde(rename = "I1", default)]
    pub i1: Option<OraclePrediction>,
    /// I2.
    #[serde(rename = "I2", default)]
    pub i2: Option<OraclePrediction>,
    /// Differential.
    #[serde(default)]
    pub differential: Option<OraclePrediction>,
    /// Crash.
    #[serde(default)]
    pub crash: Option<OraclePrediction>,
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
pub fn parse_measurements(text: &str) -> Result<Vec<MeasurementPrediction>, String> {
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
pub fn read(path: &Path) -> Result<Vec<Prediction>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Parses the audit predictions of every ```toml block of a PREREG.md text.
pub fn parse(text: &str) -> Result<Vec<Prediction>, String> {
    Ok(toml_blocks(text)?
        .into_iter()
        .flat_map(|f| f.prediction)
        .collect())
}

/// The predictions that match `report`'s run, checked against its outcome.
pub fn check(predictions: &[Prediction], report: &Report) -> Vec<PredictionCheck> {
    let vs = report.vs.as_ref().map(|v| v.label());
    let Some(p) = predictions.iter().find(|p| {
        p.target == report.target.label()
            && p.vs == vs
            && p.domain == report.domain.name
            && p.depth == report.depth
    }) else {
        return Vec::new();
    };
    let mut rows = Vec::new();
    for (oracle, pred) in [
        (OracleId::I1, &p.i1),
        (OracleId::I2, &p.i2),
        (OracleId::Differential, &p.differential),
        (OracleId::Crash, &p.crash),
    ] {
        let (Some(pred), Some(stats)) = (pred, report.oracles.get(&oracle)) else {
            continue;
        };
        let outcome = OraclePrediction {
            violated: stats.violations > 0,
            first_depth: stats.first_depth,
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
            .any(|p| p.target == "llama.cpp@0.1.156" && p.i1.as_ref().is_some_and(|o| o.violated)));
        let ms = parse_measurements(text).unwrap();
        assert!(ms
            .iter()
            .any(|m| m.quantity == "T2.greedy32_token_flips" && m.holds(0.0) && !m.holds(1.0)));
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse("# x\n\n```toml\n[[prediction]]\ntarget = 1\n```\n").unwrap_err();
        assert!(e.starts_with("line 5"), "{e}");
    }
}
