//! A worker child's last words: what its signal handler reported (the trial, the step and the
//! observation it was in), how it ended (signal or exit status) and the line of llama.cpp's
//! stderr that says why (an assertion, an abort, a sanitizer's report), read into the
//! [`TrialEnd::Crashed`] the parent reports ([`super::parent`]).

use crate::base::cache::Observation;
use crate::oracles::crash::{crash_kind, sanitizer_report, HEAP_CORRUPTION};
use crate::running::runner::TrialEnd;
use crate::targets::llama::sys;

/// The observation a crash is blamed on: what the worker was observing, unless glibc's
/// allocator aborted. It finds a corrupted heap at a later malloc or free than the write that
/// corrupted it, so such an abort while observing is the op's (a decode writing out of bounds:
/// corpora/crash_decode_next_pos_seq_id_out_of_range.json), as before observation crashes had
/// a class.
pub(super) fn blamed_observation(
    observing: Option<Observation>,
    end: &TrialEnd,
) -> Option<Observation> {
    observing.filter(|_| {
        !matches!(end, TrialEnd::Crashed { message, .. } if crash_kind(message) == HEAP_CORRUPTION)
    })
}

/// What the worker's signal handler reported last: the trial within the request, the step
/// counter and what was being observed.
#[derive(Debug, PartialEq)]
pub(super) struct Marker {
    pub(super) trial: usize,
    pub(super) step: usize,
    pub(super) observing: Option<Observation>,
}

impl Marker {
    /// The 1-based step of the op the crash belongs to: the cells before an op are observed
    /// before the op advances the counter.
    pub(super) fn op_step(&self) -> usize {
        match self.observing {
            Some(Observation::Before) => self.step + 1,
            _ => self.step,
        }
    }
}

pub(super) fn crash_marker(stderr: &str) -> Option<Marker> {
    let line = stderr
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(sys::FATAL_SIGNAL_REPORT))?;
    let nums: Vec<usize> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|s| s.parse().ok())
        .collect();
    let (trial, step, observing) = match nums[..] {
        [_sig, trial, step] => (trial, step, None),
        [_sig, trial, step, code] => (trial, step, Observation::from_code(code)),
        _ => return None,
    };
    Some(Marker {
        trial,
        step,
        observing,
    })
}

/// Reads how the worker died: the step its signal handler reported, the exit status and the
/// last lines llama.cpp printed.
pub(super) fn crash_end(
    stderr: &str,
    status: Option<std::process::ExitStatus>,
    marker_step: Option<usize>,
    trace_len: usize,
) -> TrialEnd {
    use std::os::unix::process::ExitStatusExt;
    let step = marker_step.unwrap_or(trace_len).clamp(1, trace_len.max(1));
    let signal = status.and_then(|s| s.signal());
    let what = match signal {
        Some(s) => crate::isolation::signal_name(s).to_string(),
        None => match status.and_then(|s| s.code()) {
            Some(c) => format!("exit status {c}"),
            None => "worker died".to_string(),
        },
    };
    let detail = crash_detail(stderr);
    let message = if detail.is_empty() {
        what
    } else {
        format!("{what}: {detail}")
    };
    TrialEnd::Crashed { step, message }
}

/// The assertion line llama.cpp printed, with machine-specific directories removed so the same
/// crash reads the same everywhere; on a sanitizer build, the sanitizer's report as its class
/// and site.
pub fn crash_detail(stderr: &str) -> String {
    if let Some(report) = sanitizer_report(stderr) {
        return report.kind();
    }
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(sys::FATAL_SIGNAL_REPORT.trim_end()))
        .collect();
    let keyed = lines.iter().rev().find(|l| {
        l.contains("GGML_ASSERT")
            || l.contains("Assertion")
            || l.contains("GGML_ABORT")
            || l.contains("terminate called")
    });
    // Without a recognised line, the last thing printed is the best clue there is.
    let line = keyed.or(lines.last()).copied().unwrap_or("");
    strip_dirs(line)
}

fn strip_dirs(s: &str) -> String {
    s.split(' ')
        .map(|w| match w.rfind('/') {
            Some(i) if w.contains(".c") || w.contains(".h") => &w[i + 1..],
            _ => w,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_text_is_read_back() {
        let stderr = "/root/.cargo/registry/src/x/llama-cpp-sys-2-0.1.156/llama.cpp/src/llama-kv-cells.h:318: void llama_kv_cells::seq_add(uint32_t, llama_seq_id): Assertion `!seq[i].test(seq_id)' failed.\n\nkvaudit-worker: signal 6 trial 12 step 2\n";
        assert_eq!(
            crash_marker(stderr),
            Some(Marker {
                trial: 12,
                step: 2,
                observing: None
            })
        );
        let observing = "kvaudit-worker: signal 11 trial 3 step 1 observing 3\n";
        assert_eq!(
            crash_marker(observing).map(|m| (m.op_step(), m.observing)),
            Some((1, Some(Observation::Whole)))
        );
        let before = "kvaudit-worker: signal 11 trial 0 step 0 observing 2\n";
        assert_eq!(
            crash_marker(before).map(|m| (m.op_step(), m.observing)),
            Some((1, Some(Observation::Before)))
        );
        match crash_end(stderr, None, Some(2), 3) {
            TrialEnd::Crashed { step, message } => {
                assert_eq!(step, 2);
                assert!(message.contains("llama-kv-cells.h:318:"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
}
