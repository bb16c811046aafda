//! Builds one llama.cpp pin into a cached `libkvaudit_shim.so`, without cmake.
//!
//! The recipe is LLAMA-FACTS "Building without cmake": three groups of sources found by glob
//! rules (ggml core, the ggml CPU backend, llama), compiled with the `cc` crate used as a library
//! at run time (`compile_intermediates` per group and language, all groups at once so both
//! cores stay busy), then one `c++ -shared` link of every object plus the shim
//! (`targets/llama.cpp/kvaudit_shim.c`, embedded in this binary) with an export map that
//! leaves only `kvaudit_shim_*` visible. That is what lets two pins load into one process.
//!
//! Sources come from cargo itself: a throwaway manifest that depends on
//! `llama-cpp-sys-2 = "=VERSION"`, `cargo fetch`, then
//! `$CARGO_HOME/registry/src/*/llama-cpp-sys-2-VERSION/llama.cpp`. A user-given tree
//! (`--llama-src DIR`) replaces that step.
//!
//! Cache: `$KVAUDIT_CACHE_DIR`, else `$XDG_CACHE_HOME/kvaudit`, else `~/.cache/kvaudit`; one
//! entry per key under `llama.cpp/VERSION-VARIANT-KEY/` holding `libkvaudit_shim.so`,
//! `libllama_all.a` (every llama + ggml object, to link standalone C reproducers against the
//! same pin), `include/` (the pin's llama.h and ggml headers) and `manifest.json`. The key
//! hashes everything that changes the output: pin, variant, recipe (sources, defines, flags),
//! shim text, compiler identity and version, the environment variables `cc` reads, and the
//! sources' paths, sizes and modification times. Entries are built in a temporary directory
//! and renamed into place, so a killed build never leaves a half entry behind.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::pins::{Pin, PinInfo, Variant};

/// `targets/llama.cpp/kvaudit_shim.h`, as compiled into this binary.
pub const SHIM_HEADER: &str = include_str!("../../../targets/llama.cpp/kvaudit_shim.h");
/// `targets/llama.cpp/kvaudit_shim.c`, as compiled into this binary.
pub const SHIM_SOURCE: &str = include_str!("../../../targets/llama.cpp/kvaudit_shim.c");

/// File name of the shared object in a cache entry.
pub const SO_NAME: &str = "libkvaudit_shim.so";
/// File name of the static archive of all llama + ggml objects in a cache entry.
pub const STATIC_LIB_NAME: &str = "libllama_all.a";
/// File name of the manifest in a cache entry.
pub const MANIFEST_NAME: &str = "manifest.json";

/// Bump when the recipe below changes in a way the key does not see.
const RECIPE_VERSION: u32 = 1;

/// The only host the recipe's flags are right for (x86-64 AVX2 CPU backend, ELF link flags).
const TRIPLE: &str = "x86_64-unknown-linux-gnu";

/// Flags of the ggml CPU backend group only: `-mfma` elsewhere would let the compiler contract
/// multiply-adds in ggml core and llama and change numerics (LLAMA-FACTS).
const X86_CPU_FLAGS: &[&str] = &["-msse4.2", "-mf16c", "-mfma", "-mbmi2", "-mavx", "-mavx2"];

/// Defines every ggml group gets (`add_compile_definitions` in ggml/src/CMakeLists.txt).
const GGML_DEFINES: &[&str] = &[
    "GGML_SCHED_MAX_COPIES=4",
    "_GNU_SOURCE",
    "_XOPEN_SOURCE=600",
];

/// Folders below `ggml/src/ggml-cpu/` that the CPU group leaves out: `arch/` (per-architecture
/// code; the x86 part is added back), `kleidiai/` (ARM, needs a download), `spacemit/` (RISC-V).
const CPU_SKIP_DIRS: &[&str] = &["arch", "kleidiai", "spacemit"];

/// Names in the pins' CMake `add_compile_definitions` / `target_compile_definitions` calls
/// that the recipe deliberately does not pass, with the reason. A name in a pin's CMake files
/// that is neither passed nor listed here gets a warning: a left-out define switches a feature
/// off silently.
const CMAKE_DEFINES_NOT_PASSED: &[(&str, &str)] = &[
    ("_CRT_SECURE_NO_WARNINGS", "Windows only"),
    (
        "_XOPEN_SOURCE=700",
        "OpenBSD value; Linux gets 600, which is passed",
    ),
    ("_GLIBCXX_ASSERTIONS", "cmake Debug configuration only"),
    ("HAVE_BUGGY_APPLE_LINKER", "macOS only"),
    ("_DARWIN_C_SOURCE", "macOS/iOS only"),
    ("__BSD_VISIBLE", "FreeBSD only"),
    ("_NETBSD_SOURCE", "NetBSD only"),
    ("_BSD_SOURCE", "OpenBSD only"),
    (
        "GGML_BACKEND_DL",
        "dynamically loaded backends; kvaudit links statically",
    ),
    (
        "GGML_BACKEND_BUILD",
        "only with GGML_BACKEND_DL or shared backends",
    ),
    ("GGML_BACKEND_SHARED", "only with shared backend libraries"),
    ("GGML_BACKEND_DIR", "only with GGML_BACKEND_DL"),
    ("GGML_SCHED_NO_REALLOC", "off by default"),
    (
        "GGML_USE_OPENMP",
        "OpenMP off: ggml's own thread pool, no libgomp in the shim",
    ),
    ("GGML_USE_ACCELERATE", "macOS only"),
    ("ACCELERATE_NEW_LAPACK", "macOS only"),
    ("ACCELERATE_LAPACK_ILP64", "macOS only"),
    ("GGML_USE_CPU_HBM", "off by default (needs memkind)"),
    ("GGML_USE_CPU_KLEIDIAI", "ARM only"),
    ("GGML_USE_CPU_RISCV64_SPACEMIT", "RISC-V only"),
    ("GGML_BUILD", "only for a shared libggml"),
    ("GGML_SHARED", "only for a shared libggml"),
    ("LLAMA_BUILD", "only for a shared libllama"),
    ("LLAMA_SHARED", "only for a shared libllama"),
];

/// What to build: a pin and variant, where its sources are, and where the cache is.
#[derive(Debug, Clone)]
pub struct BuildSpec {
    /// The pin and variant.
    pub pin: Pin,
    /// A user-given llama.cpp tree (the directory with `include/llama.h`, or a directory with a
    /// `llama.cpp/` subdirectory such as an unpacked `llama-cpp-sys-2` crate). `None`: fetch
    /// the pin's crate with cargo.
    pub llama_src: Option<PathBuf>,
    /// Rebuild even when a cache entry with the same key exists.
    pub force: bool,
    /// Cache root; `None`: [`cache_root`].
    pub cache_dir: Option<PathBuf>,
}

impl BuildSpec {
    /// A spec for `pin` with the pin's own sources and the default cache.
    pub fn new(pin: Pin) -> BuildSpec {
        BuildSpec {
            pin,
            llama_src: None,
            force: false,
            cache_dir: None,
        }
    }
}

/// A built pin: the shared object to load, and what a C program needs to link against the
/// same pin.
#[derive(Debug, Clone)]
pub struct BuiltShim {
    /// The pin and variant.
    pub pin: Pin,
    /// The cache entry directory.
    pub dir: PathBuf,
    /// `libkvaudit_shim.so`: load it with [`super::ffi::LlamaShim::load`].
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
    /// Version of this module's recipe.
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

/// Source language of a compile unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Lang {
    /// C, `-std=gnu11`.
    C,
    /// C++, `-std=gnu++17`.
    Cxx,
}

