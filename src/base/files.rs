//! Files: atomic writes and content hashes, the one copy of each.
//!
//! Every file kvaudit writes for a user or a cache (reports, repro files, models, build
//! manifests) goes through [`write_atomically`], so a reader never sees half a file; content
//! hashes are sha256 as lowercase hex ([`sha256_hex`]). Input files a user may have been sent
//! (repro files, reports, domain files) are read through [`read_text_limited`].
//!
//! A long job (a hunt, an audit or fuzz run with `--out`, a matrix) checks before its first
//! trial that it can write where its results go ([`check_writable_folder`],
//! [`check_writable_file`]); if a write still fails at its end, the results go to a private
//! folder under the temporary directory instead ([`write_or_aside`]): what a job found is never
//! lost to a folder that went away while it ran.
//!
//! The atomic write and the hashes are the llama.cpp target crate's (`targets/llama-cpp`, whose
//! build cache needs them and which depends on nothing of kvaudit), re-exported here: one copy.

use std::io;
use std::path::{Path, PathBuf};

pub use llama_cpp_target::files::{file_sha256, hex, sha256_hex, write_atomically};

use crate::base::error::Error;

/// `Err` naming the limit when `len` bytes of `what` (e.g. "a repro file") exceed `max_bytes`.
pub fn check_input_size(len: u64, max_bytes: u64, what: &str) -> Result<(), Error> {
    if len > max_bytes {
        return Err(format!(
            "{len} bytes or more, larger than the {max_bytes}-byte limit for {what}"
        )
        .into());
    }
    Ok(())
}

/// Reads a UTF-8 text file of at most `max_bytes` bytes. A larger file is refused before it is
/// read (and a device that never ends, such as `/dev/zero`, after `max_bytes + 1` bytes), so a
/// hostile input cannot make kvaudit allocate without bound. Errors name the file.
pub fn read_text_limited(path: &Path, max_bytes: u64) -> Result<String, Error> {
    use std::io::Read as _;
    let cannot = |e: io::Error| format!("{}: cannot read: {e}", path.display());
    let file = std::fs::File::open(path).map_err(cannot)?;
    let too_large = |n: u64| {
        check_input_size(n, max_bytes, "this input").map_err(|e| e.context(path.display()))
    };
    too_large(file.metadata().map_err(cannot)?.len())?;
    let mut bytes = Vec::new();
    file.take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    too_large(bytes.len() as u64)?;
    String::from_utf8(bytes).map_err(|e| {
        Error::input(format!(
            "{}: byte {}: not UTF-8 text",
            path.display(),
            e.utf8_error().valid_up_to()
        ))
    })
}

