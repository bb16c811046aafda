//! The human and JSON-lines displays of the event stream.

use indicatif::{ProgressBar, ProgressStyle};

use super::args::{MessageFormat, OutputArgs};
use kvaudit::records::report::Event;

/// Consumes events: a progress bar on stderr, JSON lines on stderr, or nothing.
pub struct Display {
    format: MessageFormat,
    quiet: bool,
    bar: Option<ProgressBar>,
}

impl Display {
    /// A display for these output options.
    pub fn new(out: &OutputArgs) -> Self {
        Display {
            format: out.message_format,
            quiet: out.quiet,
            bar: None,
        }
    }

    /// Shows one event.
    pub fn show(&mut self, e: &Event) {
        if self.quiet {
            return;
        }
        if self.format == MessageFormat::Json {
            if !matches!(e, Event::Done(_)) {
                eprintln!("{}", serde_json::to_string(e).expect("events serialize"));
            }
            return;
        }
        match e {
            Event::Start {
                target,
                vs,
                domain,
                depth,
                ops,
                trials,
                ..
            } => {
                let vs = vs
                    .as_ref()
                    .map(|v| format!(" vs {}", v.label()))
                    .unwrap_or_default();
                eprintln!(
                    "kvaudit: {}{vs}, domain {domain} ({ops} ops), depth {depth}: {trials} trials",
                    target.label()
                );
                let bar = ProgressBar::new(*trials);
                bar.set_style(
                    ProgressStyle::with_template(
                        "{elapsed_precise} [{bar:30}] {pos}/{len} trials ({per_sec}, eta {eta})",
                    )
                    .expect("valid template")
                    .progress_chars("=> "),
                );
                self.bar = Some(bar);
            }
            Event::Progress { done, .. } => {
                if let Some(b) = &self.bar {
                    b.set_position(*done);
                }
            }
            Event::FuzzStart {
                target,
                vs,
                seed,
                cases,
                min_len,
                max_len,
                time_s,
            } => {
                let vs = vs
                    .as_ref()
                    .map(|v| format!(" vs {}", v.label()))
                    .unwrap_or_default();
                let limit = match (cases, time_s) {
                    (Some(n), Some(t)) => format!("{n} cases or {t} s"),
                    (Some(n), None) => format!("{n} cases"),
                    (None, Some(t)) => format!("{t} s"),
                    (None, None) => "no limit".into(),
                };
                eprintln!(
                    "kvaudit fuzz: {}{vs}, seed {seed}, traces of {min_len}..={max_len} ops, {limit}",
                    target.label()
                );
                let bar = match cases {
                    Some(n) => ProgressBar::new(*n).with_style(
                        ProgressStyle::with_template(
                            "{elapsed_precise} [{bar:30}] {pos}/{len} cases ({per_sec}, eta {eta})",
                        )
                        .expect("valid template")
                        .progress_chars("=> "),
                    ),
                    None => ProgressBar::new_spinner().with_style(
                        ProgressStyle::with_template(
                            "{elapsed_precise} {spinner} {pos} cases ({per_sec})",
                        )
                        .expect("valid template"),
                    ),
                };
                self.bar = Some(bar);
            }
            Event::Shrunk {
                oracle,
                kind,
                case,
                length,
                step,
                shrunk_len,
                executions,
                elapsed_s,
                new,
            } => {
                let line = format!(
                    "case {case}: {oracle} {kind} at step {step} of {length}; shrunk to {shrunk_len} ops in {executions} executions, {elapsed_s:.3} s{}",
                    if *new { "" } else { " (a finding already made)" }
                );
                // A hidden bar (stderr is not a terminal) drops println: logs still get the line.
                match &self.bar {
                    Some(b) if !b.is_hidden() => b.println(line),
                    _ => eprintln!("{line}"),
                }
            }
            Event::Finding(_) => {}
            Event::Done(_) => {
                if let Some(b) = self.bar.take() {
                    b.finish_and_clear();
                }
            }
        }
    }
}
