//! Standalone C reproducers: a trace and its finding as a C program over llama.h only.
//!
//! The program is what a user pastes into a llama.cpp issue: it needs llama.h, a llama.cpp build
//! to link against and a model file (the generated tiny model works; its path is baked in and can
//! be overridden by `argv[1]`). It performs the setup and the ops, printing each llama.h call, and
//! at the finding's step checks the oracle itself, from the context's own serialized state. Exit
//! codes: 1 = the finding reproduces, 0 = it does not, 2 = the program could not set up (model or
//! context failed). A crash finding reproduces by crashing (the shell sees 128 + signal).
//!
//! The input is hostile: repro files travel between users, and `--check` compiles and runs what
//! this module writes. No text from the input reaches the program except through
//! [`c_string_literal`] (every byte that is not printable ASCII, and `"`, `\`, `?`, as an escape)
//! or [`c_comment_lines`] (printable ASCII only, `*/` and `/*` broken, one ` * ` line per input
//! line). Numbers are formatted from integers. `tests/it/hostile.rs` checks it with a compiler.

use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::base::error::Error;
use crate::base::files::read_text_limited;
use crate::base::op::{Op, Trace};
use crate::oracles::OracleId;
use crate::outputs::repro::{check_trace_limits, MAX_REPRO_BYTES};
use crate::records::report::terminal_text;

/// What a reproducer needs from a repro file or a report finding.
#[derive(Clone, Debug, Deserialize)]
pub struct ReproInput {
    /// The oracle that failed.
    pub oracle: OracleId,
    /// The trace.
    pub trace: Trace,
    /// 1-based step at which the finding is observed (default: the last op).
    #[serde(default)]
    pub step: Option<usize>,
    /// The sequence concerned.
    #[serde(default)]
    pub seq: Option<i32>,
    /// What the reference said (differential findings compare against it).
    #[serde(default)]
    pub expected: Value,
    /// Short class of the finding, for the comment.
    #[serde(default)]
    pub kind: Option<String>,
    /// Where it was seen.
    #[serde(default)]
    pub target: Option<Value>,
}

/// Reads a repro file or a finding (any JSON object with `oracle` and `trace`), at most
/// [`MAX_REPRO_BYTES`], with a trace inside the [`check_trace_limits`] bounds.
pub fn read_input(path: &Path) -> Result<ReproInput, Error> {
    let text = read_text_limited(path, MAX_REPRO_BYTES)?;
    parse_input(&text).map_err(|e| e.context(path.display()))
}

/// Parses a reproducer's input (see [`read_input`]); errors say where. Only inputs whose oracle
/// has a C check ([`C_CHECKED`]) parse: [`emit_c`] states that check in C.
pub fn parse_input(text: &str) -> Result<ReproInput, Error> {
    let input: ReproInput = serde_json::from_str(text).map_err(|e| {
        // serde quotes the offending value, which the file's author chose.
        let what = terminal_text(&e.to_string());
        format!("line {}, column {}: {what}", e.line(), e.column())
    })?;
    check_trace_limits(&input.trace)?;
    if !C_CHECKED.contains(&input.oracle) {
        return Err(Error::input(format!(
            "oracle {} has no check in C reproducers (they check {})",
            input.oracle,
            C_CHECKED.map(|o| o.name()).join(", ")
        )));
    }
    Ok(input)
}

/// `s` as a C string literal, escaped by construction: printable ASCII other than `"`, `\` and
/// `?` as itself, `"` `\` `?` with a backslash (`\?` keeps `??/` from being a trigraph), every
/// other byte (control characters, NUL, each byte of a UTF-8 sequence) as a three-digit octal
/// escape, which cannot run into the next character the way a hex escape does.
pub fn c_string_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for &b in s.as_bytes() {
        match b {
            b'"' | b'\\' | b'?' => {
                out.push('\\');
                out.push(b as char);
            }
            0x20..=0x7e => out.push(b as char),
            _ => {
                let _ = write!(out, "\\{b:03o}");
            }
        }
    }
    out.push('"');
    out
}

