//! The explorer's unit tests: not-judged oracles, shard coverage, resumed plans, the odometer.

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
fn odometer_counts_lexicographically() {
    let mut d = vec![0, 0];
    let mut seen = vec![d.clone()];
    while odometer(&mut d, 3) {
        seen.push(d.clone());
    }
    assert_eq!(seen.len(), 9);
    assert_eq!(seen[1], vec![0, 1]);
    assert_eq!(seen[3], vec![1, 0]);
}
