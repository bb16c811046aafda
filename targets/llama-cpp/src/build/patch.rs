//! The patched source tree of a pin with fixes (`llama.cpp@0.1.161+fix:NAME`): the pin's
//! pristine tree copied once into the cache and each fix's patch applied to the copy, exactly
//! ([`crate::fixes::apply_patch`]); the build then sees an ordinary tree.
//!
//! One tree per pin and set of fixes, at `llama.cpp/patched/VERSION-ID16/`, where the id
//! hashes the version and each fix's name and patch bytes: a changed patch is another tree.
//! It is made under the build lock in a temporary folder and renamed into place with
//! `applied.json` (what was applied, from where) written last, so a half-made tree is never
//! used. The copy keeps every file's path under the tree's root, so the object cache serves
//! every source the patches do not reach (an object's key holds its `$SRC`-relative name and
//! contents, never the tree's location): a one-file fix compiles one file, then links.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::cache::{remove_abandoned_builds, temporary_sibling, BuildLock};
use crate::error::{IoContext as _, LlamaError};
use crate::fixes::{self, EmbeddedFix};
use crate::pins::Pin;

/// The record a patched tree's folder holds once it is complete.
pub const APPLIED_NAME: &str = "applied.json";

/// What `applied.json` records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The tree's id (the folder name's hash, whole).
    pub id: String,
    /// The pin version whose sources were copied.
    pub version: String,
    /// The pristine tree it was copied from.
    pub pristine: PathBuf,
    /// The fixes applied, in order: (name, sha256 of the patch).
    pub fixes: Vec<(String, String)>,
}

/// The folder that holds the patched trees under the cache root `cache`.
pub(super) fn patched_root(cache: &Path) -> PathBuf {
    cache.join("llama.cpp").join("patched")
}

/// The fixes of `pin`, each with its built-in patch, in name order.
pub(super) fn pin_fixes(pin: &Pin) -> Result<Vec<&'static EmbeddedFix>, LlamaError> {
    pin.fixes.iter().map(|name| fixes::find(name)).collect()
}

/// The tree `pristine` (a pin's sources) with `pin`'s fixes applied, made under `cache` if it
/// is not there yet. `Err` names a patch that does not apply, with its hunk.
pub(super) fn patched_tree(
    pristine: &Path,
    pin: &Pin,
    cache: &Path,
    progress: bool,
) -> Result<PathBuf, LlamaError> {
    let fixes = pin_fixes(pin)?;
    let (dir, made) = tree_of(pristine, &pin.version, &fixes, cache)?;
    if progress && made {
        eprintln!(
            "{pin}: {} applied to a copy of {} in {}",
            pin.fixes.join(", "),
            pristine.display(),
            dir.display()
        );
    }
    Ok(dir)
}

/// [`patched_tree`] of `fixes` applied to the sources of `version` at `pristine`, and whether
/// this call made it.
fn tree_of(
    pristine: &Path,
    version: &str,
    fixes: &[&EmbeddedFix],
    cache: &Path,
) -> Result<(PathBuf, bool), LlamaError> {
    let applied = Applied {
        id: tree_id(version, fixes),
        version: version.to_string(),
        pristine: pristine.to_path_buf(),
        fixes: fixes
            .iter()
            .map(|f| (f.name.to_string(), f.patch_sha256()))
            .collect(),
    };
    let root = patched_root(cache);
    let dir = root.join(format!("{version}-{}", &applied.id[..16]));
    if is_complete(&dir, &applied) {
        return Ok((dir, false));
    }
    // Released before the build takes it again (an flock is per open file, even in one
    // process).
    let _lock = BuildLock::acquire(cache, false)?;
    if is_complete(&dir, &applied) {
        return Ok((dir, false));
    }
    fs::create_dir_all(&root).context_io(|| format!("creating {}", root.display()))?;
    remove_abandoned_builds(&root);
    let (tmp, _) = temporary_sibling(&dir);
    let made = make_tree(pristine, &tmp, fixes, &applied);
    if let Err(e) = made {
        fs::remove_dir_all(&tmp).ok();
        return Err(e);
    }
    if dir.exists() {
        // A tree without its record: a copy that was stopped before it was complete.
        fs::remove_dir_all(&dir).context_io(|| format!("removing {}", dir.display()))?;
    }
    fs::rename(&tmp, &dir)
        .context_io(|| format!("moving the patched tree to {}", dir.display()))?;
    Ok((dir, true))
}

/// sha256 of the version and each fix's name and patch bytes, hex.
fn tree_id(version: &str, fixes: &[&EmbeddedFix]) -> String {
    let mut text = format!("kvaudit patched tree v1\0{version}\0");
    for f in fixes {
        text.push_str(&format!("{}\0{}\0", f.name, f.patch));
    }
    crate::files::sha256_hex(text)
}

/// Whether `dir` holds a complete tree recording exactly `applied`.
fn is_complete(dir: &Path, applied: &Applied) -> bool {
    fs::read_to_string(dir.join(APPLIED_NAME))
        .ok()
        .and_then(|t| serde_json::from_str::<Applied>(&t).ok())
        .is_some_and(|a| a.id == applied.id && a.fixes == applied.fixes)
}

