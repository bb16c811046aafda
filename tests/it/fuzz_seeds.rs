//! The fuzz targets of `fuzz/` without libFuzzer: each target's body (a `#[doc(hidden)] pub fn
//! fuzz_*` beside the parser it exercises) runs over its checked-in seeds, `fuzz/seeds/<target>/`,
//! and over [`MUTATIONS_PER_SEED`] mutations of each (bit flips, interesting bytes and words,
//! truncations, insertions, deletions, splices with another seed) drawn from a fixed-seed PRNG,
//! so every `cargo test` replays the same inputs. A body panics when an invariant breaks; the
//! test names the seed and mutation and saves the input under `target/fuzz-seed-failures/`.
//!
//! Seeds whose names start with `gen-` are made by [`generated_seeds`] from real data (the
//! corpus, a real audit report, the tiny GGUF model, the native cache's own state bytes);
//! `KVAUDIT_BLESS_SEEDS=1 cargo test --release --test it -- fuzz_seeds` rewrites them. Inputs that
//! `cargo fuzz run` found crashing go in the same folder under their libFuzzer names
//! (`crash-<sha1>`), and stay there as regression seeds.
//!
//! `worker_wire` reads the worker's request lines and reply frames (`targets::llama::worker::wire`);
//! `trace` runs a `FuzzTrace` on the native cache (`engines::fuzz::fuzz_trace`).
//!
//! `fuzz_seeds::fuzz_crate_calls_the_library_bodies` keeps the fuzz crate buildable without
//! building it (libFuzzer): each `fuzz/fuzz_targets/NAME.rs` must be the one-line call of a body
//! listed here, so a body that is renamed or removed breaks this binary's build or that test.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use libtest_mimic::Trial;
use proptest::prelude::Rng as _;
use proptest::test_runner::{RngAlgorithm, TestRng};
use serde_json::{json, Value};

/// Mutations run per seed.
pub const MUTATIONS_PER_SEED: u64 = 2_000;

type Body = fn(&[u8]);

/// A fuzz target's body in the library: its path as `fuzz/fuzz_targets/NAME.rs` calls it, and
/// the function (`fuzz_NAME`).
macro_rules! body {
    ($path:path) => {
        (stringify!($path), $path as Body)
    };
}

/// The fuzz targets, each a body in the library: `fuzz/fuzz_targets/NAME.rs` for `fuzz_NAME`.
const TARGETS: [(&str, Body); 7] = [
    body!(kvaudit::outputs::c_repro::fuzz_repro_json),
    body!(kvaudit::records::report::fuzz_report_json),
    body!(kvaudit::base::domain::fuzz_domain_toml),
    body!(kvaudit::model::gguf::fuzz_gguf),
    body!(kvaudit::base::state::fuzz_seq_state),
    body!(kvaudit::targets::llama::worker::wire::fuzz_worker_wire),
    body!(kvaudit::engines::fuzz::fuzz_trace),
];

/// A target's name: its body's name without `fuzz_`.
fn target_name(path: &str) -> String {
    let path: String = path.chars().filter(|c| !c.is_whitespace()).collect();
    let last = path.rsplit("::").next().unwrap_or(&path);
    last.strip_prefix("fuzz_").unwrap_or(last).to_string()
}

