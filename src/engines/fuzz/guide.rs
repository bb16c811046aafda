//! The guided generator's queue and mutations, after AFL's: the traces that reached new
//! coverage ([`super::coverage`]) are kept, and most cases are a queue entry put through a
//! stack of havoc mutations: splice two entries, insert an op or a fork chunk drawn from the
//! generator, drop a run of ops, change an op's arguments (a fresh draw of the same kind), or
//! repeat an op later (a second `seq_cp` of the same pair is how the seed's I1 bug starts).
//!
//! Every new op comes from the random generator's strategies ([`super::generate`]), so a mutated
//! trace stays in the generator's domain. Every choice is drawn from the case's own guide stream
//! ([`guide_runner`]), and the queue grows only with what the (deterministic) targets showed,
//! so a guided run is a function of the seed, the case count and the starting queue.

use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use crate::base::op::{Op, Trace};
use crate::records::fuzz::GenConfig;

use super::generate::{chunk_strategy, op_strategy, stream_runner};

/// The proptest runner the guided generator's choices for case `case` of seed `seed` come from:
/// a stream apart from [`super::case_runner`]'s, so that a case drawn afresh in a guided run is
/// the random generator's case of the same number.
pub fn guide_runner(seed: u64, case: u64) -> TestRunner {
    stream_runner(b"kvaudit-guide-v1", seed, case)
}

/// One case in `FRESH_ONE_IN` is drawn afresh rather than mutated: the queue's entries all
/// descend from draws, and fresh ones bring in new material. (One in four fell further behind
/// the random generator over the first thousands of cases: `cargo bench --bench fuzz`.)
pub const FRESH_ONE_IN: u64 = 2;

/// A uniform draw from `0..n` (`n > 0`).
fn below(runner: &mut TestRunner, n: usize) -> usize {
    (runner.rng().next_u64() % n as u64) as usize
}

/// The havoc mutations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// The head of the entry, then the tail of another one.
    Splice,
    /// An op or a fork chunk drawn from the generator, at any place.
    Insert,
    /// One to four consecutive ops removed.
    Drop,
    /// An op replaced by a fresh draw of the same kind (other arguments).
    Change,
    /// A copy of an op inserted later in the trace.
    Repeat,
}

const MUTATIONS: [Mutation; 5] = [
    Mutation::Splice,
    Mutation::Insert,
    Mutation::Drop,
    Mutation::Change,
    Mutation::Repeat,
];

/// Mutates queue entries within a generator's domain.
pub struct Mutator {
    gen: GenConfig,
    op: BoxedStrategy<Op>,
    chunk: BoxedStrategy<Vec<Op>>,
}

impl Mutator {
    /// A mutator drawing its new ops as `g`'s generator does.
    pub fn new(g: &GenConfig) -> Self {
        Mutator {
            gen: g.clone(),
            op: op_strategy(g),
            chunk: chunk_strategy(g),
        }
    }

    fn draw_op(&self, runner: &mut TestRunner) -> Op {
        self.op
            .new_tree(runner)
            .expect("the generator rejects nothing")
            .current()
    }

    /// Case `case` of a guided run of seed `seed`: a child of a queue entry, or `None` (an
    /// empty queue, and one case in [`FRESH_ONE_IN`]): the random generator's case.
    pub fn next_case(&self, queue: &[Trace], seed: u64, case: u64) -> Option<Trace> {
        let mut runner = guide_runner(seed, case);
        if queue.is_empty() || below(&mut runner, FRESH_ONE_IN as usize) == 0 {
            return None;
        }
        Some(self.child(queue, &mut runner))
    }

