//! Real builds of the llama.cpp pins, for the integration-test binary to wire in.
//!
//! These are plain functions, not tests: `main.rs` decides when to run them (a first build
//! takes minutes per pin and variant; later calls hit the cache in `$KVAUDIT_CACHE_DIR`).
//! They check what LLAMA-FACTS states about the pins, against the real builds:
//! - every pin's release build compiles through `kvaudit::targets::llama::build`, exports only the
//!   shim's symbols, and loads side by side with the others in one process;
//! - each shim reports its pin label, ABI and `LLAMA_STATE_SEQ_VERSION` as pins.toml records;
//! - the doubled same-stream `seq_cp` leaves seq 1 at pos_min/max 0/2 with no serialized cells
//!   on 0.1.156 (and the next decode into seq 1 at pos 0 fails with -1), and at -1/-1 on
//!   0.1.161 (the decode succeeds);
//! - a cache entry whose library was changed is refused with its hashes, not loaded or rebuilt;
//! - builds are keyed by contents: a copy of a tree or a `touch` rebuilds nothing, an edit
//!   compiles the one file it touches.

use std::path::Path;

use anyhow::{bail, ensure, Context as _, Result};
use kvaudit::targets::llama::build::{ensure_built, BuildSpec, BuiltShim, SO_NAME};
use kvaudit::targets::llama::ffi::LlamaShim;
use kvaudit::targets::llama::pins::{known_pins, Pin, Variant, REFERENCE_PINS};

/// Builds (or finds in the cache) the release build of both reference pins, loads them into
/// this process, and checks each one's identity against pins.toml.
pub fn build_and_load_both_pins() -> Result<Vec<(BuiltShim, LlamaShim)>> {
    let mut loaded = Vec::new();
    for version in REFERENCE_PINS {
        let info = known_pins()?
            .get(version)
            .with_context(|| format!("pins.toml has no {version}"))?;
        let pin = Pin {
            version: version.to_string(),
            variant: Variant::RELEASE,
            tree: None,
            fixes: Vec::new(),
        };
        let built = ensure_built(&BuildSpec::new(pin.clone()), false)
            .with_context(|| format!("building {pin}"))?;
        let shim = LlamaShim::load_built(&built)?;
        ensure!(
            shim.version() == pin.label(),
            "{}: reports {}",
            pin,
            shim.version()
        );
        ensure!(
            !shim.assertions_enabled(),
            "{pin}: release build has assertions enabled"
        );
        ensure!(
            shim.state_seq_format() == info.state_seq_version as i32,
            "{pin}: LLAMA_STATE_SEQ_VERSION {} but pins.toml says {}",
            shim.state_seq_format(),
            info.state_seq_version
        );
        exports_only_shim_symbols(&built.so_path)?;
        loaded.push((built, shim));
    }
    ensure!(loaded.len() >= 2, "pins.toml should hold at least two pins");
    Ok(loaded)
}

/// `nm -D --defined-only` lists nothing but `kvaudit_shim_*`.
pub fn exports_only_shim_symbols(so: &Path) -> Result<()> {
    let out = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(so)
        .output()
        .context("running nm (binutils) to list the exports")?;
    ensure!(out.status.success(), "nm -D {} failed", so.display());
    let text = String::from_utf8_lossy(&out.stdout);
    let symbols: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    ensure!(!symbols.is_empty(), "{} exports nothing", so.display());
    let foreign: Vec<&&str> = symbols
        .iter()
        .filter(|s| !s.starts_with("kvaudit_shim_"))
        .collect();
    ensure!(
        foreign.is_empty(),
        "{} also exports {foreign:?}",
        so.display()
    );
    Ok(())
}

/// What the doubled `seq_cp` scenario leaves behind on one release build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoubledSeqCp {
    /// `seq_pos_min(1)` after the scenario.
    pub pos_min: i32,
    /// `seq_pos_max(1)` after the scenario.
    pub pos_max: i32,
    /// Cell count in `state_seq_get(1)` (first stream).
    pub serialized_cells: u32,
    /// `llama_decode` of one token into seq 1 at position 0 afterwards.
    pub decode_rc: i32,
}

