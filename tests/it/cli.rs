//! Command-line cases: run the real binary and check exit code and output. `@DATA/` in an
//! argument stands for `tests/data/cli/`. Cases live in `tests/data/cli/cases.json` and in any
//! `tests/data/cli/cases_*.json` (same format; one file per feature keeps concurrent edits apart).

use std::process::Command;

use libtest_mimic::Trial;
use serde::Deserialize;

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct CliCase {
    name: String,
    args: Vec<String>,
    exit: i32,
    #[serde(default)]
    stdout: Option<String>,
    #[serde(default)]
    stderr: Option<String>,
    /// Run with stdout a pipe whose reading end is already closed (`kvaudit oracles | head -0`):
    /// the case then checks the exit code and that no panic reached stderr.
    #[serde(default)]
    stdout_closed: bool,
}

pub fn trials() -> Vec<Trial> {
    let files = super::data_files(&super::root().join("tests/data/cli"), "json");
    let cases = files
        .into_iter()
        .filter(|(stem, _)| stem == "cases" || stem.starts_with("cases_"))
        .flat_map(|(stem, path)| {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let cases: Vec<CliCase> = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("tests/data/cli/{stem}.json does not parse: {e}"));
            cases
        });
    cases
        .map(|c| {
            Trial::test(format!("cli::{}", c.name), move || {
                super::outcome(check(&c))
            })
        })
        .collect()
}

fn check(c: &CliCase) -> Result<(), String> {
    let data = super::root().join("tests/data/cli");
    let args: Vec<String> = c
        .args
        .iter()
        .map(|a| a.replace("@DATA", &data.to_string_lossy()))
        .collect();
    let mut command = Command::new(env!("CARGO_BIN_EXE_kvaudit"));
    command.args(&args);
    let out = if c.stdout_closed {
        // The reading end is closed before the child starts, so its first write fails
        // whatever the scheduling (a pipe closed after the spawn races a fast child).
        let (reader, writer) = std::io::pipe().map_err(|e| e.to_string())?;
        drop(reader);
        command.stdout(writer).output().map_err(|e| e.to_string())?
    } else {
        command.output().map_err(|e| e.to_string())?
    };
    if c.stdout_closed {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("panicked") || stderr.contains("RUST_BACKTRACE") {
            return Err(format!("a panic reached the user:\n{stderr}"));
        }
    }
    let (stdout, stderr) = super::exited(&out, c.exit)?;
    if let Some(s) = &c.stdout {
        if !stdout.contains(s.as_str()) {
            return Err(format!("stdout lacks {s:?}:\n{stdout}"));
        }
    }
    if let Some(s) = &c.stderr {
        if !stderr.contains(s.as_str()) {
            return Err(format!("stderr lacks {s:?}:\n{stderr}"));
        }
        if stderr.contains("panicked") || stderr.contains("RUST_BACKTRACE") {
            return Err(format!("a panic reached the user:\n{stderr}"));
        }
    }
    Ok(())
}
