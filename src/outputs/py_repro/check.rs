//! The oracles' checks in Python, for mlx-lm reproducers: what the program states after the
//! finding's step, from the caches' own `.state` and accessors, as `workers/mlx_worker.py`
//! observes them. One [`PyCheck`] per oracle with a check ([`py_check_of`], a table of the
//! oracles' ids: the C checks live on the oracles, `oracles/c_check.rs`; these are the mlx-lm
//! renderer's own). Only integers, floats and fixed text reach the program from here: the
//! finding's `expected` is hostile, and only its numbers and booleans are read.

use std::fmt::Write as _;

use serde_json::Value;

use crate::oracles::{cache_invisible, contract, round_trip, OracleId};

/// What a check is given.
#[derive(Clone, Copy, Debug)]
pub struct PyCheckInput<'a> {
    /// The finding's step (how many ops ran).
    pub step: usize,
    /// What the oracle expected (the finding's `expected`).
    pub expected: &'a Value,
    /// The sequences checked.
    pub seqs: &'a [i32],
    /// The checked op (the program observed every sequence right before it, `before_op`).
    pub op: Option<&'a crate::base::op::Op>,
}

/// Writes Python statements for a check, at the program's top level. They append one line
/// per violation to the list `bug`.
pub type Emit = fn(&mut String, &PyCheckInput<'_>);

/// An oracle's check in Python.
#[derive(Clone, Copy)]
pub struct PyCheck {
    /// The oracle's words for what it checks (the program's comment, the report's "expected").
    pub in_words: &'static str,
    /// The check reproduces by the checked op raising: the op (and the observation after it)
    /// runs inside `try`, and an exception there is the bug.
    pub raises: bool,
    /// The statements after the checked op.
    pub after: Emit,
}

impl std::fmt::Debug for PyCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PyCheck")
    }
}

/// The Python check of the oracle `id`, if it has one.
pub fn py_check_of(id: OracleId) -> Option<PyCheck> {
    CHECKS.iter().find(|(o, _)| *o == id).map(|(_, c)| *c)
}

/// The oracles with a Python check, in report order.
pub fn checked_oracles() -> Vec<OracleId> {
    CHECKS.iter().map(|(o, _)| *o).collect()
}

const CHECKS: [(OracleId, PyCheck); 7] = [
    (OracleId::I1, I1),
    (OracleId::I2, I2),
    (OracleId::CRASH, CRASH),
    (round_trip::ID, ROUND_TRIP),
    (contract::ID, CONTRACT),
    (contract::QUESTION_ID, CONTRACT),
    (cache_invisible::ID, CACHE_INVISIBLE),
];

/// The loop over the checked sequences, each observed and printed (`o`, `cells`).
fn each_seq(s: &mut String, input: &PyCheckInput<'_>) {
    let seqs: Vec<String> = input.seqs.iter().map(i32::to_string).collect();
    let _ = writeln!(s, "for s in [{}]:", seqs.join(", "));
    let _ = writeln!(s, "    o = observe(caches[s])");
    let _ = writeln!(s, "    cells = o[\"cells\"]");
    let _ = writeln!(s, "    print(\"seq %d: offset %d; accessors [pos_min %d, pos_max %d]; positions in its .state (%d): %s\" % (s, offset(s), o[\"pos_min\"], o[\"pos_max\"], len(cells), cells))");
}