/// `s` as the text of lines inside a `/* ... */` comment: one line per input line, each only
/// printable ASCII. `*/` (which would end the comment) and `/*` become `* /` and `/ *`; any other
/// character, including a tab, a backslash (a line splice) and non-ASCII (bidirectional
/// overrides make code read otherwise than it compiles), is written as `\u{..}` text.
pub fn c_comment_lines(s: &str) -> Vec<String> {
    s.split('\n')
        .map(|line| {
            let mut out = String::with_capacity(line.len());
            let mut prev = ' ';
            for c in line.chars() {
                match c {
                    '/' if prev == '*' => out.push_str(" /"),
                    '*' if prev == '/' => out.push_str(" *"),
                    '\\' => out.push_str("\\u{5c}"),
                    ' '..='~' => out.push(c),
                    c => {
                        let _ = write!(out, "\\u{{{:x}}}", c as u32);
                    }
                }
                prev = c;
            }
            out
        })
        .collect()
}

/// What input text must never change in a generated program: its preprocessor lines, comment
/// delimiters and NUL bytes, counted (`#` lines, `/*`, `*/`, NULs) and the preprocessor lines
/// themselves. Two programs for the same trace, one with hostile free text and one without,
/// have the same shape.
pub fn program_shape(program: &str) -> (Vec<&str>, usize, usize, usize) {
    let directives = program
        .lines()
        .filter(|l| l.trim_start().starts_with('#'))
        .collect();
    (
        directives,
        program.matches("/*").count(),
        program.matches("*/").count(),
        program.matches('\0').count(),
    )
}

/// The oracles whose check a C reproducer states in C.
pub const C_CHECKED: [OracleId; 4] = [
    OracleId::I1,
    OracleId::I2,
    OracleId::DIFFERENTIAL,
    OracleId::CRASH,
];

