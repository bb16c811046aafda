//! Builds one llama.cpp pin into a cached `libkvaudit_shim.so`, without cmake.
//!
//! The recipe is LLAMA-FACTS "Building without cmake": three groups of sources found by glob
//! rules (ggml core, the ggml CPU backend, llama), compiled with the `cc` crate used as a library
//! at run time, all groups at once so both cores stay busy, then one `c++ -shared` link of every
//! object plus the shim (`targets/llama-cpp/shim/kvaudit_shim.c`, embedded in this binary) with an
//! export map that leaves only `kvaudit_shim_*` visible.
//!
//! One file per concern:
//! - `fetch`: where the sources come from (`cargo fetch` of the pin's crate, or
//!   `--llama-src DIR`), globbing, and the tree's fingerprint;
//! - `cmake`: versions, options and define names read from the tree's CMake files;
//! - `recipe`: the compile units (sources, defines, flags, includes) of a tree and variant;
//! - `toolchain`: the host check and the compilers `cc` picks;
//! - `compile` and `link`: running the compilers, the archiver and the linker;
//! - `objects`: the object cache, keyed by contents (an edit recompiles what it reaches);
//! - `patch`: the patched copy of a pin's sources that a build with fixes compiles;
//! - `progress`: the progress display;
//! - `cache`: the cache root (private to the user), its lock, the key, and verified entries;
//! - `stamps`: what the last lookup read (file hashes, the toolchain), used again while the
//!   files it came from are unchanged, so that a lookup neither probes the compilers nor reads
//!   the tree again.
//!
//! The key hashes everything that changes the output: pin, variant, recipe (sources, defines,
//! flags), shim text, compiler identity and version, the environment variables `cc` reads, and
//! the sources' paths and contents (never their times: `touch` rebuilds nothing). A new key
//! compiles only the sources whose object the object cache lacks, then archives and links.

mod cache;
mod cmake;
mod compile;
pub mod cov;
mod fetch;
mod link;
mod objects;
mod patch;
mod progress;
mod recipe;
mod stamps;
mod toolchain;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

pub use self::cache::{
    cache_root, file_sha256, prepare_cache_root, MANIFEST_NAME, SO_NAME, STATIC_LIB_NAME,
};
pub use self::cmake::{cmake_define_names, cmake_version, version_header};
pub use self::fetch::{cargo_home, locate_or_fetch};
pub use self::recipe::unknown_cmake_defines;
pub use self::recipe::{flag_build, CompileUnit, FlagBuild, Lang, Recipe};
pub use super::shim::{BuildManifest, BuiltShim, UnitRecord, SHIM_HEADER, SHIM_SOURCE};

use self::cache::{cache_key, entry_dir, install_entry, load_entry, BuildLock};
use self::compile::Compilation;
use self::fetch::tree_fingerprint;
use self::link::{archive, link_shared};
use self::objects::{FileHashes, ObjectCache, Places};
use self::progress::Progress;
use self::recipe::{check_tree_versions, RECIPE_VERSION};
use self::recipe::{glob_sources, link_flags, EXPORT_MAP};
use self::stamps::HashStamps;
use self::toolchain::{check_host, Toolchain};
use super::error::{IoContext as _, LlamaError};
use super::pins::Pin;
use super::shim::SHIM_ABI;
use super::startup::mark;
use super::tree::normalize_tree;

/// What to build: a pin and variant, where its sources are, and where the cache is.
#[derive(Debug, Clone)]
pub struct BuildSpec {
    /// The pin and variant.
    pub pin: Pin,
    /// A user-given llama.cpp tree (the directory with `include/llama.h`, or a directory with a
    /// `llama.cpp/` subdirectory such as an unpacked `llama-cpp-sys-2` crate). `None`: fetch
    /// the pin's crate with cargo.
    pub llama_src: Option<PathBuf>,
    /// Rebuild even when a cache entry with the same key exists.
    pub force: bool,
    /// Cache root; `None`: [`cache_root`].
    pub cache_dir: Option<PathBuf>,
}

impl BuildSpec {
    /// A spec for `pin` with the pin's own sources (a source tree's pin: that tree) and the
    /// default cache.
    pub fn new(pin: Pin) -> BuildSpec {
        BuildSpec {
            llama_src: pin.tree.clone(),
            pin,
            force: false,
            cache_dir: None,
        }
    }
}

