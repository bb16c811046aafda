//! The oracles' checks in C, as data for the C reproducer (`outputs/c_repro`): what a standalone
//! program over llama.h states at a finding's step, from the context's own serialized state.
//! An oracle with a C check returns one of the [`CCheck`]s here (swa-window's and state-size's
//! are in their own files, beside the rules they restate), named by the llama.cpp outputs'
//! words for the oracle (`outputs::llama_h`); the reproducer iterates the registry.
//!
//! A check adds code in up to four places: right before the trace's last op, before the loop
//! over the checked sequences (whole-context dumps), inside it (one sequence: locals `sq`,
//! `cells`, `n`, `mn`, `mx`, `tmin`, `tmax`, `k`), and after it. The program's C helpers are
//! `outputs/c_repro/prelude.rs`'s. Only integers and fixed text reach the program from here: the
//! finding's `expected` is hostile, and only its integers are read.

use std::fmt::Write as _;

use serde_json::Value;

use crate::base::op::{MemoryType, Trace};

/// What a check is given.
#[derive(Clone, Copy, Debug)]
pub struct CheckInput<'a> {
    /// The finding's trace.
    pub trace: &'a Trace,
    /// How many of its ops run before the check (the finding's step, at most the trace's length).
    pub step: usize,
    /// What the oracle expected (the finding's `expected`).
    pub expected: &'a Value,
    /// The finding's kind (hostile text: compared, never written into the program).
    pub kind: Option<&'a str>,
    /// The sequences checked.
    pub seqs: &'a [i32],
}

/// Writes C statements for a check.
pub type Emit = fn(&mut String, &CheckInput<'_>);

/// An oracle's check in C: the statements it puts in each place of the program.
#[derive(Clone, Copy)]
pub struct CCheck {
    /// Right before the trace's last op.
    pub before_last_op: Emit,
    /// Before the loop over the checked sequences.
    pub before_seqs: Emit,
    /// Inside the loop: one sequence.
    pub seq: Emit,
    /// After the loop.
    pub after_seqs: Emit,
}

impl std::fmt::Debug for CCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CCheck")
    }
}

