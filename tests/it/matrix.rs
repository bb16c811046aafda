//! Version matrices of engines other than llama.cpp: the real binary runs `kvaudit matrix` over
//! every mlx-lm version kvaudit knows (`mlx-lm@all`, the environments `.ci/run` makes), and
//! each cell must say what the repro file records for that version (`fails`: the finding is
//! present, `holds`: absent); a llama.cpp file in the same run is not applicable on every
//! mlx-lm column (and needs no llama.cpp build).

use std::process::Command;

use libtest_mimic::Trial;

use kvaudit::outputs::repro::{Expect, Repro};
use kvaudit::outputs::versions::matrix::Matrix;
use kvaudit::outputs::versions::Outcome;

/// The mlx-lm corpus file whose expectations differ across the versions (fails on 0.32.2 and
/// 0.28.4, holds on 0.30.7), and a llama.cpp file.
const MLX_FILE: &str = "corpora/crash_mlx_batch_extract_of_sequences_trimmed_to_empty.json";
const LLAMA_FILE: &str = "corpora/i1_seq_cp_twice_stale_max.json";

fn mlx_versions_agree_with_the_file() -> Result<(), String> {
    let root = super::root();
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let json = dir.path().join("matrix.json");
    let out = Command::new(env!("CARGO_BIN_EXE_kvaudit"))
        .args([
            "matrix",
            "--targets",
            "mlx-lm@all",
            MLX_FILE,
            LLAMA_FILE,
            "--json",
        ])
        .arg(&json)
        .current_dir(&root)
        .output()
        .map_err(|e| e.to_string())?;
    super::exited(&out, 0)?;
    let text = std::fs::read_to_string(&json).map_err(|e| e.to_string())?;
    let matrix: Matrix = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let known: Vec<String> = kvaudit::outputs::versions::versions_of(
        kvaudit::targets::registry::TargetKind::Mlx,
        kvaudit::targets::llama::pins::Variant::RELEASE,
    )
    .map_err(|e| e.to_string())?;
    if matrix.versions != known || known.len() < 3 {
        return Err(format!(
            "columns {:?}, expected every mlx-lm version oldest first {known:?}",
            matrix.versions
        ));
    }
    let repro = Repro::load(&root.join(MLX_FILE)).map_err(|e| e.to_string())?;
    let [mlx_row, llama_row] = matrix.rows.as_slice() else {
        return Err(format!("{} rows, expected 2", matrix.rows.len()));
    };
    let mut checked = 0;
    for (version, outcome) in matrix.versions.iter().zip(&mlx_row.outcomes) {
        let Some(expect) = repro.targets.iter().find(|t| &t.target == version) else {
            return Err(format!("{MLX_FILE} records nothing for {version}"));
        };
        let want = Some(expect.expect == Expect::Fails);
        if outcome.present() != want {
            return Err(format!(
                "{version}: the matrix says {} ({}), the file records {:?}",
                outcome.word(),
                outcome.detail(),
                expect.expect
            ));
        }
        checked += 1;
    }
    if checked != known.len() {
        return Err(format!("{checked} cells checked of {}", known.len()));
    }
    if let Some(o) = llama_row
        .outcomes
        .iter()
        .find(|o| !matches!(o, Outcome::NotApplicable { .. }))
    {
        return Err(format!(
            "the llama.cpp file on mlx-lm: {}, expected not applicable",
            o.detail()
        ));
    }
    Ok(())
}

pub fn trials() -> Vec<Trial> {
    vec![Trial::test(
        "matrix::mlx_versions_agree_with_the_file",
        || super::outcome(mlx_versions_agree_with_the_file()),
    )]
}
