//! Files: atomic writes and content hashes, the one copy of each (kvaudit re-exports them from
//! its `base::files`).
//!
//! The build cache's manifests, objects and libraries are written through [`write_atomically`],
//! so a reader never sees half a file; content hashes are sha256 as lowercase hex
//! ([`sha256_hex`]), the cache's keys and its tamper check.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

/// Writes `bytes` to `path` atomically: a temporary file in the same folder (created when
/// missing), then a rename. The temporary name is unique per process and call, so concurrent
/// writers of the same path never share one.
pub fn write_atomically(path: &Path, bytes: impl AsRef<[u8]>) -> io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} has no file name", path.display()),
        )
    })?;
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// `bytes` as lowercase hex (a digest computed here, e.g. of several files).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: impl AsRef<[u8]>) -> String {
    hex(&Sha256::digest(bytes.as_ref()))
}

/// sha256 of a file's contents, lowercase hex.
pub fn file_sha256(path: &Path) -> io::Result<String> {
    Ok(sha256_hex(std::fs::read(path)?))
}