/// Copies `pristine` to `tmp`, applies the patches, and writes `applied.json` last.
fn make_tree(
    pristine: &Path,
    tmp: &Path,
    fixes: &[&EmbeddedFix],
    applied: &Applied,
) -> Result<(), LlamaError> {
    copy_tree(pristine, tmp)?;
    for fix in fixes {
        let fail = |message: String| LlamaError::Fix {
            name: fix.name.to_string(),
            message,
        };
        let files = fixes::parse_patch(fix.patch).map_err(&fail)?;
        for file in &files {
            let path = tmp.join(&file.path);
            let text = fs::read_to_string(&path)
                .map_err(|e| fail(format!("{} of {}: {e}", file.path, pristine.display())))?;
            let patched = fixes::apply_patch(&text, file)
                .map_err(|e| fail(format!("{e} (in {})", pristine.display())))?;
            // A fresh file, not a write through: the copy may share nothing with the pristine
            // tree, but a rename also gives the patched file a change time of its own.
            crate::files::write_atomically(&path, patched)
                .context_io(|| format!("writing {}", path.display()))?;
        }
    }
    let record = serde_json::to_string_pretty(applied).map_err(|e| LlamaError::Cache {
        path: tmp.join(APPLIED_NAME),
        message: format!("serializing: {e}"),
    })?;
    fs::write(tmp.join(APPLIED_NAME), record)
        .context_io(|| format!("writing {}", tmp.join(APPLIED_NAME).display()))
}

/// Copies the tree `from` to `to` (which must not exist): folders, files, and symlinks as
/// symlinks (a link is never followed, as globbing does not follow one).
fn copy_tree(from: &Path, to: &Path) -> Result<(), LlamaError> {
    fs::create_dir_all(to).context_io(|| format!("creating {}", to.display()))?;
    let read = fs::read_dir(from).context_io(|| format!("reading {}", from.display()))?;
    for entry in read {
        let entry = entry.context_io(|| format!("reading {}", from.display()))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry
            .file_type()
            .context_io(|| format!("reading {}", src.display()))?;
        if kind.is_dir() {
            copy_tree(&src, &dst)?;
        } else if kind.is_symlink() {
            let target = fs::read_link(&src).context_io(|| format!("reading {}", src.display()))?;
            std::os::unix::fs::symlink(&target, &dst)
                .context_io(|| format!("linking {}", dst.display()))?;
        } else {
            fs::copy(&src, &dst).context_io(|| format!("copying {}", src.display()))?;
        }
    }
    Ok(())
}

/// The patched trees under `cache` that `used` does not name, each with its size: what
/// `kvaudit target gc` removes (a tree no live entry was built from).
pub(super) fn unused_trees(cache: &Path, used: &[PathBuf]) -> Vec<PathBuf> {
    let Ok(read) = fs::read_dir(patched_root(cache)) else {
        return Vec::new();
    };
    read.filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .filter(|p| !used.iter().any(|u| u == p))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fix of two hunks in one file, and the tree it was written for.
    const FIX: EmbeddedFix = EmbeddedFix {
        name: "test-fix",
        json: "{}",
        patch: "--- a/src/x.h\n+++ b/src/x.h\n@@ -2,2 +2,2 @@\n two\n-three\n+THREE\n@@ -5 +5,2 @@\n five\n+five and a half\n",
    };
    const PRISTINE: &str = "one\ntwo\nthree\nfour\nfive\nsix\n";

    #[test]
    fn a_patched_tree_is_made_once_and_keeps_the_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let (pristine, cache) = (dir.path().join("pristine"), dir.path().join("cache"));
        fs::create_dir_all(pristine.join("src")).unwrap();
        fs::write(pristine.join("src/x.h"), PRISTINE).unwrap();
        fs::write(pristine.join("other.c"), "int x;\n").unwrap();
        std::os::unix::fs::symlink("other.c", pristine.join("link.c")).unwrap();
        fs::create_dir_all(&cache).unwrap();
        let (tree, made) = tree_of(&pristine, "0.1.161", &[&FIX], &cache).unwrap();
        assert!(made);
        assert_eq!(
            fs::read_to_string(tree.join("src/x.h")).unwrap(),
            "one\ntwo\nTHREE\nfour\nfive\nfive and a half\nsix\n"
        );
        assert_eq!(
            fs::read_to_string(pristine.join("src/x.h")).unwrap(),
            PRISTINE
        );
        assert_eq!(
            fs::read_to_string(tree.join("other.c")).unwrap(),
            "int x;\n"
        );
        assert!(fs::symlink_metadata(tree.join("link.c"))
            .unwrap()
            .is_symlink());
        // Made once: a second call finds it by its record and copies nothing again.
        fs::write(tree.join("other.c"), "int y;\n").unwrap();
        assert_eq!(
            tree_of(&pristine, "0.1.161", &[&FIX], &cache).unwrap(),
            (tree.clone(), false)
        );
        assert_eq!(
            fs::read_to_string(tree.join("other.c")).unwrap(),
            "int y;\n"
        );
        assert!(unused_trees(&cache, &[tree.clone()]).is_empty());
        assert_eq!(unused_trees(&cache, &[]), vec![tree]);
    }

    #[test]
    fn a_patch_that_does_not_fit_is_an_error_naming_the_hunk_and_leaves_no_tree() {
        let dir = tempfile::tempdir().unwrap();
        let (pristine, cache) = (dir.path().join("pristine"), dir.path().join("cache"));
        fs::create_dir_all(pristine.join("src")).unwrap();
        fs::write(pristine.join("src/x.h"), "one\ntwo\nthree\nfour\nFIVE\n").unwrap();
        fs::create_dir_all(&cache).unwrap();
        let err = tree_of(&pristine, "0.1.161", &[&FIX], &cache)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("fix `test-fix`: hunk 2 (`@@ -5 +5,2 @@`) of src/x.h does not apply")
                && err.contains("line 5 is \"FIVE\", the patch expects \"five\""),
            "{err}"
        );
        assert!(
            unused_trees(&cache, &[]).is_empty(),
            "no half-made tree is left"
        );
    }
}
