//! `kvaudit fuzz`: random traces, every oracle after every op, each failure shrunk to a minimal
//! repro file. `--oracles` picks the oracles, the numerical theorems T1-T3 among them: those drive
//! a `CacheUnderTest` directly rather than through a runner, the one
//! [`kvaudit::targets::registry::TargetSpec::theorem_target`] builds with the requested window.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use super::args::{factories, record_on_specs, with_config, OutputArgs, TargetArgs};
use super::progress::Display;
use super::CliError;
use kvaudit::base::cache::Observe;
use kvaudit::base::domain::check_trace_limits;
use kvaudit::base::exit;
use kvaudit::base::files::{check_writable_folder, read_text_limited, sha256_hex};
use kvaudit::base::op::{Setup, Trace};
use kvaudit::engines::fuzz::{run_fuzz_with_queue, FuzzConfig, GenConfig, Generator};
use kvaudit::engines::shrink::ShrinkConfig;
use kvaudit::engines::theorem_check::TheoremChecker;
use kvaudit::oracles::theorems::{Theorem, Tolerance};
use kvaudit::oracles::{OracleId, Reads, Registry};
use kvaudit::outputs::repro::{
    check_date, measure, safe_file_name, targets_of, today_utc, write_output, Expect, Found, Repro,
    ReproGroup, TargetExpectation,
};
use kvaudit::records::report::Report;
use kvaudit::targets::registry::TargetSpec;

/// Arguments of `kvaudit fuzz`.
#[derive(Debug, Args)]
pub struct FuzzArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Seed of the generator (default: from the clock). Printed at the start of the run; the same
    /// seed gives the same cases, findings and repro files.
    #[arg(long)]
    seed: Option<u64>,
    /// Cases to run (default: 1000, or no limit when --time is given).
    #[arg(long)]
    cases: Option<u64>,
    /// Longest trace, in ops after the setup.
    #[arg(long, default_value_t = 64)]
    max_len: usize,
    /// Shortest trace (default: half of --max-len).
    #[arg(long)]
    min_len: Option<usize>,
    /// Stop after this wall time, shrinking included (`90`, `30s`, `5m`, `1h`).
    #[arg(long)]
    time: Option<String>,
    /// Largest position in a generated range or explicit decode position.
    #[arg(long, default_value_t = 32)]
    pos_cap: i32,
    /// Sequences of the context (`n_seq_max`); ops name all of them.
    #[arg(long, default_value_t = 4)]
    n_seq_max: u32,
    /// The context's configuration, as `--vs-config` takes it: `kv_unified=false`,
    /// `n_ubatch=2`, `flash_attn=on`, `type_k=q8_0`, ...
    #[arg(long)]
    config: Option<String>,
    /// Draw state saves and loads (sequences and the whole context) too.
    #[arg(long)]
    state: bool,
    /// Draw whole-sequence copies only (`seq_cp(src, dst, -1, -1)`), for a memory whose range
    /// copy is a known abort (dsv4); recorded in the report's generator.
    #[arg(long)]
    whole_copies: bool,
    /// Failures of one signature (oracle, kind, op at the failing step) to shrink; later ones
    /// are counted against the first one's finding.
    #[arg(long, default_value_t = 1)]
    shrinks_per_signature: u32,
    /// Most target executions one shrink may spend.
    #[arg(long, default_value_t = 100_000)]
    shrink_budget: u64,
    /// Write one repro file per finding into this folder.
    #[arg(long, default_value = "repros")]
    repro_dir: PathBuf,
    /// Write no repro files.
    #[arg(long)]
    no_repros: bool,
    /// Also record in each repro file whether it fails or holds on these targets, e.g.
    /// `native` for the fault-free build of a fault-injected run, or `llama.cpp@0.1.161`.
    #[arg(long = "record-on", value_delimiter = ',')]
    record_on: Vec<String>,
    /// The repro files' `since` date, YYYY-MM-DD (default: today, UTC).
    #[arg(long, env = "KVAUDIT_DATE")]
    date: Option<String>,
    /// Oracles to judge, comma separated, any case: I1, I2, crash, differential (needs --vs),
    /// and the numerical theorems T1, T2, T3 (need --target native+tensors). T2 and T3 derive a
    /// partner trace from each case (never-saw, prefix recompute, out-of-window); a case with no
    /// partner counts as "no pair", not as a pass. Default: I1, I2, crash (and differential
    /// with --vs).
    #[arg(long, value_delimiter = ',')]
    oracles: Vec<String>,
    /// Sliding window of the native+tensors model for the theorem oracles (T3 then also checks
    /// out-of-window evictions). I1, I2 and crash judge cell metadata, which a window leaves
    /// unchanged.
    #[arg(long)]
    window: Option<u32>,
    /// How cases are drawn: `random` (each case afresh from its own stream: case N of a seed is
    /// the same trace in every run) or `guided` (coverage-guided: cases that reach a new
    /// transition or observation shape join a queue, and one case in two mutates a queue
    /// entry: splice, insert, drop, change arguments, repeat). Default: `random`, or `guided`
    /// with --corpus.
    #[arg(long)]
    generator: Option<String>,
    /// The guided generator's queue on disk: its traces (one JSON trace per file) are run
    /// first and mutated; every trace the run keeps is written back. Created if absent.
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// With T2 or T3: draw from the plain generator instead of the one biased towards traces
    /// that have a partner (to measure how rarely plain traces have one).
    #[arg(long)]
    no_theorem_bias: bool,
    #[command(flatten)]
    out: OutputArgs,
}