/// `kvaudit target build LABEL [--llama-src DIR] [--force]`: builds (or finds in the cache) the
/// shim for `label` with a progress display, and prints where it is.
pub fn build_command(
    label: &str,
    llama_src: Option<&Path>,
    force: bool,
) -> Result<BuiltShim, LlamaError> {
    let pin = Pin::parse(label)?;
    let spec = BuildSpec {
        // A source tree's label names its sources; `--llama-src` replaces a pin's crate.
        llama_src: llama_src
            .map(Path::to_path_buf)
            .or_else(|| pin.tree.clone()),
        pin,
        force,
        cache_dir: None,
    };
    let built = ensure_built(&spec, true)?;
    eprintln!(
        "{}: {} ({})",
        built.pin,
        built.so_path.display(),
        if built.fresh {
            format!(
                "built in {:.0} s, {} of {} sources compiled",
                built.manifest.build_seconds,
                built.manifest.compiled,
                built.manifest.objects.len()
            )
        } else {
            "cached".to_string()
        }
    );
    Ok(built)
}

/// Returns the cached build for `spec`, building it first when the cache has no entry for the
/// current key (or `spec.force` is set). With `progress`, reports progress on stderr. A cache
/// entry that fails verification (a changed library, a manifest that contradicts itself) is an
/// error, not a reason to rebuild: see the `cache` module.
pub fn ensure_built(spec: &BuildSpec, progress: bool) -> Result<BuiltShim, LlamaError> {
    mark("build lookup: start");
    check_host()?;
    let info = &spec.pin.info()?;
    let cache = match &spec.cache_dir {
        Some(dir) => dir.clone(),
        None => cache_root()?,
    };
    prepare_cache_root(&cache)?;
    let src = match &spec.llama_src {
        Some(dir) => normalize_tree(dir)?,
        None => locate_or_fetch(info, &cache, progress)?,
    };
    let src = if spec.pin.fixes.is_empty() {
        src
    } else if let Some(dir) = &spec.llama_src {
        return Err(LlamaError::Pin {
            message: format!(
                "{}: fixes are made for a pin's own sources, not for {}: apply the patches \
                 under corpora/fixes/ to that tree (`patch -p1`) and build it without `+fix:`",
                spec.pin,
                dir.display()
            ),
        });
    } else {
        patch::patched_tree(&src, &spec.pin, &cache, progress)?
    };
    mark("build lookup: sources found");
    let recipe = Recipe::for_tree(&src, &spec.pin)?;
    check_tree_versions(&spec.pin, info, &recipe, &src);
    mark("build lookup: recipe read");
    let toolchain = stamps::toolchain(&cache)?;
    mark("build lookup: toolchain detected");
    let mut hashes = HashStamps::open(&cache, &src);
    let fingerprint = tree_fingerprint(&src, &recipe, &mut hashes)?;
    hashes.save();
    mark("build lookup: tree hashed");
    let key = cache_key(&spec.pin, &recipe, &toolchain, &fingerprint)?;
    let entry = entry_dir(&cache, &spec.pin, &key);
    if !spec.force {
        if let Some(built) = load_entry(&entry, &key, &spec.pin)? {
            mark("build lookup: entry verified");
            // The tree is the one the entry was built from (its key holds the tree's
            // fingerprint): its CMake files were read then, and their unknown defines recorded.
            warn_unknown_defines(&spec.pin, &src, &built.manifest.unknown_cmake_defines);
            return Ok(built);
        }
    }
    let unknown_defines = unknown_cmake_defines(&src, &recipe)?;
    warn_unknown_defines(&spec.pin, &src, &unknown_defines);
    // One build at a time per cache, across threads and processes (parallel tests ask for pins
    // at once): a build already uses every core, and two builds of one key would race on its
    // entry. Whoever waited finds the entry built and takes it.
    let _lock = BuildLock::acquire(&cache, progress)?;
    if !spec.force {
        if let Some(built) = load_entry(&entry, &key, &spec.pin)? {
            return Ok(built);
        }
    }
    let started = SystemTime::now();
    let clock = Instant::now();
    install_entry(&entry, &key, &spec.pin, spec.force, |tmp| {
        let build = EntryBuild {
            pin: &spec.pin,
            src: &src,
            recipe: &recipe,
            toolchain: &toolchain,
            key: &key,
            cache: &cache,
            entry: &entry,
            tmp,
            progress,
        };
        build.run(unknown_defines, started, clock)
    })
}

