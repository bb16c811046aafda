//! A hunt (`kvaudit hunt`): its plan, what each entry of the plan judged, the findings of the
//! whole hunt grouped by root cause, and each group's class against the corpus (known by a file
//! of its class or by the fix whose replay makes it hold, [`ByFix`]; regressed; decided by a
//! decision of the corpus; new) with the decision that covers it. Plain data and its renderings
//! (terminal, Markdown, JSON), which open with what is broken, one line per root cause
//! ([`HuntSummary::what_is_broken`]); `engines::hunt` fills it, `outputs::hunt`
//! classifies its groups.

use std::collections::BTreeMap;

use crate::records::code::{CodeSet, FileCoverage};
use crate::records::decision::{root_cause_order, DecisionKind, DecisionNote};
use serde::{Deserialize, Serialize};

use crate::base::config::MemoryType;
use crate::base::domain::Domain;
use crate::base::error::Error;
use crate::oracles::OracleId;
use crate::records::finding::{Finding, OracleStats};
use crate::records::group::FindingGroup;
use crate::records::report::Shard;
use crate::records::text::{markdown_text, parse_seconds, terminal_text};

mod by_fix;
mod table;

pub use self::by_fix::{ByFix, FixEvidence, FixReplays};
pub use self::table::TableRow;
use self::table::COLUMNS;

/// What a hunt may spend: wall time, or trials (every trial an exhaustive trial or a fuzz case;
/// the deterministic budget tests use).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Budget {
    /// Seconds of wall time, shrinking, grouping and classification included.
    Seconds(f64),
    /// Trials, shared among the entries.
    Trials(u64),
}

impl Budget {
    /// Parses `90`, `30s`, `5m`, `1h` (time) or `5000trials` (a trial count).
    pub fn parse(s: &str) -> Result<Budget, Error> {
        let t = s.trim();
        if let Some(n) = t.strip_suffix("trials") {
            return match n.trim().parse::<u64>() {
                Ok(n) if n > 0 => Ok(Budget::Trials(n)),
                _ => Err(format!("budget '{s}': expected a positive number of trials").into()),
            };
        }
        parse_seconds(t).map(Budget::Seconds).map_err(|e| {
            format!("budget '{s}': {} (or a trial count: 5000trials)", e.message).into()
        })
    }

    /// As the command line takes it.
    pub fn describe(&self) -> String {
        match self {
            Budget::Seconds(s) => format!("{s:.0} s"),
            Budget::Trials(n) => format!("{n} trials"),
        }
    }
}

/// Which second target an entry judges against.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "with")]
pub enum Pairing {
    /// The target alone.
    Alone,
    /// The native model beside it: the differential oracle.
    Native,
    /// The same target under another configuration (`--vs-config`): config-differential.
    Config {
        /// The other configuration, as `--vs-config` takes it.
        config: String,
    },
}

impl Pairing {
    /// A short label: `alone`, `vs native`, `vs-config kv_unified=false`.
    pub fn label(&self) -> String {
        match self {
            Pairing::Alone => "alone".into(),
            Pairing::Native => "vs native".into(),
            Pairing::Config { config } => format!("vs-config {config}"),
        }
    }
}

/// Whether the target takes an entry's configuration, as probed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum Support {
    /// The setup ran.
    Runs,
    /// The target refused the setup: the entry is shown, never run.
    Unsupported {
        /// What the target said.
        reason: String,
    },
}

/// One entry of the plan: a domain (a preset, or one made from a preset for a cache users run
/// into), the pairing, and the oracles that can judge there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanEntry {
    /// Unique in the plan: `seed`, `fragmented`, `iswa+swa_full`, `seed~kv_unified=false`.
    pub id: String,
    /// The memory type of the domain's setup.
    pub memory: MemoryType,
    /// Why the plan has it (which cache users run into, or which preset).
    pub why: String,
    /// The domain enumerated and whose setup the fuzzer starts from.
    pub domain: Domain,
    /// Against what.
    pub pairing: Pairing,
    /// The oracles that judge it, in registry order.
    pub oracles: Vec<OracleId>,
}

