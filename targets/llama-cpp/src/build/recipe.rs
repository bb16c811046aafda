//! The recipe: which sources of a llama.cpp tree are compiled, in which groups, with which
//! defines, flags and include directories (LLAMA-FACTS "Building without cmake"). Sources are
//! found by glob rules, not hand lists, so a pin that adds a file (0.1.161's `ggml-cpu/tiled/`)
//! needs no change here.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::cmake::{
    cmake_define_names, cmake_option_default, version_header, CMAKE_DEFINES_NOT_PASSED, CMAKE_FILES,
};
use super::cov;

use crate::error::{IoContext as _, LlamaError};
use crate::pins::{Flag, Pin, PinInfo, Variant};
use crate::tree::{shim_defines as shim_defines_for, tree_version};

/// Bump when the recipe below changes in a way the key does not see.
pub(super) const RECIPE_VERSION: u32 = 1;

/// Flags of the ggml CPU backend group only: `-mfma` elsewhere would let the compiler contract
/// multiply-adds in ggml core and llama and change numerics (LLAMA-FACTS).
pub(super) const X86_CPU_FLAGS: &[&str] =
    &["-msse4.2", "-mf16c", "-mfma", "-mbmi2", "-mavx", "-mavx2"];

/// What one variant flag changes in a build, and what a process needs to run the build: the
/// one table of the flags a label may carry (`+assert`, `+asan`, ...). A flag's compile flags go
/// to the units of its `groups` and to a C reproducer; its link flags to the shared object and
/// to a C reproducer. The release build (no flag) is what users run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlagBuild {
    /// Whether `NDEBUG` is left undefined, so that llama.cpp's `assert`s are compiled in.
    pub drops_ndebug: bool,
    /// Flags of the compile units of `groups`.
    pub compile: &'static [&'static str],
    /// The compile units (`CompileUnit::group`) that take `compile`.
    pub groups: &'static [&'static str],
    /// Flags of every link.
    pub link: &'static [&'static str],
    /// Libraries that must be loaded first in a process that loads the build (as `gcc
    /// -print-file-name` names them): the worker, a Rust binary not linked with them, preloads
    /// them. ASan refuses to start when it is not the first library, and it finds the real
    /// `__cxa_throw` only in a libstdc++ loaded when it starts: without libstdc++ preloaded too,
    /// the first C++ exception llama.cpp throws (and catches, e.g. `llama_io_write_host::write`
    /// on a too-small buffer) ends the process in `AddressSanitizer: CHECK failed:
    /// asan_interceptors.cpp:320 "((__interception::real___cxa_throw)) != (0)"`.
    pub preload: &'static [&'static str],
    /// The runtime's options variable and the options the worker sets in it: stop at the first
    /// report, abort (so the worker's signal report names the trial and step), no leak check
    /// (llama.cpp's process-lifetime allocations are not findings).
    pub options: Option<(&'static str, &'static str)>,
}

/// The row of `flag` in the table of variant flags.
pub const fn flag_build(flag: Flag) -> FlagBuild {
    match flag {
        Flag::Assert => FlagBuild {
            drops_ndebug: true,
            compile: &[],
            groups: &[],
            link: &[],
            preload: &[],
            options: None,
        },
        // -g: ASan's report names file:line only with debug information (gcc's libasan
        // symbolizes with its own libbacktrace); -fno-omit-frame-pointer: its fast unwinder
        // walks frame pointers. llama.cpp's memory sources and the shim only: at -O3 with ASan,
        // ggml took 6 minutes for 13 of its 28 objects and llama.cpp's src/ 31 minutes for 21 of
        // its 189 on this (loaded) 2-core machine; uninstrumented, the rest are the release
        // build's objects, taken from the object cache (docs/usage.md "Variants"). Allocations
        // made elsewhere still get ASan's redzones (malloc is intercepted process-wide);
        // accesses in uninstrumented code are not checked.
        Flag::Asan => FlagBuild {
            drops_ndebug: false,
            compile: &["-fsanitize=address", "-fno-omit-frame-pointer", "-g"],
            groups: SANITIZED_GROUPS,
            link: &["-fsanitize=address"],
            preload: &["libasan.so", "libstdc++.so"],
            options: Some((
                "ASAN_OPTIONS",
                "abort_on_error=1:halt_on_error=1:detect_leaks=0:handle_segv=0:handle_abort=0:symbolize=1",
            )),
        },
        Flag::Ubsan => FlagBuild {
            drops_ndebug: false,
            compile: &["-fsanitize=undefined", "-fno-omit-frame-pointer", "-g"],
            groups: SANITIZED_GROUPS,
            link: &["-fsanitize=undefined"],
            preload: &[],
            options: Some((
                "UBSAN_OPTIONS",
                "abort_on_error=1:halt_on_error=1:print_stacktrace=1:symbolize=1",
            )),
        },
        // The memory sources only, so a point means "memory code reached"; never the shim,
        // which holds the callback itself (build/cov.rs has the flags' reasons).
        Flag::Cov => FlagBuild {
            drops_ndebug: false,
            compile: cov::COV_FLAGS,
            groups: &[MEMORY_GROUP],
            link: &[],
            preload: &[],
            options: None,
        },
    }
}

