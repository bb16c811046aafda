//! What an interrupted audit had finished: the mark of a partial report, from which
//! `kvaudit audit --resume` continues.
//!
//! An exhaustive audit's work is chunks (one per depth and first op, `engines::explore`), and a
//! report's counts are sums over finished chunks. A report that lacks chunks carries an
//! [`Incomplete`]: every depth before `depth` is finished, and of `depth` the chunks whose first
//! op is in `chunks_done`. Such a report is never presented as a finished run: its heading says
//! so, and [`merge`](crate::records::report::merge) refuses it. Whether a partial report is of
//! a given run is `engines::explore::check_resumes`.

use serde::{Deserialize, Serialize};

/// Where an interrupted audit stopped: the depth in progress and its finished chunks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Incomplete {
    /// The depth in progress (every shorter depth is finished).
    pub depth: u32,
    /// The first ops (indices into the domain's op list) of the finished chunks of `depth`,
    /// ascending.
    pub chunks_done: Vec<usize>,
}

impl Incomplete {
    /// Whether the chunk of `depth` that starts with op `first` is finished.
    pub fn finished(&self, depth: u32, first: usize) -> bool {
        depth < self.depth
            || (depth == self.depth && self.chunks_done.binary_search(&first).is_ok())
    }

    /// What JSON cannot say: a depth inside the run, chunks of the domain and of shard
    /// `shard.0` of `shard.1`, ascending and distinct.
    pub(crate) fn check(
        &self,
        run_depth: u32,
        n_ops: usize,
        shard: (usize, usize),
    ) -> Result<(), String> {
        if self.depth == 0 || self.depth > run_depth {
            return Err(format!(
                "\"incomplete\": depth {} is not a depth of the run's 1..={run_depth}",
                self.depth
            ));
        }
        if !self.chunks_done.windows(2).all(|w| w[0] < w[1]) {
            return Err("\"incomplete\": chunks_done is not ascending and distinct".into());
        }
        if let Some(c) = self
            .chunks_done
            .iter()
            .find(|&&c| c >= n_ops || c % shard.1 != shard.0)
        {
            return Err(format!(
                "\"incomplete\": chunk {c} is not a chunk of shard {}/{} over {n_ops} ops",
                shard.0, shard.1
            ));
        }
        Ok(())
    }

    /// For headings: where the run stopped.
    pub fn describe(&self) -> String {
        format!(
            "INCOMPLETE: stopped in depth {} with {} of its chunks done; continue with --resume",
            self.depth,
            self.chunks_done.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finished_chunks_and_checks() {
        let i = Incomplete {
            depth: 2,
            chunks_done: vec![1, 4],
        };
        assert!(i.finished(1, 0));
        assert!(i.finished(2, 4));
        assert!(!i.finished(2, 2));
        assert!(!i.finished(3, 1));
        let shard = (1, 3);
        assert!(i.check(3, 5, shard).is_ok());
        assert!(i.check(1, 5, shard).is_err());
        assert!(i.check(3, 4, shard).is_err());
        assert!(i.check(3, 5, (0, 3)).is_err());
        let unsorted = Incomplete {
            depth: 1,
            chunks_done: vec![4, 1],
        };
        assert!(unsorted.check(3, 5, shard).is_err());
    }
}
