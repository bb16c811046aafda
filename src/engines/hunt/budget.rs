//! The hunt's budget policy, all of it in one place: how a budget (seconds or trials) is
//! shared between the entries and the end of the hunt (grouping, classifying, identity by
//! fix, the new groups' files), how one entry's share splits between its exhaustive run and
//! fuzzing, when each part is cut, and how many executions a shrink may spend.
//! `run::run_hunt`, `kvaudit hunt --plan` and the end of a hunt ask it; no other file holds a
//! fraction of a budget.

use std::time::{Duration, Instant};

use crate::base::domain::total_trials;
use crate::engines::shrink::ShrinkConfig;
use crate::records::hunt::{Budget, EntryEstimate, FuzzShare, PlanEntry, Support};

/// The part of a time budget the entries share; the rest is for grouping, classifying and
/// writing the new groups' files (their C programs are compiled and run on the target).
const ENTRY_PART: f64 = 0.8;
/// The share of the exhaustive run in an entry's budget: the rest fuzzes.
const EXHAUSTIVE_SHARE: f64 = 0.5;
/// The part of an entry's share after which its exhaustive run is cut (it is sized for
/// [`EXHAUSTIVE_SHARE`] of it; an estimate that is off leaves the fuzzing the rest all the
/// same).
const EXHAUSTIVE_CUT: f64 = 0.6;
/// The deepest exhaustive run an entry does.
const MAX_DEPTH: u32 = 6;
/// Most target executions one shrink spends.
const SHRINK_EXECUTIONS: u64 = 500;
/// Fewest: a shrink of a few dozen executions still drops most of a fuzz case's ops.
const MIN_SHRINK_EXECUTIONS: u64 = 32;
/// The part of an entry's share one shrink may spend, at the probe's rate.
const SHRINK_PART: f64 = 0.25;

/// A hunt's budget as it is spent: what is left for the entries, and when everything ends.
#[derive(Clone, Debug)]
pub struct BudgetClock {
    budget: Budget,
    /// When this run of the hunt started.
    started: Instant,
    /// Seconds spent before it (a resumed hunt's).
    spent_s: f64,
    /// Trials and fuzz cases left, on a trial budget.
    trials_left: u64,
}

/// When an entry's parts stop (none on a trial budget, which ends by counts).
#[derive(Clone, Copy, Debug)]
pub struct EntryDeadlines {
    /// The entry's end.
    pub end: Option<Instant>,
    /// Its exhaustive run's end.
    pub exhaustive_end: Option<Instant>,
}

impl BudgetClock {
    /// A hunt of `budget` started at `started`, with `spent_s` seconds and `trials_spent`
    /// trials spent before (by the stopped hunt it resumes).
    pub fn start(budget: Budget, started: Instant, spent_s: f64, trials_spent: u64) -> Self {
        let trials_left = match budget {
            Budget::Trials(n) => n.saturating_sub(trials_spent),
            Budget::Seconds(_) => 0,
        };
        BudgetClock {
            budget,
            started,
            spent_s,
            trials_left,
        }
    }

    /// When the entries must stop, on a time budget.
    fn entries_end(&self) -> Option<Instant> {
        match self.budget {
            Budget::Seconds(b) => Some(
                self.started + Duration::from_secs_f64((b * ENTRY_PART - self.spent_s).max(0.0)),
            ),
            Budget::Trials(_) => None,
        }
    }

    /// When the whole hunt must end (the end's work included), on a time budget.
    pub fn hunt_end(&self) -> Option<Instant> {
        match self.budget {
            Budget::Seconds(b) => {
                Some(self.started + Duration::from_secs_f64((b - self.spent_s).max(0.0)))
            }
            Budget::Trials(_) => None,
        }
    }

    /// Whether the entries' part of a time budget is spent (a trial budget's entries share
    /// what is left, however little).
    pub fn entries_over(&self) -> bool {
        self.entries_end().is_some_and(|end| Instant::now() >= end)
    }

    /// Seconds left for the entries, on a time budget.
    pub fn entries_left_s(&self) -> Option<f64> {
        self.entries_end()
            .map(|end| end.saturating_duration_since(Instant::now()).as_secs_f64())
    }

    /// The share of the next entry, with `entries_left` entries to run (it among them):
    /// seconds or trials, as the budget is.
    pub fn share(&self, entries_left: usize) -> f64 {
        let left = entries_left.max(1) as f64;
        match self.entries_left_s() {
            Some(s) => s / left,
            None => self.trials_left as f64 / left,
        }
    }

    /// An entry with `share` starting now: when it and its exhaustive run stop.
    pub fn entry_deadlines(&self, share: f64) -> EntryDeadlines {
        let now = Instant::now();
        let after = |part: f64| match self.budget {
            Budget::Seconds(_) => Some(now + Duration::from_secs_f64(share * part)),
            Budget::Trials(_) => None,
        };
        EntryDeadlines {
            end: after(1.0),
            exhaustive_end: after(EXHAUSTIVE_CUT),
        }
    }

