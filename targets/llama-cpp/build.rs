//! Builds the fixes into the crate: every `corpora/fixes/NAME.patch` of the repository with its
//! `NAME.json`, in name order, as a table of (name, `include_str!` of each) in
//! `$OUT_DIR/fixes.rs`, which `src/fixes.rs` includes. So `llama.cpp@VERSION+fix:NAME` is known
//! by name in every binary that links this crate, as the pins of `pins.toml` are.

use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let dir = manifest.join("../../corpora/fixes");
    // A folder: cargo looks at every file under it, so an added or removed fix lists again.
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e} (the fixes this crate builds in)", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter_map(|n| n.strip_suffix(".patch").map(str::to_string))
        .collect();
    names.sort();
    let mut table = String::from("&[\n");
    for name in &names {
        let text = |ext: &str| {
            let path = dir.join(format!("{name}.{ext}"));
            if !path.is_file() {
                panic!("{}: missing beside {name}.patch", path.display());
            }
            let path = path.canonicalize().expect("an existing file");
            format!("include_str!({:?})", path.to_str().expect("a UTF-8 path"))
        };
        table.push_str(&format!(
            "    EmbeddedFix {{ name: {name:?}, json: {}, patch: {} }},\n",
            text("json"),
            text("patch")
        ));
    }
    table.push_str("]\n");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo")).join("fixes.rs");
    std::fs::write(&out, table).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
}
