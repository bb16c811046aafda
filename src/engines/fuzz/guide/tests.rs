//! Tests of the guided generator (`super`): its queue, energy and mutations, deterministic per seed.

use super::*;
use crate::base::op::Decode;
use crate::engines::fuzz::generate;

fn in_domain(g: &GenConfig, t: &Trace) {
    assert!(
        !t.ops.is_empty() && t.ops.len() <= g.max_len,
        "{}",
        t.ops.len()
    );
    assert_eq!(t.setup, g.setup);
    for op in &t.ops {
        op.for_each_seq(|s| assert!((0..g.n_seqs()).contains(&s), "{op}"));
        match op {
            Op::SeqDiv { d, .. } => assert!((2..=g.max_divisor).contains(d)),
            Op::SeqAdd { delta, .. } => assert!(*delta != 0 && delta.abs() <= g.max_delta),
            Op::SeqCp { src, dst, .. } => assert_ne!(src, dst),
            Op::Decode(d) => {
                assert!((1..=g.max_tokens).contains(&d.n));
                let distinct: BTreeSet<_> = d.seqs.iter().collect();
                assert_eq!(distinct.len(), d.seqs.len(), "{op}");
            }
            _ => {}
        }
    }
}

fn trace(ops: usize) -> Trace {
    Trace {
        setup: GenConfig::default().setup,
        ops: vec![Op::Decode(Decode::next(0, 1)); ops],
    }
}

#[test]
fn every_mutation_stays_in_the_generator_domain() {
    let g = GenConfig::with_max_len(12);
    let queue: Vec<Trace> = (0..5).map(|c| generate(&g, 2, c)).collect();
    let m = Mutator::new(&g);
    for case in 0..200 {
        let mut runner = guide_runner(9, case);
        for kind in MUTATIONS {
            let mut ops = queue[case as usize % 5].ops.clone();
            m.apply(kind, &mut ops, &queue, &mut runner);
            ops.truncate(g.max_len);
            if !ops.is_empty() {
                in_domain(
                    &g,
                    &Trace {
                        setup: g.setup.clone(),
                        ops,
                    },
                );
            }
        }
        in_domain(&g, &m.child(&queue, case as usize % 5, &mut runner));
    }
}

#[test]
fn each_mutation_does_what_it_says() {
    let g = GenConfig::with_max_len(64);
    let queue = vec![generate(&g, 3, 0), generate(&g, 3, 1)];
    let m = Mutator::new(&g);
    let base = queue[0].ops.clone();
    let mut runner = guide_runner(1, 0);
    let mut ops = base.clone();
    m.apply(Mutation::Drop, &mut ops, &queue, &mut runner);
    assert!(ops.len() < base.len() && ops.len() + 4 >= base.len());
    let mut ops = base.clone();
    m.apply(Mutation::Truncate, &mut ops, &queue, &mut runner);
    assert!(!ops.is_empty() && ops.len() < base.len());
    assert_eq!(ops[..], base[..ops.len()]);
    let mut ops = base.clone();
    m.apply(Mutation::Insert, &mut ops, &queue, &mut runner);
    assert!(ops.len() > base.len());
    let mut ops = base.clone();
    m.apply(Mutation::Repeat, &mut ops, &queue, &mut runner);
    assert_eq!(ops.len(), base.len() + 1);
    // The one op more is a copy of an op of the original.
    let extra = ops
        .iter()
        .find(|o| ops.iter().filter(|p| p == o).count() > base.iter().filter(|p| p == o).count());
    assert!(extra.is_some_and(|o| base.contains(o)));
    for kind in [Mutation::Change, Mutation::Retype, Mutation::Boundary] {
        let mut ops = base.clone();
        m.apply(kind, &mut ops, &queue, &mut runner);
        assert_eq!(ops.len(), base.len());
        assert!(ops.iter().zip(&base).filter(|(a, b)| a != b).count() <= 1);
    }
}

#[test]
fn a_retyped_op_names_the_old_one_s_sequence() {
    let g = GenConfig::with_max_len(8);
    let m = Mutator::new(&g);
    let base = vec![Op::SeqKeep { seq: 2 }];
    let mut kinds = BTreeSet::new();
    for case in 0..64 {
        let mut ops = base.clone();
        m.apply(Mutation::Retype, &mut ops, &[], &mut guide_runner(4, case));
        kinds.insert(ops[0].name());
        let mut named = false;
        ops[0].for_each_seq(|s| named |= s == 2);
        let mut rm = vec![Op::SeqRm {
            seq: 1,
            p0: 3,
            p1: 9,
        }];
        m.apply(Mutation::Retype, &mut rm, &[], &mut guide_runner(4, case));
        assert!(range_of(&rm[0]).map_or(true, |r| r == (3, 9)), "{}", rm[0]);
        assert!(named || first_seq(&ops[0]).is_none(), "{}", ops[0]);
    }
    assert!(kinds.len() >= 4, "{kinds:?}");
}