/// I1: the accessors (offset, size(), keep) against the extremes of the positions the state
/// holds; with a windowed layer, pos_max is the full-attention layer's last position and
/// pos_min lies between its first and the windowed layer's first (as `oracles/memory.rs`
/// allows an iSWA memory).
const I1: PyCheck = PyCheck {
    in_words:
        "the accessors (offset, size()) name the first and last positions the cache's state holds",
    raises: false,
    after: |s, input| {
        each_seq(s, input);
        let _ = writeln!(
            s,
            "    tmin, tmax = (cells[0], cells[-1]) if cells else (-1, -1)"
        );
        let _ = writeln!(s, "    mn, mx_ = o[\"pos_min\"], o[\"pos_max\"]");
        let _ = writeln!(s, "    if WIN is None:");
        let _ = writeln!(s, "        wrong = (mn, mx_) != (tmin, tmax)");
        let _ = writeln!(s, "    else:");
        let _ = writeln!(s, "        win = o[\"second_cells\"]");
        let _ = writeln!(
            s,
            "        wmin = min(max(win[0] if win else tmax, tmin), tmax)"
        );
        let _ = writeln!(s, "        wrong = (mn, mx_) != (-1, -1) if tmax < 0 else (mx_ != tmax or mn < tmin or mn > wmin)");
        let _ = writeln!(s, "    if wrong:");
        let _ = writeln!(s, "        bug.append(\"I1: seq %d: offset and size() say positions [%d, %d], its .state holds [%d, %d]\" % (s, mn, mx_, tmin, tmax))");
    },
};

/// I2: no hole between a sequence's positions.
const I2: PyCheck = PyCheck {
    in_words: "a sequence's positions in the cache's state are contiguous",
    raises: false,
    after: |s, input| {
        each_seq(s, input);
        let _ = writeln!(s, "    for a, b in zip(cells, cells[1:]):");
        let _ = writeln!(s, "        if b - a > 1:");
        let _ = writeln!(s, "            bug.append(\"I2: seq %d: positions %d..%d missing from its .state\" % (s, a + 1, b - 1))");
    },
};

/// crash: the checked op, and reading every sequence's state after it, raise.
const CRASH: PyCheck = PyCheck {
    in_words: "the calls return (no exception)",
    raises: true,
    after: |_, _| {},
};

/// `expected`'s integer fields and integer `cells` as a Python dict literal (hostile input:
/// anything else is dropped).
fn expected_fields(e: &Value) -> String {
    let mut fields = Vec::new();
    for key in ["pos_min", "pos_max"] {
        if let Some(v) = e.get(key).and_then(Value::as_i64) {
            fields.push(format!("\"{key}\": {v}"));
        }
    }
    if let Some(cells) = e.get("cells").and_then(Value::as_array) {
        let cells: Vec<String> = cells
            .iter()
            .filter_map(Value::as_i64)
            .map(|v| v.to_string())
            .collect();
        fields.push(format!("\"cells\": [{}]", cells.join(", ")));
    }
    format!("{{{}}}", fields.join(", "))
}

/// contract (and `contract?`): the sequence as the op promises to leave it (the finding's
/// `expected`: positions, accessors), and what the op returned.
const CONTRACT: PyCheck = PyCheck {
    in_words: "the op leaves the sequence as it promises (a trim removes the trimmed positions from the cache, a decode adds its tokens, a copy copies)",
    raises: false,
    after: |s, input| {
        if let Some(want) = input.expected.get("returned").and_then(Value::as_bool) {
            let w = if want { "True" } else { "False" };
            let _ = writeln!(s, "if returned is not None and returned != {w}:");
            let _ = writeln!(s, "    bug.append(\"contract: the op returned %s, it promises {w}\" % returned)");
        }
        let _ = writeln!(s, "promised = {}  # the sequence after the op, as the op promises", expected_fields(input.expected));
        if let Some(crate::base::op::Op::SeqKeep { seq }) = input.op {
            // seq_keep promises the kept sequence as it was: what it held right before the op.
            let _ = writeln!(s, "kept = observe(caches[{seq}])");
            let _ = writeln!(s, "if kept != before_op[{seq}]:");
            let _ = writeln!(s, "    bug.append(\"contract: seq_keep({seq}) changed the kept sequence: %s before, %s after\" % (before_op[{seq}], kept))");
        }
        each_seq(s, input);
        let _ = writeln!(s, "    for key, want in promised.items():");
        let _ = writeln!(s, "        if o[key] != want:");
        let _ = writeln!(s, "            bug.append(\"contract: seq %d: %s is %s after the op, the op promises %s\" % (s, key, o[key], want))");
    },
};

