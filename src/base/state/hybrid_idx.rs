//! The dump of a `llama_memory_hybrid_idx` (0.1.157 on; `state_write`,
//! src/llama-memory-hybrid-idx.cpp:259-270 in 0.1.161): `llama_memory_hybrid::state_write` (the
//! attention cache, then the recurrent section), then the indexer key cache, "a pure suffix"
//! (`[TAG_HYBRID_IDX_STATE]`). The indexer cache is a `llama_kv_cache` built as an MLA cache
//! (`n_embd_head_v_mla_impl` set, :63-66), which allocates no V (`has_v = !is_mla`,
//! src/llama-kv-cache.cpp:231) and writes no V record, whatever its `v_trans` says
//! (`state_write_data` skips a null V, :2292-2294, :2321-2323): a cache's layout with K
//! records only ([`parse_k_only_cache`]), and cells without the attention cache's cell ext
//! ([`CELL_EXT`]).
//!
//! The recurrent section is not last here, and its records do not say how many layers are
//! recurrent (`n_layer` counts them all, `state_write_data` skips the others,
//! src/llama-memory-recurrent.cpp:915-975): the one count of R/S pairs after which the rest of the
//! bytes are exactly one cache is the section's end. A wrong count cannot pass for a cache: the
//! record types it would read as `n_stream` are the recurrent rows' ggml types (F32: 0, outside
//! a cache's 1..=256 streams), and a cache must end the bytes. Bytes that end right after
//! the recurrent section are the hybrid's layout without the indexer suffix (upstream #27813,
//! `state_write` not overridden): read as an indexer cache with no streams, so no cells.
//! A model with a PLE layer (`qwen4exp_ple`) writes that layer's conv history after its R
//! records ([`skip_ple_rows`]), and its indexer cache's cells carry the cell ext as well:
//! each count of pairs is tried without and with both.

use super::{
    parse_cache_ext, parse_cells, parse_cells_ext, parse_rows, KvSection, Memory, ParseError,
    Reader, RecurrentState, StateFormat, StreamState,
};

/// Whether the attention cache's cells carry a `llama_kv_cell_ext`: qwen4exp ropes with IMRoPE
/// (`n_pos_per_embd() > 1`, `has_cell_ext`, src/llama-kv-cache.cpp:1846-1849). The indexer
/// cache's do not: its hparams set `rope_type = LLAMA_ROPE_TYPE_NONE`
/// (llama-memory-hybrid-idx.cpp:60-62), so one position per cell; the recurrent section has
/// none either (measured: the dumps of `memtypes_load_qwen4exp_*`).
const CELL_EXT: bool = true;

/// The three parts, in the order `Memory` holds them: the caches (attention, indexer) and the
/// recurrent section.
pub(super) fn parse<'a>(r: &mut Reader<'a>, format: StateFormat) -> Result<Memory<'a>, ParseError> {
    let attention = parse_cache_ext(r, format, CELL_EXT)?;
    let (cells, seq_ids) = parse_cells(r)?;
    let at = r.at;
    match r.u32("s_trans")? {
        0 => {}
        x => return r.fail(at, format!("s_trans 0, found {x}")),
    }
    let n_layer = r.u32("n_layer")?;
    let records_at = r.at;
    let mut last = None;
    for (pairs, ple) in (1..=n_layer).flat_map(|p| [(p, false), (p, true)]) {
        r.at = records_at;
        let tried = (|| {
            let mut records = Vec::new();
            for i in 0..2 * pairs {
                records.push(parse_rows(r, cells.len(), "R or S")?);
                if ple && i == 0 {
                    skip_ple_rows(r, cells.len())?;
                }
            }
            if r.done() {
                // No indexer suffix: the hybrid's own layout, what 0.1.157's class wrote before
                // it overrode `state_write` (upstream #27813). The dump says nothing of the
                // indexer cache, read as a cache with no cells, so the oracles that know what
                // the ops put there (the contract) see it missing instead of the run failing.
                return Ok((records, Vec::new()));
            }
            // A PLE model's caches all carry the cell ext (`has_cell_ext`: `ple_n_heads > 0`,
            // src/llama-kv-cache.cpp:1846-1849), the indexer cache's too.
            let indexer = parse_k_only_cache(r, format, ple)?;
            if !r.done() {
                return r.fail(r.at, "the end of the indexer cache".to_string());
            }
            Ok((records, indexer))
        })();
        match tried {
            Ok((mut records, indexer)) => {
                let s = records.split_off(records.len() / 2);
                let recurrent = RecurrentState {
                    cells,
                    seq_ids,
                    n_layer,
                    r: records,
                    s,
                };
                return Ok((vec![attention, indexer], Some(recurrent), None));
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or(ParseError {
        offset: records_at,
        expected: "at least one recurrent layer (n_layer 0)".to_string(),
    }))
}

/// Reads past a PLE layer's conv history (`qwen4exp_ple`): `u64` row bytes and one row per cell,
/// written right after that layer's R rows (src/llama-memory-recurrent.cpp:944-952 in 0.1.161;
/// no type field). kvaudit's model has its PLE on its first recurrent layer, so the history
/// follows the first R record; it is read past, not judged (no oracle reads it).
fn skip_ple_rows(r: &mut Reader<'_>, cell_count: usize) -> Result<(), ParseError> {
    let row_bytes = r.u64("PLE conv row bytes")?;
    let n = row_bytes
        .checked_mul(cell_count as u64)
        .filter(|&n| n <= r.bytes.len() as u64);
    let Some(n) = n else {
        return r.fail(
            r.at,
            format!("{cell_count} PLE conv rows of {row_bytes} bytes"),
        );
    };
    r.take(n as usize, "PLE conv rows")?;
    Ok(())
}

/// A cache whose streams carry K records only (see the module docs): `u32 n_stream`, per stream
/// its cells and, when it has any, `v_trans, n_layer, [n_rot_k, n_rot_v]` and one K record per
/// layer.
fn parse_k_only_cache<'a>(
    r: &mut Reader<'a>,
    format: StateFormat,
    ext: bool,
) -> Result<Vec<StreamState<'a>>, ParseError> {
    let at = r.at;
    let n_stream = r.u32("n_stream")?;
    if n_stream == 0 || n_stream > 256 {
        return r.fail(at, format!("n_stream in 1..=256, found {n_stream}"));
    }
    (0..n_stream)
        .map(|_| {
            let (cells, seq_ids) = parse_cells_ext(r, ext)?;
            if cells.is_empty() {
                return Ok(StreamState {
                    cells,
                    seq_ids,
                    kv: None,
                });
            }
            let at = r.at;
            let v_trans = match r.u32("v_trans")? {
                0 => false,
                1 => true,
                x => return r.fail(at, format!("v_trans 0 or 1, found {x}")),
            };
            let n_layer = r.u32("n_layer")?;
            let n_rot = if format.rot_fields {
                Some((r.u32("n_rot_k")?, r.u32("n_rot_v")?))
            } else {
                None
            };
            let k = (0..n_layer)
                .map(|_| parse_rows(r, cells.len(), "indexer K"))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(StreamState {
                cells,
                seq_ids,
                kv: Some(KvSection {
                    v_trans,
                    n_layer,
                    n_rot,
                    k,
                    v: Vec::new(),
                }),
            })
        })
        .collect()
}