#[test]
fn boundaries_come_from_the_trace_s_own_positions() {
    let ops = [Op::SeqRm {
        seq: 0,
        p0: 3,
        p1: 9,
    }];
    assert_eq!(
        position_dictionary(7, &ops, 32),
        vec![0, 1, 2, 3, 4, 6, 7, 8, 9, 10]
    );
    let g = GenConfig::with_max_len(8);
    let m = Mutator::new(&g);
    let mut moved = BTreeSet::new();
    for case in 0..64 {
        let mut ops = vec![Op::SeqRm {
            seq: 1,
            p0: 3,
            p1: 9,
        }];
        m.apply(
            Mutation::Boundary,
            &mut ops,
            &[],
            &mut guide_runner(5, case),
        );
        let Op::SeqRm { seq, p0, p1 } = ops[0] else {
            panic!("{}", ops[0])
        };
        moved.insert((seq, p0, p1));
        for p in [p0, p1] {
            assert!(
                p == -1 || [0, 1, 2, 3, 4, 6, 7, 8, 9, 10].contains(&p),
                "{p}"
            );
        }
    }
    assert!(
        moved.contains(&(3, 3, 9)) && moved.contains(&(1, -1, 9)),
        "{moved:?}"
    );
}

#[test]
fn the_smallest_entry_of_a_feature_is_favoured_and_rare_features_get_the_energy() {
    let mut q = Queue::default();
    q.push(trace(5), &[1, 2]);
    q.push(trace(3), &[2]);
    q.push(trace(4), &[3]);
    // Entry 1 is the smallest for feature 2; entry 0 keeps feature 1; 2 has feature 3.
    let favoured: Vec<usize> = q.favoured().iter().map(|f| f.0).collect();
    assert_eq!(favoured, vec![0, 1, 2]);
    q.push(trace(2), &[1]);
    let favoured: Vec<usize> = q.favoured().iter().map(|f| f.0).collect();
    assert_eq!(favoured, vec![1, 2, 3]);
    // Feature 3 reached by one case in ten, feature 2 by all of them.
    for i in 0..10 {
        q.observe(if i == 0 { &[1, 2, 3] } else { &[1, 2] });
    }
    let energy: BTreeMap<usize, f64> = q.favoured().into_iter().collect();
    assert!(energy[&2] > 5.0 * energy[&1], "{energy:?}");
    let mut picks = vec![0; 4];
    for case in 0..400 {
        picks[q.pick(&mut guide_runner(1, case))] += 1;
    }
    assert!(picks[2] > picks[1] && picks[2] > picks[3], "{picks:?}");
    assert!(
        picks[0] > 0,
        "unfavoured entries are picked at times: {picks:?}"
    );
}

#[test]
fn findings_entries_are_mutated_but_not_kept() {
    let mut q = Queue::new(vec![trace(6)]);
    q.rate(0, &[1]);
    q.push(trace(5), &[2]);
    let site = FindingSite {
        step: 3,
        seq: Some(1),
        op: OpKind::SeqKeep,
    };
    q.push_finding(trace(3), finding_feature(&"I1|seq_keep"), site);
    q.push_finding(trace(2), finding_feature(&("I1|seq_keep", "prefix")), site);
    assert_eq!((q.site(1), q.site(2)), (None, Some(site)));
    assert_eq!(q.entries().len(), 4);
    assert_eq!(q.kept(), 2);
    let mut picks = [0; 4];
    for case in 0..400 {
        picks[q.pick(&mut guide_runner(2, case))] += 1;
    }
    // A quarter of the picks at least go to the findings' two entries.
    assert!(picks[2] + picks[3] >= 100, "{picks:?}");
    assert!(picks[0] > 0 && picks[1] > 0, "{picks:?}");
    assert_eq!(q.into_kept(), vec![trace(6), trace(5)]);
}

