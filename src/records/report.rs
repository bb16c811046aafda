//! Reports: one event stream, three renderings (terminal table, JSON, Markdown), and merging.
//!
//! Explorers emit [`Event`]s; the command line feeds them to a progress display and, with
//! `--message-format json`, prints them as JSON lines. The final [`Report`] is written as JSON
//! (`--format json`, `--out FILE`) or Markdown, always atomically (temp file + rename), so an
//! interrupted run never leaves half a report. [`merge`] combines shard reports into the report
//! an unsharded run gives.
//!
//! Free text in a report (target names, model file names, domain names, kinds of violation) may
//! come from a file someone sent: the renderings put it through [`terminal_text`] (no control
//! characters reach a terminal) and [`markdown_text`] / [`markdown_code`] (no text ends a code
//! span, adds a table column, starts a line or carries HTML). A report read back is at most
//! [`MAX_REPORT_BYTES`] ([`Report::load`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use tabled::{settings::Style, Table, Tabled};

use crate::base::cache::TargetInfo;
use crate::base::domain::{check_trace_limits, total_trials, Domain};
use crate::base::error::Error;
use crate::base::files::check_input_size;
use crate::oracles::OracleId;
use crate::records::prereg::{self, OraclePrediction, Prediction, PredictionCheck, RunName};
pub use crate::records::state_space::StateSpace;
use crate::records::tally::Tally;

pub use crate::records::finding::{Finding, FindingKey, OracleStats};
pub use crate::records::group::FindingGroup;
use crate::records::text::{acts_on_terminal, compact_value};

mod event;
pub use crate::records::text::{markdown_code, markdown_text, terminal_text};
pub use event::Event;

/// The largest JSON report read back (`kvaudit merge`): 64 MiB, far above a report's size (its
/// findings are distinct and shrunk), small enough that parsing one cannot exhaust memory.
pub const MAX_REPORT_BYTES: u64 = 64 << 20;
/// Most shards a report read back may say the run had ([`merge`] keeps one flag per shard).
pub const MAX_REPORT_SHARDS: usize = 1 << 16;
/// Deepest run a report read back may describe (figures such as the trial count are computed
/// per depth).
pub const MAX_REPORT_DEPTH: u32 = 10_000;

/// This run's share of the work: shard `index` of `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// K, from 0.
    pub index: usize,
    /// M, at least 1.
    pub count: usize,
}

impl Shard {
    /// The whole run.
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };

    /// Parses `K/M`.
    pub fn parse(s: &str) -> Result<Shard, Error> {
        let (k, m) = s
            .split_once('/')
            .ok_or_else(|| format!("shard '{s}': expected K/M, e.g. 0/3"))?;
        let k: usize = k
            .trim()
            .parse()
            .map_err(|_| format!("shard '{s}': K is not a number"))?;
        let m: usize = m
            .trim()
            .parse()
            .map_err(|_| format!("shard '{s}': M is not a number"))?;
        Shard::new(k, m).map_err(|e| e.context(format!("shard '{s}'")))
    }

    /// A checked shard.
    pub fn new(index: usize, count: usize) -> Result<Shard, Error> {
        if count == 0 || index >= count {
            return Err(format!("need 0 <= K < M, got K = {index}, M = {count}").into());
        }
        Ok(Shard { index, count })
    }
}

/// Wall-clock figures (left out of merge comparisons; summed by merge).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// Seconds.
    pub elapsed_s: f64,
    /// Trials per second.
    pub trials_per_s: f64,
}

