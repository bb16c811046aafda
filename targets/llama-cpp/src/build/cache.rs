//! The build cache: where it is, who may write it, the key of an entry, and the entries
//! themselves.
//!
//! Cache root: `$KVAUDIT_CACHE_DIR`, else `$XDG_CACHE_HOME/kvaudit`, else `~/.cache/kvaudit`,
//! created private to the user (mode 0700); an existing root that another user owns, or that
//! group or others may write, is refused (they could swap the library kvaudit loads). One entry
//! per key under `llama.cpp/VERSION-VARIANT-KEY16/` holding `libkvaudit_shim.so`,
//! `libllama_all.a`, `include/` and `manifest.json`. Entries are built in a temporary directory
//! and renamed into place, so a killed build never leaves a half entry behind.
//!
//! An entry is verified before its library is handed out for loading: the manifest must parse
//! and agree with the entry's name, the pin and this kvaudit (key, pin, recipe and ABI versions,
//! well-formed hashes and times), and the library must have the sha256 the manifest records
//! (`libllama_all.a` is checked the same way before a C program links against it). An entry that
//! fails is refused with an error naming the file and both hashes, never loaded and never rebuilt
//! behind the user's back: deleting it or `kvaudit target build LABEL --force` replaces it.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::fetch::non_empty_env;
use super::recipe::link_flags;
use super::recipe::{Recipe, RECIPE_VERSION};
use super::stamps::HashStamps;
use super::toolchain::Toolchain;
use crate::error::{IoContext as _, LlamaError};
use crate::pins::{Flag, Pin};
use crate::shim::{BuildManifest, BuiltShim, SHIM_ABI, SHIM_HEADER, SHIM_SOURCE};
use crate::sys;

/// File name of the shared object in a cache entry.
pub const SO_NAME: &str = "libkvaudit_shim.so";
/// File name of the static archive of all llama + ggml objects in a cache entry.
pub const STATIC_LIB_NAME: &str = "libllama_all.a";
/// File name of the manifest in a cache entry.
pub const MANIFEST_NAME: &str = "manifest.json";

/// The cache root: `$KVAUDIT_CACHE_DIR`, else `$XDG_CACHE_HOME/kvaudit`, else
/// `$HOME/.cache/kvaudit`.
pub fn cache_root() -> Result<PathBuf, LlamaError> {
    if let Some(dir) = non_empty_env("KVAUDIT_CACHE_DIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = non_empty_env("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(dir).join("kvaudit"));
    }
    match non_empty_env("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".cache").join("kvaudit")),
        None => Err(LlamaError::Host {
            message: "no cache directory: set KVAUDIT_CACHE_DIR, XDG_CACHE_HOME or HOME".into(),
        }),
    }
}

/// Creates the cache root `dir` private to the user (mode 0700, and so every missing folder
/// above it), or checks that an existing one is the user's and writable by nobody else.
pub fn prepare_cache_root(dir: &Path) -> Result<(), LlamaError> {
    match fs::metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .context_io(|| format!("creating the cache directory {}", dir.display())),
        Err(e) => Err(LlamaError::io(
            format!("reading the cache directory {}", dir.display()),
            e,
        )),
        Ok(meta) => {
            let refuse = |why: String| LlamaError::Cache {
                path: dir.to_path_buf(),
                message: format!(
                    "{why}: another user could replace a library kvaudit loads from this cache; \
                     use a directory of your own (`chmod 700` it, or set KVAUDIT_CACHE_DIR)"
                ),
            };
            if !meta.is_dir() {
                return Err(LlamaError::Cache {
                    path: dir.to_path_buf(),
                    message: "the cache directory is not a directory".into(),
                });
            }
            if meta.uid() != sys::current_uid() {
                return Err(refuse(format!(
                    "owned by uid {}, not by this user (uid {})",
                    meta.uid(),
                    sys::current_uid()
                )));
            }
            if meta.mode() & 0o022 != 0 {
                return Err(refuse(format!(
                    "writable by group or others (mode {:o})",
                    meta.mode() & 0o7777
                )));
            }
            Ok(())
        }
    }
}