/// LLAMA-FACTS "What the seed's reproducer does": `n_seq_max = 4`, `kv_unified`, positions 0..6
/// into seq 0, `seq_cp(0, 1, 0, 3)` twice, `seq_keep(0)`. Only for release builds: `+assert`
/// builds abort at the second `seq_cp`.
pub fn doubled_seq_cp(shim: &LlamaShim, model: &Path) -> Result<DoubledSeqCp> {
    let setup = kvaudit::base::op::Setup {
        n_ctx: 256,
        n_seq_max: 4,
        kv_unified: true,
        ..Default::default()
    };
    let params = kvaudit::targets::llama::context_params(setup.settings());
    let mut ctx = shim.open(model, &params)?;
    let tokens: Vec<i32> = (1..=7).collect();
    let positions: Vec<i32> = (0..7).collect();
    let seqs: Vec<&[i32]> = vec![&[0]; 7];
    let rc = ctx.decode(&tokens, Some(&positions), &seqs)?;
    ensure!(
        rc == 0,
        "{}: initial decode returned {rc}: {}",
        shim.version(),
        ctx.last_error()
    );
    ctx.seq_cp(0, 1, 0, 3)?;
    ctx.seq_cp(0, 1, 0, 3)?;
    ctx.seq_keep(0)?;
    let state = ctx.state_seq_get(1)?;
    ensure!(state.len() >= 16, "state of seq 1 is {} bytes", state.len());
    let word = |i: usize| u32::from_le_bytes([state[i], state[i + 1], state[i + 2], state[i + 3]]);
    ensure!(word(0) == 0xaf14_3cd8, "state magic {:08x}", word(0));
    Ok(DoubledSeqCp {
        pos_min: ctx.seq_pos_min(1)?,
        pos_max: ctx.seq_pos_max(1)?,
        serialized_cells: word(12),
        decode_rc: ctx.decode(&[5], Some(&[0]), &[&[1]])?,
    })
}

/// Runs [`doubled_seq_cp`] on the release shims of [`build_and_load_both_pins`] and compares
/// with LLAMA-FACTS.
pub fn doubled_seq_cp_matches_llama_facts(model: &Path) -> Result<()> {
    for (built, shim) in build_and_load_both_pins()? {
        let got = doubled_seq_cp(&shim, model)?;
        let want = match built.pin.version.as_str() {
            // seq_pos kept a reference count per position: the stale entry survives.
            "0.1.156" => DoubledSeqCp {
                pos_min: 0,
                pos_max: 2,
                serialized_cells: 0,
                decode_rc: -1,
            },
            "0.1.161" => DoubledSeqCp {
                pos_min: -1,
                pos_max: -1,
                serialized_cells: 0,
                decode_rc: 0,
            },
            other => bail!("no expectation recorded for llama.cpp@{other}"),
        };
        ensure!(
            got == want,
            "{}: got {got:?}, LLAMA-FACTS says {want:?}",
            built.pin
        );
    }
    Ok(())
}

/// A library that answers the ABI probe with 99 is refused with an error naming both numbers.
pub fn wrong_abi_is_refused() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("kvaudit-it-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let src = dir.join("fake.c");
    let so = dir.join("libfake.so");
    std::fs::write(&src, "int kvaudit_shim_abi_version(void) { return 99; }\n")?;
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .status()?;
    anyhow::ensure!(status.success(), "cc could not build the fake library");
    let err = match LlamaShim::load(&so) {
        Ok(_) => anyhow::bail!("a shim with ABI 99 was accepted"),
        Err(e) => format!("{e:#}"),
    };
    let _ = std::fs::remove_dir_all(&dir);
    anyhow::ensure!(
        err.contains("99") && err.contains("ABI"),
        "unexpected error: {err}"
    );
    Ok(())
}

