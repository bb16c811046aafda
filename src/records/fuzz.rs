//! The record of a fuzz run: what its generator drew from ([`GenConfig`]), how each finding was
//! found and shrunk ([`ShrinkRecord`]), what each theorem oracle judged ([`TheoremStats`],
//! [`TheoremFinding`]), as the `fuzz` part of a report ([`FuzzSummary`]). Plain data with its
//! renderings; the fuzzer that fills it is `engines::fuzz`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::base::cache::{LogitsProbe, Reload, ReloadProbe};
use crate::base::error::Error;
use crate::base::op::{Decode, Op, OpKind, Pos, SeqId, Setup, Trace};
use crate::oracles::theorems::{Derivation, Theorem, Verdict};

/// What the generator draws from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenConfig {
    /// Where every trace starts (the shrinker keeps its settings and shrinks its ops with the
    /// rest). Its `n_seq_max` is the number of sequences the ops name.
    pub setup: Setup,
    /// Shortest trace.
    pub min_len: usize,
    /// Longest trace.
    pub max_len: usize,
    /// Largest position in a range or an explicit decode position.
    pub pos_cap: Pos,
    /// Largest `|delta|` of a `seq_add`.
    pub max_delta: Pos,
    /// Largest divisor of a `seq_div` (the smallest is 2).
    pub max_divisor: i32,
    /// Most tokens in one decode.
    pub max_tokens: u32,
    /// Theorems to bias the draws towards (`kvaudit fuzz --oracles T2,T3`): with T2 or T3 here,
    /// each trace is a random prefix followed by one or two chunks shaped so that the theorem's
    /// derivations find a partner ([`crate::engines::fuzz::theorem_trace_strategy`]). Empty: the plain generator.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub theorems: Vec<Theorem>,
    /// The target's sliding window, when it has one: the biased generator then also draws
    /// evictions of keys out of every later query's window (T3's out-of-window pairs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u32>,
    /// Draw the state ops too: saves and (sometimes truncated) loads of sequences into named
    /// slots, and of the whole context.
    #[serde(default, skip_serializing_if = "is_false")]
    pub state: bool,
    /// Draw whole-sequence copies only (`seq_cp(src, dst, -1, -1)`): for a memory whose range
    /// copy is a known abort (dsv4's `GGML_ASSERT`, `corpora/crash_dsv4_partial_seq_cp_aborts.json`)
    /// a run would otherwise end most cases there (`kvaudit fuzz --whole-copies`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub whole_copies: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig::with_max_len(64)
    }
}

impl GenConfig {
    /// The default generator for traces of `max_len / 2 ..= max_len` ops: the seed's setup
    /// (positions 0..6 in seq 0) in a context of 4 sequences.
    pub fn with_max_len(max_len: usize) -> Self {
        GenConfig {
            setup: Setup {
                n_ctx: 256,
                n_seq_max: 4,
                ops: vec![Op::Decode(Decode::next(0, 7))],
                ..Setup::default()
            },
            min_len: (max_len / 2).max(1),
            max_len,
            pos_cap: 32,
            max_delta: 8,
            max_divisor: 4,
            max_tokens: 4,
            theorems: Vec::new(),
            window: None,
            state: false,
            whole_copies: false,
        }
    }

    /// Checks the bounds before anything runs.
    pub fn validate(&self) -> Result<(), Error> {
        if self.max_len == 0 {
            return Err("--max-len must be at least 1".into());
        }
        if self.min_len == 0 || self.min_len > self.max_len {
            return Err(format!(
                "--min-len must be in 1..={} (--max-len), got {}",
                self.max_len, self.min_len
            )
            .into());
        }
        if self.setup.n_seq_max < 2 {
            return Err("the context needs at least 2 sequences to fork".into());
        }
        if self.pos_cap < 2 || self.max_delta < 1 || self.max_divisor < 2 || self.max_tokens < 1 {
            return Err("pos_cap >= 2, max_delta >= 1, max_divisor >= 2, max_tokens >= 1".into());
        }
        Ok(())
    }

