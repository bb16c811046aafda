//! What a llama.cpp memory allocated, read from what `llama_init_from_model` logged about it
//! (the shim keeps those lines: `kvaudit_shim_memory_log`). llama.h has no C call that says
//! it: `llama_memory_breakdown_print` rounds to whole MiB (a tiny model's caches are hundredths
//! of one) and `llama_get_memory_breakdown` is C++. The lines, the same format from 0.1.113 to
//! 0.1.161 (src/llama-kv-cache.cpp, src/llama-memory-recurrent.cpp, the composite memories'
//! constructors):
//!
//! ```text
//! llama_kv_cache_iswa: creating non-SWA KV cache, size = 256 cells
//! llama_kv_cache: size =    0.03 MiB (   256 cells,   1 layers,  2/2 seqs), K (f16): ...
//! llama_memory_recurrent: size =    0.00 MiB (     2 cells,   2 layers,  2 seqs  0 rs_seq), ...
//! ```
//!
//! A cache's line gives its cells per stream and, after the `/`, its streams (before 0.1.113:
//! `S seqs`, one stream). The `creating X KV cache` line before it names the part a composite
//! memory made (`non-SWA`, `SWA`, `main`, `indexer`, `DSV4 CSA compressed`, ...), which says
//! what it holds ([`PartHolds`]).

use super::ffi::{LlamaContext, ShimError};
use crate::base::cache::{AllocatedPart, PartHolds};
use crate::base::config::MemoryType;

/// The parts of the memory of `ctx`, from what its creation logged.
pub fn read(ctx: &mut LlamaContext) -> Result<Vec<AllocatedPart>, ShimError> {
    ctx.memory_log().map(|log| parse(&log))
}

/// The parts the lines of `log` name, in order. Lines of other kinds are skipped; a part whose
/// numbers do not parse is left out (the oracle then judges the parts it has).
pub fn parse(log: &str) -> Vec<AllocatedPart> {
    let mut parts = Vec::new();
    // The name of the part the next cache line is, from the `creating ... KV cache` before it.
    let mut creating: Option<String> = None;
    for line in log.lines() {
        let (func, rest) = match line.split_once(':') {
            Some((f, r)) => (f.trim(), r.trim()),
            None => continue,
        };
        if let Some(what) = rest.strip_prefix("creating ") {
            if let Some(i) = what.find("KV cache") {
                creating = Some(
                    what[..i + "KV cache".len()]
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" "),
                );
            }
            continue;
        }
        let Some(counts) = rest.split_once('(').map(|(_, c)| c) else {
            continue;
        };
        let Some((cells, layers_and_seqs)) = counts.split_once(" cells,") else {
            continue;
        };
        let Ok(cells) = cells.trim().parse::<u32>() else {
            continue;
        };
        if func == "llama_memory_recurrent" {
            parts.push(AllocatedPart {
                name: func.to_string(),
                holds: PartHolds::States,
                cells,
                streams: 1,
            });
            continue;
        }
        // `L layers, S/T seqs)`: T streams; `S seqs)` alone: one stream.
        let seqs = layers_and_seqs
            .split(',')
            .nth(1)
            .and_then(|s| s.trim().strip_suffix(')').or(Some(s.trim())))
            .and_then(|s| s.split_whitespace().next())
            .unwrap_or("");
        let streams = match seqs.split_once('/') {
            Some((_, t)) => t.parse::<u32>().ok(),
            None => Some(1),
        };
        let Some(streams) = streams else {
            continue;
        };
        let name = creating.take().unwrap_or_else(|| func.to_string());
        parts.push(AllocatedPart {
            holds: holds_of(&name),
            name,
            cells,
            streams,
        });
    }
    parts
}

/// What the parts say the pin built, when it is not `memory`: another number of caches of the
/// context's positions, a windowed cache or recurrent states where the memory type has none, or
/// none where it has them (`None`: the parts fit, or there are none to tell by). 0.1.154 builds
/// minimax-m3's memory as one `llama_kv_cache` (MSA inside it), 0.1.135 lfm2_swa's as a plain
/// hybrid memory: not the classes kvaudit reads their dumps as.
pub fn other_memory(memory: MemoryType, parts: &[AllocatedPart]) -> Option<String> {
    if parts.is_empty() {
        return None;
    }
    let count = |h: PartHolds| parts.iter().filter(|p| p.holds == h).count();
    let built = (
        count(PartHolds::Context),
        count(PartHolds::AtMostContext) > 0,
        count(PartHolds::States) > 0,
    );
    // (caches of the context's positions, a windowed or compressed cache, recurrent states),
    // as each memory logs them on 0.1.156 and 0.1.161 (docs/memory-types.md).
    let wanted = match memory {
        MemoryType::Kv => (1, false, false),
        MemoryType::Msa | MemoryType::Dsa => (2, false, false),
        MemoryType::Iswa | MemoryType::Dsv4 => (1, true, false),
        MemoryType::DsaIswa => (2, true, false),
        MemoryType::Recurrent => (0, false, true),
        MemoryType::Hybrid => (1, false, true),
        MemoryType::HybridIdx => (2, false, true),
        MemoryType::HybridIswa => (1, true, true),
    };
    if built == wanted {
        return None;
    }
    let names: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
    Some(format!(
        "a memory of {} ({} cache(s) of the context's positions, {} windowed cache, {} recurrent states)",
        names.join(", "),
        built.0,
        if built.1 { "a" } else { "no" },
        if built.2 { "with" } else { "no" }
    ))
}