/// The fuzz crate (outside the workspace; building it needs libFuzzer) stays buildable because
/// it holds nothing but calls into the library, which this binary compiles: each file of
/// `fuzz/fuzz_targets/` is exactly the one-line call of a body in [`TARGETS`], and
/// `fuzz/Cargo.toml` declares one binary per target.
fn fuzz_crate_calls_the_library_bodies() -> Result<(), String> {
    let dir = super::root().join("fuzz/fuzz_targets");
    let mut files = Vec::new();
    for e in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let p = e.map_err(|e| e.to_string())?.path();
        if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
    files.sort();
    let mut names = Vec::new();
    for p in &files {
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        let Some((path, _)) = TARGETS.iter().find(|(path, _)| target_name(path) == name) else {
            return Err(format!("{}: no body in the library's TARGETS", display(p)));
        };
        let path: String = path.chars().filter(|c| !c.is_whitespace()).collect();
        let code: Vec<String> = std::fs::read_to_string(p)
            .map_err(|e| e.to_string())?
            .lines()
            .filter(|l| !l.trim_start().starts_with("//") && !l.trim().is_empty())
            .map(|l| l.trim().to_string())
            .collect();
        let want = [
            "#![no_main]".to_string(),
            "use libfuzzer_sys::fuzz_target;".to_string(),
            "fuzz_target!(|data: &[u8]| {".to_string(),
            format!("{path}(data);"),
            "});".to_string(),
        ];
        if code != want {
            return Err(format!(
                "{}: not the one-line call of {path}: {code:?}",
                display(p)
            ));
        }
        names.push(name);
    }
    let mut want: Vec<String> = TARGETS.iter().map(|(p, _)| target_name(p)).collect();
    want.sort();
    if names != want {
        return Err(format!(
            "fuzz/fuzz_targets/ holds {names:?}, the library's bodies are {want:?}"
        ));
    }
    let manifest = std::fs::read_to_string(super::root().join("fuzz/Cargo.toml"))
        .map_err(|e| e.to_string())?;
    let mut bins: Vec<String> = manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("path = \"fuzz_targets/"))
        .filter_map(|l| l.strip_suffix(".rs\""))
        .map(String::from)
        .collect();
    bins.sort();
    if bins != want {
        return Err(format!(
            "fuzz/Cargo.toml builds {bins:?}, the targets are {want:?}"
        ));
    }
    Ok(())
}

pub fn trials() -> Vec<Trial> {
    let mut trials = vec![Trial::test(
        "fuzz_seeds::generated_seeds_are_checked_in",
        || generated_seeds_are_checked_in().map_err(Into::into),
    )];
    trials.push(Trial::test(
        "fuzz_seeds::fuzz_crate_calls_the_library_bodies",
        || fuzz_crate_calls_the_library_bodies().map_err(Into::into),
    ));
    for (path, body) in TARGETS {
        let target = target_name(path);
        trials.push(Trial::test(format!("fuzz_seeds::{target}"), move || {
            run_target(&target, body).map_err(Into::into)
        }));
    }
    trials
}

fn seeds_dir(target: &str) -> PathBuf {
    super::root().join("fuzz/seeds").join(target)
}

/// Every seed of `target`, sorted by name.
fn seeds(target: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let dir = seeds_dir(target);
    let mut v = Vec::new();
    for e in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let p = e.map_err(|e| e.to_string())?.path();
        if p.is_file() {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            v.push((name, std::fs::read(&p).map_err(|e| e.to_string())?));
        }
    }
    v.sort();
    if v.is_empty() {
        return Err(format!("{}: no seeds", dir.display()));
    }
    Ok(v)
}

/// A fixed-seed generator (proptest's ChaCha), so the mutations are the same on every run.
struct Rng(TestRng);

