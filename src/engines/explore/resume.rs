//! Whether a partial report can be resumed by a run: [`check_resumes`].

use crate::base::error::Error;
use crate::records::report::Report;

/// Fails unless `partial` is a report of the run that `blank` (a report of no trials) heads:
/// the same targets, domain, depth, shard and oracles. `kvaudit audit --resume` checks this
/// before it adds a partial report's counts to its own.
pub fn check_resumes(partial: &Report, blank: &Report) -> Result<(), Error> {
    if !partial.same_run(blank) {
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
