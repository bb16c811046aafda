//! Escapers for C source: how text from a (hostile) input reaches a generated program, and the
//! shape that no input text may change.

use std::fmt::Write as _;

/// `s` as a C string literal, escaped by construction: printable ASCII other than `"`, `\` and
/// `?` as itself, `"` `\` `?` with a backslash (`\?` keeps `??/` from being a trigraph), every
/// other byte (control characters, NUL, each byte of a UTF-8 sequence) as a three-digit octal
/// escape, which cannot run into the next character the way a hex escape does.
pub fn c_string_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for &b in s.as_bytes() {
        match b {
            b'"' | b'\\' | b'?' => {
                out.push('\\');
                out.push(b as char);
            }
            0x20..=0x7e => out.push(b as char),
            _ => {
                let _ = write!(out, "\\{b:03o}");
            }
        }
    }
    out.push('"');
    out
}

/// `s` as the text of lines inside a `/* ... */` comment: one line per input line, each only
/// printable ASCII. `*/` (which would end the comment) and `/*` become `* /` and `/ *`; any other
/// character, including a tab, a backslash (a line splice) and non-ASCII (bidirectional
/// overrides make code read otherwise than it compiles), is written as `\u{..}` text.
pub fn c_comment_lines(s: &str) -> Vec<String> {
    s.split('\n')
        .map(|line| {
            let mut out = String::with_capacity(line.len());
            let mut prev = ' ';
            for c in line.chars() {
                match c {
                    '/' if prev == '*' => out.push_str(" /"),
                    '*' if prev == '/' => out.push_str(" *"),
                    '\\' => out.push_str("\\u{5c}"),
                    ' '..='~' => out.push(c),
                    c => {
                        let _ = write!(out, "\\u{{{:x}}}", c as u32);
                    }
                }
                prev = c;
            }
            out
        })
        .collect()
}

/// What input text must never change in a generated program: its preprocessor lines, comment
/// delimiters and NUL bytes, counted (`#` lines, `/*`, `*/`, NULs) and the preprocessor lines
/// themselves. Two programs for the same trace, one with hostile free text and one without,
/// have the same shape.
pub fn program_shape(program: &str) -> (Vec<&str>, usize, usize, usize) {
    let directives = program
        .lines()
        .filter(|l| l.trim_start().starts_with('#'))
        .collect();
    (
        directives,
        program.matches("/*").count(),
        program.matches("*/").count(),
        program.matches('\0').count(),
    )
}
