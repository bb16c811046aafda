//! Which renderer a finding's reproducer and bug report take: the one of the engine its target
//! runs ([`TargetKind::engine`]: C over llama.h for llama.cpp, and for the native models of
//! llama.cpp's cache and the reference worker, which follow llama.h; Python over mlx-lm for
//! mlx-lm), chosen by the target's kind, never by its name's text. Also what each renderer
//! writes (the program, the bug report draft around it) and whether an engine's findings have a
//! picture (`explain`).

use serde_json::Value;

use crate::base::error::Error;
use crate::outputs::bug_report::CheckedProgram;
use crate::outputs::repro::Repro;
use crate::targets::registry::{Engine, TargetKind};

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
        Language::of_engine(kind.engine())
    }

    /// The renderer of `engine`'s findings.
    pub fn of_engine(engine: Engine) -> Language {
        match engine {
            Engine::LlamaCpp => Language::C,
            Engine::MlxLm => Language::Python,
        }
    }

    /// Its name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Language::C => "C",
            Language::Python => "Python",
        }
    }

    /// A program's file extension.
    pub fn extension(self) -> &'static str {
        match self {
            Language::C => "c",
            Language::Python => "py",
        }
    }

    /// The program of `repro` in this language; `Err` (bad input) when the renderer cannot
    /// write it (an oracle without a check in the language, a setup the engine does not run).
    pub fn program(self, repro: &Repro) -> Result<String, Error> {
        let text = repro.to_text();
        match self {
            Language::C => crate::outputs::c_repro::parse_input(&text)
                .map(|i| crate::outputs::c_repro::emit_c(&i)),
            Language::Python => crate::outputs::py_repro::parse_input(&text)
                .and_then(|i| crate::outputs::py_repro::emit_py(&i)),
        }
    }

    /// The bug report draft of `repro` around its `program`, for the engine's tracker.
    pub fn bug_report(
        self,
        repro: &Repro,
        program: &str,
        checked: Option<&CheckedProgram>,
    ) -> String {
        match self {
            Language::C => crate::outputs::bug_report::bug_report(repro, program, checked),
            Language::Python => crate::outputs::mlx_bug_report::bug_report(repro, program, checked),
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

/// The engines a repro file is of, each once: its targets' (a file of the native model with
/// faults is llama.cpp's, the engine the model is of).
pub fn engines_of(repro: &Repro) -> Vec<Engine> {
    let mut engines: Vec<Engine> = repro
        .targets
        .iter()
        .filter_map(|t| TargetKind::of_label(&t.target))
        .map(TargetKind::engine)
        .collect();
    engines.sort();
    engines.dedup();
    engines
}

/// Why a finding of `engine` has no picture, if it has none: `explain` heads each step with its
/// llama.h call and draws the cells of the whole-context dump, which llama.cpp and the models
/// of its cache give.
pub fn no_picture(engine: Engine) -> Option<&'static str> {
    match engine {
        Engine::LlamaCpp => None,
        Engine::MlxLm => Some(
            "the picture draws llama.h calls over the cells of a whole-context dump, which \
             mlx-lm's worker does not give",
        ),
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
