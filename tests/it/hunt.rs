//! Hunts (`tests/data/hunt/*.json`): the real binary runs `kvaudit hunt` with a case's command
//! line into a fresh folder, and its exit code and `summary.json` must say what the case says.
//! Budgets are given in trials where a case needs determinism (`--budget 3000trials`), never
//! as "finds it within N seconds"; a time budget is only held to its contract (the hunt ends
//! within it plus 10%). `plan` cases check `--plan`'s output against the registry and the
//! memory types, so an oracle added to the registry is expected there without a test edit.
//! `shards` cases run the hunt as shards and merge them; `interrupt` cases stop it with SIGINT
//! once its first entry starts and resume it. `from_another_folder` runs it from a fresh
//! temporary folder without `--corpus` (the corpus built into kvaudit); `refused` cases must
//! fail before their first entry starts; `broken_mid_run` cases break the output folder once
//! the first entry starts and find the partial summary.

use std::process::Command;

use libtest_mimic::Trial;
use serde::Deserialize;

use kvaudit::base::config::Arch;
use kvaudit::oracles::{Reads, Registry};
use kvaudit::records::group::Cause;
use kvaudit::records::hunt::{Budget, GroupClass, HuntSummary};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HuntCase {
    #[allow(dead_code)]
    about: String,
    /// The command line after `hunt` (without `--out`).
    args: Vec<String>,
    /// The exit code; absent: whatever the summary says it must be (1 when a group of a
    /// non-advisory oracle is new or regressed, else 0), for a real target whose new groups
    /// the corpus may come to hold.
    #[serde(default)]
    exit: Option<i32>,
    /// `--plan`: stdout names every memory type and every oracle that judges observations.
    #[serde(default)]
    plan_lists_everything: bool,
    /// `--plan`: per entry id, oracles its line must not list (they cannot judge its setup:
    /// no reading of its memory type, no tolerance for its cache types).
    #[serde(default)]
    plan_leaves_out: std::collections::BTreeMap<String, Vec<String>>,
    /// Groups that must be there.
    #[serde(default)]
    groups: Vec<GroupExpect>,
    /// No group is new or regressed, advisory oracles aside.
    #[serde(default)]
    nothing_new: bool,
    /// No group rests on a native fault (`native_fault` evidence).
    #[serde(default)]
    no_fault_cause: bool,
    /// At least this many groups are known.
    #[serde(default)]
    known_at_least: usize,
    /// Every group's class is decided and a new one has its repro file in `new/`, which
    /// parses (a configuration pair's too).
    #[serde(default)]
    new_groups_have_files: bool,
    /// The extensions of the files each new group's program and drafts are written in (its
    /// repro file's `.json` and the notes in parentheses aside): every written file is of one,
    /// and some group has all of them (the engine's renderer: `.py` and `.md` on mlx-lm).
    #[serde(default)]
    new_group_files: Vec<String>,
    /// Notes every new group's files hold on what was not written, with why (their start:
    /// `(no picture:`).
    #[serde(default)]
    new_group_notes: Vec<String>,
    /// Classify against an empty corpus instead of `corpora/`: every group is new, so every
    /// group's files are written (a group the corpus holds gets none).
    #[serde(default)]
    without_corpus: bool,
    /// Classify against this folder of repro files (from the repository's root) instead of
    /// `corpora/`.
    #[serde(default)]
    corpus: Option<String>,
    /// `--plan`: no entry is unsupported (a plan from what the target declares plans only
    /// what it runs).
    #[serde(default)]
    plan_all_supported: bool,
    /// Oracles whose new groups' repro files must replay as recorded (`kvaudit replay FILE`
    /// exits 0): the file holds the trace, the setup and the targets that fail it.
    #[serde(default)]
    new_repros_replay: Vec<String>,
    /// Run as this many shards (`--shard K/M` each into its own folder), then `kvaudit merge`
    /// them:
    /// the merged summary is checked, and must hold every entry the shards ran.
    #[serde(default)]
    shards: Option<usize>,
    /// Send SIGINT once the first entry starts: the hunt must exit 4 with a partial summary,
    /// and `--resume` must finish it (the finished summary is checked).
    #[serde(default)]
    interrupt: bool,
    /// Run from a fresh temporary folder, without `--corpus`: the groups are classified
    /// against the corpus built into kvaudit, and the summary says so (every file of
    /// `corpora/`).
    #[serde(default)]
    from_another_folder: bool,
    /// The hunt must be refused before its first entry starts (`args` name the `--corpus` or
    /// `--out` that cannot serve): exit 2, one line on stderr containing this, no entry started.
    #[serde(default)]
    refused: Option<String>,
    /// Break the output folder once the first entry starts: the hunt must exit 3 and still
    /// write what it found, its summary marked partial.
    #[serde(default)]
    broken_mid_run: Option<Break>,
}

