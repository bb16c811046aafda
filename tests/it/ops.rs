//! Every op kind through every place that handles ops, from the one declaration
//! (`base/op_kind.rs`): where the compiler cannot tell that a kind was left out (a serde tag, a
//! table entry, a generator's list, a domain's enumeration, an arm that does nothing), these do.
//!
//! - `ops::every_kind_renders`: its name, JSON (tag and round trip), llama.h display and C
//!   reproducer call are the declared ones, and docs/usage.md shows its JSON.
//! - `ops::every_kind_is_generated_with_its_weight`: proptest's and `arbitrary`'s generators draw
//!   each kind as often as its declared weights say.
//! - `ops::every_kind_has_shrinker_moves`: every smaller form keeps the kind and is smaller, an op
//!   with a number in it has one, and a sequence swap moves every sequence the op names.
//! - `ops::every_kind_has_a_domain_axis`: a domain with everything on lists each kind as often
//!   as its count says; emptying the kind's declared fields removes it, emptying the others does
//!   not; every domain field is an override a domain file can set.

use kvaudit::base::domain::Domain;
use kvaudit::base::op::{Decode, Op, OpGroup, OpKind, Setup, Slot, Trace};
use kvaudit::engines::fuzz::{arb_op, case_runner, op_strategy, GenConfig};
use kvaudit::engines::shrink::{op_size, simplifications, swap_seqs};
use kvaudit::outputs::c_repro::{emit_c, parse_input};
use libtest_mimic::Trial;
use proptest::strategy::{Strategy, ValueTree};
use serde_json::{json, Value};

pub fn trials() -> Vec<Trial> {
    let t = |name: &str, f: fn() -> Result<(), String>| {
        Trial::test(format!("ops::{name}"), move || super::outcome(f()))
    };
    vec![
        t("every_kind_renders", every_kind_renders),
        t(
            "every_kind_is_generated_with_its_weight",
            every_kind_is_generated_with_its_weight,
        ),
        t(
            "every_kind_has_shrinker_moves",
            every_kind_has_shrinker_moves,
        ),
        t("every_kind_has_a_domain_axis", every_kind_has_a_domain_axis),
    ]
}

fn slot(name: &str) -> Slot {
    Slot::new(name).expect("a valid slot name")
}

/// An op of `kind` with every argument away from its smallest value.
fn example(kind: OpKind) -> Op {
    match kind {
        OpKind::SeqRm => Op::SeqRm {
            seq: 1,
            p0: 2,
            p1: 5,
        },
        OpKind::SeqCp => Op::SeqCp {
            src: 1,
            dst: 2,
            p0: 1,
            p1: 4,
        },
        OpKind::SeqKeep => Op::SeqKeep { seq: 1 },
        OpKind::SeqAdd => Op::SeqAdd {
            seq: 1,
            p0: 2,
            p1: 6,
            delta: -3,
        },
        OpKind::SeqDiv => Op::SeqDiv {
            seq: 1,
            p0: 2,
            p1: -1,
            d: 3,
        },
        OpKind::Clear => Op::Clear,
        OpKind::Decode => Op::Decode(Decode {
            seqs: vec![1, 2],
            n: 3,
            pos: Some(4),
            tokens: None,
        }),
        OpKind::StateSeqSave => Op::StateSeqSave {
            seq: 1,
            slot: slot("b"),
            flags: 0,
        },
        OpKind::StateSeqLoad => Op::StateSeqLoad {
            seq: 2,
            slot: slot("b"),
            flags: 0,
            truncate: Some(30),
            flip: None,
        },
        OpKind::StateSave => Op::StateSave { slot: slot("s") },
        OpKind::StateLoad => Op::StateLoad {
            slot: slot("s"),
            truncate: Some(30),
            flip: Some(3),
        },
    }
}

/// What must come before an op of `kind` so that it has something to work on (a load, a save).
fn before(kind: OpKind) -> Vec<Op> {
    match kind {
        OpKind::StateSeqLoad => vec![example(OpKind::StateSeqSave)],
        OpKind::StateLoad => vec![example(OpKind::StateSave)],
        OpKind::SeqRm
        | OpKind::SeqCp
        | OpKind::SeqKeep
        | OpKind::SeqAdd
        | OpKind::SeqDiv
        | OpKind::Clear
        | OpKind::Decode
        | OpKind::StateSeqSave
        | OpKind::StateSave => Vec::new(),
    }
}

/// The C reproducer of a crash finding on `ops`.
fn c_program(ops: Vec<Op>) -> Result<String, String> {
    let trace = Trace {
        setup: Setup {
            n_seq_max: 4,
            ..Setup::default()
        },
        ops,
    };
    let input = json!({ "oracle": "crash", "trace": trace }).to_string();
    let input = parse_input(&input).map_err(|e| e.to_string())?;
    Ok(emit_c(&input))
}