/// Says which defines the tree's CMake files name that kvaudit neither passes nor knows, if any.
fn warn_unknown_defines(pin: &Pin, src: &Path, unknown_defines: &[String]) {
    if !unknown_defines.is_empty() {
        eprintln!(
            "warning: {}: {} names defines that kvaudit neither passes nor knows: {}. A define \
             left out switches a feature off silently: check whether the default cmake build \
             sets it, then pass it or list it in CMAKE_DEFINES_NOT_PASSED \
             (targets/llama-cpp/src/build/cmake.rs).",
            pin,
            src.join("**/CMakeLists.txt").display(),
            unknown_defines.join(", ")
        );
    }
}

/// Compiles the shim alone (`-fsyntax-only`, seconds) against the llama.h of the tree at `src`
/// (a root as [`normalize_tree`] returns it), with the defines the tree's API needs: whether a
/// build of the tree could drive it, without building llama.cpp. `Err` names the first errors.
pub fn check_shim(src: &Path) -> Result<(), LlamaError> {
    check_host()?;
    // The facts first: a tree the shim cannot drive is said as such, not as compile errors.
    super::tree::tree_facts(src)?;
    let header = fs::read_to_string(src.join("include/llama.h"))
        .context_io(|| format!("reading {}", src.join("include/llama.h").display()))?;
    let cache = cache_root()?;
    prepare_cache_root(&cache)?;
    let toolchain = stamps::toolchain(&cache)?;
    // A scratch directory of this process under the probe directory, removed afterwards.
    let scratch = cache
        .join("llama.cpp")
        .join("probe")
        .join(format!("shim-check-{}", std::process::id()));
    fs::create_dir_all(&scratch).context_io(|| format!("creating {}", scratch.display()))?;
    let result = check_shim_in(
        src,
        &super::tree::shim_defines(&header),
        &toolchain,
        &scratch,
    );
    fs::remove_dir_all(&scratch).ok();
    result
}

fn check_shim_in(
    src: &Path,
    defines: &[String],
    toolchain: &Toolchain,
    scratch: &Path,
) -> Result<(), LlamaError> {
    for (name, text) in [
        ("kvaudit_shim.h", SHIM_HEADER),
        ("kvaudit_shim.c", SHIM_SOURCE),
    ] {
        let path = scratch.join(name);
        fs::write(&path, text).context_io(|| format!("writing {}", path.display()))?;
    }
    let mut cmd = std::process::Command::new(&toolchain.cxx);
    cmd.args(["-x", "c++", "-std=gnu++17", "-fsyntax-only"])
        .arg(format!("-I{}", scratch.display()))
        .arg(format!("-I{}", src.join("include").display()))
        .arg(format!("-I{}", src.join("ggml/include").display()));
    for d in defines {
        cmd.arg(format!("-D{d}"));
    }
    let out = cmd
        .arg(scratch.join("kvaudit_shim.c"))
        .output()
        .context_io(|| format!("running {}", toolchain.cxx.display()))?;
    if out.status.success() {
        return Ok(());
    }
    let errors: Vec<String> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| l.split_once("error: ").map(|(_, e)| e.to_string()))
        .take(3)
        .collect();
    Err(LlamaError::Compile {
        what: format!("the shim against {}", src.join("include/llama.h").display()),
        message: errors.join("; "),
    })
}

/// The cache's entries and their manifests (unverified: `load_entry` verifies an entry before
/// it is used). An entry whose manifest does not parse is left out.
fn read_entries(cache: &Path) -> Vec<(PathBuf, BuildManifest)> {
    let mut entries = Vec::new();
    if let Ok(read) = fs::read_dir(cache.join("llama.cpp")) {
        for e in read.filter_map(Result::ok) {
            let manifest = e.path().join(MANIFEST_NAME);
            let Ok(text) = fs::read_to_string(&manifest) else {
                continue; // fetch/, probe/, objects/: not entries
            };
            if let Ok(m) = serde_json::from_str::<BuildManifest>(&text) {
                entries.push((e.path(), m));
            }
        }
    }
    entries
}

