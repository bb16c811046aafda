//! Standalone Python reproducers for mlx-lm: a trace and its finding as a program over mlx and
//! mlx_lm only (and the standard library), the mlx-lm engine's renderer as `c_repro` is
//! llama.cpp's.
//!
//! The program builds the model `workers/mlx_worker.py` runs the setup on (kvaudit's tiny GGUF
//! llama, its weights made again bit for bit from the spec's seed without the file; the windowed
//! llama or mlx-lm's llama4 built in code from `mx.random.seed(0)`), makes one prompt cache per
//! sequence of the setup's cache classes ([`settings`]), replays the setup ops and the trace as straight-line mlx-lm calls in
//! the worker's mapping, each headed by a comment naming the kvaudit op ([`ops`]), then checks
//! the finding's oracle ([`check`]). Exit codes: 1 = the finding reproduces (it prints `BUG:
//! ...`), 0 = it does not, 2 = the trace could not be replayed (an exception before the checked
//! op, or an op kvaudit's mapping has no call for). A crash finding reproduces when the checked
//! op raises: the program prints the exception and exits 1; any other check does not reproduce
//! then (exit 0: the worker's trial ends crashed there, before the oracle judges it).
//!
//! The input is hostile: no text from it reaches the program except through
//! [`py_string_literal`] or [`py_comment`] (one `#` line, printable ASCII only). Numbers are
//! formatted from integers; the configuration is read into [`settings::MlxSetup`] (fixed class
//! names and integers) and refused where the worker would refuse it. `tests/it/hostile.rs`
//! runs the programs of hostile inputs.
//!
//! The parts: `escape.rs` (text into Python), `settings.rs` (the setup as mlx-lm caches),
//! `ops.rs` (the ops as mlx-lm calls), `prelude.py` (the helpers every program has: the model,
//! reading a cache's state, save and load), `check.rs` (each oracle's check).

pub mod check;
mod escape;
mod ops;
pub mod settings;

pub use escape::{py_comment, py_string_literal};

use std::fmt::Write as _;
use std::path::Path;

use check::{checked_oracles, py_check_of, PyCheckInput};
use ops::{emit_op, Replay};
use settings::MlxSetup;

use crate::base::error::Error;
use crate::base::files::{private_temp_dir, read_text_limited};
use crate::base::op::Op;
use crate::outputs::c_repro::check::ProgramRun;
use crate::outputs::c_repro::ReproInput;
use crate::outputs::repro::{check_trace_limits, MAX_REPRO_BYTES};
use crate::records::report::terminal_text;

/// The helpers every program starts with (after its settings).
const PRELUDE: &str = include_str!("prelude.py");

/// Reads a repro file or a finding (any JSON object with `oracle` and `trace`), at most
/// [`MAX_REPRO_BYTES`].
pub fn read_input(path: &Path) -> Result<ReproInput, Error> {
    let text = read_text_limited(path, MAX_REPRO_BYTES)?;
    parse_input(&text).map_err(|e| e.context(path.display()))
}

/// Parses a reproducer's input; only inputs whose oracle has a Python check and whose setup the
/// mlx-lm worker runs parse.
pub fn parse_input(text: &str) -> Result<ReproInput, Error> {
    let input: ReproInput = serde_json::from_str(text).map_err(|e| {
        let what = terminal_text(&e.to_string());
        format!("line {}, column {}: {what}", e.line(), e.column())
    })?;
    check_trace_limits(&input.trace)?;
    if py_check_of(input.oracle).is_none() {
        let checked: Vec<&str> = checked_oracles().iter().map(|o| o.name()).collect();
        return Err(Error::input(format!(
            "oracle {} has no check in Python reproducers (they check {})",
            input.oracle,
            checked.join(", ")
        )));
    }
    MlxSetup::of(&input.trace.setup)?;
    Ok(input)
}

