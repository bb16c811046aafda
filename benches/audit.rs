//! `cargo bench --bench audit`: native trials per second on the seed domain at depth 3 and 4.
//!
//! Prints figures; asserts nothing (speed is measured here, never in a test). Pass
//! `--depth N` to measure one depth only, `--threads N` to pin the thread count.

mod common;

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
}