impl Rng {
    fn new(seed: u64) -> Self {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        Rng(TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const INTERESTING_BYTES: &[u8] = b"\x00\xff\x7f\x80\x01\"\\*/\n{}[]9-e.:#<|`";
const INTERESTING_WORDS: &[u32] = &[
    0,
    1,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x100,
    0x10_0000,
    0xaf14_3cd8,
];

/// One mutation of `data`: one to four stacked edits.
fn mutate(data: &[u8], others: &[(String, Vec<u8>)], rng: &mut Rng) -> Vec<u8> {
    let mut d = data.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(8) {
            0 if !d.is_empty() => {
                let i = rng.below(d.len());
                d[i] ^= 1 << rng.below(8);
            }
            1 if !d.is_empty() => {
                let i = rng.below(d.len());
                d[i] = INTERESTING_BYTES[rng.below(INTERESTING_BYTES.len())];
            }
            2 => {
                let n = rng.below(d.len() + 1);
                d.truncate(n);
            }
            3 => {
                let at = rng.below(d.len() + 1);
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                d.splice(at..at, bytes);
            }
            4 if !d.is_empty() => {
                let a = rng.below(d.len());
                let b = (a + 1 + rng.below(16)).min(d.len());
                d.drain(a..b);
            }
            5 => {
                let (_, other) = &others[rng.below(others.len())];
                let at = rng.below(d.len() + 1);
                let from = rng.below(other.len() + 1);
                d.truncate(at);
                d.extend_from_slice(&other[from..]);
            }
            6 if !d.is_empty() => {
                let a = rng.below(d.len());
                let b = (a + 1 + rng.below(64)).min(d.len());
                let chunk = d[a..b].to_vec();
                let at = rng.below(d.len() + 1);
                d.splice(at..at, chunk);
            }
            7 if d.len() >= 4 => {
                let at = rng.below(d.len() - 3);
                let w = INTERESTING_WORDS[rng.below(INTERESTING_WORDS.len())];
                d[at..at + 4].copy_from_slice(&w.to_le_bytes());
            }
            _ => {}
        }
    }
    d
}

/// Runs `body` on `data`; a panic becomes an error naming `what`, with the input saved.
fn run_one(target: &str, body: Body, what: &str, data: &[u8]) -> Result<(), String> {
    if catch_unwind(AssertUnwindSafe(|| body(data))).is_ok() {
        return Ok(());
    }
    let dir = super::root().join("target/fuzz-seed-failures");
    let _ = std::fs::create_dir_all(&dir);
    let saved = dir.join(format!(
        "{target}-{}",
        kvaudit::base::files::sha256_hex(data)
    ));
    let _ = std::fs::write(&saved, data);
    Err(format!(
        "fuzz target {target} panics on {what} (input saved to {}; the panic message is above)",
        saved.display()
    ))
}

fn run_target(target: &str, body: Body) -> Result<(), String> {
    let seeds = seeds(target)?;
    for (name, data) in &seeds {
        run_one(target, body, &format!("seed {name}"), data)?;
    }
    for (k, (name, data)) in seeds.iter().enumerate() {
        let mut rng = Rng::new(0x6b76_6175_6469_7400 ^ (k as u64) << 32 ^ target.len() as u64);
        for m in 0..MUTATIONS_PER_SEED {
            let input = mutate(data, &seeds, &mut rng);
            run_one(
                target,
                body,
                &format!("mutation {m} of seed {name}"),
                &input,
            )?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Generated seeds

/// The generated seeds, per target: (file name, bytes).
fn generated_seeds() -> Result<Vec<(&'static str, String, Vec<u8>)>, String> {
    let mut out = Vec::new();
    let mut add = |target: &'static str, name: &str, bytes: Vec<u8>| {
        out.push((target, format!("gen-{name}"), bytes))
    };

    // repro_json: the corpus, a finding, hostile and broken variants.
    let corpus = super::data_files(&super::root().join("corpora"), "json");
    for (stem, path) in &corpus {
        add(
            "repro_json",
            &format!("{stem}.json"),
            std::fs::read(path).unwrap(),
        );
    }
    let first: Value =
        serde_json::from_slice(&std::fs::read(&corpus[0].1).unwrap()).map_err(|e| e.to_string())?;
    let mut hostile = first.clone();
    hostile["kind"] = json!("*/\n#define llama_decode(...) 0\n/* ??/ \" \\ \u{0}");
    hostile["target"] = json!("native */ `|<script>`");
    add("repro_json", "hostile-kind.json", to_bytes(&hostile));
    let finding = json!({
        "oracle": "differential", "kind": "cells differ", "step": 2, "seq": 0,
        "target": {"name": "native", "faults": ["refcount"]},
        "expected": {"pos_min": 0, "pos_max": 4, "cells": [0, 1, 2, 3, 4]},
        "trace": {"setup": {"n_ctx": 256, "n_seq_max": 2, "ops": [{"op": "decode", "seq": 0, "n": 5}]},
                  "ops": [{"op": "seq_add", "seq": 0, "p0": 2, "p1": -1, "delta": -2},
                          {"op": "decode", "seqs": [0, 1], "n": 2, "pos": 7, "tokens": [3, 4]},
                          {"op": "seq_div", "seq": 0, "p0": 0, "p1": -1, "d": 2}, {"op": "clear"}]}
    });
    add(
        "repro_json",
        "finding-differential.json",
        to_bytes(&finding),
    );
    let state_ops = json!({
        "oracle": "differential", "kind": "cells differ", "seq": 1,
        "expected": {"pos_min": 0, "pos_max": 4, "cells": [0, 1, 2, 3, 4]},
        "trace": {"setup": {"n_ctx": 256, "n_seq_max": 2, "kv_unified": false, "n_batch": 64,
                            "n_ubatch": 8, "flash_attn": true, "type_k": "q8_0", "type_v": "q4_0",
                            "ops": [{"op": "decode", "seq": 0, "n": 5}, {"op": "state_save", "slot": "setup_w"}]},
                  "ops": [{"op": "state_seq_save", "seq": 0, "slot": "a", "flags": 1},
                          {"op": "state_seq_load", "seq": 1, "slot": "a", "flags": 1, "truncate": 30, "flip": 9},
                          {"op": "state_load", "slot": "setup_w", "flip": 4000000000u32},
                          {"op": "state_seq_load", "seq": 1, "slot": "never_saved"}]}
    });
    add("repro_json", "finding-state-ops.json", to_bytes(&state_ops));
    let mut big = first.clone();
    big["trace"]["setup"]["n_ctx"] = json!(u32::MAX);
    add("repro_json", "n-ctx-too-large.json", to_bytes(&big));
    let text = std::fs::read(&corpus[0].1).unwrap();
    add(
        "repro_json",
        "truncated.json",
        text[..text.len() / 2].to_vec(),
    );

    // report_json: a real report with findings, a hostile one, a broken shard.
    let report = super::hostile::base_report()?;
    add(
        "report_json",
        "audit-refcount-depth3.json",
        to_bytes(&report),
    );
    let mut hostile = report.clone();
    hostile["findings"][0]["kind"] = json!("a | b\n# x <script>`\u{1b}[2J");
    hostile["domain"]["name"] = json!("| x | y |");
    add("report_json", "hostile-fields.json", to_bytes(&hostile));
    let mut shard = report.clone();
    shard["shard"] = json!({"index": 5, "count": 2});
    add("report_json", "shard-out-of-range.json", to_bytes(&shard));

    // domain_toml.
    for (name, text) in [
        ("seed.toml", "preset = \"seed\"\n"),
        (
            "wide-overrides.toml",
            "preset = \"wide\"\nname = \"mine\"\nseqs = [0, 1, 2]\nranges = [[0, 3], [-1, -1], [5, -1]]\n\
             deltas = [1, -1]\ndivisors = [2, 5]\nrm_all = false\ncopies = true\nkeep = false\n\
             clear = true\ndecode_next = [1, 3]\n\n[setup]\nn_ctx = 512\nn_seq_max = 3\n\
             ops = [{op = \"decode\", seq = 0, n = 7}, {op = \"seq_cp\", src = 0, dst = 1, p0 = 0, p1 = 3}]\n",
        ),
        ("zero-divisor.toml", "divisors = [0]\n"),
        ("too-many-seqs.toml", "seqs = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39]\n"),
        ("syntax-error.toml", "preset = \"seed\nseqs = [\n"),
    ] {
        add("domain_toml", name, text.as_bytes().to_vec());
    }

    // gguf: a real tiny model, every value type, a truncated header.
    use kvaudit::model::gguf::{GgufValue, GgufValueType, GgufWriter};
    use kvaudit::model::tiny::{tiny_model_bytes, TinyModelSpec};
    let spec = TinyModelSpec {
        n_layer: 1,
        n_embd: 8,
        n_head: 2,
        n_head_kv: 1,
        n_ff: 8,
        n_vocab: 8,
        ..TinyModelSpec::default()
    };
    let tiny = tiny_model_bytes(&spec).map_err(|e| format!("{e:#}"))?;
    add("gguf", "tiny-llama.gguf", tiny.clone());
    // One key of each of the 13 value types, then two tensors.
    let mut w = GgufWriter::new();
    let values = [
        GgufValue::U8(1),
        GgufValue::I8(-1),
        GgufValue::U16(2),
        GgufValue::I16(-2),
        GgufValue::U32(3),
        GgufValue::I32(-3),
        GgufValue::F32(0.25),
        GgufValue::Bool(true),
        GgufValue::String("*/ text".into()),
        GgufValue::U64(4),
        GgufValue::I64(-4),
        GgufValue::F64(0.5),
        GgufValue::Array(
            GgufValueType::I32,
            vec![GgufValue::I32(5), GgufValue::I32(6)],
        ),
    ];
    for (i, v) in values.into_iter().enumerate() {
        w.add_kv(format!("key.{i}"), v);
    }
    w.add_tensor_f32("t0", &[3], vec![1.0, -2.0, 3.5])
        .add_tensor_f32("t1", &[2, 2], vec![0.0; 4]);
    add("gguf", "every-type.gguf", w.to_bytes());
    add(
        "gguf",
        "truncated.gguf",
        tiny[..tiny.len().min(200)].to_vec(),
    );

    // seq_state: the native cache's own bytes, with and without K/V rows.
    use kvaudit::base::cache::CacheUnderTest;
    use kvaudit::base::op::{Decode, Op, Setup};
    use kvaudit::targets::registry::TargetSpec;
    let setup = Setup {
        n_ctx: 256,
        n_seq_max: 2,
        ops: vec![Op::Decode(Decode::next(0, 5))],
        ..Setup::default()
    };
    let ops = [
        Op::SeqCp {
            src: 0,
            dst: 1,
            p0: 1,
            p1: 3,
        },
        Op::Decode(Decode::next(1, 2)),
    ];
    let mut plain = kvaudit::targets::native::NativeTarget::new(Default::default());
    let (mut tensors, _) = TargetSpec::new("native+tensors", &[]).theorem_target(None)?;
    for (name, target) in [
        ("native", &mut plain as &mut dyn CacheUnderTest),
        ("native-tensors", tensors.as_mut()),
    ] {
        target.reset(&setup).map_err(|e| e.to_string())?;
        for op in &ops {
            target.apply(op).map_err(|e| e.to_string())?;
        }
        for seq in [0, 1, -1] {
            let bytes = target.seq_state(seq).map_err(|e| e.to_string())?;
            add("seq_state", &format!("{name}-seq{seq}.bin"), bytes);
        }
    }
    plain.reset(&setup).map_err(|e| e.to_string())?;
    add(
        "seq_state",
        "empty-seq1.bin",
        plain.seq_state(1).map_err(|e| e.to_string())?,
    );
    Ok(out)
}

fn to_bytes(v: &Value) -> Vec<u8> {
    (serde_json::to_string_pretty(v).unwrap() + "\n").into_bytes()
}

/// The generated seeds on disk are what the generator makes today (or are rewritten, with
/// `KVAUDIT_BLESS_SEEDS=1`).
fn generated_seeds_are_checked_in() -> Result<(), String> {
    let bless = std::env::var_os("KVAUDIT_BLESS_SEEDS").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for (target, name, bytes) in generated_seeds()? {
        let path = seeds_dir(target).join(&name);
        if bless {
            std::fs::create_dir_all(seeds_dir(target)).map_err(|e| e.to_string())?;
            std::fs::write(&path, &bytes).map_err(|e| e.to_string())?;
        } else if std::fs::read(&path).ok().as_deref() != Some(&bytes[..]) {
            stale.push(display(&path));
        }
    }
    if stale.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "generated seeds differ from what is checked in (rerun with KVAUDIT_BLESS_SEEDS=1 if \
             the change is meant): {}",
            stale.join(", ")
        ))
    }
}

fn display(p: &Path) -> String {
    p.strip_prefix(super::root())
        .unwrap_or(p)
        .display()
        .to_string()
}
