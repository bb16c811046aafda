//! Running a hunt's plan within its budget. Each entry in turn: a probe (does the target take
//! the setup, and at what cost per trial), its share of what is left of the budget, the
//! exhaustive run to the depth half the share allows, fuzzing with the rest; a watchdog stops
//! either at the entry's deadline or on a signal. A violation whose key (oracle, target, kind,
//! op) the hunt already has costs nothing more: it is not shrunk again (an exhaustive one is
//! counted as a repeat; the fuzzer skips it). Every other one is shrunk (fuzz findings are shrunk by the fuzzer already), and the
//! findings of the whole hunt are grouped by root cause at the end.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::budget::{allocate, shrink_config, BudgetClock, EntryDeadlines};
use super::plan::{factories, probe, registry};
use crate::base::domain::Domain;
use crate::base::error::Error;
use crate::base::op::{Setup, Trace};
use crate::engines::explore::{ExhaustiveConfig, Explorer, RunControl};
use crate::engines::fuzz::{run_fuzz_until, FuzzConfig, GenConfig, Generator};
use crate::engines::root_cause::group_findings;
use crate::engines::shrink::{shrink, FailureMode, ShrinkConfig};
use crate::records::code::CodeSet;
use crate::records::finding::{Finding, FindingKey};
use crate::records::hunt::{
    Budget, EntryEstimate, EntryOutcome, FuzzShare, GroupClass, HuntFinding, HuntGroup,
    HuntSummary, PlanEntry, Support,
};
use crate::records::report::{Event, Report, Shard};
use crate::running::judge::Judge;
use crate::running::runner::RunnerFactory;
use crate::running::trial::TrialEnd;
use crate::targets::registry::TargetSpec;

/// Longest fuzz trace, in ops after the setup: short traces shrink fast.
const FUZZ_MAX_LEN: usize = 12;
/// How often the watchdog looks at the clock and the signal flag.
const WATCH_EVERY: Duration = Duration::from_millis(50);

/// What a hunt runs.
pub struct HuntConfig<'a> {
    /// The target, faults included.
    pub target: TargetSpec,
    /// The budget.
    pub budget: Budget,
    /// The fuzz seed (entry `i` of the whole plan fuzzes with `seed + i`).
    pub seed: u64,
    /// The share of the plan's entries.
    pub shard: Shard,
    /// Threads of the exhaustive runs.
    pub threads: usize,
    /// The whole plan.
    pub plan: Vec<PlanEntry>,
    /// Only the entries of these ids (`--entries`); empty: every entry of the shard.
    pub only: Vec<String>,
    /// A stopped hunt's summary to continue: its finished entries are not run again.
    pub resume: Option<HuntSummary>,
    /// Set by a signal: the hunt stops at once with a partial summary.
    pub stop: &'a AtomicBool,
}

