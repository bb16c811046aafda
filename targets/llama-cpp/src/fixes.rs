//! Fixes: small patches to a pin's llama.cpp sources, each making one root cause's findings
//! hold, that a build applies when its label names them (`llama.cpp@0.1.161+fix:NAME`).
//!
//! The fixes are the repository's `corpora/fixes/NAME.patch` files (unified diffs, `-p1` from
//! the `llama.cpp/` folder), each with its `NAME.json` (what it fixes, which corpus files it
//! makes hold; kvaudit reads that part), built into this crate by `build.rs` as `pins.toml` is,
//! so a fix is known by name wherever the crate is linked.
//!
//! A patch is applied exactly ([`apply_patch`]): each hunk's context and removed lines must be
//! the file's lines at the line the hunk names, with no fuzz and no offset search, so a fix
//! written for one pin is never half-applied to another; a hunk that does not match is an error
//! naming the fix, the file, the hunk and the first line that differs.

use crate::error::LlamaError;

/// A fix as built into the crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddedFix {
    /// The name after `+fix:` in a label, and the file stem under `corpora/fixes/`.
    pub name: &'static str,
    /// The text of `NAME.json` (read by kvaudit: root cause, corpus files, pins).
    pub json: &'static str,
    /// The text of `NAME.patch`.
    pub patch: &'static str,
}

impl EmbeddedFix {
    /// sha256 of the patch's bytes: what a build's key and manifest record of it.
    pub fn patch_sha256(&self) -> String {
        crate::files::sha256_hex(self.patch)
    }
}

/// Every fix built into the crate, in name order.
pub const FIXES: &[EmbeddedFix] = include!(concat!(env!("OUT_DIR"), "/fixes.rs"));

/// The fix called `name`; `Err` lists the known ones.
pub fn find(name: &str) -> Result<&'static EmbeddedFix, LlamaError> {
    FIXES.iter().find(|f| f.name == name).ok_or_else(|| {
        let known: Vec<&str> = FIXES.iter().map(|f| f.name).collect();
        LlamaError::Fix {
            name: name.to_string(),
            message: format!(
                "not a known fix (corpora/fixes/; known: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ),
        }
    })
}

/// One file's changes in a unified diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePatch {
    /// The file, relative to the tree's root (the `+++ b/PATH` line without `b/`).
    pub path: String,
    /// Its hunks, in order.
    pub hunks: Vec<Hunk>,
}

/// One hunk: where it starts in the old file, and its lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk {
    /// The `@@ -a,b +c,d @@` line, for messages.
    pub header: String,
    /// The first old line it covers, 1-based (`a`).
    pub old_start: usize,
    /// Its lines: `' '` context, `'-'` removed, `'+'` added, with the text after the mark.
    pub lines: Vec<(char, String)>,
}

/// Parses a unified diff (`diff -ru a/ b/` or `git diff` output): every `--- a/PATH`,
/// `+++ b/PATH` pair and its hunks; anything between files (`diff ...`, `index ...`) is
/// skipped. `Err` says which line is malformed.
pub(crate) fn parse_patch(text: &str) -> Result<Vec<FilePatch>, String> {
    let lines = text_lines(text).0;
    let mut files = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(old) = lines[i].strip_prefix("--- ") else {
            i += 1;
            continue;
        };
        let new = lines
            .get(i + 1)
            .and_then(|l| l.strip_prefix("+++ "))
            .ok_or_else(|| format!("line {}: `--- {old}` is not followed by `+++`", i + 1))?;
        let path = strip_component(new)
            .ok_or_else(|| format!("line {}: `+++ {new}`: expected `+++ b/PATH`", i + 2))?;
        if strip_component(old).is_none() {
            return Err(format!(
                "line {}: `--- {old}`: a fix changes existing files only (expected `--- a/PATH`)",
                i + 1
            ));
        }
        i += 2;
        let mut hunks = Vec::new();
        while let Some(header) = lines.get(i).filter(|l| l.starts_with("@@ ")) {
            let (old_start, old_len, new_len) = hunk_header(header)
                .ok_or_else(|| format!("line {}: malformed `{header}`", i + 1))?;
            i += 1;
            let (mut seen_old, mut seen_new, mut body) = (0, 0, Vec::new());
            while seen_old < old_len || seen_new < new_len {
                let line = lines.get(i).ok_or_else(|| {
                    format!("the hunk `{header}` of {path} ends before its {old_len} old and {new_len} new lines")
                })?;
                // An empty line is an empty context line whose space an editor stripped.
                let mut chars = line.chars();
                let mark = chars.next().unwrap_or(' ');
                match mark {
                    ' ' => (seen_old, seen_new) = (seen_old + 1, seen_new + 1),
                    '-' => seen_old += 1,
                    '+' => seen_new += 1,
                    '\\' => {
                        return Err(format!(
                            "line {}: `\\ No newline at end of file` is not supported",
                            i + 1
                        ))
                    }
                    _ => return Err(format!("line {}: `{line}` is not a hunk line", i + 1)),
                }
                body.push((mark, chars.as_str().to_string()));
                i += 1;
            }
            hunks.push(Hunk {
                header: header.to_string(),
                old_start,
                lines: body,
            });
        }
        if hunks.is_empty() {
            return Err(format!("{path}: no hunk"));
        }
        files.push(FilePatch { path, hunks });
    }
    if files.is_empty() {
        return Err("no `--- a/PATH` / `+++ b/PATH` file in the patch".into());
    }
    Ok(files)
}