    /// A child of a queue entry (`queue` is not empty): an entry picked (one time in two the
    /// shortest of four drawn, as AFL favours the smallest entries: a short trace runs fast and
    /// a mutation of it changes more of what it does; else among the sixteen newest, the
    /// coverage frontier), then 1, 2, 4, 8 or 16 stacked mutations (AFL's havoc stacks; fewer
    /// gave less coverage per case in the benchmark).
    pub fn child(&self, queue: &[Trace], runner: &mut TestRunner) -> Trace {
        let n = queue.len();
        let parent = if below(runner, 2) == 0 {
            (0..4)
                .map(|_| below(runner, n))
                .min_by_key(|&i| queue[i].ops.len())
                .unwrap_or(0)
        } else if n > 16 {
            n - 16 + below(runner, 16)
        } else {
            below(runner, n)
        };
        let mut ops = queue[parent].ops.clone();
        for _ in 0..1u32 << below(runner, 5) {
            let m = MUTATIONS[below(runner, MUTATIONS.len())];
            self.apply(m, &mut ops, queue, runner);
        }
        ops.truncate(self.gen.max_len);
        if ops.is_empty() {
            ops.push(self.draw_op(runner));
        }
        Trace {
            setup: queue[parent].setup.clone(),
            ops,
        }
    }

    /// Applies one mutation to `ops` (another entry of `queue` for a splice).
    pub fn apply(&self, m: Mutation, ops: &mut Vec<Op>, queue: &[Trace], runner: &mut TestRunner) {
        let len = ops.len();
        match m {
            Mutation::Splice => {
                let other = &queue[below(runner, queue.len())].ops;
                let head = below(runner, len + 1);
                let tail = below(runner, other.len() + 1);
                ops.truncate(head);
                ops.extend_from_slice(&other[tail..]);
            }
            Mutation::Insert => {
                let at = below(runner, len + 1);
                let new = if below(runner, 4) == 0 {
                    self.chunk
                        .new_tree(runner)
                        .expect("the generator rejects nothing")
                        .current()
                } else {
                    vec![self.draw_op(runner)]
                };
                ops.splice(at..at, new);
            }
            Mutation::Drop if len > 1 => {
                let at = below(runner, len);
                let k = 1 + below(runner, 4.min(len - at));
                ops.drain(at..at + k);
            }
            Mutation::Change if len > 0 => {
                let at = below(runner, len);
                let name = ops[at].name();
                // Same kind when a draw gives one soon (clear has no arguments to change).
                let mut new = self.draw_op(runner);
                for _ in 0..16 {
                    if new.name() == name {
                        break;
                    }
                    new = self.draw_op(runner);
                }
                ops[at] = new;
            }
            Mutation::Repeat if len > 0 => {
                let at = below(runner, len);
                let to = at + 1 + below(runner, len - at);
                let op = ops[at].clone();
                ops.insert(to, op);
            }
            Mutation::Drop | Mutation::Change | Mutation::Repeat => {
                ops.push(self.draw_op(runner));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
                Op::Decode(d) => assert!((1..=g.max_tokens).contains(&d.n)),
                _ => {}
            }
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
            in_domain(&g, &m.child(&queue, &mut runner));
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
        m.apply(Mutation::Insert, &mut ops, &queue, &mut runner);
        assert!(ops.len() > base.len());
        let mut ops = base.clone();
        m.apply(Mutation::Repeat, &mut ops, &queue, &mut runner);
        assert_eq!(ops.len(), base.len() + 1);
        // The one op more is a copy of an op of the original.
        let extra = ops.iter().find(|o| {
            ops.iter().filter(|p| p == o).count() > base.iter().filter(|p| p == o).count()
        });
        assert!(extra.is_some_and(|o| base.contains(o)));
        let mut ops = base.clone();
        m.apply(Mutation::Change, &mut ops, &queue, &mut runner);
        assert_eq!(ops.len(), base.len());
        assert!(ops.iter().zip(&base).filter(|(a, b)| a != b).count() <= 1);
    }

    #[test]
    fn children_are_a_function_of_the_seed_case_and_queue() {
        let g = GenConfig::with_max_len(20);
        let queue: Vec<Trace> = (0..3).map(|c| generate(&g, 4, c)).collect();
        let m = Mutator::new(&g);
        let child = |seed, case| m.child(&queue, &mut guide_runner(seed, case));
        assert_eq!(child(1, 5), child(1, 5));
        assert_ne!(child(1, 5), child(2, 5));
    }
}