/// A cache entry whose library changed after it was built is refused, not loaded and not
/// rebuilt: the release build of the first pin is copied into a fresh cache, one byte of its
/// `libkvaudit_shim.so` is flipped, and `ensure_built` over that cache must fail with one line
/// naming the file, the recorded and the actual sha256.
pub fn tampered_entry_is_refused() -> Result<()> {
    let (pin, _) = first_release_pin()?;
    let built = ensure_built(&BuildSpec::new(pin.clone()), false)
        .with_context(|| format!("building {pin}"))?;
    let cache = tempfile::tempdir()?;
    let entry_name = built.dir.file_name().context("entry without a name")?;
    let copy = cache.path().join("llama.cpp").join(entry_name);
    copy_dir(&built.dir, &copy)?;
    let spec = BuildSpec {
        cache_dir: Some(cache.path().to_path_buf()),
        ..BuildSpec::new(pin.clone())
    };
    // The copy is a valid entry of the same key: found, not built again.
    let found = ensure_built(&spec, false)?;
    ensure!(
        !found.fresh && found.dir == copy,
        "the copied entry was not taken from the cache: {}",
        found.dir.display()
    );

    let so = copy.join(SO_NAME);
    let mut bytes = std::fs::read(&so)?;
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    std::fs::write(&so, &bytes)?;
    let actual = kvaudit::base::files::file_sha256(&so)?;
    let err = match ensure_built(&spec, false) {
        Ok(b) => bail!(
            "a tampered entry was accepted ({}, fresh: {})",
            b.so_path.display(),
            b.fresh
        ),
        Err(e) => e.to_string(),
    };
    ensure!(
        err.lines().count() == 1
            && err.contains(&so.display().to_string())
            && err.contains(&built.manifest.so_sha256)
            && err.contains(&actual),
        "unexpected refusal: {err}"
    );
    // Refused, not replaced: the tampered bytes are still there.
    ensure!(std::fs::read(&so)? == bytes, "the entry was rebuilt");
    Ok(())
}

