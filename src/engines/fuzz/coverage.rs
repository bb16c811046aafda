//! The fuzzer's coverage signal. On a target that records its own code (a `+cov` build of
//! llama.cpp: `TrialRun::code`), the PCs and edges of its memory code a case reached; elsewhere,
//! which abstract transitions and observation shapes a run of
//! target A reached, read from the observations the run already has (the cells parsed from the
//! serialized state by `base/state/`, the accessors, each op's outcome), so it costs no
//! execution and means the same on every target.
//!
//! An exact state would make every state new, so the cells are abstracted to a finite shape
//! ([`StateShape`]): per sequence, its layout (empty, contiguous, holey, a position held twice),
//! whether `seq_pos_min`/`seq_pos_max` agree with its cells (what I1 reads), and whether it holds
//! one cell or more; the set of shapes the sequences have (ids are symmetric under renaming,
//! and counts would multiply the states); and, from the whole-context dump when the target
//! gives one, how many cells are shared, by how many sequences at most, and whether a used cell
//! belongs to no sequence. A transition is the sharing before an op, the op's kind and range
//! class, the shapes (before it) of the sequences it names, and its outcome (refusal, decode
//! return code, `seq_rm`'s boolean, a crash). Finer keys (sizes, the multiset of shapes, the
//! whole shape before each op) made nearly every case new in a trial of 2,000 cases, and a
//! queue that keeps everything guides nothing.

use std::collections::BTreeSet;
use std::hash::{DefaultHasher, Hash, Hasher};

use crate::base::cache::{OpOutcome, SeqObservation, StepObservation};
use crate::base::op::{Op, Pos, SeqId, Trace};
use crate::records::code::{CodeGather, CodeSet};
use crate::records::fuzz::CoveragePoint;
use crate::running::runner::{TrialEnd, TrialRun};

/// How a sequence's cells lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Layout {
    Empty,
    /// Every position from the first to the last, once.
    Contiguous,
    /// Distinct positions with a gap.
    Holey,
    /// A position held by two cells.
    Repeated,
}

/// One sequence, abstracted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct SeqShape {
    layout: Layout,
    /// `seq_pos_min`/`seq_pos_max` are the cells' first and last positions (-1 when empty).
    accessors_agree: bool,
    /// One cell, or more.
    single: bool,
}

fn seq_shape(s: &SeqObservation) -> SeqShape {
    let cells = &s.cells;
    let layout = match (cells.first(), cells.last()) {
        (None, _) | (_, None) => Layout::Empty,
        (Some(&lo), Some(&hi)) => {
            if cells.windows(2).any(|w| w[0] == w[1]) {
                Layout::Repeated
            } else if (hi - lo + 1) as usize == cells.len() {
                Layout::Contiguous
            } else {
                Layout::Holey
            }
        }
    };
    let (lo, hi): (Pos, Pos) = (
        cells.first().copied().unwrap_or(-1),
        cells.last().copied().unwrap_or(-1),
    );
    SeqShape {
        layout,
        accessors_agree: s.pos_min == lo && s.pos_max == hi,
        single: cells.len() == 1,
    }
}

/// The cells of a whole observation, abstracted: which [`seq_shape`]s the sequences have (a set:
/// how many sequences share a shape is left out), and the sharing of cells when the
/// whole-context dump is there.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct StateShape {
    seqs: Vec<SeqShape>,
    sharing: Option<Sharing>,
}

/// How the cells of the whole-context dump are shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Sharing {
    /// Cells with two or more sequences, bucketed (0, 1, 2-3, 4+).
    shared: u8,
    /// Most sequences on one cell (capped at 4).
    max_sharers: u8,
    /// A used cell of no sequence.
    orphan: bool,
}

fn state_shape(o: &StepObservation) -> StateShape {
    let mut seqs: Vec<SeqShape> = o.seqs.iter().map(seq_shape).collect();
    seqs.sort();
    seqs.dedup();
    let sharing = o.whole.as_deref().map(|w| Sharing {
        shared: match w.iter().filter(|c| c.seqs.len() >= 2).count() {
            0 => 0,
            1 => 1,
            2..=3 => 2,
            _ => 3,
        },
        max_sharers: w.iter().map(|c| c.seqs.len()).max().unwrap_or(0).min(4) as u8,
        orphan: w.iter().any(|c| c.seqs.is_empty()),
    });
    StateShape { seqs, sharing }
}

