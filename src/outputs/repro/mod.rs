//! Repro files: a minimal failing trace stored as a value, plus what it shows and where.
//!
//! proptest's `proptest-regressions/` stores seeds, which stop reproducing when a generator
//! changes; a repro file stores the trace itself (setup and ops, in the op JSON of
//! [`crate::base::op`]), the oracle and kind of violation, the step where it shows, what was observed
//! and expected there, and per target whether the oracle `fails` there or `holds`. It is JSON,
//! written by [`Repro::to_text`] in one stable layout (one op per line, fixed key order,
//! trailing newline) so that it reads well in a bug report and diffs well in review.
//!
//! `fails` means: on that target the oracle is first violated at the recorded step, with the
//! recorded kind, sequence and observation (compared exactly); an entry may override step,
//! kind, sequence and observation where one target fails differently. `holds` means the oracle
//! is never violated on the trace. An expectation's second side, for the oracles that compare
//! two, is another target (`vs`) or the same target under another configuration (`vs_config`).
//! [`check`] replays one expectation; a bug that went away is news too ([`Status::Fixed`]). A target that cannot be built or driven is
//! [`Status::Unavailable`], never a pass.
//!
//! A file may carry what people decided its class is (`decision`, [`decision`]: real, a contract
//! question, by design, a guard, an artifact, a tolerance, with its root cause); a file without
//! one parses as before, a decision word kvaudit does not know is an error.
//!
//! Repro files travel (bug reports, CI), so a file is hostile until parsed: it is read up to
//! [`MAX_REPRO_BYTES`], its trace must stay inside [`check_trace_limits`] (shared with reports, in `base::domain`), and its free-text
//! fields may hold no control characters. Files written from repros get names made by
//! [`safe_file_name`] and are written by [`write_output`], which refuses a symlink.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::base::cache::Observe;
pub use crate::base::domain::check_trace_limits;
use crate::base::error::Error;
use crate::base::files::{check_input_size, read_text_limited, write_atomically};
use crate::base::op::{Op, SeqId, Trace};
use crate::oracles::{OracleId, Reads, Registry};
use crate::records::report::{terminal_text, Finding};
use crate::running::judge::{Judge, RunJudgement};
use crate::targets::registry::TargetSpec;
use decision::Decision;

/// The largest repro or trace file kvaudit reads (64 MiB): far above any shrunk repro (a few KB)
/// or fuzz trace, small enough that parsing one cannot exhaust memory.
pub const MAX_REPRO_BYTES: u64 = 64 << 20;
/// Longest file name [`safe_file_name`] makes, in bytes (file systems allow 255).
pub const MAX_FILE_NAME_BYTES: usize = 120;

/// `name` as a file name that stays in the folder it is joined to: ASCII letters, digits, `-`,
/// `_` and `.` only (a path separator, NUL, control character or anything else becomes `_`), no
/// leading `.` (no `..`, no hidden file), at most [`MAX_FILE_NAME_BYTES`] bytes (the extension
/// kept), never empty.
pub fn safe_file_name(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' => c,
            _ => '_',
        })
        .collect();
    while s.starts_with('.') {
        s.replace_range(..1, "_");
    }
    if s.len() > MAX_FILE_NAME_BYTES {
        let ext = s
            .rfind('.')
            .map(|i| s[i..].to_string())
            .filter(|e| e.len() <= 16)
            .unwrap_or_default();
        s.truncate(MAX_FILE_NAME_BYTES - ext.len());
        s.push_str(&ext);
    }
    if s.is_empty() {
        s.push('_');
    }
    s
}

/// Writes a file kvaudit made (a repro, a C reproducer) to `path`, atomically, unless `path` is a
/// symlink: a link planted where an output goes would otherwise redirect the write (the rename
/// replaces the link, but a user who made one meant something else), so it is refused.
pub fn write_output(path: &Path, text: &str) -> Result<(), Error> {
    if path
        .symlink_metadata()
        .is_ok_and(|m| m.file_type().is_symlink())
    {
        return Err(format!(
            "{}: is a symbolic link; refusing to write through it",
            path.display()
        )
        .into());
    }
    write_atomically(path, text)
        .map_err(|e| Error::harness(format!("{}: cannot write: {e}", path.display())))
}

/// Fields of a repro file that are one line of text: no control characters (they would rewrite
/// a terminal or split a line of a report).
fn check_one_line(field: &str, text: &str) -> Result<(), String> {
    match text.char_indices().find(|(_, c)| c.is_control()) {
        Some((at, c)) => Err(format!(
            "\"{field}\": control character U+{:04X} at byte {at}; the field is one line of text",
            c as u32
        )),
        None => Ok(()),
    }
}

