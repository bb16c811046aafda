//! The regression corpus: every `corpora/*.json` repro file, one test per target expectation,
//! named `corpus::<file stem>::<target label>` (so `cargo test -- seq_cp` picks them by name).
//!
//! The expectation lives in the file. A test fails, naming the file and the step, when the
//! oracle no longer fails the recorded way, fails where it held, or holds where it failed (a
//! fix is news too). A target that cannot be built or driven fails the test loudly: a corpus
//! entry is never skipped.

use libtest_mimic::Trial;

use kvaudit::outputs::repro::{check, Repro, Status};

pub fn trials() -> Vec<Trial> {
    let dir = super::root().join("corpora");
    let mut trials = Vec::new();
    for (stem, path) in super::data_files(&dir, "json") {
        let shown = format!("corpora/{stem}.json");
        let repro = match Repro::load(&path) {
            Ok(r) => r,
            Err(e) => {
                trials.push(Trial::test(format!("corpus::{stem}"), move || {
                    Err(format!("{shown}: {e}").into())
                }));
                continue;
            }
        };
        for entry in repro.targets.clone() {
            let (repro, shown) = (repro.clone(), shown.clone());
            let name = format!("corpus::{stem}::{}", entry.label());
            trials.push(Trial::test(name, move || {
                let r = check(&repro, &entry);
                match r.status {
                    Status::Confirmed(_) => Ok(()),
                    Status::Unavailable(why) => Err(format!(
                        "{shown}: {}: cannot check this expectation, the target is needed: {why}",
                        r.label
                    )
                    .into()),
                    other => {
                        Err(
                            format!("{shown}: {}: {}: {}", r.label, other.word(), other.detail())
                                .into(),
                        )
                    }
                }
            }));
        }
    }
    trials
}
