//! Files: atomic writes and content hashes, the one copy of each.
//!
//! Every file kvaudit writes for a user or a cache (reports, repro files, models, build
//! manifests) goes through [`write_atomically`], so a reader never sees half a file; content
//! hashes are sha256 as lowercase hex ([`sha256_hex`]). Input files a user may have been sent
//! (repro files, reports, domain files) are read through [`read_text_limited`].
//!
//! The atomic write and the hashes are the llama.cpp target crate's (`targets/llama-cpp`, whose
//! build cache needs them and which depends on nothing of kvaudit), re-exported here: one copy.

use std::io;
use std::path::Path;

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
}
