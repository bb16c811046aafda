//! The JSON-lines workers' own tests (`workers/test_*.py`, standard-library `unittest`), run
//! against the interpreter kvaudit runs each worker with: `python3` for the reference worker,
//! the environment kvaudit makes for mlx-lm (made here when it is not: `.ci/run` makes it
//! first). A worker's own tests pin the protocol's edge cases that an audit does not reach
//! (malformed requests, a hang, each fault's exact reply). Beside them, the mlx and reference
//! workers' hellos against what the hunt's plans take them to declare.

use libtest_mimic::Trial;

use std::path::Path;
use std::process::Command;

fn unittest(python: &Path, file: &str, env: &[(&str, &Path)]) -> Result<(), String> {
    let out = Command::new(python)
        .args(["-m", "unittest", file])
        .current_dir(super::root())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .envs(env.iter().map(|(k, v)| (*k, *v)))
        .output()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    let err = String::from_utf8_lossy(&out.stderr);
    // unittest says "OK" (or "OK (skipped=N)") on its last line when every test passed.
    let last = err
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    if out.status.success() && last.starts_with("OK") {
        Ok(())
    } else {
        Err(format!("{file}: {}\n{err}", out.status))
    }
}

fn python_ref() -> Result<(), String> {
    let python = kvaudit::targets::python::python3().map_err(|e| e.to_string())?;
    unittest(&python, "workers/test_python_ref.py", &[])
}

fn mlx() -> Result<(), String> {
    let python = kvaudit::targets::python::python3().map_err(|e| e.to_string())?;
    let pin = kvaudit::targets::mlx::MlxPin::parse("mlx-lm@0.32.2").map_err(|e| e.to_string())?;
    let venv = pin.ensure_built().map_err(|e| e.to_string())?;
    let gguf = kvaudit::model::tiny::try_audit_model_path().map_err(|e| e.to_string())?;
    unittest(
        &python,
        "workers/test_mlx_worker.py",
        &[
            ("KVAUDIT_TEST_MLX_PYTHON", venv.as_path()),
            // kvaudit's GGUF tiny llama, the file the mlx-lm target runs (the worker's test of
            // loading it skips without it).
            ("KVAUDIT_TEST_MLX_GGUF", gguf.as_path()),
        ],
    )
}

/// What the hunt's plan takes the worker of target `name` to observe (`planned`) and lack
/// (`lacks`) is what its hello declares: mlx-lm's (`targets::mlx::declared_observations`,
/// `LACKS`), the reference worker's (`targets::python::REFERENCE_OBSERVES`, `REFERENCE_LACKS`).
fn declared(
    name: &str,
    planned: kvaudit::base::cache::Observe,
    lacks: &[kvaudit::base::op_kind::OpKind],
) -> Result<(), String> {
    use kvaudit::base::op_kind::OpKind;
    let spec = kvaudit::targets::registry::TargetSpec::new(name, &[]);
    let runner = spec.factory().map_err(|e| e.to_string())?().map_err(|e| e.to_string())?;
    let caps = runner.capabilities();
    let declared = (
        caps.before,
        caps.whole,
        caps.round_trip,
        caps.logits,
        caps.sizes,
    );
    let taken = (
        planned.before,
        planned.whole,
        planned.round_trip,
        planned.logits,
        planned.sizes,
    );
    if declared != taken {
        return Err(format!(
            "{name}: the hello declares (before, whole, round_trip, logits, sizes) {declared:?}, the plan takes {taken:?}"
        ));
    }
    let lacking: Vec<OpKind> = OpKind::ALL
        .iter()
        .copied()
        .filter(|k| !caps.has(*k))
        .collect();
    if lacking != lacks {
        return Err(format!(
            "{name}: the hello lacks {lacking:?}, the plan leaves out {lacks:?}"
        ));
    }
    Ok(())
}

fn mlx_declared(name: &str) -> Result<(), String> {
    use kvaudit::targets::mlx::{declared_observations, LACKS};
    declared(
        name,
        declared_observations(name).map_err(|e| e.to_string())?,
        &LACKS,
    )
}

pub fn trials() -> Vec<Trial> {
    vec![
        Trial::test("workers::python_ref_unittest", || {
            super::outcome(python_ref())
        }),
        Trial::test("workers::mlx_worker_unittest_0.32.2", || {
            super::outcome(mlx())
        }),
        Trial::test("workers::mlx_declared_observations_0.32.2", || {
            super::outcome(mlx_declared("mlx-lm@0.32.2"))
        }),
        Trial::test("workers::mlx_declared_observations_0.30.7", || {
            super::outcome(mlx_declared("mlx-lm@0.30.7"))
        }),
        Trial::test("workers::python_ref_declared_observations", || {
            use kvaudit::targets::python::{REFERENCE, REFERENCE_LACKS, REFERENCE_OBSERVES};
            super::outcome(declared(REFERENCE, REFERENCE_OBSERVES, &REFERENCE_LACKS))
        }),
    ]
}
