//! `cargo bench --bench audit`: native trials per second on the seed domain at depth 3 and 4,
//! and the state-space search (`--strategy states`): distinct states, transitions, the depth
//! where the space closed or the bound it reached, and the time, on the seed domain to depth 5
//! and the wide domain to depth 3.
//!
//! Prints figures; asserts nothing (speed is measured here, never in a test). Pass
//! `--depth N` to measure one exhaustive depth only, `--threads N` to pin the thread count,
//! `--states-seed N` / `--states-wide N` for the bounds of the state-space searches (0: skip).

mod common;

use kvaudit::base::domain::Domain;
use kvaudit::engines::states::{run_states, StatesConfig};
use kvaudit::running::states::KeyScope;
use kvaudit::targets::registry::TargetSpec;

fn main() {
    let depths: Vec<u32> = match common::number_flag("--depth") {
        Some(d) => vec![d as u32],
        None => vec![3, 4],
    };
    let threads = common::threads();
    let spec = TargetSpec::new("native", &[]);
    println!("bench: native target, seed domain, {threads} thread(s)");
    for depth in depths {
        let report = common::seed_audit(&spec, depth, threads);
        println!(
            "depth {depth}: {:>9} trials in {:>6.2} s = {:>9.0} trials/s",
            report.trials, report.timing.elapsed_s, report.timing.trials_per_s
        );
    }
    for (preset, flag, bound) in [("seed", "--states-seed", 5), ("wide", "--states-wide", 3)] {
        let bound = common::number_flag(flag).map_or(bound, |d| d as u32);
        if bound > 0 {
            states(preset, bound, threads);
        }
    }
}

/// The state-space search of `preset` up to `bound`, with every oracle that does without the
/// logits probe (which a state search cannot key).
fn states(preset: &str, bound: u32, threads: usize) {
    let oracles = kvaudit::oracles::Registry::builtin().only(|o| !o.observes().logits);
    let factory = TargetSpec::new("native", &[])
        .with_observe(oracles.observe())
        .state_factory(KeyScope::Complete)
        .expect("native offers a state search");
    let cfg = StatesConfig {
        domain: Domain::preset(preset).expect("a preset"),
        depth: bound,
        threads,
        oracles,
    };
    let report = run_states(&cfg, factory.as_ref(), &mut |_| {}).expect("search runs");
    let sp = report
        .state_space
        .expect("a state search reports its space");
    println!(
        "states, {preset} domain: {:>9} distinct states, {:>9} transitions, {} at depth {} in {:>6.2} s = {:>9.0} transitions/s",
        sp.states,
        sp.transitions,
        if sp.closed { "closed" } else { "bound reached" },
        sp.depth,
        report.timing.elapsed_s,
        report.timing.trials_per_s
    );
}