/// How a case breaks the output folder while the hunt runs.
#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Break {
    /// `DIR/new` made a regular file: the new groups' files cannot be written; the partial
    /// summary is in `DIR`.
    NewIsAFile,
    /// `DIR` replaced by a regular file: nothing can be written there; the partial summary is
    /// in a folder aside, under `TMPDIR`, which the error names.
    OutIsAFile,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupExpect {
    /// The native faults its evidence names.
    faults: Vec<String>,
    /// `known`, `regressed`, `new` or `decided`.
    class: String,
    /// For a known or regressed group: the corpus files it may be matched to; for a decided
    /// one, where the decision may be (`decisions/NAME.json`, or a corpus file).
    #[serde(default)]
    files: Vec<String>,
    /// For a decided group: the decision's root cause, which the summary's "What is broken"
    /// must name.
    #[serde(default)]
    root_cause: Option<String>,
}

pub fn trials() -> Vec<Trial> {
    let mut trials: Vec<Trial> = super::data_files(&super::root().join("tests/data/hunt"), "json")
        .into_iter()
        .map(|(stem, path)| {
            Trial::test(format!("hunt::{stem}"), move || {
                let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
                let case: HuntCase =
                    serde_json::from_str(&text).map_err(|e| format!("{stem}.json: {e}"))?;
                super::outcome(check(&case))
            })
        })
        .collect();
    trials.extend(leave_one_out_trials());
    trials
}

/// A leave-one-out case (`tests/data/hunt/leave_one_out/NAME.json`): a hunt with several
/// faults injected, whose corpus (the folder `NAME/` beside it) knows every group it finds.
/// `hunt::leave_one_out::NAME::all` hunts with the whole corpus: nothing is new.
/// `hunt::leave_one_out::NAME::without_FAULT` leaves that fault's files out of a copy of it:
/// the hunt reports exactly one new group, the one the fault's removal makes hold (identity by
/// fix, `outputs::hunt::by_fix`), and every other group known. The folder is the `new/` files
/// of the same hunt against an empty corpus; `leave_out` names each fault's files among them
/// (the groups `by_fix` explains by that fault).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaveOneOut {
    #[allow(dead_code)]
    about: String,
    /// The command line after `hunt` (without `--corpus` and `--out`), `--inject` among it.
    args: Vec<String>,
    /// Per injected fault, its root cause's files in the corpus folder.
    leave_out: std::collections::BTreeMap<String, Vec<String>>,
}

fn leave_one_out_trials() -> Vec<Trial> {
    let dir = super::root().join("tests/data/hunt/leave_one_out");
    let mut trials = Vec::new();
    for (stem, path) in super::data_files(&dir, "json") {
        let case = std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<LeaveOneOut>(&t).map_err(|e| e.to_string()))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let case = std::sync::Arc::new(case);
        let corpus = dir.join(&stem);
        let left: Vec<Option<String>> = std::iter::once(None)
            .chain(case.leave_out.keys().cloned().map(Some))
            .collect();
        for fault in left {
            let name = match &fault {
                None => format!("hunt::leave_one_out::{stem}::all"),
                Some(f) => format!("hunt::leave_one_out::{stem}::without_{f}"),
            };
            let (case, corpus) = (case.clone(), corpus.clone());
            trials.push(Trial::test(name, move || {
                super::outcome(left_out(&case, &corpus, fault.as_deref()))
            }));
        }
    }
    trials
}

