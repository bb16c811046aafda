//! The points of a target's own code a run reached (a `+cov` build of llama.cpp): the set of PC
//! offsets into the build's shared object, kept in a report as a compact value (sorted, each
//! stored as its distance from the one before), with the label of the build that recorded them
//! and how many distinct edges the run took; those reached by the trace's ops and those reached
//! outside them (the context's construction, the setup, resets, observations) apart.
//! [`CodeGather`] joins them trial by trial. `kvaudit coverage` maps the PCs to file:line.

use std::collections::{BTreeSet, HashSet};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::base::cache::CodeCoverage;
use crate::records::text::{markdown_code, terminal_text};

/// The code a run reached.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeSet {
    /// The build that recorded the points (`llama.cpp@0.1.161+cov`): its shared object is what
    /// the offsets are offsets into.
    pub build: String,
    /// Distinct PC offsets the trace's ops reached (return addresses of the coverage callback).
    #[serde(serialize_with = "deltas_out", deserialize_with = "deltas_in")]
    pub pcs: BTreeSet<u32>,
    /// Distinct edges the ops took.
    pub edges: u64,
    /// Distinct PC offsets reached outside the ops (construction, setup, resets,
    /// observations); some the ops reached too. Empty in runs of builds that record the ops
    /// only.
    #[serde(
        default,
        skip_serializing_if = "BTreeSet::is_empty",
        serialize_with = "deltas_out",
        deserialize_with = "deltas_in"
    )]
    pub outside: BTreeSet<u32>,
}

impl CodeSet {
    /// An empty set of `build`'s points.
    pub fn new(build: &str) -> CodeSet {
        CodeSet {
            build: build.to_string(),
            ..CodeSet::default()
        }
    }

    /// Every point reached, by the ops or outside them.
    pub fn all(&self) -> BTreeSet<u32> {
        self.pcs.union(&self.outside).copied().collect()
    }

    /// Adds the points of `other` (of the same build). Edges are counted per run, so the
    /// join keeps the larger count (a lower bound of the distinct edges of both).
    pub fn join(&mut self, other: &CodeSet) {
        self.pcs.extend(&other.pcs);
        self.outside.extend(&other.outside);
        self.edges = self.edges.max(other.edges);
    }
}

/// The code a run's trials reached, gathered trial by trial (an audit's tally, a fuzz run's
/// coverage): the edges kept distinct, so the count is exact.
#[derive(Clone, Debug, Default)]
pub struct CodeGather {
    pcs: BTreeSet<u32>,
    edges: HashSet<u32>,
    outside: BTreeSet<u32>,
    /// Edges counted by an earlier part of the run (a resumed audit's report), not listed.
    edges_before: u64,
}

impl CodeGather {
    /// Adds a trial's points; whether the ops reached a PC or an edge no trial before had.
    pub fn add(&mut self, code: &CodeCoverage) -> bool {
        let mut new = false;
        for &pc in &code.pcs {
            new |= self.pcs.insert(pc);
        }
        for &e in &code.edges {
            new |= self.edges.insert(e);
        }
        self.outside.extend(&code.outside);
        new
    }

    /// Adds what another part of the run gathered.
    pub fn merge(&mut self, other: CodeGather) {
        self.pcs.extend(other.pcs);
        self.edges.extend(other.edges);
        self.outside.extend(other.outside);
        self.edges_before = self.edges_before.max(other.edges_before);
    }

    /// Starts from what an earlier part of the run reached (its report's set).
    pub fn resumed(set: &CodeSet) -> CodeGather {
        CodeGather {
            pcs: set.pcs.clone(),
            edges: HashSet::new(),
            outside: set.outside.clone(),
            edges_before: set.edges,
        }
    }

    /// Distinct PCs the ops reached.
    pub fn ops_pcs(&self) -> u64 {
        self.pcs.len() as u64
    }

    /// Distinct edges the ops took.
    pub fn ops_edges(&self) -> u64 {
        self.edges.len() as u64
    }

    /// The set, as a report keeps it, of `build`'s points.
    pub fn set(&self, build: &str) -> CodeSet {
        CodeSet {
            build: build.to_string(),
            pcs: self.pcs.clone(),
            edges: (self.edges.len() as u64).max(self.edges_before),
            outside: self.outside.clone(),
        }
    }
}

