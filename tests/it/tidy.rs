//! Tidy checks (as rust-analyzer's `tidy.rs`): the invariants of ARCHITECTURE.md that the
//! compiler does not enforce, read from the source text of `src/` and of the crates under
//! `targets/` (`targets/llama-cpp/src/`, `targets/native-kv/src/`: [`crate_sources`]).
//!
//! - `tidy::layers`: a module imports only from its own layer or the layers before it (base,
//!   model, oracles, records, running, targets, engines, outputs), and no two modules import each
//!   other in a circle (a module and its own parent or child do not count: Rust's `mod` tree
//!   puts those edges in every folder).
//! - `tidy::unsafe_code`: `unsafe` appears only in the modules that talk to foreign code or the
//!   OS (the llama.cpp target crate's `ffi.rs` and `sys.rs`).
//! - `tidy::dump_layout_in_targets`: only `base/state/` and `targets/` call the dump parsers.
//! - `tidy::one_state_parser`: only `base/state/` decodes binary state (and `model/gguf/read.rs` its
//!   own file format, `targets/llama/worker/wire.rs` and `wire/codec.rs` the worker's reply frames): nothing else
//!   calls `from_le_bytes`.
//! - `tidy::module_docs`: every module starts with `//!` docs.
//! - `tidy::error_style`: no public function returns `Result<_, String>`.
//!
//! Those four read the target crates too (the state parser's not in native-kv, which models
//! llama.cpp's own state writer and reader); the layers and the op matches are kvaudit's own.
//! - `tidy::cli_outside_the_library`: the command line lives in the binary.
//! - `tidy::ops_matched_exhaustively`: outside the op declaration (`base/op_kind.rs`), no
//!   `matches!` names an op (`Op::..`, `OpKind::..`) and no `match` over ops has a catch-all arm
//!   (`_ =>`, a bare binding, `Some(_)`): a new op kind must be a compiler error wherever ops are
//!   told apart. It reads `src/` (the binary too), `benches/` and `fuzz/fuzz_targets/`.
//!
//! - `tidy::target_names_tested_in_the_registry_only`: outside `targets/registry.rs`, no target's
//!   name (a string literal that is or begins like one, the registry's name constants, `'@'`)
//!   is compared, given to a string test (`starts_with`, `strip_prefix`, `split`, ...), named in
//!   `matches!` or a `match` arm: code tells targets apart by `TargetKind`, so that a new
//!   engine is a set of exhaustive matches. It reads `src/` (the binary too); the leftovers in
//!   files owned elsewhere are listed (`TARGET_NAME_TESTS_LEFT`) and may only go.
//!
//! Test code (`#[cfg(test)]` items) is left out: tests may reach any layer. Each check also runs
//! on a small made-up tree that breaks it (`tidy::checks_catch_*`), so a check that can no longer
//! fail fails there.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use libtest_mimic::Trial;

/// The layers, lowest first: a module may import from its own layer and the ones before it.
pub const LAYERS: [&str; 9] = [
    "base",
    "model",
    "oracles",
    "records",
    "running",
    "isolation",
    "targets",
    "engines",
    "outputs",
];

/// Modules allowed to hold `unsafe` code.
const UNSAFE_ALLOWED: [&str; 3] = [
    "targets/llama-cpp/src/ffi.rs",
    "targets/llama-cpp/src/ffi/raw.rs",
    "targets/llama-cpp/src/sys.rs",
];

/// The crates under `targets/` (each depends on nothing of kvaudit), by their source folder.
const TARGET_CRATES: [&str; 2] = ["targets/llama-cpp/src", NATIVE_KV];

/// The native model's crate.
const NATIVE_KV: &str = "targets/native-kv/src";

/// Modules allowed to decode binary formats by hand: llama.cpp's state, GGUF files, and the
/// worker's reply frames (kvaudit's own wire, fuzzed as `worker_wire`); and the word hash,
/// which reads bytes as words to hash them, decoding no format.
const BYTE_DECODERS: [&str; 6] = [
    "src/base/state/mod.rs",
    "src/base/state/rows.rs",
    "src/base/word_hash.rs",
    "src/model/gguf/read.rs",
    "src/targets/llama/worker/wire.rs",
    "src/targets/llama/worker/wire/codec.rs",
];

/// The one module that may tell ops apart without an exhaustive `match`: the declaration of
/// the op kinds.
const OP_DECLARATION: &str = "src/base/op_kind.rs";

/// A source file: its path under its source folder (`src/` for the library), the folder, and
/// its text.
pub struct Source {
    path: String,
    dir: String,
    text: String,
    /// Whether its parent declares it `#[cfg(test)] mod NAME;` (a test module in a file of its
    /// own, e.g. `wire/tests.rs`): all of it is test code.
    test_only: bool,
}

impl Source {
    /// A made-up file of the library, for the checks' own tests.
    pub fn new(path: &str, text: &str) -> Source {
        Source {
            path: path.into(),
            dir: "src".into(),
            text: text.into(),
            test_only: false,
        }
    }

    /// Where it is from the repository root (`src/base/op.rs`).
    fn location(&self) -> String {
        match self.dir.as_str() {
            "" => self.path.clone(),
            dir => format!("{dir}/{}", self.path),
        }
    }

    /// Its module path (`oracles::i1` for `oracles/i1.rs`, `oracles` for `oracles/mod.rs`).
    fn module(&self) -> Vec<String> {
        let p = self.path.trim_end_matches(".rs");
        let mut parts: Vec<String> = p.split('/').map(String::from).collect();
        if parts.last().is_some_and(|l| l == "mod" || l == "lib") {
            parts.pop();
        }
        parts
    }

    /// The code without comments and `#[cfg(test)]` items (none of a test module's file).
    fn code(&self) -> String {
        if self.test_only {
            return String::new();
        }
        strip_tests(&strip_comments(&self.text))
    }
}