/// The result of an audit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// kvaudit version.
    pub kvaudit: String,
    /// Target under audit.
    pub target: TargetInfo,
    /// Second target for the differential oracle, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vs: Option<TargetInfo>,
    /// The domain.
    pub domain: Domain,
    /// Longest trace.
    pub depth: u32,
    /// Which part of the work this report covers.
    pub shard: Shard,
    /// Trials run.
    pub trials: u64,
    /// Trials stopped by an unsupported op (not judged).
    pub unsupported: u64,
    /// Per oracle.
    pub oracles: BTreeMap<OracleId, OracleStats>,
    /// Distinct findings, by oracle then depth.
    pub findings: Vec<Finding>,
    /// The findings grouped by root cause (largest group first); empty until grouped
    /// (`engines::root_cause`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<FindingGroup>,
    /// Wall clock.
    pub timing: Timing,
    /// Prediction vs outcome, when PREREG.md has a prediction for this run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prediction: Vec<PredictionCheck>,
    /// For a fuzz run: the seed, the generator and how each finding was shrunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuzz: Option<crate::records::fuzz::FuzzSummary>,
    /// Set when the run was stopped before every chunk was done (`audit --resume` continues it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<crate::records::incomplete::Incomplete>,
    /// For a state-space search (`--strategy states`): what it covered. Its trials are its
    /// transitions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_space: Option<StateSpace>,
    /// The target's own code an exhaustive run's trials reached, on a `+cov` build
    /// (`kvaudit coverage` maps it to lines; a fuzz run's is `fuzz.code`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<crate::records::code::CodeSet>,
    /// The op kinds of the domain left out because a target declares it lacks them
    /// ([`crate::base::capabilities::Capabilities`]), with its reason: never run, so neither
    /// passing nor unsupported.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<crate::base::capabilities::LeftOut>,
}

impl Report {
    /// Builds the report of a (possibly partial) run. Its oracle table lists the oracles of
    /// `tally` (see [`Tally::asked`]).
    pub fn new(
        target: TargetInfo,
        vs: Option<TargetInfo>,
        domain: Domain,
        depth: u32,
        shard: Shard,
        tally: Tally,
        timing: Timing,
    ) -> Report {
        let oracles = tally.oracles;
        let code = tally.code.map(|c| c.set(&target.name));
        let mut findings: Vec<Finding> = tally.findings.into_values().collect();
        findings.sort_by(|a, b| {
            (a.oracle, a.depth, a.trial_index, &a.kind).cmp(&(
                b.oracle,
                b.depth,
                b.trial_index,
                &b.kind,
            ))
        });
        Report {
            kvaudit: env!("CARGO_PKG_VERSION").into(),
            target,
            vs,
            domain,
            depth,
            shard,
            trials: tally.trials,
            unsupported: tally.unsupported,
            oracles,
            findings,
            groups: Vec::new(),
            timing,
            prediction: Vec::new(),
            fuzz: None,
            state_space: None,
            incomplete: None,
            code,
            left_out: Vec::new(),
        }
    }

    /// Whether `other` reports on the same run: the same targets, domain and depth (shards and
    /// resumed parts of one run agree on these).
    pub fn same_run(&self, other: &Report) -> bool {
        let who = |r: &Report| {
            serde_json::to_value((&r.target, &r.vs, &r.domain, r.depth)).expect("serializes")
        };
        who(self) == who(other)
    }

    /// The counts and findings, as a [`Tally`] to merge more work into.
    pub fn into_tally(self) -> Tally {
        Tally {
            trials: self.trials,
            unsupported: self.unsupported,
            oracles: self.oracles,
            findings: self.findings.into_iter().map(|f| (f.key(), f)).collect(),
            code: self
                .code
                .as_ref()
                .map(crate::records::code::CodeGather::resumed),
        }
    }

    fn prediction_lines(&self) -> Vec<String> {
        let show = |o: &OraclePrediction| match (o.violated, o.first_depth) {
            (false, _) => "holds".to_string(),
            (true, Some(d)) => format!("violated, first at depth {d}"),
            (true, None) => "violated".to_string(),
        };
        self.prediction
            .iter()
            .map(|c| {
                let verdict = if c.confirmed {
                    "confirmed"
                } else {
                    "FALSIFIED"
                };
                format!(
                    "{}: predicted {}; outcome {}: {verdict}",
                    c.oracle,
                    show(&c.predicted),
                    show(&c.outcome)
                )
            })
            .collect()
    }

