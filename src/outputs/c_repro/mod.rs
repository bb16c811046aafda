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
//!
//! The parts: `escape.rs` (text into C), `ops.rs` (the ops as llama.h calls), `settings.rs` (the
//! model and the context's configuration, from the setup's one list of settings), `prelude.rs`
//! (the C helpers every program starts with), `check.rs` (compiling a program against a pin and
//! running it); this file reads the input and assembles the program. Each oracle's check in C is
//! the oracle's ([`crate::oracles::Oracle::c_check`], `oracles/c_check.rs`): the program asks
//! the registry for it and names no oracle.

pub mod check;
mod escape;
mod ops;
mod prelude;
mod settings;

pub use escape::{c_comment_lines, c_string_literal, program_shape};

pub use settings::{default_model_file, model_command};

use ops::{c_array, emit_op, slot_var};
use prelude::C_PRELUDE;
use settings::{describe_config, describe_model, emit_context_params, emit_model};

use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::base::error::Error;
use crate::base::files::read_text_limited;
use crate::base::op::{Op, Slot, Trace};
use crate::oracles::c_check::{CCheck, CheckInput};
use crate::oracles::{OracleId, Registry};
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
/// has a C check ([`c_check_of`]) parse: [`emit_c`] states that check in C.
pub fn parse_input(text: &str) -> Result<ReproInput, Error> {
    let input: ReproInput = serde_json::from_str(text).map_err(|e| {
        // serde quotes the offending value, which the file's author chose.
        let what = terminal_text(&e.to_string());
        format!("line {}, column {}: {what}", e.line(), e.column())
    })?;
    check_trace_limits(&input.trace)?;
    if let Some(f) = input.trace.setup.foreign.first() {
        return Err(Error::input(format!(
            "setup.foreign (slot {}: a dump saved under {}): C reproducers do not make a second context yet",
            f.slot, f.config
        )));
    }
    if c_check_of(input.oracle).is_none() {
        let checked: Vec<&str> = Registry::builtin()
            .iter()
            .filter(|o| c_check_of(o.id).is_some())
            .map(|o| o.id().name())
            .collect();
        return Err(Error::input(format!(
            "oracle {} has no check in C reproducers (they check {})",
            input.oracle,
            checked.join(", ")
        )));
    }
    Ok(input)
}

/// The C check of the oracle `id` ([`super::llama_h::words`]), if it has one.
pub fn c_check_of(id: OracleId) -> Option<CCheck> {
    super::llama_h::words(id).c_check
}

