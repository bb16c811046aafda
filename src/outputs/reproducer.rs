//! Which renderer a finding's reproducer and bug report take: the one of the engine its target
//! runs (C over llama.h for llama.cpp, and for the native models of llama.cpp's cache and the
//! reference worker, which follow llama.h; Python over mlx-lm for mlx-lm), chosen by the
//! target's kind, never by its name's text.

use serde_json::Value;

use crate::targets::registry::TargetKind;

/// A reproducer's language.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Language {
    /// A C program over llama.h (`outputs/c_repro`).
    C,
    /// A Python program over mlx and mlx_lm (`outputs/py_repro`).
    Python,
}

impl Language {
    /// The renderer of the engine a target of `kind` runs.
    pub fn of_kind(kind: TargetKind) -> Language {
        match kind {
            TargetKind::Llama
            | TargetKind::Native
            | TargetKind::NativeTensors
            | TargetKind::PythonRef => Language::C,
            TargetKind::Mlx => Language::Python,
        }
    }

    /// The renderer of a repro file or finding (`input`, its JSON): its first target's
    /// (`targets[0].target` of a repro file, `target` of a finding); C, as before engines had
    /// renderers of their own, when it names none or a label that is not a target's name (a
    /// finding's `native[refcount]`).
    pub fn of_input(input: &Value) -> Language {
        target_names(input)
            .first()
            .and_then(|name| TargetKind::parse(name).ok())
            .map_or(Language::C, Language::of_kind)
    }
}

/// The targets a repro file (`targets[].target`) or a finding (`target`, a name or an object
/// with a `name`) names, in order.
pub fn target_names(input: &Value) -> Vec<String> {
    if let Some(list) = input.get("targets").and_then(Value::as_array) {
        return list
            .iter()
            .filter_map(|t| t.get("target").and_then(Value::as_str))
            .map(str::to_string)
            .collect();
    }
    match input.get("target") {
        Some(Value::String(name)) => vec![name.clone()],
        Some(t) => t
            .get("name")
            .and_then(Value::as_str)
            .map(|n| vec![n.to_string()])
            .unwrap_or_default(),
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_first_target_picks_the_renderer() {
        let repro = json!({"targets": [{"target": "mlx-lm@0.32.2", "expect": "fails"}, {"target": "native"}]});
        assert_eq!(Language::of_input(&repro), Language::Python);
        assert_eq!(
            Language::of_input(&json!({"target": "llama.cpp@0.1.156"})),
            Language::C
        );
        assert_eq!(
            Language::of_input(&json!({"target": {"name": "mlx-lm@0.30.7"}})),
            Language::Python
        );
        assert_eq!(
            Language::of_input(&json!({"target": "native[refcount]"})),
            Language::C
        );
        assert_eq!(Language::of_input(&json!({})), Language::C);
    }
}