    /// The number of sequences the ops name.
    pub fn n_seqs(&self) -> SeqId {
        self.setup.n_seq_max as SeqId
    }

    /// Whether the generators draw ops of `kind`: no shifts for an architecture whose memory
    /// cannot shift (`Arch::can_shift`: llama.cpp aborts on them).
    pub fn draws(&self, kind: OpKind) -> bool {
        self.setup.arch.can_shift() || !kind.moves_positions()
    }
}

/// How one finding of a fuzz run was found and shrunk (same order as the report's findings).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShrinkRecord {
    /// Target(s), oracle, kind and op names of the minimal trace: what findings are told
    /// apart by.
    pub shape: String,
    /// The case (from 0) that found it first.
    pub case: u64,
    /// Length of that case's trace.
    pub length: usize,
    /// The first step of that trace that violated the oracle.
    pub step: usize,
    /// Length of the shrunk trace.
    pub shrunk_len: usize,
    /// Target executions the shrink took.
    pub executions: u64,
    /// Wall time the shrink took, in seconds.
    pub elapsed_s: f64,
    /// True if the shrink reached its fixed point (see [`crate::engines::shrink`]).
    pub minimal: bool,
    /// Later failing cases that came to the same finding.
    pub duplicates: u64,
    /// Wall time from the start of the run to the end of the case that found it, in seconds
    /// (earlier shrinks included).
    #[serde(default)]
    pub found_at_s: f64,
}

impl ShrinkRecord {
    /// One line: how the finding was found and what shrinking it took.
    pub fn summary(&self) -> String {
        format!(
            "found by case {} ({} ops, first fails at step {}); shrunk to {} ops{} in {} executions, {:.3} s; {} more failing case(s) came to it",
            self.case,
            self.length,
            self.step,
            self.shrunk_len,
            if self.minimal { " (minimal)" } else { " (budget ran out)" },
            self.executions,
            self.elapsed_s,
            self.duplicates
        )
    }
}

/// The fuzz-specific part of a report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FuzzSummary {
    /// The seed.
    pub seed: u64,
    /// The generator.
    pub generator: GenConfig,
    /// Cases run.
    pub cases: u64,
    /// Target executions, cases and shrinking together.
    pub executions: u64,
    /// Of which shrinking.
    pub shrink_executions: u64,
    /// Wall time spent shrinking, in seconds.
    pub shrink_elapsed_s: f64,
    /// One per finding, in the report's order.
    pub findings: Vec<ShrinkRecord>,
    /// The oracles asked for with `--oracles` (absent: the default set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oracles: Option<Vec<String>>,
    /// Per theorem checked (`--oracles T1,T2,T3`): how many cases it judged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub theorems: Vec<TheoremStats>,
    /// Violated theorems, one per theorem, derivation and shape of the shrunk trace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub theorem_findings: Vec<TheoremFinding>,
    /// The logits probes of the cases (the cache-invisible oracle's measurements), when any
    /// case was probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logits_probes: Option<ProbeStats>,
    /// The reload probes of the cases (the measurements of round-trip-logits and
    /// save-load-invisible), when any case was probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reload_probes: Option<ReloadStats>,
    /// Which generator drew the cases.
    #[serde(default)]
    pub generator_kind: Generator,
    /// Coverage over the run: a point after 1, 2, 4, 8, ... cases and one at the end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub coverage: Vec<CoveragePoint>,
    /// The guided generator's queue (`--generator guided`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueStats>,
    /// The target's memory code the cases reached, on a target that records it (`+cov`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<crate::records::code::CodeSet>,
    /// Failures that did not happen again when the shrinker replayed their case: the target
    /// answered the same trace two ways (its own nondeterminism, or state a worker carried over
    /// from an earlier trial). Not shrunk and not findings; each is kept with its trace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_reproduced: Vec<NotReproduced>,
}

/// A failure its own replay did not show again ([`FuzzSummary::not_reproduced`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotReproduced {
    /// The case.
    pub case: u64,
    /// The oracle that failed the first time.
    pub oracle: String,
    /// Its kind of violation.
    pub kind: String,
    /// The step it failed at.
    pub step: usize,
    /// The case's trace, as it ran.
    pub trace: Trace,
}

