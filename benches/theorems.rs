//! `cargo bench --bench theorems`: the native target in tensor mode (`native+tensors`: the cell
//! cache with K/V rows, filled by the tiny model's forward pass).
//!
//! Prints figures; asserts nothing. Two kinds:
//! - exhaustive-audit trials/s on the seed domain (I1, I2 on the tensor target: the cost of
//!   carrying and serializing rows and running the model on every decode), at `--depth N`
//!   (default 2 and 3), with `--threads N`;
//! - theorem checks/s, each on a fresh trace: T1 placement (7-token prefill + 4 decodes, every
//!   row compared after every op), T2 never-saw pair (both traces, rows, 9-step continuation), T3
//!   prefix pair.

use std::time::{Duration, Instant};

mod common;

use kvaudit::base::op::Trace;
use kvaudit::oracles::theorems::{check_pair, t1, t2, t3, TheoremJudgement, Tolerance};
use kvaudit::targets::native_tensor::NativeTensorTarget;
use kvaudit::targets::registry::TargetSpec;

fn trace(json: &str) -> Trace {
    serde_json::from_str(json).expect("bench trace")
}

/// Runs `check` for about a second; checks per second.
fn rate(mut check: impl FnMut() -> TheoremJudgement) -> f64 {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(1) {
        match check() {
            TheoremJudgement::Judged(v) => assert!(v.holds, "{v}"),
            TheoremJudgement::Unsupported { reason } => panic!("unsupported: {reason}"),
        }
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let depths: Vec<u32> = match common::number_flag("--depth") {
        Some(d) => vec![d as u32],
        None => vec![2, 3],
    };
    let threads = common::threads();
    let spec = TargetSpec::new("native+tensors", &[]);
    println!("bench: native+tensors target, seed domain, {threads} thread(s)");
    for depth in depths {
        let report = common::seed_audit(&spec, depth, threads);
        println!(
            "audit depth {depth}: {:>9} trials in {:>6.2} s = {:>9.0} trials/s",
            report.trials, report.timing.elapsed_s, report.timing.trials_per_s
        );
    }

    let model = NativeTensorTarget::default_model(None).expect("tiny model");
    let mut target = NativeTensorTarget::new(model.clone(), Default::default());
    let hd = model.hparams().head_dim;
    let exact = Tolerance::EXACT;
    let placement = trace(
        r#"{"setup":{},"ops":[{"op":"decode","seq":0,"n":7,"tokens":[1,17,42,5,63,8,30]},
        {"op":"decode","seq":0,"n":1,"tokens":[61]},{"op":"decode","seq":0,"n":1,"tokens":[20]},
        {"op":"decode","seq":0,"n":1,"tokens":[18]},{"op":"decode","seq":0,"n":1,"tokens":[33]}]}"#,
    );
    let r = rate(|| t1::check_placement(&mut target, &placement, &model, exact).unwrap());
    println!("T1 placement (prefill 7 + 4 decodes): {r:>8.0} checks/s");
    let sibling = trace(
        r#"{"setup":{"n_seq_max":2},"ops":[
        {"op":"decode","seq":0,"n":4,"tokens":[1,17,42,5]},{"op":"decode","seq":0,"n":3,"tokens":[63,8,30]},
        {"op":"seq_add","seq":0,"p0":4,"p1":-1,"delta":3},{"op":"seq_cp","src":0,"dst":1,"p0":0,"p1":4},
        {"op":"decode","seq":1,"n":3,"tokens":[9,21,33]},{"op":"seq_cp","src":1,"dst":0,"p0":4,"p1":7},
        {"op":"seq_rm","seq":0,"p0":4,"p1":7},{"op":"seq_add","seq":0,"p0":7,"p1":-1,"delta":-3}]}"#,
    );
    let pair = t2::never_saw_pair(&sibling).expect("never-saw partner");
    let r = rate(|| check_pair(&mut target, &pair, exact, hd).unwrap());
    println!("T2 never-saw pair (derived partner):  {r:>8.0} checks/s");
    let prefix = trace(
        r#"{"setup":{"n_seq_max":2},"ops":[{"op":"decode","seq":0,"n":4,"tokens":[1,17,42,5]},
        {"op":"seq_cp","src":0,"dst":1,"p0":0,"p1":-1},{"op":"decode","seq":1,"n":3,"tokens":[63,8,30]}]}"#,
    );
    let pair = t3::prefix_pair(&prefix).expect("prefix partner");
    let r = rate(|| check_pair(&mut target, &pair, exact, hd).unwrap());
    println!("T3 prefix pair (derived partner):     {r:>8.0} checks/s");
}