/// The line coverage of one source file by a run (`kvaudit coverage`): lines with a coverage
/// point (instrumented), and of those the lines a point of which the run reached; the same for
/// the points themselves (basic blocks).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileCoverage {
    /// Relative to the llama.cpp tree, e.g. `src/llama-kv-cache.cpp`.
    pub file: String,
    /// Lines with at least one coverage point.
    pub lines: u64,
    /// Of which reached.
    pub lines_reached: u64,
    /// Coverage points (basic blocks) in the file.
    pub blocks: u64,
    /// Of which reached.
    pub blocks_reached: u64,
}

impl FileCoverage {
    /// Reached lines in percent of instrumented ones (0 for a file without any).
    pub fn line_percent(&self) -> f64 {
        percent(self.lines_reached, self.lines)
    }

    /// Reached blocks in percent.
    pub fn block_percent(&self) -> f64 {
        percent(self.blocks_reached, self.blocks)
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// The files' figures added up, as a row named `total`.
pub fn total(files: &[FileCoverage]) -> FileCoverage {
    let mut t = FileCoverage {
        file: "total".into(),
        ..FileCoverage::default()
    };
    for f in files {
        t.lines += f.lines;
        t.lines_reached += f.lines_reached;
        t.blocks += f.blocks;
        t.blocks_reached += f.blocks_reached;
    }
    t
}

/// The table of `files` and their total, in Markdown (file names escaped).
pub fn markdown_table(files: &[FileCoverage]) -> String {
    let mut s = String::from(
        "| file | lines reached | lines | % | blocks reached | blocks | % |\n|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for f in files.iter().chain(std::iter::once(&total(files))) {
        s.push_str(&format!(
            "| {} | {} | {} | {:.1} | {} | {} | {:.1} |\n",
            markdown_code(&f.file),
            f.lines_reached,
            f.lines,
            f.line_percent(),
            f.blocks_reached,
            f.blocks,
            f.block_percent()
        ));
    }
    s
}

/// The same table for a terminal.
pub fn terminal_table(files: &[FileCoverage]) -> String {
    let mut s = format!(
        "{:<36} {:>8} {:>7} {:>6} {:>8} {:>7} {:>6}\n",
        "file", "lines", "of", "%", "blocks", "of", "%"
    );
    for f in files.iter().chain(std::iter::once(&total(files))) {
        s.push_str(&format!(
            "{:<36} {:>8} {:>7} {:>6.1} {:>8} {:>7} {:>6.1}\n",
            terminal_text(&f.file),
            f.lines_reached,
            f.lines,
            f.line_percent(),
            f.blocks_reached,
            f.blocks,
            f.block_percent()
        ));
    }
    s
}

fn deltas_out<S: Serializer>(pcs: &BTreeSet<u32>, s: S) -> Result<S::Ok, S::Error> {
    let mut prev = 0u32;
    let deltas: Vec<u32> = pcs
        .iter()
        .map(|&p| {
            let d = p - prev;
            prev = p;
            d
        })
        .collect();
    deltas.serialize(s)
}

fn deltas_in<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeSet<u32>, D::Error> {
    let deltas = Vec::<u32>::deserialize(d)?;
    let mut prev = 0u32;
    let mut out = BTreeSet::new();
    for x in deltas {
        prev = prev
            .checked_add(x)
            .ok_or_else(|| serde::de::Error::custom("a PC offset beyond 2^32"))?;
        out.insert(prev);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_set_round_trips_as_deltas() {
        let set = CodeSet {
            build: "llama.cpp@0.1.161+cov".into(),
            pcs: [7u32, 3, 1000, 1001].into_iter().collect(),
            edges: 9,
            outside: [5u32, 3].into_iter().collect(),
        };
        let json = serde_json::to_string(&set).unwrap();
        assert!(json.contains("[3,4,993,1]"), "{json}");
        assert!(json.contains(r#""outside":[3,2]"#), "{json}");
        assert_eq!(set.all().len(), 5);
        assert_eq!(serde_json::from_str::<CodeSet>(&json).unwrap(), set);
        let bad = r#"{"build":"x","pcs":[4294967295,1],"edges":0}"#;
        assert!(serde_json::from_str::<CodeSet>(bad).is_err());
    }
}
