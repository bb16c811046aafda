//! The regression corpus a command classifies against: the `corpora/*.json` files built into
//! kvaudit (`build.rs` lists them at compile time), or the repro files of a folder given with
//! `--corpus DIR`, which replaces them. Read whole before a job's first trial, so a corpus that
//! is missing or malformed stops the job before its work rather than after it.

use std::path::{Path, PathBuf};

use crate::base::error::Error;
use crate::records::hunt::CorpusUsed;

use super::repro::{repro_files, Repro};

/// The corpus built into kvaudit: (file name, its text), in name order.
const BUILT_IN: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/corpus.rs"));

/// A corpus, read and parsed.
pub struct Corpus {
    /// Where it came from: `None` for the one built into kvaudit.
    pub folder: Option<PathBuf>,
    /// Its repro files: (file name, repro), in name order.
    pub files: Vec<(String, Repro)>,
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
        assert_eq!(
            built_in.used().describe(),
            format!("{} files, built into kvaudit", read.files.len())
        );
    }
}