/// The compile units a sanitizer instruments: llama.cpp's memory and batch sources (split off
/// the `llama` unit into [`MEMORY_GROUP`] when a flag asks for it) and the shim.
const SANITIZED_GROUPS: &[&str] = &[MEMORY_GROUP, "shim"];

/// The unit of llama.cpp's memory sources in a variant that instruments them apart from the rest
/// of llama.cpp.
pub const MEMORY_GROUP: &str = "llama-memory";

/// Whether `rel` (a path relative to the llama.cpp tree) is one of llama.cpp's sources of the
/// memory under audit, which `+asan`, `+ubsan` and `+cov` instrument apart from the rest:
/// `src/llama-kv-cache*.cpp` (the unified cache and the iSWA pair, also the older `-unified`
/// names), `src/llama-memory*.cpp`, `src/llama-batch.cpp` (the batch allocator) and
/// `src/llama-context.cpp` (its state functions). Their headers (`llama-kv-cells.h`) are
/// compiled into them.
pub fn is_memory_source(rel: &str) -> bool {
    let Some(name) = rel.strip_prefix("src/") else {
        return false;
    };
    let Some(stem) = name.strip_suffix(".cpp") else {
        return false;
    };
    stem.starts_with("llama-kv-cache")
        || stem.starts_with("llama-memory")
        || stem == "llama-batch"
        || stem == "llama-context"
}

/// The compile flags of `variant`'s flags for the units of `group` (`None`: a C reproducer's
/// own source, compiled as the shim is: a sanitizer's flags, not `+cov`'s, whose callback only
/// the shim defines), in canonical order.
pub fn variant_compile_flags(variant: Variant, group: Option<&str>) -> Vec<String> {
    variant
        .flags()
        .map(flag_build)
        .filter(|row| row.groups.contains(&group.unwrap_or("shim")))
        .flat_map(|row| row.compile.iter().map(|s| s.to_string()))
        .collect()
}

/// The link flags of `variant`'s flags, in canonical order.
pub fn variant_link_flags(variant: Variant) -> Vec<String> {
    variant
        .flags()
        .flat_map(|f| flag_build(f).link.iter().map(|s| s.to_string()))
        .collect()
}

/// Whether `variant` defines `NDEBUG` (no flag of it keeps the asserts).
pub fn variant_defines_ndebug(variant: Variant) -> bool {
    !variant.flags().any(|f| flag_build(f).drops_ndebug)
}

/// Defines every ggml group gets (`add_compile_definitions` in ggml/src/CMakeLists.txt).
const GGML_DEFINES: &[&str] = &[
    "GGML_SCHED_MAX_COPIES=4",
    "_GNU_SOURCE",
    "_XOPEN_SOURCE=600",
];

/// Folders below `ggml/src/ggml-cpu/` that the CPU group leaves out: `arch/` (per-architecture
/// code; the x86 part is added back), `kleidiai/` (ARM, needs a download), `spacemit/` (RISC-V).
const CPU_SKIP_DIRS: &[&str] = &["arch", "kleidiai", "spacemit"];