/// What an entry is expected to cost, from a probe of its setup on the target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EntryEstimate {
    /// Whether the target takes the setup.
    pub support: Support,
    /// Ops of the domain.
    pub ops: u64,
    /// Measured seconds per trial (a probe's trials, run through the judge).
    pub seconds_per_trial: Option<f64>,
    /// Exhaustive depth the entry's share allows.
    pub depth: u32,
    /// Trials of that exhaustive run.
    pub exhaustive_trials: u64,
    /// Fuzz cases (a trial budget) or the fuzz time in seconds (a time budget).
    pub fuzz: FuzzShare,
    /// The entry's share of the budget, in seconds (a time budget).
    pub share_s: Option<f64>,
}

/// The fuzzing an entry does after its exhaustive run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FuzzShare {
    /// This many cases.
    Cases(u64),
    /// For this many seconds.
    Seconds(f64),
}

/// What one entry did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EntryOutcome {
    /// The entry's id.
    pub id: String,
    /// Its memory type.
    pub memory: MemoryType,
    /// Exhaustive depth run.
    pub depth: u32,
    /// Exhaustive trials run.
    pub trials: u64,
    /// Whether the exhaustive run was cut short by the entry's deadline.
    pub cut_short: bool,
    /// Fuzz cases run.
    pub fuzz_cases: u64,
    /// Trials the target refused (unsupported ops).
    pub unsupported: u64,
    /// Per oracle, exhaustive and fuzz judgements summed.
    pub oracles: BTreeMap<OracleId, OracleStats>,
    /// Violations that repeated a finding the hunt had already (not shrunk again).
    pub repeats: u64,
    /// Failures of its fuzz part that did not happen again when replayed to shrink
    /// (`FuzzSummary::not_reproduced`): no finding, kept with their traces to be read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_reproduced: Vec<crate::records::fuzz::NotReproduced>,
    /// Wall time, seconds.
    pub elapsed_s: f64,
    /// The memory code its parts reached (a `+cov` build), by part (`exhaustive`, `fuzz`),
    /// until the summary joins it.
    #[serde(skip)]
    pub code: BTreeMap<String, CodeSet>,
}

/// A finding of the hunt: shrunk, with where and when it was first reached.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HuntFinding {
    /// The finding (its trace shrunk).
    pub finding: Finding,
    /// The plan entry that reached it first.
    pub entry: String,
    /// Its memory type.
    pub memory: MemoryType,
    /// Seconds into the hunt when its first violation was judged.
    pub found_at_s: f64,
    /// Where the hunt's shrink budget stopped its shrink before the fixed point: the target
    /// executions spent. Unset: minimal (no op, setup op, token or argument can go without losing
    /// the failure; `engines::shrink`). A group whose representative has it is not minimal, and
    /// its summary line says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shrink_stopped_after: Option<u64>,
}

/// A group's class against the corpus.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "class")]
pub enum GroupClass {
    /// A corpus file holds it and expects it on this target (or records nothing for it).
    Known {
        /// The corpus file.
        file: String,
    },
    /// A corpus file holds it and records that it holds on this target.
    Regressed {
        /// The corpus file.
        file: String,
    },
    /// No corpus file of its class holds it, but its trace holds once a remedy whose root
    /// cause the corpus holds is applied (a fix's patch, a fault removed): that root cause,
    /// reached another way ([`HuntGroup::by_fix`] has the replays).
    KnownByFix {
        /// The remedies that make it hold (`fix seq-keep-all-streams`, `fault refcount
        /// removed`), each of a root cause the corpus holds.
        remedies: Vec<String>,
    },
    /// No corpus file holds it.
    New,
    /// No corpus file holds it, and a decision's class covers it (its `match` block): a class
    /// people decided (a root cause reached in another memory type or configuration, a
    /// contract question, by design, a guard, an artifact, a tolerance).
    Decided {
        /// What the decision says it is.
        decision: DecisionKind,
        /// The decision's root cause.
        root_cause: String,
        /// Where the decision is: a file of `decisions/`, or the corpus file that carries it.
        evidence: String,
    },
}