/// What a target does on the trace, as recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expect {
    /// The oracle is first violated at the recorded step, as recorded.
    Fails,
    /// The oracle is never violated.
    Holds,
}

/// One target (or pair of targets, for the differential oracle) and what the trace does there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetExpectation {
    /// Target name, as on the command line (`native`, `llama.cpp@0.1.156`).
    pub target: String,
    /// Injected faults (native only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<String>,
    /// The second target, for the differential oracle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vs: Option<String>,
    /// Faults of the second target.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vs_faults: Vec<String>,
    /// The second side is the target itself under this configuration (`--vs-config`,
    /// `kv_unified=false`): a configuration pair, judged by `config-differential`. Exclusive
    /// with `vs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vs_config: Option<String>,
    /// What the trace does there.
    pub expect: Expect,
    /// Where another oracle than the file's decides on this target: an older version that
    /// crashes on the trace (a bug of its own) before the file's oracle can judge it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracle: Option<OracleId>,
    /// Where this target fails at another step than the file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<usize>,
    /// Where this target fails with another kind than the file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Where this target fails on another sequence than the file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<SeqId>,
    /// Where this target observes something else than the file's `observed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<Value>,
}

impl TargetExpectation {
    /// An expectation on `target` (and `vs`), with no overrides.
    pub fn new(target: &TargetSpec, vs: Option<&TargetSpec>, expect: Expect) -> Self {
        TargetExpectation {
            target: target.name.clone(),
            faults: target.faults.clone(),
            vs: vs.map(|v| v.name.clone()),
            vs_faults: vs.map(|v| v.faults.clone()).unwrap_or_default(),
            vs_config: None,
            expect,
            oracle: None,
            step: None,
            kind: None,
            seq: None,
            observed: None,
        }
    }

    /// The target spec, and the second one.
    pub fn specs(&self) -> (TargetSpec, Option<TargetSpec>) {
        let spec = |name: &str, faults: &[String]| {
            TargetSpec::new(name, faults).with_observe(Observe::ALL_WITH_PROBE)
        };
        (
            spec(&self.target, &self.faults),
            self.vs.as_ref().map(|v| spec(v, &self.vs_faults)),
        )
    }

    /// `native[refcount]`, or `A vs B`: what test names and messages call it.
    pub fn label(&self) -> String {
        let one = |name: &str, faults: &[String]| {
            let mut s = name.to_string();
            for f in faults {
                s.push_str(&format!("[{f}]"));
            }
            s
        };
        let a = one(&self.target, &self.faults);
        match (&self.vs, &self.vs_config) {
            // As a configuration pair's second runner names itself (`running::Reconfigured`).
            (_, Some(config)) => format!("{a} vs {a} ({config})"),
            (Some(vs), None) => format!("{a} vs {}", one(vs, &self.vs_faults)),
            (None, None) => a,
        }
    }
}

/// The target(s) a violation of `oracle` belongs to, given the run's targets `a` and `b`: the
/// pair for the differential oracle, `b` alone for `b`'s own crash (`on_vs`), else `a` alone
/// (I1 and I2 judge target A only).
pub fn targets_of(
    oracle: OracleId,
    on_vs: bool,
    a: &TargetSpec,
    b: Option<&TargetSpec>,
) -> (TargetSpec, Option<TargetSpec>) {
    let pair = Registry::builtin()
        .get(oracle)
        .is_some_and(|o| o.reads() == Reads::Pair);
    match (b, pair, on_vs) {
        (Some(b), true, _) => (a.clone(), Some(b.clone())),
        (Some(b), _, true) => (b.clone(), None),
        _ => (a.clone(), None),
    }
}

/// How a repro was found, when a fuzz run or a shrink made it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Found {
    /// The fuzz seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// The fuzz case (from 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub case: Option<u64>,
    /// Length of the trace before shrinking.
    pub length: usize,
    /// Its first failing step.
    pub step: usize,
    /// Target executions the shrink took.
    pub shrink_executions: u64,
}

