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
use crate::base::error::Error;
use crate::base::op::Arch;
use crate::base::op_kind::OpKind;
use crate::isolation::jsonl::WorkerCommand;
use crate::targets::python::{python3, python_command, worker_file};

/// The target name's prefix.
pub const PREFIX: &str = "mlx-lm@";

/// The worker's source.
const WORKER_SOURCE: &str = include_str!("../../workers/mlx_worker.py");

/// The module of the models the worker runs (`import mlx_models`).
const MODELS_SOURCE: &str = include_str!("../../workers/mlx_models.py");

/// Each mlx-lm version kvaudit runs, with the `mlx[cpu]` version it is installed with (each pair
/// installed and imported on this machine kind: docs/mlx-lm.md). The first is the default.
pub const PINS: [(&str, &str); 3] = [
    ("0.32.2", "0.32.4"),
    ("0.30.7", "0.30.6"),
    ("0.28.4", "0.29.4"),
];

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
            Error::input(format!(
                "'{name}' is not an mlx-lm target ({PREFIX}VERSION)"
            ))
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
        [
            format!("mlx[cpu]=={}", self.mlx),
            format!("mlx-lm=={}", self.mlx_lm),
        ]
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
        let hash: String = h.finalize()[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
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
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .args(self.requirements()),
        )
        .map_err(|e| Error::harness(format!("installing {}: {}", self.label(), e.message)))?;
        std::fs::rename(&building, &dir)
            .map_err(|e| Error::harness(format!("{}: {e}", dir.display())))?;
        Ok(py)
    }
}

/// A configuration of mlx-lm's caches that a hunt runs (`engines::hunt::plan`): an entry on
/// the `seed` preset under `config`, one on the `state` preset (saves and loads: every class
/// has `save_prompt_cache`/`load_prompt_cache`), and, with `versus`, the entry against itself
/// under that configuration (`config-differential`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HuntConfiguration {
    /// The entry's id.
    pub id: &'static str,
    /// Its settings, as `--config` takes them (`engine.KEY=VALUE`, `arch=...`).
    pub config: &'static str,
    /// What it exercises.
    pub why: &'static str,
    /// Its sequences start as copies of one another, and one token goes into both at once:
    /// the batch caches' merge, batched decode and extract (`engine.batch=true`).
    pub shared: bool,
    /// The configuration it is paired with, if any.
    pub versus: Option<&'static str>,
}

/// mlx-lm's cache classes as a hunt runs them, one per class and setting the worker accepts
/// (`workers/mlx_worker.py`, `ENGINE_KEYS`). The rings are 8 rows: the setup's 7 tokens leave
/// one free, so a trim applies and the next decodes wrap. The windowed model's window is
/// kvaudit's gemma2 window (4, `Arch::swa_window`), which swa-window judges by; so is llama4's
/// chunk, whose chunked layers kvaudit judges as gemma2's windowed one.
pub const HUNT_CONFIGURATIONS: [HuntConfiguration; 11] = [
    HuntConfiguration {
        id: "kvcache",
        config: "engine.cache=plain",
        why: "KVCache: the plain cache, grown in steps of 256 rows, trimmed by its offset",
        shared: false,
        versus: None,
    },
    HuntConfiguration {
        id: "rotating",
        config: "engine.cache=rotating,engine.max_size=8",
        why: "RotatingKVCache(8, keep 0) on every layer: a ring that wraps",
        shared: false,
        versus: None,
    },
    HuntConfiguration {
        id: "rotating-keep2",
        config: "engine.cache=rotating,engine.max_size=8,engine.keep=2",
        why: "RotatingKVCache(8, keep 2): a ring that keeps its first 2 positions",
        shared: false,
        versus: None,
    },
    HuntConfiguration {
        id: "chunked",
        config: "engine.cache=chunked,engine.chunk_size=4",
        why: "ChunkedKVCache(4): a cache whose front is trimmed to the last chunk",
        shared: false,
        versus: None,
    },
    HuntConfiguration {
        id: "concatenate",
        config: "engine.cache=concatenate",
        why: "ConcatenateKVCache: rows concatenated per update, trimmable since 0.28",
        shared: false,
        versus: None,
    },
    HuntConfiguration {
        id: "quantized8",
        config: "engine.cache=quantized,engine.bits=8,engine.group_size=32",
        why: "QuantizedKVCache(8 bits, group 32) on heads 64 wide",
        shared: false,
        versus: None,
    },
    HuntConfiguration {
        id: "quantized4",
        config: "engine.cache=quantized,engine.bits=4,engine.group_size=32",
        why: "QuantizedKVCache(4 bits, group 32) on heads 64 wide",
        shared: false,
        versus: None,
    },
    HuntConfiguration {
        id: "batch",
        config: "engine.cache=plain,engine.batch=true",
        why: "KVCache rows merged into a BatchKVCache, decoded together, filtered and extracted",
        shared: true,
        versus: Some("engine.batch=false"),
    },
    HuntConfiguration {
        id: "batch-rotating",
        config: "engine.cache=rotating,engine.max_size=8,engine.keep=2,engine.batch=true",
        why: "RotatingKVCache(8, keep 2) rows merged into a BatchRotatingKVCache",
        shared: true,
        versus: Some("engine.batch=false"),
    },
    HuntConfiguration {
        id: "gemma2",
        config: "arch=gemma2,engine.window=4",
        why: "a model with a windowed layer (RotatingKVCache(4)) beside a full one (KVCache)",
        shared: false,
        versus: None,
    },
    HuntConfiguration {
        id: "llama4",
        config: "arch=gemma2,engine.model=llama4,engine.chunk_size=4",
        why: "mlx-lm's llama4 and its own make_cache: ChunkedKVCache(4) layers front-trimmed before each forward beside a global KVCache",
        shared: false,
        versus: None,
    },
];