impl GroupClass {
    /// `known`, `regressed`, `new`, `decided` (a group known by fix is `known`).
    pub fn word(&self) -> &'static str {
        match self {
            GroupClass::Known { .. } | GroupClass::KnownByFix { .. } => "known",
            GroupClass::Regressed { .. } => "regressed",
            GroupClass::New => "new",
            GroupClass::Decided { .. } => "decided",
        }
    }

    /// Known, by a corpus file of its class or by a fix: not what fails a hunt.
    pub fn is_known(&self) -> bool {
        matches!(
            self,
            GroupClass::Known { .. } | GroupClass::KnownByFix { .. }
        )
    }
}

/// One root-cause group of the hunt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HuntGroup {
    /// The group, numbering findings of [`HuntSummary::findings`] from 1.
    pub group: FindingGroup,
    /// The memory types its findings were reached on.
    pub memory: Vec<MemoryType>,
    /// The entries that reached it.
    pub entries: Vec<String>,
    /// Its class.
    pub class: GroupClass,
    /// How the corpus match was made: `cause` (same root-cause evidence) or `signature` (same
    /// oracle, kind, op and memory type); empty when new.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub matched_by: String,
    /// Seconds into the hunt of its first violation.
    pub first_violation_s: f64,
    /// The decision that covers it: its corpus file's (known, regressed) or the decision that
    /// matched it (decided).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<DecisionNote>,
    /// Its replays with remedies (identity by fix), when no corpus file matched it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_fix: Option<ByFix>,
    /// Files written for a new group (`new/NAME.json`, `.c`, `.svg`, `.md`), relative to the
    /// hunt's folder.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
}

/// A corpus finding the plan reached (its setup and oracle judged in an entry) that expects to
/// fail on this target and now holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixedFinding {
    /// The corpus file.
    pub file: String,
    /// Its oracle.
    pub oracle: OracleId,
    /// The entry whose setup it starts from.
    pub entry: String,
    /// What the replay said.
    pub detail: String,
}

/// The summary of a hunt (or of one shard of it, or of merged shards).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HuntSummary {
    /// kvaudit's version.
    pub kvaudit: String,
    /// The target's label.
    pub target: String,
    /// Faults injected into it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<String>,
    /// The budget.
    pub budget: Budget,
    /// The fuzz seed (entry `i` fuzzes with seed + i).
    pub seed: u64,
    /// The share of the plan's entries.
    pub shard: Shard,
    /// The plan's entries (the whole plan, every shard's).
    pub plan: Vec<String>,
    /// The entries the hunt was restricted to (`--entries`); empty: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub only: Vec<String>,
    /// Entries the target refused, with why.
    pub unsupported: Vec<(String, String)>,
    /// Entries finished, in plan order.
    pub entries: Vec<EntryOutcome>,
    /// Entries not started because the entries' part of the budget was spent (a budget too
    /// small for the plan: each entry costs at least its probe and its runners' start).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// The findings, shrunk.
    pub findings: Vec<HuntFinding>,
    /// Their root-cause groups, classified.
    pub groups: Vec<HuntGroup>,
    /// Corpus findings reached that no longer fail.
    pub fixed: Vec<FixedFinding>,
    /// The identity-by-fix pass over the groups no corpus file matched, once it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix_replays: Option<FixReplays>,
    /// Wall time, seconds (summed over resumed parts).
    pub elapsed_s: f64,
    /// Stopped before every entry of its share ran (Ctrl-C, SIGTERM).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub incomplete: bool,
    /// The memory code the entries reached, on a `+cov` build (`kvaudit coverage` maps it to
    /// lines): their exhaustive and fuzz parts together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<CodeSet>,
    /// The same by part of the entries (`exhaustive`, `fuzz`): which part reached what.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub code_parts: BTreeMap<String, CodeSet>,
    /// Its line coverage over the memory sources, when the hunt mapped it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_lines: Option<FileCoverage>,
    /// The corpus its groups were classified against, once they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corpus: Option<CorpusUsed>,
    /// What failed after the hunt's work began (an entry's runner, a new group's file): the
    /// summary holds what was found until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

