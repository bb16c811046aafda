//! `cargo bench --bench fuzz`: the random and the guided generator on the same budget.
//!
//! Three targets, each with the oracle it is judged by and a named class of finding (a corpus
//! file): the native model with the `refcount` fault (no code coverage: the guided generator's
//! signal is the abstract one) and llama.cpp@0.1.156+cov, both judged by I1, where the class is
//! `i1_seq_cp_twice_seq_rm_stale_max` (the seed's bug reached through a partial `seq_rm`); and
//! llama.cpp@0.1.161+cov judged by `round-trip-logits`, where the class is
//! `round_trip_logits_seq_div_pending_k_shift_not_saved` (a pending `seq_div` shift not saved).
//! For each generator and seed: the coverage (edges where the target records them, else
//! transitions and shapes), the wall time, the case and time of the first finding and of the
//! first finding of the class ([`kvaudit::engines::fuzz::compare`] says why both); then the mean
//! and the median over the seeds. Asserts nothing. Flags: `--cases N` (default 2000 on native,
//! 100 on llama.cpp), `--seeds K` (seeds 1..=K, default 5), `--only native|0.1.156|0.1.161`,
//! `--generator random|guided` (one of the two, while tuning one; the default runs both).

mod common;

use std::path::Path;
use std::time::Instant;

use kvaudit::base::cache::Observe;
use kvaudit::engines::fuzz::compare::{
    FindingClass, FirstFound, FirstSummary, GeneratorSummary, RunFigures,
};
use kvaudit::engines::fuzz::{run_fuzz_with_queue, FuzzConfig, GenConfig, Generator};
use kvaudit::engines::shrink::ShrinkConfig;
use kvaudit::oracles::{OracleId, Registry};
use kvaudit::outputs::repro::Repro;
use kvaudit::targets::registry::TargetSpec;

/// One target of the bench.
struct Bench {
    /// What `--only` names it by.
    key: &'static str,
    target: &'static str,
    faults: &'static [&'static str],
    /// The oracle judged (its name).
    oracle: &'static str,
    /// The corpus file of the class.
    class: &'static str,
    cases: u64,
}

const BENCHES: [Bench; 3] = [
    Bench {
        key: "native",
        target: "native",
        faults: &["refcount"],
        oracle: "I1",
        class: "i1_seq_cp_twice_seq_rm_stale_max",
        cases: 2000,
    },
    Bench {
        key: "0.1.156",
        target: "llama.cpp@0.1.156+cov",
        faults: &[],
        oracle: "I1",
        class: "i1_seq_cp_twice_seq_rm_stale_max",
        cases: 100,
    },
    Bench {
        key: "0.1.161",
        target: "llama.cpp@0.1.161+cov",
        faults: &[],
        oracle: "round-trip-logits",
        class: "round_trip_logits_seq_div_pending_k_shift_not_saved",
        cases: 100,
    },
];

fn class_of(file: &str) -> FindingClass {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpora")
        .join(format!("{file}.json"));
    let r = Repro::load(&path).expect("the class's corpus file");
    FindingClass {
        oracle: r.oracle,
        kind: r.kind,
        op: r.trace.ops[r.step - 1].name().to_string(),
    }
}

fn run(
    spec: &TargetSpec,
    b: &Bench,
    class: &FindingClass,
    generator: Generator,
    seed: u64,
    cases: u64,
) -> RunFigures {
    let oracle = OracleId::known(b.oracle).expect("a known oracle");
    // What the oracle reads (the logits probe, the reload into a twin), as `kvaudit fuzz` asks.
    let observe = Registry::builtin()
        .get(oracle)
        .map_or(Observe::ALL, |o| Observe::ALL.union(o.observes()));
    let factory = spec
        .clone()
        .with_observe(observe)
        .factory()
        .expect("target");
    let cfg = FuzzConfig {
        seed,
        cases: Some(cases),
        time: None,
        gen: GenConfig::default(),
        shrink: ShrinkConfig::default(),
        shrinks_per_signature: 1,
        oracles: Some(vec![oracle]),
        theorems: Vec::new(),
        generator,
        corpus: Vec::new(),
    };
    let start = Instant::now();
    let (report, _) =
        run_fuzz_with_queue(&cfg, factory.as_ref(), None, None, &mut |_| {}).expect("fuzz runs");
    RunFigures::of(&report, start.elapsed().as_secs_f64(), class)
}

fn first(f: Option<FirstFound>) -> String {
    f.map_or("       none        -".into(), |f| {
        format!("{:>11} {:>8.3}", f.case, f.seconds)
    })
}

fn summary(label: &str, s: &FirstSummary) -> String {
    format!(
        "{label} in {}/{} runs: case mean {:.1}, median {:.0}; seconds mean {:.3}, median {:.3}",
        s.found, s.runs, s.case.mean, s.case.median, s.seconds.mean, s.seconds.median
    )
}

fn bench(b: &Bench, cases: u64, seeds: u64, generators: &[Generator]) {
    let faults: Vec<String> = b.faults.iter().map(|f| f.to_string()).collect();
    let spec = TargetSpec::new(b.target, &faults);
    let class = class_of(b.class);
    let inject = faults
        .iter()
        .map(|f| format!(" --inject {f}"))
        .collect::<String>();
    println!(
        "\n{}{inject}: {cases} cases per run, seeds 1..={seeds}, oracle {}; class {} ({}, \"{}\" at {})",
        b.target, b.oracle, b.class, class.oracle, class.kind, class.op
    );
    println!(
        "generator  seed  seconds  transitions  shapes     pcs   edges  coverage  findings  first case  first s  class case  class s"
    );
    for &generator in generators {
        let mut all = Vec::new();
        for seed in 1..=seeds {
            let f = run(&spec, b, &class, generator, seed, cases);
            println!(
                "{:<9} {seed:>5} {:>8.2} {:>12} {:>7} {:>7} {:>7} {:>9} {:>9} {} {}",
                generator.name(),
                f.seconds,
                f.transitions,
                f.shapes,
                f.pcs,
                f.edges,
                f.coverage(),
                f.findings,
                first(f.first),
                first(f.first_of_class),
            );
            all.push(f);
        }
        let s = GeneratorSummary::of(&all);
        let signal = if all.iter().any(|f| f.pcs > 0) {
            "edges"
        } else {
            "transitions + shapes"
        };
        println!(
            "{:<9} coverage ({signal}) mean {:.1}, median {:.0}; seconds per run mean {:.2}, median {:.2}",
            generator.name(),
            s.coverage.mean,
            s.coverage.median,
            s.seconds.mean,
            s.seconds.median,
        );
        println!(
            "{:<9} {}",
            generator.name(),
            summary("first finding", &s.first)
        );
        println!(
            "{:<9} {}",
            generator.name(),
            summary("first of the class", &s.first_of_class)
        );
    }
    println!("(a run that did not find it counts at its budget: its cases and its seconds)");
}

fn main() {
    let only = common::flag("--only");
    let seeds = common::number_flag("--seeds").unwrap_or(5) as u64;
    let cases = common::number_flag("--cases").map(|n| n as u64);
    let generators = match common::flag("--generator") {
        Some(name) => vec![Generator::from_name(&name).expect("--generator random|guided")],
        None => vec![Generator::Random, Generator::Guided],
    };
    for b in &BENCHES {
        if only.as_deref().map_or(true, |o| o == b.key) {
            bench(b, cases.unwrap_or(b.cases), seeds, &generators);
        }
    }
}
