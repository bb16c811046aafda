//! The state-space explorer (`kvaudit audit --strategy states`): breadth-first search over the
//! distinct states of a target whose complete state can be keyed, judging every transition.
//!
//! Where the exhaustive explorer ([`super::explore`]) enumerates op sequences (`n^k` of length
//! `k`), this one visits each distinct state once, as a model checker does: level `L` holds the
//! states whose shortest path from the setup has `L` ops; every op of the domain is taken from
//! every state of level `L` (a *transition*), the observation after it is judged as a trial's
//! last step is, and the states not seen before form level `L + 1`. The search stops when a
//! level is empty (the space *closed*: every reachable state and every transition was judged) or
//! at the depth bound (transitions of traces up to that length were judged).
//!
//! Soundness. Merging two paths into one state is sound only when nothing any later op or
//! observation reads differs between them: the key is the target's complete state, compared byte
//! for byte (no hash collisions), through [`KeyedTarget`](crate::running::state_runner::KeyedTarget), which only a target whose whole state
//! can be read offers (`running::state_runner` says what the native target's key holds, and why
//! llama.cpp has none).
//!
//! Traces. Each state keeps the transition that first reached it (its BFS parent), in a fixed
//! order (level by level; within a level by parent, then by op in domain order), so a state's
//! path is a shortest one, and a finding's trace is the path to the transition's source plus
//! its op: a shortest trace that shows it. The search is deterministic: threads split a level's
//! states, and the new states are numbered after the level, in that order.
//!
//! Freshness. The exhaustive explorer records a violation only where no earlier step of the
//! same trace violated the same oracle. Here a state keeps the oracles its parent path violated
//! (the path the report would print), and a transition's violation is a new finding only when
//! that path did not violate the oracle already; either way it is counted (oracle counts are per
//! transition, not per path). So every finding's trace is fresh in the explorer's sense, and each
//! [`crate::records::finding::FindingKey`] keeps its shortest (then first) trace.
//!
//! The root (the setup's state) is not judged, as an exhaustive run judges no trace of zero ops.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::base::cache::HarnessError;
use crate::base::domain::Domain;
use crate::base::op::{Op, Trace};
use crate::engines::explore::{OracleBits, RunOracles};
use crate::oracles::Registry;
use crate::records::report::{Event, Report, Shard, StateSpace, Timing};
use crate::records::tally::Tally;
use crate::running::judge::VerdictMemo;
use crate::running::state_runner::{StateRunner, StateRunnerFactory};

/// What a state-space search runs.
pub struct StatesConfig {
    /// The domain.
    pub domain: Domain,
    /// Longest trace judged (the search stops earlier when the space closes).
    pub depth: u32,
    /// Worker threads (each with its own runner).
    pub threads: usize,
    /// The oracles that judge each transition (those that read one target's observations).
    pub oracles: Registry,
}

/// How a state was first reached.
#[derive(Clone, Copy)]
struct Parent {
    /// The parent state's number (`u32::MAX` for the root).
    state: u32,
    /// The op's index in the domain.
    op: u32,
}

/// A state of the level being expanded.
#[derive(Clone, Copy)]
struct Open {
    id: u32,
    /// The tracked oracles violated at some step of its path.
    ever: OracleBits,
}

/// A new state found by one thread, not yet numbered.
struct Candidate {
    /// Position of the source in the level.
    from: usize,
    op: u32,
    key: Box<[u8]>,
    ever: OracleBits,
}

/// States expanded per unit of work.
const CHUNK: usize = 16;

