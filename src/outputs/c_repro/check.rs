//! Compiling a generated program against a llama.cpp pin and running it: what `kvaudit repro
//! --check` and `kvaudit report-bug` say about a program, in one place.

use std::path::Path;

use crate::base::error::Error;
use crate::base::files::private_temp_dir;
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

/// Checks that the C and C++ compilers a reproducer check runs (`CC` and `CXX`, else `cc` and
/// `c++`, as the `cc` crate picks them) answer `--version`: a job that checks reproducers at
/// its end asks before its first trial.
pub fn check_compilers() -> Result<(), Error> {
    for (var, default) in [("CC", "cc"), ("CXX", "c++")] {
        let chosen = std::env::var(var).ok().filter(|v| !v.trim().is_empty());
        let command = chosen.as_deref().unwrap_or(default);
        let program = command.split_whitespace().next().unwrap_or(default);
        let answered = std::process::Command::new(program)
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        match answered {
            Ok(status) if status.success() => {}
            Ok(status) => {
                return Err(Error::harness(format!(
                    "the reproducer checks need a C compiler: `{program} --version` exited with {status} (set {var})"
                )))
            }
            Err(e) => {
                return Err(Error::harness(format!(
                    "the reproducer checks need a C compiler: `{program} --version`: {e} (set {var})"
                )))
            }
        }
    }
    Ok(())
}

/// Builds `label`'s pin if needed, compiles `program` against it in a fresh private folder and
/// runs it with `model`.
pub fn compile_and_run(program: &str, label: &str, model: &Path) -> Result<ProgramRun, Error> {
    let pin = Pin::parse(label).map_err(|e| Error::input(format!("{e:#}")))?;
    let built = ensure_built(&BuildSpec::new(pin), true)
        .map_err(|e| Error::harness(format!("building {label}: {e:#}")))?;
    let dir = private_temp_dir("repro")?;
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
