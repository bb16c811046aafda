//! Target names to runners: `native` and `native+tensors` (optionally with faults),
//! `python-ref`, `mlx-lm@VERSION` and, where built, `llama.cpp@PIN`. A name is parsed once
//! into a [`TargetKind`]; adding an engine is an arm of it (ARCHITECTURE.md, "Adding an
//! engine").
//!
//! The one place that knows which targets exist; explorers and commands get runners from here and
//! never name a target type themselves.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use native_kv::Faults;

use crate::base::cache::{CacheUnderTest, HarnessError, Observe};
use crate::base::error::Error;
use crate::model::forward::Model;
use crate::running::runner::RunnerFactory;
use crate::running::runner::{LocalRunner, TrialRunner};
use crate::running::state_runner::{KeyScope, StateRunner, StateRunnerFactory};
use crate::targets::native::{parse_faults, NativeTarget};

/// A target as named on the command line, plus injected faults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetSpec {
    /// A name of one of the [`TargetKind`]s: `native`, `llama.cpp@VERSION[+assert]`, ...
    pub name: String,
    /// Faults to inject: the native model's, or a llama.cpp target's test hooks
    /// ([`crate::targets::llama::faults`]).
    pub faults: Vec<String>,
    /// A model file for llama.cpp targets (default: the generated tiny model).
    pub model: Option<PathBuf>,
    /// What runners observe after each op beyond the accessors and per-sequence dumps
    /// (default: everything; oracles that need less make runs faster).
    pub observe: Observe,
}

impl TargetSpec {
    /// A spec from a name and a fault list.
    pub fn new(name: &str, faults: &[String]) -> Self {
        TargetSpec {
            name: name.to_string(),
            faults: faults.to_vec(),
            model: None,
            observe: Observe::ALL,
        }
    }

    /// The kind of target it names (`Err`: none, with the names kvaudit knows).
    pub fn kind(&self) -> Result<TargetKind, Error> {
        TargetKind::parse(&self.name)
    }

    /// The same spec, observing `what` (see [`Observe`]).
    pub fn with_observe(mut self, what: Observe) -> Self {
        self.observe = what;
        self
    }

    /// Whether the theorem oracles can judge this target: only `native+tensors` serializes K/V
    /// rows and exposes logits in process; for any other target the `Err` says why not.
    pub fn check_theorem_target(&self) -> Result<(), Error> {
        use crate::targets::native_tensor::NAME as TENSORS;
        let why = match TargetKind::parse(&self.name) {
            Ok(TargetKind::NativeTensors) => return Ok(()),
            // llama.cpp runs only in worker processes during a fuzz run, and its figures
            // are measurements, not bit-exact verdicts.
            Ok(TargetKind::Llama) => {
                "on llama.cpp, where only measurements make sense, use `kvaudit measure`"
            }
            Ok(TargetKind::Native | TargetKind::PythonRef | TargetKind::Mlx) | Err(_) => {
                "it has no tensors"
            }
        };
        Err(format!(
            "the theorem oracles need a target that serializes K/V rows and exposes logits in process, i.e. --target {TENSORS}; '{}' cannot be judged ({why})",
            self.name,
        ).into())
    }

    /// The in-process target the theorem oracles drive (`kvaudit fuzz --oracles T1,T2,T3`) and
    /// the reference model they judge it against, both with the sliding window `window`. The
    /// reference is loaded on its own: it shares no state with the target.
    pub fn theorem_target(
        &self,
        window: Option<u32>,
    ) -> Result<(Box<dyn CacheUnderTest + Send>, Arc<Model>), Error> {
        use crate::targets::native_tensor::NativeTensorTarget;
        self.check_theorem_target()?;
        let faults = parse_faults(&self.faults)?;
        let load =
            || NativeTensorTarget::default_model(window).map_err(|e| Error::harness(e.to_string()));
        let target = NativeTensorTarget::new(load()?, faults);
        Ok((Box::new(target), load()?))
    }