/// A repro file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Repro {
    /// One line: what the trace does.
    pub repro: String,
    /// One line: why, in the target's code.
    pub postmortem: String,
    /// The date (UTC, `YYYY-MM-DD`) the repro was recorded.
    pub since: String,
    /// Which oracle.
    pub oracle: OracleId,
    /// The kind of violation.
    pub kind: String,
    /// Setup and ops.
    pub trace: Trace,
    /// 1-based step where the violation first shows.
    pub step: usize,
    /// The sequence concerned, where there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<SeqId>,
    /// What the target said at that step.
    pub observed: Value,
    /// What the oracle expected.
    pub expected: Value,
    /// Per target: fails or holds.
    pub targets: Vec<TargetExpectation>,
    /// How it was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found: Option<Found>,
    /// The root cause this repro represents, for a fuzz run's repro: the evidence and how many
    /// findings of the run it stands for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<ReproGroup>,
    /// What people decided the file's class is ([`decision`]); optional, so files from before
    /// decisions were data parse as they did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
}

/// The root-cause group a repro file represents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReproGroup {
    /// The evidence that its findings are one bug.
    pub cause: crate::records::group::Cause,
    /// How many findings of the run the group holds (this repro is the smallest).
    pub findings: usize,
}

fn compact<T: Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).expect("repro values serialize")
}

fn op_lines(s: &mut String, indent: &str, ops: &[Op]) {
    if ops.is_empty() {
        s.push_str("[]");
        return;
    }
    s.push_str("[\n");
    for (i, op) in ops.iter().enumerate() {
        let comma = if i + 1 < ops.len() { "," } else { "" };
        let _ = writeln!(s, "{indent}  {}{comma}", op.to_json());
    }
    s.push_str(indent);
    s.push(']');
}

/// The ops of a trace as a short, file-name-safe string: `seq_cp_seq_cp_seq_keep`.
fn op_names(ops: &[Op], most: usize) -> String {
    let mut names: Vec<&str> = ops.iter().take(most).map(Op::name).collect();
    if ops.len() > most {
        names.push("etc");
    }
    names.join("_")
}

impl Repro {
    /// A repro of `f`, recorded on `since`, with these expectations.
    pub fn from_finding(
        f: &Finding,
        since: &str,
        targets: Vec<TargetExpectation>,
        found: Option<Found>,
    ) -> Self {
        let names: Vec<&str> = f.trace.ops.iter().map(Op::name).collect();
        let seq = f.seq.map(|s| format!(" (seq {s})")).unwrap_or_default();
        Repro {
            repro: format!(
                "{}: {} {}{seq} at step {}",
                names.join(", "),
                f.oracle,
                f.kind,
                f.step
            ),
            postmortem: String::new(),
            since: since.to_string(),
            oracle: f.oracle,
            kind: f.kind.clone(),
            trace: f.trace.clone(),
            step: f.step,
            seq: f.seq,
            observed: f.observed.clone(),
            expected: f.expected.clone(),
            targets,
            found,
            group: None,
            decision: None,
        }
    }

    /// A file name for it: oracle and op names, e.g. `i1_seq_cp_seq_cp_seq_keep.json`, made
    /// safe by [`safe_file_name`] (names come from kvaudit's own enums today; the check keeps it
    /// so if a name ever comes from a file).
    pub fn file_name(&self) -> String {
        safe_file_name(&format!(
            "{}_{}.json",
            self.oracle.name().to_ascii_lowercase(),
            op_names(&self.trace.ops, 6)
        ))
    }