/// An exclusive `flock` on `<cache>/build.lock`, released on drop (and by the kernel if the
/// process dies).
pub(super) struct BuildLock {
    file: fs::File,
}

impl BuildLock {
    /// Takes the lock of `cache` (a prepared cache root), saying on stderr when it has to wait
    /// (with `progress`).
    pub(super) fn acquire(cache: &Path, progress: bool) -> Result<BuildLock, LlamaError> {
        let path = cache.join("build.lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .context_io(|| format!("opening {}", path.display()))?;
        let got =
            sys::try_lock_exclusive(&file).context_io(|| format!("locking {}", path.display()))?;
        if !got {
            if progress {
                eprintln!("waiting for another kvaudit build ({})", path.display());
            }
            sys::lock_exclusive(&file).context_io(|| format!("locking {}", path.display()))?;
        }
        Ok(BuildLock { file })
    }
}

impl Drop for BuildLock {
    fn drop(&mut self) {
        sys::unlock(&self.file);
    }
}

/// The cache key: sha256 of everything that changes the output (pin, recipe, toolchain, the
/// tree's fingerprint, the shim's text, the link flags).
pub(super) fn cache_key(
    pin: &Pin,
    recipe: &Recipe,
    toolchain: &Toolchain,
    tree: &str,
) -> Result<String, LlamaError> {
    #[derive(Serialize)]
    struct KeyInput<'a> {
        recipe_version: u32,
        pin: String,
        recipe: &'a Recipe,
        toolchain: &'a Toolchain,
        tree: &'a str,
        shim_header: &'a str,
        shim_source: &'a str,
        #[serde(skip_serializing_if = "str::is_empty")]
        cov_source: &'a str,
        link_flags: Vec<String>,
        // Only builds with fixes have it, so every other key is what it was before fixes.
        #[serde(skip_serializing_if = "Vec::is_empty")]
        fixes: Vec<(String, String)>,
    }
    let input = KeyInput {
        recipe_version: RECIPE_VERSION,
        pin: pin.label(),
        recipe,
        toolchain,
        tree,
        shim_header: SHIM_HEADER,
        shim_source: SHIM_SOURCE,
        // Only `+cov` builds compile it; the others keep their keys.
        cov_source: if pin.variant.has(Flag::Cov) {
            super::cov::COV_SOURCE
        } else {
            ""
        },
        link_flags: link_flags(pin.variant, Path::new("$SHIM/exports.map"), "$SONAME"),
        // The patched tree's fingerprint already differs where a patch changed a file; the
        // patch bytes say which patch made it so.
        fixes: fix_records(pin)?,
    };
    let bytes = serde_json::to_vec(&input).map_err(|e| LlamaError::Compile {
        what: "hashing the cache key".into(),
        message: e.to_string(),
    })?;
    Ok(crate::files::sha256_hex(bytes))
}

/// sha256 of a file, hex; the error names the file.
pub fn file_sha256(path: &Path) -> Result<String, LlamaError> {
    crate::files::file_sha256(path).context_io(|| format!("reading {}", path.display()))
}

/// The fixes of `pin` as its key and manifest record them: (name, sha256 of the patch).
pub(super) fn fix_records(pin: &Pin) -> Result<Vec<(String, String)>, LlamaError> {
    Ok(super::patch::pin_fixes(pin)?
        .iter()
        .map(|f| (f.name.to_string(), f.patch_sha256()))
        .collect())
}

/// The directory of the entry for `pin` and `key` under the cache root `cache`:
/// `VERSION-VARIANT-KEY16`, with `+fix-NAME` after the variant for each fix.
pub(super) fn entry_dir(cache: &Path, pin: &Pin, key: &str) -> PathBuf {
    let fixes: String = pin.fixes.iter().map(|f| format!("+fix-{f}")).collect();
    cache.join("llama.cpp").join(format!(
        "{}-{}{fixes}-{}",
        pin.version,
        pin.variant,
        &key[..16]
    ))
}

