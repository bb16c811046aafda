//! The cross-engine measurement (issue 44): llama.cpp@0.1.161 and mlx-lm@0.32.2 run kvaudit's
//! tiny llama (one GGUF file) over a few traces (a prefill, decodes after it, a trim and a decode,
//! a copy, two sequences decoded together), each with F16 and F32 K/V; each sequence's
//! next-token logits after the trace (the logits probe's vector) are compared across the two.
//! It prints every figure (`$IT cross -- --nocapture`: how PREREG.md's cross-logits tolerances
//! were measured) and fails when one passes the `cross-logits` oracle's tolerance, or when
//! nothing could be compared.

use libtest_mimic::Trial;

use kvaudit::base::cache::Observe;
use kvaudit::base::op::{CacheType, Trace};
use kvaudit::oracles::cross_logits::tolerance;
use kvaudit::running::probe::logits_distance;
use kvaudit::targets::registry::TargetSpec;

const A: &str = "llama.cpp@0.1.161";
const B: &str = "mlx-lm@0.32.2";

/// The traces measured, as repro files write them (setup ops, then the trace's ops).
fn traces(kv: &str) -> Vec<(&'static str, Trace)> {
    let t = |setup_ops: serde_json::Value, ops: serde_json::Value| {
        serde_json::from_value::<Trace>(serde_json::json!({
            "setup": {"n_ctx": 64, "n_seq_max": 2, "type_k": kv, "type_v": kv, "ops": setup_ops},
            "ops": ops,
        }))
        .expect("a trace")
    };
    let d = |seq: i32, n: u32| serde_json::json!({"op": "decode", "seq": seq, "n": n});
    vec![
        (
            "prefill 8",
            t(serde_json::json!([]), serde_json::json!([d(0, 8)])),
        ),
        (
            "prefill 4, 4 decodes",
            t(
                serde_json::json!([d(0, 4)]),
                serde_json::json!([d(0, 1), d(0, 1), d(0, 1), d(0, 1)]),
            ),
        ),
        (
            "prefill 12, trim to 5, decode 2",
            t(
                serde_json::json!([d(0, 12)]),
                serde_json::json!([{"op": "seq_rm", "seq": 0, "p0": 5, "p1": -1}, d(0, 2)]),
            ),
        ),
        (
            "prefill 6, copy to seq 1, decode 3 into it",
            t(
                serde_json::json!([d(0, 6)]),
                serde_json::json!([{"op": "seq_cp", "src": 0, "dst": 1, "p0": -1, "p1": -1}, d(1, 3)]),
            ),
        ),
        (
            "two sequences prefilled together, decode 2 into seq 0",
            t(
                serde_json::json!([]),
                serde_json::json!([{"op": "decode", "seqs": [0, 1], "n": 5}, d(0, 2)]),
            ),
        ),
    ]
}

fn measure() -> Result<(), String> {
    let observe = Observe {
        logits: true,
        next_logits: true,
        ..Observe::BASIC
    };
    let runner = |name: &str| {
        let f = TargetSpec::new(name, &[])
            .with_observe(observe)
            .factory()
            .map_err(|e| format!("{name}: {e:#}"))?;
        f().map_err(|e| format!("{name}: {e}"))
    };
    let (mut ra, mut rb) = (runner(A)?, runner(B)?);
    let mut compared = 0;
    let mut problems = Vec::new();
    for kv in ["f16", "f32"] {
        let cache = if kv == "f16" {
            CacheType::F16
        } else {
            CacheType::F32
        };
        let tol = tolerance(kvaudit::base::config::MemoryType::Kv, cache)
            .ok_or("no cross-logits tolerance for a plain cache")?;
        let list = traces(kv);
        let only: Vec<Trace> = list.iter().map(|(_, t)| t.clone()).collect();
        let (runs_a, runs_b) = (
            ra.run_batch(&only).map_err(|e| e.to_string())?,
            rb.run_batch(&only).map_err(|e| e.to_string())?,
        );
        for (((what, _), x), y) in list.iter().zip(&runs_a).zip(&runs_b) {
            let last = |r: &kvaudit::running::runner::TrialRun| {
                r.steps
                    .last()
                    .and_then(|s| s.next_logits.clone())
                    .unwrap_or_default()
            };
            let (la, lb) = (last(x), last(y));
            for v in &la {
                let Some(w) = lb.iter().find(|w| w.seq == v.seq) else {
                    continue;
                };
                let d = logits_distance(&v.logits, &w.logits);
                if std::env::var_os("KVAUDIT_CROSS_DUMP").is_some() {
                    println!("A {what} {kv} {:?}\nB {what} {kv} {:?}", v.logits, w.logits);
                }
                println!(
                    "cross-logits {kv} {what}: seq {}: max |Δ| {d:.3e} (tolerance {tol:e})",
                    v.seq
                );
                compared += 1;
                if d > tol {
                    problems.push(format!("{kv} {what}: seq {}: {d:e} > {tol:e}", v.seq));
                }
            }
        }
    }
    if compared < 10 {
        problems.push(format!("only {compared} sequences compared"));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

pub fn trials() -> Vec<Trial> {
    vec![Trial::test(
        "cross::llama_cpp_vs_mlx_lm_next_token_logits",
        || super::outcome(measure()),
    )]
}
