//! What a cache lookup read last time, kept so that the next lookup need not read it again: the
//! sha256 of each file it hashed and the toolchain `cc` picked, each with the metadata of the
//! files it came from (size, modification and change times to the nanosecond, inode, device:
//! [`FileStamp`]). While that metadata is unchanged the recorded value is used; any write to a
//! file changes its change time, so it is read again. Keys still hash contents, never times: a
//! `touch` makes the file be read again and gives the same hash, hence the same key.
//!
//! Without them every `kvaudit audit` on a pin spent about 150 ms before its first trial on the
//! lookup alone (docs/performance.md): four compiler probes and `--version` runs to detect the
//! toolchain, the sha256 of every source and header of the tree, and of the entry's library.
//!
//! The stamps live under the cache root in `llama.cpp/stamps/`, one file per source tree (or
//! entry) and one per toolchain environment, written atomically; a stamp that cannot be read or
//! parsed is as none (everything is read again and the stamp rewritten).

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use super::toolchain::{cc_env_snapshot, Toolchain};
use crate::error::{IoContext as _, LlamaError};
use crate::files::{file_sha256, sha256_hex, write_atomically};

/// Bumped whenever a stamp's meaning changes: a stamp of another version is as none.
const STAMP_VERSION: u32 = 1;

/// A file's metadata: equal stamps mean the file was not written in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct FileStamp {
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    ino: u64,
    dev: u64,
}

impl FileStamp {
    /// The stamp of the file at `path` (following links), if it can be read.
    pub(super) fn of(path: &Path) -> Option<FileStamp> {
        let m = fs::metadata(path).ok()?;
        Some(FileStamp {
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            ino: m.ino(),
            dev: m.dev(),
        })
    }
}

/// The stamps folder of the cache root `cache`, and the file of `name` keyed by `scope`.
fn stamp_path(cache: &Path, name: &str, scope: &str) -> PathBuf {
    cache
        .join("llama.cpp")
        .join("stamps")
        .join(format!("{name}-{}.json", &sha256_hex(scope)[..16]))
}

/// A stamp file of this [`STAMP_VERSION`], if there is one that parses.
fn read_stamp<T: DeserializeOwned>(path: &Path) -> Option<T> {
    #[derive(Deserialize)]
    struct Versioned<T> {
        version: u32,
        stamp: T,
    }
    let text = fs::read(path).ok()?;
    let v: Versioned<T> = serde_json::from_slice(&text).ok()?;
    (v.version == STAMP_VERSION).then_some(v.stamp)
}

/// Writes a stamp atomically. Failing to is not an error: the next lookup reads everything again.
fn write_stamp<T: Serialize>(path: &Path, stamp: &T) {
    #[derive(Serialize)]
    struct Versioned<'a, T> {
        version: u32,
        stamp: &'a T,
    }
    let v = Versioned {
        version: STAMP_VERSION,
        stamp,
    };
    if let Ok(bytes) = serde_json::to_vec(&v) {
        let _ = write_atomically(path, bytes);
    }
}

/// The sha256 of files, read again only where a file's [`FileStamp`] changed since the last
/// lookup of the same scope (a source tree, an entry). [`HashStamps::save`] keeps the files
/// asked for in this lookup only, so the stamp does not grow with files a tree no longer has.
pub(super) struct HashStamps {
    path: PathBuf,
    // Hashed, not ordered: a lookup asks for about a thousand paths, and an ordered map
    // compared them component by component (a third of a lookup's instructions, callgrind).
    known: HashMap<PathBuf, (FileStamp, String)>,
    asked: HashMap<PathBuf, (FileStamp, String)>,
    changed: bool,
}

impl HashStamps {
    /// The hashes recorded for `scope` in the cache root `cache`.
    pub(super) fn open(cache: &Path, scope: &Path) -> HashStamps {
        let path = stamp_path(cache, "hashes", &scope.display().to_string());
        let known = read_stamp(&path).unwrap_or_default();
        HashStamps {
            path,
            known,
            asked: HashMap::new(),
            changed: false,
        }
    }