/// The generator of a fuzz run's cases.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Generator {
    /// Case `i` of seed `s` is drawn afresh from its own stream, whatever came before.
    #[default]
    Random,
    /// Coverage-guided: the cases that reach a new transition or observation shape join a
    /// queue, and most cases are mutations of queue entries (`engines::fuzz::guide`).
    Guided,
}

impl Generator {
    /// The name `--generator` takes.
    pub fn name(self) -> &'static str {
        match self {
            Generator::Random => "random",
            Generator::Guided => "guided",
        }
    }

    /// The strategy `name` names (`random`, `guided`).
    pub fn from_name(name: &str) -> Option<Self> {
        [Generator::Random, Generator::Guided]
            .into_iter()
            .find(|s| s.name() == name)
    }
}

/// The coverage after some cases: distinct (state, op, outcome) transitions and distinct
/// observation shapes of target A's abstracted cells (`engines::fuzz::coverage`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CoveragePoint {
    /// Wall time since the start of the run, in seconds.
    pub elapsed_s: f64,
    /// Cases run.
    pub cases: u64,
    /// Distinct transitions seen.
    pub transitions: u64,
    /// Distinct observation shapes seen.
    pub shapes: u64,
    /// Distinct PCs of the target's memory code reached (a `+cov` build; 0 elsewhere).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pcs: u64,
    /// Distinct edges of the target's memory code taken (a `+cov` build; 0 elsewhere).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub edges: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl CoveragePoint {
    /// Transitions and shapes together: what the guided generator grows.
    pub fn total(&self) -> u64 {
        self.transitions + self.shapes
    }
}

/// What the guided generator's queue did over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueStats {
    /// Entries read from `--corpus` (run first, as the first cases).
    pub loaded: u64,
    /// Entries kept for their coverage at the end of the run, loaded ones included (what
    /// `--corpus` writes; the findings' traces the queue also mutates are not among them).
    pub entries: u64,
    /// Cases that were mutations of queue entries (the others were drawn afresh).
    pub mutated: u64,
    /// Entries kept for new coverage that came from mutations.
    pub kept_from_mutations: u64,
}

/// What the logits probes of a fuzz run measured: how many sequences were probed and the largest
/// difference from a fresh decode among them, apart for sequences with moved (re-rotated) keys
/// (what PREREG.md's tolerances were chosen from).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeStats {
    /// Sequences probed whose tokens never moved, over every case.
    pub probes: u64,
    /// The largest max |Δ| of those.
    pub max_abs_diff: f32,
    /// Sequences probed with a token moved by `seq_add`/`seq_div`.
    pub shifted_probes: u64,
    /// The largest max |Δ| of those.
    pub shifted_max_abs_diff: f32,
}

impl ProbeStats {
    /// Counts one probe.
    pub fn add(&mut self, p: &LogitsProbe) {
        if p.shifted {
            self.shifted_probes += 1;
            self.shifted_max_abs_diff = self.shifted_max_abs_diff.max(p.max_abs_diff);
        } else {
            self.probes += 1;
            self.max_abs_diff = self.max_abs_diff.max(p.max_abs_diff);
        }
    }

    /// One line for the terminal.
    pub fn summary(&self) -> String {
        format!(
            "logits probes: {} sequences, largest max |Δ| {:e}; {} with moved keys, largest {:e}",
            self.probes, self.max_abs_diff, self.shifted_probes, self.shifted_max_abs_diff
        )
    }
}

/// The upper bounds of [`LoadStats::histogram`]'s buckets: a probe falls in the first bucket
/// whose bound its max |Δ| does not exceed; the last bucket holds the rest.
pub const RELOAD_BUCKETS: [f32; 6] = [0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2];

/// One load's reload probes over a fuzz run ([`Reload`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadStats {
    /// Sequences probed after a load that succeeded.
    pub probes: u64,
    /// The largest max |Δ| of those.
    pub max_abs_diff: f32,
    /// How many of those fall in each bucket of [`RELOAD_BUCKETS`] (and the last, above 1e-2).
    pub histogram: [u64; RELOAD_BUCKETS.len() + 1],
    /// Loads that failed (returned 0), per sequence.
    pub failed: u64,
}

