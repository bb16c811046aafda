//! A setup the target cannot make is an unsupported entry with its reason, and the hunt goes
//! on: native's plan with its first entry's setup made impossible (a decode of more tokens than
//! the context has cells, which returns 1 as llama.cpp's does when it has no slot).

use std::sync::atomic::AtomicBool;

use super::*;
use crate::base::op::{Decode, Op};
use crate::engines::hunt::plan::plan;
use crate::records::text::{markdown_text, terminal_text};

fn native() -> TargetSpec {
    TargetSpec::new("native", &[])
}

/// Native's first two plan entries, the first with a setup decode that cannot fit.
fn two_entries_the_first_impossible() -> Vec<PlanEntry> {
    let mut entries: Vec<PlanEntry> = plan(&native()).into_iter().take(2).collect();
    assert_eq!(entries.len(), 2, "native's plan has two entries");
    let setup = &mut entries[0].domain.setup;
    let too_many = setup.n_ctx + 1;
    setup.ops.push(Op::Decode(Decode::next(0, too_many)));
    entries
}

#[test]
fn an_impossible_setup_is_an_unsupported_entry_and_the_hunt_goes_on() {
    let entries = two_entries_the_first_impossible();
    let stop = AtomicBool::new(false);
    let cfg = HuntConfig {
        target: native(),
        budget: Budget::Trials(200),
        seed: 1,
        shard: Shard::WHOLE,
        threads: 1,
        plan: entries.clone(),
        only: Vec::new(),
        resume: None,
        stop: &stop,
    };
    let summary = run_hunt(&cfg, &mut |_| {}).expect("the hunt finishes");
    assert_eq!(summary.failed, None);
    assert!(!summary.incomplete);
    let [(id, reason)] = summary.unsupported.as_slice() else {
        panic!("one unsupported entry, got {:?}", summary.unsupported);
    };
    assert_eq!(id, &entries[0].id);
    // The reason names the op the target refused and what it answered.
    let n = entries[0].domain.setup.ops.len();
    assert!(
        reason.starts_with(&format!("cannot make the setup: setup op {n} of {n}, "))
            && reason.ends_with("Decoded { rc: 1 }"),
        "{reason}"
    );
    let ran: Vec<&str> = summary.entries.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ran, [entries[1].id.as_str()]);
    // The summary lists it with its reason: a line of its own in the terminal, a table row in
    // the Markdown.
    let terminal = summary.to_terminal();
    let line = format!("unsupported: {id}: {}", terminal_text(reason));
    assert!(terminal.lines().any(|l| l == line), "{terminal}");
    let markdown = summary.to_markdown();
    let row = format!("| {} | {} |", markdown_text(id), markdown_text(reason));
    assert!(markdown.contains("## Unsupported entries") && markdown.lines().any(|l| l == row));
}

#[test]
fn a_setup_the_target_makes_is_not_refused() {
    let entries = two_entries_the_first_impossible();
    assert_eq!(setup_refusal(&native(), &entries[1]).unwrap(), None);
    assert!(setup_refusal(&native(), &entries[0]).unwrap().is_some());
}
