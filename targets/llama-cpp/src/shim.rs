//! The C shim as both sides of it know it: the sources compiled into every build, the ABI number
//! the loader expects, and what a finished build of one pin is ([`BuiltShim`], with its
//! [`BuildManifest`]).
//!
//! [`super::build`] produces these and [`super::ffi`] consumes them; this module sits below both
//! so that neither imports the other.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::pins::{Pin, Variant};

/// `KVAUDIT_SHIM_ABI` the loader is written against (checked against the header in a test, and
/// recorded in every build's manifest).
pub const SHIM_ABI: u32 = 5;

/// `targets/llama-cpp/shim/kvaudit_shim.h`, as compiled into this binary.
pub const SHIM_HEADER: &str = include_str!("../shim/kvaudit_shim.h");
/// `targets/llama-cpp/shim/kvaudit_shim.c`, as compiled into this binary.
pub const SHIM_SOURCE: &str = include_str!("../shim/kvaudit_shim.c");

/// A built pin: the shared object to load, and what a C program needs to link against the
/// same pin.
#[derive(Debug, Clone)]
pub struct BuiltShim {
    /// The pin and variant.
    pub pin: Pin,
    /// The cache entry directory.
    pub dir: PathBuf,
    /// `libkvaudit_shim.so`: load it with [`super::ffi::LlamaShim::load_built`].
    pub so_path: PathBuf,
    /// A copy of the pin's `include/*.h` and `ggml/include/*.h` (llama.h, ggml.h, ...).
    pub include_dir: PathBuf,
    /// `libllama_all.a`: every llama + ggml object of this build (not the shim).
    pub static_lib: PathBuf,
    /// What `manifest.json` records.
    pub manifest: BuildManifest,
    /// True when this call compiled the entry, false when it came from the cache.
    pub fresh: bool,
}

/// The contents of `manifest.json` in a cache entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildManifest {
    /// The pin label, e.g. `llama.cpp@0.1.156+assert`.
    pub pin: String,
    /// The `llama-cpp-sys-2` version.
    pub version: String,
    /// Release or assert.
    pub variant: Variant,
    /// The cache key (sha256, hex).
    pub key: String,
    /// Version of the build recipe.
    pub recipe_version: u32,
    /// `KVAUDIT_SHIM_ABI` of the shim source.
    pub shim_abi: u32,
    /// The llama.cpp tree that was compiled.
    pub source_dir: PathBuf,
    /// `LLAMA_VERSION` as compiled (from the tree's CMakeLists.txt).
    pub llama_version: String,
    /// `GGML_VERSION` as compiled (from the tree's ggml/CMakeLists.txt).
    pub ggml_version: String,
    /// `--version` of the C and C++ compilers.
    pub compiler_version: String,
    /// One entry per compile unit: its full command line (without the per-file part).
    pub units: Vec<UnitRecord>,
    /// The link command line (objects elided).
    pub link_command: Vec<String>,
    /// CMake define names neither passed nor known to be irrelevant (see the warning).
    pub unknown_cmake_defines: Vec<String>,
    /// Build start and end, seconds since the Unix epoch.
    pub started_unix: u64,
    /// Build end, seconds since the Unix epoch.
    pub finished_unix: u64,
    /// Wall time of the build in seconds.
    pub build_seconds: f64,
    /// sha256 of `libkvaudit_shim.so`.
    pub so_sha256: String,
    /// sha256 of `libllama_all.a`.
    pub static_lib_sha256: String,
    /// The objects it was linked from, as paths in the object cache (`kvaudit target gc` keeps
    /// these while the entry exists). Empty in entries built before the object cache.
    #[serde(default)]
    pub objects: Vec<String>,
    /// How many sources this build compiled; the other objects came from the object cache.
    #[serde(default)]
    pub compiled: usize,
    /// The fixes applied to the sources (`+fix:NAME`): (name, sha256 of the patch). Absent
    /// from the manifests of builds without fixes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fixes: Vec<(String, String)>,
}

/// One compile unit as recorded in the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnitRecord {
    /// Group and language, e.g. `ggml-cpu.c++`.
    pub name: String,
    /// Number of source files.
    pub n_sources: usize,
    /// Compiler and arguments as `cc` runs them (the source and object paths follow).
    pub command: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shim_abi_matches_the_header() {
        let line = SHIM_HEADER
            .lines()
            .find(|l| l.starts_with("#define KVAUDIT_SHIM_ABI "))
            .expect("KVAUDIT_SHIM_ABI in kvaudit_shim.h");
        let n: u32 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
        assert_eq!(n, SHIM_ABI);
    }
}
