//! The program's model and context configuration: the setup's settings
//! ([`crate::base::setting`], the one list the llama.cpp target hands to its shim) as one
//! `cp.FIELD = VALUE;` per setting, and the model as the kind it must be and how kvaudit makes
//! it, never a path of this machine.

use std::fmt::Write as _;

use crate::base::op::{Arch, Setup};
use crate::base::setting::{Key, Setting, Value};

/// The setup's configuration in one line of plain words (for the header comment): every setting,
/// `n_ctx 256, n_seq_max 4, kv_unified true, ..., arch llama, swa_full true, n_threads 1`.
pub(super) fn describe_config(setup: &Setup) -> String {
    setup
        .settings()
        .iter()
        .map(Setting::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The model file a program opens when `argv[1]` names none: relative, as
/// [`model_command`] writes it.
pub fn default_model_file(arch: Arch) -> String {
    format!("tiny-{arch}.gguf")
}

/// How kvaudit writes the tiny model of `arch` it ran the finding on.
pub fn model_command(arch: Arch) -> String {
    format!(
        "kvaudit model --arch {arch} --out {}",
        default_model_file(arch)
    )
}

/// The header comment's lines about the model.
pub(super) fn describe_model(s: &mut String, arch: Arch) {
    let _ = writeln!(
        s,
        " * Model: a {arch} GGUF ({} memory); kvaudit writes the tiny one it ran: {}",
        arch.memory(),
        model_command(arch)
    );
}

/// The statements that load the model (`model_path`) and check that it is of the setup's
/// architecture: a finding of one memory type does not show on another.
pub(super) fn emit_model(s: &mut String, arch: Arch) {
    let _ = writeln!(
        s,
        "    struct llama_model_params mp = llama_model_default_params();"
    );
    let _ = writeln!(
        s,
        "    struct llama_model *model = llama_model_load_from_file(model_path, mp);"
    );
    let _ = writeln!(
        s,
        "    if (!model) {{ fprintf(stderr, \"cannot load %s (write it with: {})\\n\", model_path); return 2; }}",
        model_command(arch)
    );
    let _ = writeln!(s, "    {{ char arch[64] = \"\"; llama_model_meta_val_str(model, \"general.architecture\", arch, sizeof arch);");
    // The model's GGUF names its architecture (`Arch::gguf_name`: lfm2_swa is an lfm2 model
    // with a sliding window, which the key then shows; llama_hd64 and qwen4exp_ple are llama
    // and qwen4exp models of another head size or with PLE, of their base's memory type, and
    // have no window to ask for).
    let gguf = arch.gguf_name();
    let _ = writeln!(s, "      if (strcmp(arch, \"{gguf}\") != 0) {{ fprintf(stderr, \"%s is a %s model; this finding needs a {arch} model ({})\\n\", model_path, arch); return 2; }}", model_command(arch));
    if gguf != arch.name() && arch.swa_window().is_some() {
        let _ = writeln!(s, "      char window[32] = \"\"; if (llama_model_meta_val_str(model, \"{gguf}.attention.sliding_window\", window, sizeof window) < 0) {{ fprintf(stderr, \"%s has no sliding window; this finding needs a {arch} model ({})\\n\", model_path); return 2; }}", model_command(arch));
    }
    let _ = writeln!(s, "    }}");
}

/// The statements that fill `cp` (already `llama_context_default_params()`) from `setup`: one per
/// setting the context takes (the architecture is the model's, [`emit_model`]).
pub(super) fn emit_context_params(s: &mut String, setup: &Setup) {
    for setting in setup.settings() {
        // n_rs_seq 0 is llama_context_default_params' own, and pins before rollback (0.1.156 and
        // older) have no such field: the program sets it only when it asks for snapshots.
        if setting.key == Key::NRsSeq && setting.value == Value::Count(0) {
            continue;
        }
        if let Some(fields) = setting.llama_h() {
            let line: Vec<String> = fields
                .iter()
                .map(|(field, value)| format!("cp.{field} = {value};"))
                .collect();
            let _ = writeln!(s, "    {}", line.join(" "));
        }
    }
}