/// `a/src/x.cpp` → `src/x.cpp` (the diff's `-p1`), ignoring a tab-separated date.
fn strip_component(name: &str) -> Option<String> {
    let name = name.split('\t').next().unwrap_or(name).trim_end();
    let (first, rest) = name.split_once('/')?;
    (!first.is_empty() && !rest.is_empty() && !rest.split('/').any(|c| c == ".." || c.is_empty()))
        .then(|| rest.to_string())
}

/// `@@ -a[,b] +c[,d] @@ ...` → (a, b, d); a missing count is 1.
fn hunk_header(line: &str) -> Option<(usize, usize, usize)> {
    let mut parts = line.split_whitespace().skip(1);
    let range = |s: Option<&str>, sign: char| -> Option<(usize, usize)> {
        let s = s?.strip_prefix(sign)?;
        match s.split_once(',') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => Some((s.parse().ok()?, 1)),
        }
    };
    let (a, b) = range(parts.next(), '-')?;
    let (_, d) = range(parts.next(), '+')?;
    Some((a, b, d))
}

/// `text` with `patch`'s hunks applied, each exactly where it says (no fuzz, no offset search).
/// `Err` names the hunk and the first line that differs.
pub(crate) fn apply_patch(text: &str, patch: &FilePatch) -> Result<String, String> {
    let (old, ends_with_newline) = text_lines(text);
    let mut out: Vec<&str> = Vec::with_capacity(old.len() + 8);
    let mut next = 0; // the first old line not yet copied, 0-based
    for (n, hunk) in patch.hunks.iter().enumerate() {
        let at = hunk.old_start.saturating_sub(1);
        let described = format!("hunk {} (`{}`) of {}", n + 1, hunk.header, patch.path);
        if at < next {
            return Err(format!("{described} overlaps the hunk before it"));
        }
        out.extend_from_slice(&old[next.min(old.len())..at.min(old.len())]);
        let mut line = at;
        for (mark, want) in &hunk.lines {
            if *mark == '+' {
                out.push(want);
                continue;
            }
            match old.get(line) {
                Some(have) if have == want => {}
                have => {
                    return Err(format!(
                        "{described} does not apply: line {} is {}, the patch expects {want:?}",
                        line + 1,
                        have.map_or("past the end".to_string(), |h| format!("{h:?}"))
                    ))
                }
            }
            if *mark == ' ' {
                out.push(old[line]);
            }
            line += 1;
        }
        next = line;
    }
    out.extend_from_slice(&old[next.min(old.len())..]);
    let mut text = out.join("\n");
    if ends_with_newline && !out.is_empty() {
        text.push('\n');
    }
    Ok(text)
}

/// The lines of `text` (split at `\n` only, so a `\r` stays in its line) and whether the last
/// one ended with a newline; the empty remainder after a final newline is no line.
fn text_lines(text: &str) -> (Vec<&str>, bool) {
    let mut lines: Vec<&str> = text.split('\n').collect();
    let ends_with_newline = lines.last() == Some(&"");
    if ends_with_newline {
        lines.pop();
    }
    (lines, ends_with_newline)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATCH: &str = "diff -ru a/src/x.h b/src/x.h\n--- a/src/x.h\n+++ b/src/x.h\n\
        @@ -2,3 +2,3 @@\n two\n-three\n+THREE\n four\n@@ -6 +6,2 @@\n six\n+six and a half\n";

    #[test]
    fn a_patch_applies_exactly_where_it_says() {
        let files = parse_patch(PATCH).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].path, "src/x.h");
        assert_eq!(files[0].hunks.len(), 2);
        let text = "one\ntwo\nthree\nfour\nfive\nsix\nseven\n";
        assert_eq!(
            apply_patch(text, &files[0]).unwrap(),
            "one\ntwo\nTHREE\nfour\nfive\nsix\nsix and a half\nseven\n"
        );
    }

    #[test]
    fn a_hunk_that_does_not_match_names_itself_and_the_line() {
        let files = parse_patch(PATCH).unwrap();
        // The same lines one further down: no offset search, so it does not apply.
        let err = apply_patch("zero\none\ntwo\nthree\nfour\nfive\nsix\n", &files[0]).unwrap_err();
        assert!(
            err.contains("hunk 1 (`@@ -2,3 +2,3 @@`) of src/x.h does not apply")
                && err.contains("line 2 is \"one\", the patch expects \"two\""),
            "{err}"
        );
        let err = apply_patch("one\ntwo\nthree\nfour\nfive\n", &files[0]).unwrap_err();
        assert!(
            err.contains("hunk 2") && err.contains("past the end"),
            "{err}"
        );
    }

    #[test]
    fn malformed_patches_say_where() {
        assert!(parse_patch("nothing here")
            .unwrap_err()
            .contains("no `--- a/PATH`"));
        let short = "--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n a\n";
        assert!(parse_patch(short).unwrap_err().contains("ends before"));
        let escape = "--- a/../x\n+++ b/../x\n@@ -1 +1 @@\n-a\n+b\n";
        assert!(parse_patch(escape)
            .unwrap_err()
            .contains("expected `+++ b/PATH`"));
        let new_file = "--- /dev/null\n+++ b/x\n@@ -0,0 +1 @@\n+a\n";
        assert!(parse_patch(new_file)
            .unwrap_err()
            .contains("existing files only"));
    }

    #[test]
    fn every_built_in_fix_parses_and_has_its_json() {
        assert!(!FIXES.is_empty());
        for fix in FIXES {
            parse_patch(fix.patch).unwrap_or_else(|e| panic!("{}: {e}", fix.name));
            assert!(
                fix.json.contains(&format!("\"{}\"", fix.name)),
                "{}",
                fix.name
            );
            assert_eq!(find(fix.name).unwrap(), fix);
        }
        assert!(format!("{}", find("no-such-fix").unwrap_err()).contains("not a known fix"));
    }
}
