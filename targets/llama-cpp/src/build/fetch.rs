//! Where a pin's llama.cpp sources come from, and how the recipe finds files in them.
//!
//! Sources come from cargo itself: a throwaway manifest that depends on
//! `llama-cpp-sys-2 = "=VERSION"`, `cargo fetch`, then
//! `$CARGO_HOME/registry/src/*/llama-cpp-sys-2-VERSION/llama.cpp`. A user-given tree
//! (`--llama-src DIR`) replaces that step; it is resolved first, so a symlink loop or an
//! unreadable directory is one line naming it. Globbing never follows a symlink to a directory
//! (as cmake's `GLOB_RECURSE` does not), so a link back up the tree cannot make it loop.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use super::cmake::CMAKE_FILES;
use super::recipe::{glob_sources, Recipe};
use super::stamps::HashStamps;
use crate::error::{IoContext as _, LlamaError};
use crate::pins::PinInfo;

/// Cargo's home: `$CARGO_HOME`, else `$HOME/.cargo`.
pub fn cargo_home() -> Result<PathBuf, LlamaError> {
    if let Some(dir) = non_empty_env("CARGO_HOME") {
        return Ok(PathBuf::from(dir));
    }
    match non_empty_env("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".cargo")),
        None => Err(LlamaError::Host {
            message: "cannot find cargo's home: set CARGO_HOME or HOME".into(),
        }),
    }
}

/// An environment variable, unless unset or empty.
pub(super) fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Finds the pin's unpacked crate in cargo's registry, running `cargo fetch` on a throwaway
/// manifest first when it is not there.
pub fn locate_or_fetch(
    info: &PinInfo,
    cache: &Path,
    progress: bool,
) -> Result<PathBuf, LlamaError> {
    let home = cargo_home()?;
    if let Some(tree) = find_in_registry(&home, info)? {
        return Ok(tree);
    }
    let dir = cache
        .join("llama.cpp")
        .join("fetch")
        .join(format!("{}-{}", info.crate_name, info.version));
    fs::create_dir_all(dir.join("src")).context_io(|| format!("creating {}", dir.display()))?;
    let manifest = format!(
        "# Written by kvaudit to make cargo download {name} {version}; safe to delete.\n\
         [package]\nname = \"kvaudit-fetch\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
         [dependencies]\n{name} = \"={version}\"\n\n[workspace]\n",
        name = info.crate_name,
        version = info.version
    );
    for (file, text) in [("Cargo.toml", manifest.as_str()), ("src/lib.rs", "")] {
        let path = dir.join(file);
        fs::write(&path, text).context_io(|| format!("writing {}", path.display()))?;
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    if progress {
        eprintln!(
            "fetching {} {} with cargo ...",
            info.crate_name, info.version
        );
    }
    let output = Command::new(&cargo)
        .arg("fetch")
        .arg("--manifest-path")
        .arg(dir.join("Cargo.toml"))
        .env("CARGO_HOME", &home)
        .output()
        .context_io(|| format!("running {} fetch", Path::new(&cargo).display()))?;
    let failed = |message: String| LlamaError::Fetch {
        crate_name: info.crate_name.clone(),
        version: info.version.clone(),
        message,
    };
    if !output.status.success() {
        return Err(failed(format!(
            "failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    match find_in_registry(&home, info)? {
        Some(tree) => Ok(tree),
        None => Err(failed(format!(
            "succeeded but {}/registry/src/*/{}-{}/llama.cpp does not exist",
            home.display(),
            info.crate_name,
            info.version
        ))),
    }
}

pub(super) fn find_in_registry(
    cargo_home: &Path,
    info: &PinInfo,
) -> Result<Option<PathBuf>, LlamaError> {
    let registry = cargo_home.join("registry").join("src");
    let Ok(read) = fs::read_dir(&registry) else {
        return Ok(None);
    };
    let mut found: Vec<PathBuf> = read
        .filter_map(|e| e.ok())
        .map(|e| {
            e.path()
                .join(format!("{}-{}", info.crate_name, info.version))
                .join("llama.cpp")
        })
        .filter(|p| p.join("include/llama.h").is_file())
        .collect();
    // Prefer the crates.io sparse index directory when there are several registries.
    found.sort_by_key(|p| !p.to_string_lossy().contains("index.crates.io"));
    Ok(found.into_iter().next())
}

/// Paths and contents of every compiled source and every header and CMake file next to them:
/// an edit changes the key, a `touch` does not.
/// Each file's hash is the one `hashes` recorded while the file is unchanged (`stamps`).
pub(super) fn tree_fingerprint(
    src: &Path,
    recipe: &Recipe,
    hashes: &mut HashStamps,
) -> Result<String, LlamaError> {
    let mut files: BTreeSet<String> = recipe
        .units
        .iter()
        .flat_map(|u| u.sources.iter().cloned())
        .collect();
    files.extend(CMAKE_FILES.iter().map(|s| s.to_string()));
    let headers = ["h", "hpp", "inc"];
    for (dir, recursive) in [
        ("include", true),
        ("ggml/include", true),
        ("src", true),
        ("ggml/src", false),
        ("ggml/src/ggml-cpu", true),
    ] {
        if src.join(dir).is_dir() {
            files.extend(glob_sources(src, dir, recursive, &headers, &[])?);
        }
    }
    let mut h = Sha256::new();
    for rel in &files {
        let content = hashes.of(&src.join(rel))?;
        h.update(format!("{rel}\0{content}\n"));
    }
    Ok(crate::files::hex(&h.finalize()))
}
