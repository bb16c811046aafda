//! Builds the regression corpus into the binary: every `corpora/*.json` file, in name order, as
//! a table of (file name, `include_str!`) in `$OUT_DIR/corpus.rs`, and every
//! `corpora/decisions/*.json` (decisions of classes with no reproducer of their own) likewise in
//! `$OUT_DIR/decisions.rs`, which `outputs/corpus.rs` includes. So `kvaudit hunt` and
//! `kvaudit merge` classify against the corpus from any folder, as the pins and presets travel
//! with the binary.

use std::path::{Path, PathBuf};

/// The `.json` files of `dir` (none when it does not exist), in name order, as the source of a
/// `&[(&str, &str)]` of (file name, its text).
fn table(dir: &Path) -> String {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".json"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("{}: {e}", dir.display()),
    };
    names.sort();
    let mut table = String::from("&[\n");
    for name in &names {
        let path = dir.join(name);
        let path = path
            .to_str()
            .unwrap_or_else(|| panic!("{}: not UTF-8", path.display()));
        table.push_str(&format!("    ({name:?}, include_str!({path:?})),\n"));
    }
    table.push_str("]\n");
    table
}

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let dir = root.join("corpora");
    // Folders: cargo looks at every file under them, so an added or removed file lists again.
    println!("cargo:rerun-if-changed=corpora");
    println!("cargo:rerun-if-changed=corpora/decisions");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"));
    for (from, to) in [
        (dir.clone(), "corpus.rs"),
        (dir.join("decisions"), "decisions.rs"),
    ] {
        let path = out.join(to);
        std::fs::write(&path, table(&from)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}
