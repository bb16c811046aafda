//! Compiling: every compile unit of the recipe, the shim included, as one `cc::Build` each, run
//! all at once on their own threads. cc's process-wide job server (as many tokens as cores, or
//! cargo's job server when there is one) keeps exactly that many compilers running, and no core
//! idles while one group finishes.

use std::fs;
use std::path::{Path, PathBuf};

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::progress::{Progress, UnitLog};
use super::recipe::{CompileUnit, Lang, Recipe};
use super::toolchain::base_build;
use crate::targets::llama::error::LlamaError;
use crate::targets::llama::shim::UnitRecord;

/// Substitutes the placeholders of a recipe path.
fn resolve(path: &str, src: &Path, gen: &Path, shim: &Path) -> PathBuf {
    for (ph, real) in [("$SRC", src), ("$GEN", gen), ("$SHIM", shim)] {
        if let Some(rest) = path.strip_prefix(ph) {
            return real.join(rest.trim_start_matches('/'));
        }
    }
    PathBuf::from(path)
}

fn configure_unit(
    unit: &CompileUnit,
    src: &Path,
    gen: &Path,
    shim: &Path,
    obj_dir: &Path,
    log: &Arc<UnitLog>,
) -> cc::Build {
    let mut b = base_build(obj_dir);
    b.cpp(unit.lang == Lang::Cxx).std(unit.lang.std());
    b.message_logger(Some(log.clone() as Arc<dyn cc::BuildMessageLogger>));
    for inc in &unit.includes {
        b.include(resolve(inc, src, gen, shim));
    }
    for d in &unit.defines {
        match d.split_once('=') {
            Some((k, v)) => b.define(k, Some(v)),
            None => b.define(d, None::<&str>),
        };
    }
    for f in &unit.flags {
        b.flag(f);
    }
    // Biggest files first: a rough longest-job-first order, so the last job is a short one.
    let base = if unit.group == "shim" { shim } else { src };
    let mut files: Vec<(u64, PathBuf)> = unit
        .sources
        .iter()
        .map(|s| {
            let p = base.join(s);
            (fs::metadata(&p).map(|m| m.len()).unwrap_or(0), p)
        })
        .collect();
    files.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    b.files(files.into_iter().map(|(_, p)| p));
    b
}

fn command_line(b: &cc::Build) -> Result<Vec<String>, LlamaError> {
    let tool = b.try_get_compiler().map_err(|e| LlamaError::Compile {
        what: "finding the compiler of a compile unit".into(),
        message: e.to_string(),
    })?;
    let mut cmd = vec![tool.path().display().to_string()];
    cmd.extend(tool.args().iter().map(|a| a.to_string_lossy().into_owned()));
    Ok(cmd)
}

/// The units of one build, configured: one `cc` build and one log per unit, in recipe order
/// with the shim last.
pub(super) struct Compilation<'r> {
    units: Vec<&'r CompileUnit>,
    builds: Vec<cc::Build>,
    logs: Vec<Arc<UnitLog>>,
}

impl<'r> Compilation<'r> {
    /// Configures every unit of `recipe` over the tree `src`, the generated headers in `gen` and
    /// the shim sources in `shim`, with objects under `obj_root/<unit name>`.
    pub(super) fn configure(
        recipe: &'r Recipe,
        src: &Path,
        gen: &Path,
        shim: &Path,
        obj_root: &Path,
    ) -> Compilation<'r> {
        let units: Vec<&CompileUnit> = recipe
            .units
            .iter()
            .chain(std::iter::once(&recipe.shim))
            .collect();
        let logs: Vec<Arc<UnitLog>> = units.iter().map(|_| Arc::new(UnitLog::default())).collect();
        let builds = units
            .iter()
            .zip(&logs)
            .map(|(u, log)| configure_unit(u, src, gen, shim, &obj_root.join(u.name()), log))
            .collect();
        Compilation {
            units,
            builds,
            logs,
        }
    }

    /// What the manifest records of each unit, with `build_dir` (where the build runs) written
    /// as `entry_dir` (where it will be).
    pub(super) fn records(
        &self,
        build_dir: &Path,
        entry_dir: &Path,
    ) -> Result<Vec<UnitRecord>, LlamaError> {
        let (tmp_str, entry_str) = (
            build_dir.display().to_string(),
            entry_dir.display().to_string(),
        );
        self.units
            .iter()
            .zip(&self.builds)
            .map(|(u, b)| {
                Ok(UnitRecord {
                    name: u.name(),
                    n_sources: u.sources.len(),
                    // Recorded with the final entry path, not the temporary build directory.
                    command: command_line(b)?
                        .into_iter()
                        .map(|a| a.replace(&tmp_str, &entry_str))
                        .collect(),
                })
            })
            .collect()
    }

    /// Compiles every unit at once, updating `display` meanwhile. Returns the objects of the
    /// llama.cpp and ggml units, and those of the shim.
    pub(super) fn run(
        &self,
        display: &Progress,
        clock: Instant,
    ) -> Result<(Vec<PathBuf>, Vec<PathBuf>), LlamaError> {
        let objects: Vec<Result<Vec<PathBuf>, LlamaError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .units
                .iter()
                .zip(&self.builds)
                .zip(&self.logs)
                .map(|((u, b), log)| {
                    scope.spawn(move || {
                        b.try_compile_intermediates().map_err(|e| {
                            let stderr =
                                log.stderr.lock().map(|l| l.join("\n")).unwrap_or_default();
                            LlamaError::Compile {
                                what: format!("compiling {}", u.name()),
                                message: format!("{e}\n{stderr}"),
                            }
                        })
                    })
                })
                .collect();
            while !handles.iter().all(|h| h.is_finished()) {
                display.update(&self.units, &self.logs, clock.elapsed());
                std::thread::sleep(Duration::from_millis(200));
            }
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(LlamaError::Compile {
                            what: "compiling".into(),
                            message: "a compile thread panicked".into(),
                        })
                    })
                })
                .collect()
        });
        display.finish(clock.elapsed());
        let mut per_unit = Vec::new();
        for r in objects {
            per_unit.push(r?);
        }
        let shim_objects = per_unit.pop().unwrap_or_default();
        Ok((per_unit.into_iter().flatten().collect(), shim_objects))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_resolve() {
        let (s, g, h) = (Path::new("/s"), Path::new("/g"), Path::new("/h"));
        assert_eq!(
            resolve("$SRC/ggml/include", s, g, h),
            Path::new("/s/ggml/include")
        );
        assert_eq!(resolve("$GEN", s, g, h), Path::new("/g"));
        assert_eq!(resolve("$SHIM", s, g, h), Path::new("/h"));
    }
}
