//! The program's skeleton over llama.h: each op as llama.h calls (state ops over one buffer per
//! slot).

use std::fmt::Write as _;

use super::escape::c_string_literal;
use crate::base::op::{Op, Slot};

pub(super) use crate::oracles::c_check::c_array;

pub(super) fn emit_op(out: &mut String, op: &Op, label: &str) {
    let _ = writeln!(
        out,
        "    printf(\"%s: %s\\n\", {}, {});",
        c_string_literal(label),
        c_string_literal(&op.to_string())
    );
    match op {
        Op::SeqRm { seq, p0, p1 } => {
            let _ = writeln!(
                out,
                "    last_returned = llama_memory_seq_rm(mem, {seq}, {p0}, {p1});"
            );
            let _ = writeln!(
                out,
                "    printf(\"  returned %s\\n\", last_returned ? \"true\" : \"false\");"
            );
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
pub(super) fn slot_var(slot: &Slot) -> String {
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
    let _ = writeln!(
        out,
        "        size_t read = {set_call}; last_read = (long long)read;"
    );
    let _ = writeln!(
        out,
        "        printf(\"  {call} read %zu of %zu bytes%s\\n\", read, len, read ? \"\" : \" (0: failed to load)\");"
    );
    let _ = writeln!(out, "        free(b);");
    let _ = writeln!(out, "    }}");
}
