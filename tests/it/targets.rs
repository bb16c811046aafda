//! Every target kind through the registry (`targets/registry.rs`): its name pattern parses back
//! to it, a spec of one of its targets that runs here makes a factory and a runner, and the
//! runner declares the capabilities the kind is documented to have (docs/usage.md: mlx-lm
//! lacks `seq_add` and `seq_div`, the reference worker `seq_div`), and its engine's renderer writes
//! a reproducer of a finding seen on it in the engine's language (C over llama.h, Python over
//! mlx-lm). A new kind fails to compile here until it says which of its targets runs in the tests,
//! what it lacks and what its reproducers start with.

use libtest_mimic::Trial;

use kvaudit::base::op_kind::OpKind;
use kvaudit::outputs::reproducer::Language;
use kvaudit::outputs::{c_repro, py_repro};
use kvaudit::targets::registry::{TargetKind, TargetSpec};

/// A target of `kind` that runs on this machine: the pins the tests build or make.
fn runnable(kind: TargetKind) -> &'static str {
    match kind {
        TargetKind::Native => "native",
        TargetKind::NativeTensors => "native+tensors",
        TargetKind::Llama => "llama.cpp@0.1.161",
        TargetKind::PythonRef => "python-ref",
        TargetKind::Mlx => "mlx-lm@0.32.2",
    }
}

/// The op kinds a target of `kind` declares it lacks.
fn lacks(kind: TargetKind) -> &'static [OpKind] {
    match kind {
        TargetKind::Native | TargetKind::NativeTensors | TargetKind::Llama => &[],
        TargetKind::PythonRef => &[OpKind::SeqDiv],
        TargetKind::Mlx => &[OpKind::SeqAdd, OpKind::SeqDiv],
    }
}

/// What a reproducer of a finding seen on a target of `kind` must say: its engine's API.
fn renders_with(kind: TargetKind) -> &'static str {
    match kind {
        TargetKind::Native
        | TargetKind::NativeTensors
        | TargetKind::Llama
        | TargetKind::PythonRef => "#include \"llama.h\"",
        TargetKind::Mlx => "from mlx_lm.models import cache as C",
    }
}

/// A finding seen on `name` (I1 after a tail `seq_rm`), rendered by the renderer its kind picks.
fn rendered(name: &str) -> Result<String, String> {
    let finding = serde_json::json!({
        "oracle": "I1",
        "kind": "pos_max disagree with the cells",
        "step": 1,
        "seq": 0,
        "targets": [{"target": name, "expect": "fails"}],
        "trace": {
            "setup": {"n_ctx": 256, "n_seq_max": 2, "ops": [{"op": "decode", "seq": 0, "n": 7}]},
            "ops": [{"op": "seq_rm", "seq": 0, "p0": 4, "p1": -1}]
        }
    });
    let text = finding.to_string();
    match Language::of_input(&finding) {
        Language::C => c_repro::parse_input(&text)
            .map(|input| c_repro::emit_c(&input))
            .map_err(|e| format!("C renderer: {e}")),
        Language::Python => py_repro::parse_input(&text)
            .and_then(|input| py_repro::emit_py(&input))
            .map_err(|e| format!("Python renderer: {e}")),
    }
}

fn through_the_registry(kind: TargetKind) -> Result<(), String> {
    for written in kind.pattern().split(", ") {
        let parsed = TargetKind::parse(written).map_err(|e| e.to_string())?;
        if parsed != kind {
            return Err(format!(
                "pattern '{written}' parses to {parsed:?}, not {kind:?}"
            ));
        }
    }
    let name = runnable(kind);
    let spec = TargetSpec::new(name, &[]);
    if spec.kind().map_err(|e| e.to_string())? != kind {
        return Err(format!("'{name}' is not of {kind:?}"));
    }
    let factory = spec.factory().map_err(|e| format!("{name}: {e}"))?;
    let runner = factory().map_err(|e| format!("{name}: {e}"))?;
    let info = runner.info();
    if info.name != name {
        return Err(format!("the runner of '{name}' says it is '{}'", info.name));
    }
    let caps = runner.capabilities();
    let missing: Vec<OpKind> = OpKind::ALL
        .iter()
        .copied()
        .filter(|k| !caps.has(*k))
        .collect();
    if missing != lacks(kind) {
        return Err(format!(
            "{name} lacks {missing:?}, declared for its kind: {:?}",
            lacks(kind)
        ));
    }
    // What it lacks comes with a reason in the engine's words.
    for left in caps.left_out(name) {
        if left.reason.is_empty() || left.reason == "not declared by the target" {
            return Err(format!("{name} lacks {} without a reason", left.op));
        }
    }
    let program = rendered(name)?;
    if !program.contains(renders_with(kind)) {
        return Err(format!(
            "the reproducer of a finding on {name} does not say '{}'",
            renders_with(kind)
        ));
    }
    Ok(())
}

pub fn trials() -> Vec<Trial> {
    TargetKind::ALL
        .iter()
        .map(|&kind| {
            Trial::test(
                format!("targets::every_kind_through_the_registry::{kind:?}"),
                move || super::outcome(through_the_registry(kind)),
            )
        })
        .collect()
}