/// A range's class: whole, open at one end, closed.
fn range_class(p0: Pos, p1: Pos) -> u8 {
    match (p0 < 0, p1 < 0) {
        (true, true) => 0,
        (false, true) => 1,
        (true, false) => 2,
        (false, false) => 3,
    }
}

/// What an op is, for coverage: its kind, range class and the shapes (before it) of the
/// sequences it names, in argument order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct OpClass {
    name: &'static str,
    range: Option<u8>,
    /// `seq_rm` of every sequence, a multi-sequence or explicitly placed decode.
    variant: u8,
    named: Vec<Option<SeqShape>>,
}

fn op_class(op: &Op, before: Option<&StepObservation>) -> OpClass {
    let shape_of = |seq: SeqId| -> Option<SeqShape> {
        before.and_then(|b| b.seqs.iter().find(|s| s.seq == seq).map(seq_shape))
    };
    let mut named = Vec::new();
    op.for_each_seq(|s| named.push(shape_of(s)));
    let (range, variant) = match op {
        Op::SeqRm { seq, p0, p1 } => (Some(range_class(*p0, *p1)), u8::from(*seq < 0)),
        Op::SeqCp { p0, p1, .. } | Op::SeqAdd { p0, p1, .. } | Op::SeqDiv { p0, p1, .. } => {
            (Some(range_class(*p0, *p1)), 0)
        }
        Op::Decode(d) => (
            None,
            u8::from(d.seqs.len() > 1) | (u8::from(d.pos.is_some()) << 1),
        ),
        Op::SeqKeep { .. }
        | Op::Clear
        | Op::StateSeqSave { .. }
        | Op::StateSeqLoad { .. }
        | Op::StateSave { .. }
        | Op::StateLoad { .. } => (None, 0),
    };
    OpClass {
        name: op.name(),
        range,
        variant,
        named,
    }
}

/// What an op did, for coverage.
fn outcome_class(o: &OpOutcome) -> i32 {
    match o {
        OpOutcome::Done { returned: None } => 0,
        OpOutcome::Done {
            returned: Some(true),
        } => 1,
        OpOutcome::Done {
            returned: Some(false),
        } => 2,
        OpOutcome::Refused { .. } => 3,
        OpOutcome::Unsupported { .. } => 4,
        // Return codes are small; keep them apart from the classes above.
        OpOutcome::Decoded { rc } => 100 + rc.clamp(&-50, &50),
    }
}

/// A crash or an unsupported op ends a run: its own outcomes.
const CRASHED: i32 = -1;
const UNSUPPORTED_END: i32 = -2;

fn key(value: &impl Hash) -> u64 {
    // SipHash with fixed keys: the same value gives the same key in every run.
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// The tag of an edge's feature (the others are hashes: a clash is as likely as any two).
const EDGE_FEATURE: u64 = 1 << 63;

/// What one case reached: whether any of it was new to the run, and its features (edges on a
/// target that records its code, else transitions and shapes), the guided queue's signal
/// ([`super::guide::Queue`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reached {
    /// Something no earlier case of the run reached.
    pub new: bool,
    /// The case's features, each once.
    pub features: Vec<u64>,
}

/// The transitions and shapes a run has reached, and the target's own code when it records it.
#[derive(Clone, Debug, Default)]
pub struct Coverage {
    transitions: BTreeSet<u64>,
    shapes: BTreeSet<u64>,
    /// The target's memory code (a `+cov` build), once a run carried code points.
    code: Option<CodeGather>,
}

impl Coverage {
    /// Adds what `run` (of `trace` on target A) reached. On a target that records its code
    /// (`TrialRun::code`) the signal is its edges, and new PCs or edges make the case new;
    /// elsewhere the abstract transitions and shapes are the signal.
    pub fn add(&mut self, trace: &Trace, run: &TrialRun) -> Reached {
        let mut features = Vec::new();
        let abstract_new = self.add_abstract(trace, run, &mut features);
        let Some(code) = &run.code else {
            return Reached {
                new: abstract_new,
                features,
            };
        };
        // New PCs or edges of the ops make the case new; points outside them do not.
        let new = self.code.get_or_insert_with(CodeGather::default).add(code);
        features.clear();
        features.extend(code.edges.iter().map(|&e| EDGE_FEATURE | u64::from(e)));
        Reached { new, features }
    }