    /// The predictions of PREREG.md that match this run, checked against its outcome.
    pub fn check_predictions(&self, predictions: &[Prediction]) -> Vec<PredictionCheck> {
        let vs = self.vs.as_ref().map(|v| v.label());
        let target = self.target.label();
        let run = RunName {
            target: &target,
            vs: vs.as_deref(),
            domain: &self.domain.name,
            depth: self.depth,
        };
        prereg::check(predictions, &run, |oracle| {
            // An oracle that judged nothing has no outcome to confirm or falsify.
            self.oracles
                .get(&oracle)
                .filter(|s| s.checked > 0)
                .map(|stats| OraclePrediction {
                    violated: stats.violations > 0,
                    first_depth: stats.first_depth,
                })
        })
    }

    /// One line per root-cause group, largest first; `text` escapes free text for where it goes.
    fn group_lines(&self, text: fn(&str) -> String) -> Vec<String> {
        self.groups
            .iter()
            .enumerate()
            .map(|(g, group)| {
                let rep = &self.findings[group.representative - 1];
                let oracles: Vec<String> = group.oracles.iter().map(|o| o.to_string()).collect();
                let numbers: Vec<String> = group.findings.iter().map(|n| n.to_string()).collect();
                format!(
                    "group {}: {} finding{} ({}), {}; representative: finding {} ({} ops){}",
                    g + 1,
                    group.count(),
                    if group.count() == 1 { "" } else { "s" },
                    text(&oracles.join(", ")),
                    text(&group.cause.describe_with(&rep.trace)),
                    group.representative,
                    rep.trace.ops.len(),
                    if group.count() > 1 {
                        format!("; findings {}", numbers.join(", "))
                    } else {
                        String::new()
                    }
                )
            })
            .collect()
    }

    /// The group (1-based) finding `n` (1-based) belongs to, as a suffix for its heading.
    fn group_of(&self, n: usize) -> String {
        self.groups
            .iter()
            .position(|g| g.findings.contains(&n))
            .map(|g| format!(", group {}", g + 1))
            .unwrap_or_default()
    }

    /// True if any oracle was violated (a fuzz run's theorem oracles included); findings of
    /// advisory oracles ([`OracleId::advisory`]) are questions, not failures, and do not count.
    pub fn has_findings(&self) -> bool {
        self.findings.iter().any(|f| !f.oracle.advisory())
            || self
                .fuzz
                .as_ref()
                .is_some_and(|fz| !fz.theorem_findings.is_empty())
    }

    /// Parses a JSON report (`--format json`), at most [`MAX_REPORT_BYTES`]. Errors say where.
    pub fn parse(text: &str) -> Result<Report, Error> {
        check_input_size(text.len() as u64, MAX_REPORT_BYTES, "a report")?;
        let r: Report = serde_json::from_str(text).map_err(|e| {
            format!(
                "line {}, column {}: not a kvaudit JSON report: {}",
                e.line(),
                e.column(),
                terminal_text(&e.to_string())
            )
        })?;
        r.check_limits()?;
        Ok(r)
    }

