//! XML text: the one escaper of every XML output (JUnit results, SVG pictures).

use std::fmt::Write as _;

/// `s` as XML character data or attribute value: `&`, `<`, `>`, `"`, `'` as entities, and every
/// character XML 1.0 does not allow (C0 controls but tab and newline) or that reorders text
/// (bidirectional overrides) as `\u{..}` text.
pub fn xml_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\t' => out.push(c),
            c if c.is_control()
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{fffe}' | '\u{ffff}') =>
            {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_text_leaves_no_markup() {
        assert_eq!(
            xml_text("<a href='x'>&\"\u{1b}\u{202e}\n"),
            "&lt;a href=&apos;x&apos;&gt;&amp;&quot;\\u{1b}\\u{202e}\n"
        );
    }
}