    /// The sha256 of the file at `path`: the recorded one while its stamp is unchanged, else read.
    pub(super) fn of(&mut self, path: &Path) -> Result<String, LlamaError> {
        let reading = || format!("reading {}", path.display());
        let stamp = FileStamp::of(path);
        if let (Some(now), Some((then, hash))) = (stamp, self.known.get(path)) {
            if now == *then {
                let hash = hash.clone();
                self.asked.insert(path.to_path_buf(), (now, hash.clone()));
                return Ok(hash);
            }
        }
        self.changed = true;
        let hash = file_sha256(path).context_io(reading)?;
        // A file that changed while it was read gets no stamp: it is read again next time.
        if let Some(now) = stamp.filter(|s| FileStamp::of(path) == Some(*s)) {
            self.asked.insert(path.to_path_buf(), (now, hash.clone()));
        }
        Ok(hash)
    }

    /// Records the hashes asked for, if any was read anew (or a file is no longer asked for).
    pub(super) fn save(self) {
        if self.changed || self.asked.len() != self.known.len() {
            write_stamp(&self.path, &self.asked);
        }
    }
}

/// The toolchain of the last detection in the same environment, and the files it depends on.
#[derive(Serialize, Deserialize)]
struct ToolchainStamp {
    toolchain: Toolchain,
    /// Each compiler as found and the file it resolves to, with that file's stamp: another
    /// compiler behind the same name (an `update-alternatives`) or a new version of it is
    /// detected again.
    compilers: Vec<(PathBuf, PathBuf, FileStamp)>,
    /// Each folder of `PATH` with its stamp: a compiler installed earlier on the path changes
    /// its folder, so the toolchain is detected again.
    path_dirs: Vec<(PathBuf, Option<FileStamp>)>,
}

