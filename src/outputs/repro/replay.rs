//! Replaying a repro file: each recorded expectation run on its target(s) and judged, with a
//! status per expectation (confirmed, fixed, regressed, changed, unrecorded, unavailable), and
//! measuring what a trace does on a new target.

use super::*;

/// The outcome of replaying one expectation.
#[derive(Clone, Debug, PartialEq)]
pub enum Status {
    /// The recorded expectation still holds.
    Confirmed(String),
    /// Recorded as failing, and now the oracle holds: the bug looks fixed on this target.
    Fixed(String),
    /// Recorded as holding, and now the oracle fails.
    Regressed(String),
    /// Recorded as failing, and it fails otherwise (another step, kind or observation).
    Changed(String),
    /// No expectation is recorded for this target; this is what it does.
    Unrecorded(String),
    /// The target could not be built or driven, or stopped at an unsupported op: the
    /// expectation could not be checked.
    Unavailable(String),
}

impl Status {
    /// True if replay should pass: confirmed, or nothing recorded to contradict.
    pub fn passed(&self) -> bool {
        matches!(self, Status::Confirmed(_) | Status::Unrecorded(_))
    }

    /// A short word for tables.
    pub fn word(&self) -> &'static str {
        match self {
            Status::Confirmed(_) => "ok",
            Status::Fixed(_) => "FIXED",
            Status::Regressed(_) => "REGRESSED",
            Status::Changed(_) => "CHANGED",
            Status::Unrecorded(_) => "unrecorded",
            Status::Unavailable(_) => "UNAVAILABLE",
        }
    }

    /// What happened, in a sentence or two.
    pub fn detail(&self) -> &str {
        match self {
            Status::Confirmed(d)
            | Status::Fixed(d)
            | Status::Regressed(d)
            | Status::Changed(d)
            | Status::Unrecorded(d)
            | Status::Unavailable(d) => d,
        }
    }
}

/// One expectation replayed.
#[derive(Clone, Debug, PartialEq)]
pub struct EntryResult {
    /// The target's label.
    pub label: String,
    /// What happened.
    pub status: Status,
    /// Target executions spent.
    pub executions: u64,
}

fn describe(step: usize, kind: &str, seq: Option<SeqId>, observed: &Value) -> String {
    let seq = seq.map(|s| format!(", seq {s}")).unwrap_or_default();
    format!("at step {step} ({kind}{seq}) with observed {observed}")
}

/// Runs the repro's trace on `entry`'s target(s) and judges every step.
fn run_on(repro: &Repro, entry: &TargetExpectation) -> Result<(RunJudgement, u64), String> {
    let (a, b) = entry.specs();
    let second = match (&entry.vs_config, &b) {
        (Some(config), _) => Second::Config(config),
        (None, Some(b)) => Second::Target(b),
        (None, None) => Second::None,
    };
    run_specs(repro, &a, second)
}

