//! Target names to runners: `native` (optionally with faults) and, where built, `llama.cpp@PIN`.
//!
//! The one place that knows which targets exist; explorers and commands get runners from here and
//! never name a target type themselves.

use native_kv::Faults;

use crate::explore::RunnerFactory;
use crate::native::{parse_faults, NativeTarget};
use crate::runner::{LocalRunner, TrialRunner};
use crate::target::HarnessError;

/// A target as named on the command line, plus injected faults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetSpec {
    /// `native`, or `llama.cpp@VERSION[+assert]`.
    pub name: String,
    /// Faults to inject (native only).
    pub faults: Vec<String>,
}

impl TargetSpec {
    /// A spec from a name and a fault list.
    pub fn new(name: &str, faults: &[String]) -> Self {
        TargetSpec {
            name: name.to_string(),
            faults: faults.to_vec(),
        }
    }

    /// Checks the spec and returns a factory that makes one runner per call.
    pub fn factory(&self) -> Result<Box<RunnerFactory<'static>>, String> {
        match self.name.as_str() {
            "native" => {
                let faults: Faults = parse_faults(&self.faults)?;
                Ok(Box::new(
                    move || -> Result<Box<dyn TrialRunner>, HarnessError> {
                        Ok(Box::new(LocalRunner::new(Box::new(NativeTarget::new(
                            faults,
                        )))))
                    },
                ))
            }
            other if other.starts_with("llama.cpp@") => {
                if !self.faults.is_empty() {
                    return Err(format!(
                        "faults can only be injected into the native target, not {other}"
                    ));
                }
                llama_factory(other)
            }
            other => Err(format!(
                "unknown target '{other}' (known: native, llama.cpp@VERSION[+assert])"
            )),
        }
    }
}

fn llama_factory(name: &str) -> Result<Box<RunnerFactory<'static>>, String> {
    Err(format!(
        "target {name}: the llama.cpp target is not wired in yet"
    ))
}
