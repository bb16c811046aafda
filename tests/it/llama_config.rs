//! Configurations and state on real llama.cpp builds (issue 10), measured: which sequence ids each
//! KV mode accepts, decodes that do not fit or are split, which cache types make a context, what
//! a damaged state load returns and leaves behind, and what a whole-context dump lists.
//!
//! `llama_config::measure` (ignored: it prints, it asserts nothing) runs every probe on both
//! release pins, each probe in a child process (this test binary again, running the ignored
//! `llama_config::probe` with the probe in `KVAUDIT_PROBE`), since some probes abort inside
//! llama.cpp by design. docs/llama-cpp.md "Configurations and state (measured)" quotes the output:
//!
//! ```text
//! cargo test --test it -- --ignored --nocapture llama_config::measure
//! ```

use std::process::Command;

use libtest_mimic::Trial;

use kvaudit::base::op::CacheType;
use kvaudit::base::op::{Op, Setup, Trace};
use kvaudit::base::state::{parse_seq_state, parse_whole_state, StateFormat};
use kvaudit::running::runner::{TrialEnd, TrialRunner};
use kvaudit::targets::llama::context_params;
use kvaudit::targets::llama::ffi::{LlamaContext, LlamaShim};
use kvaudit::targets::llama::target::ResetMode;
use kvaudit::targets::llama::worker::WorkerRunner;
use kvaudit::targets::registry::llama_worker_spec;

const PINS: [&str; 2] = ["llama.cpp@0.1.156", "llama.cpp@0.1.161"];

pub fn trials() -> Vec<Trial> {
    vec![
        Trial::test("llama_config::alternating_configurations", || {
            super::outcome(alternating_configurations())
        }),
        Trial::test("llama_config::measure", || super::outcome(measure())).with_ignored_flag(true),
        Trial::test("llama_config::probe", || super::outcome(probe_child()))
            .with_ignored_flag(true),
    ]
}

/// Every probe, by name: `MODE/what` with MODE `u` (kv_unified) or `s` (one stream per sequence).
fn probes() -> Vec<String> {
    let mut v = Vec::new();
    for mode in ["u", "s"] {
        for s in [3, 4, 255, 256] {
            for what in [
                "decode", "rm", "cp", "keep", "add", "pos_min", "pos_max", "seq_get", "seq_set",
            ] {
                v.push(format!("{mode}/{what}/{s}"));
            }
        }
        v.push(format!("{mode}/whole_lists/4"));
        v.push(format!("{mode}/nofit/300"));
        v.push(format!("{mode}/nofit_second/200"));
        v.push(format!("{mode}/ubatch/10"));
        v.push(format!("{mode}/batch/10"));
        for cfg in [
            "fa_f16",
            "fa_q8_0",
            "fa_q4_0",
            "nofa_k_q8_0",
            "nofa_v_q8_0",
            "nofa_f32",
        ] {
            v.push(format!("{mode}/create/{cfg}"));
        }
        for dmg in [
            "trunc_0",
            "trunc_8",
            "trunc_20",
            "trunc_last",
            "flip_0",
            "flip_4",
            "flip_8",
            "flip_12",
        ] {
            v.push(format!("{mode}/damaged/{dmg}"));
        }
    }
    v
}

