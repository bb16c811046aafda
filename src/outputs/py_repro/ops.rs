//! The ops as mlx-lm calls, in `workers/mlx_worker.py`'s mapping: one place per op kind. Each
//! op is a few straight-line statements headed by a comment that names the kvaudit op; where
//! the worker decides at run time (a sequence's offset, whether a cache can trim), the program
//! does too, with the worker's words. Numbers are formatted from integers; a slot name goes
//! through [`py_string_literal`].

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::escape::{py_comment, py_string_literal};
use super::settings::MlxSetup;
use crate::base::op::{default_token, Decode, Op, Slot};

/// What rendering an op needs to know about the ops before it.
pub struct Replay<'a> {
    /// The setup as the worker runs it.
    pub setup: &'a MlxSetup,
    /// Slots a save has written so far (a load from another is refused).
    pub saved: BTreeSet<Slot>,
    /// Whether a decode may run past `n_ctx` (the decodes' tokens add up to more), so that the
    /// program needs the worker's room check.
    pub may_overflow: bool,
}

impl<'a> Replay<'a> {
    /// The replay of `ops` (setup ops and trace) on `setup`.
    pub fn new(setup: &'a MlxSetup, ops: &[&Op]) -> Self {
        let total: u64 = ops
            .iter()
            .map(|op| op.as_decode().map_or(0, |d| u64::from(d.n)))
            .sum();
        Replay {
            setup,
            saved: BTreeSet::new(),
            may_overflow: total > u64::from(setup.n_ctx),
        }
    }

    fn valid(&self, seq: i32) -> bool {
        seq >= 0 && (seq as u32) < self.setup.n_seq_max
    }

    /// `live = None` where the worker forgets its batch (engine batch only).
    fn forget_batch(&self, out: &mut Vec<String>) {
        if self.setup.batch {
            out.push("live = None".into());
        }
    }
}

/// Appends the statements of `op` (headed `# LABEL: {op json}`) at `indent`.
pub fn emit_op(s: &mut String, r: &mut Replay<'_>, op: &Op, label: &str, indent: &str) {
    let _ = writeln!(
        s,
        "{indent}# {}: {}",
        py_comment(label),
        py_comment(&op.to_json())
    );
    let mut lines = Vec::new();
    op_lines(&mut lines, r, op, label);
    if lines.is_empty() {
        lines.push("pass".into());
    }
    for line in lines {
        let _ = writeln!(s, "{indent}{line}");
    }
}

/// A `print` of fixed text (the label and kvaudit's words, no input text).
fn say(label: &str, what: &str) -> String {
    format!("print({})", py_string_literal(&format!("{label}: {what}")))
}

fn refused(out: &mut Vec<String>, label: &str, seq: i32, r: &Replay<'_>) {
    out.push(say(
        label,
        &format!(
            "sequence id {seq} outside [0, {}): kvaudit refuses the op, nothing is called",
            r.setup.n_seq_max
        ),
    ));
}

fn flags_unsupported(out: &mut Vec<String>, flags: u32) -> bool {
    if flags & !1 != 0 {
        out.push(format!(
            "unsupported(\"state flags {flags}: mlx-lm keeps no device-side state apart\")"
        ));
        return true;
    }
    false
}

