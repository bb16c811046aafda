//! A bug report for mlx-lm's tracker, in Markdown: a one-line summary, what happens, expected
//! against observed in mlx-lm's words (its docstrings and API: `trim_prompt_cache`'s return
//! value, `offset`, `state`), the calls, the standalone Python program (`outputs/py_repro`, with
//! the exit code it had when run), the versions (mlx-lm and mlx) and the caches' configuration.
//! llama.cpp's report is `bug_report.rs`; this one quotes no llama.h.
//!
//! Text from the repro file (its summary, postmortem, kind, target names, values) is hostile: it
//! goes through `markdown_text` or `markdown_code`; the program goes inside a fence longer than
//! any backtick run in it.

use std::fmt::Write as _;

use serde_json::Value;

use crate::base::op::{Op, OpKind};
use crate::oracles::{cache_invisible, contract, round_trip, OracleId};
use crate::outputs::bug_report::{fenced, CheckedProgram};
use crate::outputs::py_repro::check::py_check_of;
use crate::outputs::py_repro::settings::MlxSetup;
use crate::outputs::repro::{Expect, Repro};
use crate::records::report::{markdown_code, markdown_text};
use crate::targets::mlx::MlxPin;
use crate::targets::registry::TargetKind;

/// What mlx-lm's API says the finding's calls do, for "expected" (quoted from mlx-lm 0.32's
/// `mlx_lm/models/cache.py`).
fn in_mlx_words(oracle: OracleId, op: Option<&Op>) -> String {
    let trim = "`trim_prompt_cache(cache, num_tokens)`: \"Trim the model's cache by the given number of tokens. This function will trim the cache if possible (in-place) and return the number of tokens that were trimmed.\"";
    let offset = "A cache's `offset` counts the tokens it holds (the next token goes there; `trim(n)` lowers it by the `n` it returns) and its `state` is what it holds (what `save_prompt_cache` writes and `from_state` rebuilds a cache from): both should name the same positions.";
    if oracle == OracleId::I1 {
        return offset.into();
    }
    if oracle == OracleId::I2 {
        return "The positions a cache's `state` holds are contiguous: a cache holds a prefix of its tokens (or a window of them).".into();
    }
    if oracle == OracleId::CRASH {
        return "The calls return (mlx-lm documents no exception for them).".into();
    }
    if oracle == round_trip::ID {
        return "`save_prompt_cache`: \"Save a pre-computed prompt cache to a file.\" and `load_prompt_cache`: \"Load a prompt cache from a file.\": the loaded cache holds what the saved one held (same `state`, same `offset`), and saves to the same bytes.".into();
    }
    if oracle == cache_invisible::ID {
        return "A prompt cache stands for the tokens it holds: the next-token logits after it equal (within the tolerance below) those after a fresh cache prefilled with those tokens.".into();
    }
    if oracle == contract::ID || oracle == contract::QUESTION_ID {
        return match op.map(Op::kind) {
            Some(OpKind::SeqRm) => format!("{trim} The trimmed tokens leave the cache: its `state` holds the positions before the trimmed ones only."),
            Some(OpKind::Decode) => "The model called with `cache=` adds the tokens to the cache (`update_and_fetch`): its `state` holds them at the positions after the ones it held.".into(),
            Some(OpKind::SeqCp) => "A copy of a prompt cache (`copy.deepcopy`, as `LRUPromptCache` copies one) holds what the original holds.".into(),
            Some(OpKind::StateLoad | OpKind::StateSeqLoad) => "`load_prompt_cache`: \"Load a prompt cache from a file.\": the loaded cache holds what the saved one held.".into(),
            Some(OpKind::SeqKeep | OpKind::Clear) | None => "A fresh prompt cache (`make_prompt_cache`) holds nothing; the others are left as they were.".into(),
            // A save changes no cache; mlx-lm has no shift (left out, never run).
            Some(OpKind::StateSave | OpKind::StateSeqSave | OpKind::SeqAdd | OpKind::SeqDiv) => "The call leaves every cache as it was.".into(),
        };
    }
    py_check_of(oracle).map_or_else(String::new, |c| format!("{}.", c.in_words))
}

/// The observation of a repro, for the report: a crash's first line only (its traceback names
/// files of the machine that ran it).
fn observed_text(observed: &Value) -> String {
    match observed.get("crash").and_then(Value::as_str) {
        Some(crash) => crash.lines().next().unwrap_or_default().to_string(),
        None => observed.to_string(),
    }
}

/// What the oracle expected, without the llama.h clause a contract finding carries (the
/// report quotes mlx-lm instead).
fn expected_text(expected: &Value) -> String {
    match expected {
        Value::Object(fields) => {
            let mut fields = fields.clone();
            fields.remove("llama.h");
            Value::Object(fields).to_string()
        }
        other => other.to_string(),
    }
}

/// The mlx-lm versions a repro file names, with what it expects there.
fn versions(repro: &Repro) -> Vec<(String, Expect)> {
    repro
        .targets
        .iter()
        .filter(|t| TargetKind::parse(&t.target).ok() == Some(TargetKind::Mlx))
        .map(|t| (t.target.clone(), t.expect))
        .collect()
}

/// The mlx-lm version a report's program is run with by default: the first the file expects to
/// fail, else the first it names.
pub fn default_version(repro: &Repro) -> Option<String> {
    let v = versions(repro);
    v.iter()
        .find(|(_, e)| *e == Expect::Fails)
        .or(v.first())
        .map(|(t, _)| t.clone())
}

/// The line that states a run program's exit code.
pub fn exit_code_line(c: &CheckedProgram) -> String {
    format!(
        "Checked: run with {}: exit code {}.",
        markdown_code(&c.pin),
        c.status
    )
}

