//! User text made safe for where a report puts it: a terminal line, Markdown text, a Markdown
//! code span; and values written for people (`compact_value`) or by them (`parse_seconds`). Every rendering of a report, a
//! matrix or a bug report goes through these.

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

/// A value as JSON for people: in a list of integers, a run of at least three consecutive
/// numbers is written `a..=b` (a full cache's 250 positions are one item, not a screen). The JSON
/// report keeps the values whole.
pub fn compact_value(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Array(items) if !items.is_empty() && items.iter().all(|x| x.is_i64()) => {
            let nums: Vec<i64> = items.iter().filter_map(Value::as_i64).collect();
            let mut parts = Vec::new();
            let mut i = 0;
            while i < nums.len() {
                let mut j = i;
                while j + 1 < nums.len() && nums[j].checked_add(1) == Some(nums[j + 1]) {
                    j += 1;
                }
                if j - i >= 2 {
                    parts.push(format!("{}..={}", nums[i], nums[j]));
                } else {
                    parts.extend(nums[i..=j].iter().map(i64::to_string));
                }
                i = j + 1;
            }
            format!("[{}]", parts.join(","))
        }
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(compact_value).collect();
            format!("[{}]", parts.join(","))
        }
        Value::Object(map) => {
            let parts: Vec<String> = map
                .iter()
                .map(|(k, x)| format!("{}:{}", Value::String(k.clone()), compact_value(x)))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::compact_value;

    #[test]
    fn runs_of_consecutive_positions_are_written_as_ranges() {
        let v = serde_json::json!({"cells": [0, 1, 2, 3, 5, 7, 8, 9, 20, 21], "seq": 1, "x": [[4, 5, 6]]});
        assert_eq!(
            compact_value(&v),
            r#"{"cells":[0..=3,5,7..=9,20,21],"seq":1,"x":[[4..=6]]}"#
        );
        assert_eq!(compact_value(&serde_json::json!([])), "[]");
        assert_eq!(compact_value(&serde_json::json!(["a", 1])), r#"["a",1]"#);
        assert_eq!(
            compact_value(&serde_json::json!([i64::MAX - 1, i64::MAX])),
            format!("[{},{}]", i64::MAX - 1, i64::MAX)
        );
    }
}

/// A duration as people write it on a command line: `90` (seconds), `30s`, `5m`, `1h`.
pub fn parse_seconds(s: &str) -> Result<f64, crate::base::error::Error> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&t[..i], &t[i..]),
        None => (t, "s"),
    };
    let n: f64 = num
        .trim()
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n > 0.0)
        .ok_or("expected a positive number of seconds, or 30s, 5m, 1h")?;
    let scale = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err("unit must be s, m or h".into()),
    };
    Ok(n * scale)
}