fn c_array(v: &[i32]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn emit_op(out: &mut String, op: &Op, label: &str) {
    let _ = writeln!(
        out,
        "    printf(\"%s: %s\\n\", {}, {});",
        c_string_literal(label),
        c_string_literal(&op.to_string())
    );
    match op {
        Op::SeqRm { seq, p0, p1 } => {
            let _ = writeln!(out, "    llama_memory_seq_rm(mem, {seq}, {p0}, {p1});");
        }
        Op::SeqCp { src, dst, p0, p1 } => {
            let _ = writeln!(
                out,
                "    llama_memory_seq_cp(mem, {src}, {dst}, {p0}, {p1});"
            );
        }
        Op::SeqKeep { seq } => {
            let _ = writeln!(out, "    llama_memory_seq_keep(mem, {seq});");
        }
        Op::SeqAdd { seq, p0, p1, delta } => {
            let _ = writeln!(
                out,
                "    llama_memory_seq_add(mem, {seq}, {p0}, {p1}, {delta});"
            );
        }
        Op::SeqDiv { seq, p0, p1, d } => {
            let _ = writeln!(
                out,
                "    llama_memory_seq_div(mem, {seq}, {p0}, {p1}, {d});"
            );
        }
        Op::Clear => {
            let _ = writeln!(out, "    llama_memory_clear(mem, true);");
        }
        // Placeholder until the C reproducer learns the state ops (issue 10, in progress).
        Op::StateSeqSave { .. }
        | Op::StateSeqLoad { .. }
        | Op::StateSave { .. }
        | Op::StateLoad { .. } => {
            let _ = writeln!(
                out,
                "    fprintf(stderr, \"state ops are not emitted yet\\n\"); return 2;"
            );
        }
        Op::Decode(d) => {
            let tokens = d.token_ids();
            let pos: Vec<i32> = match d.pos {
                Some(p) => (0..d.n as i32).map(|i| p + i).collect(),
                None => vec![],
            };
            let _ = writeln!(out, "    {{");
            let _ = writeln!(
                out,
                "        const llama_token toks[] = {{{}}};",
                c_array(&tokens)
            );
            let _ = writeln!(
                out,
                "        const llama_seq_id seqs[] = {{{}}};",
                c_array(&d.seqs)
            );
            if pos.is_empty() {
                let _ = writeln!(
                    out,
                    "        int rc = decode(ctx, {}, toks, NULL, {}, seqs);",
                    d.n,
                    d.seqs.len()
                );
            } else {
                let _ = writeln!(
                    out,
                    "        const llama_pos pos[] = {{{}}};",
                    c_array(&pos)
                );
                let _ = writeln!(
                    out,
                    "        int rc = decode(ctx, {}, toks, pos, {}, seqs);",
                    d.n,
                    d.seqs.len()
                );
            }
            let _ = writeln!(
                out,
                "        printf(\"  llama_decode returned %d\\n\", rc);"
            );
            let _ = writeln!(out, "    }}");
        }
    }
}

/// The C program for `input`; `model` is the default model path baked in.
pub fn emit_c(input: &ReproInput, model: &Path) -> String {
    let t = &input.trace;
    let step = input
        .step
        .unwrap_or(t.ops.len())
        .clamp(1, t.ops.len().max(1));
    let seqs: Vec<i32> = match input.seq {
        Some(s) => vec![s],
        None => (0..t.setup.n_seq_max as i32).collect(),
    };
    let mut s = String::new();
    let ops_json: Vec<String> = t.ops.iter().map(Op::to_json).collect();
    let kind = c_comment_lines(input.kind.as_deref().unwrap_or_default());
    let _ = writeln!(s, "/* kvaudit reproducer: {} {}", input.oracle, kind[0]);
    for line in &kind[1..] {
        let _ = writeln!(s, " *   {line}");
    }
    if let Some(target) = &input.target {
        let target = c_comment_lines(&target.to_string());
        let _ = writeln!(s, " * Seen on: {}", target[0]);
        for line in &target[1..] {
            let _ = writeln!(s, " *   {line}");
        }
    }
    let _ = writeln!(
        s,
        " * Setup: n_ctx {}, n_seq_max {}, kv_unified, then:",
        t.setup.n_ctx, t.setup.n_seq_max
    );
    for op in &t.setup.ops {
        let _ = writeln!(s, " *   {}", op.to_json());
    }
    let _ = writeln!(s, " * Ops (checked after op {step}):");
    for o in &ops_json {
        let _ = writeln!(s, " *   {o}");
    }
    let _ = writeln!(s, " *");
    let _ = writeln!(s, " * Build: cc -std=gnu11 repro.c -I LLAMA/include -I LLAMA/ggml/include LIBLLAMA_AND_GGML -lstdc++ -lpthread -lm");
    let _ = writeln!(
        s,
        " * Run:   ./repro [MODEL.gguf]   exit 1: reproduces; 0: does not; 2: setup failed."
    );
    let _ = writeln!(
        s,
        " * Generated by kvaudit {}. */",
        env!("CARGO_PKG_VERSION")
    );
    s.push_str(C_PRELUDE);
    let _ = writeln!(s, "int main(int argc, char **argv) {{");
    let _ = writeln!(
        s,
        "    const char *model_path = argc > 1 ? argv[1] : {};",
        c_string_literal(&model.display().to_string())
    );
    let _ = writeln!(s, "    llama_log_set(quiet, NULL);");
    let _ = writeln!(s, "    llama_backend_init();");
    let _ = writeln!(
        s,
        "    struct llama_model_params mp = llama_model_default_params();"
    );
    let _ = writeln!(
        s,
        "    struct llama_model *model = llama_model_load_from_file(model_path, mp);"
    );
    let _ = writeln!(
        s,
        "    if (!model) {{ fprintf(stderr, \"cannot load %s\\n\", model_path); return 2; }}"
    );
    let _ = writeln!(
        s,
        "    struct llama_context_params cp = llama_context_default_params();"
    );
    let _ = writeln!(
        s,
        "    cp.n_ctx = {}; cp.n_seq_max = {}; cp.kv_unified = true;",
        t.setup.n_ctx, t.setup.n_seq_max
    );
    let _ = writeln!(s, "    cp.n_threads = 1; cp.n_threads_batch = 1; cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;");
    let _ = writeln!(
        s,
        "    struct llama_context *ctx = llama_init_from_model(model, cp);"
    );
    let _ = writeln!(
        s,
        "    if (!ctx) {{ fprintf(stderr, \"cannot create a context\\n\"); return 2; }}"
    );
    let _ = writeln!(s, "    llama_memory_t mem = llama_get_memory(ctx);");
    for op in &t.setup.ops {
        emit_op(&mut s, op, "setup");
    }
    for (i, op) in t.ops.iter().take(step).enumerate() {
        emit_op(&mut s, op, &format!("op {}", i + 1));
    }
    let _ = writeln!(s, "    int reproduced = 0;");
    let _ = writeln!(
        s,
        "    const llama_seq_id check[] = {{{}}};",
        c_array(&seqs)
    );
    let _ = writeln!(
        s,
        "    for (size_t k = 0; k < sizeof check / sizeof check[0]; k++) {{"
    );
    let _ = writeln!(s, "        llama_seq_id sq = check[k];");
    let _ = writeln!(
        s,
        "        int cells[4096]; int n = resident(ctx, sq, cells, 4096);"
    );
    let _ = writeln!(s, "        llama_pos mn = llama_memory_seq_pos_min(mem, sq), mx = llama_memory_seq_pos_max(mem, sq);");
    let _ = writeln!(
        s,
        "        int tmin = n ? cells[0] : -1, tmax = n ? cells[n - 1] : -1;"
    );
    let _ = writeln!(s, "        printf(\"seq %d: seq_pos_min %d, seq_pos_max %d; serialized cells (%d):\", sq, mn, mx, n);");
    let _ = writeln!(
        s,
        "        for (int i = 0; i < n; i++) printf(\" %d\", cells[i]);"
    );
    let _ = writeln!(s, "        printf(\"\\n\");");
    match input.oracle {
        OracleId::I1 => {
            let _ = writeln!(s, "        if (mn != tmin || mx != tmax) {{ printf(\"I1 violated: accessors say [%d, %d], the state says [%d, %d]\\n\", mn, mx, tmin, tmax); reproduced = 1; }}");
        }
        OracleId::I2 => {
            let _ = writeln!(s, "        for (int i = 1; i < n; i++) if (cells[i] - cells[i - 1] > 1) {{ printf(\"I2 violated: positions %d..%d missing\\n\", cells[i - 1] + 1, cells[i] - 1); reproduced = 1; }}");
        }
        OracleId::DIFFERENTIAL => {
            let e = &input.expected;
            let emin = e.get("pos_min").and_then(Value::as_i64).unwrap_or(-1);
            let emax = e.get("pos_max").and_then(Value::as_i64).unwrap_or(-1);
            let ecells: Vec<i32> = e
                .get("cells")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_i64)
                        .map(|x| x as i32)
                        .collect()
                })
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "        const int want[] = {{{}}}; const int nwant = {};",
                if ecells.is_empty() {
                    "0".into()
                } else {
                    c_array(&ecells)
                },
                ecells.len()
            );
            let _ = writeln!(
                s,
                "        int same = mn == {emin} && mx == {emax} && n == nwant;"
            );
            let _ = writeln!(
                s,
                "        for (int i = 0; same && i < n; i++) same = cells[i] == want[i];"
            );
            let _ = writeln!(s, "        if (!same) {{ printf(\"differs from the reference: seq_pos_min {emin}, seq_pos_max {emax}, {} cells\\n\"); reproduced = 1; }}", ecells.len());
        }
        OracleId::CRASH => {
            let _ = writeln!(s, "        (void)tmin; (void)tmax;");
        }
        // `read_input` refuses every other oracle.
        other => unreachable!("no C check for oracle {other}"),
    }
    let _ = writeln!(s, "    }}");
    if input.oracle == OracleId::CRASH {
        let _ = writeln!(
            s,
            "    printf(\"no crash: the finding does not reproduce\\n\");"
        );
    }
    let _ = writeln!(s, "    llama_free(ctx);");
    let _ = writeln!(s, "    llama_model_free(model);");
    let _ = writeln!(
        s,
        "    printf(reproduced ? \"REPRODUCED\\n\" : \"not reproduced\\n\");"
    );
    let _ = writeln!(s, "    return reproduced;");
    let _ = writeln!(s, "}}");
    s
}