    /// The code reached so far, as a report keeps it (`None` when no run carried code points).
    pub fn code(&self, build: &str) -> Option<CodeSet> {
        self.code.as_ref().map(|c| c.set(build))
    }

    fn add_abstract(&mut self, trace: &Trace, run: &TrialRun, features: &mut Vec<u64>) -> bool {
        let mut new = false;
        // Before the first op: the setup's state, the same for every trace of a run.
        let mut before: Option<&StepObservation> = None;
        let mut sharing: Option<Sharing> = None;
        for (op, after) in trace.ops.iter().zip(&run.steps) {
            let shape = state_shape(after);
            let t = key(&(sharing, op_class(op, before), outcome_class(&after.outcome)));
            new |= self.transitions.insert(t);
            new |= self.shapes.insert(key(&shape));
            features.extend([t, key(&shape)]);
            before = Some(after);
            sharing = shape.sharing;
        }
        let end = match run.end {
            TrialEnd::Crashed { .. } => Some(CRASHED),
            TrialEnd::Unsupported { .. } => Some(UNSUPPORTED_END),
            TrialEnd::Completed => None,
        };
        if let (Some(end), Some(op)) = (end, trace.ops.get(run.steps.len())) {
            let t = key(&(sharing, op_class(op, before), end));
            new |= self.transitions.insert(t);
            features.push(t);
        }
        features.sort_unstable();
        features.dedup();
        new
    }

    /// The coverage now, after `cases` cases and `elapsed_s` seconds.
    pub fn point(&self, cases: u64, elapsed_s: f64) -> CoveragePoint {
        CoveragePoint {
            elapsed_s,
            cases,
            transitions: self.transitions.len() as u64,
            shapes: self.shapes.len() as u64,
            pcs: self.code.as_ref().map_or(0, CodeGather::ops_pcs),
            edges: self.code.as_ref().map_or(0, CodeGather::ops_edges),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(seq: SeqId, cells: &[Pos], pos: (Pos, Pos)) -> SeqObservation {
        SeqObservation {
            seq,
            pos_min: pos.0,
            pos_max: pos.1,
            cells: cells.to_vec(),
            second_cells: None,
            third_cells: None,
        }
    }

    #[test]
    fn sequences_are_abstracted_to_a_few_shapes() {
        let contiguous = seq_shape(&seq(0, &[0, 1, 2, 3, 4], (0, 4)));
        assert_eq!(contiguous.layout, Layout::Contiguous);
        assert!(contiguous.accessors_agree);
        assert!(!contiguous.single);
        // Same shape at other positions: positions are not part of it.
        assert_eq!(contiguous, seq_shape(&seq(1, &[7, 8, 9, 10, 11], (7, 11))));
        assert_eq!(seq_shape(&seq(0, &[0, 2], (0, 2))).layout, Layout::Holey);
        assert_eq!(seq_shape(&seq(0, &[2, 2], (2, 2))).layout, Layout::Repeated);
        let empty = seq_shape(&seq(0, &[], (-1, -1)));
        assert_eq!((empty.layout, empty.accessors_agree), (Layout::Empty, true));
        // I1's shape: the accessors say a position the cells no longer hold.
        assert!(!seq_shape(&seq(0, &[0, 1], (0, 5))).accessors_agree);
        assert!(seq_shape(&seq(0, &[3], (3, 3))).single);
    }

    #[test]
    fn renaming_sequences_gives_the_same_state_shape() {
        let obs = |a: &[Pos], b: &[Pos]| StepObservation {
            outcome: OpOutcome::Done { returned: None },
            seqs: vec![
                seq(0, a, (a[0], *a.last().unwrap())),
                seq(1, b, (b[0], *b.last().unwrap())),
            ],
            whole: None,
            round_trip: None,
            before: None,
            logits_probe: None,
            next_logits: None,
            reload_probe: None,
            sizes: None,
        };
        assert_eq!(
            state_shape(&obs(&[0, 1], &[0, 3])),
            state_shape(&obs(&[4, 6], &[2, 3]))
        );
        assert_ne!(
            state_shape(&obs(&[0, 1], &[0, 3])),
            state_shape(&obs(&[0, 1], &[0, 1]))
        );
    }
}
