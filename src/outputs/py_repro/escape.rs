//! Text into Python source: how text from a (hostile) input reaches a generated program.

use std::fmt::Write as _;

/// `s` as a Python string literal, escaped by construction: printable ASCII other than `"` and
/// `\` as itself, those two with a backslash, every other character as a `\x`, `\u` or `\U`
/// escape of its code point (a NUL, a newline, a bidirectional override or U+2028 never
/// appears raw in the source).
pub fn py_string_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            c if (c as u32) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if (c as u32) < 0x10000 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
        }
    }
    out.push('"');
    out
}

/// `s` as the text of one `#` comment line: printable ASCII only; a newline, a carriage return
/// and every other character outside printable ASCII (a bidirectional override makes code read
/// otherwise than it runs) are written as `\u{..}` text, so the comment cannot end its line.
pub fn py_comment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\u{5c}"),
            ' '..='~' => out.push(c),
            c => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_and_comments_hold_no_raw_control_or_quote() {
        assert_eq!(
            py_string_literal("a\"b\\c\n\0é🦀"),
            r#""a\"b\\c\x0a\x00\xe9\U0001f980""#
        );
        assert_eq!(py_comment("x\ny\u{202e}\\"), "x\\u{a}y\\u{202e}\\u{5c}");
    }
}