fn every_kind_renders() -> Result<(), String> {
    let usage = std::fs::read_to_string(super::root().join("docs/usage.md"))
        .map_err(|e| format!("docs/usage.md: {e}"))?;
    let mut names = Vec::new();
    for &kind in OpKind::ALL {
        if !usage.contains(&format!("{{\"op\":\"{}\"", kind.name())) {
            return Err(format!(
                "docs/usage.md (\"Op JSON\") shows no {{\"op\":\"{}\"}}",
                kind.name()
            ));
        }
        let op = example(kind);
        if op.kind() != kind {
            return Err(format!("the example of {kind:?} is a {:?}", op.kind()));
        }
        names.push(kind.name());
        if op.name() != kind.name() || OpKind::from_name(kind.name()) != Some(kind) {
            return Err(format!("{kind:?}: name {:?}", op.name()));
        }
        let value: Value = serde_json::from_str(&op.to_json()).map_err(|e| e.to_string())?;
        if value["op"] != kind.name() {
            return Err(format!(
                "{kind:?}: JSON {value} is not tagged {:?}",
                kind.name()
            ));
        }
        let back: Op = serde_json::from_str(&op.to_json()).map_err(|e| e.to_string())?;
        if back != op {
            return Err(format!("{kind:?}: {} reads back as {back:?}", op.to_json()));
        }
        let shown = op.to_string();
        let call = shown.split_once(" = ").map_or(shown.as_str(), |(_, c)| c);
        if !call.starts_with(&format!("{}(", kind.llama_fn())) {
            return Err(format!(
                "{kind:?} displays as {shown:?}, not as {}",
                kind.llama_fn()
            ));
        }
        // The C program calls the op's function once more than the same program without it.
        let calls = |text: &str| text.matches(&format!("{}(", kind.llama_fn())).count();
        let mut without = before(kind);
        without.push(Op::Clear);
        let mut with = without.clone();
        with.push(op.clone());
        let (a, b) = (calls(&c_program(without)?), calls(&c_program(with)?));
        if b <= a {
            return Err(format!(
                "{kind:?}: the C reproducer calls {} {b} times with {op} and {a} times without it",
                kind.llama_fn()
            ));
        }
    }
    names.sort_unstable();
    names.dedup();
    if names.len() != OpKind::ALL.len() {
        return Err(format!("two kinds share a name: {names:?}"));
    }
    Ok(())
}

/// Each kind's share of the draws, from the declared weights: the group's share times the
/// kind's share of its group.
fn expected_shares(state: bool) -> Vec<(OpKind, f64)> {
    let groups: &[OpGroup] = if state {
        &[OpGroup::Memory, OpGroup::State]
    } else {
        &[OpGroup::Memory]
    };
    let group_total: u32 = groups.iter().map(|g| g.weight()).sum();
    let mut out = Vec::new();
    for &group in groups {
        let kinds_total: u32 = group.kinds().map(|k| k.weight()).sum();
        for kind in group.kinds() {
            let share = f64::from(group.weight()) / f64::from(group_total)
                * f64::from(kind.weight())
                / f64::from(kinds_total);
            out.push((kind, share));
        }
    }
    out
}

/// The draws of each kind against its expected share: within five standard deviations, and
/// every kind of an enabled group drawn.
fn check_shares(what: &str, drawn: &[OpKind], state: bool) -> Result<(), String> {
    let n = drawn.len() as f64;
    for (kind, share) in expected_shares(state) {
        let count = drawn.iter().filter(|&&k| k == kind).count() as f64;
        let sd = (n * share * (1.0 - share)).sqrt();
        if count == 0.0 || (count - n * share).abs() > 5.0 * sd + 1.0 {
            return Err(format!(
                "{what}: {kind:?} drawn {count} times in {n}, expected about {:.0}",
                n * share
            ));
        }
    }
    if !state {
        if let Some(k) = drawn.iter().find(|k| k.group() == OpGroup::State) {
            return Err(format!("{what}: {k:?} drawn without state ops"));
        }
    }
    Ok(())
}

fn every_kind_is_generated_with_its_weight() -> Result<(), String> {
    const DRAWS: u64 = 20_000;
    for state in [false, true] {
        let g = GenConfig {
            state,
            ..GenConfig::default()
        };
        let strategy = op_strategy(&g);
        let mut runner = case_runner(7, u64::from(state));
        let drawn: Vec<OpKind> = (0..DRAWS)
            .map(|_| {
                let tree = strategy
                    .new_tree(&mut runner)
                    .expect("the generator rejects nothing");
                tree.current().kind()
            })
            .collect();
        check_shares(&format!("proptest, state {state}"), &drawn, state)?;
        // arbitrary: one op from each of DRAWS inputs of fixed pseudo-random bytes.
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(state);
        let mut drawn = Vec::new();
        for _ in 0..DRAWS {
            let bytes: Vec<u8> = (0..32)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 24) as u8
                })
                .collect();
            let op = arb_op(&mut arbitrary::Unstructured::new(&bytes), &g)
                .map_err(|e| format!("arbitrary: {e}"))?;
            drawn.push(op.kind());
        }
        check_shares(&format!("arbitrary, state {state}"), &drawn, state)?;
    }
    Ok(())
}

