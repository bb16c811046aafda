//! The one integration-test binary (ripgrep's `tests/it` layout): every test is a data file run
//! through one `check` path, so `cargo test -- <name>` filters by file name.
//!
//! - `tests/data/audits/*.json`: exhaustive audits and the figures they must report.
//! - `tests/data/cli/cases.json`: command lines, with the exit code and output they must give.
//! - `tests/data/llama/*.json`: crash isolation, `+assert` aborts, fast-reset honesty and C
//!   reproducers on real llama.cpp builds.
//! - `tests/data/hunt/*.json`: `kvaudit hunt` runs (native with and without an injected fault, a
//!   short hunt and the plan of a llama.cpp pin): exit codes, groups and their classes.
//! - `tests/it/hostile.rs`: hostile strings in every free-text field, through every emitter.
//! - `tests/data/minimal/*.json`: hunt groups whose traces are local minima: committed hunt
//!   reports and fresh hunts, each group's representative shrunk again and given back.
//! - `tests/data/fuzz/*.json`: the guided fuzzer: findings, determinism, `--corpus` round trips.
//! - `fuzz/seeds/<target>/`: each fuzz target's body over its seeds and their mutations.
//! - `tests/data/theorems/*.json`: the numerical oracles T1-T3 on `native+tensors`: seed witnesses,
//!   negative controls and injected faults.
//! - `oracles.rs`: the oracle registry: a registered test oracle is judged everywhere, and every
//!   positive control the registry lists fires where it says.
//! - `tests/data/cluster/*.json`: the Slurm example scripts, driven as Slurm runs them; the
//!   merged report equals the unsharded one.
//! - `tests/data/resume/*.json`: audits stopped (in process, or the binary by a signal) and
//!   resumed give the report of a run that was not stopped.
//! - `tests/data/py_repro/*.json`: Python reproducers and bug reports of findings on mlx-lm,
//!   run with mlx-lm.
//! - `fixes.rs`: a fix of `corpora/fixes/` built into its pin and checked against the whole
//!   corpus (its file holds, nothing else moves), as `scripts/fixes-check.sh` checks them all.
//! - `ops.rs`: every op kind through every renderer, generator, shrinker move and domain axis.
//! - `workers.rs`: the JSON-lines workers' own unittests (`workers/test_*.py`).
//! - `cross.rs`: llama.cpp and mlx-lm on one model: next-token logits agree (issue 44).
//! - `targets.rs`: every target kind through the registry: its pattern, a runner, its declared
//!   capabilities.
//! - `tidy.rs`: the architecture's invariants, read from the source (layers, `unsafe`, one state
//!   parser, module docs, target names tested only in the registry).

mod audits;
mod cli;
mod cluster;
mod corpus;
mod cross;
mod docs;
mod findings;
mod fixes;
mod fuzz_guided;
mod fuzz_seeds;
mod hostile;
mod hunt;
mod llama;
mod llama_build;
mod llama_config;
mod matrix;
mod measure;
mod minimal;
mod ops;
mod oracles;
mod py_repro;
mod resume;
mod targets;
mod theorems;
mod tidy;
mod workers;

use std::path::{Path, PathBuf};

use libtest_mimic::{Arguments, Failed, Trial};

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Data files of one kind, sorted, as (test name, path).
pub fn data_files(dir: &Path, ext: &str) -> Vec<(String, PathBuf)> {
    let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some(ext))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    v.sort();
    v
}

/// A finished command's stdout and stderr, if it exited with `expected` (else what it said).
pub fn exited(out: &std::process::Output, expected: i32) -> Result<(String, String), String> {
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    let code = out.status.code().ok_or("killed by a signal")?;
    if code != expected {
        return Err(format!(
            "exit {code}, expected {expected}\nstdout: {stdout}\nstderr: {stderr}"
        ));
    }
    Ok((stdout, stderr))
}

/// Turns a `Result<(), String>` into a libtest-mimic outcome.
pub fn outcome(r: Result<(), String>) -> Result<(), Failed> {
    r.map_err(Failed::from)
}

fn main() {
    let args = Arguments::from_args();
    let mut trials: Vec<Trial> = Vec::new();
    trials.extend(audits::trials());
    trials.extend(cli::trials());
    trials.extend(cross::trials());
    trials.extend(cluster::trials());
    trials.extend(corpus::trials());
    trials.extend(docs::trials());
    trials.extend(findings::trials());
    trials.extend(fixes::trials());
    trials.extend(fuzz_guided::trials());
    trials.extend(fuzz_seeds::trials());
    trials.extend(hostile::trials());
    trials.extend(hunt::trials());
    trials.extend(llama::trials());
    trials.extend(llama_config::trials());
    trials.extend(matrix::trials());
    trials.extend(minimal::trials());
    trials.extend(resume::trials());
    let run = |f: fn() -> anyhow::Result<()>| {
        move || f().map_err(|e| libtest_mimic::Failed::from(format!("{e:#}")))
    };
    trials.push(Trial::test(
        "llama_build::wrong_abi_is_refused",
        run(llama_build::wrong_abi_is_refused),
    ));
    trials.push(Trial::test(
        "llama_build::tampered_entry_is_refused",
        run(llama_build::tampered_entry_is_refused),
    ));
    trials.push(Trial::test(
        "llama_build::an_edit_recompiles_one_file_and_a_touch_nothing",
        run(llama_build::an_edit_recompiles_one_file_and_a_touch_nothing),
    ));
    trials.push(Trial::test(
        "llama_build::a_source_tree_replays_the_corpus_and_catches_a_reintroduced_bug",
        run(llama_build::a_source_tree_replays_the_corpus_and_catches_a_reintroduced_bug),
    ));
    trials.push(Trial::test(
        "llama_build::git_bisect_run_names_the_commit_that_reintroduced_a_bug",
        run(llama_build::git_bisect_run_names_the_commit_that_reintroduced_a_bug),
    ));
    trials.push(Trial::test(
        "llama_build::both_pins_build_load_side_by_side_and_match_llama_facts",
        run(|| {
            let model = kvaudit::model::tiny::try_default_model_path()?;
            for (built, _) in llama_build::build_and_load_both_pins()? {
                llama_build::exports_only_shim_symbols(&built.so_path)?;
            }
            llama_build::doubled_seq_cp_matches_llama_facts(&model)
        }),
    ));
    trials.extend(measure::trials());
    trials.extend(oracles::trials());
    trials.extend(py_repro::trials());
    trials.extend(ops::trials());
    trials.extend(targets::trials());
    trials.extend(theorems::trials());
    trials.extend(tidy::trials());
    trials.extend(workers::trials());
    libtest_mimic::run(&args, trials).exit();
}