impl Lang {
    fn suffix(self) -> &'static str {
        match self {
            Lang::C => "c",
            Lang::Cxx => "c++",
        }
    }

    fn std(self) -> &'static str {
        match self {
            Lang::C => "gnu11",
            Lang::Cxx => "gnu++17",
        }
    }
}

/// Sources of one group in one language, and how to compile them. Paths in `includes` start
/// with a placeholder (`$SRC` the llama.cpp tree, `$GEN` the generated headers, `$SHIM` the
/// shim sources) so that the recipe, and the key hashed from it, do not depend on where
/// things are.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompileUnit {
    /// `ggml`, `ggml-cpu`, `llama` or `shim`.
    pub group: String,
    /// C or C++.
    pub lang: Lang,
    /// Source files relative to the llama.cpp tree (for the shim: relative to `$SHIM`).
    pub sources: Vec<String>,
    /// `NAME` or `NAME=VALUE`.
    pub defines: Vec<String>,
    /// Further compiler flags.
    pub flags: Vec<String>,
    /// Include directories with placeholders.
    pub includes: Vec<String>,
}

impl CompileUnit {
    /// `group.lang`, e.g. `ggml-cpu.c++`.
    pub fn name(&self) -> String {
        format!("{}.{}", self.group, self.lang.suffix())
    }
}

/// Everything that decides what is compiled for one tree and variant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recipe {
    /// `LLAMA_VERSION` as cmake would define it (e.g. `0.1.0-dev`).
    pub llama_version: String,
    /// `LLAMA_VERSION_MAJOR.MINOR.PATCH`.
    pub llama_version_base: String,
    /// `GGML_VERSION` (e.g. `0.19.0`).
    pub ggml_version: String,
    /// The llama.cpp and ggml compile units, in build order.
    pub units: Vec<CompileUnit>,
    /// The shim's compile unit.
    pub shim: CompileUnit,
    /// `ggml-version.h` contents.
    pub ggml_version_h: String,
    /// `llama-version.h` contents.
    pub llama_version_h: String,
}

// ---------------------------------------------------------------------------------------------
// Entry points

/// `kvaudit target build LABEL [--llama-src DIR] [--force]`: builds (or finds in the cache) the
/// shim for `label` with a progress display, and prints where it is.
pub fn build_command(label: &str, llama_src: Option<&Path>, force: bool) -> Result<BuiltShim> {
    let pin = Pin::parse(label)?;
    let spec = BuildSpec {
        pin,
        llama_src: llama_src.map(Path::to_path_buf),
        force,
        cache_dir: None,
    };
    let built = ensure_built(&spec, true)?;
    eprintln!(
        "{}: {} ({})",
        built.pin,
        built.so_path.display(),
        if built.fresh {
            format!("built in {:.0} s", built.manifest.build_seconds)
        } else {
            "cached".to_string()
        }
    );
    Ok(built)
}

/// Returns the cached build for `spec`, building it first when the cache has no entry for the
/// current key (or `spec.force` is set). With `progress`, reports progress on stderr.
pub fn ensure_built(spec: &BuildSpec, progress: bool) -> Result<BuiltShim> {
    check_host()?;
    let info = spec.pin.info()?;
    let cache = match &spec.cache_dir {
        Some(dir) => dir.clone(),
        None => cache_root()?,
    };
    let src = match &spec.llama_src {
        Some(dir) => normalize_tree(dir)?,
        None => locate_or_fetch(info, &cache, progress)?,
    };
    let recipe = Recipe::for_tree(&src, &spec.pin)?;
    check_tree_versions(&spec.pin, info, &recipe, &src);
    let unknown_defines = unknown_cmake_defines(&src, &recipe)?;
    if !unknown_defines.is_empty() {
        eprintln!(
            "warning: {}: {} names defines that kvaudit neither passes nor knows: {}. A define \
             left out switches a feature off silently: check whether the default cmake build \
             sets it, then pass it or list it in CMAKE_DEFINES_NOT_PASSED (src/llama/build.rs).",
            spec.pin,
            src.join("**/CMakeLists.txt").display(),
            unknown_defines.join(", ")
        );
    }
    let toolchain = Toolchain::detect(&cache)?;
    let key = cache_key(
        &spec.pin,
        &recipe,
        &toolchain,
        &tree_fingerprint(&src, &recipe)?,
    )?;
    let entry = cache.join("llama.cpp").join(format!(
        "{}-{}-{}",
        spec.pin.version,
        spec.pin.variant,
        &key[..16]
    ));
    if !spec.force {
        if let Some(built) = load_entry(&entry, &key, &spec.pin)? {
            return Ok(built);
        }
    }
    // One build at a time per cache, across threads and processes (parallel tests ask for pins
    // at once): a build already uses every core, and two builds of one key would race on its
    // entry. Whoever waited finds the entry built and takes it.
    let _lock = BuildLock::acquire(&cache, progress)?;
    if !spec.force {
        if let Some(built) = load_entry(&entry, &key, &spec.pin)? {
            return Ok(built);
        }
    }
    build_entry(
        spec,
        &src,
        &recipe,
        &toolchain,
        &key,
        &entry,
        unknown_defines,
        progress,
    )
}

/// An exclusive `flock` on `<cache>/build.lock`, released on drop (and by the kernel if the
/// process dies).
struct BuildLock {
    file: fs::File,
}

impl BuildLock {
    fn acquire(cache: &Path, progress: bool) -> Result<BuildLock> {
        fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
        let path = cache.join("build.lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock(2) on a descriptor this File owns for the lock's whole life.
        let busy = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0;
        if busy {
            if progress {
                eprintln!("waiting for another kvaudit build ({})", path.display());
            }
            // SAFETY: as above; this call blocks until the other holder releases the lock.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
                bail!(
                    "locking {}: {}",
                    path.display(),
                    std::io::Error::last_os_error()
                );
            }
        }
        Ok(BuildLock { file })
    }
}

