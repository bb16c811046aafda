//! `cargo bench --bench audit`: native trials per second on the seed domain at depth 3 and 4.
//!
//! Prints figures; asserts nothing (speed is measured here, never in a test). Pass
//! `--depth N` to measure one depth only, `--threads N` to pin the thread count.

use kvaudit::domain::Domain;
use kvaudit::explore::{run_exhaustive, ExhaustiveConfig};
use kvaudit::registry::TargetSpec;
use kvaudit::report::Shard;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<usize>().ok())
    };
    let depths: Vec<u32> = match flag("--depth") {
        Some(d) => vec![d as u32],
        None => vec![3, 4],
    };
    let threads = flag("--threads")
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let factory = TargetSpec::new("native", &[])
        .factory()
        .expect("native target");
    println!("bench: native target, seed domain, {threads} thread(s)");
    for depth in depths {
        let cfg = ExhaustiveConfig {
            domain: Domain::preset("seed").unwrap(),
            depth,
            shard: Shard::WHOLE,
            threads,
            batch: 2048,
        };
        let report = run_exhaustive(&cfg, factory.as_ref(), None, &mut |_| {}).expect("audit runs");
        println!(
            "depth {depth}: {:>9} trials in {:>6.2} s = {:>9.0} trials/s",
            report.trials, report.timing.elapsed_s, report.timing.trials_per_s
        );
    }
}
