//! `kvaudit target`: build llama.cpp pins and mlx-lm environments, and list what is known.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::CliError;
use kvaudit::base::exit;
use kvaudit::targets::registry::TargetKind;

/// Arguments of `kvaudit target`.
#[derive(Debug, Args)]
pub struct TargetCmd {
    #[command(subcommand)]
    what: TargetWhat,
}

#[derive(Debug, Subcommand)]
enum TargetWhat {
    /// Build (or find in the cache) a target: a llama.cpp pin's shim (`llama.cpp@0.1.156[+assert]`)
    /// or an mlx-lm version's environment (`mlx-lm@0.32.2`).
    Build {
        /// Pin labels.
        #[arg(required = true)]
        labels: Vec<String>,
        /// Build over this llama.cpp source tree instead of the pin's crate.
        #[arg(long)]
        llama_src: Option<PathBuf>,
        /// Rebuild even if cached.
        #[arg(long)]
        force: bool,
    },
    /// List the targets and every pin kvaudit knows, with its facts and whether it is built.
    List,
    /// Read llama.cpp trees' facts and compile the shim alone against each one's llama.h
    /// (seconds): prints each tree as a pins.toml entry, or why kvaudit cannot drive it.
    Check {
        /// llama.cpp trees (or unpacked `llama-cpp-sys-2` crates).
        #[arg(required = true)]
        trees: Vec<PathBuf>,
    },
    /// Reclaim cache space: keep the newest build of each pin and source tree, remove older
    /// builds, builds of trees that are gone, and the cached objects only they used.
    Gc {
        /// Say what would be removed, remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Runs `kvaudit target ...`.
pub fn run(t: TargetCmd) -> Result<i32, CliError> {
    match t.what {
        TargetWhat::Build {
            labels,
            llama_src,
            force,
        } => {
            for label in labels {
                match TargetKind::parse(&label) {
                    Ok(TargetKind::Mlx) => {
                        let pin = kvaudit::targets::mlx::MlxPin::parse(&label)?;
                        let python = pin.ensure_built()?;
                        println!("{}", python.display());
                        continue;
                    }
                    // Only llama.cpp pins are built below; the pin parser says why any other
                    // name is not one.
                    Ok(
                        TargetKind::Llama
                        | TargetKind::Native
                        | TargetKind::NativeTensors
                        | TargetKind::PythonRef,
                    )
                    | Err(_) => {}
                }
                kvaudit::targets::llama::pins::Pin::parse(&label)
                    .map_err(|e| CliError::usage(format!("{e:#}")))?;
                let built = kvaudit::targets::llama::build::build_command(
                    &label,
                    llama_src.as_deref(),
                    force,
                )
                .map_err(|e| CliError::harness(format!("{e:#}")))?;
                println!("{}", built.so_path.display());
            }
            Ok(exit::CLEAN)
        }
        TargetWhat::Gc { dry_run } => {
            let r = kvaudit::targets::llama::build::collect_garbage(None, dry_run)
                .map_err(|e| CliError::harness(format!("{e:#}")))?;
            let verb = if dry_run { "would remove" } else { "removed" };
            for e in &r.entries {
                println!("{verb} {}", e.display());
            }
            println!(
                "{verb} {} build(s) (older, or of a tree that is gone) and {} cached object(s): {:.1} MiB",
                r.entries.len(),
                r.objects,
                r.bytes as f64 / (1024.0 * 1024.0)
            );
            Ok(exit::CLEAN)
        }
        TargetWhat::List => {
            use kvaudit::targets::llama::pins::{known_pins, Pin, Variant};
            println!("native  (faults: {})", native_kv::Faults::NAMES.join(", "));
            println!("native+tensors  (the same, with K/V rows and a forward pass; same faults)");
            let harness =
                |e: kvaudit::targets::llama::error::LlamaError| CliError::harness(format!("{e:#}"));
            let built = kvaudit::targets::llama::build::cached_labels(None).map_err(harness)?;
            let mut pins: Vec<_> = known_pins().map_err(harness)?.values().collect();
            pins.sort_by_key(|p| kvaudit::targets::llama::pins::version_key(&p.version));
            println!(
                "llama.cpp@VERSION[+assert]: {} pins (built: release / +assert)",
                pins.len()
            );
            for info in pins {
                let is_built = |variant| {
                    let label = Pin {
                        version: info.version.clone(),
                        variant,
                        tree: None,
                        fixes: Vec::new(),
                    }
                    .label();
                    if built.contains_key(&label) {
                        "built"
                    } else {
                        "-"
                    }
                };
                println!(
                    "llama.cpp@{:<9} {:>5} / {:<5}  llama {} ggml {}, state v{}, seq_pos {}",
                    info.version,
                    is_built(Variant::RELEASE),
                    is_built(Variant::ASSERT),
                    info.llama_version,
                    info.ggml_version,
                    info.state_seq_version,
                    info.seq_pos_bookkeeping
                );
            }
            println!("llama.cpp@src:PATH[+assert]  (a llama.cpp source tree)");
            println!(
                "llama.cpp@VERSION+fix:NAME  (a pin with a fix of corpora/fixes/ applied; `kvaudit fixes list`)"
            );
            println!(
                "{}  (the JSON-lines protocol's reference worker, Python standard library only)",
                kvaudit::targets::python::REFERENCE
            );
            println!(
                "mlx-lm@VERSION: {} pins (environment made)",
                kvaudit::targets::mlx::PINS.len()
            );
            for (v, mlx) in kvaudit::targets::mlx::PINS {
                let pin = kvaudit::targets::mlx::MlxPin::parse(&format!("mlx-lm@{v}"))?;
                let made = match pin.built() {
                    Ok(Some(_)) => "made",
                    Ok(None) => "-",
                    Err(_) => "no python3",
                };
                println!("mlx-lm@{v:<8} {made:>10}  mlx[cpu] {mlx}");
            }
            Ok(exit::CLEAN)
        }
        TargetWhat::Check { trees } => {
            let mut failed = false;
            for dir in trees {
                let root = kvaudit::targets::llama::tree::normalize_tree(&dir)
                    .map_err(|e| CliError::usage(format!("{e:#}")))?;
                let facts = match kvaudit::targets::llama::tree::tree_facts(&root) {
                    Ok(f) => f,
                    Err(e) => {
                        println!("# {}: not drivable: {e:#}", dir.display());
                        failed = true;
                        continue;
                    }
                };
                let shim = kvaudit::targets::llama::build::check_shim(&root);
                if let Err(e) = &shim {
                    println!("# {}: the shim does not compile: {e:#}", dir.display());
                    failed = true;
                    continue;
                }
                print!("{}", pins_toml_entry(&facts, &root));
            }
            Ok(if failed { exit::FINDINGS } else { exit::CLEAN })
        }
    }
}

/// A tree's facts as a pins.toml entry (the crate's version, else `src`, as its key).
fn pins_toml_entry(f: &kvaudit::targets::llama::tree::TreeFacts, root: &std::path::Path) -> String {
    let version = f.crate_version.clone().unwrap_or_else(|| "src".into());
    let mut out = format!(
        "\n[pins.\"{version}\"]\ncrate = \"llama-cpp-sys-2\"\nversion = \"{version}\"\n\
         llama_version = \"{}\"\nggml_version = \"{}\"\nstate_seq_version = {}\n\
         kv_state_has_n_rot = {}\nseq_pos_bookkeeping = \"{}\"\n",
        f.llama_version,
        f.ggml_version,
        f.state_seq_version,
        f.kv_state_has_n_rot,
        f.seq_pos_bookkeeping
    );
    if !f.kv_state_has_n_stream {
        out.push_str("kv_state_has_n_stream = false\n");
    }
    if !f.state_seq_has_header {
        out.push_str("state_seq_has_header = false\n");
    }
    if f.whole_state_has_outputs {
        out.push_str("whole_state_has_outputs = true\n");
    }
    if !f.swa_seq_dump_masks {
        out.push_str("swa_seq_dump_masks = false\n");
    }
    if f.crate_version.is_none() {
        out.push_str(&format!("# read from {}\n", root.display()));
    }
    out
}