/// The Python program for `input` (which [`parse_input`] accepted).
pub fn emit_py(input: &ReproInput) -> Result<String, Error> {
    let t = &input.trace;
    let setup = MlxSetup::of(&t.setup)?;
    let check = py_check_of(input.oracle).ok_or_else(|| {
        Error::input(format!(
            "oracle {} has no check in Python reproducers",
            input.oracle
        ))
    })?;
    let step = input
        .step
        .unwrap_or(t.ops.len())
        .clamp(1, t.ops.len().max(1));
    let seqs: Vec<i32> = match input.seq {
        Some(s) if s >= 0 => vec![s],
        _ => (0..setup.n_seq_max as i32).collect(),
    };
    let mut s = String::new();
    let _ = writeln!(s, "#!/usr/bin/env python3");
    let _ = writeln!(
        s,
        "# kvaudit reproducer (mlx-lm): {} {}",
        input.oracle,
        py_comment(input.kind.as_deref().unwrap_or_default())
    );
    if let Some(target) = &input.target {
        let _ = writeln!(s, "# Seen on: {}", py_comment(&target.to_string()));
    }
    let _ = writeln!(s, "# The check: {}.", check.in_words);
    let _ = writeln!(s, "# Setup: {}; then:", setup.describe());
    for op in &t.setup.ops {
        let _ = writeln!(s, "#   {}", py_comment(&op.to_json()));
    }
    let _ = writeln!(s, "# Ops (checked after op {step}):");
    for op in &t.ops {
        let _ = writeln!(s, "#   {}", py_comment(&op.to_json()));
    }
    let _ = writeln!(s, "# The model: {}; no download.", setup.model_in_words());
    let _ = writeln!(s, "# Run: python3 repro.py   (needs mlx and mlx-lm: pip install mlx-lm, on Linux mlx[cpu] too)");
    let _ = writeln!(s, "# Exit 1: the bug reproduces (it prints BUG: ...); 0: it does not; 2: the trace could not be replayed.");
    let _ = writeln!(s, "# Generated by kvaudit {}.\n", env!("CARGO_PKG_VERSION"));
    setup.emit(&mut s);
    s.push_str(PRELUDE);
    let ops: Vec<&Op> = t.setup.ops.iter().chain(t.ops.iter().take(step)).collect();
    let mut replay = Replay::new(&setup, &ops);
    let _ = writeln!(s, "\n# -- the setup and the trace --");
    for op in &t.setup.ops {
        emit_op(&mut s, &mut replay, op, "setup", "");
    }
    for (i, op) in t.ops.iter().take(step).enumerate() {
        let label = format!("op {}", i + 1);
        if i + 1 == step && !check.raises {
            // What every sequence held right before the checked op (a check compares with it).
            let _ = writeln!(s, "before_op = [observe(caches[s]) for s in range(N_SEQ)]");
        }
        if i + 1 < step {
            emit_op(&mut s, &mut replay, op, &label, "");
            continue;
        }
        if !check.raises {
            // As the worker: an exception of mlx-lm's at the checked op ends the trial crashed
            // there, before any other oracle judges it (a crash finding of its own).
            let _ = writeln!(s, "try:");
            emit_op(&mut s, &mut replay, op, &label, "    ");
            let _ = writeln!(s, "except Exception as e:");
            let _ = writeln!(s, "    traceback.print_exc()");
            let _ = writeln!(
                s,
                "    print(\"{label} raised %s: %s: kvaudit's trial crashes here, before this check: not reproduced\" % (type(e).__name__, \" \".join(str(e).split())))"
            );
            let _ = writeln!(s, "    sys.exit(0)");
            continue;
        }
        let _ = writeln!(s, "\n# -- the check: {} --", check.in_words);
        let _ = writeln!(s, "try:");
        emit_op(&mut s, &mut replay, op, &label, "    ");
        let _ = writeln!(
            s,
            "    for s in range(N_SEQ):  # and every sequence's state read after it"
        );
        let _ = writeln!(s, "        observe(caches[s])");
        let _ = writeln!(s, "except Exception as e:");
        let _ = writeln!(s, "    traceback.print_exc()");
        let _ = writeln!(
            s,
            "    print(\"BUG: {label} raised %s: %s\" % (type(e).__name__, \" \".join(str(e).split())))"
        );
        let _ = writeln!(s, "    sys.exit(1)");
        let _ = writeln!(s, "print(\"no exception: the finding does not reproduce\")");
        let _ = writeln!(s, "sys.exit(0)");
        return Ok(s);
    }
    let _ = writeln!(s, "\n# -- the check: {} --", check.in_words);
    let _ = writeln!(s, "bug = []");
    (check.after)(
        &mut s,
        &PyCheckInput {
            step,
            expected: &input.expected,
            seqs: &seqs,
            op: t.ops.get(step.wrapping_sub(1)),
        },
    );
    let _ = writeln!(s, "for line in bug:");
    let _ = writeln!(s, "    print(\"BUG: \" + line)");
    let _ = writeln!(s, "print(\"reproduced\" if bug else \"not reproduced\")");
    let _ = writeln!(s, "sys.exit(1 if bug else 0)");
    Ok(s)
}

