//! Replay results as JUnit XML, for CI systems that read it.

use super::*;
use crate::outputs::xml::xml_text as xml_escape;

/// JUnit XML: one test case per repro file, a failure per changed expectation, an error where
/// the harness could not check one.
pub fn junit_xml(results: &[FileResult]) -> String {
    let failures = results
        .iter()
        .filter(|r| !r.passed() && !r.harness_error())
        .count();
    let errors = results.iter().filter(|r| r.harness_error()).count();
    let time: f64 = results.iter().map(|r| r.elapsed_s).sum();
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        s,
        "<testsuites name=\"kvaudit replay\" tests=\"{}\" failures=\"{failures}\" errors=\"{errors}\" time=\"{time:.3}\">",
        results.len()
    );
    let _ = writeln!(
        s,
        "  <testsuite name=\"kvaudit replay\" tests=\"{}\" failures=\"{failures}\" errors=\"{errors}\" time=\"{time:.3}\">",
        results.len()
    );
    for r in results {
        let _ = write!(
            s,
            "    <testcase classname=\"kvaudit.replay\" name=\"{}\" file=\"{}\" time=\"{:.3}\">",
            xml_escape(&r.name()),
            xml_escape(&r.path.display().to_string()),
            r.elapsed_s
        );
        match &r.entries {
            Err(e) => {
                let _ = write!(
                    s,
                    "\n      <error type=\"harness\" message=\"{}\"/>\n    ",
                    xml_escape(e)
                );
            }
            Ok(entries) => {
                let bad: Vec<&EntryResult> =
                    entries.iter().filter(|e| !e.status.passed()).collect();
                if let Some(first) = bad.first() {
                    let tag = if r.harness_error() {
                        "error"
                    } else {
                        "failure"
                    };
                    let body: Vec<String> = bad
                        .iter()
                        .map(|e| format!("{}: {}: {}", e.label, e.status.word(), e.status.detail()))
                        .collect();
                    let _ = write!(
                        s,
                        "\n      <{tag} type=\"{}\" message=\"{}\">{}</{tag}>",
                        first.status.word().to_ascii_lowercase(),
                        xml_escape(&format!("{}: {}", first.label, first.status.word())),
                        xml_escape(&body.join("\n"))
                    );
                }
                let out: Vec<String> = entries
                    .iter()
                    .map(|e| format!("{}: {}: {}", e.label, e.status.word(), e.status.detail()))
                    .collect();
                let _ = write!(
                    s,
                    "\n      <system-out>{}</system-out>\n    ",
                    xml_escape(&out.join("\n"))
                );
            }
        }
        s.push_str("</testcase>\n");
    }
    s.push_str("  </testsuite>\n</testsuites>\n");
    s
}