    /// The file text: JSON in one stable layout, one op per line, trailing newline.
    pub fn to_text(&self) -> String {
        let mut s = String::from("{\n");
        let _ = writeln!(s, "  \"repro\": {},", compact(&self.repro));
        let _ = writeln!(s, "  \"postmortem\": {},", compact(&self.postmortem));
        let _ = writeln!(s, "  \"since\": {},", compact(&self.since));
        let _ = writeln!(s, "  \"oracle\": {},", compact(&self.oracle));
        let _ = writeln!(s, "  \"kind\": {},", compact(&self.kind));
        let setup = &self.trace.setup;
        s.push_str("  \"trace\": {\n    \"setup\": {\n");
        let _ = writeln!(s, "      \"n_ctx\": {},", setup.n_ctx);
        let _ = writeln!(s, "      \"n_seq_max\": {},", setup.n_seq_max);
        // The configuration fields, as the setup serializes them (defaults left out), so a
        // repro replays under the configuration it was found in.
        if let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(setup) {
            for (k, v) in fields
                .iter()
                .filter(|(k, _)| !["n_ctx", "n_seq_max", "ops"].contains(&k.as_str()))
            {
                let _ = writeln!(s, "      {}: {},", compact(&k.as_str()), compact(v));
            }
        }
        s.push_str("      \"ops\": ");
        op_lines(&mut s, "      ", &setup.ops);
        s.push_str("\n    },\n    \"ops\": ");
        op_lines(&mut s, "    ", &self.trace.ops);
        s.push_str("\n  },\n");
        let _ = writeln!(s, "  \"step\": {},", self.step);
        if let Some(seq) = self.seq {
            let _ = writeln!(s, "  \"seq\": {seq},");
        }
        let _ = writeln!(s, "  \"observed\": {},", compact(&self.observed));
        let _ = writeln!(s, "  \"expected\": {},", compact(&self.expected));
        s.push_str("  \"targets\": [\n");
        for (i, t) in self.targets.iter().enumerate() {
            let comma = if i + 1 < self.targets.len() { "," } else { "" };
            let _ = writeln!(s, "    {}{comma}", compact(t));
        }
        s.push_str("  ]");
        if let Some(found) = &self.found {
            let _ = write!(s, ",\n  \"found\": {}", compact(found));
        }
        if let Some(group) = &self.group {
            let _ = write!(s, ",\n  \"group\": {}", compact(group));
        }
        if let Some(decision) = &self.decision {
            let _ = write!(s, ",\n  \"decision\": {}", compact(decision));
        }
        s.push_str("\n}\n");
        s
    }

    /// Parses and checks a repro file's text. Errors say where (line and column) and what.
    pub fn parse(text: &str) -> Result<Repro, Error> {
        check_input_size(text.len() as u64, MAX_REPRO_BYTES, "a repro file")?;
        let r: Repro = serde_json::from_str(text)
            .map_err(|e| format!("{}not a kvaudit repro file: {}", at(&e), message(&e)))?;
        r.validate()?;
        Ok(r)
    }

    /// Reads and parses a repro file; errors name the file.
    pub fn load(path: &Path) -> Result<Repro, Error> {
        let text = read_text_limited(path, MAX_REPRO_BYTES)?;
        Self::parse(&text).map_err(|e| e.context(path.display()))
    }

    /// Checks what the JSON schema cannot.
    pub fn validate(&self) -> Result<(), Error> {
        let n = self.trace.ops.len();
        let in_trace = |step: usize, what: &str| {
            if step == 0 || step > n {
                Err(format!(
                    "{what}: {step} is not a step of the trace's {n} ops"
                ))
            } else {
                Ok(())
            }
        };
        in_trace(self.step, "\"step\"")?;
        if let Some(d) = &self.decision {
            d.validate()?;
        }
        check_trace_limits(&self.trace).map_err(|e| format!("\"trace\": {e}"))?;
        check_one_line("repro", &self.repro)?;
        check_one_line("postmortem", &self.postmortem)?;
        check_one_line("since", &self.since)?;
        check_one_line("kind", &self.kind)?;
        // Replay prints these as JSON, which escapes C0 controls but not DEL or C1 (U+009B is a
        // one-byte CSI to some terminals).
        check_one_line("observed", &self.observed.to_string())?;
        check_one_line("expected", &self.expected.to_string())?;
        let reads = Registry::builtin().get(self.oracle).map(|o| o.reads());
        let pair = match reads {
            Some(Reads::Step) | Some(Reads::Crash) => false,
            Some(Reads::Pair) => true,
            _ => {
                return Err(format!(
                    "\"oracle\": {} runs traces of its own; repro files hold findings of the oracles that judge observations",
                    self.oracle
                ).into())
            }
        };
        if self.targets.is_empty() {
            return Err("\"targets\": at least one target expectation is needed".into());
        }
        for t in &self.targets {
            let names = std::iter::once(&t.target)
                .chain(&t.faults)
                .chain(&t.vs)
                .chain(&t.vs_faults)
                .chain(&t.vs_config)
                .chain(&t.kind);
            for name in names {
                check_one_line("targets", name)?;
            }
            if let Some(observed) = &t.observed {
                check_one_line("targets", &observed.to_string())?;
            }
            if let Some(step) = t.step {
                in_trace(step, &format!("target {}: \"step\"", t.label()))?;
            }
            if let Some(config) = &t.vs_config {
                if t.vs.is_some() {
                    return Err(format!(
                        "target {}: \"vs\" and \"vs_config\" both name a second side; give one",
                        t.label()
                    )
                    .into());
                }
                self.trace
                    .setup
                    .with_config(config)
                    .map_err(|e| format!("target {}: \"vs_config\": {e}", t.label()))?;
            }
            if pair != (t.vs.is_some() || t.vs_config.is_some()) {
                return Err(format!(
                    "target {}: a repro of {}, which compares two targets, needs \"vs\" (or \"vs_config\") on every target; other oracles none",
                    t.label(),
                    self.oracle
                ).into());
            }
        }
        Ok(())
    }
}

