//! `cargo bench --bench rebuild`: what a llama.cpp developer waits for between an edit and the
//! next audit of their own tree.
//!
//! Copies a pin's tree (default 0.1.161, `--pin V`) to a temporary directory and times
//! `ensure_built` over it three times: the copy as it is (every object is in the object cache
//! from the pin's own build, whose keys do not depend on where a tree is: a link only), after
//! `touch` of `src/llama-kv-cache.cpp` (file times are not part of any key: nothing to do), and
//! after an edit of that file (one compile and a link; the edit is new every run, and its entry is
//! removed afterwards). Figures only; asserts nothing. The pin's own build comes first if it is
//! not cached (not timed here: see `kvaudit target build`).

use std::fs;
use std::path::Path;
use std::time::Instant;

use kvaudit::targets::llama::build::{cache_root, ensure_built, locate_or_fetch, BuildSpec};
use kvaudit::targets::llama::pins::Pin;

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    fs::create_dir_all(to)?;
    for e in fs::read_dir(from)? {
        let e = e?;
        let ty = e.file_type()?;
        if ty.is_dir() {
            copy_tree(&e.path(), &to.join(e.file_name()))?;
        } else if ty.is_file() {
            fs::copy(e.path(), to.join(e.file_name()))?;
        }
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let version = args
        .iter()
        .position(|a| a == "--pin")
        .and_then(|i| args.get(i + 1))
        .map_or("0.1.161", String::as_str);
    let pin = Pin::parse(&format!("llama.cpp@{version}")).expect("a known pin");
    ensure_built(&BuildSpec::new(pin.clone()), true).expect("the pin builds");
    let cache = cache_root().expect("a cache root");
    let tree = locate_or_fetch(&pin.info().expect("pin info"), &cache, true).expect("its tree");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let copy = dir.path().join("llama.cpp");
    copy_tree(&tree, &copy).expect("copying the tree");
    let spec = BuildSpec {
        llama_src: Some(copy.clone()),
        ..BuildSpec::new(pin.clone())
    };
    let edited = copy.join("src/llama-kv-cache.cpp");
    println!("rebuilds of a copy of {pin}'s tree ({}):", copy.display());
    let step = |what: &str| {
        let t = Instant::now();
        let built = ensure_built(&spec, false).expect("the copy builds");
        if built.fresh {
            // This run's edit made this entry: gone again, so the cache does not grow per run.
            std::fs::remove_dir_all(&built.dir).ok();
        }
        let compiled = if built.fresh {
            format!(
                "{} of {} sources compiled, linked",
                built.manifest.compiled,
                built.manifest.objects.len()
            )
        } else {
            "cached entry, nothing compiled or linked".to_string()
        };
        println!(
            "  {what:<34} {:>7.2} s  ({compiled})",
            t.elapsed().as_secs_f64()
        );
    };
    step("first build of the copy");
    let f = fs::File::options()
        .append(true)
        .open(&edited)
        .expect("the file");
    f.set_modified(std::time::SystemTime::now())
        .expect("touching it");
    drop(f);
    step("after touch src/llama-kv-cache.cpp");
    let mut text = fs::read_to_string(&edited).expect("reading it");
    // New every run (the time), so the edit is never in the cache already.
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    text.push_str(&format!(
        "\n// edited by kvaudit's rebuild benchmark {nonce}\n"
    ));
    fs::write(&edited, text).expect("editing it");
    step("after an edit of that file");
}
