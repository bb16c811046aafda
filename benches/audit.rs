//! `cargo bench --bench audit`: native trials per second on the seed domain at depth 3 and 4.
//!
//! Prints figures; asserts nothing (speed is measured here, never in a test). Pass
//! `--depth N` to measure one depth only, `--threads N` to pin the thread count.
//!
//! A second section prints `audit`'s estimate (its calibration) against the measured time of
//! the same run, as `kvaudit audit` runs it (the run's oracles, its observations, runners
//! started inside the measured time), on `--estimate-on LABEL` (default `native`; e.g.
//! `llama.cpp@0.1.161`).

mod common;

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use kvaudit::base::domain::Domain;
use kvaudit::engines::explore::{ExhaustiveConfig, Explorer, RunControl};
use kvaudit::records::report::Shard;
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
    estimate_vs_measured(&depths, threads);
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
