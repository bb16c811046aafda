//! `cargo bench --bench audit`: native trials per second on the seed domain at depth 3 and 4,
//! the audit with the default oracles against `--oracles I1,I2,crash` at each depth (their
//! ratio), and the state-space search (`--strategy states`): distinct states, transitions, the depth
//! where the space closed or the bound it reached, and the time, on the seed domain to depth 5
//! and the wide domain to depth 3.
//!
//! Prints figures; asserts nothing (speed is measured here, never in a test). Pass
//! `--depth N` to measure one exhaustive depth only, `--threads N` to pin the thread count,
//! `--states-seed N` / `--states-wide N` for the bounds of the state-space searches (0: skip).
//!
//! A last section prints `audit`'s estimate (its calibration) against the measured time of
//! the same run, as `kvaudit audit` runs it (the run's oracles, its observations, runners
//! started inside the measured time), on `--estimate-on LABEL` (default `native`; e.g.
//! `llama.cpp@0.1.161`).

mod common;

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use kvaudit::base::domain::Domain;
use kvaudit::engines::explore::{ExhaustiveConfig, Explorer, RunControl};
use kvaudit::engines::state_space::{run_states, StatesConfig};
use kvaudit::records::report::Shard;
use kvaudit::running::state_runner::KeyScope;
use kvaudit::targets::registry::TargetSpec;

fn main() {
    let depths: Vec<u32> = match common::number_flag("--depth") {
        Some(d) => vec![d as u32],
        None => vec![3, 4],
    };
    let threads = common::threads();
    let spec = TargetSpec::new("native", &[]);
    println!("bench: native target, seed domain, {threads} thread(s)");
    for &depth in &depths {
        let report = common::seed_audit(&spec, depth, threads);
        println!(
            "depth {depth}: {:>9} trials in {:>6.2} s = {:>9.0} trials/s",
            report.trials, report.timing.elapsed_s, report.timing.trials_per_s
        );
    }
    for &depth in &depths {
        default_vs_basic(depth, threads);
    }
    for (preset, flag, bound) in [("seed", "--states-seed", 5), ("wide", "--states-wide", 3)] {
        let bound = common::number_flag(flag).map_or(bound, |d| d as u32);
        if bound > 0 {
            states(preset, bound, threads);
        }
    }
    estimate_vs_measured(&depths, threads);
}

/// `kvaudit audit --target native --domain seed --depth N` with the default oracles (no
/// `--oracles`) against the same audit with `--oracles I1,I2,crash`, each observing what its
/// oracles read, and their ratio (issue 26: within 2x).
fn default_vs_basic(depth: u32, threads: usize) {
    let defaults = kvaudit::oracles::Registry::for_run(false).only(|o| !o.costly());
    let basic = kvaudit::oracles::Registry::builtin()
        .only(|o| ["I1", "I2", "crash"].contains(&o.id().name()));
    // (wall, CPU) seconds.
    let seconds = |oracles: kvaudit::oracles::Registry| {
        let spec = TargetSpec::new("native", &[]).with_observe(oracles.observe());
        let cpu = common::cpu_seconds();
        let report = common::audit(&spec, "seed", depth, threads, oracles, Shard::WHOLE);
        (report.timing.elapsed_s, common::cpu_seconds() - cpu)
    };
    let (b, bc) = seconds(basic);
    let (d, dc) = seconds(defaults);
    println!(
        "depth {depth}: default oracles {d:>6.2} s, --oracles I1,I2,crash {b:>6.2} s: ratio {:.2}; CPU {dc:.2} s and {bc:.2} s: ratio {:.2}",
        d / b,
        dc / bc
    );
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

/// The estimate `kvaudit audit` prints before a seed-domain run, against the run's measured
/// time (from the runners' start to the report), at each depth.
fn estimate_vs_measured(depths: &[u32], threads: usize) {
    let label = common::flag("--estimate-on").unwrap_or_else(|| "native".into());
    let oracles = kvaudit::oracles::Registry::for_run(false).only(|o| !o.costly());
    let spec = TargetSpec::new(&label, &[]).with_observe(oracles.observe());
    let factory = spec.factory().expect("target");
    println!("estimate vs measured: {label}, seed domain, {threads} thread(s)");
    for &depth in depths {
        let cfg = ExhaustiveConfig {
            domain: Domain::preset("seed").expect("a preset"),
            depth,
            shard: Shard::WHOLE,
            threads,
            batch: 2048,
            oracles: oracles.clone(),
        };
        let stop = AtomicBool::new(false);
        let clock = Instant::now();
        let mut explorer = Explorer::new(&cfg, factory.as_ref(), None).expect("runners start");
        let estimate = explorer.estimate(None, &stop).expect("calibration runs");
        explorer
            .run(&RunControl::new(&stop), &mut |_| {})
            .expect("audit runs");
        let measured = clock.elapsed().as_secs_f64();
        match estimate.seconds {
            Some(e) => println!(
                "depth {depth}: estimate {e:>7.2} s (calibrated on {} trials), measured {measured:>7.2} s, ratio {:.2}",
                estimate.calibrated_on,
                e / measured
            ),
            None => println!("depth {depth}: not calibrated (small run), measured {measured:.2} s"),
        }
    }
}