/// What a hunt tells its display.
pub enum HuntEvent<'e> {
    /// An entry starts.
    EntryStart {
        /// 1-based, among the entries this run does.
        index: usize,
        /// Entries this run does.
        of: usize,
        /// The entry.
        entry: &'e PlanEntry,
        /// What it is given.
        estimate: &'e EntryEstimate,
        /// Seconds left for the entries, on a time budget.
        left_s: Option<f64>,
    },
    /// An entry the target refuses.
    Unsupported {
        /// The entry.
        entry: &'e PlanEntry,
        /// Why.
        reason: &'e str,
    },
    /// An entry is done.
    EntryDone(&'e EntryOutcome),
    /// An event of the exhaustive or fuzz run inside an entry.
    Run(&'e Event),
}

/// Sets its flag when dropped.
struct SetOnDrop<'f>(&'f AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The plan's entries that shard `shard` runs: every `count`-th, from `index`.
pub fn shard_entries(plan: &[PlanEntry], shard: Shard) -> Vec<(usize, &PlanEntry)> {
    plan.iter()
        .enumerate()
        .filter(|(i, _)| i % shard.count == shard.index)
        .collect()
}

/// The generator of an entry's fuzzing: the domain's setup, its state ops if it has them,
/// positions up to just beyond its ranges, decodes up to its longest (capped), whole copies only
/// where the domain copies whole sequences only (the memories whose range copy aborts).
fn generator_for(d: &Domain) -> GenConfig {
    let mut gen = GenConfig::with_max_len(FUZZ_MAX_LEN);
    gen.setup = d.setup.clone();
    gen.state = d.state;
    gen.whole_copies = d
        .copy_ranges
        .as_ref()
        .is_some_and(|r| r.iter().all(|&[p0, p1]| p0 <= 0 && p1 < 0));
    let top = d.ranges.iter().flatten().copied().max().unwrap_or(0);
    gen.pos_cap = gen.pos_cap.max(top + 4);
    let longest = d.decode_next.iter().copied().max().unwrap_or(1);
    gen.max_tokens = gen.max_tokens.max(longest.min(64));
    gen
}

/// What tells a violation from another before it is shrunk: oracle, target, kind, and the op at
/// the violating step (`setup` for step 0), as the fuzzer tells its failures apart.
type Signature = FindingKey;

fn signature(f: &Finding) -> Signature {
    f.key()
}

/// `f` shrunk by `judge` (as it is if the shrink does not reproduce it), and the executions
/// after which the budget stopped the shrink short of its fixed point, if it did.
fn shrunk(
    f: Finding,
    judge: &mut Judge,
    cfg: &ShrinkConfig,
) -> Result<(Finding, Option<u64>), Error> {
    Ok(shrink_finding(&f, judge, cfg)?.unwrap_or((f, None)))
}

/// `f` shrunk by `judge`, and the executions after which the budget stopped the shrink short of
/// its fixed point, if it did; `None` when the trace does not fail that way again.
pub(super) fn shrink_finding(
    f: &Finding,
    judge: &mut Judge,
    cfg: &ShrinkConfig,
) -> Result<Option<(Finding, Option<u64>)>, Error> {
    let mode = FailureMode {
        oracle: f.oracle,
        kind: f.kind.clone(),
    };
    let Some(s) = shrink(&f.trace, &mode, judge, cfg).map_err(harness)? else {
        return Ok(None);
    };
    let stopped = (!s.minimal).then_some(s.executions);
    let v = s.failure.violation;
    let f = Finding {
        oracle: v.oracle,
        kind: v.kind,
        target: f.target.clone(),
        depth: s.trace.ops.len() as u32,
        trial_index: f.trial_index,
        step: s.failure.step,
        seq: v.seq,
        trace: s.trace,
        observed: v.observed,
        expected: v.expected,
    };
    Ok(Some((f, stopped)))
}

/// `f` with its setup's ops moved into its trace, when its violation happened in the setup: a
/// worker reports a crash of the reset at step 1 (a finding's steps start at 1), and the
/// shrinker may then drop every op after it, leaving "step 1" of a trace of no ops, which no
/// repro file can hold. The moved trace is judged again by `judge` for the step that fails (the
/// worker's marker does not say which of the setup's ops crashed); where it does not fail
/// again, the last moved op is blamed.
fn setup_lifted(f: Finding, judge: &mut Judge) -> Result<Finding, Error> {
    if f.step <= f.trace.ops.len() || f.trace.setup.ops.is_empty() {
        return Ok(f);
    }
    let mut trace = f.trace.clone();
    let mut ops = std::mem::take(&mut trace.setup.ops);
    ops.append(&mut trace.ops);
    trace.ops = ops;
    let judged = judge.run(&trace).map_err(harness)?;
    let again = judged
        .first(f.oracle)
        .filter(|v| v.violation.kind == f.kind)
        .map(|v| (v.step, v.violation.clone()));
    let depth = trace.ops.len() as u32;
    Ok(match again {
        Some((step, v)) => Finding {
            depth,
            step,
            seq: v.seq,
            observed: v.observed,
            expected: v.expected,
            trace,
            ..f
        },
        None => Finding {
            depth,
            step: trace.ops.len(),
            trace,
            ..f
        },
    })
}

fn harness(e: crate::base::cache::HarnessError) -> Error {
    Error::harness(e.to_string())
}

/// Adds a run's per-oracle figures into an entry's.
fn add_stats(o: &mut EntryOutcome, r: &Report) {
    for (id, s) in &r.oracles {
        o.oracles.entry(*id).or_default().merge(s);
    }
    o.unsupported += r.unsupported;
}

/// Runs the hunt (or the rest of a resumed one). The summary's groups are all `new`: the corpus
/// classifies them (`outputs::hunt`).
pub fn run_hunt(
    cfg: &HuntConfig<'_>,
    sink: &mut dyn FnMut(&HuntEvent<'_>),
) -> Result<HuntSummary, Error> {
    let started = Instant::now();
    let mut summary = match cfg.resume.clone() {
        Some(mut r) => {
            let done: BTreeSet<String> = r.entries.iter().map(|e| e.id.clone()).collect();
            r.findings.retain(|f| done.contains(&f.entry));
            r.groups.clear();
            r.fixed.clear();
            r.incomplete = false;
            r.failed = None;
            r.corpus = None;
            r
        }
        None => HuntSummary {
            kvaudit: env!("CARGO_PKG_VERSION").into(),
            target: cfg.target.name.clone(),
            faults: cfg.target.faults.clone(),
            budget: cfg.budget,
            seed: cfg.seed,
            shard: cfg.shard,
            plan: cfg.plan.iter().map(|e| e.id.clone()).collect(),
            only: cfg.only.clone(),
            unsupported: Vec::new(),
            entries: Vec::new(),
            skipped: Vec::new(),
            findings: Vec::new(),
            groups: Vec::new(),
            fixed: Vec::new(),
            fix_replays: None,
            elapsed_s: 0.0,
            incomplete: false,
            code: None,
            code_parts: Default::default(),
            code_lines: None,
            corpus: None,
            failed: None,
        },
    };
    let offset = summary.elapsed_s;
    let hunt_s = || offset + started.elapsed().as_secs_f64();
    let finished: BTreeSet<String> = summary
        .entries
        .iter()
        .map(|e| e.id.clone())
        .chain(summary.unsupported.iter().map(|(id, _)| id.clone()))
        .chain(summary.skipped.iter().cloned())
        .collect();
    let todo: Vec<(usize, &PlanEntry)> = shard_entries(&cfg.plan, cfg.shard)
        .into_iter()
        .filter(|(_, e)| !finished.contains(&e.id))
        .filter(|(_, e)| cfg.only.is_empty() || cfg.only.contains(&e.id))
        .collect();
    let trials_spent: u64 = summary
        .entries
        .iter()
        .map(|e| e.trials + e.fuzz_cases)
        .sum();
    let mut clock = BudgetClock::start(cfg.budget, started, offset, trials_spent);
    let mut seen: BTreeSet<Signature> = summary
        .findings
        .iter()
        .map(|f| signature(&f.finding))
        .collect();
    for (k, &(plan_index, entry)) in todo.iter().enumerate() {
        if cfg.stop.load(Ordering::Relaxed) {
            summary.incomplete = true;
            break;
        }
        if clock.entries_over() {
            summary
                .skipped
                .extend(todo[k..].iter().map(|(_, e)| e.id.clone()));
            break;
        }
        let (support, per_trial) = match probe_or_refusal(&cfg.target, entry) {
            Ok(p) => p,
            Err(e) => {
                stopped_by(&mut summary, &e, entry);
                break;
            }
        };
        if let Support::Unsupported { reason } = &support {
            sink(&HuntEvent::Unsupported { entry, reason });
            summary.unsupported.push((entry.id.clone(), reason.clone()));
            continue;
        }
        let share = clock.share(todo.len() - k);
        let estimate = allocate(entry, support, per_trial, cfg.budget, share);
        sink(&HuntEvent::EntryStart {
            index: k + 1,
            of: todo.len(),
            entry,
            estimate: &estimate,
            left_s: clock.entries_left_s(),
        });
        let EntryDeadlines {
            end: deadline,
            exhaustive_end: exhaustive_deadline,
        } = clock.entry_deadlines(share);
        let entry_stop = AtomicBool::new(false);
        let exhaustive_stop = AtomicBool::new(false);
        let done = AtomicBool::new(false);
        let ran = std::thread::scope(|s| {
            s.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    let past = |d: Option<Instant>| d.is_some_and(|d| Instant::now() >= d);
                    if cfg.stop.load(Ordering::Relaxed) || past(deadline) {
                        entry_stop.store(true, Ordering::Relaxed);
                    }
                    if entry_stop.load(Ordering::Relaxed) || past(exhaustive_deadline) {
                        exhaustive_stop.store(true, Ordering::Relaxed);
                    }
                    std::thread::sleep(WATCH_EVERY);
                }
            });
            // Set however the entry ends, a panic included: the scope waits for the watchdog.
            let _done = SetOnDrop(&done);
            let ran = run_entry(
                cfg,
                (plan_index, entry),
                &estimate,
                (deadline, &exhaustive_stop, &entry_stop),
                &mut seen,
                &hunt_s,
                sink,
            );
            ran
        });
        let (mut outcome, found) = match ran {
            Ok(r) => r,
            Err(e) => {
                stopped_by(&mut summary, &e, entry);
                break;
            }
        };
        for (part, code) in std::mem::take(&mut outcome.code) {
            summary
                .code
                .get_or_insert_with(|| CodeSet::new(&code.build))
                .join(&code);
            summary
                .code_parts
                .entry(part)
                .or_insert_with(|| CodeSet::new(&code.build))
                .join(&code);
        }
        clock.spend_trials(outcome.trials + outcome.fuzz_cases);
        for f in found {
            summary.findings.push(HuntFinding {
                finding: f.finding,
                entry: entry.id.clone(),
                memory: entry.memory,
                found_at_s: f.found_at_s,
                shrink_stopped_after: f.shrink_stopped_after,
            });
        }
        if cfg.stop.load(Ordering::Relaxed) {
            // The entry was cut by the signal: its findings stay in the partial summary, the
            // entry itself runs again on --resume.
            summary.incomplete = true;
            break;
        }
        sink(&HuntEvent::EntryDone(&outcome));
        summary.entries.push(outcome);
    }
    // Entries in plan order, whatever order a resume finished them in.
    let order = |id: &str| summary.plan.iter().position(|p| p == id);
    summary.entries.sort_by_key(|e| order(&e.id));
    summary.elapsed_s = hunt_s();
    regroup(&mut summary);
    Ok(summary)
}