/// The labels of the builds in the cache (`kvaudit target list`), each with its entries' count:
/// an entry may be of an older key (an older shim or compiler), which the next use rebuilds.
pub fn cached_labels(
    cache_dir: Option<&Path>,
) -> Result<std::collections::BTreeMap<String, usize>, LlamaError> {
    let cache = match cache_dir {
        Some(d) => d.to_path_buf(),
        None => cache_root()?,
    };
    let mut out = std::collections::BTreeMap::new();
    for (_, m) in read_entries(&cache) {
        *out.entry(m.pin).or_insert(0) += 1;
    }
    Ok(out)
}

/// What `kvaudit target gc` removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Entries removed (older builds of the same pin and tree), and patched trees of fixes no
    /// remaining entry was built from.
    pub entries: Vec<PathBuf>,
    /// Objects removed from the object cache (no remaining entry links them).
    pub objects: usize,
    /// Bytes freed, entries and objects together.
    pub bytes: u64,
}

/// `kvaudit target gc`: keeps, for each pin and source tree, the newest cache entry, removes
/// the older ones (each edit of a tree makes an entry), the builds of source trees that no longer
/// exist, the builds with a fix whose patch changed or is gone, the patched trees no remaining
/// entry was built from, and every cached object that no remaining entry was linked from. With `dry_run`, says what it would remove and removes
/// nothing. Holds the build lock, so no build runs meanwhile.
pub fn collect_garbage(cache_dir: Option<&Path>, dry_run: bool) -> Result<Reclaimed, LlamaError> {
    let cache = match cache_dir {
        Some(d) => d.to_path_buf(),
        None => cache_root()?,
    };
    prepare_cache_root(&cache)?;
    let _lock = BuildLock::acquire(&cache, true)?;
    let mut entries = read_entries(&cache);
    // Newest first within each (pin, tree); the first of each group stays.
    entries.sort_by(|a, b| {
        (
            &a.1.pin,
            &a.1.source_dir,
            std::cmp::Reverse(a.1.finished_unix),
        )
            .cmp(&(
                &b.1.pin,
                &b.1.source_dir,
                std::cmp::Reverse(b.1.finished_unix),
            ))
    });
    let objects = ObjectCache::open(&cache);
    let mut out = Reclaimed::default();
    let mut keep = std::collections::BTreeSet::new();
    let mut seen = std::collections::BTreeSet::new();
    for (dir, m) in &entries {
        // A source tree's build whose tree is gone can never be asked for again, nor a build
        // with a fix this kvaudit no longer has or has other patch bytes of (its label names
        // another build now).
        let orphaned =
            (m.version == super::pins::SRC_VERSION && !m.source_dir.exists()) || stale_fixes(m);
        if !orphaned && seen.insert((m.pin.clone(), m.source_dir.clone())) {
            keep.extend(m.objects.iter().map(|o| objects.path_of(o)));
        } else {
            out.bytes += dir_size(dir);
            out.entries.push(dir.clone());
        }
    }
    if !dry_run {
        for dir in &out.entries {
            fs::remove_dir_all(dir).context_io(|| format!("removing {}", dir.display()))?;
        }
    }
    // A patched tree stays while an entry that stays was built from it.
    let used: Vec<PathBuf> = entries
        .iter()
        .filter(|(dir, _)| !out.entries.contains(dir))
        .map(|(_, m)| m.source_dir.clone())
        .collect();
    for tree in patch::unused_trees(&cache, &used) {
        out.bytes += dir_size(&tree);
        if !dry_run {
            fs::remove_dir_all(&tree).context_io(|| format!("removing {}", tree.display()))?;
        }
        out.entries.push(tree);
    }
    let (n, bytes) = objects::collect_garbage(&objects, &keep, dry_run)?;
    out.objects = n;
    out.bytes += bytes;
    Ok(out)
}

/// Whether the entry of `m` was built with a fix that is gone or whose patch changed since.
fn stale_fixes(m: &BuildManifest) -> bool {
    m.fixes
        .iter()
        .any(|(name, sha)| super::fixes::find(name).map_or(true, |f| &f.patch_sha256() != sha))
}