impl Drop for BuildLock {
    fn drop(&mut self) {
        use std::os::unix::io::AsRawFd;
        // SAFETY: unlocking the descriptor locked in `acquire`, still owned by self.file.
        unsafe {
            libc::flock(self.file.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

/// The cache root: `$KVAUDIT_CACHE_DIR`, else `$XDG_CACHE_HOME/kvaudit`, else
/// `$HOME/.cache/kvaudit`.
pub fn cache_root() -> Result<PathBuf> {
    if let Some(dir) = non_empty_env("KVAUDIT_CACHE_DIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = non_empty_env("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(dir).join("kvaudit"));
    }
    match non_empty_env("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".cache").join("kvaudit")),
        None => bail!("no cache directory: set KVAUDIT_CACHE_DIR, XDG_CACHE_HOME or HOME"),
    }
}

/// Cargo's home: `$CARGO_HOME`, else `$HOME/.cargo`.
pub fn cargo_home() -> Result<PathBuf> {
    if let Some(dir) = non_empty_env("CARGO_HOME") {
        return Ok(PathBuf::from(dir));
    }
    match non_empty_env("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".cargo")),
        None => bail!("cannot find cargo's home: set CARGO_HOME or HOME"),
    }
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn check_host() -> Result<()> {
    if !cfg!(all(
        target_arch = "x86_64",
        target_os = "linux",
        target_env = "gnu"
    )) {
        bail!("building llama.cpp pins is only supported on x86_64 Linux (gnu); the recipe's CPU flags and link flags are for {TRIPLE}");
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
            bail!(
                "this CPU lacks {}: the ggml CPU backend is compiled with {} and would die of SIGILL",
                missing.join(", "),
                X86_CPU_FLAGS.join(" ")
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Sources

/// Accepts a llama.cpp tree or a directory holding one in `llama.cpp/`.
fn normalize_tree(dir: &Path) -> Result<PathBuf> {
    let candidates = [dir.to_path_buf(), dir.join("llama.cpp")];
    for c in &candidates {
        if c.join("include/llama.h").is_file() && c.join("ggml/include/ggml.h").is_file() {
            return c
                .canonicalize()
                .with_context(|| format!("resolving llama.cpp tree {}", c.display()));
        }
    }
    bail!(
        "{} is not a llama.cpp tree: no include/llama.h and ggml/include/ggml.h in it or in its llama.cpp/ subdirectory",
        dir.display()
    )
}

/// Finds the pin's unpacked crate in cargo's registry, running `cargo fetch` on a throwaway
/// manifest first when it is not there.
pub fn locate_or_fetch(info: &PinInfo, cache: &Path, progress: bool) -> Result<PathBuf> {
    let home = cargo_home()?;
    if let Some(tree) = find_in_registry(&home, info)? {
        return Ok(tree);
    }
    let dir = cache
        .join("llama.cpp")
        .join("fetch")
        .join(format!("{}-{}", info.crate_name, info.version));
    fs::create_dir_all(dir.join("src")).with_context(|| format!("creating {}", dir.display()))?;
    let manifest = format!(
        "# Written by kvaudit to make cargo download {name} {version}; safe to delete.\n\
         [package]\nname = \"kvaudit-fetch\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
         [dependencies]\n{name} = \"={version}\"\n\n[workspace]\n",
        name = info.crate_name,
        version = info.version
    );
    fs::write(dir.join("Cargo.toml"), manifest)?;
    fs::write(dir.join("src/lib.rs"), "")?;
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
        .with_context(|| format!("running {} fetch", Path::new(&cargo).display()))?;
    if !output.status.success() {
        bail!(
            "`cargo fetch` for {} {} failed ({}):\n{}",
            info.crate_name,
            info.version,
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    match find_in_registry(&home, info)? {
        Some(tree) => Ok(tree),
        None => bail!(
            "`cargo fetch` succeeded but {}/registry/src/*/{}-{}/llama.cpp does not exist",
            home.display(),
            info.crate_name,
            info.version
        ),
    }
}

fn find_in_registry(cargo_home: &Path, info: &PinInfo) -> Result<Option<PathBuf>> {
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

/// Files directly in `dir` (or below it, with `recursive`) whose extension is one of `exts`,
/// as paths relative to `root`, sorted.
fn glob_sources(
    root: &Path,
    dir: &str,
    recursive: bool,
    exts: &[&str],
    skip_top: &[&str],
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![root.join(dir)];
    while let Some(d) = stack.pop() {
        let entries = fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))?;
        for entry in entries {
            let path = entry?.path();
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .to_string_lossy()
                .replace('\\', "/");
            if path.is_dir() {
                let below = path.strip_prefix(root.join(dir)).unwrap_or(&path);
                let top = below
                    .components()
                    .next()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned());
                if recursive && !top.is_some_and(|t| skip_top.contains(&t.as_str())) {
                    stack.push(path);
                }
            } else if path
                .extension()
                .is_some_and(|e| exts.iter().any(|x| e == *x))
            {
                out.push(rel);
            }
        }
    }
    out.sort();
    Ok(out)
}

impl Recipe {
    /// The recipe for the tree at `src` and `pin`'s variant.
    pub fn for_tree(src: &Path, pin: &Pin) -> Result<Recipe> {
        let read = |rel: &str| {
            fs::read_to_string(src.join(rel))
                .with_context(|| format!("reading {}", src.join(rel).display()))
        };
        let root_cmake = read("CMakeLists.txt")?;
        let ggml_cmake = read("ggml/CMakeLists.txt")?;
        let llama_version_base = cmake_version(&root_cmake, "LLAMA")
            .context("CMakeLists.txt has no set(LLAMA_VERSION_MAJOR/MINOR/PATCH ...)")?;
        let ggml_version = cmake_version(&ggml_cmake, "GGML")
            .context("ggml/CMakeLists.txt has no set(GGML_VERSION_MAJOR/MINOR/PATCH ...)")?;
        // cmake appends -dev while the LLAMA_BUILD_IS_DEV option is ON (its default).
        let llama_version = match cmake_option_default(&root_cmake, "LLAMA_BUILD_IS_DEV") {
            Some(true) => format!("{llama_version_base}-dev"),
            _ => llama_version_base.clone(),
        };
        // Without a git checkout cmake's commit is "unknown" for both.
        let commit = "unknown";

        let ndebug: &[&str] = match pin.variant {
            Variant::Release => &["NDEBUG"],
            Variant::Assert => &[],
        };
        let strings = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let quoted = |name: &str, value: &str| format!("{name}=\"{value}\"");

        let ggml_src = |exts: &[&str]| glob_sources(src, "ggml/src", false, exts, &[]);
        let mut cpu_c = glob_sources(src, "ggml/src/ggml-cpu", true, &["c"], CPU_SKIP_DIRS)?;
        let mut cpu_cxx = glob_sources(src, "ggml/src/ggml-cpu", true, &["cpp"], CPU_SKIP_DIRS)?;
        cpu_c.extend(glob_sources(
            src,
            "ggml/src/ggml-cpu/arch/x86",
            false,
            &["c"],
            &[],
        )?);
        cpu_cxx.extend(
            glob_sources(src, "ggml/src/ggml-cpu/arch/x86", false, &["cpp"], &[])?
                .into_iter()
                // cpu-feats.cpp is the feature probe of dynamically loaded backends.
                .filter(|p| !p.ends_with("/cpu-feats.cpp")),
        );
        let mut llama_cxx = glob_sources(src, "src", false, &["cpp"], &[])?;
        llama_cxx.extend(glob_sources(src, "src/models", false, &["cpp"], &[])?);

        let mut ggml_defines = strings(GGML_DEFINES);
        ggml_defines.push(quoted("GGML_VERSION", &ggml_version));
        ggml_defines.push(quoted("GGML_COMMIT", commit));
        ggml_defines.extend(strings(ndebug));
        let ggml_includes = strings(&["$SRC/ggml/src", "$SRC/ggml/include", "$GEN"]);

        let mut cpu_defines = strings(GGML_DEFINES);
        cpu_defines.extend(strings(&["GGML_USE_CPU_REPACK", "GGML_USE_LLAMAFILE"]));
        cpu_defines.extend(strings(ndebug));
        let cpu_includes = strings(&[
            "$SRC/ggml",
            "$SRC/ggml/src",
            "$SRC/ggml/src/ggml-cpu",
            "$SRC/ggml/include",
        ]);

        let mut llama_defines = strings(&["GGML_USE_CPU"]);
        llama_defines.push(quoted("LLAMA_VERSION", &llama_version));
        llama_defines.push(quoted("LLAMA_COMMIT", commit));
        llama_defines.extend(strings(ndebug));

        let unit = |group: &str,
                    lang: Lang,
                    sources: Vec<String>,
                    defines: Vec<String>,
                    flags: Vec<String>,
                    includes: Vec<String>| CompileUnit {
            group: group.to_string(),
            lang,
            sources,
            defines,
            flags,
            includes,
        };
        let mut ggml_cxx_defines = ggml_defines.clone();
        ggml_cxx_defines.push("GGML_USE_CPU".to_string());
        let units = vec![
            unit(
                "ggml",
                Lang::C,
                ggml_src(&["c"])?,
                ggml_defines.clone(),
                vec![],
                ggml_includes.clone(),
            ),
            unit(
                "ggml",
                Lang::Cxx,
                ggml_src(&["cpp"])?,
                ggml_cxx_defines,
                vec![],
                ggml_includes,
            ),
            unit(
                "ggml-cpu",
                Lang::C,
                cpu_c,
                cpu_defines.clone(),
                strings(X86_CPU_FLAGS),
                cpu_includes.clone(),
            ),
            unit(
                "ggml-cpu",
                Lang::Cxx,
                cpu_cxx,
                cpu_defines,
                strings(X86_CPU_FLAGS),
                cpu_includes,
            ),
            unit(
                "llama",
                Lang::Cxx,
                llama_cxx,
                llama_defines,
                vec![],
                strings(&["$SRC/src", "$SRC/include", "$SRC/ggml/include", "$GEN"]),
            ),
        ];
        for u in &units {
            if u.sources.is_empty() {
                bail!("{}: the glob rules found no sources for {} (not a llama.cpp tree of the expected shape?)", src.display(), u.name());
            }
        }

        let mut shim_defines = vec![format!("KVAUDIT_SHIM_PIN=\"{}\"", pin.label())];
        shim_defines.extend(strings(ndebug));
        let shim = unit(
            "shim",
            Lang::Cxx,
            vec!["kvaudit_shim.c".to_string()],
            shim_defines,
            // Compiled as C++ so its try/catch guards stop exceptions at the C ABI.
            strings(&["-x", "c++", "-fvisibility=hidden"]),
            strings(&["$SHIM", "$SRC/include", "$SRC/ggml/include"]),
        );

        Ok(Recipe {
            ggml_version_h: version_header("GGML", &ggml_version, commit),
            llama_version_h: version_header("LLAMA", &llama_version, commit),
            llama_version,
            llama_version_base,
            ggml_version,
            units,
            shim,
        })
    }

    /// Every define name the recipe passes to some llama.cpp or ggml unit.
    pub fn passed_define_names(&self) -> BTreeSet<String> {
        self.units
            .iter()
            .flat_map(|u| u.defines.iter())
            .map(|d| d.split('=').next().unwrap_or(d).to_string())
            .collect()
    }

    fn n_sources(&self) -> usize {
        self.units.iter().map(|u| u.sources.len()).sum()
    }
}

/// The contents cmake's `configure_file` gives `ggml-version.h` / `llama-version.h`
/// (`prefix` is `GGML` or `LLAMA`). 0.1.161 includes these; 0.1.156 takes `-D` macros, and both
/// are passed with identical values, which the preprocessor accepts as a benign redefinition.
pub fn version_header(prefix: &str, version: &str, commit: &str) -> String {
    format!("#pragma once\n\n#define {prefix}_VERSION \"{version}\"\n#define {prefix}_COMMIT  \"{commit}\"\n")
}

/// `MAJOR.MINOR.PATCH` from `set(<prefix>_VERSION_MAJOR 0)` etc.
pub fn cmake_version(cmake: &str, prefix: &str) -> Option<String> {
    let part = |what: &str| cmake_set_value(cmake, &format!("{prefix}_VERSION_{what}"));
    Some(format!(
        "{}.{}.{}",
        part("MAJOR")?,
        part("MINOR")?,
        part("PATCH")?
    ))
}

/// The value of the first `set(NAME value)` in a CMake file.
fn cmake_set_value(cmake: &str, name: &str) -> Option<String> {
    cmake.lines().map(str::trim).find_map(|line| {
        let rest = line.strip_prefix("set(")?.trim_start();
        let rest = rest.strip_prefix(name)?;
        if !rest.starts_with(char::is_whitespace) {
            return None;
        }
        let value = rest.trim().strip_suffix(')')?.trim().trim_matches('"');
        Some(value.to_string())
    })
}

/// The default of `option(NAME "doc" ON|OFF)`.
fn cmake_option_default(cmake: &str, name: &str) -> Option<bool> {
    cmake.lines().map(str::trim).find_map(|line| {
        let rest = line
            .strip_prefix("option(")?
            .trim_start()
            .strip_prefix(name)?;
        let rest = rest.trim().strip_suffix(')')?;
        let last = rest
            .rsplit(|c: char| c.is_whitespace() || c == '"')
            .next()?;
        match last {
            "ON" => Some(true),
            "OFF" => Some(false),
            _ => None,
        }
    })
}

/// The define names in the `add_compile_definitions(...)` and `target_compile_definitions(...)`
/// calls of a CMake file, whatever condition they sit under. Variables (`${backend_use}`) are
/// skipped; generator expressions (`$<$<CONFIG:Debug>:NAME>`) give their NAME.
pub fn cmake_define_names(cmake: &str) -> BTreeSet<String> {
    let text: String = cmake
        .lines()
        .map(strip_cmake_comment)
        .collect::<Vec<_>>()
        .join("\n");
    let lower = text.to_ascii_lowercase();
    let mut names = BTreeSet::new();
    for (call, skip_first) in [
        ("add_compile_definitions", false),
        ("target_compile_definitions", true),
    ] {
        let mut from = 0;
        while let Some(at) = lower[from..].find(call) {
            let start = from + at;
            from = start + call.len();
            let before_ok = start == 0
                || !lower.as_bytes()[start - 1].is_ascii_alphanumeric()
                    && lower.as_bytes()[start - 1] != b'_';
            let rest = text[from..].trim_start();
            if !before_ok || !rest.starts_with('(') {
                continue;
            }
            let args = balanced_parens(&rest[1..]);
            let mut tokens = args.split_whitespace();
            if skip_first {
                tokens.next();
            }
            for token in tokens {
                if let Some(name) = cmake_define_token_name(token) {
                    names.insert(name);
                }
            }
        }
    }
    names
}

fn strip_cmake_comment(line: &str) -> &str {
    let mut in_string = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => in_string = !in_string,
            '#' if !in_string => return &line[..i],
            _ => {}
        }
    }
    line
}

/// The text up to the `)` that closes an already opened `(`.
fn balanced_parens(s: &str) -> &str {
    let mut depth = 1;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &s[..i];
                }
            }
            _ => {}
        }
    }
    s
}

fn cmake_define_token_name(token: &str) -> Option<String> {
    let mut t = token.trim_matches('"');
    if matches!(t, "PRIVATE" | "PUBLIC" | "INTERFACE") || t.starts_with("${") {
        return None;
    }
    if t.starts_with("$<") {
        t = t.rsplit(':').next()?.trim_end_matches('>');
    }
    let t = t.strip_prefix("-D").unwrap_or(t);
    let name = t.split('=').next()?;
    let valid = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    valid.then(|| name.to_string())
}

/// The CMake files whose define calls the recipe mirrors.
const CMAKE_FILES: &[&str] = &[
    "CMakeLists.txt",
    "src/CMakeLists.txt",
    "ggml/CMakeLists.txt",
    "ggml/src/CMakeLists.txt",
    "ggml/src/ggml-cpu/CMakeLists.txt",
];

/// Define names in the tree's CMake files that the recipe neither passes nor lists in
/// `CMAKE_DEFINES_NOT_PASSED`.
pub fn unknown_cmake_defines(src: &Path, recipe: &Recipe) -> Result<Vec<String>> {
    let mut known = recipe.passed_define_names();
    known.extend(
        CMAKE_DEFINES_NOT_PASSED
            .iter()
            .map(|(n, _)| n.split('=').next().unwrap_or(n).to_string()),
    );
    let mut unknown = BTreeSet::new();
    for rel in CMAKE_FILES {
        let path = src.join(rel);
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        unknown.extend(
            cmake_define_names(&text)
                .into_iter()
                .filter(|n| !known.contains(n)),
        );
    }
    Ok(unknown.into_iter().collect())
}

fn check_tree_versions(pin: &Pin, info: &PinInfo, recipe: &Recipe, src: &Path) {
    if recipe.llama_version_base != info.llama_version || recipe.ggml_version != info.ggml_version {
        eprintln!(
            "warning: {} has LLAMA_VERSION {} / GGML_VERSION {}, but pins.toml records {} / {} for {}: is this the right tree?",
            src.display(),
            recipe.llama_version_base,
            recipe.ggml_version,
            info.llama_version,
            info.ggml_version,
            pin
        );
    }
}

/// Paths, sizes and modification times of every compiled source and every header and CMake
/// file next to them: a change in the tree changes the key, like make's timestamps.
fn tree_fingerprint(src: &Path, recipe: &Recipe) -> Result<String> {
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
        let meta = fs::metadata(src.join(rel))
            .with_context(|| format!("stat {}", src.join(rel).display()))?;
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .unwrap_or_default();
        h.update(format!(
            "{rel}\0{}\0{}.{}\n",
            meta.len(),
            mtime.as_secs(),
            mtime.subsec_nanos()
        ));
    }
    Ok(hex(&h.finalize()))
}