/// The verified entry at `entry` for `key` and `pin`: `Ok(None)` when there is none; `Err` when
/// there is one that fails verification (see the module documentation).
pub(super) fn load_entry(
    entry: &Path,
    key: &str,
    pin: &Pin,
) -> Result<Option<BuiltShim>, LlamaError> {
    if !entry.exists() {
        return Ok(None);
    }
    let manifest_path = entry.join(MANIFEST_NAME);
    let broken = |message: String| LlamaError::Cache {
        path: manifest_path.clone(),
        message: format!(
            "{message}; refusing to use this cache entry (delete {} or run `kvaudit target \
             build {pin} --force`)",
            entry.display()
        ),
    };
    let text = fs::read_to_string(&manifest_path)
        .map_err(|e| broken(format!("cannot read the manifest: {e}")))?;
    let manifest: BuildManifest = serde_json::from_str(&text)
        .map_err(|e| broken(format!("the manifest does not parse: {e}")))?;
    if let Some(problem) = manifest_problem(&manifest, key, pin) {
        return Err(broken(problem));
    }
    let built = built_shim(entry, pin, manifest, false);
    // The library's hash is read again only when the file changed since the last lookup
    // (`stamps`): any write to it changes its change time, so tampering is still found.
    let cache = entry.parent().and_then(Path::parent).unwrap_or(entry);
    let mut hashes = HashStamps::open(cache, entry);
    regular_file(&built.so_path, entry, &pin.label())?;
    let actual = hashes.of(&built.so_path)?;
    check_hash(
        &built.so_path,
        &built.manifest.so_sha256,
        actual,
        entry,
        &pin.label(),
    )?;
    hashes.save();
    regular_file(&built.static_lib, entry, &pin.label())?;
    Ok(Some(built))
}

/// What is wrong with a manifest found for `key` and `pin`, if anything.
fn manifest_problem(m: &BuildManifest, key: &str, pin: &Pin) -> Option<String> {
    let is_sha256 =
        |s: &str| s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if m.key != key {
        return Some(format!(
            "the manifest records key {}, this build's key is {key}",
            m.key
        ));
    }
    if m.pin != pin.label() || m.version != pin.version || m.variant != pin.variant {
        return Some(format!(
            "the manifest records pin {} (version {}, {}), expected {pin}",
            m.pin, m.version, m.variant
        ));
    }
    if m.recipe_version != RECIPE_VERSION || m.shim_abi != SHIM_ABI {
        return Some(format!(
            "the manifest records recipe {} and shim ABI {}, this kvaudit has {RECIPE_VERSION} and \
             {SHIM_ABI}",
            m.recipe_version, m.shim_abi
        ));
    }
    if !is_sha256(&m.so_sha256) || !is_sha256(&m.static_lib_sha256) {
        return Some(format!(
            "the manifest's sha256 fields are not 64 lowercase hex digits ({:?}, {:?})",
            m.so_sha256, m.static_lib_sha256
        ));
    }
    if m.finished_unix < m.started_unix || !(m.build_seconds.is_finite() && m.build_seconds >= 0.0)
    {
        return Some(format!(
            "the manifest's times contradict each other (started {}, finished {}, {} s)",
            m.started_unix, m.finished_unix, m.build_seconds
        ));
    }
    None
}

/// Fails unless `path` is a regular file (not a symlink, which could point anywhere).
fn regular_file(path: &Path, entry: &Path, pin: &str) -> Result<(), LlamaError> {
    let meta = fs::symlink_metadata(path).context_io(|| format!("reading {}", path.display()))?;
    if !meta.file_type().is_file() {
        return Err(LlamaError::Cache {
            path: path.to_path_buf(),
            message: format!(
                "not a regular file; refusing to use this cache entry (delete {} or run \
                 `kvaudit target build {pin} --force`)",
                entry.display()
            ),
        });
    }
    Ok(())
}

/// Fails unless `path` (a file of the cache entry `entry` of `pin`) is a regular file whose
/// sha256 is `recorded`.
pub(super) fn verify_file(
    path: &Path,
    recorded: &str,
    entry: &Path,
    pin: &str,
) -> Result<(), LlamaError> {
    regular_file(path, entry, pin)?;
    check_hash(path, recorded, file_sha256(path)?, entry, pin)
}