/// Checks that files can be made in the folder `dir`: `dir` itself if it exists, else the
/// nearest folder above it that does (the job makes the rest), takes a file, made and removed
/// at once. A path below a regular file or in a place no one may write (`/proc`) fails here,
/// root's included, before a job spends its budget. Makes nothing that stays.
pub fn check_writable_folder(dir: &Path) -> Result<(), Error> {
    let mut at = dir;
    while !at.as_os_str().is_empty() && at.symlink_metadata().is_err() {
        match at.parent() {
            Some(p) => at = p,
            None => break,
        }
    }
    if at.as_os_str().is_empty() {
        at = Path::new(".");
    }
    if !at.is_dir() {
        return Err(Error::input(format!(
            "{}: {} is not a folder",
            dir.display(),
            at.display()
        )));
    }
    let probe = at.join(format!(".kvaudit-write-check-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map_err(|e| {
            Error::input(format!(
                "{}: cannot write in {}: {e}",
                dir.display(),
                at.display()
            ))
        })?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Checks that the file `path` can be written: it is not a folder, and its folder takes files
/// ([`check_writable_folder`]).
pub fn check_writable_file(path: &Path) -> Result<(), Error> {
    if path.is_dir() {
        return Err(Error::input(format!("{}: is a folder", path.display())));
    }
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    check_writable_folder(dir).map_err(|e| e.context(path.display()))
}

/// Writes each (path, text) of `files` atomically. If one cannot be written (its folder went
/// away while the job ran, or became a file), all of them are written by file name into a new
/// private folder under the temporary directory ([`private_temp_dir`], named after `job`)
/// instead, and the error says what failed and where the files are: a job's results are not
/// lost at its end.
pub fn write_or_aside(job: &str, files: &[(&Path, &str)]) -> Result<(), Error> {
    for (path, text) in files {
        if let Err(e) = write_atomically(path, text) {
            let failed = format!("{}: cannot write: {e}", path.display());
            return Err(Error::harness(match write_aside(job, files) {
                Ok(dir) => format!("{failed}; written to {} instead", dir.display()),
                Err(also) => format!("{failed}; nor aside: {also}"),
            }));
        }
    }
    Ok(())
}

fn write_aside(job: &str, files: &[(&Path, &str)]) -> Result<PathBuf, Error> {
    let dir = private_temp_dir(job)?;
    for (path, text) in files {
        let name = path.file_name().unwrap_or(job.as_ref());
        let aside = dir.join(name);
        write_atomically(&aside, text)
            .map_err(|e| Error::harness(format!("{}: cannot write: {e}", aside.display())))?;
    }
    Ok(dir)
}

/// A fresh folder under the temporary directory (`kvaudit-WHAT-...`), private to the user:
/// `create` fails on one that exists, so a folder or link planted under the predictable name
/// is never written into; a name taken (by such a plant, or by another thread of this process
/// in the same clock tick: the tests check reproducers in parallel) is passed over for the
/// next one.
pub fn private_temp_dir(what: &str) -> Result<PathBuf, Error> {
    use std::os::unix::fs::DirBuilderExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut last = None;
    for _ in 0..16 {
        let dir = std::env::temp_dir().join(format!(
            "kvaudit-{what}-{}-{nanos}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some((dir, e)),
            Err(e) => return Err(Error::harness(format!("{}: {e}", dir.display()))),
        }
    }
    let (dir, e) = last.expect("the loop ran");
    Err(Error::harness(format!(
        "{}: {e} (and 15 names after it)",
        dir.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_the_empty_string() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn an_atomic_write_replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("a.json");
        write_atomically(&path, "one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
        let entries = std::fs::read_dir(path.parent().unwrap()).unwrap().count();
        assert_eq!(entries, 1);
    }

    #[test]
    fn files_that_cannot_be_written_go_aside_all_together() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let (ok, lost) = (dir.path().join("a.json"), file.join("b.md"));
        write_or_aside("test", &[(ok.as_path(), "one")]).unwrap();
        assert_eq!(std::fs::read_to_string(&ok).unwrap(), "one");
        let e = write_or_aside("test", &[(ok.as_path(), "two"), (lost.as_path(), "three")])
            .unwrap_err();
        let aside = e.message.rsplit_once("written to ").unwrap().1;
        let aside = Path::new(aside.trim_end_matches(" instead"));
        assert!(
            e.message
                .starts_with(&format!("{}: cannot write", lost.display())),
            "{e}"
        );
        assert_eq!(
            std::fs::read_to_string(aside.join("a.json")).unwrap(),
            "two"
        );
        assert_eq!(
            std::fs::read_to_string(aside.join("b.md")).unwrap(),
            "three"
        );
        std::fs::remove_dir_all(aside).unwrap();
    }

    #[test]
    fn a_folder_below_a_file_or_in_proc_is_refused_and_a_new_one_is_not_made() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let below = file.join("out");
        assert!(check_writable_folder(&below)
            .unwrap_err()
            .message
            .contains("is not a folder"));
        assert!(check_writable_file(&below.join("r.json")).is_err());
        assert!(check_writable_folder(Path::new("/proc/kvaudit-out")).is_err());
        assert!(check_writable_file(dir.path()).is_err());
        let fresh = dir.path().join("a").join("b");
        check_writable_folder(&fresh).unwrap();
        check_writable_file(&fresh.join("r.json")).unwrap();
        assert!(!dir.path().join("a").exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