/// The release build of the first reference pin, and what pins.toml records of it.
fn first_release_pin() -> Result<(Pin, &'static kvaudit::targets::llama::pins::PinInfo)> {
    let version = REFERENCE_PINS[0];
    let info = known_pins()?
        .get(version)
        .context("pins.toml has no first reference pin")?;
    let pin = Pin {
        version: version.to_string(),
        variant: Variant::RELEASE,
        tree: None,
        fixes: Vec::new(),
    };
    Ok((pin, info))
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Edits the llama.cpp tree at `copy` to bring back a stale-index bug: the keeping branch of
/// llama_kv_cells::seq_keep, for a cell the kept sequence shares,
/// `if (seq[i].test(seq_id)) { seq_pos_rm(i); ...`, drops the cell from every other sequence's
/// position index; without that line the other sequences keep a stale entry (the seed's I1
/// symptom).
fn reintroduce_stale_index_bug(copy: &Path) -> Result<()> {
    let cells = copy.join("src/llama-kv-cells.h");
    let source = std::fs::read_to_string(&cells)?;
    let needle = "if (seq[i].test(seq_id)) {\n            seq_pos_rm(i);\n";
    ensure!(
        source.contains(needle),
        "{} changed: the test's edit no longer applies",
        cells.display()
    );
    std::fs::write(
        &cells,
        source.replacen(needle, "if (seq[i].test(seq_id)) {\n", 1),
    )?;
    Ok(())
}

/// Builds are keyed by contents, and objects are cached one by one: a copy of the first pin's
/// tree is the pin's own build (no compile, no link), a `touch` changes nothing, and an edit of
/// `src/llama-kv-cache.cpp` compiles that one file and links. The edit carries this run's time,
/// so it is new every run; the entry it makes is removed at the end.
pub fn an_edit_recompiles_one_file_and_a_touch_nothing() -> Result<()> {
    let (pin, info) = first_release_pin()?;
    let own = ensure_built(&BuildSpec::new(pin.clone()), false)?;
    let cache = kvaudit::targets::llama::build::cache_root()?;
    let tree = kvaudit::targets::llama::build::locate_or_fetch(info, &cache, false)?;
    let dir = tempfile::tempdir()?;
    let copy = dir.path().join("llama.cpp");
    copy_dir(&tree, &copy)?;
    let spec = BuildSpec {
        llama_src: Some(copy.clone()),
        ..BuildSpec::new(pin.clone())
    };
    let first = ensure_built(&spec, false)?;
    ensure!(
        !first.fresh && first.dir == own.dir,
        "a copy of the pin's tree was built again ({})",
        first.dir.display()
    );
    let edited = copy.join("src/llama-kv-cache.cpp");
    let f = std::fs::File::options().append(true).open(&edited)?;
    f.set_modified(std::time::SystemTime::now())?;
    drop(f);
    let touched = ensure_built(&spec, false)?;
    ensure!(
        !touched.fresh && touched.dir == own.dir,
        "a touch rebuilt the tree"
    );
    let mut text = std::fs::read_to_string(&edited)?;
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    text.push_str(&format!("\n// kvaudit test edit {}\n", nonce.as_nanos()));
    std::fs::write(&edited, text)?;
    let rebuilt = ensure_built(&spec, false)?;
    let made = rebuilt.dir.clone();
    let outcome = (
        rebuilt.fresh,
        rebuilt.manifest.compiled,
        rebuilt.dir != own.dir,
    );
    std::fs::remove_dir_all(&made).ok();
    ensure!(
        outcome == (true, 1, true),
        "after one edit: fresh {}, {} sources compiled, new entry {} (expected true, 1, true)",
        outcome.0,
        outcome.1,
        outcome.2
    );
    Ok(())
}

/// A developer's tree as a target: `kvaudit replay corpora --target llama.cpp@src:COPY` over a
/// copy of the newest pin's tree confirms every expectation (held to that pin's, its baseline),
/// and after the copy is edited to bring back a stale-index bug (`seq_keep` keeping a shared cell
/// without dropping it from the other sequences' position index, the seed's I1 symptom) it
/// reports the I1 corpus entry REGRESSED and exits 1.
pub fn a_source_tree_replays_the_corpus_and_catches_a_reintroduced_bug() -> Result<()> {
    let (version, info) = known_pins()?
        .iter()
        .max_by_key(|(v, _)| kvaudit::targets::llama::pins::version_key(v))
        .context("pins.toml holds no pin")?;
    let pin = Pin {
        version: version.clone(),
        variant: Variant::RELEASE,
        tree: None,
        fixes: Vec::new(),
    };
    ensure_built(&BuildSpec::new(pin.clone()), false)?;
    let cache = kvaudit::targets::llama::build::cache_root()?;
    let tree = kvaudit::targets::llama::build::locate_or_fetch(info, &cache, false)?;
    let dir = tempfile::tempdir()?;
    let copy = dir.path().join("llama.cpp");
    copy_dir(&tree, &copy)?;
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpora");
    let target = format!("llama.cpp@src:{}", copy.display());
    // Each replay builds the tree into a cache entry of its own (the label, with its temporary
    // path, is compiled into the shim): removed afterwards, so test runs do not pile them up.
    let replay = || -> Result<(Option<i32>, String)> {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvaudit"))
            .args(["replay", "--quiet", "--target", &target])
            .arg(&corpus)
            .output()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let built = ensure_built(&BuildSpec::new(Pin::parse(&target)?), false)?;
        ensure!(built.pin.tree.is_some(), "not the tree's entry");
        std::fs::remove_dir_all(&built.dir).ok();
        Ok((out.status.code(), text))
    };
    let (code, text) = replay()?;
    ensure!(
        code == Some(0) && text.contains(&format!("held to the expectations of {}", pin.label())),
        "the unedited copy did not replay clean (exit {code:?}):\n{text}"
    );
    reintroduce_stale_index_bug(&copy)?;
    let (code, text) = replay()?;
    ensure!(
        code == Some(1) && text.contains("i1_seq_cp_twice_stale_max") && text.contains("REGRESSED"),
        "the reintroduced bug was not reported (exit {code:?}):\n{text}"
    );
    Ok(())
}

/// `git bisect run` with kvaudit's exit-code contract (`kvaudit bisect FILE --run --tree DIR`:
/// 0 finding absent, 1 present, 125 skip, 128 abort) names the commit that brought a bug back:
/// a git history over a copy of the newest reference pin's tree, four commits, the third of
/// which reintroduces the stale-index bug of
/// `a_source_tree_replays_the_corpus_and_catches_a_reintroduced_bug` (the seed's I1 symptom).
/// The other commits change files no build reads, so each probe is an incremental build.
pub fn git_bisect_run_names_the_commit_that_reintroduced_a_bug() -> Result<()> {
    let version = REFERENCE_PINS[1];
    let info = known_pins()?
        .get(version)
        .context("pins.toml has no newest reference pin")?;
    let pin = Pin {
        version: version.to_string(),
        variant: Variant::RELEASE,
        tree: None,
        fixes: Vec::new(),
    };
    ensure_built(&BuildSpec::new(pin), false)?;
    let cache = kvaudit::targets::llama::build::cache_root()?;
    let tree = kvaudit::targets::llama::build::locate_or_fetch(info, &cache, false)?;
    let dir = tempfile::tempdir()?;
    let copy = dir.path().join("llama.cpp");
    copy_dir(&tree, &copy)?;
    let git = |args: &[&str]| -> Result<String> {
        let out = std::process::Command::new("git")
            .args([
                "-c",
                "user.name=kvaudit",
                "-c",
                "user.email=kvaudit@localhost",
            ])
            .args(["-c", "commit.gpgsign=false"])
            .args(args)
            .current_dir(&copy)
            .output()
            .context("running git (is it installed?)")?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ensure!(out.status.success(), "git {args:?} failed:\n{text}");
        Ok(text)
    };
    let commit = |message: &str| -> Result<String> {
        git(&["add", "-A"])?;
        git(&["commit", "-q", "--no-verify", "-m", message])?;
        Ok(git(&["rev-parse", "HEAD"])?.trim().to_string())
    };
    git(&["init", "-q"])?;
    let base = commit("the pin's tree")?;
    std::fs::write(copy.join("NOTES.txt"), "a file no build reads\n")?;
    commit("notes")?;
    reintroduce_stale_index_bug(&copy)?;
    let culprit = commit("seq_keep: keep the index (brings the stale entry back)")?;
    std::fs::write(copy.join("NOTES.txt"), "more notes\n")?;
    commit("more notes")?;

    let corpus_file =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("corpora/i1_seq_cp_twice_stale_max.json");
    git(&["bisect", "start", "HEAD", &base])?;
    let run = git(&[
        "bisect",
        "run",
        env!("CARGO_BIN_EXE_kvaudit"),
        "bisect",
        &corpus_file.display().to_string(),
        "--run",
        "--tree",
        &copy.display().to_string(),
    ]);
    // The entries built for the probed commits are of this temporary tree: removed here, so
    // test runs do not pile them up.
    for entry in std::fs::read_dir(cache.join("llama.cpp"))?.filter_map(Result::ok) {
        let Ok(text) = std::fs::read_to_string(entry.path().join("manifest.json")) else {
            continue;
        };
        let source_dir = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|m| m["source_dir"].as_str().map(std::path::PathBuf::from));
        if source_dir.is_some_and(|d| d.starts_with(dir.path()) || d.starts_with(&copy)) {
            std::fs::remove_dir_all(entry.path()).ok();
        }
    }
    let run = run?;
    ensure!(
        run.contains(&format!("{culprit} is the first bad commit")),
        "git bisect run did not name {culprit}:\n{run}"
    );
    Ok(())
}