/// Every `.rs` file of the library under `src/` (not the binaries: `main.rs` and `cli/`, and the
/// worker programs of `bin/`).
pub fn library_sources() -> Vec<Source> {
    let src = super::root().join("src");
    let mut out = Vec::new();
    walk(&src, &src, "src", &mut out);
    out.retain(|s| {
        s.path != "main.rs" && !s.path.starts_with("cli/") && !s.path.starts_with("bin/")
    });
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Every `.rs` file that tells ops apart: all of `src/` (the binary too), `benches/` and the fuzz
/// targets, each by its path from the repository root.
pub fn op_sources() -> Vec<Source> {
    let root = super::root();
    let mut out = Vec::new();
    for dir in ["src", "benches", "fuzz/fuzz_targets"] {
        walk(&root, &root.join(dir), "", &mut out);
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Every `.rs` file of the crates under `targets/` ([`TARGET_CRATES`]).
pub fn crate_sources() -> Vec<Source> {
    let mut out = Vec::new();
    for dir in TARGET_CRATES {
        let src = super::root().join(dir);
        walk(&src, &src, dir, &mut out);
    }
    out
}

/// The library's sources and the target crates'.
pub fn all_sources() -> Vec<Source> {
    let mut out = library_sources();
    out.extend(crate_sources());
    out
}

/// Every `.rs` file under `dir`, its path relative to `root`, from the source folder `name`.
fn walk(root: &Path, dir: &Path, name: &str, out: &mut Vec<Source>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(root, &p, name, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            let rel = p
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{rel}: {e}"));
            out.push(Source {
                path: rel,
                dir: name.into(),
                text,
                test_only: declared_under_cfg_test(&p),
            });
        }
    }
}

/// Whether the module file `p` is declared `#[cfg(test)] mod NAME;` by its parent (`mod.rs` or
/// `lib.rs` beside it, or the `DIR.rs` of its folder).
fn declared_under_cfg_test(p: &Path) -> bool {
    let (Some(stem), Some(dir)) = (p.file_stem().and_then(|s| s.to_str()), p.parent()) else {
        return false;
    };
    if stem == "mod" || stem == "lib" {
        return false;
    }
    let declaration = format!("#[cfg(test)]\nmod {stem};");
    [
        dir.join("mod.rs"),
        dir.join("lib.rs"),
        dir.with_extension("rs"),
    ]
    .iter()
    .filter_map(|parent| std::fs::read_to_string(parent).ok())
    .any(|text| text.contains(&declaration))
}

/// Drops `//` comments (line, doc and trailing) and the contents of string literals, so that
/// paths in prose and strings do not count as imports.
fn strip_comments(text: &str) -> String {
    strip_comments_keeping(text, &|_| false)
}

/// [`strip_comments`], keeping the contents of the string literals `keep` says yes to.
fn strip_comments_keeping(text: &str, keep: &dyn Fn(&str) -> bool) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = '\0';
        let mut kept = String::new();
        let mut literal = String::new();
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            if in_str {
                if c == '"' && prev != '\\' {
                    in_str = false;
                    if keep(&literal) {
                        kept.push_str(&literal);
                    }
                    literal.clear();
                    kept.push('"');
                } else {
                    literal.push(c);
                }
                prev = if prev == '\\' && c == '\\' { '\0' } else { c };
                i += 1;
                continue;
            }
            if c == '"' && !(prev == '\'' && chars.get(i + 1) == Some(&'\'')) {
                in_str = true;
                kept.push('"');
            } else if c == '/' && chars.get(i + 1) == Some(&'/') {
                break;
            } else {
                kept.push(c);
            }
            prev = c;
            i += 1;
        }
        out.push_str(&kept);
        out.push('\n');
    }
    out
}

/// Drops every item marked `#[cfg(test)]` (up to its closing brace, or its `;`).
fn strip_tests(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        let open = item.find('{');
        let semi = item.find(';');
        let end = match (open, semi) {
            (Some(o), Some(s)) if s < o => s + 1,
            (Some(o), _) => {
                let mut depth = 0usize;
                let mut end = item.len();
                for (i, c) in item[o..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = o + i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (None, Some(s)) => s + 1,
            (None, None) => item.len(),
        };
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// The module paths a file's code refers to: `crate::a::b::C` gives `[a, b, C]` (resolved to a
/// module later), `super::x` is resolved against the file's own module. Grouped imports
/// (`crate::{a::x, b}`) give one path per member.
fn references(src: &Source) -> Vec<Vec<String>> {
    let code = src.code();
    let me = src.module();
    let mut out = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut i = 0;
    while i < bytes.len() {
        let starts = |w: &str| {
            code_at(&bytes, i, w)
                && (i == 0 || !ident(bytes[i - 1]))
                && code_at(&bytes, i + w.len(), "::")
        };
        let (base, len) = if starts("crate") {
            (Vec::new(), "crate".len())
        } else if starts("super") {
            // `super::super::x` from a::b::c is `a::x`; a `mod.rs` is its folder's module.
            let mut base = me.clone();
            let mut j = i;
            while code_at(&bytes, j, "super::") {
                base.pop();
                j += "super::".len();
            }
            out.extend(
                path_list(&bytes, j)
                    .into_iter()
                    .map(|p| [base.clone(), p].concat()),
            );
            i = j;
            continue;
        } else {
            i += 1;
            continue;
        };
        let j = i + len + 2;
        out.extend(
            path_list(&bytes, j)
                .into_iter()
                .map(|p| [base.clone(), p].concat()),
        );
        i = j;
    }
    out
}

fn code_at(bytes: &[char], i: usize, w: &str) -> bool {
    w.chars()
        .enumerate()
        .all(|(k, c)| bytes.get(i + k) == Some(&c))
}

/// The paths starting at `j`: `a::b::C` or `{a::x, b::{y, z}}`.
fn path_list(bytes: &[char], j: usize) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    if bytes.get(j) == Some(&'{') {
        let mut depth = 0;
        let mut end = j;
        for (k, &c) in bytes[j..].iter().enumerate() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = j + k;
                        break;
                    }
                }
                _ => {}
            }
        }
        let inner: String = bytes[j + 1..end].iter().collect();
        let mut out = Vec::new();
        let mut depth = 0;
        let mut start = 0;
        let inner_chars: Vec<char> = inner.chars().collect();
        for (k, &c) in inner_chars.iter().enumerate() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    out.extend(path_list(&trimmed(&inner_chars[start..k]), 0));
                    start = k + 1;
                }
                _ => {}
            }
        }
        out.extend(path_list(&trimmed(&inner_chars[start..]), 0));
        return out;
    }
    let mut path = Vec::new();
    let mut k = j;
    loop {
        let s = k;
        while bytes.get(k).is_some_and(|&c| ident(c)) {
            k += 1;
        }
        if k == s {
            if bytes.get(k) == Some(&'{') {
                return path_list(bytes, k)
                    .into_iter()
                    .map(|p| [path.clone(), p].concat())
                    .collect();
            }
            break;
        }
        path.push(bytes[s..k].iter().collect());
        if code_at(bytes, k, "::") {
            k += 2;
        } else {
            break;
        }
    }
    if path.is_empty() || path == ["self"] {
        Vec::new()
    } else {
        vec![path]
    }
}

