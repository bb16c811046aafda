//! The guided fuzzer (`kvaudit fuzz --generator guided`), one test per `tests/data/fuzz/*.json`:
//! the real binary with the file's arguments, and what the file expects of it:
//!
//! - `finds`: the oracles with a finding (exactly these);
//! - `deterministic`: a second run of the same arguments gives the same findings, coverage
//!   counts and queue (the guided run is a function of the seed, the cases and the corpus);
//! - `corpus_reload`: the run's `--corpus` folder holds its queue, and a second run whose cases
//!   are just the saved entries reaches exactly the first run's coverage (every transition and
//!   shape was first reached by a case the queue kept), then a longer one goes on from there.

use std::path::{Path, PathBuf};
use std::process::Command;

use libtest_mimic::Trial;
use serde::Deserialize;

use kvaudit::records::fuzz::{CoveragePoint, Generator};
use kvaudit::records::report::Report;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GuidedCase {
    #[allow(dead_code)]
    about: String,
    args: Vec<String>,
    finds: Vec<String>,
    deterministic: bool,
    corpus_reload: bool,
}

pub fn trials() -> Vec<Trial> {
    super::data_files(&super::root().join("tests/data/fuzz"), "json")
        .into_iter()
        .map(|(stem, path)| {
            Trial::test(format!("fuzz_guided::{stem}"), move || {
                super::outcome(check(&stem, &path))
            })
        })
        .collect()
}

/// A fresh folder under the target directory for one test's corpus.
fn scratch(stem: &str, run: &str) -> PathBuf {
    let dir = super::root()
        .join("target/fuzz-guided-tests")
        .join(format!("{stem}-{run}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// One guided run: its report, and the files of its corpus folder (name and contents).
fn run(
    args: &[String],
    corpus: &Path,
    cases: Option<u64>,
) -> Result<(Report, Vec<(String, String)>), String> {
    let mut args = args.to_vec();
    if let Some(n) = cases {
        let i = args
            .iter()
            .position(|a| a == "--cases")
            .ok_or("the case needs --cases")?;
        args[i + 1] = n.to_string();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_kvaudit"))
        .arg("fuzz")
        .args(&args)
        .args([
            "--generator",
            "guided",
            "--no-repros",
            "-q",
            "--format",
            "json",
            "--corpus",
        ])
        .arg(corpus)
        .output()
        .map_err(|e| e.to_string())?;
    if !matches!(out.status.code(), Some(0 | 1)) {
        return Err(format!(
            "kvaudit fuzz {args:?}: {:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let report: Report = serde_json::from_slice(&out.stdout).map_err(|e| format!("report: {e}"))?;
    let mut files: Vec<(String, String)> = std::fs::read_dir(corpus)
        .map_err(|e| e.to_string())?
        .map(|e| {
            let p = e.map_err(|e| e.to_string())?.path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            std::fs::read_to_string(&p)
                .map(|t| (name, t))
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, String>>()?;
    files.sort();
    Ok((report, files))
}

fn last(r: &Report) -> Result<CoveragePoint, String> {
    let fz = r.fuzz.as_ref().ok_or("not a fuzz report")?;
    if fz.generator_kind != Generator::Guided {
        return Err(format!("generator {:?}", fz.generator_kind));
    }
    fz.coverage
        .last()
        .copied()
        .ok_or_else(|| "no coverage".into())
}

fn check(stem: &str, path: &Path) -> Result<(), String> {
    let case: GuidedCase =
        serde_json::from_str(&std::fs::read_to_string(path).map_err(|e| e.to_string())?)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    let first_dir = scratch(stem, "first");
    let (first, files) = run(&case.args, &first_dir, None)?;
    let mut found: Vec<String> = first
        .findings
        .iter()
        .map(|f| f.oracle.to_string())
        .collect();
    found.dedup();
    if found != case.finds {
        return Err(format!("findings of {found:?}, expected {:?}", case.finds));
    }
    let cov = last(&first)?;
    let queue = first
        .fuzz
        .as_ref()
        .and_then(|f| f.queue)
        .ok_or("no queue")?;
    if queue.entries as usize != files.len() || files.is_empty() {
        return Err(format!(
            "{} queue entries, {} corpus files",
            queue.entries,
            files.len()
        ));
    }
    if case.deterministic {
        let again_dir = scratch(stem, "again");
        let (again, again_files) = run(&case.args, &again_dir, None)?;
        let c = last(&again)?;
        if again.findings != first.findings
            || (c.transitions, c.shapes) != (cov.transitions, cov.shapes)
            || again_files != files
        {
            return Err("the same seed gave other findings, coverage or queue".into());
        }
        let _ = std::fs::remove_dir_all(&again_dir);
    }
    if case.corpus_reload {
        let (replayed, replayed_files) = run(&case.args, &first_dir, Some(queue.entries))?;
        let c = last(&replayed)?;
        let q = replayed
            .fuzz
            .as_ref()
            .and_then(|f| f.queue)
            .ok_or("no queue")?;
        if q.loaded != queue.entries || (c.transitions, c.shapes) != (cov.transitions, cov.shapes) {
            return Err(format!(
                "replaying the {} saved entries ({} loaded) reached {c:?}, the first run {cov:?}",
                queue.entries, q.loaded
            ));
        }
        if replayed_files != files {
            return Err("replaying the saved queue changed it".into());
        }
        let (longer, longer_files) = run(&case.args, &first_dir, Some(2 * queue.entries + 100))?;
        let l = last(&longer)?;
        if l.total() <= cov.total() || longer_files.len() <= files.len() {
            return Err(format!(
                "a longer run from the corpus added nothing: {l:?} after {cov:?}"
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&first_dir);
    Ok(())
}
