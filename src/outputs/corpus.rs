//! The regression corpus a command classifies against: the `corpora/*.json` files built into
//! kvaudit (`build.rs` lists them at compile time), or the repro files of a folder given with
//! `--corpus DIR`, which replaces them. Read whole before a job's first trial, so a corpus that
//! is missing or malformed stops the job before its work rather than after it.
//!
//! A corpus has its fixes too (the remedies identity by fix replays, `hunt::by_fix`): the
//! built-in one every fix built into kvaudit (`corpora/fixes/`), a folder the fixes its
//! `fixes/NAME.json` files name, each of which must be one built into kvaudit (a label applies
//! the built-in patch by name). A folder without `fixes/` has none: a copy of `corpora/` with
//! one root cause's files and fix removed is a corpus that does not know that root cause.

use std::path::{Path, PathBuf};

use crate::base::error::Error;
use crate::records::hunt::CorpusUsed;

use super::fixes::Fix;
use super::repro::{repro_files, Repro};

/// The corpus built into kvaudit: (file name, its text), in name order.
const BUILT_IN: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/corpus.rs"));

/// A corpus, read and parsed.
pub struct Corpus {
    /// Where it came from: `None` for the one built into kvaudit.
    pub folder: Option<PathBuf>,
    /// Its repro files: (file name, repro), in name order.
    pub files: Vec<(String, Repro)>,
    /// Its fixes, in name order.
    pub fixes: Vec<Fix>,
}

impl Corpus {
    /// The corpus built into kvaudit.
    pub fn built_in() -> Result<Corpus, Error> {
        let files = BUILT_IN
            .iter()
            .map(|(name, text)| {
                Repro::parse(text)
                    .map(|r| (name.to_string(), r))
                    .map_err(|e| Error::harness(format!("built-in corpus file {name}: {e}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(Corpus {
            folder: None,
            files,
            fixes: Fix::all()?.into_iter().map(|(f, _)| f).collect(),
        })
    }

    /// The repro files of the folder `dir` (or the one file `dir` names).
    pub fn read(dir: &Path) -> Result<Corpus, Error> {
        let files = repro_files(dir)?
            .into_iter()
            .map(|path| {
                let name = path
                    .file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
                Repro::load(&path).map(|r| (name, r))
            })
            .collect::<Result<_, _>>()?;
        Ok(Corpus {
            folder: Some(dir.to_path_buf()),
            files,
            fixes: fixes_of_folder(&dir.join("fixes"))?,
        })
    }

    /// The folder `dir` if given (`--corpus DIR`), else the built-in corpus. An error names the
    /// flag.
    pub fn from_flag(dir: Option<&Path>) -> Result<Corpus, Error> {
        match dir {
            Some(d) => Corpus::read(d)
                .map_err(|e| Error::input(format!("--corpus {}: {}", d.display(), e.message))),
            None => Corpus::built_in(),
        }
    }

    /// What a summary records of it: how many files, from where.
    pub fn used(&self) -> CorpusUsed {
        CorpusUsed {
            files: self.files.len(),
            folder: self.folder.as_ref().map(|d| d.display().to_string()),
        }
    }
}

/// The fixes built into kvaudit that the folder `dir` names by a `NAME.json` (none when there
/// is no such folder); `Err` names a file that names no fix kvaudit has.
fn fixes_of_folder(dir: &Path) -> Result<Vec<Fix>, Error> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let built_in = Fix::all()?;
    repro_files(dir)?
        .into_iter()
        .map(|path| {
            let stem = path
                .file_stem()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
            built_in
                .iter()
                .find(|(f, _)| f.name == stem)
                .map(|(f, _)| f.clone())
                .ok_or_else(|| {
                    Error::input(format!(
                        "{}: no fix `{stem}` is built into kvaudit (a fix's patch is applied by \
                         name; `kvaudit fixes list` lists them)",
                        path.display()
                    ))
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_corpus_is_the_corpora_folder() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpora");
        let built_in = Corpus::built_in().unwrap();
        let read = Corpus::read(&dir).unwrap();
        assert!(!built_in.files.is_empty());
        assert_eq!(built_in.files, read.files);
        // And its fixes: the folder's `fixes/` names every fix built in.
        assert_eq!(built_in.fixes, read.fixes);
        assert!(!built_in.fixes.is_empty());
        assert_eq!(
            built_in.used().describe(),
            format!("{} files, built into kvaudit", read.files.len())
        );
    }
}