/// Fails unless `actual`, the sha256 of `path` (a file of the cache entry `entry` of `pin`), is
/// `recorded`.
fn check_hash(
    path: &Path,
    recorded: &str,
    actual: String,
    entry: &Path,
    pin: &str,
) -> Result<(), LlamaError> {
    if actual != recorded {
        return Err(LlamaError::Tampered {
            file: path.to_path_buf(),
            entry: entry.to_path_buf(),
            pin: pin.to_string(),
            recorded: recorded.to_string(),
            actual,
        });
    }
    Ok(())
}

/// The [`BuiltShim`] of the entry at `entry`.
pub(super) fn built_shim(
    entry: &Path,
    pin: &Pin,
    manifest: BuildManifest,
    fresh: bool,
) -> BuiltShim {
    BuiltShim {
        pin: pin.clone(),
        dir: entry.to_path_buf(),
        so_path: entry.join(SO_NAME),
        include_dir: entry.join("include"),
        static_lib: entry.join(STATIC_LIB_NAME),
        manifest,
        fresh,
    }
}

/// Builds the entry `entry` for `key` and `pin`: `build` fills a temporary directory next to it
/// and returns the manifest it wrote there, which is then renamed into place. When another
/// process built the same key meanwhile, its entry is kept (it may have loaded it) unless
/// `force`.
pub(super) fn install_entry(
    entry: &Path,
    key: &str,
    pin: &Pin,
    force: bool,
    build: impl FnOnce(&Path) -> Result<BuildManifest, LlamaError>,
) -> Result<BuiltShim, LlamaError> {
    let parent = entry.parent().ok_or_else(|| LlamaError::Cache {
        path: entry.to_path_buf(),
        message: "cache entry has no parent".into(),
    })?;
    fs::create_dir_all(parent).context_io(|| format!("creating {}", parent.display()))?;
    remove_abandoned_builds(parent);
    let (tmp, nanos) = temporary_sibling(entry);
    let manifest = match build(&tmp) {
        Ok(m) => m,
        Err(e) => {
            fs::remove_dir_all(&tmp).ok();
            return Err(LlamaError::Building {
                pin: pin.label(),
                error: Box::new(e),
            });
        }
    };
    if !force {
        // Another process built the same key meanwhile: keep its entry, which it may already
        // have loaded, and drop ours.
        if let Some(built) = load_entry(entry, key, pin)? {
            fs::remove_dir_all(&tmp).ok();
            return Ok(built);
        }
    }
    if entry.exists() {
        // A forced rebuild. A process that has the old .so loaded keeps its mapping.
        let old = parent.join(format!(".old-{}-{}", std::process::id(), nanos));
        fs::rename(entry, &old).ok();
        fs::remove_dir_all(&old).ok();
    }
    if let Err(e) = fs::rename(&tmp, entry) {
        fs::remove_dir_all(&tmp).ok();
        if let Some(built) = load_entry(entry, key, pin)? {
            return Ok(built);
        }
        return Err(LlamaError::io(
            format!("moving the build into {}", entry.display()),
            e,
        ));
    }
    Ok(built_shim(entry, pin, manifest, true))
}

/// Where `dir` is made before it is renamed into place: `.tmp-NAME-PID-NANOS` beside it (a
/// name [`remove_abandoned_builds`] knows), and the nanoseconds in it.
pub(super) fn temporary_sibling(dir: &Path) -> (PathBuf, u32) {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    let name = format!(
        ".tmp-{}-{}-{nanos}",
        dir.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    );
    (dir.with_file_name(name), nanos)
}

