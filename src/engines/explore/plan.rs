//! The work of one depth of an exhaustive run: its chunks (all trials that start with one op,
//! the unit a shard takes and a resumed run counts as finished), and the pieces threads pull
//! (whole chunks, the depth's last ones split, so that no thread runs on alone at its end).

use crate::records::incomplete::Incomplete;
use crate::records::report::Shard;

/// A unit of work: all trials of one depth that start with one op.
#[derive(Clone, Copy, Debug)]
pub(super) struct Chunk {
    pub(super) depth: u32,
    pub(super) first: usize,
}

/// The chunks of one depth that belong to `shard`.
pub(super) fn chunks(n_ops: usize, depth: u32, shard: Shard) -> Vec<Chunk> {
    (0..n_ops)
        .filter(|f| f % shard.count == shard.index)
        .map(|first| Chunk { depth, first })
        .collect()
}

impl Chunk {
    /// How many trials it holds, `n` being the domain's op count.
    pub(super) fn len(&self, n: u64) -> u64 {
        n.pow(self.depth - 1)
    }

    /// Index of this chunk's first trial among the trials of its depth.
    pub(super) fn base_in_depth(&self, n: u64) -> u64 {
        self.first as u64 * n.pow(self.depth - 1)
    }
}

/// One piece of a thread's work: trials `from..from + len` of a chunk (numbered within the
/// chunk). Counted work adds to the report; the rest only rebuilds the "ever violated" bits a
/// resumed run needs, or (in a calibration) only takes time.
#[derive(Clone, Copy, Debug)]
pub(super) struct Work {
    pub(super) chunk: Chunk,
    pub(super) from: u64,
    pub(super) len: u64,
    pub(super) counted: bool,
}

/// The work of `depth` in a run to `max_depth`: every chunk of the shard, or, resuming after
/// `resume`, the unfinished chunks counted and the finished ones that a later depth reads the
/// bits of rerun uncounted. A chunk's prefixes are in the chunk of the same first op one depth
/// up, so when the run stopped in its last depth only the unfinished chunks' prefixes rerun.
pub(super) fn plan(
    n_ops: usize,
    depth: u32,
    max_depth: u32,
    shard: Shard,
    resume: Option<&Incomplete>,
) -> Vec<Work> {
    let n = n_ops as u64;
    let work = chunks(n_ops, depth, shard)
        .into_iter()
        .filter_map(|chunk| {
            let counted = resume.map_or(true, |r| !r.finished(depth, chunk.first));
            let needed = counted
                || resume
                    .is_some_and(|r| r.depth < max_depth || !r.finished(max_depth, chunk.first));
            needed.then_some(Work {
                chunk,
                from: 0,
                len: chunk.len(n),
                counted,
            })
        })
        .collect::<Vec<_>>();
    split_tail(work)
}

/// How many of a depth's last chunks [`split_tail`] splits, into how many pieces each, and the
/// least trials a chunk must hold to be split.
pub(super) const TAIL_CHUNKS: usize = 4;
pub(super) const TAIL_PIECES: u64 = 8;
pub(super) const TAIL_SPLIT_FROM: u64 = 1024;

/// `work` with its last [`TAIL_CHUNKS`] chunks (of at least [`TAIL_SPLIT_FROM`] trials) split
/// into [`TAIL_PIECES`] pieces each: threads take pieces as they finish, so at the end of a depth
/// one thread runs on alone for at most an eighth of a chunk, not a whole one (at depth 3 of the
/// seed domain a chunk is 2,401 trials, at depth 4 117,649: about a second).
fn split_tail(work: Vec<Work>) -> Vec<Work> {
    let at = work.len().saturating_sub(TAIL_CHUNKS);
    let mut out = Vec::with_capacity(work.len() + TAIL_CHUNKS * TAIL_PIECES as usize);
    for (i, w) in work.into_iter().enumerate() {
        if i < at || w.len < TAIL_SPLIT_FROM {
            out.push(w);
            continue;
        }
        let bounds = |k: u64| w.from + w.len * k / TAIL_PIECES;
        out.extend((0..TAIL_PIECES).map(|k| Work {
            from: bounds(k),
            len: bounds(k + 1) - bounds(k),
            ..w
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A depth's last chunks come in pieces that cover each of them once, in order; the others,
    /// and chunks too small to split, come whole.
    #[test]
    fn the_tail_of_a_depth_comes_in_pieces_covering_each_chunk_once() {
        let n = 49u64;
        for depth in 1..=4 {
            let work = plan(49, depth, 4, Shard::WHOLE, None);
            let mut next_in_depth = 0;
            for w in &work {
                assert_eq!(w.chunk.base_in_depth(n) + w.from, next_in_depth, "{w:?}");
                assert!(w.len > 0 && w.from + w.len <= w.chunk.len(n), "{w:?}");
                next_in_depth += w.len;
            }
            assert_eq!(next_in_depth, n.pow(depth), "depth {depth}");
            let split = work.len() - 49;
            let expected = if n.pow(depth - 1) >= TAIL_SPLIT_FROM {
                TAIL_CHUNKS * (TAIL_PIECES as usize - 1)
            } else {
                0
            };
            assert_eq!(split, expected, "depth {depth}");
            assert!(work[..49 - TAIL_CHUNKS]
                .iter()
                .all(|w| w.len == w.chunk.len(n)));
        }
        // Shards split their own tails: together they still run each trial once.
        for depth in 1..=3 {
            let mut seen = vec![0u8; n.pow(depth) as usize];
            for k in 0..3 {
                for w in plan(49, depth, 3, Shard::new(k, 3).unwrap(), None) {
                    let first = w.chunk.base_in_depth(n) + w.from;
                    for i in first..first + w.len {
                        seen[i as usize] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "depth {depth}");
        }
    }
}
