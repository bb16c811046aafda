//! The host and its compilers: the one target triple the recipe is written for, the CPU
//! features its flags need, the C and C++ compilers the `cc` crate picks (honouring `CC`, `CXX`,
//! `CFLAGS`, ...), their versions, and the environment that changes what `cc` runs (all of it
//! goes into the cache key).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use super::recipe::X86_CPU_FLAGS;
use crate::error::{IoContext as _, LlamaError};

/// The only host the recipe's flags are right for (x86-64 AVX2 CPU backend, ELF link flags).
pub(super) const TRIPLE: &str = "x86_64-unknown-linux-gnu";

/// Fails unless this is x86-64 Linux (gnu) with the CPU features of the recipe's flags.
pub(super) fn check_host() -> Result<(), LlamaError> {
    if !cfg!(all(
        target_arch = "x86_64",
        target_os = "linux",
        target_env = "gnu"
    )) {
        return Err(LlamaError::Host {
            message: format!("building llama.cpp pins is only supported on x86_64 Linux (gnu); the recipe's CPU flags and link flags are for {TRIPLE}"),
        });
    }
    #[cfg(target_arch = "x86_64")]
    {
        let missing: Vec<&str> = [
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
            ("f16c", std::arch::is_x86_feature_detected!("f16c")),
            ("bmi2", std::arch::is_x86_feature_detected!("bmi2")),
            ("sse4.2", std::arch::is_x86_feature_detected!("sse4.2")),
        ]
        .into_iter()
        .filter(|(_, has)| !has)
        .map(|(name, _)| name)
        .collect();
        if !missing.is_empty() {
            return Err(LlamaError::Host {
                message: format!(
                    "this CPU lacks {}: the ggml CPU backend is compiled with {} and would die of SIGILL",
                    missing.join(", "),
                    X86_CPU_FLAGS.join(" ")
                ),
            });
        }
    }
    Ok(())
}

/// The compilers `cc` picks (honouring `CC`, `CXX`, `CFLAGS`, ...), and their versions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Toolchain {
    pub(super) c: PathBuf,
    pub(super) cxx: PathBuf,
    pub(super) version: String,
    /// The environment variables `cc` reads for this target, as set now.
    env: BTreeMap<String, String>,
}

impl Toolchain {
    /// The compilers `cc` picks now (probing in `cache`).
    pub(super) fn detect(cache: &Path) -> Result<Toolchain, LlamaError> {
        let probe_dir = cache.join("llama.cpp").join("probe");
        fs::create_dir_all(&probe_dir)
            .context_io(|| format!("creating {}", probe_dir.display()))?;
        let c = find_compiler(&probe_dir, false)?;
        let cxx = find_compiler(&probe_dir, true)?;
        let mut version = String::new();
        for compiler in [&c, &cxx] {
            let out = Command::new(compiler)
                .arg("--version")
                .output()
                .context_io(|| format!("running {} --version", compiler.display()))?;
            version.push_str(
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .next()
                    .unwrap_or("?"),
            );
            version.push('\n');
        }
        Ok(Toolchain {
            c,
            cxx,
            version: version.trim_end().to_string(),
            env: cc_env_snapshot(),
        })
    }
}

/// The environment variables that change what `cc` runs for [`TRIPLE`].
pub(super) fn cc_env_snapshot() -> BTreeMap<String, String> {
    let bases = [
        "CC",
        "CXX",
        "CFLAGS",
        "CXXFLAGS",
        "AR",
        "ARFLAGS",
        "CXXSTDLIB",
    ];
    let mut names: Vec<String> = vec![
        "CRATE_CC_NO_DEFAULTS".into(),
        "CC_SHELL_ESCAPED_FLAGS".into(),
        "CC_FORCE_DISABLE".into(),
    ];
    for b in bases {
        names.push(b.to_string());
        names.push(format!("HOST_{b}"));
        names.push(format!("TARGET_{b}"));
        names.push(format!("{b}_{TRIPLE}"));
        names.push(format!("{b}_{}", TRIPLE.replace('-', "_")));
    }
    names
        .into_iter()
        .filter_map(|n| std::env::var(&n).ok().map(|v| (n, v)))
        .collect()
}

/// A `cc` build for [`TRIPLE`] with the recipe's common settings, writing into `out_dir`.
pub(super) fn base_build(out_dir: &Path) -> cc::Build {
    let mut b = cc::Build::new();
    b.target(TRIPLE)
        .host(TRIPLE)
        .opt_level(3)
        .debug(false)
        .out_dir(out_dir)
        .cargo_metadata(false)
        .cargo_warnings(false)
        .cargo_debug(false)
        .warnings(false)
        .extra_warnings(false)
        .pic(true);
    b
}

/// The C (or, with `cpp`, C++) compiler `cc` picks, probing in `scratch`.
pub(super) fn find_compiler(scratch: &Path, cpp: bool) -> Result<PathBuf, LlamaError> {
    let mut b = base_build(scratch);
    b.cpp(cpp);
    Ok(b.try_get_compiler()
        .map_err(|e| LlamaError::Compile {
            what: "finding a C/C++ compiler with the cc crate".into(),
            message: e.to_string(),
        })?
        .path()
        .to_path_buf())
}