/// The corpus a hunt's groups were classified against.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CorpusUsed {
    /// Its repro files.
    pub files: usize,
    /// Its decisions of classes with no reproducer (`decisions/`).
    #[serde(default)]
    pub decisions: usize,
    /// The folder it was read from (`--corpus DIR`); none: the corpus built into kvaudit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder: Option<String>,
}

impl CorpusUsed {
    /// "62 files and 12 decisions, built into kvaudit", "3 files and 0 decisions from DIR"
    /// (free text: escape it).
    pub fn describe(&self) -> String {
        let what = format!("{} files and {} decisions", self.files, self.decisions);
        match &self.folder {
            None => format!("{what}, built into kvaudit"),
            Some(dir) => format!("{what} from {dir}"),
        }
    }
}

/// The largest summary read back.
pub const MAX_SUMMARY_BYTES: u64 = 64 << 20;

impl HuntSummary {
    /// The JSON summary.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a hunt summary serializes") + "\n"
    }

    /// Parses a JSON summary.
    pub fn parse(text: &str) -> Result<HuntSummary, Error> {
        serde_json::from_str(text).map_err(|e| Error::input(format!("hunt summary: {e}")))
    }

    /// Whether two summaries are parts of one hunt (same target, faults, budget and seed).
    pub fn same_hunt(&self, other: &HuntSummary) -> bool {
        (
            &self.target,
            &self.faults,
            self.budget,
            self.seed,
            &self.plan,
            &self.only,
        ) == (
            &other.target,
            &other.faults,
            other.budget,
            other.seed,
            &other.plan,
            &other.only,
        )
    }

    /// Non-advisory groups that are new or regressed: what fails a hunt (a decided group is
    /// what people decided it is).
    pub fn failing_groups(&self) -> usize {
        self.groups
            .iter()
            .filter(|g| matches!(g.class, GroupClass::New | GroupClass::Regressed { .. }))
            .filter(|g| g.group.oracles.iter().any(|o| !o.advisory()))
            .count()
    }

    /// Rows of the memory type x oracle table: judged, violations, and groups by class.
    pub fn table(&self) -> Vec<TableRow> {
        let mut rows: BTreeMap<(MemoryType, OracleId), TableRow> = BTreeMap::new();
        for e in &self.entries {
            for (o, s) in &e.oracles {
                let r = rows
                    .entry((e.memory, *o))
                    .or_insert_with(|| TableRow::new(e.memory, *o));
                r.judged += s.checked;
                r.violations += s.violations;
            }
        }
        for g in &self.groups {
            for &n in &g.group.findings {
                let f = &self.findings[n - 1];
                let r = rows
                    .entry((f.memory, f.finding.oracle))
                    .or_insert_with(|| TableRow::new(f.memory, f.finding.oracle));
                // A group counts once per row however many of its findings fall there.
                if r.counted.contains(&g.group.representative) {
                    continue;
                }
                r.counted.push(g.group.representative);
                match g.class {
                    GroupClass::New => r.new += 1,
                    GroupClass::Known { .. } | GroupClass::KnownByFix { .. } => r.known += 1,
                    GroupClass::Regressed { .. } => r.regressed += 1,
                    GroupClass::Decided { .. } => r.decided += 1,
                }
            }
        }
        for f in &self.fixed {
            if let Some(e) = self.entries.iter().find(|e| e.id == f.entry) {
                let r = rows
                    .entry((e.memory, f.oracle))
                    .or_insert_with(|| TableRow::new(e.memory, f.oracle));
                r.fixed += 1;
            }
        }
        rows.into_values().collect()
    }

    fn trials(&self) -> (u64, u64) {
        self.entries
            .iter()
            .fold((0, 0), |(t, f), e| (t + e.trials, f + e.fuzz_cases))
    }

    fn group_line(&self, g: &HuntGroup, i: usize, text: &dyn Fn(&str) -> String) -> String {
        let rep_record = &self.findings[g.group.representative - 1];
        let rep = &rep_record.finding;
        let oracles: Vec<&str> = g.group.oracles.iter().map(|o| o.name()).collect();
        let memory: Vec<&str> = g.memory.iter().map(|m| m.name()).collect();
        let class = match &g.class {
            GroupClass::Known { file } | GroupClass::Regressed { file } => {
                let evidence = g.by_fix.as_ref().map_or(String::new(), ByFix::describe);
                format!("{} ({file}, by {}){evidence}", g.class.word(), g.matched_by)
            }
            GroupClass::Decided {
                decision,
                root_cause,
                evidence,
            } => {
                let by_fix = g.by_fix.as_ref().map_or(String::new(), ByFix::describe);
                format!(
                    "decided ({} {root_cause}, by {evidence}){by_fix}",
                    decision.word()
                )
            }
            GroupClass::KnownByFix { .. } | GroupClass::New => {
                let evidence = g.by_fix.as_ref().map_or(String::new(), ByFix::describe);
                format!("{}{evidence}", g.class.word())
            }
        };
        let not_minimal = rep_record.shrink_stopped_after.map_or(String::new(), |n| {
            format!("; not minimal: shrink stopped by the budget after {n} executions")
        });
        text(&format!(
            "{i}. {class}: {} {} on {}, {} finding(s), first violation at {:.1} s; {}{not_minimal}; entries {}",
            oracles.join("+"),
            rep.kind,
            memory.join(","),
            g.group.count(),
            g.first_violation_s,
            g.group.cause.describe_with(&rep.trace),
            g.entries.join(", ")
        ))
    }

    /// What is broken, one line per root cause (free text inside: escape it for where it
    /// goes): each new group (no decision covers it), each regressed group, then the root
    /// causes of the groups a decision covers, defects first (with their fix), then contract
    /// questions, by design, guards, artifacts and tolerances; then known groups whose file
    /// carries no decision. Each with the hunt's second of its first violation.
    pub fn what_is_broken(&self) -> Vec<String> {
        let describe = |i: usize, g: &HuntGroup| {
            let rep = &self.findings[g.group.representative - 1].finding;
            let oracles: Vec<&str> = g.group.oracles.iter().map(|o| o.name()).collect();
            let memory: Vec<&str> = g.memory.iter().map(|m| m.name()).collect();
            format!(
                "group {i}: {} {} on {}",
                oracles.join("+"),
                rep.kind,
                memory.join(",")
            )
        };
        let at = |t: f64| format!("first violation at {t:.1} s");
        let mut lines = Vec::new();
        for (i, g) in self.groups.iter().enumerate() {
            match &g.class {
                GroupClass::New => lines.push(format!(
                    "new: {}; {}",
                    describe(i + 1, g),
                    at(g.first_violation_s)
                )),
                GroupClass::Regressed { file } => lines.push(format!(
                    "regressed ({file}): {}; {}",
                    describe(i + 1, g),
                    at(g.first_violation_s)
                )),
                GroupClass::Known { .. }
                | GroupClass::KnownByFix { .. }
                | GroupClass::Decided { .. } => {}
            }
        }
        // The groups a decision covers, by root cause: (groups, earliest violation).
        type Cause<'a> = (&'a DecisionNote, Vec<String>, f64);
        let mut causes: Vec<Cause> = Vec::new();
        let mut undecided: BTreeMap<&str, (Vec<String>, f64)> = BTreeMap::new();
        for (i, g) in self.groups.iter().enumerate() {
            let how = match (&g.class, &g.decision) {
                (GroupClass::Known { .. }, Some(_)) => "known",
                (GroupClass::KnownByFix { .. }, Some(_)) => "known by fix",
                (GroupClass::Decided { .. }, Some(_)) => "decided",
                (GroupClass::Known { file }, None) => {
                    let e = undecided.entry(file).or_insert((Vec::new(), f64::MAX));
                    e.0.push((i + 1).to_string());
                    e.1 = e.1.min(g.first_violation_s);
                    continue;
                }
                _ => continue,
            };
            let note = g.decision.as_ref().expect("matched above");
            let group = format!("{} ({how})", i + 1);
            match causes
                .iter_mut()
                .find(|c| c.0.root_cause == note.root_cause)
            {
                Some(c) => {
                    c.1.push(group);
                    c.2 = c.2.min(g.first_violation_s);
                }
                None => causes.push((note, vec![group], g.first_violation_s)),
            }
        }
        causes.sort_by_key(|(n, _, _)| (n.decision, root_cause_order(&n.root_cause)));
        for (note, groups, first) in causes {
            let fix = note
                .fix
                .as_ref()
                .map_or(String::new(), |f| format!(", fix {f}"));
            lines.push(format!(
                "{} {}{fix}: {}; groups {}; {}",
                note.decision.word(),
                note.root_cause,
                note.summary,
                groups.join(", "),
                at(first)
            ));
        }
        for (file, (groups, first)) in undecided {
            lines.push(format!(
                "known ({file}, no decision recorded): groups {}; {}",
                groups.join(", "),
                at(first)
            ));
        }
        lines
    }

    /// The opening sentence (free text inside: escape it for where it goes).
    fn headline(&self) -> String {
        let (t, f) = self.trials();
        format!(
            "hunt of {}{}: budget {}, {:.1} s, seed {}; {} of {} plan entries run, {} unsupported, {} not started (budget spent); {t} exhaustive trials, {f} fuzz cases{}",
            self.target,
            fault_suffix(&self.faults),
            self.budget.describe(),
            self.elapsed_s,
            self.seed,
            self.entries.len(),
            self.plan.len(),
            self.unsupported.len(),
            self.skipped.len(),
            match (&self.failed, self.incomplete) {
                (Some(why), _) => format!(" (PARTIAL: failed after its work began: {why})"),
                (None, true) => " (INCOMPLETE: stopped before every entry ran)".into(),
                (None, false) => String::new(),
            }
        ) + &self.code_lines.as_ref().map_or(String::new(), |c| {
            format!(
                "; memory code reached: {} of {} lines ({:.1}%), {} of {} blocks (kvaudit coverage)",
                c.lines_reached,
                c.lines,
                c.line_percent(),
                c.blocks_reached,
                c.blocks
            )
        })
    }

    /// The line under the headline: the corpus the groups were classified against, and what
    /// identity by fix could replay.
    fn corpus_line(&self) -> String {
        let corpus = match &self.corpus {
            Some(c) => format!("corpus: {}", c.describe()),
            None => "corpus: none yet (the groups are not classified)".into(),
        };
        match &self.fix_replays {
            Some(r) => format!("{corpus}; {}", r.describe()),
            None => corpus,
        }
    }

    /// For a terminal.
    pub fn to_terminal(&self) -> String {
        let mut s = terminal_text(&self.headline()) + "\n";
        s.push_str(&(terminal_text(&self.corpus_line()) + "\n"));
        for line in self.what_is_broken() {
            s.push_str(&(terminal_text(&line) + "\n"));
        }
        let widths = [-10, -20, 10, 10, 4, 6, 10, 8, 6];
        let line = |cells: &[String]| -> String {
            let padded: Vec<String> = cells
                .iter()
                .zip(widths)
                .map(|(c, w): (&String, i32)| match w {
                    w if w < 0 => format!("{c:<width$}", width = (-w) as usize),
                    w => format!("{c:>width$}", width = w as usize),
                })
                .collect();
            padded.join(" ") + "\n"
        };
        s.push_str(&line(&COLUMNS.map(String::from)));
        for r in self.table() {
            s.push_str(&line(&r.cells()));
        }
        if self.groups.is_empty() {
            s.push_str("no findings\n");
        }
        for (i, g) in self.groups.iter().enumerate() {
            s.push_str(&self.group_line(g, i + 1, &terminal_text));
            s.push('\n');
        }
        for x in &self.fixed {
            s.push_str(&terminal_text(&format!(
                "fixed: {} ({}) in entry {}: {}",
                x.file, x.oracle, x.entry, x.detail
            )));
            s.push('\n');
        }
        // The line's end outside the escaping: a reason's own newlines are escaped, its end not.
        for (id, why) in &self.unsupported {
            s.push_str(&terminal_text(&format!("unsupported: {id}: {why}")));
            s.push('\n');
        }
        s
    }

    /// Markdown.
    pub fn to_markdown(&self) -> String {
        let mut s = format!(
            "# {}\n\n{}\n\n",
            markdown_text(&self.headline()),
            markdown_text(&self.corpus_line())
        );
        s.push_str("## What is broken\n\n");
        let broken = self.what_is_broken();
        if broken.is_empty() {
            s.push_str("Nothing: no findings.\n");
        }
        for line in broken {
            s.push_str(&format!("- {}\n", markdown_text(&line)));
        }
        s.push_str("\n## By memory type and oracle\n\n");
        s.push_str(&format!(
            "| {} |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
            COLUMNS.join(" | ")
        ));
        for r in self.table() {
            s.push_str(&format!(
                "| {} |\n",
                r.cells().map(|c| markdown_text(&c)).join(" | ")
            ));
        }
        s.push_str("\n## Groups\n\n");
        if self.groups.is_empty() {
            s.push_str("No findings.\n");
        }
        for (i, g) in self.groups.iter().enumerate() {
            s.push_str(&self.group_line(g, i + 1, &markdown_text));
            s.push('\n');
        }
        if !self.fixed.is_empty() {
            s.push_str("\n## Fixed\n\n");
            for x in &self.fixed {
                s.push_str(&markdown_text(&format!(
                    "- {} ({}) in entry {}: {}\n",
                    x.file, x.oracle, x.entry, x.detail
                )));
            }
        }
        s.push_str("\n## Entries\n\n| entry | memory | depth | trials | fuzz cases | unsupported | repeats | s |\n|---|---|---:|---:|---:|---:|---:|---:|\n");
        for e in &self.entries {
            s.push_str(&format!(
                "| {} | {} | {}{} | {} | {} | {} | {} | {:.1} |\n",
                markdown_text(&e.id),
                e.memory.name(),
                e.depth,
                if e.cut_short { " (cut short)" } else { "" },
                e.trials,
                e.fuzz_cases,
                e.unsupported,
                e.repeats,
                e.elapsed_s
            ));
        }
        // One table of the entries the target cannot run, each with its reason.
        if !self.unsupported.is_empty() {
            s.push_str("\n## Unsupported entries\n\n| entry | why |\n|---|---|\n");
            for (id, why) in &self.unsupported {
                s.push_str(&format!(
                    "| {} | {} |\n",
                    markdown_text(id),
                    markdown_text(why)
                ));
            }
        }
        for e in &self.entries {
            for n in &e.not_reproduced {
                s.push_str(&markdown_text(&format!(
                    "\nNot reproduced: {}: case {}, {} {} at step {} did not fail again when replayed (its trace is in summary.json)\n",
                    e.id, n.case, n.oracle, n.kind, n.step
                )));
            }
        }
        s
    }
}

