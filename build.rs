//! Builds the regression corpus into the binary: every `corpora/*.json` file, in name order, as
//! a table of (file name, `include_str!`) in `$OUT_DIR/corpus.rs`, which `outputs/corpus.rs`
//! includes. So `kvaudit hunt` and `kvaudit merge` classify against the corpus from any folder,
//! as the pins and presets travel with the binary.

use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let dir = root.join("corpora");
    // A folder: cargo looks at every file under it, so an added or removed file lists again.
    println!("cargo:rerun-if-changed=corpora");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
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
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo")).join("corpus.rs");
    std::fs::write(&out, table).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
}
