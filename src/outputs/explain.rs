//! A picture of a finding: the KV cells over the steps of its trace, as a self-contained SVG (no
//! scripts, no styles or fonts from the network).
//!
//! One column per step (the setup's ops, then the trace's ops), each headed by its llama.h call.
//! The cells are the used cells of the whole-context dump (`llama_state_get_data`, parsed by
//! `base/state/`), in cache order, each with its position and sequence set; a cell that differs
//! from the one in its row a step earlier is marked changed. Below, per sequence, the accessors
//! (`seq_pos_min`/`seq_pos_max`) beside the truth (the min and max position of the sequence's
//! serialized cells); an accessor that disagrees is marked stale. The finding's step is marked.
//!
//! Every element that carries a fact has a `class` and `data-*` attributes (step, row, sequence,
//! values), so a test or a script reads the picture without guessing from pixels. Text from the
//! repro file (its one-line summary, kinds, target names) goes through
//! [`crate::outputs::xml::xml_text`].

use std::fmt::Write as _;

use crate::base::cache::SeqObservation;
use crate::base::error::Error;
use crate::base::op::{Op, Trace};
use crate::base::state::WholeCell;
use crate::outputs::repro::{Expect, Repro, TargetExpectation};
use crate::outputs::xml::xml_text;
use crate::running::runner::{TrialEnd, TrialRun};
use crate::targets::registry::{TargetKind, TargetSpec};

/// One column of the picture: the state after one op.
#[derive(Clone, Debug, PartialEq)]
pub struct Frame {
    /// `setup 1`, `op 3`, ...
    pub label: String,
    /// The op, as llama.h calls it.
    pub call: String,
    /// The used cells of the whole dump, in cache order (`None`: the target gave no whole dump).
    pub cells: Option<Vec<WholeCell>>,
    /// Per sequence: accessors and serialized cells.
    pub seqs: Vec<SeqObservation>,
    /// Why the column has no observation (the target crashed at this op or before it).
    pub note: Option<String>,
}

/// What the picture shows.
#[derive(Clone, Debug, PartialEq)]
pub struct Picture {
    /// One line: what the finding is.
    pub title: String,
    /// The target the trace ran on.
    pub target: String,
    /// The columns: every setup op, then every op of the trace (as far as the target ran).
    pub frames: Vec<Frame>,
    /// Index into `frames` of the finding's step.
    pub violating: Option<usize>,
    /// What the oracle said there, one line each (the finding, what was observed, what was
    /// expected).
    pub verdict: Vec<String>,
}

/// `trace` with its setup's ops moved into its ops, so that every setup op is observed too.
pub fn observed_setup(trace: &Trace) -> Trace {
    let mut t = trace.clone();
    let setup_ops = std::mem::take(&mut t.setup.ops);
    t.ops = setup_ops.into_iter().chain(t.ops).collect();
    t
}

/// The picture of `run`, a run of [`observed_setup`]`(trace)`; `step` is the finding's 1-based
/// step in `trace` (after the setup).
pub fn picture(
    trace: &Trace,
    run: &TrialRun,
    step: Option<usize>,
    title: &str,
    target: &str,
    verdict: Vec<String>,
) -> Picture {
    let n_setup = trace.setup.ops.len();
    let ops: Vec<&Op> = trace.setup.ops.iter().chain(&trace.ops).collect();
    let crashed_at = match &run.end {
        TrialEnd::Crashed { step, message } => {
            Some((*step, message.lines().next().unwrap_or_default()))
        }
        _ => None,
    };
    let frames = ops
        .iter()
        .enumerate()
        .map(|(i, op)| {
            let obs = run.steps.get(i);
            let note = match (obs, crashed_at) {
                (Some(_), _) => None,
                (None, Some((at, why))) if at == i + 1 => Some(format!("crashed here: {why}")),
                (None, Some(_)) => Some("no observation: the process ended".to_string()),
                (None, None) => Some("not run".to_string()),
            };
            Frame {
                label: if i < n_setup {
                    format!("setup {}", i + 1)
                } else {
                    format!("op {}", i + 1 - n_setup)
                },
                call: op.to_string(),
                cells: obs.and_then(|o| o.whole.clone()),
                seqs: obs.map(|o| o.seqs.clone()).unwrap_or_default(),
                note,
            }
        })
        .collect::<Vec<_>>();
    let violating = step.map(|s| n_setup + s - 1).filter(|&i| i < frames.len());
    Picture {
        title: title.to_string(),
        target: target.to_string(),
        frames,
        violating,
        verdict,
    }
}