/// No statements.
pub fn nothing(_: &mut String, _: &CheckInput<'_>) {}

impl CCheck {
    /// A check of each sequence alone.
    const fn per_seq(seq: Emit) -> CCheck {
        CCheck {
            before_last_op: nothing,
            before_seqs: nothing,
            seq,
            after_seqs: nothing,
        }
    }
}

/// The C statement that reads a sequence's cells (`sq`) into `cells` and their count into `n`
/// for a memory type (src/oracles/memory.rs: an iSWA memory's are its base cache's, and its
/// windowed dump fills `win`, `nwin`), the prelude's readers; `cells`, `n`, `win` and `nwin`
/// are the names given.
pub fn read_cells(memory: MemoryType, cells: &str, n: &str, win: &str, nwin: &str) -> String {
    read_cells_of(memory, "ctx", cells, n, win, nwin)
}

/// [`read_cells`] of the context named `ctx` (the round trip reads its twin's the same way: a
/// memory's cells are its own reader's, whichever context holds them).
pub fn read_cells_of(
    memory: MemoryType,
    ctx: &str,
    cells: &str,
    n: &str,
    win: &str,
    nwin: &str,
) -> String {
    let (reader, windowed) = match memory {
        MemoryType::Kv => ("resident", false),
        // MSA: two whole caches, each with its V records, as an iSWA pair's dump: the K/V cache
        // (whose cells the accessors answer from) into `cells`, the indexer cache into `win`
        // (a failed load that leaves one of them shows only when both are read).
        MemoryType::Msa => ("resident_iswa", true),
        // dsv4: the raw pair's base cache (its first cache after the header) holds every cell.
        MemoryType::Dsv4 => ("resident_dsv4", false),
        // DSA: the MLA cache (whose cells the accessors answer from) into `cells`, the indexer
        // key cache into `win` (K records only).
        MemoryType::Dsa => ("resident_dsa", true),
        MemoryType::Recurrent => ("resident_recurrent", false),
        MemoryType::Hybrid => ("resident_hybrid", false),
        // hybrid_idx: the attention cache's cells (with cell exts), as a hybrid's (the indexer
        // cache mirrors them).
        MemoryType::HybridIdx => ("resident_hybrid_idx", false),
        // A memory with a windowed cache reads its windowed dump too (`win`, `nwin`).
        MemoryType::Iswa => ("resident_iswa", true),
        // DSA-iSWA: the MLA cache into `cells`, the windowed cache (the dump's third) into `win`.
        MemoryType::DsaIswa => ("resident_dsa_iswa", true),
        MemoryType::HybridIswa => ("resident_hybrid_iswa", true),
    };
    if windowed {
        format!(
            "int {n} = 0; int {win}[4096]; int {nwin} = {reader}({ctx}, sq, {cells}, &{n}, {win}, 4096); (void){nwin};"
        )
    } else {
        format!("int {n} = {reader}({ctx}, sq, {cells}, 4096);")
    }
}

/// The C statements that put the cells a probe decodes right after into `pc` (their count `pn`),
/// inside the per-sequence loop: the observation's cells (`SeqObservation::cells`, the logits
/// and reload probes' position, running/probe.rs), which are the reader's `cells` but for a
/// hybrid memory, whose reader keeps only the attention cells within the recurrent states'
/// range (`memory::present`) while the probes decode after the attention cache's last cell.
fn probe_cells(memory: MemoryType) -> &'static str {
    match memory {
        MemoryType::Hybrid => "int pc[4096]; int pn = hybrid_cells(ctx, sq, pc, 4096, 0, 0);",
        MemoryType::HybridIdx => "int pc[4096]; int pn = hybrid_cells(ctx, sq, pc, 4096, 1, 0);",
        // The iSWA pair comes first in a hybrid-iSWA dump: its base cache, unfiltered.
        MemoryType::HybridIswa => {
            "int pc[4096]; int pn = 0; { int pw[4096]; (void)resident_iswa(ctx, sq, pc, &pn, pw, 4096); }"
        }
        MemoryType::Kv
        | MemoryType::Msa
        | MemoryType::Dsv4
        | MemoryType::Dsa
        | MemoryType::Recurrent
        | MemoryType::Iswa
        | MemoryType::DsaIswa => "const int *pc = cells; int pn = n;",
    }
}

