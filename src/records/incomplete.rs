//! What an interrupted audit had finished: the mark of a partial report, from which
//! `kvaudit audit --resume` continues.
//!
//! An exhaustive audit's work is chunks (one per depth and first op, `engines::explore`), and a
//! report's counts are sums over finished chunks. A report that lacks chunks carries an
//! [`Incomplete`]: every depth before `depth` is finished, and of `depth` the chunks whose first
//! op is in `chunks_done`. Such a report is never presented as a finished run: its heading says
//! so, and [`merge`](crate::records::report::merge) refuses it.

use serde::{Deserialize, Serialize};

use crate::base::error::Error;
use crate::records::report::{Report, Shard};

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

    /// What JSON cannot say: a depth inside the run, chunks of the domain and of the shard,
    /// ascending and distinct.
    pub fn check(&self, run_depth: u32, n_ops: usize, shard: Shard) -> Result<(), String> {
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
            .find(|&&c| c >= n_ops || c % shard.count != shard.index)
        {
            return Err(format!(
                "\"incomplete\": chunk {c} is not a chunk of shard {}/{} over {n_ops} ops",
                shard.index, shard.count
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

/// Fails unless `partial` is a report of the run that `blank` (a report of no trials) heads:
/// the same targets, domain, depth, shard and oracles. `kvaudit audit --resume` checks this
/// before it adds a partial report's counts to its own.
pub fn check_resumes(partial: &Report, blank: &Report) -> Result<(), Error> {
    let who = |r: &Report| {
        serde_json::to_value((&r.target, &r.vs, &r.domain, r.depth)).expect("serializes")
    };
    if who(partial) != who(blank) {
        return Err(format!(
            "the report is of another run: it has {} over domain {} to depth {}, this run {} over {} to {}",
            partial.target.label(),
            partial.domain.name,
            partial.depth,
            blank.target.label(),
            blank.domain.name,
            blank.depth
        )
        .into());
    }
    if partial.shard != blank.shard {
        return Err(format!(
            "the report is of shard {}/{}, this run is shard {}/{}",
            partial.shard.index, partial.shard.count, blank.shard.index, blank.shard.count
        )
        .into());
    }
    let names = |r: &Report| r.oracles.keys().map(|o| o.to_string()).collect::<Vec<_>>();
    if names(partial) != names(blank) {
        return Err(format!(
            "the report asked the oracles {}, this run asks {}",
            names(partial).join(", "),
            names(blank).join(", ")
        )
        .into());
    }
    if partial.fuzz.is_some() {
        return Err("a fuzz report cannot be resumed".into());
    }
    Ok(())
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
        let shard = Shard::new(1, 3).unwrap();
        assert!(i.check(3, 5, shard).is_ok());
        assert!(i.check(1, 5, shard).is_err());
        assert!(i.check(3, 4, shard).is_err());
        assert!(i.check(3, 5, Shard::new(0, 3).unwrap()).is_err());
        let unsorted = Incomplete {
            depth: 1,
            chunks_done: vec![4, 1],
        };
        assert!(unsorted.check(3, 5, shard).is_err());
    }
}