/// One trial of a leave-one-out case: the hunt against `corpus` without `fault`'s files.
fn left_out(
    case: &LeaveOneOut,
    corpus: &std::path::Path,
    fault: Option<&str>,
) -> Result<(), String> {
    let injected: Vec<&str> = case
        .args
        .iter()
        .skip_while(|a| *a != "--inject")
        .nth(1)
        .map_or(Vec::new(), |f| f.split(',').collect());
    let copy = tempfile::tempdir().map_err(|e| e.to_string())?;
    let out = tempfile::tempdir().map_err(|e| e.to_string())?;
    let left: &[String] = fault.map_or(&[], |f| &case.leave_out[f]);
    if let Some(f) = fault.filter(|f| !injected.contains(f)) {
        return Err(format!("{f} is not injected: {:?}", case.args));
    }
    let mut copied = 0;
    for (name, path) in super::data_files(corpus, "json") {
        let file = format!("{name}.json");
        if !left.contains(&file) {
            std::fs::copy(&path, copy.path().join(&file)).map_err(|e| e.to_string())?;
            copied += 1;
        }
    }
    // Every file named is left out: a name that is not there would leave nothing out.
    let all = super::data_files(corpus, "json").len();
    if all - copied != left.len() {
        return Err(format!(
            "{} of {:?} are not in {}",
            left.len() - (all - copied),
            left,
            corpus.display()
        ));
    }
    let o = hunt(
        &case.args,
        Some(copy.path()),
        &["--out".as_ref(), out.path().as_os_str()],
        false,
    )
    .output()
    .map_err(|e| e.to_string())?;
    // Exit 1 when the new group's oracle is not advisory (`contract?` alone fails nothing).
    let code = o.status.code().ok_or("killed by a signal")?;
    super::exited(&o, if matches!(code, 0 | 1) { code } else { 1 })?;
    let s = read_summary(out.path())?;
    if code != i32::from(s.failing_groups() > 0) {
        return Err(format!(
            "exit {code}, but the summary has {} new or regressed groups",
            s.failing_groups()
        ));
    }
    let new: Vec<&kvaudit::records::hunt::HuntGroup> =
        s.groups.iter().filter(|g| !g.class.is_known()).collect();
    let why = || s.to_terminal();
    let Some(fault) = fault else {
        return match new.len() {
            0 => Ok(()),
            n => Err(format!(
                "{n} group(s) not known with the whole corpus:\n{}",
                why()
            )),
        };
    };
    let [g] = new.as_slice() else {
        return Err(format!(
            "{} groups not known without {fault}'s files, expected 1:\n{}",
            new.len(),
            why()
        ));
    };
    let remedies: Vec<&str> = g
        .by_fix
        .iter()
        .flat_map(|b| b.explained.iter().map(|e| e.remedy.as_str()))
        .collect();
    let wanted = format!("fault {fault} removed");
    if g.class != GroupClass::New || remedies != [wanted.as_str()] {
        return Err(format!(
            "the group not known is {:?}, explained by {remedies:?}, expected new and \
             explained by {wanted} alone:\n{}",
            g.class,
            why()
        ));
    }
    Ok(())
}

/// `kvaudit hunt ARGS EXTRA --corpus CORPUS` (quiet unless `progress`; no `--corpus` when
/// `corpus` is `None`: the built-in one).
fn hunt(
    args: &[String],
    corpus: Option<&std::path::Path>,
    extra: &[&std::ffi::OsStr],
    progress: bool,
) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvaudit"));
    cmd.arg("hunt")
        .args(args)
        .args(extra)
        .env("KVAUDIT_DATE", "2026-12-01");
    if let Some(corpus) = corpus {
        cmd.arg("--corpus").arg(corpus);
    }
    if !progress {
        cmd.arg("-q");
    }
    cmd
}

