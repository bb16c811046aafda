//! `cargo bench --bench fuzz`: the random and the guided generator on the same budget.
//!
//! For each target (the native model with the seed's `refcount` fault, and llama.cpp@0.1.156,
//! where the seed's I1 bug is real), each generator and each seed: the coverage reached after
//! `--cases N` cases (transitions and observation shapes, `engines::fuzz::coverage`), the wall
//! time, and the case and time of the first I1 violation (I1 alone is judged, so no other
//! oracle's shrinking is timed in). Prints figures, then the median over the seeds; asserts
//! nothing. Flags: `--cases N` (default 2000 on native, 300 on llama.cpp), `--seeds K` (seeds
//! 1..=K, default 5), `--only native|llama`, `--pin VERSION` (default 0.1.156).

mod common;

use std::time::Instant;

use kvaudit::engines::fuzz::{run_fuzz_with_queue, FuzzConfig, GenConfig, Generator};
use kvaudit::engines::shrink::ShrinkConfig;
use kvaudit::oracles::OracleId;
use kvaudit::targets::registry::TargetSpec;

/// What one run gave.
struct Figures {
    seconds: f64,
    transitions: u64,
    shapes: u64,
    /// Case and wall time of the first I1 violation.
    first_i1: Option<(u64, f64)>,
}

fn run(spec: &TargetSpec, generator: Generator, seed: u64, cases: u64) -> Figures {
    let factory = spec.factory().expect("target");
    let cfg = FuzzConfig {
        seed,
        cases: Some(cases),
        time: None,
        gen: GenConfig::default(),
        shrink: ShrinkConfig::default(),
        shrinks_per_signature: 1,
        oracles: Some(vec![OracleId::I1]),
        theorems: Vec::new(),
        generator,
        corpus: Vec::new(),
    };
    let start = Instant::now();
    let (report, _) =
        run_fuzz_with_queue(&cfg, factory.as_ref(), None, None, &mut |_| {}).expect("fuzz runs");
    let seconds = start.elapsed().as_secs_f64();
    let fz = report.fuzz.expect("a fuzz report");
    let last = fz.coverage.last().copied().unwrap_or_default();
    let first_i1 = report
        .findings
        .iter()
        .zip(&fz.findings)
        .filter(|(f, _)| f.oracle == OracleId::I1)
        .map(|(_, r)| (r.case, r.found_at_s))
        .min_by(|a, b| a.0.cmp(&b.0));
    Figures {
        seconds,
        transitions: last.transitions,
        shapes: last.shapes,
        first_i1,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn bench(spec: &TargetSpec, cases: u64, seeds: u64) {
    println!(
        "\n{}: {cases} cases per run, seeds 1..={seeds}, oracle I1",
        spec.name
    );
    println!("generator  seed  seconds  transitions  shapes  coverage  first I1 case  first I1 s");
    for generator in [Generator::Random, Generator::Guided] {
        let mut all = Vec::new();
        for seed in 1..=seeds {
            let f = run(spec, generator, seed, cases);
            let (case, at) = f.first_i1.map_or(("none".into(), "-".into()), |(c, s)| {
                (c.to_string(), format!("{s:.3}"))
            });
            println!(
                "{:<9} {seed:>5} {:>8.2} {:>12} {:>7} {:>9} {case:>14} {at:>11}",
                generator.name(),
                f.seconds,
                f.transitions,
                f.shapes,
                f.transitions + f.shapes
            );
            all.push(f);
        }
        let found: Vec<&Figures> = all.iter().filter(|f| f.first_i1.is_some()).collect();
        println!(
            "{:<9} median: coverage {:.0} (transitions {:.0}, shapes {:.0}) in {:.2} s; first I1 in {}/{} runs, median case {:.0}, median {:.3} s",
            generator.name(),
            median(all.iter().map(|f| (f.transitions + f.shapes) as f64).collect()),
            median(all.iter().map(|f| f.transitions as f64).collect()),
            median(all.iter().map(|f| f.shapes as f64).collect()),
            median(all.iter().map(|f| f.seconds).collect()),
            found.len(),
            all.len(),
            median(found.iter().map(|f| f.first_i1.unwrap().0 as f64).collect()),
            median(found.iter().map(|f| f.first_i1.unwrap().1).collect()),
        );
    }
}

fn main() {
    let only = common::flag("--only");
    let seeds = common::number_flag("--seeds").unwrap_or(5) as u64;
    let cases = common::number_flag("--cases").map(|n| n as u64);
    if only.as_deref().map_or(true, |o| o == "native") {
        let spec = TargetSpec::new("native", &["refcount".into()]);
        bench(&spec, cases.unwrap_or(2000), seeds);
    }
    if only.as_deref().map_or(true, |o| o == "llama") {
        let pin = common::flag("--pin").unwrap_or_else(|| "0.1.156".into());
        let spec = TargetSpec::new(&format!("llama.cpp@{pin}"), &[]);
        bench(&spec, cases.unwrap_or(300), seeds);
    }
}