/// Source language of a compile unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Lang {
    /// C, `-std=gnu11`.
    C,
    /// C++, `-std=gnu++17`.
    Cxx,
}

impl Lang {
    pub(super) fn suffix(self) -> &'static str {
        match self {
            Lang::C => "c",
            Lang::Cxx => "c++",
        }
    }

    pub(super) fn std(self) -> &'static str {
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

impl Recipe {
    /// The recipe for the tree at `src` and `pin`'s variant.
    pub fn for_tree(src: &Path, pin: &Pin) -> Result<Recipe, LlamaError> {
        let read = |rel: &str| {
            let path = src.join(rel);
            fs::read_to_string(&path).context_io(|| format!("reading {}", path.display()))
        };
        let root_cmake = read("CMakeLists.txt")?;
        let ggml_cmake = read("ggml/CMakeLists.txt")?;
        let llama_version_base = tree_version(&root_cmake, "LLAMA");
        let ggml_version = tree_version(&ggml_cmake, "GGML");
        // cmake appends -dev while the LLAMA_BUILD_IS_DEV option is ON (its default).
        let llama_version = match cmake_option_default(&root_cmake, "LLAMA_BUILD_IS_DEV") {
            Some(true) => format!("{llama_version_base}-dev"),
            _ => llama_version_base.clone(),
        };
        // Without a git checkout cmake's commit is "unknown" for both.
        let commit = "unknown";

        let ndebug: &[&str] = if variant_defines_ndebug(pin.variant) {
            &["NDEBUG"]
        } else {
            &[]
        };
        // Empty for release and +assert, so their recipes (and cache keys) are what they were.
        let sanitize = |group: &str| variant_compile_flags(pin.variant, Some(group));
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
        // src/models/ appeared in crate 0.1.140; older trees keep every model in src/.
        if src.join("src/models").is_dir() {
            llama_cxx.extend(glob_sources(src, "src/models", false, &["cpp"], &[])?);
        }

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
            flags: flags.into_iter().chain(sanitize(group)).collect(),
            includes,
        };
        let mut ggml_cxx_defines = ggml_defines.clone();
        ggml_cxx_defines.push("GGML_USE_CPU".to_string());
        let llama_includes = strings(&["$SRC/src", "$SRC/include", "$SRC/ggml/include", "$GEN"]);
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
                llama_includes,
            ),
        ];
        let mut units = units;
        // A variant that instruments the memory sources alone compiles them as a unit of their
        // own (release and +assert keep one llama unit, and their keys).
        if pin
            .variant
            .flags()
            .any(|f| flag_build(f).groups.contains(&MEMORY_GROUP))
        {
            let at = units
                .iter()
                .position(|u| u.group == "llama")
                .expect("the recipe has a llama unit");
            let (memory, rest): (Vec<String>, Vec<String>) = units[at]
                .sources
                .iter()
                .cloned()
                .partition(|s| is_memory_source(s));
            let mut memory_unit = units[at].clone();
            memory_unit.group = MEMORY_GROUP.to_string();
            memory_unit.sources = memory;
            memory_unit.flags.extend(sanitize(MEMORY_GROUP));
            units[at].sources = rest;
            units.insert(at + 1, memory_unit);
        }
        for u in &units {
            if u.sources.is_empty() {
                return Err(LlamaError::Source {
                    path: src.to_path_buf(),
                    message: format!(
                        "the glob rules found no sources for {} (not a llama.cpp tree of the expected shape?)",
                        u.name()
                    ),
                });
            }
        }

        let mut shim_defines = vec![format!("KVAUDIT_SHIM_PIN=\"{}\"", pin.label())];
        shim_defines.extend(shim_defines_for(&read("include/llama.h")?));
        shim_defines.extend(strings(ndebug));
        let mut shim_sources = vec!["kvaudit_shim.c".to_string()];
        if pin.variant.has(Flag::Cov) {
            shim_sources.push(cov::COV_FILE.to_string());
        }
        let shim = unit(
            "shim",
            Lang::Cxx,
            shim_sources,
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

    pub(super) fn n_sources(&self) -> usize {
        self.units.iter().map(|u| u.sources.len()).sum()
    }
}