    /// A factory of state runners for a state-space search (`--strategy states`), keying
    /// `scope`: only for a target whose complete state can be keyed, `native`; for any other
    /// the `Err` (bad input) says why not.
    pub fn state_factory(
        &self,
        scope: KeyScope,
    ) -> Result<Box<StateRunnerFactory<'static>>, Error> {
        let why = match TargetKind::parse(&self.name) {
            Ok(TargetKind::Native) => None,
            Ok(TargetKind::Llama) => Some(
                "its hidden state (the position index, heads, pending shifts) cannot be observed, \
                 and deduplicating by what can be (accessors and dumps) would merge exactly the \
                 states a stale index tells apart",
            ),
            Ok(TargetKind::NativeTensors | TargetKind::PythonRef | TargetKind::Mlx) | Err(_) => {
                Some(
                    "only the native target's complete state can be keyed (this one carries \
                     tensor rows)",
                )
            }
        };
        if let Some(why) = why {
            return Err(Error::input(format!(
                "--strategy states cannot run on '{}': {why}; use --strategy exhaustive",
                self.name
            )));
        }
        let faults: Faults = parse_faults(&self.faults)?;
        let observe = self.observe;
        Ok(Box::new(move || -> Result<StateRunner, HarnessError> {
            Ok(StateRunner::new(Box::new(NativeTarget::new(faults)), observe)?.with_scope(scope))
        }))
    }

    /// Checks the spec and returns a factory that makes one runner per call.
    pub fn factory(&self) -> Result<Box<RunnerFactory<'static>>, Error> {
        match TargetKind::parse(&self.name)? {
            TargetKind::PythonRef => {
                let cmd = crate::targets::python::reference_command(&self.faults, self.observe)?;
                jsonl_factory(cmd)
            }
            TargetKind::Mlx => {
                let cmd =
                    crate::targets::mlx::worker_command(&self.name, &self.faults, self.observe)?;
                jsonl_factory(cmd)
            }
            TargetKind::Native => {
                let faults: Faults = parse_faults(&self.faults)?;
                let observe = self.observe;
                Ok(Box::new(
                    move || -> Result<Box<dyn TrialRunner>, HarnessError> {
                        Ok(Box::new(
                            LocalRunner::new(Box::new(NativeTarget::new(faults)))
                                .with_observe(observe),
                        ))
                    },
                ))
            }
            TargetKind::NativeTensors => {
                let faults: Faults = parse_faults(&self.faults)?;
                let model = crate::targets::native_tensor::load_model(self.model.as_deref())
                    .map_err(|e| e.to_string())?;
                let observe = self.observe;
                Ok(Box::new(
                    move || -> Result<Box<dyn TrialRunner>, HarnessError> {
                        Ok(Box::new(
                            LocalRunner::new(Box::new(
                                crate::targets::native_tensor::NativeTensorTarget::new(
                                    model.clone(),
                                    faults,
                                ),
                            ))
                            .with_observe(observe),
                        ))
                    },
                ))
            }
            TargetKind::Llama => {
                let faults = crate::targets::llama::faults::LlamaFaults::parse(&self.faults)?;
                llama_factory(&self.name, self.model.as_deref(), self.observe, faults)
            }
        }
    }
}

/// Every kind of target kvaudit knows, parsed once from a target's name: adding an engine is
/// an arm here and the `match`es over it that the compiler then walks through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetKind {
    /// `native`: the Rust model of llama.cpp's cell cache (`targets/native-kv`).
    Native,
    /// `native+tensors`: the same with K/V rows and a tiny model's forward pass.
    NativeTensors,
    /// `llama.cpp@PIN[+VARIANT]` or `llama.cpp@src:PATH`: a real llama.cpp build in workers.
    Llama,
    /// `python-ref`: the reference worker of the JSON-lines protocol
    /// (`workers/python_ref.py`).
    PythonRef,
    /// `mlx-lm@VERSION`: mlx-lm's caches in a worker (`workers/mlx_worker.py`) in an
    /// environment kvaudit makes.
    Mlx,
}

impl TargetKind {
    /// Every kind, for listings and the tests that walk them all.
    pub const ALL: [TargetKind; 5] = [
        TargetKind::Native,
        TargetKind::NativeTensors,
        TargetKind::Llama,
        TargetKind::PythonRef,
        TargetKind::Mlx,
    ];

    /// The kind a target's name is of (`Err`: no kind, with the names kvaudit knows).
    pub fn parse(name: &str) -> Result<TargetKind, Error> {
        use crate::targets::native_tensor::NAME as TENSORS;
        if name == "native" {
            Ok(TargetKind::Native)
        } else if name == TENSORS {
            Ok(TargetKind::NativeTensors)
        } else if name.starts_with("llama.cpp@") {
            Ok(TargetKind::Llama)
        } else if name == crate::targets::python::REFERENCE {
            Ok(TargetKind::PythonRef)
        } else if name.starts_with(crate::targets::mlx::PREFIX) {
            Ok(TargetKind::Mlx)
        } else {
            Err(Error::input(format!(
                "unknown target '{name}' (known: {})",
                TargetKind::ALL.map(|k| k.pattern()).join(", ")
            )))
        }
    }