// ---------------------------------------------------------------------------------------------
// Toolchain and key

/// The compilers `cc` picks (honouring `CC`, `CXX`, `CFLAGS`, ...), and their versions.
#[derive(Debug, Clone, Serialize)]
struct Toolchain {
    c: PathBuf,
    cxx: PathBuf,
    version: String,
    /// The environment variables `cc` reads for this target, as set now.
    env: BTreeMap<String, String>,
}

impl Toolchain {
    fn detect(cache: &Path) -> Result<Toolchain> {
        let probe_dir = cache.join("llama.cpp").join("probe");
        fs::create_dir_all(&probe_dir)?;
        let tool = |cpp: bool| -> Result<PathBuf> {
            let mut b = base_build(&probe_dir);
            b.cpp(cpp);
            Ok(b.try_get_compiler()
                .context("finding a C/C++ compiler with the cc crate")?
                .path()
                .to_path_buf())
        };
        let c = tool(false)?;
        let cxx = tool(true)?;
        let mut version = String::new();
        for compiler in [&c, &cxx] {
            let out = Command::new(compiler)
                .arg("--version")
                .output()
                .with_context(|| format!("running {} --version", compiler.display()))?;
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
fn cc_env_snapshot() -> BTreeMap<String, String> {
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

fn cache_key(pin: &Pin, recipe: &Recipe, toolchain: &Toolchain, tree: &str) -> Result<String> {
    #[derive(Serialize)]
    struct KeyInput<'a> {
        recipe_version: u32,
        pin: String,
        recipe: &'a Recipe,
        toolchain: &'a Toolchain,
        tree: &'a str,
        shim_header: &'a str,
        shim_source: &'a str,
        link_flags: Vec<String>,
    }
    let input = KeyInput {
        recipe_version: RECIPE_VERSION,
        pin: pin.label(),
        recipe,
        toolchain,
        tree,
        shim_header: SHIM_HEADER,
        shim_source: SHIM_SOURCE,
        link_flags: link_flags(Path::new("$SHIM/exports.map"), "$SONAME"),
    };
    Ok(hex(&Sha256::digest(serde_json::to_vec(&input)?)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 of a file, hex.
pub fn file_sha256(path: &Path) -> Result<String> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(crate::base::files::sha256_hex(bytes))
}

// ---------------------------------------------------------------------------------------------
// Cache entries

fn load_entry(entry: &Path, key: &str, pin: &Pin) -> Result<Option<BuiltShim>> {
    let manifest_path = entry.join(MANIFEST_NAME);
    let Ok(text) = fs::read_to_string(&manifest_path) else {
        return Ok(None);
    };
    let Ok(manifest) = serde_json::from_str::<BuildManifest>(&text) else {
        return Ok(None);
    };
    let built = built_shim(entry, pin, manifest, false);
    if built.manifest.key != key
        || !built.so_path.is_file()
        || !built.static_lib.is_file()
        || file_sha256(&built.so_path)? != built.manifest.so_sha256
    {
        return Ok(None);
    }
    Ok(Some(built))
}

fn built_shim(entry: &Path, pin: &Pin, manifest: BuildManifest, fresh: bool) -> BuiltShim {
    BuiltShim {
        pin: pin.clone(),
        dir: entry.to_path_buf(),
        so_path: entry.join(SO_NAME),
        include_dir: entry.join("include"),
        static_lib: entry.join(STATIC_LIB_NAME),
        manifest,
        fresh,
    }
}

/// Substitutes the placeholders of a recipe path.
fn resolve(path: &str, src: &Path, gen: &Path, shim: &Path) -> PathBuf {
    for (ph, real) in [("$SRC", src), ("$GEN", gen), ("$SHIM", shim)] {
        if let Some(rest) = path.strip_prefix(ph) {
            return real.join(rest.trim_start_matches('/'));
        }
    }
    PathBuf::from(path)
}

fn base_build(out_dir: &Path) -> cc::Build {
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

/// Collects what `cc` reports while compiling: compile starts (for progress) and the stderr of
/// failing commands.
#[derive(Default)]
struct UnitLog {
    started: AtomicUsize,
    stderr: Mutex<Vec<String>>,
}

impl cc::BuildMessageLogger for UnitLog {
    fn log(
        &self,
        kind: cc::BuildMessageKind,
        msg: cc::BuildMessage<'_>,
        _extra: &dyn std::any::Any,
    ) {
        match kind {
            cc::BuildMessageKind::CompileCommand => {
                self.started.fetch_add(1, Ordering::Relaxed);
            }
            cc::BuildMessageKind::StderrForwarding | cc::BuildMessageKind::CommandFailed { .. } => {
                if let Ok(mut lines) = self.stderr.lock() {
                    if lines.len() < 200 {
                        lines.push(msg.to_string());
                    }
                }
            }
            _ => {}
        }
    }
}

fn configure_unit(
    unit: &CompileUnit,
    src: &Path,
    gen: &Path,
    shim: &Path,
    obj_dir: &Path,
    log: &Arc<UnitLog>,
) -> cc::Build {
    let mut b = base_build(obj_dir);
    b.cpp(unit.lang == Lang::Cxx).std(unit.lang.std());
    b.message_logger(Some(log.clone() as Arc<dyn cc::BuildMessageLogger>));
    for inc in &unit.includes {
        b.include(resolve(inc, src, gen, shim));
    }
    for d in &unit.defines {
        match d.split_once('=') {
            Some((k, v)) => b.define(k, Some(v)),
            None => b.define(d, None::<&str>),
        };
    }
    for f in &unit.flags {
        b.flag(f);
    }
    // Biggest files first: a rough longest-job-first order, so the last job is a short one.
    let base = if unit.group == "shim" { shim } else { src };
    let mut files: Vec<(u64, PathBuf)> = unit
        .sources
        .iter()
        .map(|s| {
            let p = base.join(s);
            (fs::metadata(&p).map(|m| m.len()).unwrap_or(0), p)
        })
        .collect();
    files.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    b.files(files.into_iter().map(|(_, p)| p));
    b
}

fn command_line(b: &cc::Build) -> Result<Vec<String>> {
    let tool = b.try_get_compiler()?;
    let mut cmd = vec![tool.path().display().to_string()];
    cmd.extend(tool.args().iter().map(|a| a.to_string_lossy().into_owned()));
    Ok(cmd)
}

fn link_flags(export_map: &Path, soname: &str) -> Vec<String> {
    vec![
        "-shared".into(),
        format!("-Wl,-soname,{soname}"),
        format!("-Wl,--version-script={}", export_map.display()),
        // Calls inside the .so bind to its own copies, never to another pin's.
        "-Wl,-Bsymbolic".into(),
        // Without it a missing source file still "links", with undefined symbols.
        "-Wl,--no-undefined".into(),
        "-Wl,--exclude-libs,ALL".into(),
    ]
}

const EXPORT_MAP: &str = "{ global: kvaudit_shim_*; local: *; };\n";

#[allow(clippy::too_many_arguments)]
fn build_entry(
    spec: &BuildSpec,
    src: &Path,
    recipe: &Recipe,
    toolchain: &Toolchain,
    key: &str,
    entry: &Path,
    unknown_cmake_defines: Vec<String>,
    progress: bool,
) -> Result<BuiltShim> {
    let started = SystemTime::now();
    let clock = Instant::now();
    let parent = entry.parent().context("cache entry has no parent")?;
    fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    remove_abandoned_builds(parent);
    let nanos = started
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    let tmp = parent.join(format!(
        ".tmp-{}-{}-{}",
        entry.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id(),
        nanos
    ));
    let result = build_into(
        spec,
        src,
        recipe,
        toolchain,
        key,
        entry,
        &tmp,
        unknown_cmake_defines,
        progress,
        started,
        clock,
    );
    match result {
        Ok(manifest) => {
            if !spec.force {
                // Another process built the same key meanwhile: keep its entry, which it may
                // already have loaded, and drop ours.
                if let Some(built) = load_entry(entry, key, &spec.pin)? {
                    fs::remove_dir_all(&tmp).ok();
                    return Ok(built);
                }
            }
            if entry.exists() {
                // A forced rebuild or a broken entry. A process that has the old .so loaded
                // keeps its mapping.
                let old = parent.join(format!(".old-{}-{}", std::process::id(), nanos));
                fs::rename(entry, &old).ok();
                fs::remove_dir_all(&old).ok();
            }
            if let Err(e) = fs::rename(&tmp, entry) {
                fs::remove_dir_all(&tmp).ok();
                if let Some(built) = load_entry(entry, key, &spec.pin)? {
                    return Ok(built);
                }
                return Err(e)
                    .with_context(|| format!("moving the build into {}", entry.display()));
            }
            Ok(built_shim(entry, &spec.pin, manifest, true))
        }
        Err(e) => {
            fs::remove_dir_all(&tmp).ok();
            Err(e.context(format!("building {}", spec.pin)))
        }
    }
}

/// Removes the temporary directories of builds whose process is gone (killed mid-build):
/// `.tmp-ENTRY-PID-NANOS` and `.old-PID-NANOS`.
fn remove_abandoned_builds(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for path in entries.filter_map(|e| e.ok()).map(|e| e.path()) {
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if !(name.starts_with(".tmp-") || name.starts_with(".old-")) {
            continue;
        }
        let pid = name.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                fs::remove_dir_all(&path).ok();
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn build_into(
    spec: &BuildSpec,
    src: &Path,
    recipe: &Recipe,
    toolchain: &Toolchain,
    key: &str,
    entry: &Path,
    tmp: &Path,
    unknown_cmake_defines: Vec<String>,
    progress: bool,
    started: SystemTime,
    clock: Instant,
) -> Result<BuildManifest> {
    let gen = tmp.join("gen");
    let shim_dir = tmp.join("shim");
    let include = tmp.join("include");
    for d in [&gen, &shim_dir, &include] {
        fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    fs::write(gen.join("ggml-version.h"), &recipe.ggml_version_h)?;
    fs::write(gen.join("llama-version.h"), &recipe.llama_version_h)?;
    fs::write(shim_dir.join("kvaudit_shim.h"), SHIM_HEADER)?;
    fs::write(shim_dir.join("kvaudit_shim.c"), SHIM_SOURCE)?;
    fs::write(shim_dir.join("exports.map"), EXPORT_MAP)?;
    for dir in ["include", "ggml/include"] {
        for rel in glob_sources(src, dir, false, &["h"], &[])? {
            let name = Path::new(&rel)
                .file_name()
                .context("header without a name")?;
            fs::copy(src.join(&rel), include.join(name))
                .with_context(|| format!("copying {rel}"))?;
        }
    }

    // Every unit, the shim included, compiles at once on its own thread; cc's process-wide
    // job server (as many tokens as cores, or cargo's job server when there is one) keeps
    // exactly that many compilers running, and no core idles while one group finishes.
    let all_units: Vec<&CompileUnit> = recipe
        .units
        .iter()
        .chain(std::iter::once(&recipe.shim))
        .collect();
    let logs: Vec<Arc<UnitLog>> = all_units
        .iter()
        .map(|_| Arc::new(UnitLog::default()))
        .collect();
    let builds: Vec<cc::Build> = all_units
        .iter()
        .zip(&logs)
        .map(|(u, log)| {
            configure_unit(
                u,
                src,
                &gen,
                &shim_dir,
                &tmp.join("obj").join(u.name()),
                log,
            )
        })
        .collect();
    let (tmp_str, entry_str) = (tmp.display().to_string(), entry.display().to_string());
    let units_record = all_units
        .iter()
        .zip(&builds)
        .map(|(u, b)| {
            Ok(UnitRecord {
                name: u.name(),
                n_sources: u.sources.len(),
                // Recorded with the final entry path, not the temporary build directory.
                command: command_line(b)?
                    .into_iter()
                    .map(|a| a.replace(&tmp_str, &entry_str))
                    .collect(),
            })
        })
        .collect::<Result<Vec<_>>>()?;

    let total = recipe.n_sources() + 1;
    let display = Progress::new(progress, &spec.pin, total);
    let objects: Vec<Result<Vec<PathBuf>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = all_units
            .iter()
            .zip(&builds)
            .zip(&logs)
            .map(|((u, b), log)| {
                scope.spawn(move || {
                    b.try_compile_intermediates().map_err(|e| {
                        let stderr = log.stderr.lock().map(|l| l.join("\n")).unwrap_or_default();
                        anyhow::anyhow!("compiling {}: {e}\n{stderr}", u.name())
                    })
                })
            })
            .collect();
        while !handles.iter().all(|h| h.is_finished()) {
            display.update(&all_units, &logs, clock.elapsed());
            std::thread::sleep(Duration::from_millis(200));
        }
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a compile thread panicked")))
            })
            .collect()
    });
    display.finish(clock.elapsed());
    let mut per_unit = Vec::new();
    for r in objects {
        per_unit.push(r?);
    }
    let shim_objects = per_unit.pop().context("no shim object")?;
    let llama_objects: Vec<PathBuf> = per_unit.into_iter().flatten().collect();

    // libllama_all.a, for standalone C reproducers.
    let static_lib = tmp.join(STATIC_LIB_NAME);
    let mut ar = base_build(&tmp.join("obj")).try_get_archiver()?;
    ar.arg("crs").arg(&static_lib).args(&llama_objects);
    run_checked(&mut ar, "archiving libllama_all.a")?;

    // The shared object: all objects and the shim, only kvaudit_shim_* exported.
    let so = tmp.join(SO_NAME);
    let soname = format!(
        "libkvaudit_shim-{}-{}-{}.so",
        spec.pin.version,
        spec.pin.variant,
        &key[..16]
    );
    let flags = link_flags(&shim_dir.join("exports.map"), &soname);
    let mut link = Command::new(&toolchain.cxx);
    link.args(&flags)
        .arg("-o")
        .arg(&so)
        .args(&llama_objects)
        .args(&shim_objects)
        .args(["-lpthread", "-lm"]);
    run_checked(&mut link, "linking libkvaudit_shim.so")?;
    check_exports(&so)?;
    fs::remove_dir_all(tmp.join("obj")).ok();

    let mut link_command = vec![toolchain.cxx.display().to_string()];
    link_command.extend(flags);
    link_command.extend(["-o".to_string(), entry.join(SO_NAME).display().to_string()]);
    link_command.push(format!("<{} objects> <shim object>", llama_objects.len()));
    link_command.extend(["-lpthread".to_string(), "-lm".to_string()]);

    let finished = SystemTime::now();
    let secs = |t: SystemTime| {
        t.duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    };
    let manifest = BuildManifest {
        pin: spec.pin.label(),
        version: spec.pin.version.clone(),
        variant: spec.pin.variant,
        key: key.to_string(),
        recipe_version: RECIPE_VERSION,
        shim_abi: super::ffi::SHIM_ABI,
        source_dir: src.to_path_buf(),
        llama_version: recipe.llama_version.clone(),
        ggml_version: recipe.ggml_version.clone(),
        compiler_version: toolchain.version.clone(),
        units: units_record,
        link_command,
        unknown_cmake_defines,
        started_unix: secs(started),
        finished_unix: secs(finished),
        build_seconds: clock.elapsed().as_secs_f64(),
        so_sha256: file_sha256(&so)?,
        static_lib_sha256: file_sha256(&static_lib)?,
    };
    // Written last: an entry without a manifest is never used.
    fs::write(
        tmp.join(MANIFEST_NAME),
        serde_json::to_string_pretty(&manifest)?,
    )?;
    Ok(manifest)
}

fn run_checked(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd
        .output()
        .with_context(|| format!("{what}: starting {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Fails when the shared object exports anything but `kvaudit_shim_*` (checked with `nm`; a
/// missing `nm` only skips the check).
fn check_exports(so: &Path) -> Result<()> {
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
        bail!(
            "nm -D {} failed: {}",
            so.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let foreign: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .filter(|s| !s.starts_with("kvaudit_shim_"))
        .collect();
    if !foreign.is_empty() {
        bail!(
            "{} exports symbols besides kvaudit_shim_*: {}",
            so.display(),
            foreign.join(", ")
        );
    }
    Ok(())
}

/// The progress display: an indicatif bar on a terminal, a plain line every 15 s otherwise.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    plain: bool,
    label: String,
    total: usize,
    last_plain: Mutex<Option<Instant>>,
}

impl Progress {
    fn new(enabled: bool, pin: &Pin, total: usize) -> Progress {
        let tty = std::io::stderr().is_terminal();
        let bar = (enabled && tty).then(|| {
            let bar = indicatif::ProgressBar::new(total as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar.set_prefix(format!("building {pin}"));
            bar
        });
        if enabled && !tty {
            eprintln!("building {pin}: {total} sources");
        }
        Progress {
            bar,
            plain: enabled && !tty,
            label: pin.label(),
            total,
            last_plain: Mutex::new(None),
        }
    }

    fn update(&self, units: &[&CompileUnit], logs: &[Arc<UnitLog>], elapsed: Duration) {
        let started: Vec<usize> = logs
            .iter()
            .map(|l| l.started.load(Ordering::Relaxed))
            .collect();
        let done: usize = started.iter().sum();
        // Per group (C and C++ together), the groups with work left: "ggml-cpu 12/21, llama 3/177".
        let mut groups: Vec<(&str, usize, usize)> = Vec::new();
        for (u, s) in units.iter().zip(&started) {
            match groups.iter_mut().find(|g| g.0 == u.group) {
                Some(g) => {
                    g.1 += s;
                    g.2 += u.sources.len();
                }
                None => groups.push((&u.group, *s, u.sources.len())),
            }
        }
        let open: Vec<String> = groups
            .iter()
            .filter(|(_, s, n)| s < n)
            .map(|(g, s, n)| format!("{g} {s}/{n}"))
            .collect();
        let current = format!("compiling {}", open.join(", "));
        if let Some(bar) = &self.bar {
            bar.set_position(done as u64);
            bar.set_message(current);
        } else if self.plain {
            let Ok(mut last) = self.last_plain.lock() else {
                return;
            };
            // (`Option::is_none_or` needs Rust 1.82; the crate's MSRV is 1.80.)
            #[allow(clippy::unnecessary_map_or)]
            let due = last.map_or(true, |t| t.elapsed() >= Duration::from_secs(15));
            if due {
                *last = Some(Instant::now());
                eprintln!(
                    "building {}: {done}/{} started, {current} ({:.0} s)",
                    self.label,
                    self.total,
                    elapsed.as_secs_f64()
                );
            }
        }
    }

    fn finish(&self, elapsed: Duration) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if self.bar.is_some() || self.plain {
            eprintln!(
                "compiled {} in {:.0} s; linking",
                self.label,
                elapsed.as_secs_f64()
            );
        }
    }
}

impl BuiltShim {
    /// Compiles and links a standalone C program against this build (llama.h from
    /// [`BuiltShim::include_dir`], objects from [`BuiltShim::static_lib`]), with the build's
    /// NDEBUG choice. Used for C reproducers of findings.
    pub fn compile_c_program(&self, source: &Path, output: &Path) -> Result<()> {
        let scratch = self.dir.join("probe");
        fs::create_dir_all(&scratch)?;
        let cc_path = base_build(&scratch)
            .try_get_compiler()?
            .path()
            .to_path_buf();
        let cxx_path = {
            let mut b = base_build(&scratch);
            b.cpp(true);
            b.try_get_compiler()?.path().to_path_buf()
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    const CMAKE_SAMPLE: &str = r#"
set(LLAMA_VERSION_MAJOR 0)
set(LLAMA_VERSION_MINOR 6)
set(LLAMA_VERSION_PATCH 0)
set(LLAMA_VERSION_BASE "${LLAMA_VERSION_MAJOR}.${LLAMA_VERSION_MINOR}.${LLAMA_VERSION_PATCH}")
option(LLAMA_BUILD_IS_DEV "llama: dev build" ON)
add_compile_definitions(GGML_SCHED_MAX_COPIES=${GGML_SCHED_MAX_COPIES})
if (CMAKE_SYSTEM_NAME MATCHES "Linux")
    add_compile_definitions($<$<CONFIG:Debug>:_GLIBCXX_ASSERTIONS>)
endif()
# add_compile_definitions(COMMENTED_OUT)
target_compile_definitions(ggml-base PRIVATE
    GGML_VERSION="${GGML_INSTALL_VERSION}"
    GGML_COMMIT="${GGML_BUILD_COMMIT}"
)
target_compile_definitions(ggml PUBLIC ${backend_use})
target_compile_definitions(${GGML_CPU_NAME} PRIVATE GGML_USE_LLAMAFILE) # trailing comment
my_add_compile_definitions(NOT_A_CALL)
"#;

    #[test]
    fn cmake_define_names_are_extracted() {
        let names: Vec<String> = cmake_define_names(CMAKE_SAMPLE).into_iter().collect();
        assert_eq!(
            names,
            [
                "GGML_COMMIT",
                "GGML_SCHED_MAX_COPIES",
                "GGML_USE_LLAMAFILE",
                "GGML_VERSION",
                "_GLIBCXX_ASSERTIONS"
            ]
        );
    }

    #[test]
    fn cmake_versions_and_options_are_read() {
        assert_eq!(
            cmake_version(CMAKE_SAMPLE, "LLAMA").as_deref(),
            Some("0.6.0")
        );
        assert_eq!(cmake_version(CMAKE_SAMPLE, "GGML"), None);
        assert_eq!(
            cmake_option_default(CMAKE_SAMPLE, "LLAMA_BUILD_IS_DEV"),
            Some(true)
        );
        assert_eq!(cmake_option_default(CMAKE_SAMPLE, "LLAMA_OTHER"), None);
    }

    #[test]
    fn version_headers_match_cmake_configure_file() {
        assert_eq!(
            version_header("GGML", "0.26.0", "unknown"),
            "#pragma once\n\n#define GGML_VERSION \"0.26.0\"\n#define GGML_COMMIT  \"unknown\"\n"
        );
        assert!(version_header("LLAMA", "0.6.0-dev", "unknown")
            .contains("#define LLAMA_VERSION \"0.6.0-dev\""));
    }

    #[test]
    fn abandoned_builds_are_removed_and_live_ones_kept() {
        let dir = std::env::temp_dir().join(format!("kvaudit-abandoned-{}", std::process::id()));
        let dead = dir.join(".tmp-0.1.156-release-abc-4000000000-1");
        let live = dir.join(format!(".tmp-0.1.156-release-abc-{}-2", std::process::id()));
        let entry = dir.join("0.1.156-release-abc");
        for d in [&dead, &live, &entry] {
            fs::create_dir_all(d).unwrap();
        }
        remove_abandoned_builds(&dir);
        let (dead_left, live_left, entry_left) = (dead.exists(), live.exists(), entry.exists());
        fs::remove_dir_all(&dir).ok();
        assert!(!dead_left && live_left && entry_left);
    }

    #[test]
    fn placeholders_resolve() {
        let (s, g, h) = (Path::new("/s"), Path::new("/g"), Path::new("/h"));
        assert_eq!(
            resolve("$SRC/ggml/include", s, g, h),
            Path::new("/s/ggml/include")
        );
        assert_eq!(resolve("$GEN", s, g, h), Path::new("/g"));
        assert_eq!(resolve("$SHIM", s, g, h), Path::new("/h"));
    }

    #[test]
    fn recipe_globs_a_fake_tree() {
        let dir = std::env::temp_dir().join(format!("kvaudit-recipe-test-{}", std::process::id()));
        let files = [
            "CMakeLists.txt",
            "ggml/CMakeLists.txt",
            "include/llama.h",
            "ggml/include/ggml.h",
            "ggml/src/ggml.c",
            "ggml/src/ggml.cpp",
            "ggml/src/ggml-cuda/cuda.cpp",
            "ggml/src/ggml-cpu/ops.cpp",
            "ggml/src/ggml-cpu/quants.c",
            "ggml/src/ggml-cpu/tiled/tiled.cpp",
            "ggml/src/ggml-cpu/kleidiai/k.cpp",
            "ggml/src/ggml-cpu/arch/arm/quants.c",
            "ggml/src/ggml-cpu/arch/x86/quants.c",
            "ggml/src/ggml-cpu/arch/x86/cpu-feats.cpp",
            "ggml/src/ggml-cpu/arch/x86/repack.cpp",
            "src/llama.cpp",
            "src/models/llama.cpp",
        ];
        for f in files {
            let p = dir.join(f);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            let text = match f {
                "CMakeLists.txt" => "set(LLAMA_VERSION_MAJOR 0)\nset(LLAMA_VERSION_MINOR 1)\nset(LLAMA_VERSION_PATCH 0)\noption(LLAMA_BUILD_IS_DEV \"dev\" ON)\n",
                "ggml/CMakeLists.txt" => "set(GGML_VERSION_MAJOR 0)\nset(GGML_VERSION_MINOR 19)\nset(GGML_VERSION_PATCH 0)\n",
                _ => "",
            };
            fs::write(p, text).unwrap();
        }
        let pin = Pin::parse("llama.cpp@0.1.156+assert").unwrap();
        let r = Recipe::for_tree(&dir, &pin).unwrap();
        fs::remove_dir_all(&dir).ok();
        let by_name: BTreeMap<String, &CompileUnit> =
            r.units.iter().map(|u| (u.name(), u)).collect();
        assert_eq!(r.llama_version, "0.1.0-dev");
        assert_eq!(r.ggml_version, "0.19.0");
        assert_eq!(by_name["ggml.c"].sources, ["ggml/src/ggml.c"]);
        assert_eq!(by_name["ggml.c++"].sources, ["ggml/src/ggml.cpp"]);
        assert_eq!(
            by_name["ggml-cpu.c"].sources,
            [
                "ggml/src/ggml-cpu/quants.c",
                "ggml/src/ggml-cpu/arch/x86/quants.c"
            ]
        );
        assert_eq!(
            by_name["ggml-cpu.c++"].sources,
            [
                "ggml/src/ggml-cpu/ops.cpp",
                "ggml/src/ggml-cpu/tiled/tiled.cpp",
                "ggml/src/ggml-cpu/arch/x86/repack.cpp"
            ]
        );
        assert_eq!(
            by_name["llama.c++"].sources,
            ["src/llama.cpp", "src/models/llama.cpp"]
        );
        // The assert variant has no NDEBUG anywhere; the CPU flags stay in their group.
        assert!(r
            .units
            .iter()
            .chain([&r.shim])
            .all(|u| !u.defines.iter().any(|d| d == "NDEBUG")));
        assert!(by_name["ggml.c"].flags.is_empty() && by_name["llama.c++"].flags.is_empty());
        assert!(by_name["ggml-cpu.c"].flags.contains(&"-mfma".to_string()));
        assert!(by_name["ggml.c++"]
            .defines
            .contains(&"GGML_USE_CPU".to_string()));
        assert!(!by_name["ggml.c"]
            .defines
            .contains(&"GGML_USE_CPU".to_string()));
        assert!(by_name["llama.c++"]
            .defines
            .contains(&"LLAMA_VERSION=\"0.1.0-dev\"".to_string()));
        assert!(r
            .shim
            .defines
            .contains(&"KVAUDIT_SHIM_PIN=\"llama.cpp@0.1.156+assert\"".to_string()));
    }

    #[test]
    fn the_pins_cmake_defines_are_all_accounted_for() {
        // Runs against the unpacked pins when cargo's registry has them; says so when not.
        for info in crate::targets::llama::pins::known_pins().unwrap().values() {
            let Ok(home) = cargo_home() else { return };
            let Some(tree) = find_in_registry(&home, info).unwrap() else {
                eprintln!(
                    "note: {} {} is not unpacked in {}; skipping",
                    info.crate_name,
                    info.version,
                    home.display()
                );
                continue;
            };
            let pin = Pin {
                version: info.version.clone(),
                variant: Variant::Release,
            };
            let recipe = Recipe::for_tree(&tree, &pin).unwrap();
            assert_eq!(recipe.llama_version_base, info.llama_version);
            assert_eq!(recipe.ggml_version, info.ggml_version);
            assert_eq!(
                unknown_cmake_defines(&tree, &recipe).unwrap(),
                Vec::<String>::new(),
                "{}",
                info.version
            );
        }
    }
}