    /// `n` trials and fuzz cases spent.
    pub fn spend_trials(&mut self, n: u64) {
        self.trials_left = self.trials_left.saturating_sub(n);
    }
}

/// The share of each of `entries` in a plan printed before any is run (`--plan`).
pub fn plan_share(budget: Budget, entries: usize) -> f64 {
    let n = entries.max(1) as f64;
    match budget {
        Budget::Seconds(s) => s * ENTRY_PART / n,
        Budget::Trials(t) => t as f64 / n,
    }
}

/// An entry's allocation: the exhaustive depth its share allows, then the fuzzing with the
/// rest. `share` is seconds or trials, as `budget` is.
pub fn allocate(
    e: &PlanEntry,
    support: Support,
    seconds_per_trial: Option<f64>,
    budget: Budget,
    share: f64,
) -> EntryEstimate {
    let ops = e.domain.ops().len() as u64;
    let cost = |d: u32| -> f64 {
        let trials = total_trials(ops, d) as f64;
        match budget {
            Budget::Seconds(_) => trials * seconds_per_trial.unwrap_or(f64::INFINITY),
            Budget::Trials(_) => trials,
        }
    };
    let depth = (1..=MAX_DEPTH)
        .take_while(|&d| cost(d) <= share * EXHAUSTIVE_SHARE)
        .last()
        .unwrap_or(0);
    let exhaustive_trials = if depth == 0 {
        0
    } else {
        total_trials(ops, depth)
    };
    let rest = (share - cost(depth).min(share)).max(0.0);
    let fuzz = match budget {
        Budget::Seconds(_) => FuzzShare::Seconds(rest),
        Budget::Trials(_) => FuzzShare::Cases((rest as u64).max(1)),
    };
    EntryEstimate {
        support,
        ops,
        seconds_per_trial,
        depth,
        exhaustive_trials,
        fuzz,
        share_s: matches!(budget, Budget::Seconds(_)).then_some(share),
    }
}

/// The shrink limits of an entry: at most [`SHRINK_EXECUTIONS`], and on a time budget no
/// more executions than [`SHRINK_PART`] of the entry's share pays for at the probe's rate (an
/// iSWA setup on llama.cpp costs tens of milliseconds per execution).
pub fn shrink_config(est: &EntryEstimate) -> ShrinkConfig {
    let affordable = match (est.share_s, est.seconds_per_trial) {
        (Some(share), Some(per)) if per > 0.0 => (share * SHRINK_PART / per) as u64,
        _ => SHRINK_EXECUTIONS,
    };
    ShrinkConfig {
        max_executions: affordable.clamp(MIN_SHRINK_EXECUTIONS, SHRINK_EXECUTIONS),
        ..ShrinkConfig::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::hunt::plan;
    use crate::targets::registry::TargetSpec;

    #[test]
    fn a_trial_budget_goes_to_the_deepest_exhaustive_run_that_fits_half_of_it() {
        let e = &plan(&TargetSpec::new("native", &[]))[0];
        let n = e.domain.ops().len() as u64;
        let share = 2.0 * total_trials(n, 2) as f64 + 10.0;
        let est = allocate(e, Support::Runs, None, Budget::Trials(1), share);
        assert_eq!(est.depth, 2);
        assert_eq!(
            est.fuzz,
            FuzzShare::Cases((share as u64) - total_trials(n, 2))
        );
    }

    #[test]
    fn a_time_budget_keeps_a_fifth_for_the_end_and_shares_the_rest() {
        let started = Instant::now();
        let clock = BudgetClock::start(Budget::Seconds(100.0), started, 20.0, 0);
        // 80 s for the entries, 20 of them spent before: 60 s for 3 entries.
        let share = clock.share(3);
        assert!((19.0..=20.0).contains(&share), "{share}");
        assert!(!clock.entries_over());
        let end = clock.hunt_end().unwrap() - started;
        assert!((end.as_secs_f64() - 80.0).abs() < 1e-6);
        assert!((plan_share(Budget::Seconds(100.0), 4) - 20.0).abs() < 1e-9);
        let spent = BudgetClock::start(Budget::Seconds(100.0), started, 80.0, 0);
        assert!(spent.entries_over());
        let mut trials = BudgetClock::start(Budget::Trials(100), started, 0.0, 40);
        assert_eq!(trials.share(3), 20.0);
        trials.spend_trials(60);
        assert_eq!(trials.share(1), 0.0);
        assert!(!trials.entries_over());
        assert!(trials.entry_deadlines(10.0).end.is_none());
    }
}
