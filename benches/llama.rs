//! `cargo bench --bench llama`: llama.cpp trials/s on the depth-3 seed audit.
//!
//! Prints, for each built pin: (1) the real audit path (crash-isolated worker processes) with one
//! worker, whose figure is a worker's own throughput while the parent judges on another core,
//! then with one worker per core; (2) one in-process runner with fast resets (restore the state
//! saved after the setup); (3) a naive harness in the same process: a fresh context and a fresh
//! decode of the setup for every trial. All on the audit model
//! ([`kvaudit::model::tiny::TinyModelSpec::audit`]) unless `--model FILE` names another. Figures
//! only; asserts nothing. `--pin 0.1.161` picks one pin, `--trials N` caps the in-process runs
//! (default: all 117,649 depth-3 trials; fewer are spread evenly over them; the naive harness
//! gets the first 1,000); `--only audit|presets|restore|naive` runs one part (for profiling one
//! path). `presets` prints the depth-2 `server` preset audit's trials/s beside the `seed` one's.

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use kvaudit::base::domain::Domain;
use kvaudit::base::op::Trace;
use kvaudit::base::state::StateFormat;
use kvaudit::running::runner::LocalRunner;
use kvaudit::targets::llama::build::{ensure_built, BuildSpec};
use kvaudit::targets::llama::ffi::LlamaShim;
use kvaudit::targets::llama::pins::Pin;
use kvaudit::targets::llama::target::{LlamaTarget, ResetMode};
use kvaudit::targets::registry::TargetSpec;

/// `limit` depth-3 traces of the seed domain, spread evenly over all of them (every k-th in
/// enumeration order), so each op appears in every position about as often as in the audit.
fn depth3_traces(limit: usize) -> Vec<Trace> {
    let d = Domain::preset("seed").unwrap();
    let ops = d.ops();
    let n = ops.len();
    let total = n * n * n;
    let stride = (total / limit.max(1)).max(1);
    (0..total)
        .step_by(stride)
        .take(limit)
        .map(|i| Trace {
            setup: d.setup.clone(),
            ops: vec![
                ops[i / (n * n)].clone(),
                ops[i / n % n].clone(),
                ops[i % n].clone(),
            ],
        })
        .collect()
}

fn in_process(
    shim: &LlamaShim,
    model: &Path,
    label: &str,
    format: StateFormat,
    mode: ResetMode,
    traces: &[Trace],
) -> f64 {
    let mut runner = LocalRunner::new(Box::new(LlamaTarget::new(
        shim.clone(),
        model,
        label,
        format,
        mode,
    )));
    runner.run_last(&traces[0]).expect("warm-up");
    let t = Instant::now();
    for tr in traces {
        runner.run_last(tr).expect("trial");
    }
    traces.len() as f64 / t.elapsed().as_secs_f64()
}

/// The depth-3 seed audit through worker processes, as `kvaudit audit` runs it.
fn audit(label: &str, model: &Path, workers: usize) {
    let mut spec = TargetSpec::new(label, &[]);
    spec.model = Some(model.to_path_buf());
    let report = common::seed_audit(&spec, 3, workers);
    println!(
        "{label}: depth-3 seed audit, {workers} worker process(es): {} trials in {:.2} s = {:.0} trials/s ({:.0} per worker)",
        report.trials,
        report.timing.elapsed_s,
        report.timing.trials_per_s,
        report.timing.trials_per_s / workers as f64
    );
}

/// Depth-2 audits of the `seed` and `server` presets side by side, every oracle on (the server
/// preset's trials save, load and round-trip state: they cost more).
fn presets(label: &str, model: &Path, workers: usize) {
    let mut spec = TargetSpec::new(label, &[]);
    spec.model = Some(model.to_path_buf());
    for preset in ["seed", "server"] {
        let report = common::preset_audit(&spec, preset, 2, workers);
        println!(
            "{label}: depth-2 {preset} audit, {workers} worker process(es): {} trials in {:.2} s = {:.0} trials/s",
            report.trials, report.timing.elapsed_s, report.timing.trials_per_s
        );
    }
}

fn main() {
    let flag = common::flag;
    let pins: Vec<String> = match flag("--pin") {
        Some(p) => vec![p],
        None => vec!["0.1.156".into(), "0.1.161".into()],
    };
    let limit: usize = flag("--trials")
        .and_then(|v| v.parse().ok())
        .unwrap_or(49 * 49 * 49);
    let only = flag("--only");
    if let Some(o) = &only {
        assert!(
            ["audit", "presets", "restore", "naive"].contains(&o.as_str()),
            "--only takes audit, presets, restore or naive, not {o:?}"
        );
    }
    let runs = |part: &str| only.as_deref().is_none_or(|o| o == part);
    let model: PathBuf = match flag("--model") {
        Some(m) => PathBuf::from(m),
        None => kvaudit::model::tiny::try_audit_model_path().expect("audit model"),
    };
    println!("model: {}", model.display());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for version in pins {
        let label = format!("llama.cpp@{version}");
        let pin = Pin::parse(&label).expect("known pin");
        let info = pin.info().expect("pin info");
        let format: StateFormat = info.state_format();
        let built = ensure_built(&BuildSpec::new(pin), true).expect("pin builds");
        let shim = LlamaShim::load(&built.so_path).expect("shim loads");
        if runs("audit") {
            // One worker: its own throughput, the parent on another core. Then every core.
            audit(&label, &model, 1);
            if cores > 1 {
                audit(&label, &model, cores);
            }
        }
        if runs("presets") {
            presets(&label, &model, cores);
        }
        let traces = depth3_traces(limit);
        let fast = runs("restore").then(|| {
            let fast = in_process(&shim, &model, &label, format, ResetMode::Restore, &traces);
            println!(
                "{label}: in process, restore resets: {fast:.0} trials/s ({} trials)",
                traces.len()
            );
            fast
        });
        let naive = runs("naive").then(|| {
            let naive_traces = &traces[..traces.len().min(1000)];
            let naive = in_process(&shim, &model, &label, format, ResetMode::Fresh, naive_traces);
            println!("{label}: in process, naive (fresh context + decode per trial): {naive:.0} trials/s ({} trials)", naive_traces.len());
            naive
        });
        if let (Some(fast), Some(naive)) = (fast, naive) {
            println!("{label}: restore resets / naive = {:.1}x", fast / naive);
        }
    }
}