/// The second side of a replay.
pub enum Second<'a> {
    /// One target alone.
    None,
    /// Another target (`vs`).
    Target(&'a TargetSpec),
    /// The target itself under another configuration (`vs_config`).
    Config(&'a str),
}

/// Runs the repro's trace on `a` (and the second side), as the specs say what to observe, and
/// what the repro's oracle reads beyond that (the reload probe is in no spec's default).
fn run_specs(repro: &Repro, a: &TargetSpec, b: Second<'_>) -> Result<(RunJudgement, u64), String> {
    let reads = crate::oracles::Registry::builtin()
        .get(repro.oracle)
        .map_or(Observe::BASIC, |o| o.observes());
    let widen = |s: &TargetSpec| s.clone().with_observe(s.observe.union(reads));
    let fa = widen(a).factory()?;
    let fb = match b {
        Second::None => None,
        Second::Target(b) => Some(widen(b).factory()?),
        Second::Config(config) => Some(crate::running::runner::reconfigured_factory(
            widen(a).factory()?,
            config.to_string(),
        )),
    };
    let mut judge = Judge::new(fa.as_ref(), fb.as_deref()).map_err(|e| e.to_string())?;
    let j = judge.run(&repro.trace).map_err(|e| e.to_string())?;
    Ok((j, judge.executions()))
}

/// Runs the repro's trace on `target` (and the `second` side, for a pair oracle), observing
/// what the specs say, and judges every step, with no expectation to compare: what a version
/// matrix or a bisection classifies. `Err`: the target could not be built or driven.
pub fn judge_on(
    repro: &Repro,
    target: &TargetSpec,
    second: Second<'_>,
) -> Result<RunJudgement, Error> {
    run_specs(repro, target, second)
        .map(|(j, _)| j)
        .map_err(Error::harness)
}

/// Runs the repro's trace as `entry` names it (target, second target or configuration) and
/// judges every step, with no expectation to compare: what a fix's check compares between a
/// pin and the same pin with the fix. `Err`: the target could not be built or driven.
pub fn judge_entry(repro: &Repro, entry: &TargetExpectation) -> Result<RunJudgement, Error> {
    run_on(repro, entry).map(|(j, _)| j).map_err(Error::harness)
}

/// Replays one expectation of `repro`.
pub fn check(repro: &Repro, entry: &TargetExpectation) -> EntryResult {
    let label = entry.label();
    let (j, executions) = match run_on(repro, entry) {
        Ok(x) => x,
        Err(e) => {
            return EntryResult {
                label,
                status: Status::Unavailable(format!("not available: {e}")),
                executions: 0,
            }
        }
    };
    let status = judge_expectation(repro, entry, &j);
    EntryResult {
        label,
        status,
        executions,
    }
}

/// Compares what the oracles said about the repro's trace with `entry`'s expectation.
pub fn judge_expectation(repro: &Repro, entry: &TargetExpectation, j: &RunJudgement) -> Status {
    let oracle = entry.oracle.unwrap_or(repro.oracle);
    let first = j.first(oracle);
    let want_step = entry.step.unwrap_or(repro.step);
    let want_kind = entry.kind.as_deref().unwrap_or(&repro.kind);
    // An entry under another oracle than the file's says its own sequence and observation.
    let overridden = entry.oracle.is_some();
    let want_seq = if overridden {
        entry.seq
    } else {
        entry.seq.or(repro.seq)
    };
    let want_observed = match &entry.observed {
        Some(observed) => observed,
        None if overridden => &Value::Null,
        None => &repro.observed,
    };
    let n = repro.trace.ops.len();
    // A crash that ends the run leaves the steps after it unjudged: neither "holds on every
    // step" nor a first failure past the last judged step can be confirmed there. (A crash in
    // an observation, e.g. of a twin, does not end the run: its steps are judged.)
    if first.is_none() && oracle != OracleId::CRASH && j.steps < n {
        if let Some(crash) = j.first(OracleId::CRASH) {
            if entry.expect == Expect::Holds || want_step > j.steps {
                return Status::Changed(format!(
                    "recorded: {oracle} {}; now the target crashes at step {} ({}) and {oracle} \
                     was judged on steps 1..={} only (record \"oracle\": \"crash\" for this \
                     target if that is what it does)",
                    match entry.expect {
                        Expect::Holds => "holds on every step".to_string(),
                        Expect::Fails => format!("fails at step {want_step}"),
                    },
                    crash.step,
                    crash.violation.kind,
                    j.steps
                ));
            }
        }
    }
    let want = describe(want_step, want_kind, want_seq, want_observed);
    match (entry.expect, first) {
        (Expect::Fails, None) => Status::Fixed(format!(
            "recorded: {oracle} fails first {want}; now {oracle} holds on all {n} steps: \
             the bug looks fixed on this target (record \"expect\": \"holds\" if so)"
        )),
        (Expect::Fails, Some(v)) => {
            let got = describe(
                v.step,
                &v.violation.kind,
                v.violation.seq,
                &v.violation.observed,
            );
            // (`Option::is_none_or` needs Rust 1.82; the crate's MSRV is 1.80.)
            #[allow(clippy::unnecessary_map_or)]
            let observed_counts = crate::oracles::Registry::builtin()
                .get(oracle)
                .map_or(true, |o| o.observed_is_evidence());
            if v.step == want_step
                && v.violation.kind == want_kind
                && v.violation.seq == want_seq
                && (!observed_counts || &v.violation.observed == want_observed)
            {
                Status::Confirmed(format!("{oracle} fails first {got}, as recorded"))
            } else {
                Status::Changed(format!(
                    "recorded: {oracle} fails first {want}; now it fails first {got}"
                ))
            }
        }
        (Expect::Holds, None) => {
            Status::Confirmed(format!("{oracle} holds on all {n} steps, as recorded"))
        }
        (Expect::Holds, Some(v)) => Status::Regressed(format!(
            "recorded: {oracle} holds on all {n} steps; now it fails first {}",
            describe(
                v.step,
                &v.violation.kind,
                v.violation.seq,
                &v.violation.observed
            )
        )),
    }
}

/// Measures what the repro's trace does on a target: the expectation to record for it, with
/// overrides where it fails otherwise than the file says. `Err` if the target is unavailable or
/// stops at an unsupported op.
pub fn measure(
    repro: &Repro,
    target: &TargetSpec,
    vs: Option<&TargetSpec>,
) -> Result<TargetExpectation, Error> {
    match measure_setup(repro, target, vs)? {
        Measured::Expectation(entry) => Ok(entry),
        Measured::SetupUnsupported(why) => Err(Error::harness(format!(
            "step 0 is unsupported by the target ({why})"
        ))),
    }
}

/// What [`measure_setup`] found.
enum Measured {
    /// The expectation to record.
    Expectation(TargetExpectation),
    /// The target does not run the trace's setup at all (its first step is unsupported, e.g. a
    /// memory type the native model lacks): neither a finding nor the harness breaking.
    SetupUnsupported(String),
}

/// [`measure`], telling a target that does not run the setup apart from one that fails.
fn measure_setup(
    repro: &Repro,
    target: &TargetSpec,
    vs: Option<&TargetSpec>,
) -> Result<Measured, Error> {
    let mut entry = TargetExpectation::new(target, vs, Expect::Holds);
    let (j, _) = run_on(repro, &entry).map_err(Error::harness)?;
    if let Some((0, why)) = &j.unsupported {
        if j.first(repro.oracle).is_none() {
            return Ok(Measured::SetupUnsupported(why.clone()));
        }
    }
    if let Status::Unavailable(why) = judge_expectation(repro, &entry, &j) {
        return Err(Error::harness(why));
    }
    // A crash before the file's oracle fails decides here (see judge_expectation).
    let crash = j
        .first(OracleId::CRASH)
        .filter(|_| j.first(repro.oracle).is_none() && j.steps < repro.trace.ops.len());
    if crash.is_some() && repro.oracle != OracleId::CRASH {
        entry.oracle = Some(OracleId::CRASH);
    }
    if let (Some(v), Some(_)) = (crash, entry.oracle) {
        // The crash's own step, kind and sequence; its message (a trace with this machine's
        // paths) is not evidence (`observed_is_evidence`), so it is not recorded.
        entry.expect = Expect::Fails;
        entry.step = Some(v.step);
        entry.kind = Some(v.violation.kind.clone());
        entry.seq = v.violation.seq;
    } else if let Some(v) = crash.or_else(|| j.first(repro.oracle)) {
        entry.expect = Expect::Fails;
        if v.step != repro.step {
            entry.step = Some(v.step);
        }
        if v.violation.kind != repro.kind {
            entry.kind = Some(v.violation.kind.clone());
        }
        if v.violation.seq != repro.seq {
            entry.seq = v.violation.seq;
        }
        if v.violation.observed != repro.observed {
            entry.observed = Some(v.violation.observed.clone());
        }
    }
    Ok(Measured::Expectation(entry))
}

/// Parses `name[fault][fault]` (a target label) into a spec.
pub fn parse_label(label: &str) -> Result<TargetSpec, Error> {
    let (name, rest) = match label.find('[') {
        Some(i) => (&label[..i], &label[i..]),
        None => (label, ""),
    };
    let mut faults = Vec::new();
    let mut rest = rest;
    while !rest.is_empty() {
        let end = rest
            .find(']')
            .filter(|_| rest.starts_with('['))
            .ok_or_else(|| format!("target '{label}': expected NAME or NAME[fault][fault]"))?;
        faults.push(rest[1..end].to_string());
        rest = &rest[end + 1..];
    }
    if name.is_empty() {
        return Err(format!("target '{label}': no name").into());
    }
    Ok(TargetSpec::new(name, &faults))
}

/// One repro file replayed.
#[derive(Clone, Debug)]
pub struct FileResult {
    /// The file.
    pub path: PathBuf,
    /// Its expectations replayed, or why the file could not be read.
    pub entries: Result<Vec<EntryResult>, String>,
    /// Wall time, in seconds.
    pub elapsed_s: f64,
}

impl FileResult {
    /// The file's stem: the test case's name.
    pub fn name(&self) -> String {
        self.path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// True if every expectation was confirmed.
    pub fn passed(&self) -> bool {
        self.entries
            .as_ref()
            .is_ok_and(|es| es.iter().all(|e| e.status.passed()))
    }

    /// True if the harness could not check something (unreadable file, unavailable target).
    pub fn harness_error(&self) -> bool {
        match &self.entries {
            Err(_) => true,
            Ok(es) => es
                .iter()
                .any(|e| matches!(e.status, Status::Unavailable(_))),
        }
    }
}

/// Which expectations of a file to replay.
#[derive(Clone, Debug, Default)]
pub struct ReplayFilter {
    /// Only this target (or pair); a target the file records nothing for is run and reported
    /// as [`Status::Unrecorded`].
    pub target: Option<(TargetSpec, Option<TargetSpec>)>,
    /// For `target` without expectations of its own: the label of a target whose expectations
    /// it is held to (a source tree is held to its baseline pin's).
    pub baseline: Option<String>,
}

/// Replays the expectations of one repro.
pub fn replay(repro: &Repro, filter: &ReplayFilter) -> Vec<EntryResult> {
    let Some((a, b)) = &filter.target else {
        return repro.targets.iter().map(|e| check(repro, e)).collect();
    };
    let wanted = TargetExpectation::new(a, b.as_ref(), Expect::Holds);
    let mine: Vec<&TargetExpectation> = repro
        .targets
        .iter()
        .filter(|e| e.label() == wanted.label())
        .collect();
    if !mine.is_empty() {
        return mine.into_iter().map(|e| check(repro, e)).collect();
    }
    if let (Some(base), None) = (&filter.baseline, b) {
        let held: Vec<EntryResult> = repro
            .targets
            .iter()
            .filter(|e| &e.label() == base)
            .map(|e| {
                let on_a = TargetExpectation {
                    target: a.name.clone(),
                    faults: a.faults.clone(),
                    ..e.clone()
                };
                EntryResult {
                    label: format!("{} (as {base})", on_a.label()),
                    ..check(repro, &on_a)
                }
            })
            .collect();
        if !held.is_empty() {
            return held;
        }
    }
    let status = match measure_setup(repro, a, b.as_ref()) {
        Ok(Measured::SetupUnsupported(why)) => Status::Unrecorded(format!(
            "no expectation recorded; the target does not run the setup ({why})"
        )),
        Ok(Measured::Expectation(m)) => Status::Unrecorded(match m.expect {
            Expect::Holds => format!(
                "no expectation recorded; {} holds on every step",
                repro.oracle
            ),
            Expect::Fails => format!(
                "no expectation recorded; {} fails first at step {}{}",
                m.oracle.unwrap_or(repro.oracle),
                m.step.unwrap_or(repro.step),
                match &m.kind {
                    Some(kind) if m.oracle.is_some() => format!(" ({kind})"),
                    _ => String::new(),
                }
            ),
        }),
        Err(e) => Status::Unavailable(format!("not available: {e}")),
    };
    vec![EntryResult {
        label: wanted.label(),
        status,
        executions: 0,
    }]
}

/// Replays one file.
pub fn replay_file(path: &Path, filter: &ReplayFilter) -> FileResult {
    let started = Instant::now();
    let entries = Repro::load(path)
        .map(|r| replay(&r, filter))
        .map_err(String::from);
    FileResult {
        path: path.to_path_buf(),
        entries,
        elapsed_s: started.elapsed().as_secs_f64(),
    }
}

/// The repro files a path names: the file itself, or a folder's `*.json`, sorted.
pub fn repro_files(path: &Path) -> Result<Vec<PathBuf>, Error> {
    if !path.is_dir() {
        if !path.exists() {
            return Err(format!("{}: no such file or folder", path.display()).into());
        }
        return Ok(vec![path.to_path_buf()]);
    }
    let mut v: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("json"))
        .collect();
    v.sort();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::running::judge::StepViolation;

    fn violation(oracle: OracleId, step: usize, kind: &str) -> StepViolation {
        StepViolation::of_kind(oracle, step, kind)
    }

    fn contract_file() -> Repro {
        Repro::parse(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/corpora/contract_mlx_batch_rotating_seq_keep_drops_the_kept_positions.json"
            ))
            .unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn a_crash_before_the_oracle_judges_is_not_a_hold() {
        let repro = contract_file();
        let entry =
            TargetExpectation::new(&TargetSpec::new("mlx-lm@0.30.7", &[]), None, Expect::Holds);
        let crashed = RunJudgement {
            violations: vec![violation(OracleId::CRASH, 2, "exception: ValueError")],
            steps: 1,
            ..RunJudgement::default()
        };
        assert!(matches!(
            judge_expectation(&repro, &entry, &crashed),
            Status::Changed(_)
        ));
        assert!(matches!(
            judge_expectation(
                &repro,
                &entry,
                &RunJudgement {
                    steps: 2,
                    ..RunJudgement::default()
                }
            ),
            Status::Confirmed(_)
        ));
        // Recorded under the crash oracle, the same run is confirmed; a run that does not
        // crash there is not.
        let mut under_crash = entry.clone();
        under_crash.expect = Expect::Fails;
        under_crash.oracle = Some(OracleId::CRASH);
        under_crash.kind = Some("exception: ValueError".to_string());
        assert!(matches!(
            judge_expectation(&repro, &under_crash, &crashed),
            Status::Confirmed(_)
        ));
        let held = RunJudgement {
            steps: 2,
            ..RunJudgement::default()
        };
        assert!(matches!(
            judge_expectation(&repro, &under_crash, &held),
            Status::Fixed(_)
        ));
        // A failure of the file's oracle before the crash still decides.
        let failed_first = RunJudgement {
            violations: vec![
                violation(repro.oracle, 1, "seq_keep: other sequence kept"),
                violation(OracleId::CRASH, 2, "exception: ValueError"),
            ],
            steps: 1,
            ..RunJudgement::default()
        };
        assert!(matches!(
            judge_expectation(&repro, &entry, &failed_first),
            Status::Regressed(_)
        ));
    }
}