fn dir_size(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|r| {
            r.filter_map(Result::ok)
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_size(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// One build of a cache entry into its temporary directory `tmp`.
struct EntryBuild<'a> {
    pin: &'a Pin,
    src: &'a Path,
    recipe: &'a Recipe,
    toolchain: &'a Toolchain,
    key: &'a str,
    /// The cache root (its object cache serves and keeps the objects).
    cache: &'a Path,
    /// Where the entry will be once built.
    entry: &'a Path,
    tmp: &'a Path,
    progress: bool,
}

impl EntryBuild<'_> {
    /// Writes the generated headers and the shim, compiles, archives, links, and writes the
    /// manifest last (an entry without a manifest is never used).
    fn run(
        &self,
        unknown_cmake_defines: Vec<String>,
        started: SystemTime,
        clock: Instant,
    ) -> Result<BuildManifest, LlamaError> {
        let (tmp, src, recipe) = (self.tmp, self.src, self.recipe);
        let gen = tmp.join("gen");
        let shim_dir = tmp.join("shim");
        let include = tmp.join("include");
        for d in [&gen, &shim_dir, &include] {
            fs::create_dir_all(d).context_io(|| format!("creating {}", d.display()))?;
        }
        for (path, text) in [
            (gen.join("ggml-version.h"), recipe.ggml_version_h.as_str()),
            (gen.join("llama-version.h"), recipe.llama_version_h.as_str()),
            (shim_dir.join("kvaudit_shim.h"), SHIM_HEADER),
            (shim_dir.join("kvaudit_shim.c"), SHIM_SOURCE),
            (shim_dir.join("exports.map"), EXPORT_MAP),
            (shim_dir.join(cov::COV_FILE), cov::COV_SOURCE),
        ] {
            fs::write(&path, text).context_io(|| format!("writing {}", path.display()))?;
        }
        for dir in ["include", "ggml/include"] {
            for rel in glob_sources(src, dir, false, &["h"], &[])? {
                let name = Path::new(&rel).file_name().unwrap_or_default();
                fs::copy(src.join(&rel), include.join(name))
                    .context_io(|| format!("copying {rel}"))?;
            }
        }

        let places = Places {
            src,
            gen: &gen,
            shim: &shim_dir,
        };
        let objects = ObjectCache::open(self.cache);
        let toolchain_id =
            serde_json::to_string(self.toolchain).map_err(|e| LlamaError::Compile {
                what: "describing the toolchain".into(),
                message: e.to_string(),
            })?;
        let mut hashes = FileHashes::default();
        let compilation = Compilation::configure(
            recipe,
            places,
            &tmp.join("obj"),
            &objects,
            &toolchain_id,
            &mut hashes,
        )?;
        let units_record = compilation.records(tmp, self.entry)?;
        let n_cached = recipe.n_sources() + 1 - compilation.n_to_compile();
        if self.progress && n_cached > 0 {
            eprintln!(
                "building {}: {n_cached} of {} objects unchanged, from the object cache",
                self.pin,
                recipe.n_sources() + 1
            );
        }
        let display = Progress::new(self.progress, self.pin, compilation.n_to_compile());
        let (llama_objects, shim_objects) = compilation.run(&display, clock, &mut hashes)?;

        // libllama_all.a, for standalone C reproducers.
        let static_lib = tmp.join(STATIC_LIB_NAME);
        archive(&llama_objects, &static_lib, &tmp.join("obj"))?;

        // The shared object: all objects and the shim, only kvaudit_shim_* exported.
        let so = tmp.join(SO_NAME);
        let soname = format!(
            "libkvaudit_shim-{}-{}-{}.so",
            self.pin.version,
            self.pin.variant,
            &self.key[..16]
        );
        let flags = link_flags(self.pin.variant, &shim_dir.join("exports.map"), &soname);
        link_shared(
            &self.toolchain.cxx,
            &flags,
            &so,
            &llama_objects,
            &shim_objects,
        )?;
        fs::remove_dir_all(tmp.join("obj")).ok();

        let mut link_command = vec![self.toolchain.cxx.display().to_string()];
        link_command.extend(flags);
        link_command.extend([
            "-o".to_string(),
            self.entry.join(SO_NAME).display().to_string(),
        ]);
        link_command.push(format!("<{} objects> <shim object>", llama_objects.len()));
        link_command.extend(["-lpthread".to_string(), "-lm".to_string()]);

        let finished = SystemTime::now();
        let secs = |t: SystemTime| {
            t.duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        };
        let manifest = BuildManifest {
            pin: self.pin.label(),
            version: self.pin.version.clone(),
            variant: self.pin.variant,
            key: self.key.to_string(),
            recipe_version: RECIPE_VERSION,
            shim_abi: SHIM_ABI,
            source_dir: src.to_path_buf(),
            llama_version: recipe.llama_version.clone(),
            ggml_version: recipe.ggml_version.clone(),
            compiler_version: self.toolchain.version.clone(),
            units: units_record,
            link_command,
            unknown_cmake_defines,
            started_unix: secs(started),
            finished_unix: secs(finished),
            build_seconds: clock.elapsed().as_secs_f64(),
            so_sha256: file_sha256(&so)?,
            static_lib_sha256: file_sha256(&static_lib)?,
            objects: llama_objects
                .iter()
                .chain(&shim_objects)
                .map(|o| objects.name_of(o))
                .collect(),
            compiled: compilation.n_to_compile(),
            fixes: cache::fix_records(self.pin)?,
        };
        // Written last: an entry without a manifest is never used.
        let manifest_path = tmp.join(MANIFEST_NAME);
        let text = serde_json::to_string_pretty(&manifest).map_err(|e| LlamaError::Cache {
            path: manifest_path.clone(),
            message: format!("serializing the manifest: {e}"),
        })?;
        fs::write(&manifest_path, text)
            .context_io(|| format!("writing {}", manifest_path.display()))?;
        Ok(manifest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pins::Variant;

    #[test]
    fn a_llama_src_that_is_a_symlink_loop_is_one_line_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let looped = dir.path().join("loop");
        std::os::unix::fs::symlink(&looped, &looped).unwrap();
        let spec = BuildSpec {
            pin: Pin {
                version: "0.1.156".into(),
                variant: Variant::RELEASE,
                tree: None,
                fixes: Vec::new(),
            },
            llama_src: Some(looped.clone()),
            force: false,
            cache_dir: Some(dir.path().join("cache")),
        };
        let err = ensure_built(&spec, false).unwrap_err().to_string();
        assert!(
            err.starts_with(&looped.display().to_string())
                && err.contains("cannot read this llama.cpp tree"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }

    #[test]
    fn gc_removes_builds_of_changed_patches_and_the_trees_only_they_used() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        prepare_cache_root(&cache).unwrap();
        let fix = crate::fixes::FIXES[0];
        let entry = |name: &str, sha: String| {
            let tree = patch::patched_root(&cache).join(name);
            fs::create_dir_all(&tree).unwrap();
            let entry = cache.join("llama.cpp").join(name);
            fs::create_dir_all(&entry).unwrap();
            let manifest = serde_json::json!({
                "pin": format!("llama.cpp@0.1.161+fix:{}", fix.name), "version": "0.1.161",
                "variant": "release", "key": name, "recipe_version": 0, "shim_abi": 0,
                "source_dir": tree, "llama_version": "", "ggml_version": "",
                "compiler_version": "", "units": [], "link_command": [],
                "unknown_cmake_defines": [], "started_unix": 1, "finished_unix": 2,
                "build_seconds": 1.0, "so_sha256": "", "static_lib_sha256": "",
                "fixes": [[fix.name, sha]],
            });
            fs::write(entry.join(MANIFEST_NAME), manifest.to_string()).unwrap();
            (entry, tree)
        };
        let (current, current_tree) = entry("current", fix.patch_sha256());
        let (stale, stale_tree) = entry("stale", "0".repeat(64));
        let unused_tree = patch::patched_root(&cache).join("unused");
        fs::create_dir_all(&unused_tree).unwrap();
        let reclaimed = collect_garbage(Some(&cache), false).unwrap();
        assert!(current.exists() && current_tree.exists());
        assert!(!stale.exists() && !stale_tree.exists() && !unused_tree.exists());
        assert_eq!(reclaimed.entries.len(), 3, "{reclaimed:?}");
    }

    #[test]
    fn globbing_does_not_follow_a_link_back_up_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        fs::create_dir_all(src.join("sub")).unwrap();
        fs::write(src.join("a.cpp"), "").unwrap();
        fs::write(src.join("sub/b.cpp"), "").unwrap();
        std::os::unix::fs::symlink(&src, src.join("sub/up")).unwrap();
        std::os::unix::fs::symlink(src.join("a.cpp"), src.join("sub/c.cpp")).unwrap();
        let found = glob_sources(dir.path(), "src", true, &["cpp"], &[]).unwrap();
        assert_eq!(found, ["src/a.cpp", "src/sub/b.cpp", "src/sub/c.cpp"]);
    }
}