/// The target a picture of `repro` is drawn on by default: the first llama.cpp pin the file
/// expects to fail (the engine a bug report is for), else the first target it expects to fail;
/// of a pair (`vs`, `vs_config`), its first target is drawn.
pub fn default_target(repro: &Repro) -> Option<&TargetExpectation> {
    let fails = || repro.targets.iter().filter(|t| t.expect == Expect::Fails);
    fails()
        .find(|t| TargetKind::is_llama(&t.target))
        .or_else(|| fails().next())
}

/// Runs `repro`'s trace on `spec` (every setup op observed, with the whole dump) and draws it.
pub fn explain_repro(repro: &Repro, spec: &TargetSpec) -> Result<Picture, Error> {
    let factory = spec.factory()?;
    let mut runner = factory().map_err(|e| Error::harness(e.to_string()))?;
    let label = runner.info().label();
    let traces = [observed_setup(&repro.trace)];
    let run = runner
        .run_batch(&traces)
        .map_err(|e| Error::harness(e.to_string()))?
        .pop()
        .ok_or_else(|| Error::harness("the runner returned no run"))?;
    let seq = repro.seq.map(|s| format!(" (seq {s})")).unwrap_or_default();
    let verdict = vec![
        format!(
            "{} violated after op {}{seq}: {}",
            repro.oracle, repro.step, repro.kind
        ),
        format!("observed {}", repro.observed),
        format!("expected {}", repro.expected),
    ];
    Ok(picture(
        &repro.trace,
        &run,
        Some(repro.step),
        &repro.repro,
        &label,
        verdict,
    ))
}

/// The true min and max of a sequence's serialized cells (-1, -1 when it has none).
fn truth(s: &SeqObservation) -> (i32, i32) {
    match (s.cells.iter().min(), s.cells.iter().max()) {
        (Some(&lo), Some(&hi)) => (lo, hi),
        _ => (-1, -1),
    }
}

fn seq_set(seqs: &[i32]) -> String {
    let ids: Vec<String> = seqs.iter().map(|s| s.to_string()).collect();
    format!("{{{}}}", ids.join(","))
}

const COL: usize = 240;
const LEFT: usize = 150;
const ROW: usize = 22;
const TOP: usize = 86;