/// The reload probes of a fuzz run, per load.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReloadStats {
    /// Per load.
    pub loads: BTreeMap<Reload, LoadStats>,
}

impl ReloadStats {
    /// Counts one probe.
    pub fn add(&mut self, p: &ReloadProbe) {
        let s = self.loads.entry(p.load).or_default();
        if !p.loaded {
            s.failed += 1;
            return;
        }
        s.probes += 1;
        s.max_abs_diff = s.max_abs_diff.max(p.max_abs_diff);
        let bucket = RELOAD_BUCKETS
            .iter()
            .position(|&b| p.max_abs_diff <= b)
            .unwrap_or(RELOAD_BUCKETS.len());
        s.histogram[bucket] += 1;
    }

    /// One line per load for the terminal.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        for (load, s) in &self.loads {
            let _ = write!(
                out,
                "{}reload probes, {}: {} sequences, largest max |Δ| {:e}, by bucket (<= 0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, more) {:?}; {} failed loads",
                if out.is_empty() { "" } else { "\n" },
                load.name(),
                s.probes,
                s.max_abs_diff,
                s.histogram,
                s.failed
            );
        }
        out
    }
}

/// What one theorem did over a fuzz run. Every case is offered to it; a case from which no pair
/// derives is `no_pair`, neither a pass nor a failure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TheoremStats {
    /// The theorem.
    pub theorem: Theorem,
    /// Cases offered.
    pub cases: u64,
    /// Cases judged by at least one check (T1: every case the target could show).
    pub checked: u64,
    /// Cases no derivation gave a pair for.
    pub no_pair: u64,
    /// Cases whose every check was unsupported by the target.
    pub unsupported: u64,
    /// Cases with a violated check.
    pub violations: u64,
    /// Judged checks per derivation (`placement` for T1).
    pub pairs: BTreeMap<String, u64>,
}

impl TheoremStats {
    /// The share of the cases that were judged.
    pub fn checked_fraction(&self) -> f64 {
        self.checked as f64 / (self.cases.max(1)) as f64
    }

    /// One line: cases, judged, no pair, unsupported, violated, pairs by derivation.
    pub fn summary(&self) -> String {
        let by: Vec<String> = self.pairs.iter().map(|(d, n)| format!("{d} {n}")).collect();
        format!(
            "{}: {} cases, {} checked ({:.1}%), {} no pair, {} unsupported, {} violated; checks: {}",
            self.theorem.name(),
            self.cases,
            self.checked,
            100.0 * self.checked_fraction(),
            self.no_pair,
            self.unsupported,
            self.violations,
            if by.is_empty() { "none".to_string() } else { by.join(", ") }
        ) + if self.checked == 0 {
            " (never checked: this run says nothing about it)"
        } else {
            ""
        }
    }
}

/// A violated theorem: the shrunk trace, its partner and the verdict, and how it was found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TheoremFinding {
    /// The theorem.
    pub theorem: Theorem,
    /// How the pair was derived (absent for T1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub derivation: Option<Derivation>,
    /// The target it was seen on.
    pub target: String,
    /// Theorem, derivation and op names of the shrunk trace: what findings are told apart by.
    pub shape: String,
    /// The shrunk trace (the pair's left side).
    pub trace: Trace,
    /// Its derived partner (the right side), for T2 and T3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partner: Option<Trace>,
    /// The verdict on the shrunk trace.
    pub verdict: Verdict,
    /// The case (from 0) that found it first.
    pub case: u64,
    /// Length of that case's trace.
    pub length: usize,
    /// Length of the shrunk trace.
    pub shrunk_len: usize,
    /// Target executions the shrink took.
    pub executions: u64,
    /// Wall time the shrink took, in seconds.
    pub elapsed_s: f64,
    /// True if the shrink reached its fixed point.
    pub minimal: bool,
    /// Later failing cases that came to the same finding.
    pub duplicates: u64,
}

