//! What the benchmarks share: kvaudit's allocator, their flags, and the exhaustive seed-domain
//! audit they time.

// Each benchmark uses part of this.
#![allow(dead_code)]

use kvaudit::base::domain::Domain;
use kvaudit::engines::explore::{run_exhaustive, ExhaustiveConfig};
use kvaudit::records::report::{Report, Shard};
use kvaudit::targets::registry::TargetSpec;

// The same allocator as the `kvaudit` binary, so the figures are the tool's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The value after `--name` on the command line, if any.
pub fn flag(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// `--name N` as a number (absent or unparsable: `None`).
pub fn number_flag(name: &str) -> Option<usize> {
    flag(name).and_then(|v| v.parse().ok())
}

/// `--threads N`, else every core.
pub fn threads() -> usize {
    number_flag("--threads")
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The exhaustive audit of the seed domain to `depth` on `spec`, with `threads` runners.
pub fn seed_audit(spec: &TargetSpec, depth: u32, threads: usize) -> Report {
    preset_audit(spec, "seed", depth, threads)
}

/// The exhaustive audit of the preset domain `preset` to `depth` on `spec`, with `threads`
/// runners and every built-in oracle.
pub fn preset_audit(spec: &TargetSpec, preset: &str, depth: u32, threads: usize) -> Report {
    audit(
        spec,
        preset,
        depth,
        threads,
        kvaudit::oracles::Registry::builtin(),
        Shard::WHOLE,
    )
}

/// The exhaustive audit of `preset` to `depth` on `spec` (observing what it observes) with
/// `oracles`, `threads` runners, this `shard` of the work.
pub fn audit(
    spec: &TargetSpec,
    preset: &str,
    depth: u32,
    threads: usize,
    oracles: kvaudit::oracles::Registry,
    shard: Shard,
) -> Report {
    let factory = spec.factory().expect("target");
    let cfg = ExhaustiveConfig {
        domain: Domain::preset(preset).expect("a preset"),
        depth,
        shard,
        threads,
        batch: 2048,
        oracles,
    };
    run_exhaustive(&cfg, factory.as_ref(), None, &mut |_| {}).expect("audit runs")
}

/// The CPU seconds this process and its reaped children have used (user and system, from
/// `/proc/self/stat`, at the usual 100 ticks a second): on a machine shared with other jobs a
/// ratio of CPU times moves less than one of wall times. A worker's fork-server children are
/// counted once the worker is reaped (it reaps them), so measure around a whole audit.
pub fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (which may hold spaces) in its parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<f64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0.0))
        .collect();
    // utime, stime, cutime, cstime: fields 14-17 of the line, 12-15 after the name.
    fields
        .get(11..15)
        .map_or(0.0, |t| t.iter().sum::<f64>() / 100.0)
}
