//! Compiling a generated program against a llama.cpp pin and running it: what `kvaudit repro
//! --check` and `kvaudit report-bug` say about a program, in one place.

use std::path::Path;

use crate::base::error::Error;
use crate::targets::llama::build::{ensure_built, BuildSpec};
use crate::targets::llama::pins::Pin;

/// How a program ended on a pin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramRun {
    /// Its exit code, if it exited.
    pub code: Option<i32>,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
    /// What it printed.
    pub stdout: String,
    /// What it printed on stderr.
    pub stderr: String,
}

impl ProgramRun {
    /// The exit status as a shell reports it: the code, or 128 + the signal.
    pub fn shell_status(&self) -> i32 {
        self.code.or(self.signal.map(|s| 128 + s)).unwrap_or(-1)
    }
}

/// Builds `label`'s pin if needed, compiles `program` against it in a fresh private folder and
/// runs it with `model`.
pub fn compile_and_run(program: &str, label: &str, model: &Path) -> Result<ProgramRun, Error> {
    let pin = Pin::parse(label).map_err(|e| Error::input(format!("{e:#}")))?;
    let built = ensure_built(&BuildSpec::new(pin), true)
        .map_err(|e| Error::harness(format!("building {label}: {e:#}")))?;
    let dir = private_dir()?;
    let src = dir.join("repro.c");
    let bin = dir.join("repro");
    let result = (|| {
        std::fs::write(&src, program)
            .map_err(|e| Error::harness(format!("{}: {e}", src.display())))?;
        built
            .compile_c_program(&src, &bin)
            .map_err(|e| Error::harness(format!("compiling the reproducer: {e:#}")))?;
        std::process::Command::new(&bin)
            .arg(model)
            .env("GGML_NO_BACKTRACE", "1")
            .output()
            .map_err(|e| Error::harness(format!("running {}: {e}", bin.display())))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let out = result?;
    use std::os::unix::process::ExitStatusExt;
    Ok(ProgramRun {
        code: out.status.code(),
        signal: out.status.signal(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// A fresh folder under the temporary directory, private to the user: `create` fails on one that
/// exists, so a folder or link planted under the predictable name is never written into; a name
/// taken (by such a plant, or by another thread of this process in the same clock tick: the
/// tests check reproducers in parallel) is passed over for the next one.
fn private_dir() -> Result<std::path::PathBuf, Error> {
    use std::os::unix::fs::DirBuilderExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut last = None;
    for _ in 0..16 {
        let dir = std::env::temp_dir().join(format!(
            "kvaudit-repro-{}-{nanos}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some((dir, e)),
            Err(e) => return Err(Error::harness(format!("{}: {e}", dir.display()))),
        }
    }
    let (dir, e) = last.expect("the loop ran");
    Err(Error::harness(format!(
        "{}: {e} (and 15 names after it)",
        dir.display()
    )))
}