/// Removes the temporary directories of builds whose process is gone (killed mid-build):
/// `.tmp-ENTRY-PID-NANOS` and `.old-PID-NANOS`.
pub(super) fn remove_abandoned_builds(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for path in entries.filter_map(|e| e.ok()).map(|e| e.path()) {
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if !(name.starts_with(".tmp-") || name.starts_with(".old-")) {
            continue;
        }
        let pid = name.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                fs::remove_dir_all(&path).ok();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;
    use crate::pins::Variant;

    #[test]
    fn abandoned_builds_are_removed_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let dead = dir.join(".tmp-0.1.156-release-abc-4000000000-1");
        let live = dir.join(format!(".tmp-0.1.156-release-abc-{}-2", std::process::id()));
        let entry = dir.join("0.1.156-release-abc");
        for d in [&dead, &live, &entry] {
            fs::create_dir_all(d).unwrap();
        }
        remove_abandoned_builds(dir);
        assert!(!dead.exists() && live.exists() && entry.exists());
    }

    #[test]
    fn a_new_cache_root_is_private_and_a_shared_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("a").join("kvaudit");
        prepare_cache_root(&root).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(root.parent().unwrap()), 0o700);
        prepare_cache_root(&root).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o777)).unwrap();
        let err = prepare_cache_root(&root).unwrap_err().to_string();
        assert!(
            err.contains("writable by group or others (mode 777)") && err.contains("chmod 700"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }

    /// A fake entry: a manifest that matches `key` and a "library" of a few bytes.
    fn fake_entry(cache: &Path, pin: &Pin, key: &str) -> PathBuf {
        let entry = entry_dir(cache, pin, key);
        fs::create_dir_all(&entry).unwrap();
        fs::write(entry.join(SO_NAME), b"not really a library").unwrap();
        fs::write(entry.join(STATIC_LIB_NAME), b"not really an archive").unwrap();
        let manifest = BuildManifest {
            pin: pin.label(),
            version: pin.version.clone(),
            variant: pin.variant,
            key: key.to_string(),
            recipe_version: RECIPE_VERSION,
            shim_abi: SHIM_ABI,
            source_dir: PathBuf::from("/src"),
            llama_version: "0.1.0-dev".into(),
            ggml_version: "0.19.0".into(),
            compiler_version: "cc".into(),
            units: vec![],
            link_command: vec![],
            unknown_cmake_defines: vec![],
            started_unix: 1,
            finished_unix: 2,
            build_seconds: 1.0,
            so_sha256: file_sha256(&entry.join(SO_NAME)).unwrap(),
            static_lib_sha256: file_sha256(&entry.join(STATIC_LIB_NAME)).unwrap(),
            objects: vec![],
            compiled: 0,
            fixes: vec![],
        };
        fs::write(
            entry.join(MANIFEST_NAME),
            serde_json::to_string(&manifest).unwrap(),
        )
        .unwrap();
        entry
    }

    #[test]
    fn entries_are_verified_before_use() {
        let dir = tempfile::tempdir().unwrap();
        let pin = Pin {
            version: "0.1.156".into(),
            variant: Variant::RELEASE,
            tree: None,
            fixes: Vec::new(),
        };
        let key = "ab".repeat(32);
        let entry = fake_entry(dir.path(), &pin, &key);
        assert!(load_entry(&entry, &key, &pin).unwrap().is_some());
        assert!(load_entry(&dir.path().join("none"), &key, &pin)
            .unwrap()
            .is_none());

        // Another key, another pin: refused, naming the manifest.
        let other_key = "cd".repeat(32);
        let err = load_entry(&entry, &other_key, &pin)
            .unwrap_err()
            .to_string();
        assert!(err.contains(MANIFEST_NAME) && err.contains("key"), "{err}");
        let assert_pin = Pin {
            variant: Variant::ASSERT,
            ..pin.clone()
        };
        let err = load_entry(&entry, &key, &assert_pin)
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected llama.cpp@0.1.156+assert"), "{err}");

        // One byte of the library changed: refused with both hashes.
        let so = entry.join(SO_NAME);
        let recorded = file_sha256(&so).unwrap();
        let mut bytes = fs::read(&so).unwrap();
        bytes[3] ^= 1;
        fs::write(&so, &bytes).unwrap();
        let actual = file_sha256(&so).unwrap();
        let err = load_entry(&entry, &key, &pin).unwrap_err().to_string();
        assert!(
            err.contains(&so.display().to_string())
                && err.contains(&recorded)
                && err.contains(&actual)
                && err.contains("--force"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");

        // A manifest that does not parse is refused too, not rebuilt over.
        fs::write(entry.join(MANIFEST_NAME), "{").unwrap();
        let err = load_entry(&entry, &key, &pin).unwrap_err().to_string();
        assert!(err.contains("does not parse"), "{err}");
    }
}