fn read_summary(dir: &std::path::Path) -> Result<HuntSummary, String> {
    let path = dir.join("summary.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    HuntSummary::parse(&text).map_err(|e| e.to_string())
}

/// Runs `cmd` (a hunt with progress), calls `meanwhile` once its first entry starts, and
/// gives back its exit code and the rest of its stderr.
fn once_started(
    mut cmd: Command,
    meanwhile: &dyn Fn(u32) -> Result<(), String>,
) -> Result<(Option<i32>, Vec<String>), String> {
    use std::io::{BufRead, BufReader};
    let mut child = cmd
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let started = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.starts_with("[1/"));
    if !started {
        let _ = child.kill();
        return Err("the hunt never started an entry".into());
    }
    meanwhile(child.id())?;
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let code = child.wait().map_err(|e| e.to_string())?.code();
    Ok((code, rest))
}

/// Interrupts the hunt once its first entry starts; checks the partial summary.
fn interrupted(
    c: &HuntCase,
    corpus: &std::path::Path,
    dir: &std::path::Path,
) -> Result<(), String> {
    let cmd = hunt(
        &c.args,
        Some(corpus),
        &["--out".as_ref(), dir.as_os_str()],
        true,
    );
    let (code, rest) = once_started(cmd, &|pid| {
        Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status()
            .map(drop)
            .map_err(|e| e.to_string())
    })?;
    if code != Some(4) {
        return Err(format!("exit {code:?} after SIGINT, expected 4: {rest:?}"));
    }
    let partial = read_summary(dir)?;
    if !partial.incomplete {
        return Err("the summary after SIGINT is not marked incomplete".into());
    }
    Ok(())
}

/// Breaks the output folder once the first entry starts; the hunt must exit 3 with one line
/// on stderr and its partial summary written where that line says: marked failed, with what
/// it found.
fn broken_mid_run(
    c: &HuntCase,
    corpus: &std::path::Path,
    dir: &std::path::Path,
    how: Break,
) -> Result<(), String> {
    let out = dir.join("out");
    let aside = dir.join("tmp");
    std::fs::create_dir(&aside).map_err(|e| e.to_string())?;
    let mut cmd = hunt(
        &c.args,
        Some(corpus),
        &["--out".as_ref(), out.as_os_str()],
        true,
    );
    cmd.env("TMPDIR", &aside);
    let (code, rest) = once_started(cmd, &|_| {
        let broken = match how {
            Break::NewIsAFile => out.join("new"),
            Break::OutIsAFile => {
                std::fs::remove_dir_all(&out).map_err(|e| e.to_string())?;
                out.clone()
            }
        };
        std::fs::write(&broken, "not a folder").map_err(|e| e.to_string())
    })?;
    let errors: Vec<&String> = rest
        .iter()
        .filter(|l| l.starts_with("kvaudit: error:"))
        .collect();
    if code != Some(3) || errors.len() != 1 {
        return Err(format!(
            "exit {code:?}, expected 3 with one error line: {rest:?}"
        ));
    }
    let error = errors[0];
    let written = match how {
        Break::NewIsAFile => out.clone(),
        Break::OutIsAFile => {
            let folders: Vec<_> = std::fs::read_dir(&aside)
                .map_err(|e| e.to_string())?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            match folders.as_slice() {
                [one] if error.contains(&*one.to_string_lossy()) => one.clone(),
                _ => {
                    return Err(format!(
                        "no one folder aside that {error:?} names: {folders:?}"
                    ))
                }
            }
        }
    };
    let s = read_summary(&written)?;
    let markdown =
        std::fs::read_to_string(written.join("summary.md")).map_err(|e| e.to_string())?;
    if s.failed.is_none() || !markdown.contains("PARTIAL") {
        return Err(format!(
            "the summary in {} is not marked partial",
            written.display()
        ));
    }
    if s.groups.is_empty() || s.entries.is_empty() {
        return Err(format!(
            "the partial summary lost what was found:\n{}",
            s.to_terminal()
        ));
    }
    Ok(())
}

