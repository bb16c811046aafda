//! The regression corpus a command classifies against: the `corpora/*.json` files and the
//! decisions of `corpora/decisions/*.json` built into kvaudit (`build.rs` lists them at compile
//! time), or the repro files of a folder given with `--corpus DIR` and the decisions of its
//! `decisions/` folder, which replace them. Read whole before a job's first trial, so a corpus
//! that is missing or malformed (a decision with an unknown word among them) stops the job
//! before its work rather than after it; an error names the file.
//!
//! A corpus has its fixes too (the remedies identity by fix replays, `hunt::by_fix`): the
//! built-in one every fix built into kvaudit (`corpora/fixes/`), a folder the fixes its
//! `fixes/NAME.json` files name, each of which must be one built into kvaudit (a label applies
//! the built-in patch by name). A folder without `fixes/` has none: a copy of `corpora/` with
//! one root cause's files and fix removed is a corpus that does not know that root cause.

use std::path::{Path, PathBuf};

use crate::base::error::Error;
use crate::base::files::read_text_limited;
use crate::records::hunt::CorpusUsed;

use super::fixes::Fix;
use super::repro::decision::Decision;
use super::repro::{repro_files, Repro, MAX_REPRO_BYTES};

/// The corpus built into kvaudit: (file name, its text), in name order.
const BUILT_IN: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/corpus.rs"));

/// The decisions built into kvaudit (`corpora/decisions/`): (file name, its text), in name order.
const BUILT_IN_DECISIONS: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/decisions.rs"));

/// The folder of a corpus that holds its decisions of classes with no reproducer.
pub const DECISIONS_FOLDER: &str = "decisions";

/// A decision file's text parsed; an error names the file (`decisions/NAME.json`).
fn parse_decision(name: &str, text: &str) -> Result<(String, Decision), Error> {
    let shown = format!("{DECISIONS_FOLDER}/{name}");
    Decision::parse(text)
        .map(|d| (shown.clone(), d))
        .map_err(|e| Error::harness(format!("{shown}: {e}")))
}

/// A corpus, read and parsed.
#[derive(Debug)]
pub struct Corpus {
    /// Where it came from: `None` for the one built into kvaudit.
    pub folder: Option<PathBuf>,
    /// Its repro files: (file name, repro), in name order.
    pub files: Vec<(String, Repro)>,
    /// Its decisions of classes with no reproducer: (`decisions/NAME.json`, decision), in
    /// name order.
    pub decisions: Vec<(String, Decision)>,
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
        let decisions = BUILT_IN_DECISIONS
            .iter()
            .map(|(name, text)| {
                parse_decision(name, text)
                    .map_err(|e| Error::harness(format!("built-in corpus {}", e.message)))
            })
            .collect::<Result<_, _>>()?;
        Ok(Corpus {
            folder: None,
            files,
            decisions,
            fixes: Fix::all()?.into_iter().map(|(f, _)| f).collect(),
        })
    }

    /// The repro files of the folder `dir` (or the one file `dir` names) and the decisions of
    /// its `decisions/` folder, if it has one.
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
        let decisions_dir = dir.join(DECISIONS_FOLDER);
        let decisions = if decisions_dir.is_dir() {
            repro_files(&decisions_dir)?
                .into_iter()
                .map(|path| {
                    let name = path
                        .file_name()
                        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
                    let text = read_text_limited(&path, MAX_REPRO_BYTES)?;
                    parse_decision(&name, &text).map_err(|e| e.context(dir.display()))
                })
                .collect::<Result<_, _>>()?
        } else {
            Vec::new()
        };
        Ok(Corpus {
            folder: Some(dir.to_path_buf()),
            files,
            decisions,
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
            decisions: self.decisions.len(),
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
        assert!(!built_in.decisions.is_empty());
        assert_eq!(built_in.decisions, read.decisions);
        // And its fixes: the folder's `fixes/` names every fix built in.
        assert_eq!(built_in.fixes, read.fixes);
        assert!(!built_in.fixes.is_empty());
        assert_eq!(
            built_in.used().describe(),
            format!(
                "{} files and {} decisions, built into kvaudit",
                read.files.len(),
                read.decisions.len()
            )
        );
    }

    #[test]
    fn a_decision_with_an_unknown_word_is_an_error_that_names_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let corpora = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpora");
        let file = "i1_recurrent_seq_add_below_zero.json";
        std::fs::copy(corpora.join(file), dir.path().join(file)).unwrap();
        std::fs::create_dir(dir.path().join(DECISIONS_FOLDER)).unwrap();
        let (name, d) = &Corpus::built_in().unwrap().decisions[0];
        let name = name.trim_start_matches("decisions/");
        let text = serde_json::to_string(d).unwrap();
        let path = dir.path().join(DECISIONS_FOLDER).join(name);
        std::fs::write(&path, &text).unwrap();
        assert_eq!(Corpus::read(dir.path()).unwrap().decisions.len(), 1);
        let word = format!("\"{}\"", d.decision.word());
        std::fs::write(&path, text.replacen(&word, "\"wontfix\"", 1)).unwrap();
        let e = Corpus::read(dir.path()).unwrap_err().message;
        assert!(e.contains(name) && e.contains("wontfix"), "{e}");
        // In a repro file too: the file named.
        let repro = std::fs::read_to_string(dir.path().join(file)).unwrap();
        let wrong = repro.replacen("\"decision\":\"question\"", "\"decision\":\"wontfix\"", 1);
        assert_ne!(wrong, repro, "the file's decision is a question");
        std::fs::write(dir.path().join(file), wrong).unwrap();
        let e = Corpus::read(dir.path()).unwrap_err().message;
        assert!(e.contains(file) && e.contains("wontfix"), "{e}");
    }
}