/// Integers as a C initializer list.
pub fn c_array(v: &[i32]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// I1: the accessors against the extremes of the sequence's cells; for an iSWA memory
/// (`memory::allowed`), pos_max is the base cache's largest position and pos_min lies between
/// the base cache's smallest and the windowed dump's smallest (`win`, `nwin`).
pub const I1: CCheck = CCheck::per_seq(|s, input| {
    if input.trace.setup.arch.memory().has_window() {
        let _ = writeln!(
            s,
            "        int wmin = nwin ? win[0] : tmax; if (wmin < tmin) wmin = tmin; if (wmin > tmax) wmin = tmax;"
        );
        let _ = writeln!(s, "        if (tmax < 0 ? (mn != -1 || mx != -1) : (mx != tmax || mn < tmin || mn > wmin)) {{ printf(\"I1 violated: accessors say [%d, %d], the base cache holds [%d, %d], the windowed dump starts at %d\\n\", mn, mx, tmin, tmax, nwin ? win[0] : -1); reproduced = 1; }}");
    } else {
        let _ = writeln!(s, "        if (mn != tmin || mx != tmax) {{ printf(\"I1 violated: accessors say [%d, %d], the state says [%d, %d]\\n\", mn, mx, tmin, tmax); reproduced = 1; }}");
    }
});

/// I2: no hole between the sequence's cells.
pub const I2: CCheck = CCheck::per_seq(|s, _| {
    let _ = writeln!(s, "        for (int i = 1; i < n; i++) if (cells[i] - cells[i - 1] > 1) {{ printf(\"I2 violated: positions %d..%d missing\\n\", cells[i - 1] + 1, cells[i] - 1); reproduced = 1; }}");
});

/// differential: the sequence as the reference left it (`expected`'s `pos_min`, `pos_max`,
/// `cells`).
pub const DIFFERENTIAL: CCheck = CCheck::per_seq(|s, input| differs_from(s, input.expected));

/// config-differential: the sequence as the other configuration left it (`expected`'s `other
/// configuration`, recorded by kvaudit): the program runs the first configuration only.
pub const CONFIG_DIFFERENTIAL: CCheck = CCheck::per_seq(|s, input| {
    differs_from(
        s,
        input
            .expected
            .get("other configuration")
            .unwrap_or(&Value::Null),
    )
});

/// The statements of a check that the sequence differs from `e`'s `pos_min`, `pos_max` and
/// `cells`.
fn differs_from(s: &mut String, e: &Value) {
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

/// crash: the program reproduces by crashing; reaching the end is not reproducing. A crash
/// while observing what the last op did (an observation crash, [`crate::oracles::crash`]) is
/// reproduced by making that observation after the op: the whole dump (also for the dumps'
/// sizes, which begin with it), or the twin round trip's whole load (the per-sequence dumps
/// are the loop's own).
pub const CRASH: CCheck = CCheck {
    before_last_op: nothing,
    before_seqs: |s, input| {
        let observation = |what: crate::base::cache::Observation| {
            input.kind.is_some_and(|k| {
                k.starts_with(&format!(
                    "{} ({})",
                    crate::base::cache::OBSERVATION_CRASH,
                    what.describe()
                ))
            })
        };
        // Printed, not a comment: the kind is hostile text, and a program's comment delimiters
        // must not depend on it (`fuzz_repro_json`).
        if observation(crate::base::cache::Observation::Whole)
            || observation(crate::base::cache::Observation::Sizes)
        {
            let _ = writeln!(
                s,
                "    printf(\"the observation that crashed: the whole dump (its size, then its data)\\n\");"
            );
            let _ = writeln!(s, "    {{ size_t wl = 0; uint8_t *w = dump_whole(ctx, &wl); printf(\"whole dump: %zu bytes\\n\", wl); free(w); }}");
        } else if observation(crate::base::cache::Observation::RoundTrip) {
            let _ = writeln!(
                s,
                "    printf(\"the observation that crashed: the twin round trip\\n\");"
            );
            let _ = writeln!(s, "    {{ size_t wl = 0; uint8_t *w = dump_whole(ctx, &wl); struct llama_context *tw = llama_init_from_model(model, cp);");
            let _ = writeln!(s, "      if (tw) printf(\"whole load into the twin read %zu of %zu bytes\\n\", llama_state_set_data(tw, w, wl), wl);");
            let _ = writeln!(s, "      free(w); if (tw) llama_free(tw); }}");
        }
    },
    seq: |s, _| {
        let _ = writeln!(s, "        (void)tmin; (void)tmax;");
    },
    after_seqs: |s, _| {
        let _ = writeln!(
            s,
            "    printf(\"no crash: the finding does not reproduce\\n\");"
        );
    },
};

/// conservation: the whole dump's cells are the union of the sequences' cells.
pub const CONSERVATION: CCheck = CCheck {
    before_last_op: nothing,
    before_seqs: |s, _| {
        let _ = writeln!(
            s,
            "    size_t whole_len = 0; uint8_t *whole = dump_whole(ctx, &whole_len);"
        );
        let _ = writeln!(s, "    int orphans = 0, whole_pos[4096]; int n_whole = whole_cells(whole, whole_len, -1, whole_pos, 4096, &orphans);");
        let _ = writeln!(
            s,
            "    printf(\"whole dump: %d used cells, %d of no sequence\\n\", n_whole, orphans);"
        );
        let _ = writeln!(s, "    if (orphans) {{ printf(\"conservation violated: cell without a sequence\\n\"); reproduced = 1; }}");
    },
    seq: |s, _| {
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
    },
    after_seqs: |s, _| {
        let _ = writeln!(s, "    free(whole);");
    },
};

/// round-trip: the whole dump and each sequence's dump load into a twin and read back the same.
pub const ROUND_TRIP: CCheck = CCheck {
    before_last_op: nothing,
    before_seqs: |s, _| emit_round_trip_prologue(s),
    seq: |s, input| emit_round_trip_seq(s, input.trace.setup.arch.memory()),
    after_seqs: |s, input| emit_round_trip_epilogue(s, input.trace.setup.arch.memory()),
};

/// contract and `contract?`: what the op returned, and the fields of the finding's `expected`.
pub const CONTRACT: CCheck = CCheck {
    before_last_op: nothing,
    before_seqs: |s, input| {
        // A clause about what the op returns (`seq_rm` of a whole sequence never fails).
        if let Some(want) = input.expected.get("returned").and_then(Value::as_bool) {
            let w = i32::from(want);
            let _ = writeln!(s, "    if (last_returned != -1 && last_returned != {w}) {{ printf(\"contract violated: the op returned %s, llama.h says {want}\\n\", last_returned ? \"true\" : \"false\"); reproduced = 1; }}");
        }
    },
    seq: |s, input| emit_contract_seq(s, input.expected),
    after_seqs: nothing,
};

/// cache-invisible: the probe's logits against a fresh twin that decodes the resident tokens.
pub const CACHE_INVISIBLE: CCheck = CCheck {
    before_last_op: cache_invisible_before_last_op,
    before_seqs: nothing,
    seq: |s, input| emit_probe_check(s, input, probe_tolerance(input), "cache-invisible"),
    after_seqs: nothing,
};

/// rollback: cache-invisible's program (the twin decodes the tokens the sequence kept, by the
/// token model over the trace, then the probe token in both contexts), under its own name.
pub const ROLLBACK: CCheck = CCheck {
    before_last_op: cache_invisible_before_last_op,
    before_seqs: nothing,
    seq: |s, input| emit_probe_check(s, input, probe_tolerance(input), "rollback"),
    after_seqs: nothing,
};

/// The tolerance a probe finding recorded (`expected`'s `max_abs_diff_at_most`).
fn probe_tolerance(input: &CheckInput<'_>) -> f64 {
    input
        .expected
        .get("max_abs_diff_at_most")
        .and_then(Value::as_f64)
        .unwrap_or(0.0)
}

/// cache-invisible: the tokens the twin decodes for each checked sequence, by position, from the
/// token model over the setup and the trace (`TokenModel::attention_tokens`): the resident
/// tokens llama.h says the sequence holds.
fn cache_invisible_before_last_op(s: &mut String, input: &CheckInput<'_>) {
    let (t, step, seqs) = (input.trace, input.step, input.seqs);
    let mut all = t.setup.clone();
    all.ops.extend(t.ops.iter().take(step).cloned());
    let model = crate::base::tokens::TokenModel::after_setup(&all);
    let n = seqs.len().max(1);
    let lists: Vec<Vec<(i32, i32)>> = seqs
        .iter()
        .map(|&q| model.attention_tokens(q).unwrap_or_default())
        .collect();
    let width = lists.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let rows = |f: fn(&(i32, i32)) -> i32| -> String {
        lists
            .iter()
            .map(|l| format!("{{{}}}", c_array(&l.iter().map(f).collect::<Vec<_>>())))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let counts: Vec<i32> = lists.iter().map(|l| l.len() as i32).collect();
    let _ = writeln!(s, "    /* the resident tokens of each checked sequence, by position (the twin decodes them) */");
    let _ = writeln!(s, "    const int ci_n[{n}] = {{{}}};", c_array(&counts));
    let _ = writeln!(
        s,
        "    const llama_pos ci_pos[{n}][{width}] = {{{}}};",
        rows(|e| e.0)
    );
    let _ = writeln!(
        s,
        "    const llama_token ci_tok[{n}][{width}] = {{{}}};",
        rows(|e| e.1)
    );
}

/// The probe token and position of one sequence (`pt`, `at`: right after the observation's last
/// cell, [`probe_cells`]) and the probe decode in the context (`rc`, -1 without cells).
fn emit_probe_position(s: &mut String, memory: MemoryType) {
    let probe = crate::base::tokens::PROBE_TOKEN;
    let _ = writeln!(s, "          {}", probe_cells(memory));
    let _ = writeln!(s, "          llama_token pt = {probe}; llama_pos at = pn ? pc[pn - 1] + 1 : 0; llama_seq_id one[1] = {{sq}};");
    let _ = writeln!(
        s,
        "          int rc = pn ? decode(ctx, 1, &pt, &at, 1, one) : -1;"
    );
}

/// cache-invisible on one sequence: the probe token's logits after the sequence in the audited
/// context against a fresh twin that decodes the resident tokens and the same probe.
fn emit_probe_check(s: &mut String, input: &CheckInput<'_>, tolerance: f64, name: &str) {
    let _ = writeln!(s, "        {{ const float tol = {tolerance:e}f; const int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));");
    emit_probe_position(s, input.trace.setup.arch.memory());
    let _ = writeln!(
        s,
        "          float *a = malloc(sizeof(float) * (size_t)nv);"
    );
    let _ = writeln!(s, "          if (rc == 0) memcpy(a, llama_get_logits_ith(ctx, -1), sizeof(float) * (size_t)nv);");
    let _ = writeln!(
        s,
        "          struct llama_context *tw = llama_init_from_model(model, cp);"
    );
    let _ = writeln!(s, "          int rt = (tw && ci_n[k]) ? decode(tw, ci_n[k], ci_tok[k], ci_pos[k], 1, one) : (tw ? 0 : -1);");
    let _ = writeln!(
        s,
        "          if (rt == 0) rt = decode(tw, 1, &pt, &at, 1, one);"
    );
    let _ = writeln!(s, "          if (rc == 0 && rt == 0) {{");
    let _ = writeln!(
        s,
        "            const float *b = llama_get_logits_ith(tw, -1); float d = 0;"
    );
    let _ = writeln!(s, "            for (int i = 0; i < nv; i++) {{ float x = a[i] - b[i]; if (x < 0) x = -x; if (!(x <= d)) d = x; }}");
    let _ = writeln!(s, "            printf(\"{name} (seq %d): probe at %d, %d resident tokens, max |logit difference| %g, tolerance %g\\n\", sq, at, ci_n[k], d, tol);");
    let _ = writeln!(s, "            if (d > tol) {{ printf(\"{name} violated: the logits differ from a fresh decode of the resident tokens\\n\"); reproduced = 1; }}");
    let _ = writeln!(s, "          }} else printf(\"{name} (seq %d): a probe decode failed (%d, %d): not judged\\n\", sq, rc, rt);");
    let _ = writeln!(s, "          free(a); if (tw) llama_free(tw); }}");
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
fn emit_round_trip_seq(s: &mut String, memory: MemoryType) {
    let _ = writeln!(s, "        (void)tmin; (void)tmax;");
    // The twin's cells by the memory's own reader, as the context's (`read_cells`): the plain
    // kv reader would misread another memory type's dump.
    let _ = writeln!(
        s,
        "        int tc[4096]; {}",
        read_cells_of(memory, "twin", "tc", "tn", "twin_win", "twin_nwin")
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
fn emit_round_trip_epilogue(s: &mut String, memory: MemoryType) {
    // Each sequence alone into the emptied twin, as the harness does (running/observe.rs
    // `round_trip`): sequences that share cells are written out separately.
    let _ = writeln!(
        s,
        "    const size_t n_check = sizeof check / sizeof check[0];"
    );
    let _ = writeln!(s, "    uint8_t *seq_bytes[sizeof check / sizeof check[0]]; size_t seq_len[sizeof check / sizeof check[0]]; size_t seq_read[sizeof check / sizeof check[0]];");
    let _ = writeln!(s, "    for (size_t k = 0; k < n_check; k++) seq_bytes[k] = dump_seq(ctx, check[k], &seq_len[k]);");
    let _ = writeln!(s, "    for (size_t k = 0; k < n_check; k++) {{");
    let _ = writeln!(s, "        llama_memory_clear(twin_mem, true);");
    let _ = writeln!(
        s,
        "        seq_read[k] = llama_state_seq_set_data(twin, seq_bytes[k], seq_len[k], check[k]);"
    );
    let _ = writeln!(s, "        printf(\"round trip: llama_state_seq_set_data(seq %d) into the emptied twin read %zu of %zu bytes\\n\", check[k], seq_read[k], seq_len[k]);");
    let _ = writeln!(s, "        llama_seq_id sq = check[k];");
    let _ = writeln!(
        s,
        "        int cells[4096]; {}",
        read_cells_of(memory, "ctx", "cells", "n", "win", "nwin")
    );
    let _ = writeln!(
        s,
        "        int tc[4096]; {}",
        read_cells_of(memory, "twin", "tc", "tn", "twin_win", "twin_nwin")
    );
    let _ = writeln!(s, "        llama_pos mn = llama_memory_seq_pos_min(mem, sq), mx = llama_memory_seq_pos_max(mem, sq);");
    let _ = writeln!(s, "        llama_pos tmn = llama_memory_seq_pos_min(twin_mem, sq), tmx = llama_memory_seq_pos_max(twin_mem, sq);");
    let _ = writeln!(s, "        int same = tmn == mn && tmx == mx && tn == n;");
    let _ = writeln!(
        s,
        "        for (int i = 0; same && i < n; i++) same = tc[i] == cells[i];"
    );
    let _ = writeln!(s, "        printf(\"  twin after the load: seq %d: seq_pos_min %d, seq_pos_max %d, %d cells\\n\", sq, tmn, tmx, tn);");
    let _ = writeln!(s, "        if (!seq_read[k]) {{ printf(\"round trip violated: seq load failed (seq %d)\\n\", sq); reproduced = 1; }}");
    let _ = writeln!(s, "        else if (!same) {{ printf(\"round trip violated: seq load differs (seq %d)\\n\", sq); reproduced = 1; }}");
    let _ = writeln!(
        s,
        "        size_t again_len = 0; uint8_t *again = dump_seq(twin, check[k], &again_len);"
    );
    let _ = writeln!(s, "        if (seq_read[k] && (again_len != seq_len[k] || memcmp(again, seq_bytes[k], seq_len[k]) != 0)) {{ printf(\"round trip violated: seq redump differs (seq %d)\\n\", check[k]); reproduced = 1; }}");
    let _ = writeln!(s, "        free(again); free(seq_bytes[k]);");
    let _ = writeln!(s, "    }}");
    let _ = writeln!(s, "    if (whole_read && !whole_same_bytes) {{ printf(\"round trip violated: whole redump differs\\n\"); reproduced = 1; }}");
    let _ = writeln!(s, "    free(whole);");
    let _ = writeln!(s, "    llama_free(twin);");
}

/// Whether failed-restore's C check compares the second part's cells too (`win`), as the oracle
/// does for every memory: a DSA memory's indexer key cache (its failed loads leave the two caches
/// apart). Other memories' C checks compare the first part only, as they did before DSA.
fn judges_second_part(memory: MemoryType) -> bool {
    // Both read their indexer cache into `win` (`read_cells_of`), a part of the memory a failed
    // load may leave behind on its own (R6d, R6f).
    matches!(memory, MemoryType::Dsa | MemoryType::Msa)
}

/// failed-restore: every checked sequence is read right before the last op (a load) and after
/// it; when the load read 0 bytes (`last_read`), a sequence load must leave every other
/// sequence as it was and its destination as it was or empty, a whole load every sequence as
/// it was or every one empty. The accessors and the reader's cells are compared (the memory's
/// first part: the prelude's readers; a DSA or MSA memory's indexer cache too,
/// `judges_second_part`).
pub const FAILED_RESTORE: CCheck = CCheck {
    before_last_op: |s, input| {
        let memory = input.trace.setup.arch.memory();
        let n = input.seqs.len().max(1);
        let _ = writeln!(s, "    /* every checked sequence right before the load */");
        let _ = writeln!(
            s,
            "    static int fr_c[{n}][4096]; int fr_n[{n}]; llama_pos fr_mn[{n}], fr_mx[{n}];"
        );
        if judges_second_part(memory) {
            let _ = writeln!(s, "    static int fr_w[{n}][4096]; int fr_nw[{n}];");
        }
        let _ = writeln!(
            s,
            "    {{ const llama_seq_id fr_seq[] = {{{}}};",
            c_array(input.seqs)
        );
        let _ = writeln!(
            s,
            "      for (size_t k = 0; k < sizeof fr_seq / sizeof fr_seq[0]; k++) {{ llama_seq_id sq = fr_seq[k]; int cells[4096];"
        );
        let _ = writeln!(
            s,
            "        {}",
            read_cells(memory, "cells", "n", "win", "nwin")
        );
        let _ = writeln!(s, "        fr_n[k] = n; memcpy(fr_c[k], cells, sizeof(int) * (size_t)(n < 4096 ? n : 4096)); fr_mn[k] = llama_memory_seq_pos_min(mem, sq); fr_mx[k] = llama_memory_seq_pos_max(mem, sq);");
        if judges_second_part(memory) {
            let _ = writeln!(s, "        fr_nw[k] = nwin; memcpy(fr_w[k], win, sizeof(int) * (size_t)(nwin < 4096 ? nwin : 4096));");
        }
        let _ = writeln!(s, "      }} }}");
    },
    before_seqs: |s, _| {
        let _ = writeln!(
            s,
            "    int fr_failed = last_read == 0, fr_changed = 0, fr_full = 0;"
        );
        let _ = writeln!(
            s,
            "    if (!fr_failed) printf(\"the load did not fail: not judged\\n\");"
        );
    },
    seq: |s, input| {
        let last = input.trace.ops.get(input.step.saturating_sub(1));
        let dest = if let Some(crate::base::op::Op::StateSeqLoad { seq, .. }) = last {
            Some(*seq)
        } else {
            None
        };
        let _ = writeln!(s, "        (void)tmin; (void)tmax;");
        let _ = writeln!(
            s,
            "        int same = n == fr_n[k] && mn == fr_mn[k] && mx == fr_mx[k];"
        );
        let _ = writeln!(
            s,
            "        for (int i = 0; same && i < n; i++) same = cells[i] == fr_c[k][i];"
        );
        if judges_second_part(input.trace.setup.arch.memory()) {
            let _ = writeln!(s, "        same = same && nwin == fr_nw[k];");
            let _ = writeln!(
                s,
                "        for (int i = 0; same && i < nwin; i++) same = win[i] == fr_w[k][i];"
            );
        }
        let _ = writeln!(s, "        int empty = n == 0 && mn == -1 && mx == -1;");
        if judges_second_part(input.trace.setup.arch.memory()) {
            let _ = writeln!(s, "        empty = empty && nwin == 0;");
        }
        let _ = writeln!(s, "        fr_changed += !same; fr_full += !empty;");
        match dest {
            Some(d) => {
                let _ = writeln!(s, "        if (fr_failed && sq != {d} && !same) {{ printf(\"failed-restore violated: failed seq load changed another sequence (seq %d)\\n\", sq); reproduced = 1; }}");
                let _ = writeln!(s, "        if (fr_failed && sq == {d} && !same && !empty) {{ printf(\"failed-restore violated: failed seq load left the destination neither as it was nor empty\\n\"); reproduced = 1; }}");
            }
            None => {
                let _ = writeln!(s, "        (void)same; (void)empty;");
            }
        }
    },
    after_seqs: |s, input| {
        let whole = input
            .trace
            .ops
            .get(input.step.saturating_sub(1))
            .is_some_and(|op| op.kind() == crate::base::op::OpKind::StateLoad);
        if whole {
            let _ = writeln!(s, "    if (fr_failed && fr_changed && fr_full) {{ printf(\"failed-restore violated: failed whole load left the memory neither as it was nor empty\\n\"); reproduced = 1; }}");
        } else {
            let _ = writeln!(s, "    (void)fr_changed; (void)fr_full;");
        }
    },
};

/// The tolerance a reload finding recorded (`expected`'s `max_abs_diff_at_most`).
fn reload_tolerance(input: &CheckInput<'_>) -> f64 {
    input
        .expected
        .get("max_abs_diff_at_most")
        .and_then(Value::as_f64)
        .unwrap_or(0.0)
}

/// Whether a reload finding is of a sequence's own state (its kind starts with `seq`), not the
/// whole context's.
fn reload_of_whole(input: &CheckInput<'_>) -> bool {
    !input.kind.is_some_and(|k| k.starts_with("seq"))
}

/// round-trip-logits: the saved state loaded into a fresh twin gives the same next-token logits.
pub const ROUND_TRIP_LOGITS: CCheck = CCheck::per_seq(|s, input| {
    emit_reload_check(s, input, true);
});

/// save-load-invisible: the saved state loaded back into the context changes no next-token
/// logits.
pub const SAVE_LOAD_INVISIBLE: CCheck = CCheck::per_seq(|s, input| {
    emit_reload_check(s, input, false);
});

/// round-trip-logits (`into_twin`) and save-load-invisible on one sequence (the reload probe,
/// `running/probe.rs`): the state saved (`whole`, or the sequence's), a probe token's logits in
/// the context, then the same probe after the state is loaded into a fresh twin or back into
/// the context.
fn emit_reload_check(s: &mut String, input: &CheckInput<'_>, into_twin: bool) {
    let (tolerance, whole) = (reload_tolerance(input), reload_of_whole(input));
    let name = if into_twin {
        "round-trip-logits"
    } else {
        "save-load-invisible"
    };
    let _ = writeln!(s, "        {{ const float tol = {tolerance:e}f; const int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));");
    let save = if whole {
        "dump_whole(ctx, &sl)"
    } else {
        "dump_seq(ctx, sq, &sl)"
    };
    // Saved before the probe decode, as the harness saves right after the trial.
    let _ = writeln!(s, "          size_t sl = 0; uint8_t *saved = {save};");
    emit_probe_position(s, input.trace.setup.arch.memory());
    let _ = writeln!(
        s,
        "          float *a = malloc(sizeof(float) * (size_t)nv);"
    );
    let _ = writeln!(s, "          if (rc == 0) memcpy(a, llama_get_logits_ith(ctx, -1), sizeof(float) * (size_t)nv);");
    let _ = writeln!(s, "          llama_memory_seq_rm(mem, sq, at, -1);");
    let target = if into_twin {
        let _ = writeln!(
            s,
            "          struct llama_context *tw = llama_init_from_model(model, cp);"
        );
        "tw"
    } else {
        let _ = writeln!(s, "          struct llama_context *tw = NULL;");
        "ctx"
    };
    let load = if whole {
        format!("llama_state_set_data({target}, saved, sl)")
    } else {
        format!("llama_state_seq_set_data({target}, saved, sl, sq)")
    };
    let _ = writeln!(
        s,
        "          size_t rd = (rc == 0 && (tw || !{into_twin})) ? {load} : 0;",
        into_twin = i32::from(into_twin)
    );
    let _ = writeln!(
        s,
        "          int rt = rd ? decode({target}, 1, &pt, &at, 1, one) : -1;"
    );
    let _ = writeln!(s, "          if (rt == 0) {{");
    let _ = writeln!(
        s,
        "            const float *b = llama_get_logits_ith({target}, -1); float d = 0;"
    );
    let _ = writeln!(s, "            for (int i = 0; i < nv; i++) {{ float x = a[i] - b[i]; if (x < 0) x = -x; if (!(x <= d)) d = x; }}");
    let _ = writeln!(s, "            printf(\"{name} (seq %d): probe at %d after the load, max |logit difference| %g, tolerance %g\\n\", sq, at, d, tol);");
    let _ = writeln!(s, "            if (d > tol) {{ printf(\"{name} violated: the load changed the next-token logits\\n\"); reproduced = 1; }}");
    let _ = writeln!(
        s,
        "            llama_memory_seq_rm(llama_get_memory({target}), sq, at, -1);"
    );
    let _ = writeln!(s, "          }} else printf(\"{name} (seq %d): no probe after the load (decode %d, load read %zu bytes): not judged\\n\", sq, rc, rd);");
    let _ = writeln!(
        s,
        "          free(a); free(saved); if (tw) llama_free(tw); }}"
    );
}
