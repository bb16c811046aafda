//! `cargo bench --bench llama`: llama.cpp trials/s on the depth-3 seed audit.
//!
//! Prints, for each built pin: (1) the real audit path (crash-isolated worker processes, every
//! core), (2) one in-process runner with fast resets (restore the state saved after the setup),
//! (3) a naive harness in the same process: a fresh context and a fresh decode of the setup for
//! every trial. Figures only; asserts nothing. `--pin 0.1.161` picks one pin, `--trials N` caps the
//! in-process runs (default: the first 20,000 depth-3 trials; the naive harness gets 1,000).

use std::time::Instant;

use kvaudit::domain::Domain;
use kvaudit::explore::{run_exhaustive, ExhaustiveConfig};
use kvaudit::llama::build::{ensure_built, BuildSpec};
use kvaudit::llama::ffi::LlamaShim;
use kvaudit::llama::pins::Pin;
use kvaudit::llama::target::{LlamaTarget, ResetMode};
use kvaudit::op::Trace;
use kvaudit::registry::TargetSpec;
use kvaudit::report::Shard;
use kvaudit::runner::LocalRunner;
use kvaudit::state::StateFormat;

fn depth3_traces(limit: usize) -> Vec<Trace> {
    let d = Domain::preset("seed").unwrap();
    let ops = d.ops();
    let mut out = Vec::new();
    'outer: for a in &ops {
        for b in &ops {
            for c in &ops {
                out.push(Trace {
                    setup: d.setup.clone(),
                    ops: vec![a.clone(), b.clone(), c.clone()],
                });
                if out.len() == limit {
                    break 'outer;
                }
            }
        }
    }
    out
}

fn in_process(
    shim: &LlamaShim,
    label: &str,
    format: StateFormat,
    mode: ResetMode,
    traces: &[Trace],
) -> f64 {
    let model = kvaudit::model::tiny::try_default_model_path().expect("tiny model");
    let mut runner = LocalRunner::new(Box::new(LlamaTarget::new(
        shim.clone(),
        &model,
        label,
        format,
        mode,
    )));
    runner.run(&traces[0]).expect("warm-up");
    let t = Instant::now();
    for tr in traces {
        runner.run(tr).expect("trial");
    }
    traces.len() as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let pins: Vec<String> = match flag("--pin") {
        Some(p) => vec![p],
        None => vec!["0.1.156".into(), "0.1.161".into()],
    };
    let limit: usize = flag("--trials")
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    for version in pins {
        let label = format!("llama.cpp@{version}");
        let pin = Pin::parse(&label).expect("known pin");
        let info = pin.info().expect("pin info");
        let format = StateFormat {
            rot_fields: info.kv_state_has_n_rot,
        };
        let built = ensure_built(&BuildSpec::new(pin), true).expect("pin builds");
        let shim = LlamaShim::load(&built.so_path).expect("shim loads");

        let factory = TargetSpec::new(&label, &[]).factory().expect("target");
        let cfg = ExhaustiveConfig {
            domain: Domain::preset("seed").unwrap(),
            depth: 3,
            shard: Shard::WHOLE,
            threads,
            batch: 2048,
        };
        let report = run_exhaustive(&cfg, factory.as_ref(), None, &mut |_| {}).expect("audit");
        println!(
            "{label}: depth-3 seed audit, {threads} worker process(es): {} trials in {:.2} s = {:.0} trials/s ({:.0} per worker)",
            report.trials,
            report.timing.elapsed_s,
            report.timing.trials_per_s,
            report.timing.trials_per_s / threads as f64
        );
        let traces = depth3_traces(limit);
        let fast = in_process(&shim, &label, format, ResetMode::Restore, &traces);
        println!(
            "{label}: in process, restore resets: {fast:.0} trials/s ({} trials)",
            traces.len()
        );
        let naive_traces = &traces[..traces.len().min(1000)];
        let naive = in_process(&shim, &label, format, ResetMode::Fresh, naive_traces);
        println!("{label}: in process, naive (fresh context + decode per trial): {naive:.0} trials/s ({} trials)", naive_traces.len());
        println!("{label}: restore resets / naive = {:.1}x", fast / naive);
    }
}