fn op_lines(out: &mut Vec<String>, r: &mut Replay<'_>, op: &Op, label: &str) {
    match op {
        Op::Decode(d) => decode(out, r, d, label),
        Op::SeqRm { seq, p0, p1 } => {
            if *seq != -1 && !r.valid(*seq) {
                return refused(out, label, *seq, r);
            }
            r.forget_batch(out);
            seq_rm(out, r, *seq, *p0, *p1, label);
        }
        Op::SeqCp { src, dst, p0, p1 } => {
            if let Some(bad) = [*src, *dst].into_iter().find(|s| !r.valid(*s)) {
                return refused(out, label, bad, r);
            }
            r.forget_batch(out);
            if src == dst {
                out.push(say(label, "a copy onto itself: nothing to do"));
                return;
            }
            if *p0 > 0 {
                out.push(format!(
                    "unsupported(\"seq_cp from position {p0}: mlx-lm copies a whole cache\")"
                ));
                return;
            }
            if *p1 >= 0 {
                out.push(format!("if {p1} < offset({src}):"));
                out.push(format!("    unsupported(\"seq_cp [{p0}, {p1}) of a longer sequence: mlx-lm copies a whole cache\")"));
            }
            out.push(format!("if offset({dst}) != 0:"));
            out.push(format!("    unsupported(\"seq_cp into seq {dst}, which holds tokens: an mlx-lm copy replaces a cache\")"));
            out.push(format!("caches[{dst}] = copy.deepcopy(caches[{src}])  # as LRUPromptCache copies a prompt cache"));
            out.push(format!("evaluate(caches[{dst}])"));
            out.push(format!("tokens[{dst}] = list(tokens[{src}])"));
        }
        Op::SeqKeep { seq } => {
            if !r.valid(*seq) {
                return refused(out, label, *seq, r);
            }
            r.forget_batch(out);
            if r.setup.batch {
                out.push("ids = written()".into());
                out.push(format!(
                    "if {seq} in ids:  # through the batch: merge, filter, extract"
                ));
                out.push(
                    "    batch = [merge(l, [caches[s][l] for s in ids]) for l in range(N_LAYERS)]"
                        .into(),
                );
                out.push("    for b in batch:".into());
                out.push(format!("        b.filter([ids.index({seq})])"));
                out.push(format!("    caches[{seq}] = [b.extract(0) for b in batch]"));
                out.push(format!("    evaluate(caches[{seq}])"));
            }
            out.push("for s in range(N_SEQ):".into());
            out.push(format!("    if s != {seq}:"));
            out.push("        caches[s], tokens[s] = make_cache(), []".into());
        }
        Op::Clear => {
            r.forget_batch(out);
            out.push("for s in range(N_SEQ):".into());
            out.push("    caches[s], tokens[s] = make_cache(), []".into());
        }
        Op::SeqAdd { .. } | Op::SeqDiv { .. } => {
            out.push("unsupported(\"mlx-lm caches have no position shift\")".into());
        }
        Op::StateSave { slot } => {
            out.push(format!(
                "slots[{}] = save_whole()  # save_prompt_cache",
                py_string_literal(slot.as_str())
            ));
            out.push("returned = True".into());
            r.saved.insert(slot.clone());
        }
        Op::StateSeqSave { seq, slot, flags } => {
            if flags_unsupported(out, *flags) {
                return;
            }
            if !r.valid(*seq) {
                return refused(out, label, *seq, r);
            }
            out.push(format!(
                "slots[{}] = save_seq({seq})  # save_prompt_cache",
                py_string_literal(slot.as_str())
            ));
            out.push("returned = True".into());
            r.saved.insert(slot.clone());
        }
        Op::StateLoad {
            slot,
            truncate,
            flip,
        } => {
            if !r.saved.contains(slot) {
                out.push(say(
                    label,
                    "the slot holds nothing (no save into it before): kvaudit refuses the load",
                ));
                return;
            }
            damaged(out, slot, *truncate, *flip);
            out.push(
                "returned = load_whole(data, intact=data == saved)  # load_prompt_cache".into(),
            );
            out.push(format!(
                "print({} % returned)",
                py_string_literal(&format!("{label}: the load returned %s"))
            ));
        }
        Op::StateSeqLoad {
            seq,
            slot,
            flags,
            truncate,
            flip,
        } => {
            if flags_unsupported(out, *flags) {
                return;
            }
            if !r.valid(*seq) {
                return refused(out, label, *seq, r);
            }
            r.forget_batch(out);
            if !r.saved.contains(slot) {
                out.push(say(
                    label,
                    "the slot holds nothing (no save into it before): kvaudit refuses the load",
                ));
                return;
            }
            damaged(out, slot, *truncate, *flip);
            out.push(format!(
                "returned = load_seq({seq}, data, intact=data == saved)  # load_prompt_cache"
            ));
            out.push(format!(
                "print({} % returned)",
                py_string_literal(&format!("{label}: the load returned %s"))
            ));
        }
    }
}

/// `saved` and `data`: a slot's bytes, and the bytes the load sees (damaged as the op says).
fn damaged(out: &mut Vec<String>, slot: &Slot, truncate: Option<u32>, flip: Option<u32>) {
    let opt = |v: Option<u32>| v.map_or("None".to_string(), |v| v.to_string());
    out.push(format!(
        "saved = slots[{}]",
        py_string_literal(slot.as_str())
    ));
    if truncate.is_none() && flip.is_none() {
        out.push("data = saved".into());
    } else {
        out.push(format!(
            "data = damaged(saved, truncate={}, flip={})",
            opt(truncate),
            opt(flip)
        ));
    }
}