/// round-trip: each sequence saved (save_prompt_cache) and loaded (load_prompt_cache) into a
/// fresh cache reads back the same, and saves to the same bytes; the whole file of every
/// written sequence too.
const ROUND_TRIP: PyCheck = PyCheck {
    in_words: "a prompt cache saved with save_prompt_cache and loaded with load_prompt_cache reads back the same (same positions, same offset) and saves to the same bytes",
    raises: false,
    after: |s, input| {
        each_seq(s, input);
        let _ = writeln!(s, "    data = save_seq(s)");
        let _ = writeln!(s, "    loaded, meta = read(data)");
        let _ = writeln!(s, "    twin = loaded or make_cache()");
        let _ = writeln!(s, "    t = observe(twin)");
        let _ = writeln!(s, "    print(\"  saved and loaded into a fresh cache: accessors [%d, %d], positions %s\" % (t[\"pos_min\"], t[\"pos_max\"], t[\"cells\"]))");
        let _ = writeln!(s, "    if t != o:");
        let _ = writeln!(s, "        bug.append(\"round-trip: seq %d: loaded back it reads %s, before the save %s\" % (s, t, o))");
        let _ = writeln!(s, "    elif write(loaded, meta) != data:");
        let _ = writeln!(s, "        bug.append(\"round-trip: seq %d: the loaded cache saves to other bytes\" % s)");
        let _ = writeln!(s, "ids = written()");
        let _ = writeln!(s, "loaded, meta = read(save_whole())");
        let _ = writeln!(s, "if \"batch\" in meta:");
        let _ = writeln!(s, "    twins = {{q: [b.extract(i) for b in loaded] for i, q in enumerate(ids)}}");
        let _ = writeln!(s, "else:");
        let _ = writeln!(s, "    twins = {{q: loaded[i * N_LAYERS:(i + 1) * N_LAYERS] for i, q in enumerate(ids)}}");
        let seqs: Vec<String> = input.seqs.iter().map(i32::to_string).collect();
        let _ = writeln!(s, "for s in [{}]:", seqs.join(", "));
        let _ = writeln!(s, "    o, t = observe(caches[s]), observe(twins.get(s) or make_cache())");
        let _ = writeln!(s, "    if t != o:");
        let _ = writeln!(s, "        bug.append(\"round-trip: seq %d: the file of every sequence loads it back as %s, before the save %s\" % (s, t, o))");
    },
};

/// cache-invisible: the probe token's logits after each sequence's cache against a fresh
/// cache that prefilled the sequence's tokens, within the tolerance kvaudit judged with.
const CACHE_INVISIBLE: PyCheck = PyCheck {
    in_words: "the next-token logits after a prompt cache equal, within the tolerance, those after a fresh prefill of the tokens it holds",
    raises: false,
    after: |s, input| {
        let tol = input
            .expected
            .get("max_abs_diff_at_most")
            .and_then(Value::as_f64)
            .filter(|t| t.is_finite())
            .unwrap_or(0.0);
        let _ = writeln!(s, "TOLERANCE = {tol:e}  # the largest max |logit difference| kvaudit lets hold");
        let _ = writeln!(s, "probe = mx.array([[5]])  # kvaudit's probe token (the worker's PROBE_TOKEN)");
        each_seq(s, input);
        let _ = writeln!(s, "    if not cells and not o.get(\"second_cells\"):");
        let _ = writeln!(s, "        continue");
        let _ = writeln!(s, "    a = model(probe, cache=copy.deepcopy(caches[s]))[0, -1]");
        let _ = writeln!(s, "    fresh = make_cache()");
        let _ = writeln!(s, "    if tokens[s]:");
        let _ = writeln!(s, "        model(mx.array([tokens[s]]), cache=fresh)");
        let _ = writeln!(s, "    b = model(probe, cache=fresh)[0, -1]");
        let _ = writeln!(s, "    d = mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))).item()");
        let _ = writeln!(s, "    print(\"  probe after %d tokens: max |logit difference| to a fresh prefill %g, tolerance %g\" % (len(tokens[s]), d, TOLERANCE))");
        let _ = writeln!(s, "    if not d <= TOLERANCE:");
        let _ = writeln!(s, "        bug.append(\"cache-invisible: seq %d: the logits after the cache differ from a fresh prefill of its %d tokens by %g\" % (s, len(tokens[s]), d))");
    },
};
