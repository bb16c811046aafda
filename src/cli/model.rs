//! `kvaudit model --arch ARCH --out FILE`: writes the tiny GGUF model kvaudit runs a setup of that
//! architecture on (`model::tiny`, `TinyModelSpec::for_arch`), the model a C reproducer of such a
//! finding needs.

use std::path::PathBuf;

use clap::Args;

use super::CliError;
use kvaudit::base::exit;
use kvaudit::base::op::Arch;
use kvaudit::model::tiny::{write_tiny_model, TinyModelSpec};

/// Arguments of `kvaudit model`.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// The architecture (llama, gemma2, mamba, jamba, lfm2, lfm2_swa, minimax-m3, qwen4exp, deepseek4, glm-dsa, deepseek32, dots3note, llama_hd64, qwen4exp_ple): which memory type llama.cpp gives it.
    #[arg(long, default_value = "llama")]
    arch: String,
    /// Where to write the GGUF file.
    #[arg(long)]
    out: PathBuf,
}

/// Writes the model.
pub fn run(a: ModelArgs) -> Result<i32, CliError> {
    let arch: Arch = a.arch.parse().map_err(CliError::usage)?;
    write_tiny_model(&TinyModelSpec::for_arch(arch), &a.out)
        .map_err(|e| CliError::harness(format!("{e:#}")))?;
    println!(
        "wrote the tiny {arch} model ({} memory) to {}",
        arch.memory(),
        a.out.display()
    );
    Ok(exit::CLEAN)
}