const C_PRELUDE: &str = r#"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)level; (void)text; (void)user;
}

/* One llama_decode; pos == NULL lets llama.cpp choose each sequence's next position. */
static int decode(struct llama_context *ctx, int n, const llama_token *toks, const llama_pos *pos,
                  int n_seq, const llama_seq_id *seqs) {
    struct llama_batch b = llama_batch_init(n, 0, n_seq);
    llama_pos *own_pos = b.pos;
    for (int i = 0; i < n; i++) {
        b.token[i] = toks[i];
        if (pos) b.pos[i] = pos[i];
        b.n_seq_id[i] = n_seq;
        for (int s = 0; s < n_seq; s++) b.seq_id[i][s] = seqs[s];
        b.logits[i] = i == n - 1;
    }
    b.n_tokens = n;
    if (!pos) b.pos = NULL;
    int rc = llama_decode(ctx, b);
    b.pos = own_pos;
    llama_batch_free(b);
    return rc;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The positions of seq's cells in llama_state_seq_get_data (magic, seq id, n_stream, then per
 * stream a cell count and (pos, n_seq_id, seq ids) per cell), sorted. */
static int resident(struct llama_context *ctx, llama_seq_id seq, int *out, int cap) {
    size_t size = llama_state_seq_get_size(ctx, seq);
    uint8_t *buf = malloc(size ? size : 1);
    size_t got = llama_state_seq_get_data(ctx, buf, size, seq);
    size_t at = 8; /* magic, seq id */
    int n = 0;
    uint32_t n_stream = 0;
    if (got >= 12) { memcpy(&n_stream, buf + at, 4); at += 4; }
    for (uint32_t s = 0; s < n_stream && at + 4 <= got; s++) {
        uint32_t count; memcpy(&count, buf + at, 4); at += 4;
        if (count == 0) continue;
        for (uint32_t c = 0; c < count && at + 8 <= got; c++) {
            int32_t p; uint32_t ns; memcpy(&p, buf + at, 4); memcpy(&ns, buf + at + 4, 4);
            at += 8 + 4 * (size_t)ns;
            if (n < cap) out[n++] = p;
        }
        break; /* one unified stream: the K/V data that follows is not needed */
    }
    free(buf);
    qsort(out, n, sizeof out[0], cmp_int);
    return n;
}