/// The C program for `input`. It opens the model `argv[1]` names, else
/// [`default_model_file`] in the current folder (never a path of this machine).
pub fn emit_c(input: &ReproInput) -> String {
    let t = &input.trace;
    let step = input
        .step
        .unwrap_or(t.ops.len())
        .clamp(1, t.ops.len().max(1));
    // A finding on seq -1 (any sequence) checks every sequence.
    let seqs: Vec<i32> = match input.seq {
        Some(s) if s >= 0 => vec![s],
        _ => (0..t.setup.n_seq_max.max(1) as i32).collect(),
    };
    // `parse_input` admits only oracles with a C check.
    let check = c_check_of(input.oracle).expect("an oracle with a C check");
    let checked = CheckInput {
        trace: t,
        step: input.step.unwrap_or(t.ops.len()).min(t.ops.len()),
        expected: &input.expected,
        kind: input.kind.as_deref(),
        seqs: &seqs,
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
    describe_model(&mut s, t.setup.arch);
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
        .filter_map(Op::slot)
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
        c_string_literal(&default_model_file(t.setup.arch))
    );
    let _ = writeln!(s, "    llama_log_set(quiet, NULL);");
    let _ = writeln!(s, "    llama_backend_init();");
    emit_model(&mut s, t.setup.arch);
    if t.setup.embd_input {
        let _ = writeln!(s, "    n_embd_input = llama_model_n_embd(model);");
    }
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
    let _ = writeln!(
        s,
        "    memlog_done = 1; /* a twin's lines are not the audited memory's */"
    );
    let _ = writeln!(s, "    llama_memory_t mem = llama_get_memory(ctx);");
    // What the last seq_rm returned (-1: none ran), for the clauses about return values.
    let _ = writeln!(s, "    int last_returned = -1;");
    // What the last state load read (-1: none ran), for the failed-load clauses.
    let _ = writeln!(s, "    long long last_read = -1;");
    for op in &t.setup.ops {
        emit_op(&mut s, op, "setup");
    }
    for (i, op) in t.ops.iter().take(step).enumerate() {
        if i + 1 == step {
            (check.before_last_op)(&mut s, &checked);
        }
        emit_op(&mut s, op, &format!("op {}", i + 1));
    }
    let _ = writeln!(s, "    int reproduced = 0;");
    let _ = writeln!(s, "    (void)last_returned; (void)last_read;");
    (check.before_seqs)(&mut s, &checked);
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
    // The positions present for the sequence, by memory type (src/oracles/memory.rs): an
    // iSWA memory's are its base cache's, and its windowed dump (`win`, `nwin`) bounds
    // `seq_pos_min` (docs/memory-types.md).
    let _ = writeln!(
        s,
        "        int cells[4096]; {}",
        crate::oracles::c_check::read_cells(t.setup.arch.memory(), "cells", "n", "win", "nwin")
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
    (check.seq)(&mut s, &checked);
    let _ = writeln!(s, "    }}");
    (check.after_seqs)(&mut s, &checked);
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
        let program = emit_c(&input);
        let mut plain = input.clone();
        plain.kind = None;
        plain.target = None;
        assert_eq!(
            program_shape(&program),
            program_shape(&emit_c(&plain)),
            "{program}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_feeds_the_embeddings_the_shim_feeds() {
        // embd_input: a C program replays a finding only if its decode helper computes the
        // very floats kvaudit_shim_decode gave llama.cpp.
        let body = |src: &str, name: &str| -> String {
            let at = src.find(name).unwrap_or_else(|| panic!("no {name}"));
            let open = at + src[at..].find('{').expect("a body");
            let close = open + src[open..].find('}').expect("its end");
            src[open..=close].split_whitespace().collect()
        };
        let shim = body(
            crate::targets::llama::shim::SHIM_SOURCE,
            "shim_token_embd(int32_t t",
        );
        let prelude = body(C_PRELUDE, "token_embd(int32_t t");
        assert!(shim.contains("%17u"), "{shim}");
        assert_eq!(shim, prelude);
    }

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
        let c = emit_c(&state_ops_input("contract"));
        for want in [
            "cp.n_ctx = 256;\n    cp.n_seq_max = 2;\n    cp.kv_unified = false;",
            "cp.n_ubatch = 4;",
            "cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;",
            "cp.type_k = GGML_TYPE_Q8_0;\n    cp.type_v = GGML_TYPE_F16;",
            "cp.swa_full = true;",
            "cp.n_threads = 1; cp.n_threads_batch = 1;",
            "argc > 1 ? argv[1] : \"tiny-llama.gguf\"",
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
        let rt = emit_c(&state_ops_input("round-trip"));
        assert!(
            rt.contains("llama_init_from_model(model, cp);\n    if (!twin)"),
            "{rt}"
        );
        assert!(rt.contains("round trip violated: seq redump differs"));
        let cons = emit_c(&state_ops_input("conservation"));
        assert!(cons.contains("whole_cells(whole, whole_len, sq, in_whole, 4096, NULL)"));
    }

    #[test]
    fn the_state_oracles_parse_by_name() {
        for name in ["round-trip", "conservation", "contract", "contract?"] {
            let id = OracleId::known(name).expect("a built-in oracle");
            assert!(c_check_of(id).is_some(), "{name}");
        }
    }

    #[test]
    fn the_seed_repro_reads_as_c() {
        let json = r#"{"oracle":"I1","seq":1,"trace":{"setup":{"n_ctx":256,"n_seq_max":2,"ops":[{"op":"decode","seq":0,"n":7}]},
            "ops":[{"op":"seq_cp","src":0,"dst":1,"p0":0,"p1":3},{"op":"seq_cp","src":0,"dst":1,"p0":0,"p1":3},{"op":"seq_keep","seq":0}]}}"#;
        let input: ReproInput = serde_json::from_str(json).unwrap();
        let c = emit_c(&input);
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