/// The Markdown bug report of `repro` (a finding on mlx-lm); `program` is its Python program,
/// `checked` how it ended when run, if it was.
pub fn bug_report(repro: &Repro, program: &str, checked: Option<&CheckedProgram>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# {}\n", markdown_text(&repro.repro));
    let seen = versions(repro);
    let affected: Vec<String> = seen
        .iter()
        .filter(|(_, e)| *e == Expect::Fails)
        .map(|(p, _)| markdown_code(p))
        .collect();
    let op = repro.trace.ops.get(repro.step.saturating_sub(1));
    let _ = writeln!(
        s,
        "**Summary.** {} {}{} after call {} of the trace below{}.\n",
        repro.oracle,
        markdown_text(&repro.kind),
        repro
            .seq
            .map(|q| format!(" (sequence {q})"))
            .unwrap_or_default(),
        repro.step,
        if affected.is_empty() {
            String::new()
        } else {
            format!(", on {}", affected.join(", "))
        }
    );
    let _ = writeln!(s, "## What happens\n");
    let _ = writeln!(
        s,
        "Each sequence is one prompt cache (a list of per-layer caches, as `make_prompt_cache` makes). After call {}{}, the cache was observed as {} where {} was expected.\n",
        repro.step,
        op.map(|o| format!(" ({})", markdown_code(&o.to_json())))
            .unwrap_or_default(),
        markdown_code(&observed_text(&repro.observed)),
        markdown_code(&expected_text(&repro.expected))
    );
    if !repro.postmortem.is_empty() {
        let _ = writeln!(
            s,
            "Cause, as far as known: {}\n",
            markdown_text(&repro.postmortem)
        );
    }
    let _ = writeln!(s, "## Expected vs observed\n");
    let _ = writeln!(
        s,
        "- expected, in mlx-lm's words: {}",
        in_mlx_words(repro.oracle, op)
    );
    let _ = writeln!(
        s,
        "- observed: {}",
        markdown_code(&observed_text(&repro.observed))
    );
    let _ = writeln!(
        s,
        "- expected: {}\n",
        markdown_code(&expected_text(&repro.expected))
    );
    let _ = writeln!(s, "## The calls\n");
    let _ = writeln!(s, "As kvaudit ops (the program below makes them mlx-lm calls, each under a comment naming its op):\n");
    let mut calls = String::new();
    for op in &repro.trace.setup.ops {
        let _ = writeln!(calls, "setup: {}", op.to_json());
    }
    for (i, op) in repro.trace.ops.iter().enumerate() {
        let mark = if i + 1 == repro.step {
            "   <- here"
        } else {
            ""
        };
        let _ = writeln!(calls, "{:>2}. {}{mark}", i + 1, op.to_json());
    }
    s.push_str(&fenced("text", &calls));
    let _ = writeln!(s, "\n## Reproducer (Python, mlx and mlx-lm only)\n");
    let _ = writeln!(s, "Run with mlx-lm installed (`pip install mlx-lm`; on Linux `mlx[cpu]` too): `python3 repro.py`. It builds its tiny model in code, no download and no file: the llama of kvaudit's GGUF file with its weights made again from their seed, or a model from `mx.random.seed(0)`. Exit code 1: the bug reproduces (it prints `BUG: ...`); 0: it does not; 2: the calls could not be replayed.\n");
    match checked {
        Some(c) => {
            let _ = writeln!(s, "{}\n", exit_code_line(c));
        }
        None => {
            let _ = writeln!(s, "Not run for this report.\n");
        }
    }
    s.push_str(&fenced("python", program));
    let _ = writeln!(s, "\n## Versions\n");
    if seen.is_empty() {
        let _ = writeln!(s, "No mlx-lm version was checked.\n");
    } else {
        let _ = writeln!(s, "| mlx-lm | mlx | shows it |\n|---|---|---|");
        for (p, e) in &seen {
            let mlx = MlxPin::parse(p)
                .map(|pin| pin.mlx)
                .unwrap_or_else(|_| "?".into());
            let _ = writeln!(
                s,
                "| {} | {} | {} |",
                markdown_code(p),
                markdown_code(&mlx),
                if *e == Expect::Fails { "yes" } else { "no" }
            );
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(s, "These are the versions this trace was checked on, not a bisection. CPU (`mlx[cpu]`), float32 weights.\n");
    let _ = writeln!(s, "## Configuration\n");
    match MlxSetup::of(&repro.trace.setup) {
        Ok(setup) => {
            let _ = writeln!(s, "- {}", setup.describe());
        }
        Err(e) => {
            let _ = writeln!(s, "- {}", markdown_text(&e.message));
        }
    }
    s
}

/// The Python program of a report (between the fences after the heading "Reproducer") and the
/// exit code it states; for tests and scripts that check a report.
pub fn program_and_status(report: &str) -> Option<(String, Option<i32>)> {
    let after = &report[report.find("## Reproducer")?..];
    let status = after
        .lines()
        .find(|l| l.starts_with("Checked: "))
        .and_then(|l| l.rsplit("exit code ").next())
        .and_then(|n| n.trim_end_matches('.').parse().ok());
    let mut lines = after.lines();
    let fence = lines
        .find(|l| {
            l.ends_with("python") && l.len() > 8 && l[..l.len() - 6].bytes().all(|b| b == b'`')
        })?
        .trim_end_matches("python")
        .to_string();
    let mut body = String::new();
    for line in lines {
        if line == fence {
            return Some((body, status));
        }
        body.push_str(line);
        body.push('\n');
    }
    None
}