pub(super) fn check_tree_versions(pin: &Pin, info: &PinInfo, recipe: &Recipe, src: &Path) {
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

/// The version script of the shared object: the shim's functions and nothing else.
pub(super) const EXPORT_MAP: &str = "{ global: kvaudit_shim_*; local: *; };\n";

/// The flags of the shared-object link of `variant`, `export_map` being a file with
/// [`EXPORT_MAP`].
pub(super) fn link_flags(variant: Variant, export_map: &Path, soname: &str) -> Vec<String> {
    let mut flags = vec![
        "-shared".into(),
        format!("-Wl,-soname,{soname}"),
        format!("-Wl,--version-script={}", export_map.display()),
        // Calls inside the .so bind to its own copies, never to another pin's.
        "-Wl,-Bsymbolic".into(),
        // Without it a missing source file still "links", with undefined symbols.
        "-Wl,--no-undefined".into(),
        "-Wl,--exclude-libs,ALL".into(),
    ];
    flags.extend(variant_link_flags(variant));
    flags
}

/// Define names in the tree's CMake files that the recipe neither passes nor lists in
/// `CMAKE_DEFINES_NOT_PASSED`.
pub fn unknown_cmake_defines(src: &Path, recipe: &Recipe) -> Result<Vec<String>, LlamaError> {
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

/// Files directly in `dir` (or below it, with `recursive`) whose extension is one of `exts`,
/// as paths relative to `root`, sorted. Folders of `dir` named in `skip_top` are left out, and
/// so is every symlink to a directory; a symlink to a file counts as the file.
pub(super) fn glob_sources(
    root: &Path,
    dir: &str,
    recursive: bool,
    exts: &[&str],
    skip_top: &[&str],
) -> Result<Vec<String>, LlamaError> {
    let mut out = Vec::new();
    let mut stack = vec![root.join(dir)];
    while let Some(d) = stack.pop() {
        let entries = fs::read_dir(&d).context_io(|| format!("listing {}", d.display()))?;
        for entry in entries {
            let entry = entry.context_io(|| format!("listing {}", d.display()))?;
            let path = entry.path();
            let kind = entry
                .file_type()
                .context_io(|| format!("reading {}", path.display()))?;
            let is_dir = if kind.is_symlink() {
                // Followed for files only: a link to a directory could lead back up the tree.
                let target = fs::metadata(&path).map_err(|e| LlamaError::Source {
                    path: path.clone(),
                    message: format!("unreadable symlink: {e}"),
                })?;
                if target.is_dir() {
                    continue;
                }
                false
            } else {
                kind.is_dir()
            };
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .to_string_lossy()
                .replace('\\', "/");
            if is_dir {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

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
            "src/llama-batch.cpp",
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
        let asan = Recipe::for_tree(&dir, &Pin::parse("llama.cpp@0.1.156+asan").unwrap()).unwrap();
        let release = Recipe::for_tree(&dir, &Pin::parse("llama.cpp@0.1.156").unwrap()).unwrap();
        fs::remove_dir_all(&dir).ok();
        // +asan: the memory sources are a unit of their own, instrumented with the shim; the
        // rest compile as in the release build (the same objects).
        let asan_units: BTreeMap<String, &CompileUnit> =
            asan.units.iter().map(|u| (u.name(), u)).collect();
        let release_units: BTreeMap<String, &CompileUnit> =
            release.units.iter().map(|u| (u.name(), u)).collect();
        assert_eq!(
            asan_units["llama-memory.c++"].sources,
            ["src/llama-batch.cpp"]
        );
        assert!(asan_units["llama-memory.c++"]
            .flags
            .contains(&"-fsanitize=address".to_string()));
        assert!(asan.shim.flags.contains(&"-fsanitize=address".to_string()));
        for name in ["ggml.c", "ggml-cpu.c++", "llama.c++"] {
            assert_eq!(asan_units[name].flags, release_units[name].flags, "{name}");
        }
        assert!(!release_units.contains_key("llama-memory.c++"));
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
            [
                "src/llama-batch.cpp",
                "src/llama.cpp",
                "src/models/llama.cpp"
            ]
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
}
