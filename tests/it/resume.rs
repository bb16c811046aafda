//! Stopped and resumed audits (`tests/data/resume/*.json`): a run stopped halfway and continued
//! with `--resume` gives the report of a run that was never stopped (wall-clock figures aside).
//!
//! Two kinds of case. `stop_at` cases stop in process, at chosen places: the run is stopped
//! once N chunks of depth D are finished, its partial report goes through JSON and back, and the rest
//! runs from it (stopped again where a list has more numbers); `shard` resumes one shard and
//! merges it with the others. `signal` cases stop the real binary: it runs with `--out`, gets
//! the signal once a checkpoint of its last depth is on disk (it holds there until the signal,
//! through the test hook `KVAUDIT_TEST_HOLD_AT_DEPTH`; `group`: to its whole process
//! group, as a terminal's Ctrl-C, workers included), must exit with the "incomplete" code and
//! leave a partial report, and `--resume` must finish it into the report of an uninterrupted
//! run of the same command line.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use libtest_mimic::Trial;
use serde::Deserialize;
use serde_json::Value;

use kvaudit::base::domain::{Domain, DomainOverrides};
use kvaudit::base::exit;
use kvaudit::engines::explore::{ExhaustiveConfig, Explorer, RunControl};
use kvaudit::records::report::{merge, Event, Report, Shard};
use kvaudit::targets::registry::TargetSpec;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResumeCase {
    #[allow(dead_code)]
    about: String,
    target: String,
    #[serde(default)]
    inject: Vec<String>,
    domain: String,
    #[serde(default)]
    overrides: Option<Value>,
    depth: u32,
    /// In process: stop once `[depth, chunks]` is reached (that many chunks of that depth
    /// finished, or a later depth begun), resume, stop at the next pair...
    #[serde(default)]
    stop_at: Vec<(u32, usize)>,
    /// In process: resume shard K of M (`[K, M]`) and merge it with the other shards.
    #[serde(default)]
    shard: Option<(usize, usize)>,
    /// The binary: the command line after `audit` (without `--out`), and the signal.
    #[serde(default)]
    signal: Option<SignalCase>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignalCase {
    args: Vec<String>,
    /// `TERM` or `INT`.
    signal: String,
    /// To the process group (a terminal's Ctrl-C) rather than the audit's process alone.
    #[serde(default)]
    group: bool,
}

pub fn trials() -> Vec<Trial> {
    super::data_files(&super::root().join("tests/data/resume"), "json")
        .into_iter()
        .map(|(name, path)| {
            Trial::test(format!("resume::{name}"), move || {
                super::outcome(check(&path))
            })
        })
        .collect()
}

fn check(path: &std::path::Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let case: ResumeCase =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(s) = &case.signal {
        return check_signal(s);
    }
    let whole = run(&case, Shard::WHOLE, None, None)?;
    if whole.incomplete.is_some() {
        return Err("a run that was not stopped is marked incomplete".into());
    }
    let shard = match case.shard {
        Some((k, m)) => Shard::new(k, m).map_err(|e| e.to_string())?,
        None => Shard::WHOLE,
    };
    let mut partial: Option<Report> = None;
    for &stop_at in &case.stop_at {
        let r = run(&case, shard, partial.as_ref(), Some(stop_at))?;
        let Some(at) = &r.incomplete else {
            return Err(format!("stopped at {stop_at:?}, the run finished anyway"));
        };
        if !r.to_terminal().contains("INCOMPLETE") || merge(vec![r.clone()]).is_ok() {
            return Err(format!("a partial report ({at:?}) reads as a finished one"));
        }
        // Through the file format, as `--resume` reads it.
        partial = Some(Report::parse(&r.to_json()).map_err(|e| e.to_string())?);
    }
    let resumed = run(&case, shard, partial.as_ref(), None)?;
    let mut finished = match case.shard {
        Some((k, m)) => {
            let mut parts = vec![resumed];
            for other in (0..m).filter(|&i| i != k) {
                parts.push(run(&case, Shard::new(other, m).unwrap(), None, None)?);
            }
            merge(parts).map_err(|e| e.to_string())?
        }
        None => resumed,
    };
    same_run(&mut finished, whole)
}

/// `got` equals `want` but for wall-clock figures.
fn same_run(got: &mut Report, mut want: Report) -> Result<(), String> {
    got.timing = Default::default();
    want.timing = Default::default();
    if *got != want {
        return Err(format!(
            "the resumed run differs from the uninterrupted one:\nresumed: {}\nwhole: {}",
            got.to_json(),
            want.to_json()
        ));
    }
    Ok(())
}

/// Runs the case's audit in process, resuming after `partial`; with `stop_at` (depth, chunks),
/// stops there (a checkpoint comes after every chunk; chunks in flight still finish, but no
/// depth starts after a stop).
fn run(
    case: &ResumeCase,
    shard: Shard,
    partial: Option<&Report>,
    stop_at: Option<(u32, usize)>,
) -> Result<Report, String> {
    let mut domain = Domain::preset(&case.domain).ok_or(format!("no preset {}", case.domain))?;
    if let Some(o) = &case.overrides {
        let o: DomainOverrides =
            serde_json::from_value(o.clone()).map_err(|e| format!("overrides: {e}"))?;
        o.apply(&mut domain);
        domain.validate().map_err(|e| e.to_string())?;
    }
    let oracles = kvaudit::oracles::Registry::for_run(false).only(|o| !o.costly());
    let a = TargetSpec::new(&case.target, &case.inject)
        .with_observe(oracles.observe())
        .factory()?;
    let cfg = ExhaustiveConfig {
        domain,
        depth: case.depth,
        shard,
        threads: 2,
        batch: 256,
        oracles,
    };
    let stop = AtomicBool::new(false);
    let ctl = RunControl {
        resume: partial,
        checkpoint_every: Duration::ZERO,
        ..RunControl::new(&stop)
    };
    let explorer = Explorer::new(&cfg, a.as_ref(), None).map_err(|e| e.to_string())?;
    if let Some(p) = partial {
        kvaudit::engines::explore::check_resumes(p, &explorer.blank_report())
            .map_err(|e| e.to_string())?;
    }
    explorer
        .run(&ctl, &mut |e| {
            if let (Event::Checkpoint(r), Some((depth, chunks))) = (e, stop_at) {
                let at = r.incomplete.as_ref().expect("a checkpoint is partial");
                if (at.depth, at.chunks_done.len()) >= (depth, chunks) {
                    stop.store(true, Ordering::SeqCst);
                }
            }
        })
        .map_err(|e| e.to_string())
}

/// The binary with `args`, its report in `out`; its exit code.
fn audit(args: &[String], out: &std::path::Path, extra: &[&str]) -> Result<i32, String> {
    let status = Command::new(env!("CARGO_BIN_EXE_kvaudit"))
        .arg("audit")
        .args(args)
        .arg("--out")
        .arg(out)
        .args(extra)
        .arg("-q")
        .status()
        .map_err(|e| e.to_string())?;
    status
        .code()
        .ok_or_else(|| "killed by a signal".to_string())
}

fn check_signal(s: &SignalCase) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (whole_path, stopped_path) = (dir.path().join("whole.json"), dir.path().join("run.json"));
    let whole_exit = audit(&s.args, &whole_path, &[])?;
    let whole = Report::load(&whole_path).map_err(|e| e.to_string())?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvaudit"))
        .arg("audit")
        .args(&s.args)
        .arg("--out")
        .arg(&stopped_path)
        .arg("-q")
        // Holds once the first chunk of the last depth is done, until the signal: the test
        // stops it there however fast the machine is (docs/usage.md, test hooks).
        .env("KVAUDIT_TEST_HOLD_AT_DEPTH", whole.depth.to_string())
        // Its own process group, as a shell gives a foreground job: a group signal reaches the
        // audit and its workers, and nothing else.
        .process_group(0)
        .spawn()
        .map_err(|e| e.to_string())?;
    // A checkpoint of the last depth: the run is well under way, and held there.
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    loop {
        let at = Report::load(&stopped_path)
            .ok()
            .and_then(|r| r.incomplete)
            .map(|i| i.depth);
        if at == Some(whole.depth) {
            break;
        }
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!(
                "the run ended ({st}) before a checkpoint of its last depth"
            ));
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            return Err("no checkpoint of the last depth in 10 minutes".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let target = if s.group {
        format!("-{}", child.id())
    } else {
        child.id().to_string()
    };
    let sent = Command::new("kill")
        .arg(format!("-{}", s.signal))
        .arg("--")
        .arg(&target)
        .status()
        .map_err(|e| e.to_string())?;
    if !sent.success() {
        return Err(format!("kill -{} {target} failed", s.signal));
    }
    let code = child.wait().map_err(|e| e.to_string())?.code();
    if code != Some(exit::INCOMPLETE) {
        return Err(format!(
            "stopped by SIG{}: exit {code:?}, expected {}",
            s.signal,
            exit::INCOMPLETE
        ));
    }
    let partial = Report::load(&stopped_path).map_err(|e| e.to_string())?;
    if partial.incomplete.is_none() {
        return Err("the stopped run's report is not marked incomplete".into());
    }
    let resumed_exit = audit(
        &s.args,
        &stopped_path,
        &["--resume", &stopped_path.to_string_lossy()],
    )?;
    if resumed_exit != whole_exit {
        return Err(format!(
            "resumed: exit {resumed_exit}, uninterrupted: {whole_exit}"
        ));
    }
    let mut resumed = Report::load(&stopped_path).map_err(|e| e.to_string())?;
    same_run(&mut resumed, whole)
}
