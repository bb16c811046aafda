//! `kvaudit coverage RUN...`: the memory code of a `+cov` build that runs reached, per source
//! file and line. The points a run reached (`records::code::CodeSet`, PC offsets into the
//! build's shared object) are looked up in the build's [`CodeMap`] (every coverage point of the
//! shared object, mapped to file:line by `addr2line`): a line is instrumented when a point maps
//! to it, reached when a reached point does. Rendered as a table per file (terminal, Markdown)
//! and as an HTML page per file with each source line marked reached, not reached, or not
//! instrumented.

use std::collections::{BTreeMap, BTreeSet};

use crate::base::error::Error;
use crate::outputs::xml::xml_text;
use crate::records::code::{total, FileCoverage};
use crate::targets::llama::build::cov::CodeMap;

/// The lines of one file: instrumented, and reached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileLines {
    /// Lines with a coverage point.
    pub instrumented: BTreeSet<u32>,
    /// Lines with a reached coverage point.
    pub reached: BTreeSet<u32>,
    /// Points in the file.
    pub blocks: u64,
    /// Reached points in the file.
    pub blocks_reached: u64,
}

impl FileLines {
    /// The file's figures.
    pub fn figures(&self, file: &str) -> FileCoverage {
        FileCoverage {
            file: file.to_string(),
            lines: self.instrumented.len() as u64,
            lines_reached: self.reached.len() as u64,
            blocks: self.blocks,
            blocks_reached: self.blocks_reached,
        }
    }
}

/// The lines of every file of `map`, with those `reached` (PC offsets) reached. A reached point
/// the map does not have means the run was recorded by another build of the same label (an
/// older shim or compiler): an error, since its offsets name other code.
pub fn lines_reached(
    map: &CodeMap,
    reached: &BTreeSet<u32>,
) -> Result<BTreeMap<String, FileLines>, Error> {
    let mut files: BTreeMap<String, FileLines> = BTreeMap::new();
    for (pc, at) in &map.points {
        let f = files.entry(at.file.clone()).or_default();
        f.instrumented.insert(at.line);
        f.blocks += 1;
        if reached.contains(pc) {
            f.reached.insert(at.line);
            f.blocks_reached += 1;
        }
    }
    check_offsets(&map.sites, reached)?;
    Ok(files)
}

/// Checks that every reached offset is a coverage point of the build (`sites`: every return
/// address of the coverage callback, inside the tree's sources or not).
fn check_offsets(sites: &BTreeSet<u32>, reached: &BTreeSet<u32>) -> Result<(), Error> {
    let foreign = reached.difference(sites).count();
    if foreign > 0 {
        return Err(Error::input(format!(
            "{foreign} of {} reached points are not coverage points of this build: the run was recorded by another build of the label (another shim or compiler); run it again",
            reached.len()
        )));
    }
    Ok(())
}

/// The figures of every file, sorted by name.
pub fn figures(files: &BTreeMap<String, FileLines>) -> Vec<FileCoverage> {
    files.iter().map(|(f, l)| l.figures(f)).collect()
}

/// The name of a file's HTML page: its path with `/` as `_`.
pub fn page_name(file: &str) -> String {
    format!("{}.html", file.replace('/', "_"))
}

