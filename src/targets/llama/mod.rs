//! The llama.cpp target as kvaudit sees it: the crate `llama-cpp-target` (`targets/llama-cpp/`:
//! pins, tree facts, the C shim, the build, the FFI and libc; llama.h's vocabulary, nothing of
//! kvaudit's), adapted here to kvaudit's types.
//!
//! - The crate's modules, re-exported so that kvaudit names them in one place: [`pins`], [`fixes`],
//!   [`tree`], [`shim`], [`build`], [`ffi`], [`sys`], [`error`], [`startup`].
//! - [`context_params`]: a setup's settings (`base/setting.rs`) as the shim's (key, value)
//!   pairs; [`state_format`]: a pin's state format as `base/state/` reads it.
//! - [`target`]: [`target::LlamaTarget`], the `CacheUnderTest` over one context; [`faults`]:
//!   its test hooks, faults injected on kvaudit's side of the FFI (`--inject`), the positive
//!   controls of oracles on classes the native model cannot stand in for.
//! - [`worker`]: crash isolation, a fork server in a child process and its line protocol. Its
//!   trial loop runs kvaudit's `LocalRunner` over a [`target::LlamaTarget`], so it stays here,
//!   over the crate's process plumbing ([`sys`]: fork, signals, waitpid).

pub use llama_cpp_target::{build, error, ffi, fixes, pins, shim, startup, sys, tree};

pub mod faults;
pub mod memory_log;
pub mod target;
pub mod worker;

use self::ffi::ContextParams;
use self::pins::PinInfo;
use crate::base::setting::Setting;
use crate::base::state::StateFormat;

/// The context params of `settings`, in order: each as the shim takes it
/// ([`Setting::shim_value`]); the architecture is left out (it picks the model, not a context
/// field). A key given twice keeps its first place and its last value.
pub fn context_params(settings: impl IntoIterator<Item = Setting>) -> ContextParams {
    settings
        .into_iter()
        .fold(ContextParams::default(), |params, s| match s.shim_value() {
            Some(v) => params.with(s.key.name(), v),
            None => params,
        })
}

/// The variant of the state format `pin` writes (the memory type is the setup's).
pub fn state_format(pin: &PinInfo) -> StateFormat {
    StateFormat {
        rot_fields: pin.kv_state_has_n_rot,
        no_stream_count: !pin.kv_state_has_n_stream,
        no_seq_header: !pin.state_seq_has_header,
        whole_has_outputs: pin.whole_state_has_outputs,
        ..StateFormat::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::op::{Arch, CacheType, Setup};
    use crate::base::setting::{Key, Value};

    #[test]
    fn every_shim_key_is_a_key_the_shim_applies_and_reads_back() {
        // The C side's one loop compares keys by name: each one kvaudit passes must be in the
        // shim's apply and read-back chains (an unknown key would fail every open).
        let source = shim::SHIM_SOURCE;
        let setup = Setup {
            n_batch: Some(8),
            n_ubatch: Some(4),
            ..Setup::default()
        };
        for s in setup.settings() {
            let quoted = format!("strcmp(k, \"{}\") == 0", s.key);
            let read = format!("strcmp(key, \"{}\") == 0", s.key);
            match s.shim_value() {
                Some(_) => assert!(
                    source.contains(&quoted) && source.contains(&read),
                    "{} is not applied and read back by the shim",
                    s.key
                ),
                None => assert!(!source.contains(&quoted), "{}", s.key),
            }
        }
    }

    #[test]
    fn the_architecture_picks_the_model_and_is_not_passed() {
        let setup = Setup {
            arch: Arch::Mamba,
            ..Setup::default()
        };
        let retyped = Setting {
            key: Key::TypeK,
            value: Value::Type(CacheType::F32),
        };
        let params = context_params(setup.settings().into_iter().chain([retyped]));
        let names: Vec<&str> = params.settings().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "n_ctx",
                "n_seq_max",
                "kv_unified",
                "flash_attn",
                "type_k",
                "type_v",
                "swa_full",
                "n_rs_seq",
                "n_threads"
            ]
        );
        assert_eq!(params.get("type_k"), Some(0));
    }
}