    /// The kind of a report's or repro file's label: a name, then faults (`native[refcount]`)
    /// or a note after a space (`llama.cpp@0.1.161 (arch=deepseek4)`); `None` for no kind.
    pub fn of_label(label: &str) -> Option<TargetKind> {
        let name = label.split(['[', ' ']).next().unwrap_or(label);
        TargetKind::parse(name).ok()
    }

    /// Whether `label` (a name, or a report's label as [`TargetKind::of_label`] reads it)
    /// names a llama.cpp build: what the outputs that speak llama.h (a picture's default
    /// target, the version matrix, a bug report) pick out of a repro file's targets.
    pub fn is_llama(label: &str) -> bool {
        match TargetKind::of_label(label) {
            Some(TargetKind::Llama) => true,
            Some(
                TargetKind::Native
                | TargetKind::NativeTensors
                | TargetKind::PythonRef
                | TargetKind::Mlx,
            )
            | None => false,
        }
    }

    /// What follows the `@` of a name of a kind with versions (`0.1.156+assert` of
    /// `llama.cpp@0.1.156+assert`, `0.32.2` of `mlx-lm@0.32.2`); `None` for a name of a
    /// kind without versions, or of no kind.
    pub fn version_of(name: &str) -> Option<&str> {
        match TargetKind::parse(name).ok()? {
            TargetKind::Llama | TargetKind::Mlx => name.split_once('@').map(|(_, v)| v),
            TargetKind::Native | TargetKind::NativeTensors | TargetKind::PythonRef => None,
        }
    }

    /// The engine whose cache a target of this kind is, or models: the native models and the
    /// reference worker follow llama.h and llama.cpp's cell cache, so their findings are
    /// llama.cpp's to compare with.
    pub fn engine(self) -> Engine {
        match self {
            TargetKind::Native
            | TargetKind::NativeTensors
            | TargetKind::Llama
            | TargetKind::PythonRef => Engine::LlamaCpp,
            TargetKind::Mlx => Engine::MlxLm,
        }
    }

    /// How a name of this kind is written.
    pub fn pattern(self) -> &'static str {
        match self {
            TargetKind::Native => "native",
            TargetKind::NativeTensors => crate::targets::native_tensor::NAME,
            TargetKind::Llama => "llama.cpp@VERSION[+assert], llama.cpp@src:PATH",
            TargetKind::PythonRef => crate::targets::python::REFERENCE,
            TargetKind::Mlx => "mlx-lm@VERSION",
        }
    }
}

/// An engine whose KV cache kvaudit audits (ARCHITECTURE.md's glossary): what a finding is of.
/// Outputs compare and render findings per engine: a corpus file of one engine says nothing of
/// a hunt group of another, and a version matrix runs a file on its own engine's versions only.
/// In a file (a decision's match block) by its name.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Engine {
    /// llama.cpp (and the models of its cache: `native`, `native+tensors`, `python-ref`).
    #[serde(rename = "llama.cpp")]
    LlamaCpp,
    /// mlx-lm.
    #[serde(rename = "mlx-lm")]
    MlxLm,
}

impl Engine {
    /// Its name, for messages and reports.
    pub fn name(self) -> &'static str {
        match self {
            Engine::LlamaCpp => "llama.cpp",
            Engine::MlxLm => "mlx-lm",
        }
    }
}

/// A factory of runners over the JSON-lines worker `cmd`: the first worker is started now, so
/// that a worker that cannot start (no interpreter, an unknown fault) is an error before any
/// trial, and handed to the first runner asked for.
fn jsonl_factory(
    cmd: crate::isolation::jsonl::WorkerCommand,
) -> Result<Box<RunnerFactory<'static>>, Error> {
    use crate::isolation::jsonl::JsonlRunner;
    let first = JsonlRunner::new(cmd.clone()).map_err(|e| Error::input(e.to_string()))?;
    let first = std::sync::Mutex::new(Some(first));
    Ok(Box::new(
        move || -> Result<Box<dyn TrialRunner>, HarnessError> {
            let ready = first.lock().unwrap_or_else(|e| e.into_inner()).take();
            Ok(Box::new(match ready {
                Some(r) => r,
                None => JsonlRunner::new(cmd.clone())?,
            }))
        },
    ))
}

/// How long one llama.cpp trial may take before it counts as a hang.
pub const LLAMA_TRIAL_TIMEOUT: Duration = Duration::from_secs(20);