    /// What rendering and merging rely on and JSON cannot say: a shard inside its run, a depth,
    /// domain and traces inside the input limits, each finding's step a step of its trace.
    fn check_limits(&self) -> Result<(), String> {
        Shard::new(self.shard.index, self.shard.count).map_err(|e| format!("\"shard\": {e}"))?;
        if self.shard.count > MAX_REPORT_SHARDS {
            return Err(format!(
                "\"shard\": {} shards, more than the limit of {MAX_REPORT_SHARDS}",
                self.shard.count
            ));
        }
        if self.depth > MAX_REPORT_DEPTH {
            return Err(format!(
                "\"depth\": {}, more than the limit of {MAX_REPORT_DEPTH}",
                self.depth
            ));
        }
        self.domain
            .check_limits()
            .map_err(|e| format!("\"domain\": {e}"))?;
        if let Some(i) = &self.incomplete {
            i.check(
                self.depth,
                self.domain.ops().len(),
                (self.shard.index, self.shard.count),
            )?;
        }
        for (i, f) in self.findings.iter().enumerate() {
            check_trace_limits(&f.trace).map_err(|e| format!("finding {}: {e}", i + 1))?;
            if f.step == 0 || f.step > f.trace.ops.len() {
                return Err(format!(
                    "finding {}: step {} is not a step of its trace's {} ops",
                    i + 1,
                    f.step,
                    f.trace.ops.len()
                ));
            }
        }
        let n = self.findings.len();
        for (g, group) in self.groups.iter().enumerate() {
            let inside = |i: &usize| (1..=n).contains(i);
            if !inside(&group.representative)
                || group.findings.is_empty()
                || !group.findings.iter().all(inside)
            {
                return Err(format!("group {}: a finding number outside 1..={n}", g + 1));
            }
        }
        Ok(())
    }

    /// Reads and parses a JSON report; errors name the file.
    pub fn load(path: &std::path::Path) -> Result<Report, Error> {
        let text = crate::base::files::read_text_limited(path, MAX_REPORT_BYTES)?;
        Self::parse(&text).map_err(|e| e.context(path.display()))
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("reports always serialize") + "\n"
    }

    /// The per-oracle table, for terminals.
    pub fn oracle_table(&self) -> String {
        #[derive(Tabled)]
        struct Row {
            oracle: String,
            checked: String,
            violations: u64,
            #[tabled(rename = "first depth")]
            first_depth: String,
            findings: usize,
        }
        let rows = self.oracles.iter().map(|(id, s)| Row {
            oracle: id.to_string(),
            checked: checked_cell(s.checked, self.trials),
            violations: s.violations,
            first_depth: s.first_depth.map_or("-".into(), |d| d.to_string()),
            findings: self.findings.iter().filter(|f| f.oracle == *id).count(),
        });
        Table::new(rows).with(Style::rounded()).to_string()
    }

    /// "no findings", saying which requested theorems never checked a case: a theorem that
    /// judged nothing must not read as a clean result.
    fn no_findings_line(&self) -> String {
        let unchecked: Vec<&str> = self
            .fuzz
            .iter()
            .flat_map(|fz| &fz.theorems)
            .filter(|t| t.checked == 0)
            .map(|t| t.theorem.name())
            .collect();
        if unchecked.is_empty() {
            "no findings".into()
        } else {
            format!(
                "no findings, but {} never checked a case",
                unchecked.join(", ")
            )
        }
    }

    /// The one-line summary; `text` escapes free text for where it goes.
    fn heading(&self, text: fn(&str) -> String) -> String {
        let vs = self
            .vs
            .as_ref()
            .map(|v| format!(" vs {}", text(&v.label())))
            .unwrap_or_default();
        let shard = if self.shard.count > 1 {
            format!(", shard {}/{}", self.shard.index, self.shard.count)
        } else {
            String::new()
        };
        if let Some(fz) = &self.fuzz {
            return format!(
                "{}{vs}: fuzz seed {}, traces of {}..={} ops: {} cases ({} unsupported) in {:.2} s",
                text(&self.target.label()),
                fz.seed,
                fz.generator.min_len,
                fz.generator.max_len,
                self.trials,
                self.unsupported,
                self.timing.elapsed_s
            );
        }
        if let Some(sp) = &self.state_space {
            return format!(
                "{}{vs}: domain {} ({} ops), states: {} distinct states, {} transitions ({} unsupported), {} at depth {} in {:.2} s",
                text(&self.target.label()),
                text(&self.domain.name),
                self.ops_run(),
                sp.states,
                sp.transitions,
                self.unsupported,
                if sp.closed { "closed" } else { "bound reached" },
                sp.depth,
                self.timing.elapsed_s
            );
        }
        format!(
            "{}{vs}: domain {} ({} ops), depth {}{shard}: {} trials ({} unsupported) in {:.2} s",
            text(&self.target.label()),
            text(&self.domain.name),
            self.ops_run(),
            self.depth,
            self.trials,
            self.unsupported,
            self.timing.elapsed_s
        )
    }