/// Runs `program` with the interpreter of the mlx-lm environment of `label` (made first when
/// it is not), in a fresh private folder.
pub fn run_program(program: &str, label: &str) -> Result<ProgramRun, Error> {
    let pin = crate::targets::mlx::MlxPin::parse(label)?;
    let python = pin.ensure_built()?;
    let dir = private_temp_dir("repro-py")?;
    let src = dir.join("repro.py");
    let result = (|| {
        std::fs::write(&src, program)
            .map_err(|e| Error::harness(format!("{}: {e}", src.display())))?;
        std::process::Command::new(&python)
            .arg(&src)
            .current_dir(&dir)
            .env("OMP_NUM_THREADS", "1")
            .output()
            .map_err(|e| Error::harness(format!("running {}: {e}", python.display())))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let out = result?;
    use std::os::unix::process::ExitStatusExt;
    Ok(ProgramRun {
        code: out.status.code(),
        signal: out.status.signal(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FINDING: &str = r#"{"oracle": "I1", "target": "mlx-lm@0.32.2", "trace": {"setup": {"n_ctx": 256, "n_seq_max": 2, "engine": {"cache": "concatenate"}, "ops": [{"op": "decode", "seq": 0, "n": 7}]}, "ops": [{"op": "seq_rm", "seq": 0, "p0": 4, "p1": -1}]}}"#;

    #[test]
    fn an_oracle_without_a_python_check_is_refused_in_one_line() {
        let e = parse_input(&FINDING.replace("I1", "swa-window")).unwrap_err();
        assert!(
            e.message.starts_with(
                "oracle swa-window has no check in Python reproducers (they check I1, I2, crash"
            ),
            "{e}"
        );
        assert!(!e.message.contains('\n'));
    }

    #[test]
    fn a_setup_the_worker_refuses_is_refused() {
        let e = parse_input(&FINDING.replace("concatenate", "paged")).unwrap_err();
        assert!(e.message.contains("engine cache \"paged\""), "{e}");
    }

    #[test]
    fn each_op_is_an_mlx_lm_call_under_its_kvaudit_op() {
        let p = emit_py(&parse_input(FINDING).unwrap()).unwrap();
        for want in [
            // one cache per layer of kvaudit's GGUF llama, the worker's model, made from its spec
            "return [C.ConcatenateKVCache()]",
            "MODEL = \"gguf\"",
            "GGUF = dict(n_layer=1, n_embd=32, n_head=2, n_head_kv=1, n_ff=32, n_vocab=64,",
            "# setup: {\"op\":\"decode\",\"seq\":0,\"n\":7}",
            "model(mx.array([[12, 49, 23, 60, 34, 8, 45]]), cache=caches[0])",
            "# op 1: {\"op\":\"seq_rm\",\"seq\":0,\"p0\":4,\"p1\":-1}",
            "trimmed = C.trim_prompt_cache(caches[0], n)",
            "sys.exit(1 if bug else 0)",
        ] {
            assert!(p.contains(want), "{want}\n{p}");
        }
    }

    #[test]
    fn llama4_runs_its_own_make_cache_and_observes_its_global_and_chunked_layers() {
        let llama4 = FINDING.replace(
            r#""engine": {"cache": "concatenate"}"#,
            r#""arch": "gemma2", "engine": {"model": "llama4", "chunk_size": "4"}"#,
        );
        let p = emit_py(&parse_input(&llama4).unwrap()).unwrap();
        for want in [
            "MODEL = \"llama4\"",
            "CHUNK_SIZE = 4",
            "N_LAYERS = 4",
            "KINDS = [\"chunked\", \"chunked\", \"chunked\", \"plain\"]",
            "BASE = 3",
            "WIN = 0",
            "return C.make_prompt_cache(model)",
            "returned = returned and trimmed == n",
        ] {
            assert!(p.contains(want), "{want}\n{p}");
        }
        let e = parse_input(&llama4.replace("gemma2", "llama")).unwrap_err();
        assert!(e.message.contains("llama4"), "{e}");
    }
}