fn trimmed(c: &[char]) -> Vec<char> {
    let s: String = c.iter().collect();
    s.trim().chars().collect()
}

/// The module a path names: its longest prefix that is a module of `modules`.
fn module_of(path: &[String], modules: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| modules.contains(p))
}

fn layer_of(module: &[String]) -> Option<usize> {
    LAYERS
        .iter()
        .position(|l| module.first().is_some_and(|m| m == l))
}

/// Imports against the layer order, and cycles between modules.
pub fn check_layers(sources: &[Source]) -> Result<(), String> {
    let modules: BTreeSet<Vec<String>> = sources.iter().map(|s| s.module()).collect();
    let mut problems = Vec::new();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for s in sources {
        let me = s.module();
        let Some(my_layer) = layer_of(&me) else {
            if !me.is_empty() {
                problems.push(format!(
                    "src/{}: in no layer (layers: {})",
                    s.path,
                    LAYERS.join(", ")
                ));
            }
            continue;
        };
        for r in references(s) {
            let Some(target) = module_of(&r, &modules) else {
                continue;
            };
            if let Some(l) = layer_of(&target) {
                if l > my_layer {
                    problems.push(format!(
                        "src/{}: imports {} (layer {}) from layer {} ({})",
                        s.path,
                        r.join("::"),
                        LAYERS[l],
                        LAYERS[my_layer],
                        "a layer imports only from itself and the layers before it"
                    ));
                }
            }
            let related = target.starts_with(&me) || me.starts_with(&target);
            if !related {
                edges.entry(me.clone()).or_default().insert(target);
            }
        }
    }
    for cycle in find_cycles(&edges) {
        problems.push(format!(
            "import cycle: {}",
            cycle
                .iter()
                .map(|m| m.join("::"))
                .collect::<Vec<_>>()
                .join(" -> ")
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// Every import cycle: one per strongly connected set of modules (Tarjan's algorithm), each
/// shown as a path around it.
fn find_cycles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct Tarjan<'e> {
        edges: &'e BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<Vec<String>, (usize, usize)>,
        stack: Vec<Vec<String>>,
        on_stack: BTreeSet<Vec<String>>,
        sccs: Vec<Vec<Vec<String>>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, m: &Vec<String>) {
            let n = self.index.len();
            self.index.insert(m.clone(), (n, n));
            self.stack.push(m.clone());
            self.on_stack.insert(m.clone());
            for w in self.edges.get(m).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.index[m].1.min(self.index[w].1);
                    self.index.get_mut(m).unwrap().1 = low;
                } else if self.on_stack.contains(w) {
                    let low = self.index[m].1.min(self.index[w].0);
                    self.index.get_mut(m).unwrap().1 = low;
                }
            }
            if self.index[m].0 == self.index[m].1 {
                let mut scc = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on_stack.remove(&w);
                    let done = &w == m;
                    scc.push(w);
                    if done {
                        break;
                    }
                }
                if scc.len() > 1 {
                    self.sccs.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges,
        index: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        sccs: Vec::new(),
    };
    for m in edges.keys() {
        if !t.index.contains_key(m) {
            t.visit(m);
        }
    }
    // A path around each set: from its smallest module, along edges inside the set, back.
    t.sccs
        .into_iter()
        .map(|scc| {
            let inside: BTreeSet<_> = scc.into_iter().collect();
            let start = inside.iter().next().unwrap().clone();
            let mut path = vec![start.clone()];
            let mut seen = BTreeSet::from([start.clone()]);
            let mut at = start.clone();
            loop {
                let next = edges[&at].iter().filter(|w| inside.contains(*w));
                let back = next.clone().find(|w| **w == start);
                match (back, next.clone().find(|w| !seen.contains(*w))) {
                    (Some(w), _) => {
                        path.push(w.clone());
                        break;
                    }
                    (None, Some(w)) => {
                        seen.insert(w.clone());
                        path.push(w.clone());
                        at = w.clone();
                    }
                    (None, None) => break,
                }
            }
            path
        })
        .collect()
}

fn has_word(code: &str, word: &str) -> bool {
    code.match_indices(word).any(|(i, _)| {
        let before = code[..i].chars().next_back();
        let after = code[i + word.len()..].chars().next();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        !ident(before) && !ident(after)
    })
}

/// `unsafe` only where [`UNSAFE_ALLOWED`] says.
pub fn check_unsafe(sources: &[Source]) -> Result<(), String> {
    let bad: Vec<String> = sources
        .iter()
        .filter(|s| !UNSAFE_ALLOWED.contains(&s.location().as_str()))
        .filter(|s| has_word(&strip_comments(&s.text), "unsafe"))
        .map(|s| s.location())
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "unsafe outside {}: {}",
            UNSAFE_ALLOWED.join(", "),
            bad.join(", ")
        ))
    }
}

