//! **allocation**: what the memory allocates is what its configuration implies (issue 24 item
//! 3; upstream #19552, fixed by #19559: the hybrid memory's attention cache was made with
//! `n_ctx` cells per stream where each of its `n_seq_max` streams needs its share, so
//! `-np` times the memory).
//!
//! llama.h's words: `n_ctx` is the "text context" (`llama_context_params`), `llama_n_ctx` the
//! context's size, `n_seq_max` the "max number of sequences", and with `kv_unified` false
//! "each sequence has its own" KV buffer, so a context's positions are shared among its
//! sequences: a context of `n_ctx` holds `n_ctx` positions however many sequences it serves.
//! From what the memory allocated ([`Allocation`], read on llama.cpp from what
//! `llama_init_from_model` logs, `targets/llama/memory_log.rs`), after every op:
//!
//! 1. a cache of the context's positions ([`PartHolds::Context`]: a plain, non-SWA, main or
//!    indexer cache) has the context's streams (one when unified, else one per sequence) of
//!    the stream's share of `llama_n_ctx` each: `n_ctx` cells in all;
//! 2. a windowed or compressed cache ([`PartHolds::AtMostContext`]) has no stream larger than
//!    the stream's share of the context;
//! 3. a recurrent memory has one state per sequence (`max(1, n_seq_max)`; rollback's snapshots,
//!    `n_rs_seq`, are planes of their own).
//!
//! What it cannot see: the bytes per cell (the log rounds them to hundredths of a MiB) and
//! buffers the log lines do not name (DSV4's compressor states). A target that cannot say what
//! it allocated leaves the oracle nothing to judge.

use std::fmt::Write as _;

use serde_json::json;

use super::c_check::{nothing, CCheck, CheckInput};
use super::{Oracle, OracleId, PositiveControl, Reads, Seen, Violation};
use crate::base::cache::{AllocatedPart, Allocation, Observe, PartHolds, StepObservation};

/// Its id.
pub const ID: OracleId = OracleId::builtin(20, "allocation");

/// The kind: a cache of the context's positions is not `n_ctx` cells in the context's streams.
pub const CONTEXT_CELLS: &str =
    "a cache of the context's positions allocates other than n_ctx cells";
/// The kind: a windowed or compressed cache has a stream larger than a stream of the context.
pub const OVER_CONTEXT: &str =
    "a windowed or compressed cache allocates more cells per stream than the context's share";
/// The kind: a recurrent memory allocates other than one state per sequence.
pub const STATES: &str = "a recurrent memory allocates other than one state per sequence";

/// The streams a cache of the context's positions has and the cells each holds, as the
/// context's size and sequences imply: one stream of `n_ctx` when unified, else `n_seq_max` of
/// `n_ctx / n_seq_max`.
pub fn context_share(a: &Allocation) -> (u32, u32) {
    let n_seq_max = a.n_seq_max.max(1);
    if a.kv_unified {
        (1, a.n_ctx)
    } else {
        (n_seq_max, a.n_ctx / n_seq_max)
    }
}

fn part_json(p: &AllocatedPart) -> serde_json::Value {
    json!({ "part": p.name, "cells_per_stream": p.cells, "streams": p.streams,
            "cells": u64::from(p.cells) * u64::from(p.streams) })
}

/// The first part that breaks one of the three rules, as a violation.
pub fn check_allocation(a: &Allocation) -> Option<Violation> {
    let (streams, share) = context_share(a);
    for p in &a.parts {
        let (broken, kind, expected) = match p.holds {
            PartHolds::Context => (
                p.streams != streams || p.cells != share,
                CONTEXT_CELLS,
                json!({ "n_ctx": a.n_ctx, "n_seq_max": a.n_seq_max, "streams": streams,
                        "cells_per_stream": share }),
            ),
            PartHolds::AtMostContext => (
                p.cells > share,
                OVER_CONTEXT,
                json!({ "n_ctx": a.n_ctx, "n_seq_max": a.n_seq_max,
                        "cells_per_stream_at_most": share }),
            ),
            PartHolds::States => (
                p.cells != a.n_seq_max.max(1),
                STATES,
                json!({ "n_seq_max": a.n_seq_max, "states": a.n_seq_max.max(1) }),
            ),
        };
        if broken {
            return Some(Violation {
                oracle: ID,
                kind: kind.into(),
                seq: None,
                observed: part_json(p),
                expected,
            });
        }
    }
    None
}

fn allocated(after: &StepObservation) -> Option<&Allocation> {
    after.sizes.as_ref().and_then(|s| s.allocated.as_ref())
}