/// Every new group's files are of the case's extensions and hold its notes, the files are
/// there, and some group has a file of every extension.
fn new_group_files(c: &HuntCase, s: &HuntSummary, dir: &std::path::Path) -> Result<(), String> {
    let mut complete = false;
    for g in s.groups.iter().filter(|g| g.class == GroupClass::New) {
        let (notes, written): (Vec<&String>, Vec<&String>) =
            g.files.iter().partition(|f| f.starts_with('('));
        let mut extensions = Vec::new();
        for f in written.iter().filter(|f| !f.ends_with(".json")) {
            let ext = f.rsplit_once('.').map_or("", |(_, e)| e);
            if !c.new_group_files.iter().any(|e| e == ext) || !dir.join(f).is_file() {
                return Err(format!(
                    "new group file {f}: not one of {:?} written",
                    c.new_group_files
                ));
            }
            extensions.push(ext);
        }
        complete |= c
            .new_group_files
            .iter()
            .all(|e| extensions.contains(&e.as_str()));
        if let Some(want) = c
            .new_group_notes
            .iter()
            .find(|w| !notes.iter().any(|n| n.starts_with(w.as_str())))
        {
            return Err(format!(
                "a new group's files lack the note {want:?}: {:?}",
                g.files
            ));
        }
    }
    if !complete {
        return Err(format!(
            "no new group has a file of every one of {:?}:\n{}",
            c.new_group_files,
            s.to_terminal()
        ));
    }
    Ok(())
}

/// The hunt must stop before its first entry: exit 2, one line on stderr containing `why`,
/// and no summary.
fn refused(c: &HuntCase, dir: &std::path::Path, why: &str) -> Result<(), String> {
    let out = hunt(&c.args, None, &[], true)
        .current_dir(dir)
        .output()
        .map_err(|e| e.to_string())?;
    let (_, stderr) = super::exited(&out, 2)?;
    let lines: Vec<&str> = stderr.lines().collect();
    match lines.as_slice() {
        [line] if line.starts_with("kvaudit: error:") && line.contains(why) => {}
        _ => {
            return Err(format!(
                "expected one error line with {why:?}, got:\n{stderr}"
            ))
        }
    }
    let left: Vec<_> = std::fs::read_dir(dir).map_err(|e| e.to_string())?.collect();
    if !left.is_empty() {
        return Err(format!("a refused hunt left {} files behind", left.len()));
    }
    Ok(())
}