/// Parses `90`, `30s`, `5m`, `1h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    kvaudit::records::text::parse_seconds(s)
        .map(Duration::from_secs_f64)
        .map_err(|e| format!("--time '{s}': {}", e.message))
}

/// The largest corpus file read.
const MAX_CORPUS_ENTRY_BYTES: u64 = 16 << 20;

/// The traces of a `--corpus` folder, in file-name order (none if it does not exist yet); each
/// must start from `setup` (the run's own).
pub fn read_corpus(dir: &Path, setup: &Setup) -> Result<Vec<Trace>, CliError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(CliError::usage(format!("--corpus {}: {e}", dir.display()))),
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for path in paths {
        let bad = |why: String| CliError::usage(format!("--corpus {}: {why}", path.display()));
        let text =
            read_text_limited(&path, MAX_CORPUS_ENTRY_BYTES).map_err(|e| bad(e.to_string()))?;
        let trace: Trace = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        check_trace_limits(&trace).map_err(|e| bad(e.to_string()))?;
        if &trace.setup != setup {
            return Err(bad(
                "starts from another setup than this run's (--config, --n-seq-max)".into(),
            ));
        }
        out.push(trace);
    }
    Ok(out)
}

/// Writes each trace of `queue` into `dir` as `<sha256 prefix>.json`, unless a file of that
/// name is there; returns how many were new.
pub fn write_corpus(dir: &Path, queue: &[Trace]) -> Result<usize, CliError> {
    let err = |e: String| CliError::harness(format!("--corpus {}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
    let mut written = 0;
    for t in queue {
        let text = serde_json::to_string_pretty(t).expect("a trace serializes") + "\n";
        let path = dir.join(format!("{}.json", &sha256_hex(&text)[..16]));
        if path.exists() {
            continue;
        }
        write_output(&path, &text).map_err(|e| err(e.to_string()))?;
        written += 1;
    }
    Ok(written)
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64 % 1_000_000_000)
}

/// The repro of each finding of a fuzz report, with the expectations measured on `record_on`.
pub fn repros_of(
    report: &Report,
    record_on: &[TargetSpec],
    date: &str,
) -> Result<Vec<Repro>, CliError> {
    let fz = report.fuzz.as_ref().expect("a fuzz report");
    let a = TargetSpec::new(&report.target.name, &report.target.faults);
    let vs = report
        .vs
        .as_ref()
        .map(|v| TargetSpec::new(&v.name, &v.faults));
    let vs = vs.as_ref();
    let mut out = Vec::new();
    // One repro per root cause: its representative, saying how many findings it stands for (the
    // report keeps every finding). An ungrouped report gives one per finding.
    let group_of = |n: usize| report.groups.iter().find(|g| g.findings.contains(&n));
    for (i, (f, rec)) in report.findings.iter().zip(&fz.findings).enumerate() {
        let group = group_of(i + 1);
        if group.is_some_and(|g| g.representative != i + 1) {
            continue;
        }
        let found = Found {
            seed: Some(fz.seed),
            case: Some(rec.case),
            length: rec.length,
            step: rec.step,
            shrink_executions: rec.executions,
        };
        // B's own crash is labelled with B alone (see Judge::label_of).
        let on_vs = vs.is_some_and(|b| f.target == label_of(b) && f.target != label_of(&a));
        let (x, y) = targets_of(f.oracle, on_vs, &a, vs);
        let fails = TargetExpectation::new(&x, y.as_ref(), Expect::Fails);
        let mut r = Repro::from_finding(f, date, vec![fails], Some(found));
        r.group = group.map(|g| ReproGroup {
            cause: g.cause.clone(),
            findings: g.count(),
        });
        for spec in record_on {
            let e = measure(&r, spec, y.as_ref())
                .map_err(|e| CliError::harness(format!("--record-on {}: {e}", spec.name)))?;
            r.targets.push(e);
        }
        out.push(r);
    }
    Ok(out)
}

fn label_of(t: &TargetSpec) -> String {
    TargetExpectation::new(t, None, Expect::Holds).label()
}

/// Writes repro files into `dir`, one per repro, names made unique in this run.
pub fn write_repros(dir: &std::path::Path, repros: &[Repro]) -> Result<Vec<PathBuf>, CliError> {
    let mut used = BTreeSet::new();
    let mut paths = Vec::new();
    for r in repros {
        // file_name() is safe already; a name is still never trusted to stay in `dir`.
        let base = safe_file_name(&r.file_name());
        let stem = base.trim_end_matches(".json").to_string();
        let mut name = base;
        let mut k = 2;
        while !used.insert(name.clone()) {
            name = format!("{stem}_{k}.json");
            k += 1;
        }
        let path = dir.join(&name);
        write_output(&path, &r.to_text()).map_err(CliError::harness)?;
        paths.push(path);
    }
    Ok(paths)
}

/// The oracles of `--oracles`, looked up in the registry: observation oracles (`None` when the
/// list is empty: the default set) and theorems (oracles that run traces), each once, in the
/// order given.
pub fn parse_oracles(list: &[String]) -> Result<(Option<Vec<OracleId>>, Vec<Theorem>), String> {
    if list.is_empty() {
        return Ok((None, Vec::new()));
    }
    let registry = Registry::builtin();
    let (mut obs, mut thm) = (Vec::new(), Vec::new());
    for name in list.iter().map(|n| n.trim()) {
        let oracle = registry.find(name).ok_or_else(|| {
            format!(
                "--oracles: unknown oracle '{name}' (known: {})",
                registry.names().join(", ")
            )
        })?;
        if oracle.reads() == Reads::Runs {
            let t = Theorem::from_name(oracle.id().name())
                .expect("every oracle that runs traces is a theorem");
            if !thm.contains(&t) {
                thm.push(t);
            }
        } else if !obs.contains(&oracle.id()) {
            obs.push(oracle.id());
        }
    }
    Ok((Some(obs), thm))
}

/// Runs the fuzzer.
pub fn run(a: FuzzArgs) -> Result<i32, CliError> {
    let time = a
        .time
        .as_deref()
        .map(parse_duration)
        .transpose()
        .map_err(CliError::usage)?;
    let mut gen = GenConfig::with_max_len(a.max_len);
    if let Some(m) = a.min_len {
        gen.min_len = m;
    }
    gen.pos_cap = a.pos_cap;
    gen.setup.n_seq_max = a.n_seq_max;
    if let Some(c) = &a.config {
        gen.setup = with_config(&gen.setup, c)?;
    }
    gen.state = a.state;
    gen.whole_copies = a.whole_copies;
    gen.validate().map_err(CliError::usage)?;
    a.target.check()?;
    let (oracles, theorems) = parse_oracles(&a.oracles).map_err(CliError::usage)?;
    let registry = Registry::builtin();
    // A configuration pair is judged by config-differential, not differential (see
    // TargetArgs::registry), unless --oracles says otherwise.
    let oracles = oracles.or_else(|| {
        a.target.vs_config.as_ref().map(|_| {
            a.target
                .registry()
                .iter()
                .filter(|o| o.reads() != Reads::Runs)
                .map(|o| o.id())
                .collect()
        })
    });
    let needs_vs = oracles
        .iter()
        .flatten()
        .find(|o| registry.get(**o).is_some_and(|o| o.reads() == Reads::Pair));
    if let (Some(o), None, None) = (needs_vs, &a.target.vs, &a.target.vs_config) {
        return Err(CliError::usage(format!(
            "--oracles {o} compares two targets: give the second with --vs"
        )));
    }
    let mut theorem_target = None;
    if !theorems.is_empty() {
        let spec = a.target.specs().0;
        // Refused before anything else is checked: no other option makes this target judgeable.
        if let Err(why) = spec.check_theorem_target() {
            let names: Vec<&str> = theorems.iter().map(|t| t.name()).collect();
            return Err(CliError::usage(format!(
                "--oracles {}: {why}",
                names.join(",")
            )));
        }
        if oracles.as_ref().is_some_and(|o| o.is_empty()) && a.target.vs.is_some() {
            return Err(CliError::usage(
                "--vs is for the differential oracle; the theorem oracles judge --target alone",
            ));
        }
        if a.window == Some(0) {
            return Err(CliError::usage("--window 0 hides every key"));
        }
        if !a.no_theorem_bias {
            gen.theorems = theorems.clone();
            gen.window = a.window;
        }
        theorem_target = Some(spec.theorem_target(a.window)?);
    } else if a.window.is_some() || a.no_theorem_bias {
        return Err(CliError::usage(
            "--window and --no-theorem-bias apply to the theorem oracles (--oracles T1,T2,T3)",
        ));
    }
    if a.cases == Some(0) {
        return Err(CliError::usage("--cases must be at least 1"));
    }
    let generator = match (a.generator.as_deref(), &a.corpus) {
        (None, None) => Generator::Random,
        (None, Some(_)) => Generator::Guided,
        (Some(name), _) => Generator::from_name(name).ok_or_else(|| {
            CliError::usage(format!("--generator '{name}': expected random or guided"))
        })?,
    };
    if generator == Generator::Random && a.corpus.is_some() {
        return Err(CliError::usage(
            "--corpus is the guided generator's queue: use it with --generator guided",
        ));
    }
    if generator == Generator::Guided && !theorems.is_empty() {
        return Err(CliError::usage(
            "--generator guided judges observation oracles; the theorem oracles need --generator random",
        ));
    }
    let corpus = match &a.corpus {
        Some(dir) => read_corpus(dir, &gen.setup)?,
        None => Vec::new(),
    };
    let date = match &a.date {
        Some(d) => check_date(d).map_err(|e| CliError::usage(format!("--date: {e}")))?,
        None => today_utc(),
    };
    let (spec_a, spec_b) = a.target.specs();
    // Every observation after every op, plus the logits probe when an oracle that reads it is
    // asked (by default it is: a fuzz run probes the last step of each case only).
    let observe = match &oracles {
        Some(list) => list
            .iter()
            .filter_map(|o| registry.get(*o))
            .fold(Observe::ALL, |acc, o| acc.union(o.observes())),
        None => Observe::ALL.union(registry.observe()),
    };
    let spec_a = spec_a.with_observe(observe);
    let spec_b = spec_b.map(|b| b.with_observe(observe));
    let (fa, fb) = factories(&spec_a, spec_b.as_ref(), a.target.vs_config.as_deref())?;
    let record_on = record_on_specs(&a.record_on)?;
    let cfg = FuzzConfig {
        seed: a.seed.unwrap_or_else(clock_seed),
        cases: match (a.cases, time) {
            (Some(n), _) => Some(n),
            (None, Some(_)) => None,
            (None, None) => Some(1000),
        },
        time,
        gen,
        shrink: ShrinkConfig {
            max_executions: a.shrink_budget,
            ..ShrinkConfig::default()
        },
        shrinks_per_signature: a.shrinks_per_signature.max(1),
        oracles,
        theorems,
        generator,
        corpus,
    };
    let mut checker = match theorem_target {
        None => None,
        Some((target, reference)) => Some(TheoremChecker::new(
            target,
            reference,
            a.window,
            Tolerance::EXACT,
        )),
    };
    // Where the end writes, checked before the first case.
    a.out.check_writable()?;
    if let Some(dir) = &a.corpus {
        check_writable_folder(dir).map_err(|e| CliError::usage(format!("--corpus {e}")))?;
    }
    if !a.no_repros {
        check_writable_folder(&a.repro_dir)
            .map_err(|e| CliError::usage(format!("--repro-dir {e}")))?;
    }
    let mut display = Display::new(&a.out);
    let (mut report, queue) = run_fuzz_with_queue(
        &cfg,
        fa.as_ref(),
        fb.as_deref(),
        checker.as_mut(),
        &mut |e| display.show(e),
    )?;
    kvaudit::engines::root_cause::group_report(&mut report);
    // Each output is tried whatever the one before it did: a failure at the end loses no more
    // than its own part (the report holds every finding's trace).
    let emitted = a.out.emit(&report);
    let fz = report.fuzz.as_ref().expect("a fuzz report");
    if !a.out.quiet {
        eprintln!(
            "kvaudit fuzz: seed {}: {} cases, {} target executions; shrinking took {} executions, {:.3} s",
            fz.seed, fz.cases, fz.executions, fz.shrink_executions, fz.shrink_elapsed_s
        );
        for t in &fz.theorems {
            eprintln!("kvaudit fuzz: {}", t.summary());
        }
        if let Some(p) = &fz.logits_probes {
            eprintln!("kvaudit fuzz: {}", p.summary());
        }
        if let Some(p) = &fz.reload_probes {
            for line in p.summary().lines() {
                eprintln!("kvaudit fuzz: {line}");
            }
        }
    }
    let corpus_written = match &a.corpus {
        Some(dir) => write_corpus(dir, &queue).map(|written| {
            if !a.out.quiet {
                eprintln!(
                    "kvaudit fuzz: corpus {}: {} entries, {written} new",
                    dir.display(),
                    queue.len()
                );
            }
        }),
        None => Ok(()),
    };
    let repros_written = if !a.no_repros && report.has_findings() {
        repros_of(&report, &record_on, &date)
            .and_then(|repros| write_repros(&a.repro_dir, &repros))
            .map(|paths| {
                if !a.out.quiet {
                    for p in paths {
                        eprintln!("repro written to {}", p.display());
                    }
                }
            })
    } else {
        Ok(())
    };
    emitted?;
    corpus_written?;
    repros_written?;
    Ok(if report.has_findings() {
        exit::FINDINGS
    } else {
        exit::CLEAN
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("0.5s").unwrap(), Duration::from_millis(500));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("-3").is_err());
    }
}