/// One batch whose traces alternate between configurations (unified, one stream per sequence,
/// and one llama.cpp refuses) observes the same with fast resets as with rebuilt ones, and every
/// trace of the refused configuration is an unsupported trial.
fn alternating_configurations() -> Result<(), String> {
    let setup = |config: &str| -> Result<Setup, String> {
        let mut s = Setup::default()
            .with_config(config)
            .map_err(|e| e.to_string())?;
        s.n_seq_max = 2;
        s.ops = vec![op(r#"{"op":"decode","seq":0,"n":4}"#)?];
        Ok(s)
    };
    let configs = [
        setup("kv_unified=true")?,
        setup("kv_unified=false")?,
        setup("type_v=q8_0")?,
    ];
    let ops = [
        r#"{"op":"state_seq_save","seq":0,"slot":"a"}"#,
        r#"{"op":"state_seq_load","seq":1,"slot":"a"}"#,
        r#"{"op":"seq_rm","seq":0,"p0":1,"p1":-1}"#,
    ]
    .iter()
    .map(|j| op(j))
    .collect::<Result<Vec<_>, _>>()?;
    let mut traces = Vec::new();
    for round in 0..3 {
        for s in &configs {
            traces.push(Trace {
                setup: s.clone(),
                ops: ops[..=round % ops.len()].to_vec(),
            });
        }
    }
    let spec = llama_worker_spec("llama.cpp@0.1.161", None)?;
    let mut slow_spec = spec.clone();
    slow_spec.reset = ResetMode::Rebuild;
    let fast = WorkerRunner::new(spec)
        .map_err(|e| e.to_string())?
        .run_batch(&traces)
        .map_err(|e| e.to_string())?;
    let slow = WorkerRunner::new(slow_spec)
        .map_err(|e| e.to_string())?
        .run_batch(&traces)
        .map_err(|e| e.to_string())?;
    for (i, ((t, f), s)) in traces.iter().zip(&fast).zip(&slow).enumerate() {
        if f != s {
            return Err(format!("trace {i}: restore {f:?}, rebuild {s:?}"));
        }
        let refused = t.setup.type_v != Default::default();
        match (&f.end, refused) {
            (TrialEnd::Unsupported { step: 0, .. }, true) | (TrialEnd::Completed, false) => {}
            (end, _) => return Err(format!("trace {i} ({:?}): ended {end:?}", t.setup)),
        }
    }
    Ok(())
}

fn op(json: &str) -> Result<Op, String> {
    serde_json::from_str(json).map_err(|e| format!("{json}: {e}"))
}

fn measure() -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    for pin in PINS {
        // Build (or find) the pin here, once, not in every child.
        llama_worker_spec(pin, None)?;
        println!("## {pin}");
        for probe in probes() {
            let out = Command::new(&exe)
                .args(["--ignored", "--exact", "llama_config::probe", "--nocapture"])
                .env("KVAUDIT_PROBE", format!("{pin}|{probe}"))
                .env("GGML_NO_BACKTRACE", "1")
                .output()
                .map_err(|e| e.to_string())?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let result: Vec<&str> = stdout
                .lines()
                .filter_map(|l| l.strip_prefix("PROBE: "))
                .collect();
            let mut tail = result.join("; ");
            if !out.status.success() {
                let assert = stderr
                    .lines()
                    .find(|l| l.contains("GGML_ASSERT") || l.contains("Assertion"))
                    .map_or("", |l| l.rsplit(": ").next().unwrap_or(l));
                tail.push_str(&format!(" ABORT ({}) {}", out.status, assert.trim()));
            }
            println!("{probe}: {tail}");
        }
    }
    Ok(())
}

struct Probe {
    shim: LlamaShim,
    model: std::path::PathBuf,
    format: StateFormat,
    unified: bool,
}

impl Probe {
    fn params(&self) -> Setup {
        Setup {
            n_ctx: 256,
            n_seq_max: 4,
            kv_unified: self.unified,
            flash_attn: false,
            ..Setup::default()
        }
    }

    fn open(&self, setup: &Setup) -> Result<LlamaContext, String> {
        self.shim
            .open(&self.model, &context_params(setup.settings()))
            .map_err(|e| format!("{e:#}"))
    }

    /// The cells of `seq` in its own dump.
    fn cells(&self, c: &mut LlamaContext, seq: i32) -> Result<Vec<i32>, String> {
        let bytes = c.state_seq_get(seq).map_err(|e| format!("{e:#}"))?;
        let parsed = parse_seq_state(&bytes, self.format).map_err(|e| e.to_string())?;
        Ok(parsed.resident_positions())
    }

    fn describe(&self, c: &mut LlamaContext, seq: i32) -> Result<String, String> {
        let mn = c.seq_pos_min(seq).map_err(|e| format!("{e:#}"))?;
        let mx = c.seq_pos_max(seq).map_err(|e| format!("{e:#}"))?;
        Ok(format!(
            "seq {seq} [{mn},{mx}] cells {:?}",
            self.cells(c, seq)?
        ))
    }
}

fn say(s: impl std::fmt::Display) {
    println!("PROBE: {}", s.to_string().replace('\n', " "));
}

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

fn probe_child() -> Result<(), String> {
    let Ok(what) = std::env::var("KVAUDIT_PROBE") else {
        return Ok(());
    };
    let (pin, probe) = what.split_once('|').ok_or("KVAUDIT_PROBE: PIN|PROBE")?;
    let spec = llama_worker_spec(pin, None)?;
    let shim = LlamaShim::load(&spec.shim).map_err(e)?;
    let mut parts = probe.split('/');
    let (mode, kind, arg) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
    );
    let p = Probe {
        shim,
        model: spec.model.clone(),
        format: spec.format,
        unified: mode == "u",
    };
    let params = p.params();
    let n: i32 = arg.parse().unwrap_or(0);
    match kind {
        "create" => {
            let mut q = params.clone();
            let (fa, k, v) = match arg {
                "fa_f16" => (true, CacheType::F16, CacheType::F16),
                "fa_q8_0" => (true, CacheType::Q8_0, CacheType::Q8_0),
                "fa_q4_0" => (true, CacheType::Q4_0, CacheType::Q4_0),
                "nofa_k_q8_0" => (false, CacheType::Q8_0, CacheType::F16),
                "nofa_v_q8_0" => (false, CacheType::F16, CacheType::Q8_0),
                _ => (false, CacheType::F32, CacheType::F32),
            };
            q.flash_attn = fa;
            q.type_k = k;
            q.type_v = v;
            match p.open(&q) {
                Ok(mut c) => {
                    let rc = c.decode(&[1, 2, 3], None, &[&[0], &[0], &[0]]).map_err(e)?;
                    say(format!(
                        "created; decode 3 -> {rc}; {}",
                        p.describe(&mut c, 0)?
                    ));
                }
                Err(m) => say(format!("refused: {m}")),
            }
        }
        "nofit" => {
            let mut c = p.open(&params)?;
            say(format!(
                "n_ctx {} n_batch {} n_ubatch {}",
                c.n_ctx().map_err(e)?,
                c.n_batch().map_err(e)?,
                c.n_ubatch().map_err(e)?
            ));
            let toks: Vec<i32> = (0..n).map(|i| i % 60).collect();
            let seqs: Vec<&[i32]> = toks.iter().map(|_| &[0][..]).collect();
            let rc = c.decode(&toks, None, &seqs).map_err(e)?;
            say(format!(
                "decode {n} -> {rc} ({}); {}",
                c.last_error(),
                p.describe(&mut c, 0)?
            ));
        }
        "nofit_second" => {
            let mut c = p.open(&params)?;
            let toks: Vec<i32> = (0..n).map(|i| i % 60).collect();
            let seqs: Vec<&[i32]> = toks.iter().map(|_| &[0][..]).collect();
            let rc = c.decode(&toks, None, &seqs).map_err(e)?;
            let toks2: Vec<i32> = (0..100).map(|i| i % 60).collect();
            let seqs2: Vec<&[i32]> = toks2.iter().map(|_| &[1][..]).collect();
            let rc2 = c.decode(&toks2, None, &seqs2).map_err(e)?;
            let err = c.last_error();
            let s0 = p.describe(&mut c, 0)?;
            let s1 = p.describe(&mut c, 1)?;
            say(format!(
                "decode {n} into 0 -> {rc}; then 100 into 1 -> {rc2} ({err}); seq 0 {} cells; {s1}",
                s0.matches(',').count()
            ));
        }
        "ubatch" | "batch" => {
            let mut q = params.clone();
            if kind == "ubatch" {
                q.n_ubatch = Some(4);
            } else {
                q.n_batch = Some(4);
            }
            let mut c = p.open(&q)?;
            say(format!(
                "n_batch {} n_ubatch {}",
                c.n_batch().map_err(e)?,
                c.n_ubatch().map_err(e)?
            ));
            let toks: Vec<i32> = (0..n).collect();
            let seqs: Vec<&[i32]> = toks.iter().map(|_| &[0][..]).collect();
            let rc = c.decode(&toks, None, &seqs).map_err(e)?;
            let err = c.last_error();
            say(format!(
                "decode {n} -> {rc} ({err}); {}",
                p.describe(&mut c, 0)?
            ));
        }
        "whole_lists" => {
            let mut c = p.open(&params)?;
            c.decode(&[1, 2], None, &[&[0], &[0]]).map_err(e)?;
            let rc = c.decode(&[3, 4, 5], None, &[&[n], &[n], &[n]]).map_err(e)?;
            let whole = c.state_get().map_err(e)?;
            let cells = parse_whole_state(&whole, p.format).map_err(e)?;
            let listed: Vec<String> = cells
                .iter()
                .map(|c| format!("{}:{:?}", c.pos, c.seqs))
                .collect();
            say(format!(
                "decode 3 into seq {n} -> {rc}; whole dump cells {}",
                listed.join(" ")
            ));
            let mut twin = p.open(&params)?;
            let read = twin.state_load(&whole).map_err(e)?;
            say(format!(
                "whole dump into a fresh context: read {read} of {} ({}); twin {}",
                whole.len(),
                twin.last_error(),
                p.describe(&mut twin, 0)?
            ));
        }
        "damaged" => {
            let mut c = p.open(&params)?;
            c.decode(&[1, 2, 3, 4, 5], None, &[&[0][..]; 5])
                .map_err(e)?;
            c.decode(&[6, 7], None, &[&[1][..]; 2]).map_err(e)?;
            let bytes = c.state_seq_save(0, 0).map_err(e)?;
            let (what, at) = arg.split_once('_').unwrap_or((arg, "0"));
            let at: usize = if at == "last" {
                bytes.len() - 1
            } else {
                at.parse().unwrap_or(0)
            };
            let mut b = bytes.clone();
            if what == "trunc" {
                b.truncate(at);
            } else if let Some(x) = b.get_mut(at) {
                *x ^= 0xff;
            }
            let read = c.state_seq_load(1, &b, 0).map_err(e)?;
            let err = c.last_error();
            say(format!(
                "{} of {} bytes into seq 1 (held 2 cells) -> read {read} ({err}); {}; {}",
                b.len(),
                bytes.len(),
                p.describe(&mut c, 1)?,
                p.describe(&mut c, 0)?
            ));
        }
        op => {
            let mut c = p.open(&params)?;
            c.decode(&[1, 2, 3], None, &[&[0], &[0], &[0]]).map_err(e)?;
            let s = n;
            let r = match op {
                "decode" => {
                    let rc = c.decode(&[4], Some(&[0]), &[&[s]]).map_err(e)?;
                    format!("rc {rc} ({})", c.last_error())
                }
                "rm" => format!("returned {}", c.seq_rm(s, -1, -1).map_err(e)?),
                "cp" => {
                    c.seq_cp(0, s, -1, -1).map_err(e)?;
                    "ok".into()
                }
                "keep" => {
                    c.seq_keep(s).map_err(e)?;
                    format!("ok; {}", p.describe(&mut c, 0)?)
                }
                "add" => {
                    c.seq_add(s, 0, 10, 1).map_err(e)?;
                    "ok".into()
                }
                "pos_min" => format!("{}", c.seq_pos_min(s).map_err(e)?),
                "pos_max" => format!("{}", c.seq_pos_max(s).map_err(e)?),
                "seq_get" => format!("{} bytes", c.state_seq_save(s, 0).map_err(e)?.len()),
                "seq_set" => {
                    let bytes = c.state_seq_save(0, 0).map_err(e)?;
                    let read = c.state_seq_load(s, &bytes, 0).map_err(e)?;
                    format!("read {read} of {} ({})", bytes.len(), c.last_error())
                }
                other => return Err(format!("no probe {other}")),
            };
            say(format!("seq {s}: {r}"));
        }
    }
    Ok(())
}
