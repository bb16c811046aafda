//! The human and JSON-lines displays of the event stream.

use indicatif::{ProgressBar, ProgressStyle};

use super::args::{MessageFormat, OutputArgs};
use kvaudit::records::report::Event;

/// Consumes events: a progress bar on stderr, JSON lines on stderr, or nothing.
pub struct Display {
    format: MessageFormat,
    quiet: bool,
    bar: Option<ProgressBar>,
    /// When the last progress line went to a stderr that is not a terminal (a batch job's log,
    /// where no bar shows).
    last_line: Option<std::time::Instant>,
}

/// Least time between two progress lines in a log.
const LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

impl Display {
    /// One line above the bar, or on stderr: a hidden bar (stderr is not a terminal) drops
    /// println, and logs still get the line.
    fn say(&self, line: &str) {
        match &self.bar {
            Some(b) if !b.is_hidden() => b.println(line),
            _ => eprintln!("{line}"),
        }
    }

    /// A display for these output options.
    pub fn new(out: &OutputArgs) -> Self {
        Display {
            format: out.message_format,
            quiet: out.quiet,
            bar: None,
            last_line: None,
        }
    }

    /// Shows one event.
    pub fn show(&mut self, e: &Event) {
        if self.quiet {
            return;
        }
        if self.format == MessageFormat::Json {
            if !matches!(e, Event::Done(_) | Event::Checkpoint(_)) {
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
                self.last_line = Some(std::time::Instant::now());
            }
            Event::Progress {
                done,
                total,
                elapsed_s,
            } => {
                if let Some(b) = &self.bar {
                    b.set_position(*done);
                    if b.is_hidden() && self.last_line.map_or(true, |t| t.elapsed() >= LOG_EVERY) {
                        self.last_line = Some(std::time::Instant::now());
                        eprintln!("kvaudit: {}", progress_line(*done, *total, *elapsed_s));
                    }
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
                self.say(&line);
            }
            Event::NotReproduced {
                oracle,
                kind,
                case,
                step,
            } => {
                let line = format!(
                    "case {case}: {oracle} {kind} at step {step} did not fail again when replayed: not shrunk (kept in the report's not_reproduced)"
                );
                self.say(&line);
            }
            Event::Finding(_) | Event::Checkpoint(_) => {}
            Event::Done(_) => {
                if let Some(b) = self.bar.take() {
                    b.finish_and_clear();
                }
            }
        }
    }
}

/// "1,234/5,678 trials (21.7%), 590,000 trials/s, eta 8 s": a log's progress line.
/// A total of 0 is an unknown one (a fuzz run limited by time): "1,234 trials, 590 trials/s".
pub fn progress_line(done: u64, total: u64, elapsed_s: f64) -> String {
    let rate = done as f64 / elapsed_s.max(1e-9);
    if total == 0 {
        return format!(
            "{} trials, {} trials/s",
            thousands(done),
            thousands(rate as u64)
        );
    }
    let eta = total.saturating_sub(done) as f64 / rate.max(1e-9);
    format!(
        "{}/{} trials ({:.1}%), {} trials/s, eta {}",
        thousands(done),
        thousands(total),
        100.0 * done as f64 / total.max(1) as f64,
        thousands(rate as u64),
        duration(eta)
    )
}

/// `n` with a comma every three digits.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Seconds in the unit a person reads them in: "11 s", "4.2 min", "3.1 h", "12 days", "3,000
/// years".
pub fn duration(s: f64) -> String {
    const DAY: f64 = 86_400.0;
    match s {
        s if s < 100.0 => format!("{} s", (s.ceil() as u64).max(1)),
        s if s < 6_000.0 => format!("{:.1} min", s / 60.0),
        s if s < 2.0 * DAY => format!("{:.1} h", s / 3_600.0),
        s if s < 730.0 * DAY => format!("{:.0} days", s / DAY),
        s => format!("{} years", thousands((s / (365.25 * DAY)) as u64)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_as_people_write_them() {
        assert_eq!(thousands(5_884_900), "5,884,900");
        assert_eq!(thousands(999), "999");
        assert_eq!(duration(10.2), "11 s");
        assert_eq!(duration(252.0), "4.2 min");
        assert_eq!(duration(3.0 * 86_400.0), "3 days");
        assert!(duration(1e12).ends_with(" years"));
        assert_eq!(
            progress_line(50, 200, 1.0),
            "50/200 trials (25.0%), 50 trials/s, eta 3 s"
        );
        // A fuzz run limited by time has no total: no share of it, no eta.
        assert_eq!(progress_line(8_112, 0, 2.0), "8,112 trials, 4,056 trials/s");
    }
}