fn fault_suffix(faults: &[String]) -> String {
    faults.iter().map(|f| format!("[{f}]")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fix_is_named_with_its_root_cause_and_its_replay() {
        let mut e = FixEvidence {
            remedy: "fix seq-keep-all-streams".into(),
            root_cause: Some("R8".into()),
            replayed_on: "llama.cpp@0.1.161+fix:seq-keep-all-streams".into(),
            fails_at: 3,
            files: vec!["contract_streams_seq_keep_leaves_other_streams.json".into()],
        };
        let by_fix = ByFix {
            explained: vec![e.clone()],
            replayed: 18,
            ..ByFix::default()
        };
        assert_eq!(
            format!("known{}", by_fix.describe()),
            "known R8 by fix seq-keep-all-streams: replayed on \
             llama.cpp@0.1.161+fix:seq-keep-all-streams, fails at step 3 -> holds"
        );
        // A root cause the corpus does not hold: the group stays new, with the evidence.
        e.files.clear();
        let by_fix = ByFix {
            explained: vec![e],
            replayed: 18,
            ..ByFix::default()
        };
        assert_eq!(
            by_fix.describe(),
            " (made to hold by fix seq-keep-all-streams (R8): replayed on \
             llama.cpp@0.1.161+fix:seq-keep-all-streams, fails at step 3 -> holds; no corpus \
             file of its root cause)"
        );
    }

    #[test]
    fn budgets() {
        assert_eq!(Budget::parse("5m").unwrap(), Budget::Seconds(300.0));
        assert_eq!(Budget::parse("90").unwrap(), Budget::Seconds(90.0));
        assert_eq!(Budget::parse("400trials").unwrap(), Budget::Trials(400));
        assert!(Budget::parse("0trials").is_err());
        assert!(Budget::parse("5 parsecs").is_err());
    }

    /// A summary of one group whose representative's shrink stopped after `stopped` executions.
    fn one_group(stopped: Option<u64>) -> HuntSummary {
        let stopped = stopped.map_or(String::new(), |n| {
            format!(r#", "shrink_stopped_after": {n}"#)
        });
        HuntSummary::parse(&format!(
            r#"{{"kvaudit": "", "target": "native", "budget": {{"trials": 1}}, "seed": 1,
            "shard": {{"index": 0, "count": 1}}, "plan": ["seed"], "unsupported": [], "entries": [],
            "findings": [{{"finding": {{"oracle": "I1", "kind": "k", "target": "native", "depth": 1,
              "trial_index": 0, "step": 1, "seq": 0, "trace": {{"setup": {{"n_ctx": 256,
              "n_seq_max": 2, "ops": [{{"op": "decode", "seq": 0, "n": 7}}]}},
              "ops": [{{"op": "seq_rm", "seq": 0, "p0": 1, "p1": 7}}]}}, "observed": null,
              "expected": null}}, "entry": "seed", "memory": "kv", "found_at_s": 1.0{stopped}}}],
            "groups": [{{"group": {{"cause": {{"by": "minimal_trace", "shape": "[shape]"}},
              "oracles": ["I1"], "representative": 1, "findings": [1]}}, "memory": ["kv"],
              "entries": ["seed"], "class": {{"class": "new"}}, "first_violation_s": 1.0}}],
            "fixed": [], "elapsed_s": 1.0}}"#
        ))
        .unwrap()
    }

    #[test]
    fn a_group_line_writes_the_trace_with_its_values_and_says_when_it_is_not_minimal() {
        let minimal = one_group(None).to_markdown();
        assert!(
            minimal.contains(r#"{"op":"seq\_rm","p0":1,"p1":7,"seq":0}"#),
            "{minimal}"
        );
        assert!(!minimal.contains("[shape]") && !minimal.contains("not minimal"));
        let stopped = one_group(Some(40)).to_terminal();
        assert!(
            stopped.contains("; not minimal: shrink stopped by the budget after 40 executions"),
            "{stopped}"
        );
    }
}
