//! What a llama.cpp source tree says about itself, read without building it: where its root is
//! (a tree, or an unpacked `llama-cpp-sys-2` crate with the tree in `llama.cpp/`), its version
//! numbers (from its CMake files) and the facts kvaudit needs to drive and parse it (the state
//! format, the `seq_pos` bookkeeping), so that `llama.cpp@src:PATH` works on a tree no pin
//! records.

use std::fs;
use std::path::{Path, PathBuf};

use super::error::LlamaError;

/// Accepts a llama.cpp tree or a directory holding one in `llama.cpp/`; returns it canonical.
pub fn normalize_tree(dir: &Path) -> Result<PathBuf, LlamaError> {
    let unreadable = |error: std::io::Error| LlamaError::Source {
        path: dir.to_path_buf(),
        message: format!("cannot read this llama.cpp tree: {error}"),
    };
    // Resolved and listed before anything else, so that a symlink loop or a directory without
    // read permission is said as such, not as "not a llama.cpp tree".
    let resolved = dir.canonicalize().map_err(unreadable)?;
    fs::read_dir(&resolved).map_err(unreadable)?;
    for c in [resolved.clone(), resolved.join("llama.cpp")] {
        if c.join("include/llama.h").is_file() && c.join("ggml/include/ggml.h").is_file() {
            return c.canonicalize().map_err(unreadable);
        }
    }
    Err(LlamaError::Source {
        path: dir.to_path_buf(),
        message: "not a llama.cpp tree: no include/llama.h and ggml/include/ggml.h in it or in \
                  its llama.cpp/ subdirectory"
            .into(),
    })
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

/// What a tree's CMake files carry as its `<prefix>` version: `MAJOR.MINOR.PATCH`, or
/// [`UNVERSIONED`] for trees before llama.cpp versioned its CMake files (crate versions before
/// 0.1.156 for llama, 0.1.123 for ggml), whose cmake computes `0.0.<git commit count>`, which an
/// unpacked crate does not have.
pub fn tree_version(cmake: &str, prefix: &str) -> String {
    cmake_version(cmake, prefix).unwrap_or_else(|| UNVERSIONED.to_string())
}

/// The version of a tree whose CMake files set none.
pub const UNVERSIONED: &str = "0.0.0";

/// The value of the first `set(NAME value)` in a CMake file.
pub(crate) fn cmake_set_value(cmake: &str, name: &str) -> Option<String> {
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

/// What a tree's own files say: its llama and ggml versions, and the facts pins.toml records
/// for a pin, read from the sources they describe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeFacts {
    /// `LLAMA_VERSION_MAJOR.MINOR.PATCH` of its CMakeLists.txt.
    pub llama_version: String,
    /// `GGML_VERSION_MAJOR.MINOR.PATCH` of ggml/CMakeLists.txt.
    pub ggml_version: String,
    /// The `llama-cpp-sys-2` version when the tree is an unpacked crate (its Cargo.toml).
    pub crate_version: Option<String>,
    /// `#define LLAMA_STATE_SEQ_VERSION` in include/llama.h.
    pub state_seq_version: u32,
    /// Whether `src/llama-kv-cache.cpp` writes `n_rot_k` / `n_rot_v` into the state.
    pub kv_state_has_n_rot: bool,
    /// The type of `llama_kv_cells::seq_pos`: `pos-set`, `refcount-map`, `pos-cell-set` or
    /// `unknown`.
    pub seq_pos_bookkeeping: String,
    /// Whether the cache's state starts with `u32 n_stream` (crate 0.1.113 on); before, one
    /// stream's cells follow at once, and its K/V header even when it has no cells.
    pub kv_state_has_n_stream: bool,
    /// Whether `state_seq_get_data` writes `u32 magic, i32 seq_id` first (crate 0.1.147 on).
    pub state_seq_has_header: bool,
    /// Whether `state_write_data` writes the last batch's outputs, logits and embeddings
    /// before the memory (crate versions before 0.1.137).
    pub whole_state_has_outputs: bool,
    /// Whether `llama_kv_cache::state_write` leaves the cells the sliding window masks out of a
    /// per-sequence dump (crate 0.1.147 on).
    pub swa_seq_dump_masks: bool,
    /// Whether `llama_context_params` has `kv_unified` (crate 0.1.113 on); the shim is compiled
    /// with `KVAUDIT_SHIM_NO_KV_UNIFIED` when it has not ([`shim_defines`]).
    pub has_kv_unified: bool,
}

/// The defines the shim needs for the API of a tree whose include/llama.h is `header` (see the
/// top of kvaudit_shim.c): what the header alone cannot tell the preprocessor.
pub fn shim_defines(header: &str) -> Vec<String> {
    let mut defines = Vec::new();
    if !header.contains("kv_unified") {
        defines.push("KVAUDIT_SHIM_NO_KV_UNIFIED".to_string());
    }
    // `n_rs_seq` (recurrent rollback) is in llama_context_params from some version between
    // crates 0.1.112 and 0.1.156 on (llama.h:356 in 0.1.156, :370 in 0.1.161).
    if !header.contains("n_rs_seq") {
        defines.push("KVAUDIT_SHIM_NO_RS_SEQ".to_string());
    }
    defines
}

/// Reads `tree`'s facts (a root as [`normalize_tree`] returns it).
pub fn tree_facts(tree: &Path) -> Result<TreeFacts, LlamaError> {
    let read = |rel: &str| {
        fs::read_to_string(tree.join(rel)).map_err(|e| LlamaError::Source {
            path: tree.join(rel),
            message: format!("cannot read this file of the llama.cpp tree: {e}"),
        })
    };
    let missing = |what: &str, rel: &str| LlamaError::Source {
        path: tree.join(rel),
        message: format!("no {what} in it: is this a llama.cpp tree kvaudit can drive?"),
    };
    let llama_version = tree_version(&read("CMakeLists.txt")?, "LLAMA");
    let ggml_version = tree_version(&read("ggml/CMakeLists.txt")?, "GGML");
    let header = read("include/llama.h")?;
    if !header.contains("llama_memory_seq_cp") {
        return Err(LlamaError::Source {
            path: tree.join("include/llama.h"),
            message:
                "no llama_memory_seq_cp in it: this llama.cpp predates the llama_memory_* API \
                      (crate llama-cpp-sys-2 0.1.109), which the shim drives"
                    .into(),
        });
    }
    let state_seq_version = header
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("#define LLAMA_STATE_SEQ_VERSION")?
                .trim()
                .parse::<u32>()
                .ok()
        })
        .ok_or_else(|| missing("#define LLAMA_STATE_SEQ_VERSION", "include/llama.h"))?;
    // llama-kv-cache-unified.cpp until crate 0.1.121, llama-kv-cache.cpp since.
    let kv_cache_file = ["src/llama-kv-cache.cpp", "src/llama-kv-cache-unified.cpp"]
        .into_iter()
        .find(|rel| tree.join(rel).is_file())
        .unwrap_or("src/llama-kv-cache.cpp");
    let kv_cache = read(kv_cache_file)?;
    let cells = read("src/llama-kv-cells.h")?;
    let context = read("src/llama-context.cpp")?;
    let seq_pos_bookkeeping = if cells.contains("std::set<llama_pos> seq_pos[") {
        "pos-set"
    } else if cells.contains("std::map<llama_pos, int> seq_pos[") {
        "refcount-map"
    } else if cells.contains("std::set<std::pair<llama_pos, uint32_t>> seq_pos[") {
        "pos-cell-set"
    } else {
        "unknown"
    };
    let crate_version = tree.parent().and_then(|p| {
        let toml = fs::read_to_string(p.join("Cargo.toml")).ok()?;
        let mut in_package = false;
        toml.lines().map(str::trim).find_map(|l| {
            if l.starts_with('[') {
                in_package = l == "[package]";
                return None;
            }
            let v = l.strip_prefix("version")?.trim_start().strip_prefix('=')?;
            in_package.then(|| v.trim().trim_matches('"').to_string())
        })
    });
    Ok(TreeFacts {
        llama_version,
        ggml_version,
        crate_version,
        state_seq_version,
        kv_state_has_n_rot: kv_cache.contains("io.write(&n_rot_k"),
        seq_pos_bookkeeping: seq_pos_bookkeeping.to_string(),
        kv_state_has_n_stream: kv_cache.contains("io.write(&n_stream"),
        has_kv_unified: header.contains("kv_unified"),
        state_seq_has_header: context.contains("io.write(&io_magic"),
        whole_state_has_outputs: context.contains("writing logits"),
        swa_seq_dump_masks: kv_cache
            .contains("const bool is_masked = llama_hparams::is_masked_swa"),
    })
}