/// The oracle, as a value ([`Oracle`]).
pub static ALLOCATION: Oracle = Oracle {
    id: ID,
    summary: "the memory allocates what its configuration implies: n_ctx cells for the context's positions whatever n_seq_max, one recurrent state per sequence",
    reads: Reads::Step,
    kinds: &[CONTEXT_CELLS, OVER_CONTEXT, STATES],
    positive_controls: &[
        PositiveControl {
            fault: "attn_sized_by_n_ctx",
            target: "native[attn_sized_by_n_ctx] (domain streams)",
            seed_depth: None,
            evidence: "oracles/allocation_attn_sized_by_n_ctx.json",
        },
        PositiveControl {
            fault: "attn_sized_by_n_ctx",
            target: "native[attn_sized_by_n_ctx] (arch=jamba, kv_unified=false)",
            seed_depth: None,
            evidence: "oracles/allocation_attn_sized_by_n_ctx_hybrid.json",
        },
        PositiveControl {
            fault: "attn_sized_by_n_ctx",
            target: "native[attn_sized_by_n_ctx] (domain hybrid_iswa, kv_unified=false)",
            seed_depth: None,
            evidence: "oracles/allocation_attn_sized_by_n_ctx_hybrid_iswa.json",
        },
        PositiveControl {
            fault: "attn_sized_by_n_ctx",
            target: "native[attn_sized_by_n_ctx] (domain msa)",
            seed_depth: None,
            evidence: "oracles/allocation_attn_sized_by_n_ctx_msa.json",
        },
        PositiveControl {
            fault: "attn_sized_by_n_ctx",
            target: "native[attn_sized_by_n_ctx] (domain hybrid_idx, kv_unified=false)",
            seed_depth: None,
            evidence: "oracles/allocation_attn_sized_by_n_ctx_hybrid_idx.json",
        },
        PositiveControl {
            fault: "attn_sized_by_n_ctx",
            target: "native[attn_sized_by_n_ctx] (domain dsa_iswa)",
            seed_depth: None,
            evidence: "oracles/allocation_attn_sized_by_n_ctx_dsa_iswa.json",
        },
        PositiveControl {
            fault: "attn_sized_by_n_ctx",
            target: "native[attn_sized_by_n_ctx] (domain dsa)",
            seed_depth: None,
            evidence: "oracles/allocation_attn_sized_by_n_ctx_dsa.json",
        },
        PositiveControl {
            fault: "attn_sized_by_n_ctx: the llama.cpp target's test hook",
            target: "llama.cpp@0.1.161[attn_sized_by_n_ctx] (domain dsv4)",
            seed_depth: None,
            evidence: "oracles/allocation_attn_sized_by_n_ctx_dsv4.json",
        },
    ],
    observes: Observe {
        sizes: true,
        ..Observe::BASIC
    },
    check: violation_on,
    judges: Some(judges_on),
    ..Oracle::DEFAULTS
};

fn violation_on(seen: &Seen<'_>) -> Option<Violation> {
    match seen {
        Seen::Step { after, .. } => allocated(after).and_then(check_allocation),
        _ => None,
    }
}

fn judges_on(seen: &Seen<'_>) -> bool {
    match seen {
        Seen::Step { after, .. } => allocated(after).is_some(),
        _ => false,
    }
}

/// allocation in C: the program's log callback keeps the lines `llama_init_from_model` logged
/// about the memory (the prelude's `memlog`, as the shim's), which the check reads as
/// `targets/llama/memory_log.rs` does and judges by the three rules, against `llama_n_ctx`,
/// `llama_n_seq_max` and the setup's `kv_unified`.
pub const C_CHECK: CCheck = CCheck {
    before_last_op: nothing,
    before_seqs: emit_check,
    seq: |s, _| {
        let _ = writeln!(s, "        (void)tmin; (void)tmax;");
    },
    after_seqs: nothing,
};