/// The picture as a self-contained SVG document.
pub fn to_svg(p: &Picture) -> String {
    let n_rows = p
        .frames
        .iter()
        .filter_map(|f| f.cells.as_ref().map(Vec::len))
        .max()
        .unwrap_or(0);
    let seq_ids: Vec<i32> = {
        let mut ids: Vec<i32> = p
            .frames
            .iter()
            .flat_map(|f| f.seqs.iter().map(|s| s.seq))
            .collect();
        ids.sort();
        ids.dedup();
        ids
    };
    let cells_top = TOP + 36;
    let acc_top = cells_top + n_rows.max(1) * ROW + 30;
    let height = acc_top + seq_ids.len() * 2 * ROW + 40 + 16 * p.verdict.len();
    // Monospace at 12 px: about 7.3 px a character.
    let longest_line = p
        .verdict
        .iter()
        .map(String::as_str)
        .chain([p.title.as_str()])
        .map(|l| l.chars().count())
        .chain([p.target.chars().count() + 110])
        .max()
        .unwrap_or(0);
    let width = (LEFT + p.frames.len().max(1) * COL + 20).max(longest_line * 73 / 10 + 20);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="monospace" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<title>{}</title>"#,
        xml_text(&format!("{} on {}", p.title, p.target))
    );
    s.push_str(
        "<style>.cell{fill:#eef3fb;stroke:#7a8aa6}.cell.changed{fill:#fff1c2;stroke:#b08900;stroke-width:2}\
         .stale{fill:#c62828;font-weight:bold}.ok{fill:#1b5e20}.violation{fill:none;stroke:#c62828;stroke-width:3}\
         .head{font-weight:bold}</style>\n",
    );
    let _ = writeln!(
        s,
        r#"<text class="title head" x="10" y="20">{}</text>"#,
        xml_text(&p.title)
    );
    let _ = writeln!(
        s,
        r#"<text class="target" x="10" y="38">{}</text>"#,
        xml_text(&format!(
            "target {}; cells from llama_state_get_data (position and sequence set), accessors beside the truth from llama_state_seq_get_data",
            p.target
        ))
    );
    let _ = writeln!(
        s,
        r#"<text class="legend" x="10" y="56">yellow: the op changed the cell; red: an accessor that disagrees with the serialized cells; red frame: the finding's step</text>"#
    );
    let _ = writeln!(s, r#"<text x="10" y="{}">cells</text>"#, cells_top + 15);
    for (k, f) in p.frames.iter().enumerate() {
        let x = LEFT + k * COL;
        let _ = writeln!(
            s,
            r#"<text class="op head" data-step="{k}" x="{x}" y="{TOP}">{}</text>"#,
            xml_text(&f.label)
        );
        // The call on two lines (name, then arguments) to fit the column.
        let (name, args) = f.call.split_at(f.call.find('(').unwrap_or(f.call.len()));
        let _ = writeln!(
            s,
            r#"<text class="call" data-step="{k}" x="{x}" y="{}" font-size="9"><tspan>{}</tspan><tspan x="{x}" dy="11">{}</tspan></text>"#,
            TOP + 13,
            xml_text(name),
            xml_text(args)
        );
        let prev = k.checked_sub(1).and_then(|j| p.frames[j].cells.as_ref());
        match &f.cells {
            None => {
                // At most a column's width (the verdict below has the whole message).
                let why: String = f
                    .note
                    .as_deref()
                    .unwrap_or("no whole dump")
                    .chars()
                    .take(COL / 6)
                    .collect();
                let _ = writeln!(
                    s,
                    r#"<text class="no-dump" data-step="{k}" x="{x}" y="{}" font-size="9">{}</text>"#,
                    cells_top + 15,
                    xml_text(&why)
                );
            }
            Some(cells) => {
                for (r, c) in cells.iter().enumerate() {
                    let changed = prev.map_or(true, |pc| pc.get(r) != Some(c));
                    let y = cells_top + r * ROW;
                    let class = if changed { "cell changed" } else { "cell" };
                    let _ = writeln!(
                        s,
                        r#"<g data-step="{k}" data-row="{r}" data-pos="{}" data-seqs="{}"><rect class="{class}" x="{x}" y="{y}" width="{}" height="{}"/><text x="{}" y="{}">{}</text></g>"#,
                        c.pos,
                        xml_text(&seq_set(&c.seqs)),
                        COL - 10,
                        ROW - 4,
                        x + 4,
                        y + 13,
                        xml_text(&format!("pos {} seqs {}", c.pos, seq_set(&c.seqs)))
                    );
                }
                // Rows the previous step had and this one has not: the op freed them.
                for r in cells.len()..prev.map_or(0, Vec::len) {
                    let y = cells_top + r * ROW;
                    let _ = writeln!(
                        s,
                        r#"<g data-step="{k}" data-row="{r}" class="freed"><rect class="cell changed" x="{x}" y="{y}" width="{}" height="{}" fill-opacity="0.3"/><text x="{}" y="{}">freed</text></g>"#,
                        COL - 10,
                        ROW - 4,
                        x + 4,
                        y + 13
                    );
                }
            }
        }
        for (j, sq) in seq_ids.iter().enumerate() {
            let y = acc_top + j * 2 * ROW;
            if k == 0 {
                let _ = writeln!(
                    s,
                    r#"<text x="10" y="{}">seq {sq} accessors</text><text x="10" y="{}">seq {sq} truth</text>"#,
                    y + 13,
                    y + ROW + 13
                );
            }
            let Some(o) = f.seqs.iter().find(|o| o.seq == *sq) else {
                continue;
            };
            let (lo, hi) = truth(o);
            let stale = (o.pos_min, o.pos_max) != (lo, hi);
            let _ = writeln!(
                s,
                r#"<text class="accessor {}" data-step="{k}" data-seq="{sq}" data-pos-min="{}" data-pos-max="{}" data-true-min="{lo}" data-true-max="{hi}" x="{x}" y="{}">min {} max {}</text>"#,
                if stale { "stale" } else { "ok" },
                o.pos_min,
                o.pos_max,
                y + 13,
                o.pos_min,
                o.pos_max
            );
            let cells: Vec<String> = o.cells.iter().map(|c| c.to_string()).collect();
            let _ = writeln!(
                s,
                r#"<text class="truth" data-step="{k}" data-seq="{sq}" x="{x}" y="{}">min {lo} max {hi} [{}]</text>"#,
                y + ROW + 13,
                cells.join(",")
            );
        }
    }
    if let Some(k) = p.violating {
        let x = LEFT + k * COL - 5;
        let _ = writeln!(
            s,
            r#"<rect class="violation" data-step="{k}" x="{x}" y="{}" width="{}" height="{}"/>"#,
            TOP - 16,
            COL,
            acc_top + seq_ids.len() * 2 * ROW - TOP + 16
        );
    }
    for (i, line) in p.verdict.iter().enumerate() {
        let _ = writeln!(
            s,
            r#"<text class="verdict stale" x="10" y="{}">{}</text>"#,
            height + 12 - 16 * (p.verdict.len() - i),
            xml_text(line)
        );
    }
    s.push_str("</svg>\n");
    s
}
