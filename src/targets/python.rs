//! Targets whose worker is a Python program speaking the JSON-lines protocol
//! (docs/worker-protocol.md): `python-ref`, the reference worker (`workers/python_ref.py`,
//! standard library only: a model KV cell cache that proves the protocol and carries injected
//! faults as positive controls).
//!
//! A worker's source is built into kvaudit and written to the cache folder under a hash of its
//! bytes on first use, so a target runs from any folder and a changed worker is a new file.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::base::cache::Observe;
use crate::base::error::Error;
use crate::base::op_kind::OpKind;
use crate::isolation::jsonl::WorkerCommand;

/// The reference worker's target name.
pub const REFERENCE: &str = "python-ref";

/// The reference worker's source.
const REFERENCE_SOURCE: &str = include_str!("../../workers/python_ref.py");

/// How long one trial of a Python worker may take before it counts as a hang.
pub const TRIAL_TIMEOUT: Duration = Duration::from_secs(20);

/// The interpreter: `$KVAUDIT_PYTHON`, else `python3` on the PATH; an error that says what to
/// install when there is none.
pub fn python3() -> Result<PathBuf, Error> {
    if let Some(p) = std::env::var_os("KVAUDIT_PYTHON").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(Error::input(format!(
                "KVAUDIT_PYTHON={}: no such file",
                p.display()
            )))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("python3"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::input(
                "python3 is not on the PATH: a Python target needs Python 3.9 or later \
                 (Debian: apt-get install python3 python3-venv), or set KVAUDIT_PYTHON",
            )
        })
}

/// `source` written as `name` in the cache folder under a hash of its bytes (left as it is
/// when already there).
pub fn worker_file(name: &str, source: &str) -> Result<PathBuf, Error> {
    let digest = Sha256::digest(source.as_bytes());
    let hash: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let path = crate::model::tiny::cache_dir()
        .join("workers")
        .join(hash)
        .join(name);
    if std::fs::read(&path).ok().as_deref() != Some(source.as_bytes()) {
        crate::base::files::write_atomically(&path, source.as_bytes()).map_err(|e| {
            Error::harness(format!("cannot write the worker {}: {e}", path.display()))
        })?;
    }
    Ok(path)
}

/// What the reference worker observes beyond the sequences, as its `hello` declares it
/// (`CAPABILITIES` in `workers/python_ref.py`): the sequences before each op, the whole dump's
/// cells and the round trip; no logits, dump sizes or reload probe.
/// `workers::python_ref_declared_observations` checks it against the hello.
pub const REFERENCE_OBSERVES: Observe = Observe {
    before: true,
    whole: true,
    round_trip: true,
    ..Observe::BASIC
};

/// The op kinds the reference worker declares it lacks (its hello's `lacks`).
pub const REFERENCE_LACKS: [OpKind; 1] = [OpKind::SeqDiv];

/// The entries of llama.cpp's hunt plan (`engines::hunt::plan`) the reference worker's hunt
/// runs: its cache is one unified attention cache of `n_ctx` cells (`parse_setup` in
/// `workers/python_ref.py` refuses every other architecture, one stream per sequence, a
/// windowed cache, recurrent states, embedding inputs and foreign dumps) that ignores cache
/// types, flash attention and batch sizes, so the entries and pairs that change only those
/// (`flash`, `quant`, `state+flash`, `long-ubatch`, `seed~flash_attn=on`, ...) would run `seed`
/// again, and `flags` adds only saves it refuses (ON_DEVICE). Each runs beside the native
/// model, which models the same cache.
pub const REFERENCE_HUNT_ENTRIES: [&str; 7] = [
    "seed",
    "wide",
    "state",
    "batch",
    "full",
    "seqids",
    "fragmented",
];

/// The command that runs the reference worker with `faults`, observing `observe`.
pub fn reference_command(faults: &[String], observe: Observe) -> Result<WorkerCommand, Error> {
    let script = worker_file("python_ref.py", REFERENCE_SOURCE)?;
    Ok(python_command(
        REFERENCE,
        &python3()?,
        &script,
        faults,
        observe,
    ))
}

/// A worker command running `script` with `python`.
pub fn python_command(
    name: &str,
    python: &Path,
    script: &Path,
    faults: &[String],
    observe: Observe,
) -> WorkerCommand {
    WorkerCommand {
        name: name.to_string(),
        program: python.to_path_buf(),
        // -u: unbuffered, so that what it printed last reaches a crash finding.
        args: vec![OsString::from("-u"), script.as_os_str().to_os_string()],
        env: vec![(
            OsString::from("PYTHONDONTWRITEBYTECODE"),
            OsString::from("1"),
        )],
        faults: faults.to_vec(),
        timeout: TRIAL_TIMEOUT,
        start_timeout: Duration::from_secs(60),
        observe,
        options: serde_json::json!({}),
    }
}