/// `line L, column C: ` of a JSON error.
fn at(e: &serde_json::Error) -> String {
    format!("line {}, column {}: ", e.line(), e.column())
}

/// A JSON error's message without serde's own ` at line L column C` suffix, safe for a
/// terminal (serde quotes the offending value, which the file's author chose).
fn message(e: &serde_json::Error) -> String {
    let s = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    terminal_text(s.strip_suffix(&suffix).unwrap_or(&s))
}

/// Reads a file that holds either a repro or a bare trace (`{"setup": .., "ops": [..]}`).
pub fn load_trace_or_repro(path: &Path) -> Result<(Trace, Option<Repro>), Error> {
    let text = read_text_limited(path, MAX_REPRO_BYTES)?;
    let at = |e: serde_json::Error, what: &str| {
        format!(
            "{}: {}not a {what}: {}",
            path.display(),
            at(&e),
            message(&e)
        )
    };
    let v: Value = serde_json::from_str(&text).map_err(|e| at(e, "JSON file"))?;
    if v.get("trace").is_some() {
        let r = Repro::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok((r.trace.clone(), Some(r)))
    } else {
        let t: Trace = serde_json::from_str(&text).map_err(|e| at(e, "trace or repro file"))?;
        check_trace_limits(&t).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok((t, None))
    }
}

mod dates;
pub mod decision;
mod junit;
mod replay;

