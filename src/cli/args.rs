//! Argument groups shared by several subcommands: target, domain, output.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::CliError;
use kvaudit::base::domain::{parse_range, Domain, DomainOverrides, PRESETS};
use kvaudit::base::files::{check_writable_file, write_or_aside};
use kvaudit::records::report::Report;
use kvaudit::targets::registry::TargetSpec;

/// The runner factories of a target and of the optional second one (`--vs`); an unknown name
/// or a fault the target cannot take is a usage error.
#[allow(clippy::type_complexity)]
pub fn factories(
    a: &TargetSpec,
    b: Option<&TargetSpec>,
    vs_config: Option<&str>,
) -> Result<
    (
        Box<kvaudit::running::runner::RunnerFactory<'static>>,
        Option<Box<kvaudit::running::runner::RunnerFactory<'static>>>,
    ),
    CliError,
> {
    Ok(kvaudit::engines::audit::factories(a, b, vs_config)?)
}

/// The targets of `--record-on LABEL...` (`native`, `native[fault]`, `llama.cpp@PIN`), each
/// checked to exist now rather than after a long run.
pub fn record_on_specs(labels: &[String]) -> Result<Vec<TargetSpec>, CliError> {
    labels
        .iter()
        .map(|l| {
            let spec = kvaudit::outputs::repro::parse_label(l)
                .map_err(|e| CliError::usage(format!("--record-on: {e}")))?;
            spec.factory()
                .map(drop)
                .map_err(|e| CliError::from(e.context("--record-on")))?;
            Ok(spec)
        })
        .collect()
}

/// Which target(s) to run.
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// Target under audit: `native` or `llama.cpp@VERSION[+assert]`.
    #[arg(long, default_value = "native")]
    pub target: String,
    /// Inject faults into the target (the native model's, `kvaudit target list` names them; a
    /// llama.cpp target's test hooks, docs/usage.md).
    #[arg(long = "inject", value_delimiter = ',')]
    pub inject: Vec<String>,
    /// Second target for the differential oracle.
    #[arg(long)]
    pub vs: Option<String>,
    /// Inject faults into the second target.
    #[arg(long = "inject-b", value_delimiter = ',')]
    pub inject_b: Vec<String>,
    /// Run the second target (default: the first one again) under another configuration,
    /// e.g. `kv_unified=false` or `flash_attn=on,n_ubatch=1`: the configuration differential.
    #[arg(long = "vs-config")]
    pub vs_config: Option<String>,
}

impl TargetArgs {
    /// The target specs (A, optional B).
    pub fn specs(&self) -> (TargetSpec, Option<TargetSpec>) {
        let a = TargetSpec::new(&self.target, &self.inject);
        let b = match (&self.vs, &self.vs_config) {
            (Some(v), _) => Some(TargetSpec::new(v, &self.inject_b)),
            (None, Some(_)) if self.inject_b.is_empty() => {
                Some(TargetSpec::new(&self.target, &self.inject))
            }
            (None, Some(_)) => Some(TargetSpec::new(&self.target, &self.inject_b)),
            (None, None) => None,
        };
        (a, b)
    }

    /// Checks the combination of flags.
    pub fn check(&self) -> Result<(), CliError> {
        if !self.inject_b.is_empty() && self.vs.is_none() && self.vs_config.is_none() {
            return Err(CliError::usage("--inject-b needs --vs or --vs-config"));
        }
        Ok(())
    }

    /// The oracles of a run with these targets: a configuration differential (`--vs-config`)
    /// is judged by `config-differential`, which knows the documented differences between
    /// configurations, and not by `differential`; two different targets the other way round.
    pub fn registry(&self) -> kvaudit::oracles::Registry {
        kvaudit::oracles::Registry::for_run(self.vs_config.is_some())
    }
}

/// Which domain: a preset or a TOML file, plus overrides.
#[derive(Debug, Args)]
pub struct DomainArgs {
    /// Preset name (seed, wide) or path to a domain TOML file.
    #[arg(long, default_value = "seed")]
    pub domain: String,
    /// Override the sequences, e.g. `0,1,2`.
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    pub seqs: Option<Vec<i32>>,
    /// Override the ranges, e.g. `0:3,2:5,3:,open`.
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    pub ranges: Option<Vec<String>>,
    /// Override the seq_add deltas, e.g. `2,-2`.
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    pub deltas: Option<Vec<i32>>,
    /// Override the seq_div divisors.
    #[arg(long, value_delimiter = ',')]
    pub divisors: Option<Vec<i32>>,
    /// Override the decode-next token counts.
    #[arg(long = "decode-next", value_delimiter = ',')]
    pub decode_next: Option<Vec<u32>>,
    /// The model architecture of the domain's setup (llama, gemma2, mamba, jamba, lfm2, lfm2_swa): which memory
    /// type llama.cpp audits (docs/memory-types.md).
    #[arg(long)]
    pub arch: Option<kvaudit::base::op::Arch>,
    /// The setup's configuration, as fuzz's `--config` takes it: `n_rs_seq=3`,
    /// `kv_unified=false`, `n_ubatch=2`, ... (applied after --arch; the domain is then named
    /// `NAME+CONFIG`, so its report and PREREG predictions are its own).
    #[arg(long)]
    pub config: Option<String>,
}

