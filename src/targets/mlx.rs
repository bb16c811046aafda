//! The mlx-lm target (`mlx-lm@VERSION`): mlx-lm's KV caches driven by `workers/mlx_worker.py`
//! over the JSON-lines protocol, in a virtual environment kvaudit makes from the package
//! registry and caches.
//!
//! A version is pinned with the mlx it runs on ([`PINS`]: mlx-lm names no mlx for Linux from
//! 0.28 on, so the pair is kvaudit's). The environment lives in the cache folder under a key of
//! the pair and the interpreter's version, and is made whole or not at all (built beside,
//! renamed when complete), so a build that stopped half-way is built again, never used.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::base::cache::Observe;
use crate::base::op::Arch;
use crate::base::error::Error;
use crate::isolation::jsonl::WorkerCommand;
use crate::targets::python::{python3, python_command, worker_file};

/// The target name's prefix.
pub const PREFIX: &str = "mlx-lm@";

/// The worker's source.
const WORKER_SOURCE: &str = include_str!("../../workers/mlx_worker.py");

/// Each mlx-lm version kvaudit runs, with the `mlx[cpu]` version it is installed with (each pair
/// installed and imported on this machine kind: docs/mlx-lm.md). The first is the default.
pub const PINS: [(&str, &str); 3] = [("0.32.2", "0.32.4"), ("0.30.7", "0.30.6"), ("0.28.4", "0.29.4")];

/// An mlx-lm version and the mlx it runs with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlxPin {
    /// mlx-lm's version.
    pub mlx_lm: String,
    /// mlx's (`mlx[cpu]`).
    pub mlx: String,
}

impl MlxPin {
    /// The pin a target name names (`mlx-lm@0.32.2`).
    pub fn parse(name: &str) -> Result<MlxPin, Error> {
        let version = name.strip_prefix(PREFIX).ok_or_else(|| {
            Error::input(format!("'{name}' is not an mlx-lm target ({PREFIX}VERSION)"))
        })?;
        PINS.iter()
            .find(|(v, _)| *v == version)
            .map(|(v, m)| MlxPin {
                mlx_lm: v.to_string(),
                mlx: m.to_string(),
            })
            .ok_or_else(|| {
                let known: Vec<String> = PINS.iter().map(|(v, _)| format!("{PREFIX}{v}")).collect();
                Error::input(format!(
                    "{name}: kvaudit knows no mlx to run this mlx-lm with (known: {})",
                    known.join(", ")
                ))
            })
    }

    /// Its target name.
    pub fn label(&self) -> String {
        format!("{PREFIX}{}", self.mlx_lm)
    }

    /// The packages the environment installs, as pip takes them.
    fn requirements(&self) -> [String; 2] {
        [format!("mlx[cpu]=={}", self.mlx), format!("mlx-lm=={}", self.mlx_lm)]
    }

    /// The environment's folder for the interpreter `python` (its version is part of the key).
    fn venv_dir(&self, python: &Path) -> Result<PathBuf, Error> {
        let version = run_text(Command::new(python).arg("--version"))?;
        let mut h = Sha256::new();
        for r in self.requirements() {
            h.update(r.as_bytes());
            h.update(b"\n");
        }
        h.update(version.trim().as_bytes());
        let hash: String = h.finalize()[..6].iter().map(|b| format!("{b:02x}")).collect();
        Ok(crate::model::tiny::cache_dir()
            .join("mlx-lm")
            .join(format!("{}-{hash}", self.mlx_lm)))
    }

    /// The environment's interpreter when it is built.
    pub fn built(&self) -> Result<Option<PathBuf>, Error> {
        let dir = self.venv_dir(&python3()?)?;
        let py = dir.join("bin").join("python");
        Ok(py.is_file().then_some(py))
    }

    /// The environment's interpreter, the environment made first when it is not (a progress
    /// line on stderr: it takes under a minute).
    pub fn ensure_built(&self) -> Result<PathBuf, Error> {
        let python = python3()?;
        let dir = self.venv_dir(&python)?;
        let py = dir.join("bin").join("python");
        if py.is_file() {
            return Ok(py);
        }
        if run_text(Command::new(&python).args(["-c", "import venv, ensurepip"])).is_err() {
            return Err(Error::input(format!(
                "{} has no venv or ensurepip module: install it (Debian: apt-get install python3-venv)",
                python.display()
            )));
        }
        let building = dir.with_extension("building");
        let _ = std::fs::remove_dir_all(&building);
        std::fs::create_dir_all(building.parent().expect("in the cache folder"))
            .map_err(|e| Error::harness(format!("{}: {e}", building.display())))?;
        eprintln!(
            "kvaudit: making the environment of {} ({} and {}) in {}",
            self.label(),
            self.requirements()[0],
            self.requirements()[1],
            dir.display()
        );
        run_text(Command::new(&python).arg("-m").arg("venv").arg(&building))?;
        run_text(
            Command::new(building.join("bin").join("python"))
                .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
                .args(self.requirements()),
        )
        .map_err(|e| Error::harness(format!("installing {}: {}", self.label(), e.message)))?;
        std::fs::rename(&building, &dir)
            .map_err(|e| Error::harness(format!("{}: {e}", dir.display())))?;
        Ok(py)
    }
}

/// Runs `cmd`, its standard output as text; its standard error in the `Err`.
fn run_text(cmd: &mut Command) -> Result<String, Error> {
    let out = cmd
        .output()
        .map_err(|e| Error::harness(format!("cannot run {cmd:?}: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: String = err
            .lines()
            .rev()
            .take(12)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        return Err(Error::harness(format!("{cmd:?} failed ({}): {tail}", out.status)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned()
        + &String::from_utf8_lossy(&out.stderr))
}

/// The command that runs the worker of target `name` with `faults`, observing `observe`, its
/// environment made first when it is not.
pub fn worker_command(name: &str, faults: &[String], observe: Observe) -> Result<WorkerCommand, Error> {
    let pin = MlxPin::parse(name)?;
    let python = pin.ensure_built()?;
    let script = worker_file("mlx_worker.py", WORKER_SOURCE)?;
    let mut cmd = python_command(&pin.label(), &python, &script, faults, observe);
    // One model for both engines: the GGUF files kvaudit's llama.cpp targets load, for the
    // architectures the worker runs from a file (docs/worker-protocol.md, option `models`).
    let mut models = serde_json::Map::new();
    for arch in [Arch::Llama, Arch::LlamaHd64] {
        let path = crate::model::tiny::try_arch_model_path(arch)
            .map_err(|e| Error::harness(format!("the tiny {} model: {e}", arch.name())))?;
        models.insert(arch.name().into(), path.to_string_lossy().into_owned().into());
    }
    cmd.options = serde_json::json!({ "models": models });
    // One thread: trials run one per worker, workers one per core (as llama.cpp's).
    cmd.env.push(("OMP_NUM_THREADS".into(), "1".into()));
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_parse_and_an_unknown_version_names_the_known() {
        let p = MlxPin::parse("mlx-lm@0.32.2").unwrap();
        assert_eq!((p.mlx_lm.as_str(), p.mlx.as_str()), ("0.32.2", "0.32.4"));
        assert_eq!(p.label(), "mlx-lm@0.32.2");
        let e = MlxPin::parse("mlx-lm@9.9.9").unwrap_err().to_string();
        assert!(e.contains("mlx-lm@0.32.2") && e.contains("9.9.9"), "{e}");
    }
}
