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
//! line). Numbers are formatted from integers. Slot names become C identifiers (`slot_NAME`):
//! [`crate::base::op::Slot`] admits only `[a-z0-9_]{1,16}`, checked when the input is parsed. The
//! setup's configuration is written from its typed fields (booleans, integers, and cache types as
//! fixed `GGML_TYPE_*` names). `tests/it/hostile.rs` checks it with a compiler.
//!
//! State ops are emitted as llama.h calls over one static buffer per slot, sized with the
//! `*_get_size(_ext)` call; a damaged load (`truncate`, `flip`) damages a copy in C, and every
//! load prints what llama.cpp returned. A load from a slot the program never saved into is
//! skipped with a note, as the harness refuses it.

use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::base::error::Error;
use crate::base::files::read_text_limited;
use crate::base::op::{CacheType, Op, Setup, Slot, Trace};
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
pub const C_CHECKED: [OracleId; 8] = [
    OracleId::I1,
    OracleId::I2,
    OracleId::DIFFERENTIAL,
    OracleId::CRASH,
    crate::oracles::round_trip::ID,
    crate::oracles::conservation::ID,
    crate::oracles::contract::ID,
    crate::oracles::contract::QUESTION_ID,
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
        Op::StateSeqSave { seq, slot, flags } => {
            let (size, get) = if *flags == 0 {
                (
                    format!("llama_state_seq_get_size(ctx, {seq})"),
                    format!(
                        "llama_state_seq_get_data(ctx, {b}, size, {seq})",
                        b = slot_var(slot)
                    ),
                )
            } else {
                (
                    format!("llama_state_seq_get_size_ext(ctx, {seq}, {flags}u)"),
                    format!(
                        "llama_state_seq_get_data_ext(ctx, {b}, size, {seq}, {flags}u)",
                        b = slot_var(slot)
                    ),
                )
            };
            emit_save(out, slot, &size, &get);
        }
        Op::StateSave { slot } => {
            let get = format!("llama_state_get_data(ctx, {}, size)", slot_var(slot));
            emit_save(out, slot, "llama_state_get_size(ctx)", &get);
        }
        Op::StateSeqLoad {
            seq,
            slot,
            flags,
            truncate,
            flip,
        } => {
            let (call, set) = if *flags == 0 {
                (
                    "llama_state_seq_set_data".to_string(),
                    format!("llama_state_seq_set_data(ctx, b, len, {seq})"),
                )
            } else {
                (
                    "llama_state_seq_set_data_ext".to_string(),
                    format!("llama_state_seq_set_data_ext(ctx, b, len, {seq}, {flags}u)"),
                )
            };
            emit_load(out, slot, *truncate, *flip, &call, &set);
        }
        Op::StateLoad {
            slot,
            truncate,
            flip,
        } => {
            emit_load(
                out,
                slot,
                *truncate,
                *flip,
                "llama_state_set_data",
                "llama_state_set_data(ctx, b, len)",
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

/// The C variable holding `slot`'s bytes (a valid identifier: see [`Slot`]).
fn slot_var(slot: &Slot) -> String {
    format!("slot_{}", slot.as_str())
}

/// A save into `slot`: `size_call` sizes the buffer, `get_call` (which writes into the slot's
/// buffer and reads a local `size`) fills it.
fn emit_save(out: &mut String, slot: &Slot, size_call: &str, get_call: &str) {
    let b = slot_var(slot);
    let _ = writeln!(out, "    {{");
    let _ = writeln!(out, "        size_t size = {size_call};");
    let _ = writeln!(
        out,
        "        free({b}); {b} = malloc(size ? size : 1); if (!{b}) {{ fprintf(stderr, \"out of memory\\n\"); return 2; }}"
    );
    let _ = writeln!(out, "        {b}_len = {get_call};");
    let _ = writeln!(
        out,
        "        printf(\"  wrote %zu of %zu bytes\\n\", {b}_len, size);"
    );
    let _ = writeln!(out, "    }}");
}

/// A load from `slot`, damaged as asked, by `set_call` (which reads the locals `b` and `len`).
fn emit_load(
    out: &mut String,
    slot: &Slot,
    truncate: Option<u32>,
    flip: Option<u32>,
    call: &str,
    set_call: &str,
) {
    let v = slot_var(slot);
    let _ = writeln!(
        out,
        "    if (!{v}) printf(\"  slot %s holds nothing (never saved): not loaded\\n\", {});",
        c_string_literal(slot.as_str())
    );
    let _ = writeln!(out, "    else {{");
    let _ = writeln!(out, "        size_t len = {v}_len;");
    let _ = writeln!(
        out,
        "        uint8_t *b = malloc(len ? len : 1); if (!b) {{ fprintf(stderr, \"out of memory\\n\"); return 2; }}"
    );
    let _ = writeln!(out, "        memcpy(b, {v}, len);");
    if let Some(n) = truncate {
        let _ = writeln!(out, "        if (len > {n}u) len = {n}u; /* truncated */");
    }
    if let Some(at) = flip {
        let _ = writeln!(
            out,
            "        if ({at}u < len) b[{at}u] ^= 0xff; /* flipped */"
        );
    }
    let _ = writeln!(out, "        size_t read = {set_call};");
    let _ = writeln!(
        out,
        "        printf(\"  {call} read %zu of %zu bytes%s\\n\", read, len, read ? \"\" : \" (0: failed to load)\");"
    );
    let _ = writeln!(out, "        free(b);");
    let _ = writeln!(out, "    }}");
}

/// `enum ggml_type` name of a cache type, as C source.
fn ggml_type_name(t: CacheType) -> &'static str {
    match t {
        CacheType::F16 => "GGML_TYPE_F16",
        CacheType::F32 => "GGML_TYPE_F32",
        CacheType::Q8_0 => "GGML_TYPE_Q8_0",
        CacheType::Q4_0 => "GGML_TYPE_Q4_0",
    }
}

/// The setup's configuration in one line of plain words (for the header comment).
fn describe_config(setup: &Setup) -> String {
    let mut out = format!(
        "n_ctx {}, n_seq_max {}, kv_unified {}",
        setup.n_ctx, setup.n_seq_max, setup.kv_unified
    );
    if let Some(n) = setup.n_batch {
        let _ = write!(out, ", n_batch {n}");
    }
    if let Some(n) = setup.n_ubatch {
        let _ = write!(out, ", n_ubatch {n}");
    }
    let _ = write!(
        out,
        ", flash_attn {}, type_k {}, type_v {}",
        if setup.flash_attn { "on" } else { "off" },
        setup.type_k.name(),
        setup.type_v.name()
    );
    out
}

/// The statements that fill `cp` (already `llama_context_default_params()`) from `setup`.
fn emit_context_params(s: &mut String, setup: &Setup) {
    let _ = writeln!(
        s,
        "    cp.n_ctx = {}; cp.n_seq_max = {}; cp.kv_unified = {};",
        setup.n_ctx, setup.n_seq_max, setup.kv_unified
    );
    if let Some(n) = setup.n_batch {
        let _ = writeln!(s, "    cp.n_batch = {n};");
    }
    if let Some(n) = setup.n_ubatch {
        let _ = writeln!(s, "    cp.n_ubatch = {n};");
    }
    let _ = writeln!(
        s,
        "    cp.n_threads = 1; cp.n_threads_batch = 1; cp.flash_attn_type = {};",
        if setup.flash_attn {
            "LLAMA_FLASH_ATTN_TYPE_ENABLED"
        } else {
            "LLAMA_FLASH_ATTN_TYPE_DISABLED"
        }
    );
    let _ = writeln!(
        s,
        "    cp.type_k = {}; cp.type_v = {};",
        ggml_type_name(setup.type_k),
        ggml_type_name(setup.type_v)
    );
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
    let _ = writeln!(s, " * Setup: {}, then:", describe_config(&t.setup));
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
    let mut slots: Vec<&Slot> = t
        .setup
        .ops
        .iter()
        .chain(t.ops.iter().take(step))
        .filter_map(|op| match op {
            Op::StateSeqSave { slot, .. }
            | Op::StateSeqLoad { slot, .. }
            | Op::StateSave { slot }
            | Op::StateLoad { slot, .. } => Some(slot),
            _ => None,
        })
        .collect();
    slots.sort();
    slots.dedup();
    for slot in slots {
        let v = slot_var(slot);
        let _ = writeln!(s, "static uint8_t *{v}; static size_t {v}_len;");
    }
    if !s.ends_with("\n\n") {
        s.push('\n');
    }
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
    emit_context_params(&mut s, &t.setup);
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
    match input.oracle.name() {
        "round-trip" => emit_round_trip_prologue(&mut s),
        "conservation" => {
            let _ = writeln!(
                s,
                "    size_t whole_len = 0; uint8_t *whole = dump_whole(ctx, &whole_len);"
            );
            let _ = writeln!(s, "    int orphans = 0, whole_pos[4096]; int n_whole = whole_cells(whole, whole_len, -1, whole_pos, 4096, &orphans);");
            let _ = writeln!(s, "    printf(\"whole dump: %d used cells, %d of no sequence\\n\", n_whole, orphans);");
            let _ = writeln!(s, "    if (orphans) {{ printf(\"conservation violated: cell without a sequence\\n\"); reproduced = 1; }}");
        }
        _ => {}
    }
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
    match input.oracle.name() {
        "I1" => {
            let _ = writeln!(s, "        if (mn != tmin || mx != tmax) {{ printf(\"I1 violated: accessors say [%d, %d], the state says [%d, %d]\\n\", mn, mx, tmin, tmax); reproduced = 1; }}");
        }
        "I2" => {
            let _ = writeln!(s, "        for (int i = 1; i < n; i++) if (cells[i] - cells[i - 1] > 1) {{ printf(\"I2 violated: positions %d..%d missing\\n\", cells[i - 1] + 1, cells[i] - 1); reproduced = 1; }}");
        }
        "differential" => {
            let e = &input.expected;
            let emin = e.get("pos_min").and_then(Value::as_i64).unwrap_or(-1);
            let emax = e.get("pos_max").and_then(Value::as_i64).unwrap_or(-1);
            let ecells = expected_cells(e).unwrap_or_default();
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
        "crash" => {
            let _ = writeln!(s, "        (void)tmin; (void)tmax;");
        }
        "round-trip" => emit_round_trip_seq(&mut s),
        "conservation" => {
            let _ = writeln!(s, "        (void)tmin; (void)tmax;");
            let _ = writeln!(s, "        int in_whole[4096]; int nw = whole_cells(whole, whole_len, sq, in_whole, 4096, NULL);");
            let _ = writeln!(s, "        int same = nw == n;");
            let _ = writeln!(
                s,
                "        for (int i = 0; same && i < n; i++) same = cells[i] == in_whole[i];"
            );
            let _ = writeln!(
                s,
                "        printf(\"  the whole dump lists %d cells of seq %d:\", nw, sq);"
            );
            let _ = writeln!(
                s,
                "        for (int i = 0; i < nw; i++) printf(\" %d\", in_whole[i]);"
            );
            let _ = writeln!(s, "        printf(\"\\n\");");
            let _ = writeln!(s, "        if (!same) {{ printf(\"conservation violated: %s\\n\", nw < n ? \"sequence cell missing from the whole dump\" : \"whole dump cell missing from the sequence dump\"); reproduced = 1; }}");
        }
        // `contract?` states the same comparison: the finding's expected cells.
        "contract" | "contract?" => emit_contract_seq(&mut s, &input.expected),
        // `parse_input` refuses every other oracle.
        other => unreachable!("no C check for oracle {other}"),
    }
    let _ = writeln!(s, "    }}");
    match input.oracle.name() {
        "round-trip" => emit_round_trip_epilogue(&mut s),
        "conservation" => {
            let _ = writeln!(s, "    free(whole);");
        }
        _ => {}
    }
    if input.oracle.name() == "crash" {
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

/// `expected.cells` as integers, if it is an array (non-integers are dropped: the input is
/// hostile, and only integers may reach the program).
fn expected_cells(e: &Value) -> Option<Vec<i32>> {
    e.get("cells").and_then(Value::as_array).map(|a| {
        a.iter()
            .filter_map(Value::as_i64)
            .map(|x| x.clamp(i32::MIN.into(), i32::MAX.into()) as i32)
            .collect()
    })
}

/// `expected.<key>` as an i32, if it is an integer.
fn expected_pos(e: &Value, key: &str) -> Option<i32> {
    e.get(key)
        .and_then(Value::as_i64)
        .map(|x| x.clamp(i32::MIN.into(), i32::MAX.into()) as i32)
}

/// The `contract` check of one sequence: the fields the finding's `expected` holds
/// (`pos_min`, `pos_max`, `cells`) against what the context says, as the differential check.
fn emit_contract_seq(s: &mut String, e: &Value) {
    let _ = writeln!(s, "        (void)tmin; (void)tmax;");
    let _ = writeln!(s, "        int same = 1;");
    if let Some(v) = expected_pos(e, "pos_min") {
        let _ = writeln!(s, "        if (mn != {v}) {{ printf(\"  seq_pos_min %d, the contract says {v}\\n\", mn); same = 0; }}");
    }
    if let Some(v) = expected_pos(e, "pos_max") {
        let _ = writeln!(s, "        if (mx != {v}) {{ printf(\"  seq_pos_max %d, the contract says {v}\\n\", mx); same = 0; }}");
    }
    if let Some(cells) = expected_cells(e) {
        let _ = writeln!(
            s,
            "        const int want[] = {{{}}}; const int nwant = {};",
            if cells.is_empty() {
                "0".into()
            } else {
                c_array(&cells)
            },
            cells.len()
        );
        let _ = writeln!(s, "        int same_cells = n == nwant;");
        let _ = writeln!(
            s,
            "        for (int i = 0; same_cells && i < n; i++) same_cells = cells[i] == want[i];"
        );
        let _ = writeln!(
            s,
            "        if (!same_cells) {{ printf(\"  the contract says {} cells\\n\"); same = 0; }}",
            cells.len()
        );
    }
    let _ = writeln!(
        s,
        "        if (!same) {{ printf(\"contract violated for seq %d\\n\", sq); reproduced = 1; }}"
    );
}

/// Round trip, before the per-sequence loop: the whole dump and every checked sequence's dump
/// are taken from `ctx`; the whole dump goes into a twin made with the same params.
fn emit_round_trip_prologue(s: &mut String) {
    let _ = writeln!(
        s,
        "    struct llama_context *twin = llama_init_from_model(model, cp);"
    );
    let _ = writeln!(
        s,
        "    if (!twin) {{ fprintf(stderr, \"cannot create the twin context\\n\"); return 2; }}"
    );
    let _ = writeln!(s, "    llama_memory_t twin_mem = llama_get_memory(twin);");
    let _ = writeln!(
        s,
        "    size_t whole_len = 0; uint8_t *whole = dump_whole(ctx, &whole_len);"
    );
    let _ = writeln!(
        s,
        "    size_t whole_read = llama_state_set_data(twin, whole, whole_len);"
    );
    let _ = writeln!(s, "    printf(\"round trip: llama_state_set_data into the twin read %zu of %zu bytes\\n\", whole_read, whole_len);");
    let _ = writeln!(s, "    if (!whole_read) {{ printf(\"round trip violated: whole load failed\\n\"); reproduced = 1; }}");
    let _ = writeln!(
        s,
        "    size_t again_len = 0; uint8_t *again = dump_whole(twin, &again_len);"
    );
    let _ = writeln!(s, "    int whole_same_bytes = again_len == whole_len && memcmp(again, whole, whole_len) == 0;");
    let _ = writeln!(s, "    free(again);");
}

/// Round trip, inside the per-sequence loop: compare the twin after the whole load (it happens
/// once, before the loop).
fn emit_round_trip_seq(s: &mut String) {
    let _ = writeln!(s, "        (void)tmin; (void)tmax;");
    let _ = writeln!(
        s,
        "        int tc[4096]; int tn = resident(twin, sq, tc, 4096);"
    );
    let _ = writeln!(s, "        llama_pos tmn = llama_memory_seq_pos_min(twin_mem, sq), tmx = llama_memory_seq_pos_max(twin_mem, sq);");
    let _ = writeln!(s, "        int same = tmn == mn && tmx == mx && tn == n;");
    let _ = writeln!(
        s,
        "        for (int i = 0; same && i < n; i++) same = tc[i] == cells[i];"
    );
    let _ = writeln!(s, "        printf(\"  twin after the whole load: seq_pos_min %d, seq_pos_max %d, %d cells\\n\", tmn, tmx, tn);");
    let _ = writeln!(s, "        if (whole_read && !same) {{ printf(\"round trip violated: whole load differs (seq %d)\\n\", sq); reproduced = 1; }}");
}

/// Round trip, after the per-sequence loop: every checked sequence's dump into the emptied twin,
/// then each compared, then the redumps' bytes.
fn emit_round_trip_epilogue(s: &mut String) {
    let _ = writeln!(s, "    llama_memory_clear(twin_mem, true);");
    let _ = writeln!(
        s,
        "    const size_t n_check = sizeof check / sizeof check[0];"
    );
    let _ = writeln!(s, "    uint8_t *seq_bytes[sizeof check / sizeof check[0]]; size_t seq_len[sizeof check / sizeof check[0]]; size_t seq_read[sizeof check / sizeof check[0]];");
    let _ = writeln!(s, "    for (size_t k = 0; k < n_check; k++) seq_bytes[k] = dump_seq(ctx, check[k], &seq_len[k]);");
    let _ = writeln!(s, "    for (size_t k = 0; k < n_check; k++) {{");
    let _ = writeln!(
        s,
        "        seq_read[k] = llama_state_seq_set_data(twin, seq_bytes[k], seq_len[k], check[k]);"
    );
    let _ = writeln!(s, "        printf(\"round trip: llama_state_seq_set_data(seq %d) into the twin read %zu of %zu bytes\\n\", check[k], seq_read[k], seq_len[k]);");
    let _ = writeln!(s, "    }}");
    let _ = writeln!(s, "    for (size_t k = 0; k < n_check; k++) {{");
    let _ = writeln!(s, "        llama_seq_id sq = check[k];");
    let _ = writeln!(
        s,
        "        int cells[4096]; int n = resident(ctx, sq, cells, 4096);"
    );
    let _ = writeln!(
        s,
        "        int tc[4096]; int tn = resident(twin, sq, tc, 4096);"
    );
    let _ = writeln!(s, "        llama_pos mn = llama_memory_seq_pos_min(mem, sq), mx = llama_memory_seq_pos_max(mem, sq);");
    let _ = writeln!(s, "        llama_pos tmn = llama_memory_seq_pos_min(twin_mem, sq), tmx = llama_memory_seq_pos_max(twin_mem, sq);");
    let _ = writeln!(s, "        int same = tmn == mn && tmx == mx && tn == n;");
    let _ = writeln!(
        s,
        "        for (int i = 0; same && i < n; i++) same = tc[i] == cells[i];"
    );
    let _ = writeln!(s, "        printf(\"  twin after the sequence loads: seq %d: seq_pos_min %d, seq_pos_max %d, %d cells\\n\", sq, tmn, tmx, tn);");
    let _ = writeln!(s, "        if (!seq_read[k]) {{ printf(\"round trip violated: seq load failed (seq %d)\\n\", sq); reproduced = 1; }}");
    let _ = writeln!(s, "        else if (!same) {{ printf(\"round trip violated: seq load differs (seq %d)\\n\", sq); reproduced = 1; }}");
    let _ = writeln!(s, "    }}");
    let _ = writeln!(s, "    if (whole_read && !whole_same_bytes) {{ printf(\"round trip violated: whole redump differs\\n\"); reproduced = 1; }}");
    let _ = writeln!(s, "    for (size_t k = 0; k < n_check; k++) {{");
    let _ = writeln!(
        s,
        "        size_t again_len = 0; uint8_t *again = dump_seq(twin, check[k], &again_len);"
    );
    let _ = writeln!(s, "        if (seq_read[k] && (again_len != seq_len[k] || memcmp(again, seq_bytes[k], seq_len[k]) != 0)) {{ printf(\"round trip violated: seq redump differs (seq %d)\\n\", check[k]); reproduced = 1; }}");
    let _ = writeln!(s, "        free(again); free(seq_bytes[k]);");
    let _ = writeln!(s, "    }}");
    let _ = writeln!(s, "    free(whole);");
    let _ = writeln!(s, "    llama_free(twin);");
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

/* The bytes of llama_state_seq_get_data(seq) and llama_state_get_data, malloc'd. */
static inline uint8_t *dump_seq(struct llama_context *ctx, llama_seq_id seq, size_t *len) {
    size_t size = llama_state_seq_get_size(ctx, seq);
    uint8_t *buf = malloc(size ? size : 1);
    *len = buf ? llama_state_seq_get_data(ctx, buf, size, seq) : 0;
    return buf;
}

static inline uint8_t *dump_whole(struct llama_context *ctx, size_t *len) {
    size_t size = llama_state_get_size(ctx);
    uint8_t *buf = malloc(size ? size : 1);
    *len = buf ? llama_state_get_data(ctx, buf, size) : 0;
    return buf;
}

/* The used cells of a whole dump (u32 length and the architecture name, then the first cache:
 * n_stream, per stream a cell count, the cells (pos, n_seq_id, seq ids), then its K and V
 * data, skipped). Keeps the positions of the cells that list seq (every cell: seq = -1),
 * sorted, and counts cells that list no sequence into *orphans (may be NULL). */
static inline int whole_cells(const uint8_t *buf, size_t got, llama_seq_id seq, int *out,
                              int cap, int *orphans) {
    size_t at = 0;
    int n = 0;
    uint32_t u, n_stream = 0;
    if (orphans) *orphans = 0;
#define TAKE(dst, k) do { if (at + (k) > got) goto done; memcpy((dst), buf + at, (k)); at += (k); } while (0)
    TAKE(&u, 4); at += u;
    TAKE(&n_stream, 4);
    for (uint32_t s = 0; s < n_stream; s++) {
        uint32_t count; TAKE(&count, 4);
        if (count == 0) continue;
        for (uint32_t c = 0; c < count; c++) {
            int32_t p; uint32_t ns; TAKE(&p, 4); TAKE(&ns, 4);
            int listed = seq < 0;
            for (uint32_t i = 0; i < ns; i++) { int32_t id; TAKE(&id, 4); listed |= id == seq; }
            if (ns == 0 && orphans) (*orphans)++;
            if (listed && n < cap) out[n++] = p;
        }
        uint32_t v_trans, n_layer; TAKE(&v_trans, 4); TAKE(&n_layer, 4);
#if LLAMA_STATE_SEQ_VERSION >= 4
        at += 8; /* n_rot_k, n_rot_v */
#endif
        for (uint32_t l = 0; l < n_layer; l++) { int32_t t; uint64_t row; TAKE(&t, 4); TAKE(&row, 8); at += row * count; }
        for (uint32_t l = 0; l < n_layer; l++) {
            int32_t t; TAKE(&t, 4);
            if (!v_trans) { uint64_t row; TAKE(&row, 8); at += row * count; }
            else { uint32_t el, n_embd; TAKE(&el, 4); TAKE(&n_embd, 4); at += (size_t)el * n_embd * count; }
        }
    }
#undef TAKE
done:
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

    /// A finding over every state op, checked by `oracle`.
    fn state_ops_input(oracle: &'static str) -> ReproInput {
        let json = r#"{"oracle":"I1","trace":{"setup":{"n_ctx":256,"n_seq_max":2,"kv_unified":false,"n_ubatch":4,"flash_attn":true,"type_k":"q8_0","ops":[{"op":"decode","seq":0,"n":7}]},
            "ops":[{"op":"state_seq_save","seq":0,"slot":"a"},{"op":"state_save","slot":"whole_1"},
                   {"op":"state_seq_load","seq":1,"slot":"a","flags":1,"truncate":30,"flip":9},
                   {"op":"state_load","slot":"whole_1"},{"op":"state_seq_load","seq":1,"slot":"b"}]},
            "expected":{"pos_min":0,"pos_max":6,"cells":[0,1,2,3,4,5,6]}}"#;
        let mut input: ReproInput = serde_json::from_str(json).unwrap();
        input.oracle = OracleId::known(oracle).expect("a built-in oracle");
        input
    }

    #[test]
    fn state_ops_and_the_configuration_read_as_c() {
        let c = emit_c(&state_ops_input("contract"), Path::new("/tmp/m.gguf"));
        for want in [
            "cp.n_ctx = 256; cp.n_seq_max = 2; cp.kv_unified = false;",
            "cp.n_ubatch = 4;",
            "cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;",
            "cp.type_k = GGML_TYPE_Q8_0; cp.type_v = GGML_TYPE_F16;",
            "static uint8_t *slot_a; static size_t slot_a_len;",
            "static uint8_t *slot_whole_1; static size_t slot_whole_1_len;",
            "static uint8_t *slot_b; static size_t slot_b_len;",
            "size_t size = llama_state_seq_get_size(ctx, 0);",
            "slot_a_len = llama_state_seq_get_data(ctx, slot_a, size, 0);",
            "slot_whole_1_len = llama_state_get_data(ctx, slot_whole_1, size);",
            "if (len > 30u) len = 30u;",
            "if (9u < len) b[9u] ^= 0xff;",
            "size_t read = llama_state_seq_set_data_ext(ctx, b, len, 1, 1u);",
            "size_t read = llama_state_set_data(ctx, b, len);",
            "size_t read = llama_state_seq_set_data(ctx, b, len, 1);",
            "contract violated",
        ] {
            assert!(c.contains(want), "{want}\n{c}");
        }
        let rt = emit_c(&state_ops_input("round-trip"), Path::new("/tmp/m.gguf"));
        assert!(
            rt.contains("llama_init_from_model(model, cp);\n    if (!twin)"),
            "{rt}"
        );
        assert!(rt.contains("round trip violated: seq redump differs"));
        let cons = emit_c(&state_ops_input("conservation"), Path::new("/tmp/m.gguf"));
        assert!(cons.contains("whole_cells(whole, whole_len, sq, in_whole, 4096, NULL)"));
    }

    #[test]
    fn the_state_oracles_parse_by_name() {
        let names = C_CHECKED.map(|o| o.name());
        for name in ["round-trip", "conservation", "contract", "contract?"] {
            assert!(names.contains(&name), "{name}");
        }
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