/// The op kinds the worker declares it lacks (`LACKS` in `workers/mlx_worker.py`: no position
/// shift in mlx-lm's caches). A hunt's domains leave them out, so that its estimates count
/// the ops that run.
pub const LACKS: [OpKind; 2] = [OpKind::SeqAdd, OpKind::SeqDiv];

/// What the worker of target `name` observes beyond the sequences, as its `hello` declares it
/// (`capabilities()` in `workers/mlx_worker.py`) and the JSON-lines protocol carries it: the
/// sequences before each op, the logits probe, and the round trip where a never-written cache
/// saves and loads back (0.32 on: `Api.empty_save`); never a whole-state dump's cells, the
/// dumps' sizes or the reload probe. `tests/it/workers.rs` checks it against the hello.
pub fn declared_observations(name: &str) -> Result<Observe, Error> {
    let pin = MlxPin::parse(name)?;
    let version: Vec<u32> = pin
        .mlx_lm
        .split('.')
        .map(|p| p.parse().unwrap_or(0))
        .collect();
    Ok(Observe {
        before: true,
        round_trip: version.as_slice() >= [0, 32].as_slice(),
        logits: true,
        ..Observe::BASIC
    })
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
        return Err(Error::harness(format!(
            "{cmd:?} failed ({}): {tail}",
            out.status
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// The command that runs the worker of target `name` with `faults`, observing `observe`, its
/// environment made first when it is not.
pub fn worker_command(
    name: &str,
    faults: &[String],
    observe: Observe,
) -> Result<WorkerCommand, Error> {
    let pin = MlxPin::parse(name)?;
    let python = pin.ensure_built()?;
    let script = worker_file("mlx_worker.py", WORKER_SOURCE)?;
    // The models' module in a folder of its own content's hash, on the worker's import path.
    let models = worker_file("mlx_models.py", MODELS_SOURCE)?;
    let mut cmd = python_command(&pin.label(), &python, &script, faults, observe);
    if let Some(dir) = models.parent() {
        cmd.env
            .push(("PYTHONPATH".into(), dir.as_os_str().to_owned()));
    }
    // One model for both engines: the GGUF files kvaudit's llama.cpp targets load, for the
    // architectures the worker runs from a file (docs/worker-protocol.md, option `models`).
    let mut models = serde_json::Map::new();
    for arch in [Arch::Llama, Arch::LlamaHd64] {
        let path = crate::model::tiny::try_arch_model_path(arch)
            .map_err(|e| Error::harness(format!("the tiny {} model: {e}", arch.name())))?;
        models.insert(
            arch.name().into(),
            path.to_string_lossy().into_owned().into(),
        );
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