/// Runs a state-space search; `sink` sees the event stream (start, progress after each level,
/// findings, done).
pub fn run_states(
    cfg: &StatesConfig,
    factory: &StateRunnerFactory<'_>,
    sink: &mut dyn FnMut(&Event),
) -> Result<Report, HarnessError> {
    let ops = cfg.domain.ops();
    let n = ops.len();
    let setup = &cfg.domain.setup;
    let threads = cfg.threads.max(1);
    let mut runners: Vec<StateRunner> =
        (0..threads).map(|_| factory()).collect::<Result<_, _>>()?;
    let info = runners[0].info();
    let judges = RunOracles::new(&cfg.oracles, false);
    sink(&Event::Start {
        target: info.clone(),
        vs: None,
        domain: cfg.domain.name.clone(),
        depth: cfg.depth,
        ops: n,
        trials: n as u64,
        shard: Shard::WHOLE,
    });
    let started = Instant::now();
    let mut tally = Tally::default();
    let mut visited: HashSet<Box<[u8]>> = HashSet::new();
    let mut parents: Vec<Parent> = Vec::new();
    let mut level: Vec<Open> = Vec::new();
    if let Some(root) = runners[0].state_at(setup, &[])? {
        visited.insert(runners[0].key(&root).into_boxed_slice());
        parents.push(Parent {
            state: u32::MAX,
            op: 0,
        });
        level.push(Open { id: 0, ever: 0 });
    } else {
        // The target cannot take the setup: every first op is an unsupported trial.
        tally.trials = n as u64;
        tally.unsupported = n as u64;
    }
    let mut depth = 0;
    let mut transitions = 0u64;
    let mut closed = level.is_empty();
    while !level.is_empty() && depth < cfg.depth {
        depth += 1;
        let base = transitions;
        let next_chunk = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let found: Mutex<Vec<Candidate>> = Mutex::new(Vec::new());
        let results: Vec<Result<Tally, HarnessError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = runners
                .iter_mut()
                .map(|runner| {
                    let work = LevelWork {
                        ops: &ops,
                        setup_domain: &cfg.domain,
                        level: &level,
                        parents: &parents,
                        visited: &visited,
                        judges: &judges,
                        next_chunk: &next_chunk,
                        failed: &failed,
                        found: &found,
                        base,
                    };
                    scope.spawn(move || {
                        let r = work.run(runner);
                        if r.is_err() {
                            work.failed.store(true, Ordering::Relaxed);
                        }
                        r
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a search thread panicked"))
                .collect()
        });
        for r in results {
            tally.merge(r?);
        }
        transitions += (level.len() * n) as u64;
        // Number the new states in (source, op) order: the same whatever the threads did.
        let mut found = found.into_inner().expect("no thread panicked holding it");
        found.sort_unstable_by_key(|c| (c.from, c.op));
        let mut next = Vec::new();
        for c in found {
            if visited.insert(c.key) {
                next.push(Open {
                    id: parents.len() as u32,
                    ever: c.ever,
                });
                parents.push(Parent {
                    state: level[c.from].id,
                    op: c.op,
                });
            }
        }
        sink(&Event::Progress {
            done: transitions,
            total: transitions + (next.len() * n) as u64,
            elapsed_s: started.elapsed().as_secs_f64(),
        });
        closed = next.is_empty();
        level = next;
    }
    let elapsed = started.elapsed().as_secs_f64();
    tally.asked(judges.ids());
    let mut report = Report::new(
        info,
        None,
        cfg.domain.clone(),
        cfg.depth,
        Shard::WHOLE,
        tally,
        Timing {
            elapsed_s: elapsed,
            trials_per_s: transitions as f64 / elapsed.max(1e-9),
        },
    );
    report.state_space = Some(StateSpace {
        states: parents.len() as u64,
        transitions,
        depth,
        closed,
    });
    for f in &report.findings {
        sink(&Event::Finding(f.clone()));
    }
    sink(&Event::Done(Box::new(report.clone())));
    Ok(report)
}

/// What one thread needs to expand its share of a level.
#[derive(Clone, Copy)]
struct LevelWork<'a> {
    ops: &'a [Op],
    setup_domain: &'a Domain,
    level: &'a [Open],
    parents: &'a [Parent],
    /// The states of every earlier level (read only while a level runs).
    visited: &'a HashSet<Box<[u8]>>,
    judges: &'a RunOracles,
    next_chunk: &'a AtomicUsize,
    failed: &'a AtomicBool,
    found: &'a Mutex<Vec<Candidate>>,
    /// Transitions of the earlier levels: where this level's trial indices start.
    base: u64,
}

impl LevelWork<'_> {
    /// The ops from the setup to state `id`, along the BFS parents.
    fn path(&self, mut id: u32) -> Vec<Op> {
        let mut rev = Vec::new();
        while let Some(p) = self
            .parents
            .get(id as usize)
            .filter(|p| p.state != u32::MAX)
        {
            rev.push(self.ops[p.op as usize].clone());
            id = p.state;
        }
        rev.reverse();
        rev
    }

    fn run(&self, runner: &mut StateRunner) -> Result<Tally, HarnessError> {
        let n = self.ops.len();
        let setup = &self.setup_domain.setup;
        let info = runner.info();
        let mut tally = Tally::default();
        // New keys this thread found in this level, so it offers each once.
        let mut mine: HashSet<Box<[u8]>> = HashSet::new();
        let mut found = Vec::new();
        loop {
            if self.failed.load(Ordering::Relaxed) {
                break;
            }
            let start = self.next_chunk.fetch_add(1, Ordering::Relaxed) * CHUNK;
            if start >= self.level.len() {
                break;
            }
            for from in start..(start + CHUNK).min(self.level.len()) {
                let open = self.level[from];
                let mut trace = Trace {
                    setup: setup.clone(),
                    ops: self.path(open.id),
                };
                let state = runner
                    .state_at(setup, &trace.ops)?
                    .expect("the setup was taken for the root");
                for (j, op) in self.ops.iter().enumerate() {
                    let step = runner.step(&state, setup, op)?;
                    trace.ops.push(op.clone());
                    let index = self.base + (from * n + j) as u64;
                    let now = self.judges.judge(
                        &mut VerdictMemo::default(),
                        &mut tally,
                        &trace,
                        index,
                        (&info, &step.run),
                        None,
                        open.ever,
                    );
                    trace.ops.pop();
                    let Some(key) = step.key else {
                        continue;
                    };
                    let key = key.into_boxed_slice();
                    if self.visited.contains(&key) || mine.contains(&key) {
                        continue;
                    }
                    mine.insert(key.clone());
                    found.push(Candidate {
                        from,
                        op: j as u32,
                        key,
                        ever: open.ever | now.unwrap_or(0),
                    });
                }
            }
        }
        self.found
            .lock()
            .expect("no thread panicked holding it")
            .append(&mut found);
        Ok(tally)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::running::state_runner::{KeyScope, StateRunner};
    use crate::targets::native::NativeTarget;

    fn search(threads: usize, depth: u32) -> Report {
        let faults = native_kv::Faults {
            refcount: true,
            ..Default::default()
        };
        let oracles = Registry::builtin().only(|o| !o.observes().logits);
        let observe = oracles.observe();
        let factory = move || -> Result<StateRunner, HarnessError> {
            Ok(
                StateRunner::new(Box::new(NativeTarget::new(faults)), observe)?
                    .with_scope(KeyScope::Complete),
            )
        };
        let cfg = StatesConfig {
            domain: Domain::preset("seed").unwrap(),
            depth,
            threads,
            oracles,
        };
        let mut r = run_states(&cfg, &factory, &mut |_| {}).unwrap();
        r.timing = Timing::default();
        r
    }

    #[test]
    fn any_number_of_threads_gives_the_same_report() {
        let one = search(1, 3);
        assert_eq!(one, search(2, 3));
        assert_eq!(one, search(3, 3));
        let sp = one.state_space.unwrap();
        assert_eq!((sp.depth, sp.closed), (3, false));
        assert_eq!(one.trials, sp.transitions);
    }

    #[test]
    fn a_domain_that_cannot_grow_closes() {
        // Copies and removals alone over the setup's cells: finitely many states.
        let faults = native_kv::Faults::default();
        let oracles = Registry::builtin().only(|o| !o.observes().logits);
        let observe = oracles.observe();
        let factory = move || StateRunner::new(Box::new(NativeTarget::new(faults)), observe);
        let mut domain = Domain::preset("seed").unwrap();
        domain.deltas.clear();
        domain.divisors.clear();
        domain.decode_next.clear();
        let cfg = StatesConfig {
            domain,
            depth: 20,
            threads: 2,
            oracles,
        };
        let r = run_states(&cfg, &factory, &mut |_| {}).unwrap();
        let sp = r.state_space.unwrap();
        assert!(sp.closed, "{sp:?}");
        assert!(sp.depth < 20);
        assert_eq!(sp.transitions, sp.states * r.domain.ops().len() as u64);
    }
}