    /// How many of the domain's ops the run enumerated: those of the kinds no target lacks.
    fn ops_run(&self) -> usize {
        let ops = self.domain.ops();
        ops.iter()
            .filter(|op| !self.left_out.iter().any(|l| l.op == op.kind().name()))
            .count()
    }

    /// One line per op kind left out ([`Report::left_out`]).
    fn left_out_lines(&self, text: fn(&str) -> String) -> Vec<String> {
        self.left_out
            .iter()
            .map(|l| {
                format!(
                    "left out: {} ({} declares it lacks it: {})",
                    text(&l.op),
                    text(&l.target),
                    text(&l.reason)
                )
            })
            .collect()
    }

    /// The terminal rendering: heading, table, one block per finding.
    pub fn to_terminal(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "{}", self.heading(terminal_text));
        for l in self.left_out_lines(terminal_text) {
            let _ = writeln!(s, "{l}");
        }
        if let Some(i) = &self.incomplete {
            let _ = writeln!(s, "{}", i.describe());
        }
        // A fuzz run of theorem oracles alone judges no observation oracle: no empty table.
        if !self.oracles.is_empty() {
            let _ = writeln!(s, "{}", self.oracle_table());
        }
        if !self.prediction.is_empty() {
            let _ = writeln!(s, "\nPREREG.md, prediction vs outcome:");
            for l in self.prediction_lines() {
                let _ = writeln!(s, "  {l}");
            }
        }
        if !self.groups.is_empty() {
            let _ = writeln!(
                s,
                "\n{} root cause{} of {} findings:",
                self.groups.len(),
                if self.groups.len() == 1 { "" } else { "s" },
                self.findings.len()
            );
            for l in self.group_lines(terminal_text) {
                let _ = writeln!(s, "  {l}");
            }
        }
        for (i, f) in self.findings.iter().enumerate() {
            let _ = writeln!(
                s,
                "\nfinding {}: {} {} on {} (depth {}, step {}{})",
                i + 1,
                f.oracle,
                terminal_text(&f.kind),
                terminal_text(&f.target),
                f.depth,
                f.step,
                self.group_of(i + 1)
            );
            let _ = write!(s, "{}", f.trace);
            let _ = writeln!(s, "  observed: {}", compact_value(&f.observed));
            let _ = writeln!(s, "  expected: {}", compact_value(&f.expected));
            if let Some(r) = self.fuzz.as_ref().and_then(|fz| fz.findings.get(i)) {
                let _ = writeln!(s, "  {}", r.summary());
            }
        }
        if let Some(fz) = &self.fuzz {
            s.push_str(&fz.theorems_terminal(self.findings.len()));
            if !fz.coverage.is_empty() {
                let _ = writeln!(s, "\n{}", fz.coverage_line());
            }
        }
        if !self.has_findings() {
            let _ = writeln!(s, "\n{}", self.no_findings_line());
        }
        // Whatever a field let through (a JSON string with a C1 control), no line acts on the
        // terminal.
        s.split('\n')
            .map(terminal_text)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The Markdown rendering.
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# kvaudit report: {}\n",
            markdown_text(&self.target.label())
        );
        let _ = writeln!(s, "{}\n", self.heading(markdown_text));
        for l in self.left_out_lines(markdown_text) {
            let _ = writeln!(s, "- {l}");
        }
        if !self.left_out.is_empty() {
            s.push('\n');
        }
        if let Some(i) = &self.incomplete {
            let _ = writeln!(s, "**{}**\n", i.describe());
        }
        let targets: Vec<String> = std::iter::once(&self.target)
            .chain(self.vs.as_ref())
            .map(|t| {
                // A llama.cpp target's version is its pin, already in its name.
                let version = (!t.name.ends_with(&t.version))
                    .then(|| format!("version {}", markdown_text(&t.version)));
                let model = t
                    .model
                    .as_ref()
                    .map(|m| format!("model {}", markdown_code(m)));
                let about: Vec<String> = version.into_iter().chain(model).collect();
                if about.is_empty() {
                    markdown_code(&t.label())
                } else {
                    format!("{} ({})", markdown_code(&t.label()), about.join(", "))
                }
            })
            .collect();
        let _ = writeln!(s, "Targets: {}.\n", targets.join(", "));
        // As in the terminal: no empty table for a fuzz run of theorem oracles alone.
        if !self.oracles.is_empty() {
            let _ = writeln!(
                s,
                "| oracle | checked | violations | first depth | findings |"
            );
            let _ = writeln!(s, "|---|---:|---:|---:|---:|");
            for (id, st) in &self.oracles {
                let n = self.findings.iter().filter(|f| f.oracle == *id).count();
                let fd = st.first_depth.map_or("-".into(), |d| d.to_string());
                let _ = writeln!(
                    s,
                    "| {id} | {} | {} | {fd} | {n} |",
                    checked_cell(st.checked, self.trials),
                    st.violations
                );
            }
        }
        if !self.prediction.is_empty() {
            let _ = writeln!(s, "\n## Prediction (PREREG.md) vs outcome\n");
            for l in self.prediction_lines() {
                let _ = writeln!(s, "- {l}");
            }
        }
        if !self.groups.is_empty() {
            let _ = writeln!(
                s,
                "\n## Root causes\n\n{} root cause{} of {} findings (findings are the same bug by evidence: see docs/usage.md, root-cause groups).\n",
                self.groups.len(),
                if self.groups.len() == 1 { "" } else { "s" },
                self.findings.len()
            );
            for l in self.group_lines(markdown_text) {
                let _ = writeln!(s, "- {l}");
            }
        }
        for (i, f) in self.findings.iter().enumerate() {
            let _ = writeln!(
                s,
                "\n## Finding {}: {} {}\n",
                i + 1,
                f.oracle,
                markdown_text(&f.kind)
            );
            let _ = writeln!(
                s,
                "On {}, depth {}, observed after step {}{}.\n",
                markdown_code(&f.target),
                f.depth,
                f.step,
                self.group_of(i + 1)
            );
            let _ = writeln!(s, "```text\n{}```\n", f.trace);
            let ops: Vec<String> = f.trace.ops.iter().map(|o| o.to_json()).collect();
            let _ = writeln!(
                s,
                "Ops (JSON): {}\n",
                markdown_code(&format!("[{}]", ops.join(",")))
            );
            let _ = writeln!(
                s,
                "- observed: {}\n- expected: {}",
                markdown_code(&compact_value(&f.observed)),
                markdown_code(&compact_value(&f.expected))
            );
            if let Some(r) = self.fuzz.as_ref().and_then(|fz| fz.findings.get(i)) {
                let _ = writeln!(s, "- {}", r.summary());
            }
        }
        if let Some(fz) = &self.fuzz {
            s.push_str(&fz.theorems_markdown(self.findings.len()));
            if !fz.coverage.is_empty() {
                let _ = writeln!(s, "\n{}.", markdown_text(&fz.coverage_line()));
            }
        }
        if !self.has_findings() {
            let line = self.no_findings_line();
            let _ = writeln!(s, "\n{}{}.", line[..1].to_uppercase(), &line[1..]);
        }
        s
    }
}

