//! Cluster scripts (`tests/data/cluster/*.json`): the Slurm job-array example driven with the
//! environment Slurm gives each task (`SLURM_ARRAY_TASK_ID`, `_COUNT`, `_MIN`,
//! `SLURM_CPUS_PER_TASK`), then its merge job: the merged report must equal the report of one
//! unsharded run (wall-clock figures aside). `scripts/slurm-check.sh` runs the same scripts
//! under a real single-node Slurm (docs/usage.md, "On a cluster").

use std::process::Command;

use libtest_mimic::Trial;
use serde::Deserialize;

use kvaudit::records::report::Report;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterCase {
    #[allow(dead_code)]
    about: String,
    /// The array task's script, from the repository root.
    script: String,
    /// The merge job's script.
    merge: String,
    /// `KVAUDIT_ARGS`: the audit's command line.
    audit: String,
    shards: usize,
    task_min: usize,
}

pub fn trials() -> Vec<Trial> {
    super::data_files(&super::root().join("tests/data/cluster"), "json")
        .into_iter()
        .map(|(name, path)| {
            Trial::test(format!("cluster::{name}"), move || {
                super::outcome(check(&path))
            })
        })
        .collect()
}

/// Runs `script` with bash and `env`; fails unless it exits 0.
fn job(script: &str, env: &[(&str, String)]) -> Result<(), String> {
    let out = Command::new("bash")
        .arg(super::root().join(script))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "{script} {env:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

fn check(path: &std::path::Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let case: ClusterCase =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let shards = dir.path().join("shards");
    let common = [
        ("KVAUDIT", env!("CARGO_BIN_EXE_kvaudit").to_string()),
        ("KVAUDIT_OUT", shards.to_string_lossy().into_owned()),
        ("KVAUDIT_ARGS", case.audit.clone()),
    ];
    for k in 0..case.shards {
        let mut env = common.to_vec();
        env.extend([
            ("SLURM_ARRAY_TASK_ID", (case.task_min + k).to_string()),
            ("SLURM_ARRAY_TASK_COUNT", case.shards.to_string()),
            ("SLURM_ARRAY_TASK_MIN", case.task_min.to_string()),
            ("SLURM_CPUS_PER_TASK", "2".to_string()),
        ]);
        job(&case.script, &env)?;
        if k == 0 {
            // A requeued task: its report is finished, and stays what it was.
            job(&case.script, &env)?;
        }
    }
    job(&case.merge, &common)?;
    let mut merged = Report::load(&shards.join("report.json")).map_err(|e| e.to_string())?;
    let whole_path = dir.path().join("whole.json");
    let status = Command::new(env!("CARGO_BIN_EXE_kvaudit"))
        .arg("audit")
        .args(case.audit.split_whitespace())
        .arg("--out")
        .arg(&whole_path)
        .arg("--quiet")
        .status()
        .map_err(|e| e.to_string())?;
    if status.code().map_or(true, |c| c > 1) {
        return Err(format!("the unsharded audit: {status}"));
    }
    let mut whole = Report::load(&whole_path).map_err(|e| e.to_string())?;
    // Wall clock aside; PREREG.md's predictions are checked by `audit`, not by `merge`.
    for r in [&mut merged, &mut whole] {
        r.timing = Default::default();
        r.prediction.clear();
    }
    if merged != whole {
        return Err(format!(
            "merged shards differ from the unsharded run:\nmerged: {}\nwhole: {}",
            merged.to_json(),
            whole.to_json()
        ));
    }
    Ok(())
}
