//! Every target kind through the registry (`targets/registry.rs`): its name pattern parses back
//! to it, a spec of one of its targets that runs here makes a factory and a runner, and the
//! runner declares the capabilities the kind is documented to have (docs/usage.md: mlx-lm
//! lacks `seq_add` and `seq_div`, the reference worker `seq_div`). A new kind fails to compile
//! here until it says which of its targets runs in the tests and what it lacks.

use libtest_mimic::Trial;

use kvaudit::base::op_kind::OpKind;
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