/// Checks that every Markdown table in `md` (a run of lines starting with `|`) has as many
/// columns on every row as in its header; an escaped `\|` is not a column separator. The check
/// the hostile-input test and the `report_json` fuzz target apply to a rendered report.
pub fn check_markdown_tables(md: &str) -> Result<(), Error> {
    let columns = |line: &str| {
        let mut n = 0;
        let mut escaped = false;
        for c in line.chars() {
            match c {
                '|' if !escaped => n += 1,
                '\\' if !escaped => {
                    escaped = true;
                    continue;
                }
                _ => {}
            }
            escaped = false;
        }
        n
    };
    let mut header: Option<usize> = None;
    for (i, line) in md.lines().enumerate() {
        if !line.starts_with('|') {
            header = None;
            continue;
        }
        let n = columns(line);
        match header {
            None => header = Some(n),
            Some(h) if h != n => {
                return Err(format!(
                    "line {}: {} column separators, the table's header has {h}: {line}",
                    i + 1,
                    n
                )
                .into())
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Fuzz target `report_json` (`fuzz/fuzz_targets/report_json.rs`, and `tests/it/fuzz_seeds.rs`
/// over its seeds): any bytes parse as a report or fail with an error; a report that parses
/// renders for a terminal with no control character but newlines, and as Markdown whose tables
/// keep their columns. Panics otherwise.
#[doc(hidden)]
pub fn fuzz_report_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(report) = Report::parse(text) else {
        return;
    };
    let terminal = report.to_terminal();
    if let Some(c) = terminal.chars().find(|&c| c != '\n' && acts_on_terminal(c)) {
        panic!("U+{:04X} reaches the terminal", c as u32);
    }
    if let Err(e) = check_markdown_tables(&report.to_markdown()) {
        panic!("{e}");
    }
    let _ = report.to_json();
}

/// Combines shard reports into the report of the whole run. Fails (with the reason) unless the
/// reports are shards of one run that cover every shard exactly once.
pub fn merge(reports: Vec<Report>) -> Result<Report, Error> {
    let first = reports.first().ok_or("no reports to merge")?.clone();
    if reports.iter().any(|r| r.fuzz.is_some()) {
        return Err("fuzz reports cannot be merged (they are not shards of an enumeration)".into());
    }
    if reports.iter().any(|r| r.state_space.is_some()) {
        return Err("state-space reports cannot be merged (they are not sharded)".into());
    }
    let m = first.shard.count;
    let mut seen = vec![false; m];
    let mut tally = Tally::default();
    let mut timing = Timing::default();
    for (i, r) in reports.into_iter().enumerate() {
        if !r.same_run(&first) {
            return Err(format!(
                "report {} is of another run (target, domain or depth differ)",
                i + 1
            )
            .into());
        }
        if r.shard.count != m {
            return Err(format!(
                "report {} is shard {}/{}, others are of {m}",
                i + 1,
                r.shard.index,
                r.shard.count
            )
            .into());
        }
        if std::mem::replace(&mut seen[r.shard.index], true) {
            return Err(format!("shard {}/{m} given twice", r.shard.index).into());
        }
        if let Some(i) = &r.incomplete {
            return Err(format!("shard {}/{m}: {}", r.shard.index, i.describe()).into());
        }
        timing.elapsed_s += r.timing.elapsed_s;
        tally.merge(r.into_tally());
    }
    if let Some(missing) = seen.iter().position(|s| !s) {
        return Err(format!("shard {missing}/{m} is missing").into());
    }
    let expected = total_trials(first.domain.ops().len() as u64, first.depth);
    if tally.trials != expected {
        return Err(format!("merged {} trials, the run has {expected}", tally.trials).into());
    }
    timing.trials_per_s = tally.trials as f64 / timing.elapsed_s.max(1e-9);
    Ok(Report::new(
        first.target,
        first.vs,
        first.domain,
        first.depth,
        Shard::WHOLE,
        tally,
        timing,
    ))
}
/// The "checked" cell of an oracle row: the count, or that the target gave the oracle nothing
/// to judge in a run that had trials.
fn checked_cell(checked: u64, trials: u64) -> String {
    if checked == 0 && trials > 0 {
        "0 (not judged)".into()
    } else {
        checked.to_string()
    }
}
