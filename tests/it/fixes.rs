//! The fixes of `corpora/fixes/` as CI checks one of them: `llama.cpp@0.1.161` built with
//! `pos-div-shift-sign` (one line of `src/llama-kv-cells.h`), every corpus file run on it and on
//! the pin without it; the fix's file goes from failing to holding and every other run ends as
//! on the pin (the two files whose logits difference the fix declares it changes aside), and
//! the result is the one `corpora/fixes/pos-div-shift-sign.json` records, with its patch.
//! The whole corpus is run, not only the memory types the fix touches: both runs together take
//! seconds once the build is there (its first build compiles the 23 sources that include the
//! header, then links; `.ci/run` builds it beforehand).

use libtest_mimic::Trial;

use kvaudit::outputs::corpus::Corpus;
use kvaudit::outputs::fixes::check::{check_fix, Verdict};
use kvaudit::outputs::fixes::Fix;
use kvaudit::targets::llama::build::{ensure_built, BuildSpec};
use kvaudit::targets::llama::pins::Pin;

/// The fix CI checks.
const CHECKED_IN_CI: &str = "pos-div-shift-sign";

pub fn trials() -> Vec<Trial> {
    vec![Trial::test(
        format!("fixes::{CHECKED_IN_CI}_makes_its_file_hold_and_changes_nothing_else"),
        || super::outcome(check_in_ci()),
    )]
}

fn check_in_ci() -> Result<(), String> {
    let (fix, embedded) = Fix::named(CHECKED_IN_CI).map_err(|e| e.message)?;
    let pin = Pin::parse(&fix.target()).map_err(|e| format!("{e:#}"))?;
    let built = ensure_built(&BuildSpec::new(pin.clone()), false).map_err(|e| format!("{e:#}"))?;
    // The build is the pin's with the patch: the manifest says which patch bytes went in.
    let recorded = &built.manifest.fixes;
    if recorded != &[(fix.name.clone(), embedded.patch_sha256())] {
        return Err(format!(
            "{pin}: the manifest records the fixes {recorded:?}"
        ));
    }
    let corpus = Corpus::built_in().map_err(|e| e.message)?;
    let check = check_fix(&fix, &corpus, &mut |_| {}).map_err(|e| e.message)?;
    let not_passed: Vec<String> = check
        .runs
        .iter()
        .filter(|r| !r.verdict().passed())
        .map(|r| r.line())
        .collect();
    if !check.passed() {
        return Err(format!(
            "{}\n{}",
            check.result_line(),
            not_passed.join("\n")
        ));
    }
    // Every file ran on both builds, and the fix's own file is among them, fixed.
    let own: Vec<_> = check.runs.iter().filter(|r| r.own).collect();
    if own.len() != fix.files.len() || own.iter().any(|r| r.verdict() != Verdict::Fixed) {
        return Err(format!("the fix's files: {own:?}"));
    }
    if check.runs.len() < corpus.files.len() {
        return Err(format!(
            "{} runs for {} files",
            check.runs.len(),
            corpus.files.len()
        ));
    }
    // The committed record is this result, of this patch (scripts/fixes-check.sh writes it).
    let checked = fix
        .current_check(embedded)
        .ok_or("corpora/fixes/pos-div-shift-sign.json records no check of this patch")?;
    // The record says the check passed on this patch's bytes; its counts are of the corpus it
    // ran on (scripts/fixes-check.sh records them again), which grows with every new file.
    if !checked.passed {
        return Err(format!(
            "corpora/fixes/{CHECKED_IN_CI}.json records a failed check ({:?}); it passes now: {:?}",
            checked.result,
            check.result_line()
        ));
    }
    Ok(())
}
