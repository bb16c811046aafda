//! The build's progress display: an indicatif bar on a terminal, a plain line every 15 s
//! otherwise (CI logs), fed by what the `cc` crate reports per compile unit.

use std::io::IsTerminal as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::pins::Pin;

/// The progress display: an indicatif bar on a terminal, a plain line every 15 s otherwise.
pub(super) struct Progress {
    bar: Option<indicatif::ProgressBar>,
    plain: bool,
    label: String,
    total: usize,
    last_plain: Mutex<Option<Instant>>,
}

impl Progress {
    pub(super) fn new(enabled: bool, pin: &Pin, total: usize) -> Progress {
        let tty = std::io::stderr().is_terminal();
        let bar = (enabled && tty).then(|| {
            let bar = indicatif::ProgressBar::new(total as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar.set_prefix(format!("building {pin}"));
            bar
        });
        if enabled && !tty {
            eprintln!("building {pin}: {total} sources");
        }
        Progress {
            bar,
            plain: enabled && !tty,
            label: pin.label(),
            total,
            last_plain: Mutex::new(None),
        }
    }

    /// `units`: each unit's group and how many sources it compiles in this build.
    pub(super) fn update(&self, units: &[(&str, usize)], logs: &[Arc<UnitLog>], elapsed: Duration) {
        let started: Vec<usize> = logs
            .iter()
            .map(|l| l.started.load(Ordering::Relaxed))
            .collect();
        let done: usize = started.iter().sum();
        // Per group (C and C++ together), the groups with work left: "ggml-cpu 12/21, llama 3/177".
        let mut groups: Vec<(&str, usize, usize)> = Vec::new();
        for (&(group, n), s) in units.iter().zip(&started) {
            match groups.iter_mut().find(|g| g.0 == group) {
                Some(g) => {
                    g.1 += s;
                    g.2 += n;
                }
                None => groups.push((group, *s, n)),
            }
        }
        let open: Vec<String> = groups
            .iter()
            .filter(|(_, s, n)| s < n)
            .map(|(g, s, n)| format!("{g} {s}/{n}"))
            .collect();
        let current = format!("compiling {}", open.join(", "));
        if let Some(bar) = &self.bar {
            bar.set_position(done as u64);
            bar.set_message(current);
        } else if self.plain {
            let Ok(mut last) = self.last_plain.lock() else {
                return;
            };
            // (`Option::is_none_or` needs Rust 1.82; the crate's MSRV is 1.80.)
            #[allow(clippy::unnecessary_map_or)]
            let due = last.map_or(true, |t| t.elapsed() >= Duration::from_secs(15));
            if due {
                *last = Some(Instant::now());
                eprintln!(
                    "building {}: {done}/{} started, {current} ({:.0} s)",
                    self.label,
                    self.total,
                    elapsed.as_secs_f64()
                );
            }
        }
    }

    pub(super) fn finish(&self, elapsed: Duration) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if self.bar.is_some() || self.plain {
            eprintln!(
                "compiled {} in {:.0} s; linking",
                self.label,
                elapsed.as_secs_f64()
            );
        }
    }
}

/// Collects what `cc` reports while compiling: compile starts (for progress) and the stderr of
/// failing commands.
#[derive(Default)]
pub(super) struct UnitLog {
    pub(super) started: AtomicUsize,
    pub(super) stderr: Mutex<Vec<String>>,
}

impl cc::BuildMessageLogger for UnitLog {
    fn log(
        &self,
        kind: cc::BuildMessageKind,
        msg: cc::BuildMessage<'_>,
        _extra: &dyn std::any::Any,
    ) {
        match kind {
            cc::BuildMessageKind::CompileCommand => {
                self.started.fetch_add(1, Ordering::Relaxed);
            }
            cc::BuildMessageKind::StderrForwarding | cc::BuildMessageKind::CommandFailed { .. } => {
                if let Ok(mut lines) = self.stderr.lock() {
                    if lines.len() < 200 {
                        lines.push(msg.to_string());
                    }
                }
            }
            _ => {}
        }
    }
}