/// Whether `path` may appear in a label: kvaudit passes labels to the shim's build as a C string
/// and to worker processes as an argument, so quotes, backslashes and control characters are
/// refused rather than escaped.
pub fn label_safe(path: &str) -> bool {
    !path.is_empty()
        && !path
            .chars()
            .any(|c| c.is_control() || c == '"' || c == '\\')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fake_tree_says_its_versions_and_facts() {
        let dir = tempfile::tempdir().unwrap();
        let crate_dir = dir.path();
        let t = crate_dir.join("llama.cpp");
        for d in ["include", "ggml/include", "src"] {
            fs::create_dir_all(t.join(d)).unwrap();
        }
        fs::write(
            crate_dir.join("Cargo.toml"),
            "[package]\nname = \"llama-cpp-sys-2\"\nversion = \"0.1.170\"\n[dependencies]\nversion = \"1\"\n",
        )
        .unwrap();
        fs::write(
            t.join("CMakeLists.txt"),
            "set(LLAMA_VERSION_MAJOR 0)\nset(LLAMA_VERSION_MINOR 7)\nset(LLAMA_VERSION_PATCH 1)\n",
        )
        .unwrap();
        fs::write(
            t.join("ggml/CMakeLists.txt"),
            "set(GGML_VERSION_MAJOR 0)\nset(GGML_VERSION_MINOR 30)\nset(GGML_VERSION_PATCH 0)\n",
        )
        .unwrap();
        fs::write(
            t.join("include/llama.h"),
            "#define LLAMA_STATE_SEQ_VERSION 4\nllama_memory_seq_cp kv_unified\n",
        )
        .unwrap();
        fs::write(t.join("ggml/include/ggml.h"), "").unwrap();
        fs::write(
            t.join("src/llama-kv-cache.cpp"),
            "io.write(&n_stream, 4); io.write(&n_rot_k, 4);\n\
             const bool is_masked = llama_hparams::is_masked_swa(n_swa, swa_type, p, m);",
        )
        .unwrap();
        fs::write(
            t.join("src/llama-kv-cells.h"),
            "std::set<std::pair<llama_pos, uint32_t>> seq_pos[LLAMA_MAX_SEQ];",
        )
        .unwrap();
        fs::write(t.join("src/llama-context.cpp"), "io.write(&io_magic, 4);").unwrap();
        let root = normalize_tree(crate_dir).unwrap();
        assert_eq!(root, t.canonicalize().unwrap());
        let f = tree_facts(&root).unwrap();
        assert_eq!(
            (f.llama_version.as_str(), f.ggml_version.as_str()),
            ("0.7.1", "0.30.0")
        );
        assert_eq!(f.crate_version.as_deref(), Some("0.1.170"));
        assert_eq!((f.state_seq_version, f.kv_state_has_n_rot), (4, true));
        assert_eq!(f.seq_pos_bookkeeping, "pos-cell-set");
        assert!(f.kv_state_has_n_stream && f.has_kv_unified);
        assert!(shim_defines("bool kv_unified; uint32_t n_rs_seq;").is_empty());
        assert_eq!(shim_defines("bool kv_unified;"), ["KVAUDIT_SHIM_NO_RS_SEQ"]);
        assert!(f.state_seq_has_header && !f.whole_state_has_outputs && f.swa_seq_dump_masks);
        fs::write(t.join("include/llama.h"), "llama_memory_seq_cp").unwrap();
        let err = tree_facts(&root).unwrap_err().to_string();
        assert!(err.contains("LLAMA_STATE_SEQ_VERSION"), "{err}");
        fs::write(
            t.join("include/llama.h"),
            "#define LLAMA_STATE_SEQ_VERSION 2\n",
        )
        .unwrap();
        let err = tree_facts(&root).unwrap_err().to_string();
        assert!(err.contains("predates the llama_memory_* API"), "{err}");
        // A tree of crate 0.1.112's shape: no versions in its CMake files, the cache in
        // llama-kv-cache-unified.cpp without n_stream, a std::set per sequence, no kv_unified.
        fs::write(
            t.join("include/llama.h"),
            "#define LLAMA_STATE_SEQ_VERSION 2\nllama_memory_seq_cp\n",
        )
        .unwrap();
        fs::write(t.join("CMakeLists.txt"), "").unwrap();
        fs::remove_file(t.join("src/llama-kv-cache.cpp")).unwrap();
        fs::write(
            t.join("src/llama-kv-cache-unified.cpp"),
            "io.write(&cell_count, 4);",
        )
        .unwrap();
        fs::write(
            t.join("src/llama-kv-cells.h"),
            "std::set<llama_pos> seq_pos[LLAMA_MAX_SEQ];",
        )
        .unwrap();
        fs::write(t.join("src/llama-context.cpp"), "// - writing logits").unwrap();
        let f = tree_facts(&root).unwrap();
        assert!(!f.state_seq_has_header && f.whole_state_has_outputs && !f.swa_seq_dump_masks);
        assert_eq!(f.llama_version, UNVERSIONED);
        assert_eq!(f.seq_pos_bookkeeping, "pos-set");
        assert!(!f.kv_state_has_n_stream && !f.has_kv_unified && !f.kv_state_has_n_rot);
        assert_eq!(
            shim_defines("bool flash_attn;"),
            ["KVAUDIT_SHIM_NO_KV_UNIFIED", "KVAUDIT_SHIM_NO_RS_SEQ"]
        );
        assert!(label_safe("/home/me/llama.cpp") && !label_safe("/a\"b") && !label_safe(""));
    }
}
