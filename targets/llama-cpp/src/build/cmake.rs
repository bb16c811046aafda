//! Reading llama.cpp's CMake files without cmake: the version numbers and options the recipe
//! needs, the headers cmake's `configure_file` would generate, and the define names of every
//! `add_compile_definitions` / `target_compile_definitions` call, to warn when a pin adds one
//! the recipe neither passes nor knows to be irrelevant.

use std::collections::BTreeSet;

pub use crate::tree::cmake_version;

/// Names in the pins' CMake `add_compile_definitions` / `target_compile_definitions` calls
/// that the recipe deliberately does not pass, with the reason. A name in a pin's CMake files
/// that is neither passed nor listed here gets a warning: a left-out define switches a feature
/// off silently.
pub(super) const CMAKE_DEFINES_NOT_PASSED: &[(&str, &str)] = &[
    ("_CRT_SECURE_NO_WARNINGS", "Windows only"),
    (
        "_WIN32_WINNT",
        "Windows only (crate versions before 0.1.113)",
    ),
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

/// The contents cmake's `configure_file` gives `ggml-version.h` / `llama-version.h`
/// (`prefix` is `GGML` or `LLAMA`). 0.1.161 includes these; 0.1.156 takes `-D` macros, and both
/// are passed with identical values, which the preprocessor accepts as a benign redefinition.
pub fn version_header(prefix: &str, version: &str, commit: &str) -> String {
    format!("#pragma once\n\n#define {prefix}_VERSION \"{version}\"\n#define {prefix}_COMMIT  \"{commit}\"\n")
}

/// The default of `option(NAME "doc" ON|OFF)`.
pub(super) fn cmake_option_default(cmake: &str, name: &str) -> Option<bool> {
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
pub(super) const CMAKE_FILES: &[&str] = &[
    "CMakeLists.txt",
    "src/CMakeLists.txt",
    "ggml/CMakeLists.txt",
    "ggml/src/CMakeLists.txt",
    "ggml/src/ggml-cpu/CMakeLists.txt",
];

#[cfg(test)]
mod tests {
    use super::super::fetch::{cargo_home, find_in_registry};
    use super::super::recipe::{unknown_cmake_defines, Recipe};
    use super::*;
    use crate::pins::{Pin, Variant};

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
    fn the_pins_cmake_defines_are_all_accounted_for() {
        // Runs against the unpacked pins when cargo's registry has them; says so when not.
        for info in crate::pins::known_pins().unwrap().values() {
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
                variant: Variant::RELEASE,
                tree: None,
                fixes: Vec::new(),
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