/// What a cache named `name` holds: a windowed (`SWA`, not `non-SWA`) or compressed cache holds
/// at most the context; every other cache (plain, `non-SWA`, `main`, `indexer`) a cell per
/// position of the context. The allocation oracle's C check (`oracles/allocation.rs`,
/// `C_CHECK`) classifies a part by the same words.
fn holds_of(name: &str) -> PartHolds {
    let windowed = name.contains("SWA") && !name.contains("non-SWA");
    let compressed = name.contains("compressed") || name.contains("lightning-indexer");
    if windowed || compressed {
        PartHolds::AtMostContext
    } else {
        PartHolds::Context
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as 0.1.156 logged them for deepseek4 (n_ctx 256, n_seq_max 2, kv_unified false)
    /// and for lfm2_swa, measured with a C program over the pin's library (2026-12-05).
    const DSV4: &str = "llama_kv_cache_dsv4: creating DSV4 raw KV cache
llama_kv_cache_iswa: creating non-SWA KV cache, size = 256 cells
llama_kv_cache: size =    0.00 MiB (   256 cells,   0 layers,  2/2 seqs), K (f16):    0.00 MiB, V (f16):    0.00 MiB
llama_kv_cache_iswa: creating     SWA KV cache, size = 256 cells
llama_kv_cache: size =    0.02 MiB (   256 cells,   2 layers,  2/2 seqs), K (f16):    0.02 MiB, V (f16):    0.00 MiB
llama_kv_cache_dsv4: creating DSV4 CSA compressed KV cache, size = 64 cells
llama_kv_cache: size =    0.01 MiB (   256 cells,   1 layers,  2/2 seqs), K (f16):    0.01 MiB, V (f16):    0.00 MiB
";

    const HYBRID_ISWA: &str = "llama_kv_cache_iswa: creating non-SWA KV cache, size = 256 cells
llama_kv_cache: size =    0.00 MiB (   256 cells,   0 layers,  2/2 seqs), K (f16):    0.00 MiB, V (f16):    0.00 MiB
llama_kv_cache_iswa: creating     SWA KV cache, size = 256 cells
llama_kv_cache: size =    0.02 MiB (   256 cells,   1 layers,  2/2 seqs), K (f16):    0.01 MiB, V (f16):    0.01 MiB
llama_memory_recurrent: size =    0.00 MiB (     2 cells,   2 layers,  2 seqs  0 rs_seq), R (f32):    0.00 MiB, S (f32):    0.00 MiB
";

    fn part(name: &str, holds: PartHolds, cells: u32, streams: u32) -> AllocatedPart {
        AllocatedPart::new(name, holds, cells, streams)
    }

    #[test]
    fn each_cache_line_is_a_part_named_by_the_creating_line_before_it() {
        assert_eq!(
            parse(DSV4),
            vec![
                part("non-SWA KV cache", PartHolds::Context, 256, 2),
                part("SWA KV cache", PartHolds::AtMostContext, 256, 2),
                part(
                    "DSV4 CSA compressed KV cache",
                    PartHolds::AtMostContext,
                    256,
                    2
                ),
            ]
        );
        assert_eq!(
            parse(HYBRID_ISWA),
            vec![
                part("non-SWA KV cache", PartHolds::Context, 256, 2),
                part("SWA KV cache", PartHolds::AtMostContext, 256, 2),
                part("llama_memory_recurrent", PartHolds::States, 2, 1),
            ]
        );
    }

    #[test]
    fn a_memory_of_another_kind_is_told_apart() {
        // 0.1.135 builds lfm2_swa's memory as a plain hybrid one.
        let hybrid = "llama_kv_cache: size =    0.03 MiB (   512 cells,   1 layers,  2/2 seqs), K (f16): 0.02 MiB
llama_memory_recurrent: size =    0.00 MiB (     2 cells,   2 layers,  2 seqs), R (f32):    0.00 MiB
";
        let parts = parse(hybrid);
        assert!(other_memory(MemoryType::HybridIswa, &parts).is_some());
        assert_eq!(other_memory(MemoryType::Hybrid, &parts), None);
        assert_eq!(
            other_memory(MemoryType::HybridIswa, &parse(HYBRID_ISWA)),
            None
        );
        assert_eq!(other_memory(MemoryType::Dsv4, &parse(DSV4)), None);
        assert_eq!(other_memory(MemoryType::Kv, &[]), None);
        // 0.1.154 builds minimax-m3's memory as one cache.
        let one =
            parse("llama_kv_cache: size =    0.03 MiB (   256 cells,   2 layers,  2/2 seqs), K\n");
        assert!(other_memory(MemoryType::Msa, &one).is_some());
        assert_eq!(other_memory(MemoryType::Kv, &one), None);
    }

    #[test]
    fn a_plain_cache_and_the_old_format_without_streams() {
        let plain = "llama_kv_cache: size =    0.03 MiB (  1024 cells,   1 layers,  4/1 seqs), K (f16): 0.02 MiB\n";
        assert_eq!(
            parse(plain),
            vec![part("llama_kv_cache", PartHolds::Context, 1024, 1)]
        );
        let old = "llama_kv_cache_unified: size =    0.03 MiB (   256 cells,   1 layers,  2 seqs), K (f16): 0.02 MiB\n";
        assert_eq!(
            parse(old),
            vec![part("llama_kv_cache_unified", PartHolds::Context, 256, 1)]
        );
        assert!(parse("llama_context: n_ctx = 512\nno colon here\n").is_empty());
    }
}
