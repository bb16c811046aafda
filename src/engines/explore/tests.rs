//! The explorer's unit tests: not-judged oracles, shard coverage, resumed plans, the odometer, runs of judged trials.

use super::*;

#[test]
fn an_oracle_whose_observation_a_target_cannot_give_is_not_judged_not_passed() {
    use crate::base::cache::Observe;
    use crate::running::runner::{LocalRunner, TrialRunner};
    use crate::targets::native::NativeTarget;
    let basic = || -> Result<Box<dyn TrialRunner>, HarnessError> {
        Ok(Box::new(
            LocalRunner::new(Box::new(NativeTarget::new(Default::default())))
                .with_observe(Observe::BASIC),
        ))
    };
    let cfg = ExhaustiveConfig {
        domain: crate::base::domain::Domain::preset("seed").unwrap(),
        depth: 1,
        shard: Shard::WHOLE,
        threads: 1,
        batch: 64,
        oracles: crate::oracles::Registry::builtin(),
    };
    let report = run_exhaustive(&cfg, &basic, None, &mut |_| {}).unwrap();
    let stats = |name: &str| &report.oracles[&crate::oracles::OracleId::known(name).unwrap()];
    assert_eq!(stats("I1").checked, 49);
    for name in ["conservation", "round-trip", "contract"] {
        assert_eq!(stats(name).checked, 0, "{name}");
    }
    assert!(report.oracle_table().contains("0 (not judged)"));
}

#[test]
fn shards_cover_every_trial_once() {
    let n = 5u64;
    for depth in 1..=3 {
        let mut seen = vec![0u32; n.pow(depth) as usize];
        for k in 0..3 {
            for c in chunks(5, depth, Shard::new(k, 3).unwrap()) {
                for i in 0..c.len(n) {
                    seen[(c.base_in_depth(n) + i) as usize] += 1;
                }
            }
        }
        assert!(seen.iter().all(|&s| s == 1));
    }
    assert_eq!(total_trials(49, 3), 49 + 49 * 49 + 49 * 49 * 49);
}

#[test]
fn a_resumed_plan_counts_the_unfinished_chunks_and_reruns_what_a_later_depth_reads() {
    let counted = |w: &[Work]| {
        w.iter()
            .filter(|w| w.counted)
            .map(|w| w.chunk.first)
            .collect::<Vec<_>>()
    };
    let rerun = |w: &[Work]| {
        w.iter()
            .filter(|w| !w.counted)
            .map(|w| w.chunk.first)
            .collect::<Vec<_>>()
    };
    let whole = Shard::WHOLE;
    // Stopped in depth 2 of 3: depth 1 reruns, depth 2's finished chunks rerun, the rest count.
    let mid = Incomplete {
        depth: 2,
        chunks_done: vec![0, 2],
    };
    assert_eq!(rerun(&plan(4, 1, 3, whole, Some(&mid))), vec![0, 1, 2, 3]);
    assert_eq!(counted(&plan(4, 2, 3, whole, Some(&mid))), vec![1, 3]);
    assert_eq!(rerun(&plan(4, 2, 3, whole, Some(&mid))), vec![0, 2]);
    assert_eq!(counted(&plan(4, 3, 3, whole, Some(&mid))), vec![0, 1, 2, 3]);
    // Stopped in the last depth: only the unfinished chunks' prefixes rerun.
    let last = Incomplete {
        depth: 3,
        chunks_done: vec![0, 2],
    };
    assert_eq!(rerun(&plan(4, 1, 3, whole, Some(&last))), vec![1, 3]);
    assert_eq!(rerun(&plan(4, 2, 3, whole, Some(&last))), vec![1, 3]);
    assert!(rerun(&plan(4, 3, 3, whole, Some(&last))).is_empty());
    assert_eq!(counted(&plan(4, 3, 3, whole, Some(&last))), vec![1, 3]);
    // A shard plans its own chunks only.
    let shard = Shard::new(1, 2).unwrap();
    assert_eq!(counted(&plan(4, 2, 3, shard, None)), vec![1, 3]);
}

#[test]
fn the_enumeration_counts_lexicographically() {
    let mut d = Vec::new();
    let seen: Vec<Vec<usize>> = (0..9)
        .map(|number| {
            enumerated_indices(3, 2, number, &mut d);
            d.clone()
        })
        .collect();
    assert_eq!(seen.len(), 9);
    assert_eq!(seen[1], vec![0, 1]);
    assert_eq!(seen[3], vec![1, 0]);
    assert_eq!(seen[8], vec![2, 2]);
}