pub use dates::{check_date, today_utc};
pub use junit::junit_xml;
pub use replay::{
    check, judge_entry, judge_expectation, judge_on, measure, parse_label, replay, replay_file,
    repro_files, EntryResult, FileResult, ReplayFilter, Second, Status,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::op::{Decode, Setup};
    use dates::civil_date;

    fn seed_repro() -> Repro {
        let cp = Op::SeqCp {
            src: 0,
            dst: 1,
            p0: 0,
            p1: 3,
        };
        Repro {
            repro: "seq_cp twice then seq_keep leaves a stale seq_pos_max".into(),
            postmortem: "seq_cp adds dst without checking seq_has".into(),
            since: "2026-11-29".into(),
            oracle: OracleId::I1,
            kind: "pos_min and pos_max stale on an empty sequence".into(),
            trace: Trace {
                setup: Setup {
                    n_ctx: 256,
                    n_seq_max: 2,
                    ops: vec![Op::Decode(Decode::next(0, 7))],
                    ..Setup::default()
                },
                ops: vec![cp.clone(), cp, Op::SeqKeep { seq: 0 }],
            },
            step: 3,
            seq: Some(1),
            observed: serde_json::json!({"pos_min": 0, "pos_max": 2}),
            expected: serde_json::json!({"pos_min": -1, "pos_max": -1, "cells": []}),
            targets: vec![
                TargetExpectation::new(
                    &TargetSpec::new("native", &["refcount".into()]),
                    None,
                    Expect::Fails,
                ),
                TargetExpectation::new(&TargetSpec::new("native", &[]), None, Expect::Holds),
            ],
            found: None,
            group: None,
            decision: None,
        }
    }

    #[test]
    fn repro_files_round_trip_byte_for_byte() {
        let r = seed_repro();
        let text = r.to_text();
        assert!(text.ends_with("}\n"));
        assert!(
            text.contains("\n      {\"op\":\"seq_keep\",\"seq\":0}\n    ]\n"),
            "{text}"
        );
        let back = Repro::parse(&text).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.to_text(), text);
        let with_found = Repro {
            found: Some(Found {
                seed: Some(1),
                case: Some(4),
                length: 40,
                step: 33,
                shrink_executions: 100,
            }),
            trace: Trace {
                setup: Setup::default(),
                ..r.trace.clone()
            },
            ..r
        };
        let text = with_found.to_text();
        assert!(text.contains("\"ops\": []"), "{text}");
        assert_eq!(Repro::parse(&text).unwrap().to_text(), text);
    }

    #[test]
    fn the_setup_configuration_survives_the_file() {
        let mut r = seed_repro();
        r.trace.setup = r
            .trace
            .setup
            .with_config("kv_unified=false,n_ubatch=4,flash_attn=on,type_k=q8_0")
            .unwrap();
        let text = r.to_text();
        assert!(text.contains("\"kv_unified\": false,"), "{text}");
        let back = Repro::parse(&text).unwrap();
        assert_eq!(back.trace.setup, r.trace.setup);
        assert_eq!(back.to_text(), text);
    }

    #[test]
    fn expectations_are_replayed_and_news_is_news() {
        let r = seed_repro();
        let res: Vec<Status> = r.targets.iter().map(|e| check(&r, e).status).collect();
        assert!(res.iter().all(Status::passed), "{res:?}");
        // A changed observation names the step.
        let mut edited = r.clone();
        edited.observed = serde_json::json!({"pos_min": 0, "pos_max": 3});
        let s = check(&edited, &edited.targets[0]).status;
        assert!(matches!(s, Status::Changed(_)), "{s:?}");
        assert!(s.detail().contains("step 3"), "{}", s.detail());
        // "fails" on a target where it holds: fixed is news.
        let mut fixed = r.clone();
        fixed.targets[1].expect = Expect::Fails;
        let s = check(&fixed, &fixed.targets[1]).status;
        assert!(matches!(s, Status::Fixed(_)), "{s:?}");
        // An unknown target is unavailable, not a pass.
        let mut gone = r.clone();
        gone.targets[0].target = "vllm".into();
        let s = check(&gone, &gone.targets[0]).status;
        assert!(matches!(s, Status::Unavailable(_)) && !s.passed(), "{s:?}");
    }

    #[test]
    fn measure_records_what_a_target_does() {
        let r = seed_repro();
        let m = measure(&r, &TargetSpec::new("native", &["refcount".into()]), None).unwrap();
        assert_eq!(m, r.targets[0]);
        let m = measure(&r, &TargetSpec::new("native", &[]), None).unwrap();
        assert_eq!(m.expect, Expect::Holds);
    }

    #[test]
    fn malformed_files_say_where() {
        let e = Repro::parse("{\n  \"repro\": \"x\",\n  \"oracle\": \"I9\"\n}").unwrap_err();
        assert!(e.message.starts_with("line 3, column"), "{e}");
        let mut r = seed_repro();
        r.step = 4;
        let e = Repro::parse(&r.to_text()).unwrap_err();
        assert!(e.message.contains("\"step\": 4"), "{e}");
    }

    #[test]
    fn junit_has_one_case_per_file() {
        let r = seed_repro();
        let ok = FileResult {
            path: "corpora/a.json".into(),
            entries: Ok(r.targets.iter().map(|e| check(&r, e)).collect()),
            elapsed_s: 0.001,
        };
        let mut edited = r.clone();
        edited.step = 2;
        let bad = FileResult {
            path: "corpora/b<&>.json".into(),
            entries: Ok(vec![check(&edited, &edited.targets[0])]),
            elapsed_s: 0.002,
        };
        let broken = FileResult {
            path: "corpora/c.json".into(),
            entries: Err("corpora/c.json: line 1, column 1: EOF".into()),
            elapsed_s: 0.0,
        };
        let xml = junit_xml(&[ok, bad, broken]);
        assert!(xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"));
        assert!(
            xml.contains("tests=\"3\" failures=\"1\" errors=\"1\""),
            "{xml}"
        );
        assert_eq!(xml.matches("<testcase ").count(), 3);
        assert!(xml.contains("name=\"b&lt;&amp;&gt;\""), "{xml}");
        assert!(xml.contains("<failure type=\"changed\""), "{xml}");
        assert!(xml.contains("<error type=\"harness\""), "{xml}");
        assert_eq!(xml.matches("</testcase>").count(), 3);
    }

    #[test]
    fn labels_parse_back() {
        let s = parse_label("native[refcount][seq_rm_off_by_one]").unwrap();
        assert_eq!(s.faults, ["refcount", "seq_rm_off_by_one"]);
        assert_eq!(
            parse_label("llama.cpp@0.1.156").unwrap().name,
            "llama.cpp@0.1.156"
        );
        assert!(parse_label("native[refcount").is_err());
    }

    #[test]
    fn dates() {
        assert_eq!(civil_date(0), "1970-01-01");
        assert_eq!(civil_date(20_786), "2026-11-29");
        assert!(check_date("2026-11-29").is_ok());
        assert!(check_date("2026-13-01").is_err());
        assert!(check_date("29/11/2026").is_err());
    }
}