/// [`probe`], where a probe that breaks on the entry's setup is the entry's answer: the setup's
/// ops run again as a trial's ops ([`setup_refusal`]), and one the target does not take makes
/// the entry unsupported, with the op and its outcome as the reason (an old pin without room
/// for the iSWA preset's 250-token decode runs the rest of the plan). A probe that breaks on a
/// setup the target makes is the harness's failure, as before. The check runs only after a
/// failed probe: an entry the target runs pays nothing for it.
pub fn probe_or_refusal(
    target: &TargetSpec,
    entry: &PlanEntry,
) -> Result<(Support, Option<f64>), Error> {
    let broken = match probe(target, entry) {
        Ok(p) => return Ok(p),
        Err(e) => e,
    };
    match setup_refusal(target, entry)? {
        Some(reason) => Ok((Support::Unsupported { reason }, None)),
        None => Err(broken),
    }
}

/// Why the target (or the entry's partner) cannot make the entry's setup, if it cannot. A
/// runner's reset fails on a setup op that does not take effect, with its outcome in a string
/// (a worker's error crosses its pipe as text); run as the ops of a trial from the setup's
/// configuration alone, the same ops give their outcomes as data, a crash included.
pub fn setup_refusal(target: &TargetSpec, e: &PlanEntry) -> Result<Option<String>, Error> {
    let trace = Trace {
        setup: Setup {
            ops: Vec::new(),
            ..e.domain.setup.clone()
        },
        ops: e.domain.setup.ops.clone(),
    };
    let (a, b) = factories(target, e)?;
    let sides = std::iter::once(("", a)).chain(b.map(|b| ("its partner: ", b)));
    for (side, factory) in sides {
        let mut runner = factory().map_err(harness)?;
        let run = runner
            .run_batch(std::slice::from_ref(&trace))
            .map_err(harness)?
            .pop()
            .ok_or_else(|| Error::harness("a runner returned no run for the setup check"))?;
        let op = |step: usize| match step.checked_sub(1).and_then(|i| trace.ops.get(i)) {
            Some(op) => format!("setup op {step} of {}, {op}", trace.ops.len()),
            None => "the setup's configuration".to_string(),
        };
        let refused = run
            .steps
            .iter()
            .position(|s| !s.outcome.took_effect())
            .map(|i| (i + 1, format!("{:?}", run.steps[i].outcome)));
        let why = match (refused, run.end) {
            (Some((step, outcome)), _) => format!("{}: {outcome}", op(step)),
            (None, TrialEnd::Unsupported { step, reason }) => format!("{}: {reason}", op(step)),
            (None, TrialEnd::Crashed { step, message }) => {
                format!("{} crashes the target: {message}", op(step))
            }
            (None, TrialEnd::Completed) => continue,
        };
        return Ok(Some(format!("{side}cannot make the setup: {why}")));
    }
    Ok(None)
}