fn seqs_of(op: &Op) -> Vec<i32> {
    let mut v = Vec::new();
    op.for_each_seq(|s| v.push(s));
    v
}

fn every_kind_has_shrinker_moves() -> Result<(), String> {
    for &kind in OpKind::ALL {
        let op = example(kind);
        let smaller = simplifications(&op, 4);
        for c in &smaller {
            if c.kind() != kind || op_size(c) >= op_size(&op) {
                return Err(format!("{kind:?}: {c} is offered as a smaller {op}"));
            }
        }
        let has_number = serde_json::to_value(&op)
            .map_err(|e| e.to_string())?
            .as_object()
            .is_some_and(|o| o.values().any(|v| v.is_number() || v.is_array()));
        if has_number && smaller.is_empty() {
            return Err(format!("{kind:?}: no smaller form of {op}"));
        }
        // Swapping two sequences the op names (or two it does not) renames exactly those.
        let named = seqs_of(&op);
        let (a, b) = match named.as_slice() {
            [] => (0, 3),
            [s] => (*s, 3),
            [s, t, ..] => (*s, *t),
        };
        let swapped = swap_seqs(&op, a, b);
        let rename = |s: i32| {
            if s == a {
                b
            } else if s == b {
                a
            } else {
                s
            }
        };
        let want: Vec<i32> = named.iter().map(|&s| rename(s)).collect();
        if swapped.kind() != kind || seqs_of(&swapped) != want || swap_seqs(&swapped, a, b) != op {
            return Err(format!(
                "{kind:?}: swapping {a} and {b} in {op} gives {swapped}"
            ));
        }
    }
    Ok(())
}

/// The seed preset with every op of every kind switched on.
fn everything() -> Domain {
    Domain {
        name: "everything".into(),
        copy_ranges: Some(vec![[0, 3], [-1, -1]]),
        decode_shared: true,
        beyond_seqs: vec![2, 40],
        state: true,
        state_flags: vec![1],
        load_truncate: vec![12],
        ..Domain::preset("seed").expect("the seed preset")
    }
}

/// `d` with each field in `fields` emptied (`false`, `[]`).
fn emptied(d: &Domain, fields: &[&str]) -> Result<Domain, String> {
    let mut v = serde_json::to_value(d).map_err(|e| e.to_string())?;
    for f in fields {
        let slot = v
            .get_mut(*f)
            .ok_or_else(|| format!("the domain has no field {f:?}"))?;
        *slot = match slot {
            Value::Bool(_) => Value::Bool(false),
            Value::Array(_) => json!([]),
            other => return Err(format!("field {f:?} is neither a flag nor a list: {other}")),
        };
    }
    serde_json::from_value(v).map_err(|e| e.to_string())
}

fn count(d: &Domain, kind: OpKind) -> u64 {
    d.ops().iter().filter(|op| op.kind() == kind).count() as u64
}

fn every_kind_has_a_domain_axis() -> Result<(), String> {
    let all = everything();
    all.validate().map_err(|e| e.to_string())?;
    let value = serde_json::to_value(&all).map_err(|e| e.to_string())?;
    let axes: Vec<&str> = value
        .as_object()
        .expect("a domain is an object")
        .keys()
        .map(String::as_str)
        .filter(|&k| k != "name" && k != "setup")
        .collect();
    for &kind in OpKind::ALL {
        let n = count(&all, kind);
        if n == 0 || n != all.kind_count_bound(kind) {
            return Err(format!(
                "{kind:?}: the domain lists {n}, its count says {}",
                all.kind_count_bound(kind)
            ));
        }
        let own = kind.domain_fields();
        let without = emptied(&all, own)?;
        if count(&without, kind) != 0 || without.kind_count_bound(kind) != 0 {
            return Err(format!("{kind:?}: still listed with {own:?} empty"));
        }
        let others: Vec<&str> = axes.iter().copied().filter(|f| !own.contains(f)).collect();
        let only = emptied(&all, &others)?;
        if count(&only, kind) == 0 {
            return Err(format!("{kind:?}: not listed with only {own:?} set"));
        }
    }
    for f in &axes {
        if !OpKind::ALL.iter().any(|k| k.domain_fields().contains(f)) {
            return Err(format!("domain field {f:?} is no kind's axis"));
        }
    }
    // A domain file can set every field (`DomainOverrides` has each), and sets it as it is.
    let text = toml::to_string(&all).map_err(|e| e.to_string())?;
    let read = Domain::from_toml(&text).map_err(|e| e.to_string())?;
    if read != all {
        return Err(format!("a domain file of\n{text}\nreads back as {read:?}"));
    }
    Ok(())
}
