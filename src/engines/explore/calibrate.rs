//! How long an exhaustive audit will take, from a short calibration: a sample of its
//! longest trials, run on its own runners before the audit starts.
//!
//! The last depth holds nearly all trials (a fraction `(n-1)/n` of them), so its trials' cost
//! is the run's: the estimate is the time spent so far (the runners' start, a llama.cpp
//! worker's warm-up, the calibration) plus the run's trials at the sample's rate. The sample is
//! batches of consecutive trials, as the run sends them, from chunks and places spread over the
//! last depth; a first batch per thread warms the runners up and is not timed.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};

use super::{chunks, run_work, Explorer, Work};
use crate::base::cache::HarnessError;
use crate::records::incomplete::Incomplete;

/// Runs with fewer trials than this are not calibrated: they take about as long as a
/// calibration would.
pub const CALIBRATE_FROM: u64 = 20_000;
/// Wall time the timed part of a calibration aims at.
const CALIBRATION_TIME: Duration = Duration::from_millis(500);
/// Most of a run a calibration samples: one trial in this many.
const SAMPLE_SHARE: u64 = 50;

/// A run's size and how long it will take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    /// Trials the run will do.
    pub trials: u64,
    /// Seconds from the runners' start to the end of the run, when calibrated.
    pub seconds: Option<f64>,
    /// Trials the calibration timed.
    pub calibrated_on: u64,
}

impl Explorer<'_> {
    /// Times a sample of the run's longest trials (resuming after `resume`) and estimates the
    /// whole run's time. The sample's results are dropped: the run does its trials again. Runs
    /// below [`CALIBRATE_FROM`] trials are not timed. Stops early when `stop` is set.
    pub fn estimate(
        &mut self,
        resume: Option<&Incomplete>,
        stop: &AtomicBool,
    ) -> Result<Estimate, HarnessError> {
        let trials = self.trials_to_run(resume);
        let mut estimate = Estimate {
            trials,
            seconds: None,
            calibrated_on: 0,
        };
        let cfg = self.shared.cfg;
        let n = self.shared.ops.len() as u64;
        let mine = chunks(self.shared.ops.len(), cfg.depth, cfg.shard);
        if trials < CALIBRATE_FROM || mine.is_empty() {
            return Ok(estimate);
        }
        let chunk_len = mine[0].len(n);
        let batch = (cfg.batch as u64).min(chunk_len);
        let threads = self.runners.len() as u64;
        // Pieces at places spread over the last depth (the golden ratio's multiples, mod 1).
        let sample = |from: u64, count: u64| -> Vec<Work> {
            (from..from + count)
                .map(|i| {
                    let spread = |x: f64| (i as f64 * x).fract();
                    let chunk = mine[(spread(0.618_034) * mine.len() as f64) as usize];
                    let at = (spread(0.754_878) * (chunk_len - batch + 1) as f64) as u64;
                    Work {
                        chunk,
                        from: at.min(chunk_len - batch),
                        len: batch,
                        counted: false,
                    }
                })
                .collect()
        };
        let done = AtomicU64::new(0);
        // A calibration is never held (`RunControl::hold_at_depth` is for the run itself).
        let never_held = std::sync::atomic::AtomicBool::new(false);
        let (shared, runners) = (&self.shared, &mut self.runners);
        let warm_up = Instant::now();
        run_work(
            shared,
            runners,
            &sample(0, threads),
            (None, None),
            (stop, &never_held),
            &done,
            &mut |_| {},
        )?;
        let per_piece = warm_up.elapsed().as_secs_f64().max(1e-6);
        let most = (trials / SAMPLE_SHARE / batch / threads).max(1);
        let per_thread = ((CALIBRATION_TIME.as_secs_f64() / per_piece) as u64).clamp(1, most);
        let timed = sample(threads, per_thread * threads);
        let before = done.load(std::sync::atomic::Ordering::Relaxed);
        let clock = Instant::now();
        run_work(
            shared,
            runners,
            &timed,
            (None, None),
            (stop, &never_held),
            &done,
            &mut |_| {},
        )?;
        let took = clock.elapsed().as_secs_f64().max(1e-9);
        let timed_trials = done.load(std::sync::atomic::Ordering::Relaxed) - before;
        if timed_trials > 0 {
            let rate = timed_trials as f64 / took;
            estimate.seconds = Some(self.started.elapsed().as_secs_f64() + trials as f64 / rate);
            estimate.calibrated_on = timed_trials;
        }
        Ok(estimate)
    }
}
