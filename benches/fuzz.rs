//! `cargo bench --bench fuzz`: the random and the guided generator on the same budget.
//!
//! For each target (the native model with the seed's `refcount` fault, and llama.cpp@0.1.156+cov,
//! where the seed's I1 bug is real and the memory code records what it reaches), each generator
//! and each seed: the coverage reached after `--cases N` cases (transitions and observation
//! shapes, `engines::fuzz::coverage`; on the `+cov` build also the PCs and edges of llama.cpp's
//! memory code, the guided generator's signal there), the wall time, and the case and time of
//! the first I1 violation (I1 alone is judged, so no other oracle's shrinking is timed in).
//! Prints figures, then the mean and median over the seeds; asserts nothing. Flags: `--cases N`
//! (default 2000 on native, 300 on llama.cpp), `--seeds K` (seeds 1..=K, default 5),
//! `--only native|llama`, `--pin VERSION` (default `0.1.156+cov`).

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
    /// PCs and edges of the target's memory code (a `+cov` build; 0 elsewhere).
    pcs: u64,
    edges: u64,
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
        pcs: last.pcs,
        edges: last.edges,
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

fn mean(v: Vec<f64>) -> f64 {
    if v.is_empty() {
        f64::NAN
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn bench(spec: &TargetSpec, cases: u64, seeds: u64) {
    println!(
        "\n{}: {cases} cases per run, seeds 1..={seeds}, oracle I1",
        spec.name
    );
    println!("generator  seed  seconds  transitions  shapes  coverage     pcs   edges  first I1 case  first I1 s");
    for generator in [Generator::Random, Generator::Guided] {
        let mut all = Vec::new();
        for seed in 1..=seeds {
            let f = run(spec, generator, seed, cases);
            let (case, at) = f.first_i1.map_or(("none".into(), "-".into()), |(c, s)| {
                (c.to_string(), format!("{s:.3}"))
            });
            println!(
                "{:<9} {seed:>5} {:>8.2} {:>12} {:>7} {:>9} {:>7} {:>7} {case:>14} {at:>11}",
                generator.name(),
                f.seconds,
                f.transitions,
                f.shapes,
                f.transitions + f.shapes,
                f.pcs,
                f.edges,
            );
            all.push(f);
        }
        let found: Vec<&Figures> = all.iter().filter(|f| f.first_i1.is_some()).collect();
        let of = |g: &dyn Fn(&Figures) -> f64| all.iter().map(g).collect::<Vec<f64>>();
        let first_case = found
            .iter()
            .map(|f| f.first_i1.unwrap().0 as f64)
            .collect::<Vec<_>>();
        let first_s = found
            .iter()
            .map(|f| f.first_i1.unwrap().1)
            .collect::<Vec<_>>();
        println!(
            "{:<9} mean: coverage {:.1} (transitions {:.1}, shapes {:.1}), pcs {:.1}, edges {:.1} in {:.2} s; first I1 in {}/{} runs, mean case {:.1}, mean {:.3} s",
            generator.name(),
            mean(of(&|f| (f.transitions + f.shapes) as f64)),
            mean(of(&|f| f.transitions as f64)),
            mean(of(&|f| f.shapes as f64)),
            mean(of(&|f| f.pcs as f64)),
            mean(of(&|f| f.edges as f64)),
            mean(of(&|f| f.seconds)),
            found.len(),
            all.len(),
            mean(first_case.clone()),
            mean(first_s.clone()),
        );
        println!(
            "{:<9} median: coverage {:.0}, pcs {:.0}, edges {:.0} in {:.2} s; median first I1 case {:.0}, {:.3} s",
            generator.name(),
            median(of(&|f| (f.transitions + f.shapes) as f64)),
            median(of(&|f| f.pcs as f64)),
            median(of(&|f| f.edges as f64)),
            median(of(&|f| f.seconds)),
            median(first_case),
            median(first_s),
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
        let pin = common::flag("--pin").unwrap_or_else(|| "0.1.156+cov".into());
        let spec = TargetSpec::new(&format!("llama.cpp@{pin}"), &[]);
        bench(&spec, cases.unwrap_or(300), seeds);
    }
}