/// The folders of `PATH` and their stamps now.
fn path_dirs() -> Vec<(PathBuf, Option<FileStamp>)> {
    std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| {
                    let s = FileStamp::of(&d);
                    (d, s)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Each compiler, the file it resolves to (a bare name such as `cc`, as `cc` gives it, is
/// looked up on `PATH` as the system does) and that file's stamp.
fn compiler_stamps(t: &Toolchain) -> Option<Vec<(PathBuf, PathBuf, FileStamp)>> {
    [t.c.clone(), t.cxx.clone()]
        .into_iter()
        .map(|c| {
            let found = if c.components().count() > 1 {
                c.clone()
            } else {
                let path = std::env::var_os("PATH")?;
                std::env::split_paths(&path)
                    .map(|d| d.join(&c))
                    .find(|p| p.is_file())?
            };
            let real = fs::canonicalize(found).ok()?;
            let s = FileStamp::of(&real)?;
            Some((c, real, s))
        })
        .collect()
}

/// The toolchain `cc` picks now ([`Toolchain::detect`]), or the one recorded by the last
/// detection in the same environment (the variables `cc` reads and `PATH`) while neither the
/// compilers it found nor the folders of `PATH` have changed since.
pub(super) fn toolchain(cache: &Path) -> Result<Toolchain, LlamaError> {
    let scope = format!(
        "{:?}\0{:?}",
        cc_env_snapshot(),
        std::env::var_os("PATH").unwrap_or_default()
    );
    let path = stamp_path(cache, "toolchain", &scope);
    let dirs = path_dirs();
    if let Some(stamp) = read_stamp::<ToolchainStamp>(&path) {
        if stamp.path_dirs == dirs && compiler_stamps(&stamp.toolchain) == Some(stamp.compilers) {
            return Ok(stamp.toolchain);
        }
    }
    let toolchain = Toolchain::detect(cache)?;
    if let Some(compilers) = compiler_stamps(&toolchain) {
        write_stamp(
            &path,
            &ToolchainStamp {
                toolchain: toolchain.clone(),
                compilers,
                path_dirs: dirs,
            },
        );
    }
    Ok(toolchain)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Sets a file's modification time back to what it was: only its contents changed.
    fn rewrite_keeping_mtime(path: &Path, bytes: &[u8]) {
        let mtime = fs::metadata(path).unwrap().modified().unwrap();
        fs::write(path, bytes).unwrap();
        fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
    }

    #[test]
    fn a_recorded_hash_is_used_while_the_file_is_unchanged_and_a_new_one_after_any_write() {
        let dir = tempfile::tempdir().unwrap();
        let (cache, tree) = (dir.path().join("cache"), dir.path().join("tree"));
        fs::create_dir_all(&tree).unwrap();
        let file = tree.join("llama.cpp");
        fs::write(&file, "int a;").unwrap();
        let first = {
            let mut h = HashStamps::open(&cache, &tree);
            let hash = h.of(&file).unwrap();
            h.save();
            hash
        };
        assert_eq!(first, sha256_hex("int a;"));
        // A stale stamp (a forged hash under the file's current stamp) would be believed: that
        // is what shows the recorded hash is the one used.
        let path = stamp_path(&cache, "hashes", &tree.display().to_string());
        let mut known: BTreeMap<PathBuf, (FileStamp, String)> = read_stamp(&path).unwrap();
        known.get_mut(&file).unwrap().1 = "recorded".into();
        write_stamp(&path, &known);
        assert_eq!(
            HashStamps::open(&cache, &tree).of(&file).unwrap(),
            "recorded"
        );
        // The same size, the same modification time, other contents: the change time differs,
        // so the file is read again and its key changes.
        rewrite_keeping_mtime(&file, b"int b;");
        let mut h = HashStamps::open(&cache, &tree);
        assert_eq!(h.of(&file).unwrap(), sha256_hex("int b;"));
        h.save();
        // A touch reads it again and gives the same hash (keys hash contents, never times).
        fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(std::time::SystemTime::now())
            .unwrap();
        assert_eq!(
            HashStamps::open(&cache, &tree).of(&file).unwrap(),
            sha256_hex("int b;")
        );
    }

    #[test]
    fn a_stamp_of_another_version_or_unreadable_is_as_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        write_stamp(&path, &7u32);
        assert_eq!(read_stamp::<u32>(&path), Some(7));
        fs::write(
            &path,
            format!("{{\"version\":{},\"stamp\":7}}", STAMP_VERSION + 1),
        )
        .unwrap();
        assert_eq!(read_stamp::<u32>(&path), None);
        fs::write(&path, "{").unwrap();
        assert_eq!(read_stamp::<u32>(&path), None);
    }

    #[test]
    fn the_toolchain_is_detected_again_when_a_compiler_changes() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path();
        let detected = toolchain(cache).unwrap();
        let scope = format!(
            "{:?}\0{:?}",
            cc_env_snapshot(),
            std::env::var_os("PATH").unwrap_or_default()
        );
        let path = stamp_path(cache, "toolchain", &scope);
        let mut stamp: ToolchainStamp = read_stamp(&path).expect("the detection was recorded");
        // Recorded and current: the recorded toolchain is used (a forged version shows it).
        stamp.toolchain.version = "recorded".into();
        write_stamp(&path, &stamp);
        assert_eq!(toolchain(cache).unwrap().version, "recorded");
        // The compiler's file is not what was recorded (as after an upgrade): detected again.
        stamp.compilers[0].2.len += 1;
        write_stamp(&path, &stamp);
        assert_eq!(toolchain(cache).unwrap().version, detected.version);
        // So is a PATH folder that changed (a compiler installed earlier on the path).
        let mut stamp: ToolchainStamp = read_stamp(&path).unwrap();
        stamp.toolchain.version = "recorded".into();
        stamp.path_dirs.push((dir.path().join("new"), None));
        write_stamp(&path, &stamp);
        assert_eq!(toolchain(cache).unwrap().version, detected.version);
    }
}