/// Marks `summary` as stopped by the harness failure `e` in `entry`: the entries before it and
/// their findings stay, and the entry runs again on `--resume`, as after a signal.
fn stopped_by(summary: &mut HuntSummary, e: &Error, entry: &PlanEntry) {
    summary.incomplete = true;
    summary.failed = Some(format!("entry {}: {}", entry.id, e.message));
}

/// A new finding of an entry, shrunk: the hunt's second of its first violation, and where the
/// shrink budget stopped its shrink short (as [`HuntFinding::shrink_stopped_after`]).
struct EntryFinding {
    finding: Finding,
    found_at_s: f64,
    shrink_stopped_after: Option<u64>,
}

/// The new findings of one entry (repeats of the hunt's earlier ones dropped).
type EntryFindings = Vec<EntryFinding>;

fn run_entry(
    cfg: &HuntConfig<'_>,
    (plan_index, e): (usize, &PlanEntry),
    est: &EntryEstimate,
    (deadline, exhaustive_stop, stop): (Option<Instant>, &AtomicBool, &AtomicBool),
    seen: &mut BTreeSet<Signature>,
    hunt_s: &dyn Fn() -> f64,
    sink: &mut dyn FnMut(&HuntEvent<'_>),
) -> Result<(EntryOutcome, EntryFindings), Error> {
    let started = Instant::now();
    let (fa, fb): (Box<RunnerFactory<'static>>, _) = factories(&cfg.target, e)?;
    let oracles = registry(e);
    let mut outcome = EntryOutcome {
        id: e.id.clone(),
        memory: e.memory,
        ..EntryOutcome::default()
    };
    let mut found: EntryFindings = Vec::new();
    // Started when a finding is first shrunk or judged again.
    let mut judge: Option<Judge> = None;
    let judge_of = |slot: &mut Option<Judge>| -> Result<(), Error> {
        if slot.is_none() {
            *slot = Some(
                Judge::new(fa.as_ref(), fb.as_deref())
                    .map_err(harness)?
                    .with_oracles(oracles.clone()),
            );
        }
        Ok(())
    };
    if est.depth > 0 {
        let xcfg = ExhaustiveConfig {
            domain: e.domain.clone(),
            depth: est.depth,
            shard: Shard::WHOLE,
            threads: cfg.threads,
            batch: 256,
            oracles: oracles.clone(),
        };
        let explorer = Explorer::new(&xcfg, fa.as_ref(), fb.as_deref()).map_err(harness)?;
        let mut first_seen: Vec<(Signature, f64)> = Vec::new();
        let report = explorer
            .run(&RunControl::new(exhaustive_stop), &mut |ev| {
                if let Event::Finding(f) = ev {
                    first_seen.push((signature(f), hunt_s()));
                }
                sink(&HuntEvent::Run(ev));
            })
            .map_err(harness)?;
        outcome.depth = est.depth;
        outcome.trials = report.trials;
        outcome.cut_short = report.incomplete.is_some();
        add_stats(&mut outcome, &report);
        if let Some(code) = report.code.clone() {
            outcome.code.insert("exhaustive".into(), code);
        }
        for f in report.findings {
            if !seen.insert(signature(&f)) {
                outcome.repeats += 1;
                continue;
            }
            let at = first_seen
                .iter()
                .find(|(s, _)| *s == signature(&f))
                .map_or_else(hunt_s, |(_, t)| *t);
            judge_of(&mut judge)?;
            let judge = judge.as_mut().expect("started");
            let (f, shrink_stopped_after) = shrunk(f, judge, &shrink_config(est))?;
            found.push(EntryFinding {
                finding: setup_lifted(f, judge)?,
                found_at_s: at,
                shrink_stopped_after,
            });
        }
    }
    let fuzz_time = match (est.fuzz, deadline) {
        (FuzzShare::Seconds(_), Some(d)) => {
            Some(d.saturating_duration_since(Instant::now())).filter(|t| !t.is_zero())
        }
        _ => None,
    };
    let cases = match est.fuzz {
        FuzzShare::Cases(n) => Some(n),
        FuzzShare::Seconds(_) => None,
    };
    if !stop.load(Ordering::Relaxed) && (cases.is_some() || fuzz_time.is_some()) {
        let fcfg = FuzzConfig {
            seed: cfg.seed.wrapping_add(plan_index as u64),
            cases,
            time: fuzz_time,
            gen: generator_for(&e.domain),
            shrink: shrink_config(est),
            shrinks_per_signature: 1,
            oracles: Some(e.oracles.clone()),
            theorems: Vec::new(),
            generator: Generator::Random,
            corpus: Vec::new(),
        };
        let fuzz_started = hunt_s();
        let known = seen.clone();
        let (report, _) = run_fuzz_until(
            &fcfg,
            fa.as_ref(),
            fb.as_deref(),
            None,
            (stop, &known),
            &mut |ev| sink(&HuntEvent::Run(ev)),
        )
        .map_err(harness)?;
        let fz = report.fuzz.clone().expect("a fuzz report");
        outcome.fuzz_cases = fz.cases;
        outcome.not_reproduced = fz.not_reproduced.clone();
        if let Some(code) = fz.code {
            outcome.code.insert("fuzz".into(), code);
        }
        add_stats(&mut outcome, &report);
        for (f, rec) in report.findings.into_iter().zip(&fz.findings) {
            if !seen.insert(signature(&f)) {
                outcome.repeats += 1;
                continue;
            }
            let f = if f.step > f.trace.ops.len() {
                judge_of(&mut judge)?;
                setup_lifted(f, judge.as_mut().expect("started"))?
            } else {
                f
            };
            found.push(EntryFinding {
                finding: f,
                found_at_s: fuzz_started + rec.found_at_s,
                shrink_stopped_after: (!rec.minimal).then_some(rec.executions),
            });
        }
    }
    outcome.elapsed_s = started.elapsed().as_secs_f64();
    Ok((outcome, found))
}

/// Groups the summary's findings by root cause (`engines::group`), each group `new` until the
/// corpus says otherwise: after a run, and after shards are merged.
pub fn regroup(summary: &mut HuntSummary) {
    let findings: Vec<Finding> = summary.findings.iter().map(|f| f.finding.clone()).collect();
    summary.groups = group_findings(&findings)
        .into_iter()
        .map(|group| {
            let members: Vec<&HuntFinding> = group
                .findings
                .iter()
                .map(|&n| &summary.findings[n - 1])
                .collect();
            let mut memory: Vec<_> = members.iter().map(|f| f.memory).collect();
            memory.sort();
            memory.dedup();
            let mut entries: Vec<String> = Vec::new();
            for f in &members {
                if !entries.contains(&f.entry) {
                    entries.push(f.entry.clone());
                }
            }
            let first_violation_s = members
                .iter()
                .map(|f| f.found_at_s)
                .fold(f64::INFINITY, f64::min);
            HuntGroup {
                group,
                memory,
                entries,
                class: GroupClass::New,
                matched_by: String::new(),
                first_violation_s,
                decision: None,
                by_fix: None,
                files: Vec::new(),
            }
        })
        .collect();
}

/// Merges the summaries of a hunt's shards: their entries, unsupported entries and findings,
/// grouped again (and to be classified again). Fails unless they are shards of one hunt that
/// cover every shard once.
pub fn merge_shards(mut parts: Vec<HuntSummary>) -> Result<HuntSummary, Error> {
    parts.sort_by_key(|p| p.shard.index);
    let first = parts
        .first()
        .ok_or_else(|| Error::input("no hunt summaries to merge"))?;
    let count = first.shard.count;
    for (i, p) in parts.iter().enumerate() {
        if !p.same_hunt(first) {
            return Err(Error::input(format!(
                "shard {} is of another hunt (target, faults, budget, seed or plan differ)",
                p.shard.index
            )));
        }
        if p.shard.count != count || p.shard.index != i {
            return Err(Error::input(format!(
                "expected shards 0..{count} once each, got shard {}/{} at place {i}",
                p.shard.index, p.shard.count
            )));
        }
        if p.incomplete {
            return Err(Error::input(format!(
                "shard {}/{} is incomplete: resume it first (--resume)",
                p.shard.index, p.shard.count
            )));
        }
    }
    if parts.len() != count {
        return Err(Error::input(format!(
            "{} of {count} shards given",
            parts.len()
        )));
    }
    let mut whole = parts[0].clone();
    whole.shard = Shard::WHOLE;
    // Classified again: a shard's failure in its classification is not the merge's.
    whole.failed = None;
    whole.corpus = None;
    whole.fix_replays = None;
    for p in parts.into_iter().skip(1) {
        whole.entries.extend(p.entries);
        whole.unsupported.extend(p.unsupported);
        whole.skipped.extend(p.skipped);
        whole.findings.extend(p.findings);
        if let Some(code) = &p.code {
            whole
                .code
                .get_or_insert_with(|| CodeSet::new(&code.build))
                .join(code);
        }
        for (part, code) in &p.code_parts {
            whole
                .code_parts
                .entry(part.clone())
                .or_insert_with(|| CodeSet::new(&code.build))
                .join(code);
        }
        // Shards run side by side: the hunt took as long as its longest shard.
        whole.elapsed_s = whole.elapsed_s.max(p.elapsed_s);
    }
    let order = |id: &str| whole.plan.iter().position(|p| p == id);
    whole.entries.sort_by_key(|e| order(&e.id));
    regroup(&mut whole);
    Ok(whole)
}

#[cfg(test)]
mod tests;