fn check(c: &HuntCase) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let empty = tempfile::tempdir().map_err(|e| e.to_string())?;
    let corpus = match (c.without_corpus, &c.corpus) {
        (true, _) => empty.path().to_path_buf(),
        (false, Some(dir)) => super::root().join(dir),
        (false, None) => super::root().join("corpora"),
    };
    if let Some(why) = &c.refused {
        return refused(c, dir.path(), why);
    }
    if let Some(how) = c.broken_mid_run {
        return broken_mid_run(c, &corpus, dir.path(), how);
    }
    let out_arg: [&std::ffi::OsStr; 2] = ["--out".as_ref(), dir.path().as_os_str()];
    let elsewhere = tempfile::tempdir().map_err(|e| e.to_string())?;
    let out = if c.from_another_folder {
        hunt(&c.args, None, &out_arg, false)
            .current_dir(elsewhere.path())
            .output()
    } else if let Some(m) = c.shards {
        let mut merge: Vec<std::ffi::OsString> = vec!["merge".into()];
        for k in 0..m {
            let part = dir.path().join(format!("shard-{k}"));
            let shard = format!("{k}/{m}");
            let o = hunt(
                &c.args,
                Some(&corpus),
                &[
                    "--shard".as_ref(),
                    shard.as_ref(),
                    "--out".as_ref(),
                    part.as_os_str(),
                ],
                false,
            )
            .output()
            .map_err(|e| e.to_string())?;
            if !matches!(o.status.code(), Some(0 | 1)) {
                return Err(format!(
                    "shard {shard}: {}",
                    String::from_utf8_lossy(&o.stderr)
                ));
            }
            merge.push(part.into_os_string());
        }
        Command::new(env!("CARGO_BIN_EXE_kvaudit"))
            .args(&merge)
            .args(out_arg)
            .arg("--corpus")
            .arg(&corpus)
            .env("KVAUDIT_DATE", "2026-12-01")
            .output()
    } else if c.interrupt {
        interrupted(c, &corpus, dir.path())?;
        hunt(
            &c.args,
            Some(&corpus),
            &["--resume".as_ref(), dir.path().as_os_str()],
            false,
        )
        .output()
    } else {
        hunt(&c.args, Some(&corpus), &out_arg, false).output()
    }
    .map_err(|e| e.to_string())?;
    let code = out.status.code().ok_or("killed by a signal")?;
    // Without an expected code, the summary decides between 0 and 1; any other code is the
    // harness breaking, and its stderr is the only account of why.
    let expected = c
        .exit
        .unwrap_or(if matches!(code, 0 | 1) { code } else { 1 });
    let (stdout, _) = super::exited(&out, expected)?;
    if c.plan_lists_everything {
        let registry = Registry::builtin();
        let wanted = Arch::ALL.iter().map(|a| a.memory().name()).chain(
            registry
                .iter()
                .filter(|o| o.reads() != Reads::Runs)
                .map(|o| o.id().name()),
        );
        for name in wanted {
            let listed = stdout
                .lines()
                .filter(|l| l.starts_with("memory types:") || l.starts_with("oracles:"))
                .any(|l| l.split([':', ',']).any(|w| w.trim() == name));
            if !listed {
                return Err(format!("--plan does not list {name}:\n{stdout}"));
            }
        }
    }
    for (entry, oracles) in &c.plan_leaves_out {
        let mut lines = stdout.lines();
        lines
            .find(|l| l.split_whitespace().next() == Some(entry.as_str()))
            .ok_or_else(|| format!("--plan has no entry {entry}:\n{stdout}"))?;
        let listed = lines
            .next()
            .and_then(|l| l.trim().strip_prefix("oracles:"))
            .ok_or_else(|| format!("--plan lists no oracles for {entry}:\n{stdout}"))?;
        if let Some(o) = oracles
            .iter()
            .find(|o| listed.split(',').any(|w| w.trim() == o.as_str()))
        {
            return Err(format!(
                "--plan lists {o} on {entry}, which it cannot judge: {listed}"
            ));
        }
    }
    if c.plan_all_supported {
        if let Some(line) = stdout.lines().find(|l| l.contains("UNSUPPORTED")) {
            return Err(format!("--plan has an unsupported entry: {line}\n{stdout}"));
        }
        if !stdout.lines().any(|l| l.contains("exhaustive depth")) {
            return Err(format!("--plan lists no entry that runs:\n{stdout}"));
        }
    }
    if c.plan_lists_everything || !c.plan_leaves_out.is_empty() || c.plan_all_supported {
        return Ok(());
    }
    let s = read_summary(dir.path())?;
    let says = if s.failing_groups() > 0 { 1 } else { 0 };
    if code != says {
        return Err(format!(
            "exit {code}, but the summary has {} new or regressed groups",
            s.failing_groups()
        ));
    }
    if s.incomplete {
        return Err("the summary is marked incomplete".into());
    }
    if c.from_another_folder {
        let shipped = super::data_files(&super::root().join("corpora"), "json").len();
        let decisions = super::data_files(&super::root().join("corpora/decisions"), "json").len();
        let said = format!("corpus: {shipped} files and {decisions} decisions, built into kvaudit");
        let markdown =
            std::fs::read_to_string(dir.path().join("summary.md")).map_err(|e| e.to_string())?;
        if !markdown.contains(&said) {
            return Err(format!("summary.md does not say {said:?}:\n{markdown}"));
        }
        if std::fs::read_dir(elsewhere.path())
            .map_err(|e| e.to_string())?
            .count()
            != 0
        {
            return Err("the hunt wrote into the folder it ran in".into());
        }
    }
    let ran: usize = s.entries.len() + s.unsupported.len() + s.skipped.len();
    let wanted = if s.only.is_empty() {
        s.plan.len()
    } else {
        s.only.len()
    };
    if ran != wanted {
        return Err(format!(
            "{ran} entries ran or were refused, of {wanted}:\n{}",
            s.to_terminal()
        ));
    }
    if let Budget::Seconds(b) = s.budget {
        if s.elapsed_s > b * 1.1 {
            return Err(format!("took {:.1} s on a budget of {b} s", s.elapsed_s));
        }
    }
    let why = || s.to_terminal();
    for g in &c.groups {
        let hit = s.groups.iter().find(
            |h| matches!(&h.group.cause, Cause::NativeFault { faults } if *faults == g.faults),
        );
        let Some(h) = hit else {
            return Err(format!("no group caused by {:?}:\n{}", g.faults, why()));
        };
        if h.class.word() != g.class {
            return Err(format!(
                "the {:?} group is {:?}, expected {}:\n{}",
                g.faults,
                h.class,
                g.class,
                why()
            ));
        }
        let file = match &h.class {
            GroupClass::Known { file } | GroupClass::Regressed { file } => Some(file),
            GroupClass::Decided { evidence, .. } => Some(evidence),
            // Known by fix: the remedy's files are the evidence (`by_fix`), not one file.
            GroupClass::KnownByFix { .. } | GroupClass::New => None,
        };
        if let Some(file) = file.filter(|f| !g.files.is_empty() && !g.files.contains(f)) {
            return Err(format!(
                "the {:?} group is matched to {file}, expected one of {:?}",
                g.faults, g.files
            ));
        }
        if let Some(want) = &g.root_cause {
            let named =
                matches!(&h.class, GroupClass::Decided { root_cause, .. } if root_cause == want);
            let markdown = std::fs::read_to_string(dir.path().join("summary.md"))
                .map_err(|e| e.to_string())?;
            let broken = markdown
                .split("## What is broken")
                .nth(1)
                .and_then(|rest| rest.split("\n## ").next())
                .unwrap_or("");
            let line = broken.lines().find(|l| l.contains(want.as_str()));
            if !named || line.is_none() {
                return Err(format!(
                    "the {:?} group is {:?}; summary.md's What is broken does not name {want}:\n{markdown}",
                    g.faults, h.class
                ));
            }
        }
    }
    if c.nothing_new && s.failing_groups() > 0 {
        return Err(format!(
            "{} new or regressed groups:\n{}",
            s.failing_groups(),
            why()
        ));
    }
    if c.no_fault_cause {
        if let Some(g) = s
            .groups
            .iter()
            .find(|g| matches!(g.group.cause, Cause::NativeFault { .. }))
        {
            return Err(format!(
                "a group rests on a native fault: {:?}\n{}",
                g.group.cause,
                why()
            ));
        }
    }
    let known = s
        .groups
        .iter()
        .filter(|g| matches!(g.class, GroupClass::Known { .. }))
        .count();
    if known < c.known_at_least {
        return Err(format!(
            "{known} known groups, expected at least {}:\n{}",
            c.known_at_least,
            why()
        ));
    }
    if c.new_groups_have_files {
        for g in s.groups.iter().filter(|g| g.class == GroupClass::New) {
            let repro = g.files.iter().find(|f| f.ends_with(".json"));
            match repro {
                // It parses as a repro file (a configuration pair's names its `vs_config`).
                Some(f) => {
                    kvaudit::outputs::repro::Repro::load(&dir.path().join(f))
                        .map_err(|e| format!("new group's repro file {f}: {e}"))?;
                }
                None => return Err(format!("new group without its repro file: {:?}", g.files)),
            }
        }
    }
    if !c.new_group_files.is_empty() || !c.new_group_notes.is_empty() {
        new_group_files(c, &s, dir.path())?;
    }
    let replayed = s
        .groups
        .iter()
        .filter(|g| g.class == GroupClass::New)
        .filter(|g| {
            g.group
                .oracles
                .iter()
                .any(|o| c.new_repros_replay.contains(&o.name().to_string()))
        });
    let mut replays = 0;
    for g in replayed {
        let f = g
            .files
            .iter()
            .find(|f| f.ends_with(".json"))
            .ok_or_else(|| format!("new group without its repro file: {:?}", g.files))?;
        let o = Command::new(env!("CARGO_BIN_EXE_kvaudit"))
            .arg("replay")
            .arg(dir.path().join(f))
            .output()
            .map_err(|e| e.to_string())?;
        super::exited(&o, 0).map_err(|e| format!("kvaudit replay {f}: {e}"))?;
        replays += 1;
    }
    if !c.new_repros_replay.is_empty() && replays == 0 {
        return Err(format!(
            "no new group of {:?} to replay:\n{}",
            c.new_repros_replay,
            why()
        ));
    }
    Ok(())
}