/// A trial judged where it was observed (a worker's `Reply::Judged`: the verdicts, no step) is
/// counted as the same trial judged here from its step: every depth-2 trial of the seed domain
/// on a faulty native model (`refcount`: I1 and others fail, at the first step or only at the
/// second), each with its prior bits, gives the same tally either way, and a step violated
/// afresh (beyond its prior bits) is the one the worker sends whole.
#[test]
fn a_trial_judged_where_it_was_observed_counts_as_judged_here() {
    use crate::engines::explore::judging::RunOracles;
    use crate::running::judge::{step_verdicts, VerdictMemo};
    use crate::running::runner::{LocalRunner, TrialEnd, TrialRunner};
    use crate::targets::native::NativeTarget;
    let faults = native_kv::Faults {
        refcount: true,
        ..Default::default()
    };
    let d = crate::base::domain::Domain::preset("seed").unwrap();
    let ops = d.ops();
    let judges = RunOracles::new(&crate::oracles::Registry::builtin(), false);
    let tracked: Vec<_> = judges
        .tracked_ids()
        .into_iter()
        .map(|id| crate::oracles::Registry::builtin().get(id).unwrap())
        .collect();
    let mut runner = LocalRunner::new(Box::new(NativeTarget::new(faults)));
    let info = runner.info();
    let (mut here, mut there) = (Tally::default(), Tally::default());
    let (mut sent_whole, mut judged_there) = (0, 0);
    for (i, a) in ops.iter().enumerate() {
        let first = Trace {
            setup: d.setup.clone(),
            ops: vec![a.clone()],
        };
        let first_run = runner.run_last(&first).unwrap();
        let prior = judges
            .judge(
                &mut VerdictMemo::default(),
                &mut Tally::default(),
                &first,
                i as u64,
                (&info, &first_run),
                None,
                0,
            )
            .unwrap_or(0);
        for (j, b) in ops.iter().enumerate() {
            let trace = Trace {
                setup: d.setup.clone(),
                ops: vec![a.clone(), b.clone()],
            };
            let index = (i * ops.len() + j) as u64;
            let run = runner.run_last(&trace).unwrap();
            judges.judge(
                &mut VerdictMemo::default(),
                &mut here,
                &trace,
                index,
                (&info, &run),
                None,
                prior,
            );
            // What the worker does with it.
            let judged = match (&run.end, run.steps.last()) {
                (TrialEnd::Completed, Some(last)) => {
                    let v = step_verdicts(&tracked, b, last, trace.setup.arch);
                    (v.violated & !prior == 0).then(|| TrialRun::judged(v))
                }
                _ => None,
            };
            let sent = match judged {
                Some(j) => {
                    judged_there += 1;
                    j
                }
                None => {
                    sent_whole += 1;
                    run
                }
            };
            judges.judge(
                &mut VerdictMemo::default(),
                &mut there,
                &trace,
                index,
                (&info, &sent),
                None,
                prior,
            );
        }
    }
    assert!(
        judged_there > 0 && sent_whole > 0,
        "{judged_there} judged there, {sent_whole} sent whole"
    );
    assert_eq!(here.trials, there.trials);
    assert_eq!(here.unsupported, there.unsupported);
    assert_eq!(
        format!("{:?}", here.oracles),
        format!("{:?}", there.oracles)
    );
    assert_eq!(
        here.findings.keys().collect::<Vec<_>>(),
        there.findings.keys().collect::<Vec<_>>()
    );
}

/// A run of clean trials judged where they were observed counts, for each trial, the trial, the
/// crash oracles unviolated, each oracle that judged it with its verdict, and the others as
/// asked but not judged: n trials recorded at once count n of each.
#[test]
fn a_run_of_judged_trials_counts_each_trial() {
    use crate::oracles::OracleId;
    use crate::running::runner::StepVerdicts;
    let registry = Registry::builtin().only(|o| ["I1", "I2", "crash"].contains(&o.id().name()));
    let judges = RunOracles::new(&registry, false);
    let tracked = judges.tracked_ids();
    let at = |name: &str| tracked.iter().position(|id| id.name() == name).unwrap();
    // I1 judged and held, I2 judged and violated (not afresh: it is counted only).
    let v = StepVerdicts {
        judged: 1 << at("I1") | 1 << at("I2"),
        violated: 1 << at("I2"),
    };
    let mut tally = Tally::default();
    judges.record_judged(&mut tally, 3, v, 5);
    judges.record_judged(
        &mut tally,
        3,
        StepVerdicts {
            judged: 1 << at("I1"),
            violated: 0,
        },
        2,
    );
    assert_eq!(tally.trials, 7);
    let stats = |name: &str| tally.oracles[&OracleId::known(name).unwrap()].clone();
    assert_eq!((stats("I1").checked, stats("I1").violations), (7, 0));
    assert_eq!((stats("I2").checked, stats("I2").violations), (5, 5));
    assert_eq!(stats("I2").first_depth, Some(3));
    assert_eq!((stats("crash").checked, stats("crash").violations), (7, 0));
}
