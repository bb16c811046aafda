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
    let out = Command::new(env!("CARGO_BIN_EXE_kvaudit"))
        .args(&args)
        .output()
        .map_err(|e| e.to_string())?;
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