fn emit_check(s: &mut String, input: &CheckInput<'_>) {
    let unified = input.trace.setup.kv_unified;
    let _ = writeln!(s, "    {{ unsigned a_ctx = llama_n_ctx(ctx), a_seq = llama_n_seq_max(ctx) ? llama_n_seq_max(ctx) : 1;");
    let _ = writeln!(
        s,
        "      unsigned a_streams = {}, a_share = {};",
        if unified { "1" } else { "a_seq" },
        if unified { "a_ctx" } else { "a_ctx / a_seq" }
    );
    let _ = writeln!(s, "      char label[128] = \"\"; const char *p = memlog;");
    let _ = writeln!(s, "      printf(\"allocation: llama_n_ctx %u, llama_n_seq_max %u, kv_unified {unified}\\n\", a_ctx, a_seq);");
    let _ = writeln!(s, "      while (*p) {{");
    let _ = writeln!(
        s,
        "        const char *e = strchr(p, '\\n'); int len = e ? (int)(e - p) : (int)strlen(p);"
    );
    let _ = writeln!(s, "        char line[512]; snprintf(line, sizeof line, \"%.*s\", len, p); p += len + (e ? 1 : 0);");
    let _ = writeln!(
        s,
        "        char *c = strstr(line, \"creating \"), *k = c ? strstr(c, \"KV cache\") : NULL;"
    );
    let _ = writeln!(s, "        if (k) {{ snprintf(label, sizeof label, \"%.*s\", (int)(k - c - 9), c + 9); continue; }}");
    let _ = writeln!(s, "        char *q = strchr(line, '('); unsigned cells = 0, layers = 0, seqs = 0, streams = 1;");
    let _ = writeln!(s, "        if (!q || sscanf(q, \"( %u cells, %u layers, %u/%u seqs\", &cells, &layers, &seqs, &streams) < 3) continue;");
    let _ = writeln!(s, "        printf(\"  %s\\n\", line);");
    let _ = writeln!(
        s,
        "        if (strncmp(line, \"llama_memory_recurrent\", 22) == 0) {{"
    );
    let _ = writeln!(s, "          if (cells != a_seq) {{ printf(\"allocation violated: {STATES}: %u states, n_seq_max %u\\n\", cells, a_seq); reproduced = 1; }}");
    let _ = writeln!(s, "        }} else if ((strstr(label, \"SWA\") && !strstr(label, \"non-SWA\")) || strstr(label, \"compressed\") || strstr(label, \"lightning-indexer\")) {{");
    let _ = writeln!(s, "          if (cells > a_share) {{ printf(\"allocation violated: {OVER_CONTEXT}: %s: %u cells per stream, share %u\\n\", label, cells, a_share); reproduced = 1; }}");
    let _ = writeln!(
        s,
        "        }} else if (cells != a_share || streams != a_streams) {{"
    );
    let _ = writeln!(s, "          printf(\"allocation violated: {CONTEXT_CELLS}: %s: %u streams of %u cells, expected %u of %u (n_ctx %u)\\n\", label[0] ? label : \"llama_kv_cache\", streams, cells, a_streams, a_share, a_ctx); reproduced = 1;");
    let _ = writeln!(s, "        }}");
    let _ = writeln!(s, "        label[0] = '\\0';");
    let _ = writeln!(s, "      }} }}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(name: &str, holds: PartHolds, cells: u32, streams: u32) -> AllocatedPart {
        AllocatedPart::new(name, holds, cells, streams)
    }

    fn alloc(n_ctx: u32, n_seq_max: u32, parts: Vec<AllocatedPart>) -> Allocation {
        // Unified where the first cache has one stream, as in the figures below.
        let kv_unified = parts.first().is_some_and(|p| p.streams == 1);
        Allocation {
            n_ctx,
            n_seq_max,
            kv_unified,
            parts,
        }
    }

    #[test]
    fn what_llama_cpp_allocates_holds() {
        // 0.1.161, lfm2_swa: n_ctx 256, n_seq_max 2, kv_unified false (n_ctx padded to 512).
        let a = alloc(
            512,
            2,
            vec![
                part("non-SWA KV cache", PartHolds::Context, 256, 2),
                part("SWA KV cache", PartHolds::AtMostContext, 256, 2),
                part("llama_memory_recurrent", PartHolds::States, 2, 1),
            ],
        );
        assert_eq!(check_allocation(&a), None);
        // Unified, four sequences: one stream of the whole context.
        let a = alloc(
            1024,
            4,
            vec![
                part("llama_kv_cache", PartHolds::Context, 1024, 1),
                part("llama_memory_recurrent", PartHolds::States, 4, 1),
            ],
        );
        assert_eq!(check_allocation(&a), None);
    }

    #[test]
    fn a_hybrid_attention_cache_of_n_ctx_per_stream_is_19552() {
        // 0.1.135's llama_memory_hybrid: attn_kv_size = cparams.n_ctx, with n_seq_max streams.
        let a = alloc(
            1024,
            4,
            vec![
                part("llama_kv_cache", PartHolds::Context, 1024, 4),
                part("llama_memory_recurrent", PartHolds::States, 4, 1),
            ],
        );
        let v = check_allocation(&a).expect("violated");
        assert_eq!(v.kind, CONTEXT_CELLS);
        assert_eq!(v.observed["cells"], 4096);
        assert_eq!(v.expected["cells_per_stream"], 256);
    }

    #[test]
    fn windowed_streams_beyond_the_share_and_missing_states() {
        let a = alloc(
            512,
            2,
            vec![
                part("non-SWA KV cache", PartHolds::Context, 256, 2),
                part("SWA KV cache", PartHolds::AtMostContext, 512, 2),
            ],
        );
        assert_eq!(
            check_allocation(&a).map(|v| v.kind),
            Some(OVER_CONTEXT.into())
        );
        let a = alloc(
            512,
            2,
            vec![part("llama_memory_recurrent", PartHolds::States, 1, 1)],
        );
        assert_eq!(check_allocation(&a).map(|v| v.kind), Some(STATES.into()));
    }
}