/// `setup` under `spec` (`key=value,...`): the one parse of `--config`, for `audit`, `domain`
/// and `fuzz`.
pub fn with_config(
    setup: &kvaudit::base::op::Setup,
    spec: &str,
) -> Result<kvaudit::base::op::Setup, CliError> {
    setup
        .with_config(spec)
        .map_err(|e| CliError::usage(format!("--config: {e}")))
}

impl DomainArgs {
    /// Resolves preset or file, then applies the overrides.
    pub fn resolve(&self) -> Result<Domain, CliError> {
        let mut d = match Domain::preset(&self.domain) {
            Some(d) => d,
            None if self.domain.ends_with(".toml")
                || std::path::Path::new(&self.domain).exists() =>
            {
                Domain::from_file(std::path::Path::new(&self.domain)).map_err(CliError::usage)?
            }
            None => {
                return Err(CliError::usage(format!(
                    "--domain '{}': not a preset ({}) nor a file",
                    self.domain,
                    PRESETS.join(", ")
                )))
            }
        };
        let ranges = match &self.ranges {
            Some(rs) => Some(
                rs.iter()
                    .map(|r| parse_range(r))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(CliError::usage)?,
            ),
            None => None,
        };
        DomainOverrides {
            seqs: self.seqs.clone(),
            ranges,
            deltas: self.deltas.clone(),
            divisors: self.divisors.clone(),
            decode_next: self.decode_next.clone(),
            ..DomainOverrides::default()
        }
        .apply(&mut d);
        if let Some(arch) = self.arch {
            d.setup.arch = arch;
        }
        if let Some(c) = &self.config {
            d.setup = with_config(&d.setup, c)?;
            d.name = format!("{}+{}", d.name, c.trim());
        }
        d.validate()
            .map_err(|e| CliError::usage(format!("domain {}: {e}", d.name)))?;
        Ok(d)
    }
}

/// Report format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Table and findings for a terminal.
    Terminal,
    /// The JSON report.
    Json,
    /// Markdown.
    Markdown,
}

/// How progress is shown while running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MessageFormat {
    /// A progress bar on stderr.
    Human,
    /// Every event as a JSON line on stderr.
    Json,
}

/// Where and how the report goes.
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Report format (on stdout, or in --out).
    #[arg(long, value_enum, default_value = "terminal")]
    pub format: Format,
    /// Write the report to this file (atomically) instead of stdout; the terminal still gets
    /// the table. Format from --format, or from the extension (.json, .md).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Progress display.
    #[arg(long = "message-format", value_enum, default_value = "human")]
    pub message_format: MessageFormat,
    /// No progress display.
    #[arg(long, short)]
    pub quiet: bool,
}

impl OutputArgs {
    /// Writes or prints the report.
    pub fn emit(&self, report: &Report) -> Result<(), CliError> {
        emit(report, self.format, self.out.as_deref(), self.quiet)
    }

    /// Checks, before a run's first trial, that `--out` can be written at its end.
    pub fn check_writable(&self) -> Result<(), CliError> {
        writable_out("--out", self.out.as_deref())
    }
}

/// Checks, before a run's first trial, that the file `flag` names (if any) can be written at
/// its end: a usage error naming the flag.
pub fn writable_out(flag: &str, path: Option<&std::path::Path>) -> Result<(), CliError> {
    match path {
        Some(p) => check_writable_file(p).map_err(|e| CliError::usage(format!("{flag} {e}"))),
        None => Ok(()),
    }
}

/// A report that renders for a terminal, as JSON and as Markdown.
pub trait Rendered {
    /// Table and findings for a terminal.
    fn to_terminal(&self) -> String;
    /// The JSON report.
    fn to_json(&self) -> String;
    /// Markdown.
    fn to_markdown(&self) -> String;
}

impl Rendered for Report {
    fn to_terminal(&self) -> String {
        Report::to_terminal(self)
    }
    fn to_json(&self) -> String {
        Report::to_json(self)
    }
    fn to_markdown(&self) -> String {
        Report::to_markdown(self)
    }
}

/// Prints `report` in `format`, or writes it to `out` (format from the extension when `format` is
/// the terminal one) and prints the terminal table unless `quiet`.
pub fn emit(
    report: &dyn Rendered,
    format: Format,
    out: Option<&std::path::Path>,
    quiet: bool,
) -> Result<(), CliError> {
    let format = match (out, format) {
        (Some(p), Format::Terminal) => match p.extension().and_then(|e| e.to_str()) {
            Some("md") => Format::Markdown,
            _ => Format::Json,
        },
        (_, f) => f,
    };
    let text = match format {
        Format::Terminal => report.to_terminal(),
        Format::Json => report.to_json(),
        Format::Markdown => report.to_markdown(),
    };
    match out {
        Some(path) => {
            // A run's report is what it found: if --out cannot be written at the end, it goes
            // aside, and the error says where.
            let written = write_or_aside("report", &[(path, &text)]);
            if !quiet {
                print!("{}", report.to_terminal());
            }
            written?;
            if !quiet {
                println!("report written to {}", path.display());
            }
        }
        None => print!("{text}"),
    }
    Ok(())
}
