//! User text made safe for where a report puts it: a terminal line, Markdown text, a Markdown
//! code span. Every rendering of a report, a matrix or a bug report goes through these.

use std::fmt::Write as _;

/// Characters a terminal acts on rather than prints: C0 and C1 controls (ESC starts escape
/// sequences, U+009B is a one-byte CSI) and the bidirectional overrides and isolates, which make
/// text display in another order than it reads.
pub(crate) fn acts_on_terminal(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` for a terminal, on one line: every character a terminal acts on (newlines included) as a
/// `\u{..}` escape.
pub fn terminal_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if acts_on_terminal(c) {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

/// `s` as Markdown text that renders as itself inside a line, a heading or a table cell: control
/// characters (newlines included) become spaces; `|` (a table column), `` ` `` (a code span),
/// `\`, `*`, `_`, `[`, `]`, `#` and `~` are backslash-escaped; `<`, `>` and `&` become entities, so
/// no HTML tag or entity passes.
pub fn markdown_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '|' | '`' | '\\' | '*' | '_' | '[' | ']' | '#' | '~' => {
                out.push('\\');
                out.push(c);
            }
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            c if acts_on_terminal(c) => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// `s` as a Markdown code span, backticks included: delimited by one backtick more than the
/// longest run of backticks inside (CommonMark's rule), padded with a space where `s` starts or
/// ends with one; control characters (newlines included) become spaces and `|` is written `\|`
/// so a span in a table cell keeps the row's columns (GitHub-flavoured tables split on `|`
/// before code spans are parsed).
pub fn markdown_code(s: &str) -> String {
    let body: String = s
        .chars()
        .map(|c| if acts_on_terminal(c) { ' ' } else { c })
        .collect::<String>()
        .replace('|', "\\|");
    let longest_run = body.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest_run + 1);
    let pad = if body.starts_with('`') || body.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{body}{pad}{fence}")
}