fn decode(out: &mut Vec<String>, r: &mut Replay<'_>, d: &Decode, label: &str) {
    let mut seqs: Vec<i32> = Vec::new();
    for &s in &d.seqs {
        if !seqs.contains(&s) {
            seqs.push(s);
        }
    }
    if let Some(bad) = seqs.iter().find(|s| !r.valid(**s)) {
        out.push(say(
            label,
            &format!(
                "sequence id {bad} outside [0, {}): the decode returns -1, nothing is called",
                r.setup.n_seq_max
            ),
        ));
        return;
    }
    let toks: Vec<i32> = match &d.tokens {
        Some(t) => t.clone(),
        None => (0..d.n).map(default_token).collect(),
    };
    let vocab = r.setup.vocab();
    if toks.iter().any(|t| !(0..vocab).contains(t)) {
        out.push(say(label, &format!("a token outside the vocabulary [0, {vocab}): the decode returns -1, nothing is called")));
        return;
    }
    let list = toks
        .iter()
        .map(i32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let first = seqs[0];
    let mut body = Vec::new();
    if seqs.len() > 1 {
        let offs = seqs
            .iter()
            .map(|s| format!("offset({s})"))
            .collect::<Vec<_>>()
            .join(", ");
        body.push(format!("if len({{{offs}}}) > 1:"));
        body.push("    unsupported(\"a decode into sequences at different offsets: mlx-lm places each token at its own cache's offset\")".into());
    }
    body.push(format!(
        "start = offset({first})  # mlx-lm puts the tokens at the cache's offset"
    ));
    if let Some(pos) = d.pos {
        body.push(format!("if start != {pos}:"));
        body.push(format!("    unsupported(\"a decode at position {pos}: mlx-lm places a token at its cache's offset\")"));
    }
    let mut call = Vec::new();
    if seqs.len() > 1 && r.setup.batch {
        let ids = seqs
            .iter()
            .map(i32::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        call.push(format!("ids = [{ids}]"));
        call.push("if live is not None and live[0] == ids:  # the batch of the last decode, still in step".into());
        call.push("    batch = live[1]".into());
        call.push("else:".into());
        call.push(
            "    batch = [merge(l, [caches[s][l] for s in ids]) for l in range(N_LAYERS)]".into(),
        );
        call.push("live = None".into());
        call.push(format!(
            "model(mx.array([[{list}]] * {}), cache=batch)",
            seqs.len()
        ));
        call.push("evaluate(batch)".into());
        call.push("for i, s in enumerate(ids):".into());
        call.push("    caches[s] = [b.extract(i) for b in batch]".into());
        call.push("    evaluate(caches[s])".into());
        call.push("    tokens[s] = tokens[s][:start] + [".to_string() + &list + "]");
        call.push("live = (ids, batch)".into());
    } else {
        if r.setup.batch {
            call.push("live = None".into());
        }
        for s in &seqs {
            call.push(format!("model(mx.array([[{list}]]), cache=caches[{s}])"));
            call.push(format!("evaluate(caches[{s}])"));
            call.push(format!("tokens[{s}] = tokens[{s}][:start] + [{list}]"));
        }
    }
    if r.may_overflow {
        body.push(format!("if start + {} > N_CTX:", d.n));
        body.push(format!(
            "    print({})",
            py_string_literal(&format!(
                "{label}: no room for {} tokens in n_ctx: the decode returns 1",
                d.n
            ))
        ));
        body.push("else:".into());
        body.extend(call.into_iter().map(|l| format!("    {l}")));
    } else {
        body.extend(call);
    }
    out.extend(body);
}

fn seq_rm(out: &mut Vec<String>, r: &Replay<'_>, seq: i32, p0: i32, p1: i32, label: &str) {
    let lo = p0.max(0);
    if p1 >= 0 && lo >= p1 {
        out.push(say(label, "an empty range: nothing to remove"));
        out.push("returned = True".into());
        return;
    }
    // the worker's seq_rm returns whether every trim_prompt_cache trimmed what was asked
    out.push("returned = True".into());
    let (indent, sq) = if seq == -1 {
        out.push("for s in range(N_SEQ):  # seq -1: every sequence".into());
        ("    ", "s".to_string())
    } else {
        ("", seq.to_string())
    };
    let mut body = vec![format!(
        "if offset({sq}) > {lo}:  # something resident from position {lo} on"
    )];
    if p1 >= 0 {
        body.push(format!("    if offset({sq}) > {p1}:"));
        body.push(format!("        unsupported(\"seq_rm [{p0}, {p1}) inside a sequence: mlx-lm removes only a tail\")"));
    }
    let trim = vec![
        format!("n = offset({sq}) - {lo}"),
        format!("trimmed = C.trim_prompt_cache(caches[{sq}], n)"),
        format!(
            "print({} % ({sq}, n, trimmed))",
            py_string_literal(&format!(
                "{label}: trim_prompt_cache(seq %d, %d) returned %d"
            ))
        ),
        format!("returned = returned and trimmed == n  # \"return the number of tokens that were trimmed\""),
        format!("evaluate(caches[{sq}])"),
        format!("tokens[{sq}] = tokens[{sq}][:{lo}]"),
    ];
    if r.setup.may_refuse_trim() {
        body.push(format!(
            "    if not C.can_trim_prompt_cache(caches[{sq}]):  # a RotatingKVCache that wrapped"
        ));
        if lo > 0 {
            body.push(format!(
                "        print({} % {sq})",
                py_string_literal(&format!(
                    "{label}: seq %d: can_trim_prompt_cache is false: the op is refused"
                ))
            ));
        } else {
            body.push(format!("        caches[{sq}], tokens[{sq}] = make_cache(), []  # the whole sequence: a fresh cache"));
        }
        body.push("    else:".into());
        body.extend(trim.into_iter().map(|l| format!("        {l}")));
    } else {
        body.extend(trim.into_iter().map(|l| format!("    {l}")));
    }
    out.extend(body.into_iter().map(|l| format!("{indent}{l}")));
}
