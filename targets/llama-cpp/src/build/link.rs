//! Linking: `libllama_all.a` (every llama.cpp and ggml object, for standalone C reproducers) and
//! `libkvaudit_shim.so`, one `c++ -shared` of every object plus the shim with an export map that
//! leaves only `kvaudit_shim_*` visible. That is what lets two pins load into one process.
//! Also the link of a C program against a built pin ([`BuiltShim::compile_c_program`]).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::cache::verify_file;
use super::toolchain::{base_build, find_compiler};
use crate::error::{IoContext as _, LlamaError};
use crate::pins::Variant;
use crate::shim::BuiltShim;

/// Archives `objects` into `static_lib` with the archiver `cc` picks.
pub(super) fn archive(
    objects: &[PathBuf],
    static_lib: &Path,
    scratch: &Path,
) -> Result<(), LlamaError> {
    let mut ar = base_build(scratch)
        .try_get_archiver()
        .map_err(|e| LlamaError::Compile {
            what: "finding an archiver with the cc crate".into(),
            message: e.to_string(),
        })?;
    ar.arg("crs").arg(static_lib).args(objects);
    run_checked(&mut ar, "archiving libllama_all.a")
}

/// Links the shared object `so` with `cxx` and `flags` (from [`link_flags`]), then checks its
/// exports.
pub(super) fn link_shared(
    cxx: &Path,
    flags: &[String],
    so: &Path,
    llama_objects: &[PathBuf],
    shim_objects: &[PathBuf],
) -> Result<(), LlamaError> {
    let mut link = Command::new(cxx);
    link.args(flags)
        .arg("-o")
        .arg(so)
        .args(llama_objects)
        .args(shim_objects)
        .args(["-lpthread", "-lm"]);
    run_checked(&mut link, "linking libkvaudit_shim.so")?;
    check_exports(so)
}

/// Runs `cmd`; a failure to start or a non-zero exit is an error with everything it printed.
fn run_checked(cmd: &mut Command, what: &str) -> Result<(), LlamaError> {
    let out = cmd
        .output()
        .context_io(|| format!("{what}: starting {:?}", cmd.get_program()))?;
    if !out.status.success() {
        return Err(LlamaError::Command {
            what: what.to_string(),
            status: out.status.to_string(),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(())
}

/// Fails when the shared object exports anything but `kvaudit_shim_*` (checked with `nm`; a
/// missing `nm` only skips the check).
fn check_exports(so: &Path) -> Result<(), LlamaError> {
    let Ok(out) = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(so)
        .output()
    else {
        eprintln!(
            "warning: nm not found; not checking the exports of {}",
            so.display()
        );
        return Ok(());
    };
    if !out.status.success() {
        return Err(LlamaError::Command {
            what: format!("nm -D {}", so.display()),
            status: out.status.to_string(),
            output: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let foreign: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|s| !s.starts_with("kvaudit_shim_"))
        .collect();
    if !foreign.is_empty() {
        return Err(LlamaError::Compile {
            what: format!("linking {}", so.display()),
            message: format!(
                "it exports symbols besides kvaudit_shim_*: {}",
                foreign.join(", ")
            ),
        });
    }
    Ok(())
}

impl BuiltShim {
    /// Compiles and links a standalone C program against this build (llama.h from
    /// [`BuiltShim::include_dir`], objects from [`BuiltShim::static_lib`], which is checked
    /// against the sha256 the manifest records first), with the build's NDEBUG choice. Used for C
    /// reproducers of findings.
    pub fn compile_c_program(&self, source: &Path, output: &Path) -> Result<(), LlamaError> {
        verify_file(
            &self.static_lib,
            &self.manifest.static_lib_sha256,
            &self.dir,
            &self.pin.label(),
        )?;
        let scratch = self.dir.join("probe");
        fs::create_dir_all(&scratch).context_io(|| format!("creating {}", scratch.display()))?;
        let (cc_path, cxx_path) = (
            find_compiler(&scratch, false)?,
            find_compiler(&scratch, true)?,
        );
        let object = output.with_extension("o");
        let mut compile = Command::new(&cc_path);
        compile
            .args(["-std=gnu11", "-O2", "-Wall"])
            .arg("-I")
            .arg(&self.include_dir);
        if self.pin.variant == Variant::Release {
            compile.arg("-DNDEBUG");
        }
        compile.arg("-c").arg(source).arg("-o").arg(&object);
        run_checked(&mut compile, &format!("compiling {}", source.display()))?;
        let mut link = Command::new(&cxx_path);
        link.arg(&object)
            .arg(&self.static_lib)
            .args(["-lpthread", "-lm", "-o"])
            .arg(output);
        run_checked(&mut link, &format!("linking {}", output.display()))?;
        fs::remove_file(&object).ok();
        Ok(())
    }
}