impl TheoremFinding {
    /// One line: how the finding was found and what shrinking it took.
    pub fn summary(&self) -> String {
        format!(
            "found by case {} ({} ops); shrunk to {} ops{} in {} executions, {:.3} s; {} more failing case(s) came to it",
            self.case,
            self.length,
            self.shrunk_len,
            if self.minimal { " (minimal)" } else { " (budget ran out)" },
            self.executions,
            self.elapsed_s,
            self.duplicates
        )
    }

    fn title(&self) -> String {
        match self.derivation {
            Some(d) => format!("{} {} pair violated on {}", self.theorem, d, self.target),
            None => format!("{} placement violated on {}", self.theorem, self.target),
        }
    }
}

impl FuzzSummary {
    /// One line: the generator, its final coverage and the curve (empty without coverage).
    pub fn coverage_line(&self) -> String {
        let Some(last) = self.coverage.last() else {
            return String::new();
        };
        let curve: Vec<String> = self
            .coverage
            .iter()
            .map(|p| format!("{}@{:.1}s:{}", p.cases, p.elapsed_s, p.total()))
            .collect();
        let queue = self.queue.map_or(String::new(), |q| {
            format!(
                "; queue {} entries ({} loaded, {} kept from mutations), {} mutated cases",
                q.entries, q.loaded, q.kept_from_mutations, q.mutated
            )
        });
        format!(
            "coverage ({} generator): {} transitions, {} shapes after {} cases{queue}; cases@time:total {}",
            self.generator_kind.name(),
            last.transitions,
            last.shapes,
            last.cases,
            curve.join(" ")
        )
    }

    /// The theorem part of the terminal report (empty without theorem oracles); `numbered`
    /// findings came before.
    pub fn theorems_terminal(&self, numbered: usize) -> String {
        let mut s = String::new();
        if self.theorems.is_empty() {
            return s;
        }
        let _ = writeln!(
            s,
            "\ntheorem oracles (window {}):",
            window_text(self.generator.window)
        );
        for t in &self.theorems {
            let _ = writeln!(s, "  {}", t.summary());
        }
        for (i, f) in self.theorem_findings.iter().enumerate() {
            let _ = writeln!(s, "\nfinding {}: {}", numbered + i + 1, f.title());
            let _ = write!(s, "{}", f.trace);
            if let Some(p) = &f.partner {
                let _ = writeln!(s, "  partner:");
                let _ = write!(s, "{p}");
            }
            let _ = writeln!(s, "  {}", f.verdict);
            let _ = writeln!(s, "  {}", f.summary());
        }
        s
    }

    /// The theorem part of the Markdown report (empty without theorem oracles).
    pub fn theorems_markdown(&self, numbered: usize) -> String {
        let mut s = String::new();
        if self.theorems.is_empty() {
            return s;
        }
        let _ = writeln!(
            s,
            "\n## Theorem oracles\n\nWindow {}.\n\n| theorem | cases | checked | no pair | unsupported | violated | checks |\n|---|---:|---:|---:|---:|---:|---|",
            window_text(self.generator.window)
        );
        for t in &self.theorems {
            let by: Vec<String> = t.pairs.iter().map(|(d, n)| format!("{d} {n}")).collect();
            let _ = writeln!(
                s,
                "| {} | {} | {} ({:.1}%) | {} | {} | {} | {} |",
                t.theorem.name(),
                t.cases,
                t.checked,
                100.0 * t.checked_fraction(),
                t.no_pair,
                t.unsupported,
                t.violations,
                by.join(", ")
            );
        }
        for (i, f) in self.theorem_findings.iter().enumerate() {
            let _ = writeln!(s, "\n## Finding {}: {}\n", numbered + i + 1, f.title());
            let _ = writeln!(s, "```text\n{}```\n", f.trace);
            if let Some(p) = &f.partner {
                let _ = writeln!(s, "Partner:\n\n```text\n{p}```\n");
            }
            let _ = writeln!(s, "- verdict: {}\n- {}", f.verdict, f.summary());
        }
        s
    }
}

fn window_text(w: Option<u32>) -> String {
    w.map_or("unset".into(), |w| w.to_string())
}
