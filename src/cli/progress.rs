//! The human and JSON-lines displays of the event stream.

use indicatif::{ProgressBar, ProgressStyle};

use super::args::{MessageFormat, OutputArgs};
use crate::report::Event;

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
            Event::Finding(_) => {}
            Event::Done(_) => {
                if let Some(b) = self.bar.take() {
                    b.finish_and_clear();
                }
            }
        }
    }
}
