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

use crate::error::{IoContext as _, LlamaError};
use crate::pins::{Pin, PinInfo, Variant};
use crate::tree::{shim_defines as shim_defines_for, tree_version};

/// Bump when the recipe below changes in a way the key does not see.
pub(super) const RECIPE_VERSION: u32 = 1;

/// Flags of the ggml CPU backend group only: `-mfma` elsewhere would let the compiler contract
/// multiply-adds in ggml core and llama and change numerics (LLAMA-FACTS).
pub(super) const X86_CPU_FLAGS: &[&str] =
    &["-msse4.2", "-mf16c", "-mfma", "-mbmi2", "-mavx", "-mavx2"];

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

/// The flags of the shared-object link, `export_map` being a file with [`EXPORT_MAP`].
pub(super) fn link_flags(export_map: &Path, soname: &str) -> Vec<String> {
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
}