/// Binary decoding only where [`BYTE_DECODERS`] says.
pub fn check_one_state_parser(sources: &[Source]) -> Result<(), String> {
    let bad: Vec<String> = sources
        .iter()
        .filter(|s| !BYTE_DECODERS.contains(&s.location().as_str()))
        .filter(|s| {
            let code = s.code();
            code.contains("from_le_bytes")
                || code.contains("from_be_bytes")
                || code.contains("from_ne_bytes")
        })
        .map(|s| s.location())
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "bytes decoded outside {} (the state format has one parser, base/state/): {}",
            BYTE_DECODERS.join(", "),
            bad.join(", ")
        ))
    }
}

/// llama.cpp's dump layout is read only by the targets that write it: no file of the library
/// outside `base/state/` and `targets/` calls its parsers (the runner, oracles and engines
/// take a sequence's cells from the target's own `observe_seq`).
pub fn check_dump_layout_in_targets(sources: &[Source]) -> Result<(), String> {
    let bad: Vec<String> = sources
        .iter()
        .filter(|s| !s.path.starts_with("base/state/") && !s.path.starts_with("targets/"))
        .filter(|s| {
            let code = strip_tests(&s.code());
            code.contains("parse_seq_state(") || code.contains("parse_whole_state(")
        })
        .map(|s| s.location())
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "a dump parsed outside base/state/ and targets/ (a target observes its own cells, \
             targets/dump_cells.rs): {}",
            bad.join(", ")
        ))
    }
}

/// No public function of the library returns `Result<_, String>`: failures are
/// `base::error::Error` (or a layer's own typed error), whose kind decides the exit code.
pub fn check_error_style(sources: &[Source]) -> Result<(), String> {
    let mut bad = Vec::new();
    for s in sources {
        let code = s.code();
        for (at, _) in code.match_indices("pub fn ") {
            let sig_end = code[at..].find(['{', ';']).map_or(code.len(), |e| at + e);
            let sig: String = code[at..sig_end]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            if sig.contains("-> Result<") && sig.trim_end().ends_with(", String>") {
                let name = sig["pub fn ".len()..]
                    .split(['(', '<'])
                    .next()
                    .unwrap_or("?");
                bad.push(format!("{}: {name}", s.location()));
            }
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "public functions returning Result<_, String> (use base::error::Error): {}",
            bad.join(", ")
        ))
    }
}

/// Every module starts with `//!` docs.
pub fn check_module_docs(sources: &[Source]) -> Result<(), String> {
    let bad: Vec<String> = sources
        .iter()
        .filter(|s| !s.text.trim_start().starts_with("//!"))
        .map(|s| s.location())
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("modules without //! docs: {}", bad.join(", ")))
    }
}