/// The annotated page of one file: each line of `source` marked reached (green), not reached
/// (red) or not instrumented (no colour), with the file's figures on top.
pub fn html_page(file: &str, build: &str, source: &str, lines: &FileLines) -> String {
    let f = lines.figures(file);
    let mut s = format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title><style>\n\
         body{{font-family:monospace}} pre{{margin:0}} .r{{background:#d4f7d4}} .m{{background:#f7d4d4}}\n\
         .n{{color:#888}} span.l{{display:inline-block;width:5em;text-align:right;margin-right:1em;color:#888}}\n\
         </style></head><body>\n<h1>{t}</h1>\n<p>{b}: {lr} of {l} instrumented lines reached ({lp:.1}%), {br} of {bl} blocks ({bp:.1}%). \
         Green: reached; red: instrumented, not reached; plain: no coverage point.</p>\n<pre>",
        t = xml_text(file),
        b = xml_text(build),
        lr = f.lines_reached,
        l = f.lines,
        lp = f.line_percent(),
        br = f.blocks_reached,
        bl = f.blocks,
        bp = f.block_percent(),
    );
    for (i, text) in source.lines().enumerate() {
        let n = i as u32 + 1;
        let class = if lines.reached.contains(&n) {
            "r"
        } else if lines.instrumented.contains(&n) {
            "m"
        } else {
            "n"
        };
        s.push_str(&format!(
            "<div class=\"{class}\"><span class=\"l\">{n}</span>{}</div>",
            xml_text(text)
        ));
    }
    s.push_str("</pre></body></html>\n");
    s
}

/// The index page: the table with a link per file.
pub fn html_index(build: &str, files: &[FileCoverage]) -> String {
    let mut s = format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>coverage of {b}</title></head><body>\n<h1>Memory code of {b} reached</h1>\n<table border=\"1\"><tr><th>file</th><th>lines reached</th><th>lines</th><th>%</th><th>blocks reached</th><th>blocks</th><th>%</th></tr>\n",
        b = xml_text(build)
    );
    for f in files.iter().chain(std::iter::once(&total(files))) {
        let name = if f.file == "total" {
            "total".to_string()
        } else {
            format!(
                "<a href=\"{}\">{}</a>",
                xml_text(&page_name(&f.file)),
                xml_text(&f.file)
            )
        };
        s.push_str(&format!(
            "<tr><td>{name}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{:.1}</td></tr>\n",
            f.lines_reached,
            f.lines,
            f.line_percent(),
            f.blocks_reached,
            f.blocks,
            f.block_percent()
        ));
    }
    s.push_str("</table></body></html>\n");
    s
}

/// The lines of `lines` not reached, as runs `a..=b` (for the committed list of lines no run
/// reaches).
pub fn unreached_runs(lines: &FileLines) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for &n in lines.instrumented.difference(&lines.reached) {
        match out.last_mut() {
            Some((_, hi)) if lines.instrumented.range(*hi + 1..n).next().is_none() => *hi = n,
            _ => out.push((n, n)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::targets::llama::build::cov::SourceLine;

    fn map() -> CodeMap {
        let at = |file: &str, line| SourceLine {
            file: file.into(),
            line,
        };
        CodeMap {
            points: [
                (10, at("src/a.cpp", 3)),
                (20, at("src/a.cpp", 3)),
                (30, at("src/a.cpp", 5)),
                (40, at("src/a.cpp", 9)),
                (50, at("src/b.h", 1)),
            ]
            .into_iter()
            .collect(),
            sites: [10, 20, 30, 40, 50, 60].into_iter().collect(),
            tree: "/t".into(),
        }
    }

    #[test]
    fn a_line_is_reached_when_one_of_its_points_is() {
        let files = lines_reached(&map(), &[20, 50].into_iter().collect()).unwrap();
        let a = &files["src/a.cpp"];
        assert_eq!(a.instrumented, [3, 5, 9].into_iter().collect());
        assert_eq!(a.reached, [3].into_iter().collect());
        assert_eq!((a.blocks, a.blocks_reached), (4, 1));
        assert_eq!(files["src/b.h"].figures("src/b.h").lines_reached, 1);
        // 5 and 9 are not reached, and nothing instrumented lies between them: one run.
        assert_eq!(unreached_runs(a), vec![(5, 9)]);
        let page = html_page("src/a.cpp", "llama.cpp@x+cov", "a\nb\nc<d>\nd\ne\n", a);
        assert!(
            page.contains("<div class=\"r\"><span class=\"l\">3</span>c&lt;d&gt;</div>"),
            "{page}"
        );
        assert!(page.contains("<div class=\"m\"><span class=\"l\">5</span>e</div>"));
        assert!(page.contains("<div class=\"n\"><span class=\"l\">1</span>a</div>"));
    }

    #[test]
    fn offsets_of_another_build_are_refused() {
        let sites: BTreeSet<u32> = [10, 20].into_iter().collect();
        assert!(check_offsets(&sites, &[10].into_iter().collect()).is_ok());
        assert!(check_offsets(&sites, &[10, 11].into_iter().collect()).is_err());
        assert!(lines_reached(&map(), &[60].into_iter().collect()).is_ok());
        assert!(lines_reached(&map(), &[61].into_iter().collect()).is_err());
    }
}
