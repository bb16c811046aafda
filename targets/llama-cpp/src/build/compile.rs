//! Compiling: every compile unit of the recipe, the shim included, as one `cc::Build` each, run
//! all at once on their own threads. cc's process-wide job server (as many tokens as cores, or
//! cargo's job server when there is one) keeps exactly that many compilers running, and no core
//! idles while one group finishes.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::objects::{FileHashes, Lookup, ObjectCache, Places};
use super::progress::{Progress, UnitLog};
use super::recipe::{CompileUnit, Lang, Recipe};
use super::toolchain::base_build;
use crate::error::LlamaError;
use crate::shim::UnitRecord;

/// Substitutes the placeholders of a recipe path.
fn resolve(path: &str, src: &Path, gen: &Path, shim: &Path) -> PathBuf {
    for (ph, real) in [("$SRC", src), ("$GEN", gen), ("$SHIM", shim)] {
        if let Some(rest) = path.strip_prefix(ph) {
            return real.join(rest.trim_start_matches('/'));
        }
    }
    PathBuf::from(path)
}

/// A `cc` build of `unit` compiling `files` (possibly none: the build then only names the
/// compiler and its flags), with `-MD` so the compiler lists what it read beside each object.
fn configure_unit(
    unit: &CompileUnit,
    places: &Places<'_>,
    files: &[PathBuf],
    obj_dir: &Path,
    log: &Arc<UnitLog>,
) -> cc::Build {
    let mut b = base_build(obj_dir);
    b.cpp(unit.lang == Lang::Cxx).std(unit.lang.std());
    b.message_logger(Some(log.clone() as Arc<dyn cc::BuildMessageLogger>));
    for inc in &unit.includes {
        b.include(resolve(inc, places.src, places.gen, places.shim));
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
    b.flag("-MD");
    b.files(files);
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

/// One source of a unit: where it is, and its cached object or the key to cache it under.
struct Planned {
    source: PathBuf,
    found: Lookup,
}

/// The units of one build, configured: per unit, its sources looked up in the object cache, a
/// `cc` build of those that missed and a log, in recipe order with the shim last.
pub(super) struct Compilation<'r, 'p> {
    units: Vec<&'r CompileUnit>,
    plans: Vec<Vec<Planned>>,
    /// Per unit, the sources its build compiles, in the order `cc` returns their objects.
    compiled: Vec<Vec<PathBuf>>,
    builds: Vec<cc::Build>,
    logs: Vec<Arc<UnitLog>>,
    places: Places<'p>,
    objects: &'r ObjectCache,
}

impl<'r, 'p> Compilation<'r, 'p> {
    /// Configures every unit of `recipe` over `places`, with fresh objects under
    /// `obj_root/<unit name>`: each source is looked up in `objects` first (keys take the
    /// toolchain's identity `toolchain_id`), and only the misses are compiled.
    pub(super) fn configure(
        recipe: &'r Recipe,
        places: Places<'p>,
        obj_root: &Path,
        objects: &'r ObjectCache,
        toolchain_id: &str,
        hashes: &mut FileHashes,
    ) -> Result<Compilation<'r, 'p>, LlamaError> {
        let units: Vec<&CompileUnit> = recipe
            .units
            .iter()
            .chain(std::iter::once(&recipe.shim))
            .collect();
        let logs: Vec<Arc<UnitLog>> = units.iter().map(|_| Arc::new(UnitLog::default())).collect();
        let (mut plans, mut compiled, mut builds) = (Vec::new(), Vec::new(), Vec::new());
        for (u, log) in units.iter().zip(&logs) {
            let obj_dir = obj_root.join(u.name());
            let command = command_line(&configure_unit(u, &places, &[], &obj_dir, log))?;
            let command = places.abstract_text(&command.join("\0"));
            let base = if u.group == "shim" {
                places.shim
            } else {
                places.src
            };
            let mut plan = Vec::new();
            for s in &u.sources {
                let source = base.join(s);
                let key =
                    ObjectCache::source_key(&command, toolchain_id, &places, &source, hashes)?;
                let found = objects.lookup(key, &places, hashes);
                plan.push(Planned { source, found });
            }
            // Biggest files first: a rough longest-job-first order, so the last job is short.
            let mut misses: Vec<(u64, PathBuf)> = plan
                .iter()
                .filter(|p| matches!(p.found, Lookup::Miss { .. }))
                .map(|p| {
                    (
                        fs::metadata(&p.source).map(|m| m.len()).unwrap_or(0),
                        p.source.clone(),
                    )
                })
                .collect();
            misses.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            let files: Vec<PathBuf> = misses.into_iter().map(|(_, p)| p).collect();
            builds.push(configure_unit(u, &places, &files, &obj_dir, log));
            compiled.push(files);
            plans.push(plan);
        }
        Ok(Compilation {
            units,
            plans,
            compiled,
            builds,
            logs,
            places,
            objects,
        })
    }

    /// How many sources this build compiles (the rest come from the object cache).
    pub(super) fn n_to_compile(&self) -> usize {
        self.plans.iter().map(|p| n_misses(p)).sum()
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

    /// Compiles what the object cache lacks, every unit at once, updating `display` meanwhile,
    /// and caches the new objects. Returns the objects (in the cache) of the llama.cpp and ggml
    /// units, and those of the shim, each in recipe order.
    pub(super) fn run(
        &self,
        display: &Progress,
        clock: Instant,
        hashes: &mut FileHashes,
    ) -> Result<(Vec<PathBuf>, Vec<PathBuf>), LlamaError> {
        let groups: Vec<(&str, usize)> = self
            .units
            .iter()
            .zip(&self.plans)
            .map(|(u, p)| (u.group.as_str(), n_misses(p)))
            .collect();
        let compiled: Vec<Result<Vec<PathBuf>, LlamaError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .units
                .iter()
                .zip(&self.builds)
                .zip(&self.logs)
                .zip(&self.plans)
                .map(|(((u, b), log), plan)| {
                    let work = n_misses(plan) > 0;
                    scope.spawn(move || {
                        if !work {
                            return Ok(Vec::new());
                        }
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
                display.update(&groups, &self.logs, clock.elapsed());
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
        for ((plan, sources), fresh) in self.plans.iter().zip(&self.compiled).zip(compiled) {
            per_unit.push(self.cache_and_order(plan, sources, fresh?, hashes)?);
        }
        let shim_objects = per_unit.pop().unwrap_or_default();
        Ok((per_unit.into_iter().flatten().collect(), shim_objects))
    }

    /// Stores a unit's fresh objects (of `sources`, in that order) in the cache and lists all
    /// its objects in source order.
    fn cache_and_order(
        &self,
        plan: &[Planned],
        sources: &[PathBuf],
        fresh: Vec<PathBuf>,
        hashes: &mut FileHashes,
    ) -> Result<Vec<PathBuf>, LlamaError> {
        // `cc` returns the objects in the order of its files, named `<hash>-<file stem>.o`.
        let mismatch = |what: String| LlamaError::Compile {
            what,
            message: "cc returned objects that do not match the sources it was given".into(),
        };
        if fresh.len() != sources.len() {
            return Err(mismatch(format!(
                "{} sources, {} objects",
                sources.len(),
                fresh.len()
            )));
        }
        let mut object_of: HashMap<&Path, PathBuf> = HashMap::new();
        for (source, obj) in sources.iter().zip(fresh) {
            let stem = source.file_stem().unwrap_or_default().to_string_lossy();
            let name = obj.file_name().unwrap_or_default().to_string_lossy();
            if !name.ends_with(&format!("-{stem}.o")) {
                return Err(mismatch(format!("{} as {name}", source.display())));
            }
            object_of.insert(source, obj);
        }
        let mut out = Vec::new();
        for p in plan {
            match &p.found {
                Lookup::Hit(obj) => out.push(obj.clone()),
                Lookup::Miss { source_key } => {
                    let obj = object_of
                        .get(p.source.as_path())
                        .ok_or_else(|| mismatch(format!("{} not compiled", p.source.display())))?;
                    let depfile = obj.with_extension("d");
                    out.push(self.objects.store(
                        source_key,
                        obj,
                        &depfile,
                        &self.places,
                        hashes,
                    )?);
                }
            }
        }
        Ok(out)
    }
}

fn n_misses(plan: &[Planned]) -> usize {
    plan.iter()
        .filter(|p| matches!(p.found, Lookup::Miss { .. }))
        .count()
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