"#;

/// Fuzz target `repro_json` (`fuzz/fuzz_targets/repro_json.rs`, and `tests/it/fuzz_seeds.rs` over
/// its seeds): any bytes either fail to parse with an error, or give a repro that writes back to
/// text that parses to the same repro, under a safe file name; any bytes that read as a
/// reproducer's input give a C program with the same preprocessor lines and comment delimiters
/// as the same input with its free text removed ([`program_shape`]).
/// Panics otherwise.
#[doc(hidden)]
pub fn fuzz_repro_json(data: &[u8]) {
    use crate::outputs::repro::{safe_file_name, Repro};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(r) = Repro::parse(text) {
        let again = r.to_text();
        assert_eq!(Repro::parse(&again).as_ref(), Ok(&r), "{again}");
        let name = r.file_name();
        assert_eq!(safe_file_name(&name), name);
    }
    if let Ok(input) = parse_input(text) {
        let model = Path::new("/tmp/model.gguf");
        let program = emit_c(&input, model);
        let mut plain = input.clone();
        plain.kind = None;
        plain.target = None;
        assert_eq!(
            program_shape(&program),
            program_shape(&emit_c(&plain, model)),
            "{program}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oracle_without_a_c_check_does_not_parse() {
        let text = r#"{"oracle": "T1", "trace": {"setup": {"n_ctx": 8, "n_seq_max": 1, "ops": []}, "ops": [{"op": "clear"}]}}"#;
        let e = parse_input(text).unwrap_err();
        assert!(e.message.starts_with("oracle T1 has no check"), "{e}");
        let fine = text.replace("T1", "I1");
        assert_eq!(parse_input(&fine).unwrap().oracle, OracleId::I1);
    }

    #[test]
    fn the_seed_repro_reads_as_c() {
        let json = r#"{"oracle":"I1","seq":1,"trace":{"setup":{"n_ctx":256,"n_seq_max":2,"ops":[{"op":"decode","seq":0,"n":7}]},
            "ops":[{"op":"seq_cp","src":0,"dst":1,"p0":0,"p1":3},{"op":"seq_cp","src":0,"dst":1,"p0":0,"p1":3},{"op":"seq_keep","seq":0}]}}"#;
        let input: ReproInput = serde_json::from_str(json).unwrap();
        let c = emit_c(&input, Path::new("/tmp/m.gguf"));
        assert!(c.contains("llama_memory_seq_cp(mem, 0, 1, 0, 3);"));
        assert!(c.contains("llama_memory_seq_keep(mem, 0);"));
        assert!(c.contains("int rc = decode(ctx, 7, toks, NULL, 1, seqs);"));
        assert!(c.contains("I1 violated"));
        assert_eq!(
            c.lines()
                .filter(|l| l.trim_start().starts_with("llama_memory_seq_cp("))
                .count(),
            2
        );
    }
}