#[test]
fn a_neighbour_keeps_the_prefix_and_ends_in_a_ranged_op_on_the_failing_sequence() {
    let g = GenConfig::with_max_len(16);
    let m = Mutator::new(&g);
    let copy = Op::SeqCp {
        src: 0,
        dst: 1,
        p0: 0,
        p1: 1,
    };
    let entry = Trace {
        setup: g.setup.clone(),
        ops: vec![copy.clone(), copy, Op::SeqKeep { seq: 0 }, Op::Clear],
    };
    let site = FindingSite {
        step: 3,
        seq: Some(1),
        op: OpKind::SeqKeep,
    };
    let (mut kinds, mut on_violation, mut widened, mut removals) = (BTreeSet::new(), 0, 0, 0);
    for case in 0..200 {
        let n = m.neighbour(&entry, site, &mut guide_runner(6, case));
        in_domain(&g, &n);
        assert!(
            n.ops.len() >= 3,
            "the ops before the failing one, then one, then a tail"
        );
        let last = &n.ops[2];
        assert!(RANGED.contains(&last.kind()), "{last}");
        kinds.insert(last.kind());
        removals += usize::from(last.kind() == OpKind::SeqRm);
        on_violation += usize::from(first_seq(last) == Some(1));
        // The two copies of one range move together, and only ever wider.
        let (r0, r1) = (range_of(&n.ops[0]), range_of(&n.ops[1]));
        assert_eq!(r0, r1);
        let (p0, p1) = r0.expect("a copy has a range");
        assert!(p0 == 0 && (p1 == -1 || p1 >= 1), "{p1}");
        widened += usize::from(p1 != 1);
    }
    assert_eq!(kinds.len(), RANGED.len(), "{kinds:?}");
    assert!((100..200).contains(&on_violation), "{on_violation}");
    assert!((100..200).contains(&widened), "{widened}");
    // The failing `seq_keep`'s sibling, half the time, and one of the four kinds the rest: a
    // `seq_rm` about five times in eight.
    assert!((100..160).contains(&removals), "{removals}");
}

#[test]
fn a_new_finding_s_entry_gets_the_picks_until_it_is_not_new() {
    let mut q = Queue::default();
    for c in 0..6 {
        q.push(trace(4 + c as usize), &[c]);
    }
    let site = FindingSite {
        step: 1,
        seq: Some(0),
        op: OpKind::SeqAdd,
    };
    q.push_finding(trace(1), finding_feature(&"new"), site);
    let finding = q.entries().len() - 1;
    let picks: Vec<usize> = (0..400)
        .map(|case| q.pick(&mut guide_runner(4, case)))
        .collect();
    let share = |picks: &[usize]| picks.iter().filter(|&&i| i == finding).count();
    // New: about two picks in three (one in two, and its share of the rest).
    let first = share(&picks[..24]);
    assert!(first >= 12, "{first} of the first 24");
    // Then the share `FINDING_ONE_IN` and its energy give it.
    let later = share(&picks[200..]);
    assert!(later * 24 < first * 200, "{later} of 200 later");
    assert!(later > 0);
}

#[test]
fn a_finding_s_entry_is_mostly_mutated_into_its_neighbours() {
    let g = GenConfig::with_max_len(16);
    let m = Mutator::new(&g);
    let mut q = Queue::default();
    let site = FindingSite {
        step: 2,
        seq: None,
        op: OpKind::Decode,
    };
    q.push_finding(trace(2), finding_feature(&"only"), site);
    let children: Vec<Trace> = (WARMUP_CASES..WARMUP_CASES + 200)
        .filter_map(|case| m.next_case(&mut q, 3, case))
        .collect();
    let neighbours = children
        .iter()
        .filter(|c| c.ops.len() >= 2 && RANGED.contains(&c.ops[1].kind()))
        .count();
    assert!(
        neighbours * 2 > children.len() && neighbours < children.len(),
        "{neighbours} of {}",
        children.len()
    );
}

#[test]
fn children_are_a_function_of_the_seed_case_and_queue() {
    let g = GenConfig::with_max_len(20);
    let m = Mutator::new(&g);
    let queue = || {
        let mut q = Queue::default();
        for c in 0..3 {
            q.push(generate(&g, 4, c), &[c]);
        }
        // A finding's entry too: its neighbours are drawn from the same stream.
        let site = FindingSite {
            step: 3,
            seq: Some(1),
            op: OpKind::SeqKeep,
        };
        q.push_finding(generate(&g, 4, 3), finding_feature(&"f"), site);
        q
    };
    let children = |seed| {
        let mut q = queue();
        (0..24)
            .map(|case| m.next_case(&mut q, seed, case))
            .collect::<Vec<_>>()
    };
    let first = children(1);
    assert_eq!(first, children(1));
    assert_ne!(first, children(2));
    let mutated = first.iter().filter(|c| c.is_some()).count();
    assert!((4..16).contains(&mutated), "{mutated} of 24 mutated");
    assert!(first[..WARMUP_CASES as usize].iter().all(Option::is_none));
}