/// Builds the pin if needed (a progress line on stderr) and describes the worker process that
/// serves it.
pub fn llama_worker_spec(
    name: &str,
    model: Option<&std::path::Path>,
) -> Result<crate::targets::llama::worker::WorkerSpec, Error> {
    use crate::targets::llama::build::{ensure_built, BuildSpec};
    use crate::targets::llama::pins::Pin;
    use crate::targets::llama::startup::mark;
    use crate::targets::llama::target::ResetMode;
    let pin = Pin::parse(name).map_err(|e| Error::input(format!("{e:#}")))?;
    let info = pin.info().map_err(|e| Error::input(format!("{e:#}")))?;
    let built = ensure_built(&BuildSpec::new(pin.clone()), true)
        .map_err(|e| Error::harness(format!("building {name}: {e:#}")))?;
    mark("kvaudit: build found");
    let model = match model {
        Some(m) => m.to_path_buf(),
        None => crate::model::tiny::try_audit_model_path()
            .map_err(|e| Error::harness(format!("tiny model: {e:#}")))?,
    };
    mark("kvaudit: model written");
    let exe = std::env::current_exe()
        .map_err(|e| Error::harness(format!("cannot find the kvaudit executable: {e}")))?;
    let exe = worker_exe(exe);
    if !exe.is_file() {
        return Err(Error::harness(format!(
            "the llama.cpp worker program {} is missing: it is built beside kvaudit (`cargo build --release` builds both; `cargo install` installs both)",
            exe.display()
        )));
    }
    Ok(crate::targets::llama::worker::WorkerSpec {
        exe,
        shim: built.so_path.clone(),
        model,
        label: pin.label(),
        format: crate::targets::llama::state_format(&info),
        timeout: LLAMA_TRIAL_TIMEOUT,
        reset: ResetMode::Restore,
        observe: Observe::ALL,
        env: crate::targets::llama::worker::runtime_env(pin.variant)
            .map_err(|e| Error::harness(format!("{name}: {e:#}")))?,
        crash_observing: crash_observing_hook()?,
        faults: Default::default(),
    })
}

/// The test hook `KVAUDIT_TEST_CRASH_OBSERVING=OBSERVATION` (docs/usage.md): llama.cpp workers
/// die of SIGSEGV whenever they make that observation (`whole`, `round-trip`, `before`,
/// `probe`, `sequences`), so that an observation crash can be shown on any pin.
fn crash_observing_hook() -> Result<Option<crate::base::cache::Observation>, Error> {
    use crate::base::cache::Observation;
    let Some(v) = std::env::var_os("KVAUDIT_TEST_CRASH_OBSERVING") else {
        return Ok(None);
    };
    let v = v.to_string_lossy();
    Observation::from_name(&v).map(Some).ok_or_else(|| {
        let names: Vec<&str> = Observation::ALL.iter().map(|o| o.name()).collect();
        Error::input(format!(
            "KVAUDIT_TEST_CRASH_OBSERVING={v}: expected one of {}",
            names.join(", ")
        ))
    })
}

/// A factory that starts one crash-isolated worker process per runner.
fn llama_factory(
    name: &str,
    model: Option<&std::path::Path>,
    observe: Observe,
    faults: crate::targets::llama::faults::LlamaFaults,
) -> Result<Box<RunnerFactory<'static>>, Error> {
    use crate::targets::llama::worker::WorkerRunner;
    let spec = crate::targets::llama::worker::WorkerSpec {
        observe,
        faults,
        ..llama_worker_spec(name, model)?
    };
    Ok(Box::new(
        move || -> Result<Box<dyn TrialRunner>, HarnessError> {
            Ok(Box::new(WorkerRunner::new(spec.clone())?))
        },
    ))
}

/// The worker binary ([`WORKER_BINARY`]) beside `current`, the running executable: `kvaudit`
/// installed or built has it in the same folder (cargo builds both, and builds them for
/// integration tests and benches, whose executables sit one folder down, in `deps/`).
/// `KVAUDIT_LLAMA_WORKER` names another.
///
/// [`WORKER_BINARY`]: crate::targets::llama::worker::entry::WORKER_BINARY
fn worker_exe(current: PathBuf) -> PathBuf {
    use crate::targets::llama::worker::entry::WORKER_BINARY;
    if let Some(p) = std::env::var_os("KVAUDIT_LLAMA_WORKER") {
        return PathBuf::from(p);
    }
    // target/<profile>/deps/it-HASH -> target/<profile>/kvaudit-llama-worker
    let mut dir = current.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") && !dir.join(WORKER_BINARY).exists() {
        dir.pop();
    }
    dir.join(WORKER_BINARY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_observe_everything_unless_told() {
        let spec = TargetSpec::new("native", &[]);
        assert_eq!(spec.observe, Observe::ALL);
        let basic = spec.with_observe(Observe::BASIC);
        assert_eq!(basic.observe, Observe::BASIC);
        assert!(basic.factory().is_ok());
    }
}