/// Whether `text` names an op variant or kind: `Op::` or `OpKind::` as a whole path segment.
fn names_an_op(text: &str) -> bool {
    ["Op::", "OpKind::"].iter().any(|w| {
        text.match_indices(w).any(|(i, _)| {
            !text[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    })
}

/// The end (exclusive) of the bracketed group that opens at `open` (`(`, `[` or `{`).
fn group_end(c: &[char], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, &ch) in c.iter().enumerate().skip(open) {
        match ch {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    c.len()
}

/// The arm patterns of the `match` block `c[open..end]` (`open` at its `{`), guards included.
fn arm_patterns(c: &[char], open: usize, end: usize) -> Vec<String> {
    let mut pats = Vec::new();
    let mut i = open + 1;
    let close = end.saturating_sub(1);
    while i < close {
        // The pattern: up to `=>` outside brackets.
        let start = i;
        let mut depth = 0usize;
        while i < close && !(depth == 0 && c[i] == '=' && c.get(i + 1) == Some(&'>')) {
            match c[i] {
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => depth = depth.saturating_sub(1),
                _ => {}
            }
            i += 1;
        }
        if i >= close {
            break;
        }
        pats.push(c[start..i].iter().collect::<String>().trim().to_string());
        i += 2;
        while i < close && c[i].is_whitespace() {
            i += 1;
        }
        // The arm's body: a block, or an expression up to `,` outside brackets.
        if c.get(i) == Some(&'{') {
            i = group_end(c, i);
            while i < close && c[i].is_whitespace() {
                i += 1;
            }
            if c.get(i) == Some(&',') {
                i += 1;
            }
        } else {
            let mut depth = 0usize;
            while i < close && !(depth == 0 && c[i] == ',') {
                match c[i] {
                    '(' | '[' | '{' => depth += 1,
                    ')' | ']' | '}' => depth = depth.saturating_sub(1),
                    _ => {}
                }
                i += 1;
            }
            i += 1;
        }
    }
    pats
}

/// A pattern that matches whatever the arms before it did not: `_`, a bare binding, a tuple of
/// wildcards, `Some(_)`.
fn is_catch_all(pat: &str) -> bool {
    let p: String = pat.chars().filter(|c| !c.is_whitespace()).collect();
    let inner = p
        .strip_prefix("Some(")
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or(&p);
    let binding = |s: &str| {
        let s = s.strip_prefix("ref").unwrap_or(s);
        let s = s.strip_prefix("mut").unwrap_or(s);
        !s.is_empty()
            && s.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    binding(inner) || (inner.contains('_') && inner.chars().all(|c| "_(),.".contains(c)))
}

/// No `matches!` over ops and no catch-all arm in a `match` over ops, outside
/// [`OP_DECLARATION`].
pub fn check_op_matches(sources: &[Source]) -> Result<(), String> {
    let mut bad = Vec::new();
    for s in sources.iter().filter(|s| s.path != OP_DECLARATION) {
        // Bracket characters as char literals (`'{'`) would unbalance the groups.
        let mut code_text = s.code();
        for b in ["'{'", "'}'", "'('", "')'", "'['", "']'"] {
            code_text = code_text.replace(b, "' '");
        }
        let code: Vec<char> = code_text.chars().collect();
        let line_of = |i: usize| code[..i].iter().filter(|&&c| c == '\n').count() + 1;
        let text: String = code.iter().collect();
        for (at, _) in text.match_indices("matches!(") {
            let at = text[..at].chars().count();
            let open = at + "matches!".len();
            let end = group_end(&code, open);
            if names_an_op(&code[open..end].iter().collect::<String>()) {
                bad.push(format!("{}:{}: matches! over ops", s.path, line_of(at)));
            }
        }
        for (at, _) in text.match_indices("match ") {
            let at = text[..at].chars().count();
            if at > 0 && (code[at - 1].is_ascii_alphanumeric() || code[at - 1] == '_') {
                continue;
            }
            let Some(open) = (at..code.len()).find(|&i| code[i] == '{') else {
                continue;
            };
            let end = group_end(&code, open);
            let pats = arm_patterns(&code, open, end);
            if pats.iter().any(|p| names_an_op(p)) && pats.iter().any(|p| is_catch_all(p)) {
                bad.push(format!(
                    "{}:{}: a catch-all arm in a match over ops",
                    s.path,
                    line_of(at)
                ));
            }
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "ops told apart without an exhaustive match (outside {OP_DECLARATION}; a new op kind \
             would pass silently): {}",
            bad.join(", ")
        ))
    }
}

/// Where a target's name may be tested: the registry, which parses it once into a
/// `TargetKind`.
const TARGET_REGISTRY: &str = "src/targets/registry.rs";

/// The registry's constants that hold a target's name or its prefix, by the path they are
/// imported by (an `as` alias of one counts too).
const TARGET_NAME_CONSTANTS: [&str; 3] =
    ["native_tensor::NAME", "python::REFERENCE", "mlx::PREFIX"];

/// Target names still tested as strings outside the registry, each by its file and the test
/// (as [`check_target_names`] prints it). To move: owned elsewhere this session; each goes when
/// its file turns to `TargetKind`, and an entry no longer found fails the check so the list
/// only shrinks.
const TARGET_NAME_TESTS_LEFT: [(&str, &str); 4] = [
    ("src/base/cache.rs", "split(['@', ' '])"),
    ("src/outputs/bug_report.rs", "starts_with(\"llama.cpp@\")"),
    ("src/outputs/bug_report.rs", "starts_with(\"llama.cpp@\")"),
    ("src/targets/mlx.rs", "strip_prefix(PREFIX)"),
];

/// The string methods that test or take apart the string they are called on or with.
const STRING_TESTS: [&str; 22] = [
    "starts_with",
    "ends_with",
    "contains",
    "strip_prefix",
    "strip_suffix",
    "trim_start_matches",
    "trim_end_matches",
    "trim_matches",
    "split",
    "rsplit",
    "splitn",
    "rsplitn",
    "split_once",
    "rsplit_once",
    "split_terminator",
    "find",
    "rfind",
    "matches",
    "match_indices",
    "replace",
    "eq",
    "ne",
];

/// The first words of target names (`native`, `llama.cpp`, ...), from the registry's kinds.
fn target_name_roots() -> Vec<String> {
    let mut roots: Vec<String> = kvaudit::targets::registry::TargetKind::ALL
        .iter()
        .flat_map(|k| k.pattern().split(", "))
        .map(|p| p.split(['@', '[']).next().unwrap_or(p).to_string())
        .collect();
    roots.sort();
    roots.dedup();
    roots
}

/// Whether a string literal's contents are a target's name or start with one (`native`,
/// `native[refcount]`, `llama.cpp@0.1.161 (arch=x)`, `mlx-lm@{v}`).
fn is_target_name(literal: &str, roots: &[String]) -> bool {
    roots.iter().any(|r| {
        literal
            .strip_prefix(r.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['@', '[', ' ', '+']))
    })
}

/// A call whose argument list encloses a place in the code.
struct Call {
    /// `starts_with`, `matches!`.
    name: String,
    /// Called as a method (`.name(`).
    method: bool,
    /// Where its name starts.
    start: usize,
    /// Where its `(` is.
    open: usize,
}

/// The call whose argument list encloses `at` (`starts_with` of `x.starts_with("a")`,
/// `matches!` of `matches!(x, "a")`), looking through array brackets and `format!`; `None`
/// outside a call or past the statement.
fn enclosing_call(c: &[char], at: usize) -> Option<Call> {
    let ident = |ch: char| ch.is_ascii_alphanumeric() || ch == '_';
    let mut depth = 0usize;
    let mut i = at;
    while i > 0 {
        i -= 1;
        match c[i] {
            ')' | ']' | '}' => depth += 1,
            '(' | '[' | '{' if depth > 0 => depth -= 1,
            '[' => {}
            '(' => {
                let bang = i > 0 && c[i - 1] == '!';
                let end = i - usize::from(bang);
                let mut start = end;
                while start > 0 && ident(c[start - 1]) {
                    start -= 1;
                }
                let word: String = c[start..end].iter().collect();
                if bang && word == "format" {
                    continue;
                }
                return Some(Call {
                    name: if bang { format!("{word}!") } else { word },
                    method: start > 0 && c[start - 1] == '.',
                    start,
                    open: i,
                });
            }
            '{' | ';' => return None,
            _ => {}
        }
    }
    None
}

/// The string literals of `code` (stripped: only kept literals have contents) as the char
/// ranges of their quotes; a `'"'` is no quote.
fn literals(code: &[char]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut open = None;
    for (i, &ch) in code.iter().enumerate() {
        let char_literal = i > 0 && code[i - 1] == '\'' && code.get(i + 1) == Some(&'\'');
        if ch != '"' || char_literal {
            continue;
        }
        match open.take() {
            Some(o) => out.push((o, i + 1)),
            None => open = Some(i),
        }
    }
    out
}

/// Where a target's name is tested as a string outside [`TARGET_REGISTRY`]: a string literal
/// that is a target's name (or begins like one, [`is_target_name`]), one of
/// [`TARGET_NAME_CONSTANTS`] or `'@'`, compared (`==`, `!=`), given to or called with a string
/// test ([`STRING_TESTS`]: `starts_with`, `strip_prefix`, `split`, ...), named in `matches!`,
/// or a `match` arm's pattern. Each as `path:line: the test`. Naming a target as data
/// (`TargetSpec::new("native", ..)`, a positive control's label, a message) is no test.
pub fn target_name_tests(sources: &[Source]) -> Vec<(String, usize, String)> {
    let roots = target_name_roots();
    let mut found = Vec::new();
    for s in sources
        .iter()
        .filter(|s| s.location() != TARGET_REGISTRY && !s.test_only)
    {
        let kept = strip_comments_keeping(&s.text, &|l| is_target_name(l, &roots));
        let code: Vec<char> = strip_tests(&kept).chars().collect();
        let text: String = code.iter().collect();
        // Each name: where it starts and ends (in chars).
        let to_chars = |b: usize| text[..b].chars().count();
        let mut names: Vec<(usize, usize)> = literals(&code)
            .into_iter()
            .filter(|&(a, b)| {
                let inside: String = code[a + 1..b - 1].iter().collect();
                is_target_name(&inside, &roots)
            })
            .collect();
        let mut aliases: Vec<String> = Vec::new();
        for k in TARGET_NAME_CONSTANTS {
            for (at, _) in text.match_indices(k) {
                let end = at + k.len();
                names.push((to_chars(at), to_chars(end)));
                let after = text[end..].trim_start();
                if let Some(alias) = after.strip_prefix("as ") {
                    let alias: String = alias
                        .trim_start()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    aliases.push(alias);
                }
            }
            // Inside its own module the constant goes by its last word.
            let (module, word) = k.split_once("::").unwrap_or(("", k));
            if s.path.ends_with(&format!("{module}.rs")) {
                aliases.push(word.to_string());
            }
        }
        for w in aliases.iter().map(String::as_str).chain(["'@'"]) {
            for (at, _) in text.match_indices(w) {
                let before = text[..at].chars().next_back();
                let after = text[at + w.len()..].chars().next();
                let ident = |c: Option<char>| {
                    c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
                };
                if !ident(before) && !ident(after) {
                    names.push((to_chars(at), to_chars(at + w.len())));
                }
            }
        }
        // A constant's path is read whole (`crate::targets::python::REFERENCE`).
        for (start, _) in names.iter_mut() {
            while *start > 0
                && (code[*start - 1].is_ascii_alphanumeric()
                    || code[*start - 1] == '_'
                    || code[*start - 1] == ':')
                && code[*start] != '"'
                && code[*start] != '\''
            {
                *start -= 1;
            }
        }
        names.sort();
        names.dedup();
        let line_of = |i: usize| code[..i].iter().filter(|&&c| c == '\n').count() + 1;
        let squash = |v: &[char]| {
            v.iter()
                .collect::<String>()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        for (start, end) in names {
            let name = squash(&code[start..end]);
            let before: String = code[..start]
                .iter()
                .collect::<String>()
                .trim_end()
                .to_string();
            let after_text: String = code[end..].iter().collect();
            let after = after_text.trim_start();
            let after_closers =
                after.trim_start_matches(|c: char| c == ')' || c == ']' || c.is_whitespace());
            let test = if let Some(op) = ["==", "!="].iter().find(|op| before.ends_with(**op)) {
                Some(format!("{op} {name}"))
            } else if let Some(op) = ["==", "!="].iter().find(|op| after.starts_with(**op)) {
                Some(format!("{name} {op}"))
            } else if after_closers.starts_with("=>")
                || (after_closers.starts_with('|') && !after_closers.starts_with("||"))
            {
                Some(format!("{name} =>"))
            } else if let Some(m) = after.strip_prefix('.').and_then(|a| {
                STRING_TESTS.iter().find(|t| {
                    a.strip_prefix(**t)
                        .is_some_and(|r| r.trim_start().starts_with('('))
                })
            }) {
                Some(format!("{name}.{m}(..)"))
            } else if let Some(call) = enclosing_call(&code, start) {
                let tests = call.name == "matches!"
                    || (call.method && STRING_TESTS.contains(&call.name.as_str()));
                tests.then(|| squash(&code[call.start..group_end(&code, call.open)]))
            } else {
                None
            };
            if let Some(test) = test {
                found.push((s.location(), line_of(start), test));
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// No target's name is tested as a string outside [`TARGET_REGISTRY`] but the ones
/// [`TARGET_NAME_TESTS_LEFT`] names, and each of those is still there.
pub fn check_target_names_with(sources: &[Source], left: &[(&str, &str)]) -> Result<(), String> {
    let found = target_name_tests(sources);
    let mut allowed: Vec<(String, String)> = left
        .iter()
        .map(|(f, t)| (f.to_string(), t.to_string()))
        .collect();
    let mut bad = Vec::new();
    for (file, line, test) in &found {
        match allowed.iter().position(|(f, t)| f == file && t == test) {
            Some(i) => {
                allowed.remove(i);
            }
            None => bad.push(format!("{file}:{line}: {test}")),
        }
    }
    let mut problems = Vec::new();
    if !bad.is_empty() {
        problems.push(format!(
            "a target's name tested as a string outside {TARGET_REGISTRY} (parse it into a \
             TargetKind there and match the kind): {}",
            bad.join(", ")
        ));
    }
    if !allowed.is_empty() {
        let gone: Vec<String> = allowed.iter().map(|(f, t)| format!("{f}: {t}")).collect();
        problems.push(format!(
            "listed in TARGET_NAME_TESTS_LEFT but no longer found (take them off the list): {}",
            gone.join(", ")
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// [`check_target_names_with`] the leftovers of [`TARGET_NAME_TESTS_LEFT`].
pub fn check_target_names(sources: &[Source]) -> Result<(), String> {
    check_target_names_with(sources, &TARGET_NAME_TESTS_LEFT)
}

/// Every `.rs` file under `src/` (the library and the binary), by its path from the
/// repository root.
pub fn src_sources() -> Vec<Source> {
    let mut out = op_sources();
    out.retain(|s| s.path.starts_with("src/"));
    out
}

fn run(
    f: fn(&[Source]) -> Result<(), String>,
) -> impl FnOnce() -> Result<(), libtest_mimic::Failed> {
    move || super::outcome(f(&library_sources()))
}

/// `f` over the library and the target crates.
fn run_all(
    f: fn(&[Source]) -> Result<(), String>,
) -> impl FnOnce() -> Result<(), libtest_mimic::Failed> {
    move || super::outcome(f(&all_sources()))
}

fn must_fail(
    f: fn(&[Source]) -> Result<(), String>,
    tree: Vec<Source>,
    says: &'static str,
) -> impl FnOnce() -> Result<(), libtest_mimic::Failed> {
    move || {
        super::outcome(match f(&tree) {
            Ok(()) => Err("the check passed a tree that breaks it".into()),
            Err(e) if e.contains(says) => Ok(()),
            Err(e) => Err(format!("the check failed, but without \"{says}\": {e}")),
        })
    }
}

pub fn trials() -> Vec<Trial> {
    let lib_rs = super::root().join("src/lib.rs");
    vec![
        Trial::test("tidy::layers", run(check_layers)),
        Trial::test("tidy::unsafe_code", run_all(check_unsafe)),
        Trial::test("tidy::one_state_parser", move || {
            // native-kv models llama.cpp down to its own state writer and reader: those bytes
            // are the model's, not a target's that kvaudit reads.
            let mut sources = all_sources();
            sources.retain(|s| s.dir != NATIVE_KV);
            super::outcome(check_one_state_parser(&sources))
        }),
        Trial::test(
            "tidy::dump_layout_in_targets",
            run(check_dump_layout_in_targets),
        ),
        Trial::test(
            "tidy::checks_catch_a_dump_parsed_by_the_runner",
            must_fail(
                check_dump_layout_in_targets,
                vec![Source::new(
                    "running/observe.rs",
                    "//! x\nfn f(b: &[u8]) { let _ = parse_seq_state(b, StateFormat::default()); }\n",
                )],
                "running/observe.rs",
            ),
        ),
        Trial::test("tidy::module_docs", run_all(check_module_docs)),
        Trial::test("tidy::error_style", run_all(check_error_style)),
        Trial::test("tidy::target_names_tested_in_the_registry_only", move || {
            super::outcome(check_target_names(&src_sources()))
        }),
        Trial::test("tidy::checks_catch_a_target_name_tested", move || {
            let tree = vec![
                Source::new(
                    "outputs/x.rs",
                    "//! x\nfn f(t: &str) -> bool {\n    t.starts_with(\"llama.cpp@\")\n}\n",
                ),
                Source::new(
                    "engines/y.rs",
                    "//! y\nfn g(name: &str) -> u8 {\n    match name {\n        \"native\" => 1,\n        \"python-ref\" | \"mlx-lm@0.32.2\" => 2,\n        _ => 0,\n    }\n}\n",
                ),
                Source::new(
                    "base/z.rs",
                    "//! z\nfn h(n: &str, s: &Spec) -> bool {\n    let i = n.split(['@', ' ']).next();\n    s.name == crate::targets::native_tensor::NAME\n}\n",
                ),
                Source::new(
                    "cli/w.rs",
                    "//! w\nuse kvaudit::targets::mlx::PREFIX as MLX;\nfn k(l: &str) -> bool {\n    l.strip_prefix(MLX).is_some()\n        || matches!(l, \"native+tensors\")\n        || \"native\" != l\n}\n",
                ),
                // The registry may; a name as data is no test; nor is a test's.
                Source::new(
                    "targets/registry.rs",
                    "//! r\nfn parse(n: &str) -> bool {\n    n == \"native\" || n.starts_with(\"llama.cpp@\")\n}\n",
                ),
                Source::new(
                    "engines/v.rs",
                    "//! v\nfn data(v: &str) -> Vec<String> {\n    let s = TargetSpec::new(\"native\", &[]);\n    let c = Control { target: \"native[refcount]\" };\n    vec![format!(\"llama.cpp@{v}\"), \"python-ref\".into()]\n}\n#[cfg(test)]\nmod tests {\n    fn t(x: &str) { assert!(x == \"native\"); }\n}\n",
                ),
            ];
            let says = [
                "src/base/z.rs:3: split(['@', ' '])",
                "src/base/z.rs:4: == crate::targets::native_tensor::NAME",
                "src/cli/w.rs:4: strip_prefix(MLX)",
                "src/cli/w.rs:5: matches!(l, \"native+tensors\")",
                "src/cli/w.rs:6: \"native\" !=",
                "src/engines/y.rs:4: \"native\" =>",
                "src/engines/y.rs:5: \"python-ref\" =>",
                "src/engines/y.rs:5: \"mlx-lm@0.32.2\" =>",
                "src/outputs/x.rs:3: starts_with(\"llama.cpp@\")",
            ];
            let e = check_target_names_with(&tree, &[]).err().unwrap_or_default();
            let missed: Vec<&str> = says.iter().copied().filter(|w| !e.contains(w)).collect();
            let found = target_name_tests(&tree);
            let extra = found
                .iter()
                .any(|(f, _, _)| f.ends_with("registry.rs") || f.ends_with("v.rs"));
            let found = found.len();
            // A leftover no longer there fails too, so the list only shrinks.
            let stale = check_target_names_with(&[], &[("src/outputs/gone.rs", "== \"native\"")])
                .err()
                .unwrap_or_default();
            super::outcome(
                if missed.is_empty() && !extra && found == says.len() && stale.contains("src/outputs/gone.rs: == \"native\"") {
                    Ok(())
                } else {
                    Err(format!(
                        "missed {missed:?}; registry or data caught: {extra}; {found} found; \
                         the check said: {e}; stale: {stale:?}"
                    ))
                },
            )
        }),
        Trial::test("tidy::ops_matched_exhaustively", move || {
            super::outcome(check_op_matches(&op_sources()))
        }),
        Trial::test(
            "tidy::checks_catch_a_catch_all_over_ops",
            must_fail(
                check_op_matches,
                vec![
                    Source::new(
                        "src/oracles/x.rs",
                        "//! x\nfn moves(op: &Op) -> bool {\n    match op {\n        Op::SeqAdd { .. } | Op::SeqDiv { .. } => true,\n        _ => false,\n    }\n}\n",
                    ),
                    Source::new(
                        "src/engines/y.rs",
                        "//! y\nfn f(op: &Op) -> bool {\n    matches!(\n        op,\n        Op::Clear\n    )\n}\n",
                    ),
                    Source::new(
                        "benches/z.rs",
                        "//! z\nfn g(op: Option<&Op>) -> u8 {\n    match op {\n        Some(Op::Decode(d)) => { 1 }\n        Some(other) => 2,\n        None => 0,\n    }\n}\n",
                    ),
                    Source::new(
                        "src/base/op_kind.rs",
                        "//! the declaration\nfn ok(k: OpKind) -> bool { matches!(k, OpKind::Clear) }\n",
                    ),
                ],
                "src/oracles/x.rs:3: a catch-all arm in a match over ops, src/engines/y.rs:3: \
                 matches! over ops, benches/z.rs:3: a catch-all arm in a match over ops",
            ),
        ),
        Trial::test("tidy::checks_pass_an_exhaustive_match_over_ops", move || {
            super::outcome(check_op_matches(&[Source::new(
                "src/oracles/x.rs",
                "//! x\nfn moves(op: &Op, o: Outcome) -> bool {\n    match o { Outcome::A => {}, _ => {} }\n    match op {\n        Op::SeqAdd { .. } | Op::SeqDiv { .. } => true,\n        Op::Decode(d) if d.n > 1 => { false }\n        Op::Decode(_) | Op::Clear => false,\n    }\n}\n",
            )]))
        }),
        Trial::test(
            "tidy::checks_catch_a_string_error",
            must_fail(
                check_error_style,
                vec![Source::new(
                    "base/x.rs",
                    "//! x\npub fn parse(\n    s: &str,\n) -> Result<u32, String> {\n    todo!()\n}\n",
                )],
                "src/base/x.rs: parse",
            ),
        ),
        Trial::test("tidy::cli_outside_the_library", move || {
            let text = std::fs::read_to_string(&lib_rs).map_err(|e| e.to_string())?;
            super::outcome(if has_word(&strip_comments(&text), "cli") {
                Err(
                    "src/lib.rs declares or uses `cli`: the command line lives in the binary"
                        .into(),
                )
            } else {
                Ok(())
            })
        }),
        Trial::test(
            "tidy::checks_catch_an_import_against_the_layers",
            must_fail(
                check_layers,
                vec![
                    Source::new("base/op.rs", "//! x\nuse crate::engines::explore::run;\n"),
                    Source::new("engines/explore.rs", "//! x\npub fn run() {}\n"),
                ],
                "src/base/op.rs: imports engines::explore::run (layer engines) from layer base",
            ),
        ),
        Trial::test(
            "tidy::checks_catch_a_cycle_in_a_layer",
            must_fail(
                check_layers,
                vec![
                    Source::new(
                        "records/a.rs",
                        "//! x\nuse crate::records::{b::B, c};\npub struct A;\n",
                    ),
                    Source::new("records/b.rs", "//! x\npub struct B(super::a::A);\n"),
                    Source::new(
                        "records/c.rs",
                        "//! x\n#[cfg(test)]\nmod tests { use crate::engines::x; }\n",
                    ),
                ],
                "import cycle: records::a -> records::b -> records::a",
            ),
        ),
        Trial::test(
            "tidy::checks_ignore_tests_comments_and_strings",
            move || {
                let tree = vec![
                    Source::new(
                        "base/op.rs",
                        "//! see [`crate::engines::explore`]\nconst S: &str = \"crate::engines::x\"; // crate::outputs\n#[cfg(test)]\nmod tests {\n    use crate::engines::explore;\n}\n",
                    ),
                    Source::new("engines/explore.rs", "//! x\n"),
                ];
                super::outcome(check_layers(&tree))
            },
        ),
        Trial::test("tidy::checks_read_the_target_crates", move || {
            // Each target crate is read (a moved folder would leave it unchecked), the allowed
            // `unsafe` modules exist, and `unsafe` in any other file of a crate is caught.
            let sources = all_sources();
            let missing: Vec<&str> = TARGET_CRATES
                .iter()
                .copied()
                .filter(|dir| !sources.iter().any(|s| s.dir == *dir))
                .chain(
                    UNSAFE_ALLOWED
                        .iter()
                        .copied()
                        .filter(|l| !sources.iter().any(|s| s.location() == *l)),
                )
                .collect();
            let stray = Source {
                path: "build/mod.rs".into(),
                dir: TARGET_CRATES[0].into(),
                text: "//! x
fn f() { unsafe {} }
".into(),
                test_only: false,
            };
            let u = check_unsafe(&[stray]).err().unwrap_or_default();
            super::outcome(
                if missing.is_empty() && u.contains("targets/llama-cpp/src/build/mod.rs") {
                    Ok(())
                } else {
                    Err(format!("not read: {missing:?}; unsafe: {u:?}"))
                },
            )
        }),
        Trial::test("tidy::checks_catch_unsafe_and_a_second_parser", move || {
            let tree = vec![Source::new(
                "engines/fuzz.rs",
                "//! x\nfn f(b: [u8; 4]) -> u32 { unsafe { u32::from_le_bytes(b) } }\n",
            )];
            let u = check_unsafe(&tree).err().unwrap_or_default();
            let p = check_one_state_parser(&tree).err().unwrap_or_default();
            let d = check_module_docs(&[Source::new("base/x.rs", "fn f() {}\n")])
                .err()
                .unwrap_or_default();
            super::outcome(
                if u.contains("engines/fuzz.rs")
                    && p.contains("engines/fuzz.rs")
                    && d.contains("base/x.rs")
                {
                    Ok(())
                } else {
                    Err(format!("unsafe: {u:?}; parser: {p:?}; docs: {d:?}"))
                },
            )
        }),
    ]
}
