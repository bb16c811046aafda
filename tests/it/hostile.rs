//! Hostile inputs: every free-text field of a repro file, a finding and a report, filled with each
//! string of [`hostile_strings`], through every emitter (C reproducer, Markdown, terminal, repro
//! file text, file names), plus the size limits, symlinked outputs and unreadable model paths.
//!
//! **The C check.** A reproducer made from a repro file whose field holds a hostile string must be
//! the same program as the one made from the same file with a clean string, apart from string
//! literals that are meant to hold that text. Both programs go through the C preprocessor
//! (`cc -E -P -trigraphs -nostdinc`, with empty stand-ins for the headers so only the program's
//! own text is compared; `-trigraphs` so `??/` counts as the backslash it is in strict C), which
//! removes comments, runs any `#include`/`#define` that escaped a comment and fails on an
//! unterminated comment or literal. The outputs are split into tokens: string and character
//! literals (decoded: escapes turned back into bytes) and whitespace-separated runs of anything
//! else. Comment-only fields (`kind`, `target`) must give the clean token list exactly; the
//! model path, which the program holds as a string literal, must give the clean list with that
//! one literal decoding to the hostile bytes. So a hostile string that ended a comment, started
//! a preprocessor line, broke a literal or smuggled a NUL would add, drop or change a token, and
//! any extra definition would change the expansion. Text outside the program (comments) is not
//! compared: it is the one place user text is allowed to differ.
//!
//! **The Python check** (mlx-lm reproducers): the same, with Python's own parser
//! (`ast.dump`, which leaves comments out) in place of the preprocessor.
//!
//! **Markdown and terminal.** A report with a hostile field renders with the same line structure
//! as the clean one (headings, table rows, list items, fences on the same lines), every table
//! keeps its column count, no `<` appears outside code spans that the clean report lacks, and the
//! terminal text carries no control character but its newlines.

use std::path::Path;
use std::process::Command;

use libtest_mimic::Trial;
use serde_json::{json, Value};

use kvaudit::outputs::c_repro::{emit_c, parse_input};
use kvaudit::outputs::repro::{safe_file_name, write_output, Repro, MAX_REPRO_BYTES};
use kvaudit::records::report::{check_markdown_tables, Report};

/// The hostile strings, by name: comment terminators, preprocessor lines after newlines,
/// quotes, backslashes and line splices, trigraphs, NUL and terminal controls, bidirectional
/// overrides, Markdown table and HTML syntax, and 100 KB of text.
pub fn hostile_strings() -> Vec<(&'static str, String)> {
    let mut v: Vec<(&'static str, String)> = [
        ("comment_end", "x */ int injected = 1; /* y"),
        ("comment_end_at_end", "x */"),
        ("comment_start", "/* x"),
        ("line_comment", "x // y"),
        ("newline_include", "x\n#include \"/etc/passwd\"\ny"),
        ("newline_define", "*/\n#define llama_decode(...) 0\n/*"),
        ("crlf_define", "x\r\n#define main evil\r\n"),
        ("quote", "x\"); system(\"id\"); (\""),
        ("single_quote", "x'y'"),
        ("backslash_end", "x\\"),
        ("backslash_newline", "x */ \\\n#define Y 1"),
        ("trigraph_splice", "x ??/\n#define T 1"),
        ("trigraphs", "??' ??( ??) ??/\" ??= ??! ??< ??> ??-"),
        ("star_slash_split", "*\n/"),
        ("nul", "x\0y */ z"),
        ("terminal_controls", "\x1b[2J\x1b]0;pwned\x07\r\x08\t\x7f"),
        ("c1_csi", "\u{9b}31m red \u{85} next"),
        ("bidi", "a\u{202e}evil\u{2066}b\u{2069}"),
        ("unicode", "ünïcødé 🦀 \u{feff} \u{2028} line"),
        ("markdown_pipe", "a | b | c"),
        (
            "markdown_html",
            "<script>alert(1)</script><img src=x onerror=alert(1)>",
        ),
        ("markdown_backticks", "``` `code` ``` ` <b>x</b>"),
        ("markdown_heading", "\n# Fake heading\n| fake | row |\n"),
        (
            "markdown_link",
            "[click](javascript:alert(1)) *em* _u_ &amp; \\",
        ),
        ("path_traversal", "../../etc/passwd"),
    ]
    .iter()
    .map(|(n, s)| (*n, s.to_string()))
    .collect();
    v.push(("long_100kb", "*/ x\n".repeat(20_000)));
    v
}

pub fn trials() -> Vec<Trial> {
    let run = |f: fn() -> Result<(), String>| move || f().map_err(Into::into);
    vec![
        Trial::test(
            "hostile::c_reproducer_is_the_same_program",
            run(c_reproducer_is_the_same_program),
        ),
        Trial::test(
            "hostile::python_reproducer_is_the_same_program",
            run(python_reproducer_is_the_same_program),
        ),
        Trial::test(
            "hostile::mlx_bug_report_keeps_its_layout",
            run(mlx_bug_report_keeps_its_layout),
        ),
        Trial::test(
            "hostile::markdown_and_terminal_keep_their_layout",
            run(markdown_and_terminal_keep_their_layout),
        ),
        Trial::test(
            "hostile::bug_report_keeps_its_layout",
            run(bug_report_keeps_its_layout),
        ),
        Trial::test(
            "hostile::explain_svg_stays_one_clean_document",
            run(explain_svg_stays_one_clean_document),
        ),
        Trial::test(
            "hostile::repro_files_refuse_or_round_trip",
            run(repro_files_refuse_or_round_trip),
        ),
        Trial::test(
            "hostile::file_names_stay_in_their_folder",
            run(file_names_stay_in_their_folder),
        ),
        Trial::test(
            "hostile::outputs_are_not_written_through_symlinks",
            run(outputs_are_not_written_through_symlinks),
        ),
        Trial::test(
            "hostile::oversized_inputs_are_refused_before_reading",
            run(oversized_inputs_are_refused_before_reading),
        ),
        Trial::test(
            "hostile::unreadable_model_paths_are_one_line_errors",
            run(unreadable_model_paths_are_one_line_errors),
        ),
    ]
}

/// A real repro file from the corpus, as JSON.
fn base_repro() -> Value {
    let path = super::root().join("corpora/i1_seq_cp_twice_stale_max.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

// ---------------------------------------------------------------------------------------------
// C reproducers

/// A token of preprocessed C: a decoded string or character literal, or a whitespace-separated
/// run of other characters.
#[derive(Clone, Debug, PartialEq)]
enum Token {
    Literal(char, Vec<u8>),
    Other(String),
}

/// Decodes the escapes of a C literal's body.
fn decode_escapes(body: &str) -> Result<Vec<u8>, String> {
    let b = body.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let c = *b.get(i + 1).ok_or("a literal ends in a backslash")?;
        i += 2;
        match c {
            b'0'..=b'7' => {
                let mut v = u32::from(c - b'0');
                let mut k = 0;
                while k < 2 && i < b.len() && (b'0'..=b'7').contains(&b[i]) {
                    v = v * 8 + u32::from(b[i] - b'0');
                    i += 1;
                    k += 1;
                }
                out.push(u8::try_from(v).map_err(|_| "octal escape over 255")?);
            }
            b'n' => out.push(b'\n'),
            b't' => out.push(b'\t'),
            b'r' => out.push(b'\r'),
            b'\\' | b'"' | b'\'' | b'?' => out.push(c),
            other => return Err(format!("unexpected escape \\{}", other as char)),
        }
    }
    Ok(out)
}

/// Splits preprocessed C into tokens; an unterminated literal is an error.
fn tokens(pre: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut chars = pre.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if c == '"' || c == '\'' {
            if !word.is_empty() {
                out.push(Token::Other(std::mem::take(&mut word)));
            }
            let mut escaped = false;
            let mut end = None;
            for (j, d) in chars.by_ref() {
                if d == '\n' {
                    break;
                }
                if !escaped && d == c {
                    end = Some(j);
                    break;
                }
                escaped = !escaped && d == '\\';
            }
            let end = end.ok_or_else(|| format!("unterminated literal at byte {start}"))?;
            out.push(Token::Literal(c, decode_escapes(&pre[start + 1..end])?));
        } else if c.is_whitespace() {
            if !word.is_empty() {
                out.push(Token::Other(std::mem::take(&mut word)));
            }
        } else {
            word.push(c);
        }
    }
    if !word.is_empty() {
        out.push(Token::Other(word));
    }
    Ok(out)
}

/// Empty stand-ins for the headers the program includes, so the preprocessor output is the
/// program's own text.
fn header_stubs() -> Result<tempfile::TempDir, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    for h in ["stdint.h", "stdio.h", "stdlib.h", "string.h", "llama.h"] {
        std::fs::write(dir.path().join(h), "").map_err(|e| e.to_string())?;
    }
    Ok(dir)
}

/// `cc -E -P` of `program`: the tokens, or the compiler's complaint.
fn preprocess(program: &str, stubs: &Path) -> Result<Vec<Token>, String> {
    let src = stubs.join("repro.c");
    std::fs::write(&src, program).map_err(|e| e.to_string())?;
    let out = Command::new("cc")
        .args(["-E", "-P", "-trigraphs", "-nostdinc", "-I"])
        .arg(stubs)
        .arg(&src)
        .output()
        .map_err(|e| format!("this test needs a C compiler (`cc`) on PATH: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "the preprocessor rejects the program: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    tokens(&String::from_utf8_lossy(&out.stdout))
}

/// The first difference between two token lists, for a failure message.
fn first_difference(a: &[Token], b: &[Token]) -> String {
    let i = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    format!(
        "token {i}: clean {:?}, hostile {:?} ({} vs {} tokens)",
        a.get(i),
        b.get(i),
        a.len(),
        b.len()
    )
}

fn c_reproducer_is_the_same_program() -> Result<(), String> {
    let stubs = header_stubs()?;
    let base = base_repro();
    // No path reaches the program (it opens `argv[1]` or a relative file named by the
    // architecture, `c_repro::default_model_file`): the input's free text is all there is.
    let emit = |v: &Value| -> Result<String, String> { Ok(emit_c(&parse_input(&v.to_string())?)) };
    let clean = preprocess(&emit(&base)?, stubs.path())?;
    let mut failures = Vec::new();
    for (name, text) in hostile_strings() {
        // Comment-only fields: the program must not change at all.
        let mut fields: Vec<(&str, Value)> = Vec::new();
        let mut v = base.clone();
        v["kind"] = json!(text);
        fields.push(("kind", v));
        let mut v = base.clone();
        v["target"] = json!(text);
        fields.push(("target", v));
        let mut v = base.clone();
        v["target"] = json!({ "name": text, "faults": [text] });
        fields.push(("target object", v));
        for (field, v) in fields {
            let program = emit(&v)?;
            match preprocess(&program, stubs.path()) {
                Ok(t) if t == clean => {}
                Ok(t) => failures.push(format!(
                    "{name} in {field}: another program: {}",
                    first_difference(&clean, &t)
                )),
                Err(e) => failures.push(format!("{name} in {field}: {e}")),
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} hostile C reproducers:\n{}",
            failures.len(),
            failures.join("\n")
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Python reproducers (mlx-lm)

/// A finding on mlx-lm, as JSON.
fn base_mlx_repro() -> Value {
    let path = super::root().join("tests/data/py_repro/i1_concatenate_trim_keeps_state.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// The hostile strings, and what would run as Python after a newline or a carriage return
/// (both end a line of Python source) or close a string literal.
fn python_hostile_strings() -> Vec<(&'static str, String)> {
    let mut v = hostile_strings();
    v.push(("py_newline_code", "x\nimport os; os.system('id')\n".into()));
    v.push(("py_cr_code", "x\rprint('pwned'); sys.exit(0)".into()));
    v.push(("py_string_close", "\"); sys.exit(0); (\"".into()));
    v.push((
        "py_triple_quote",
        "'''\"\"\"\nsys.exit(0)\n\"\"\"'''".into(),
    ));
    v
}

/// The program as Python's own parser reads it (`ast.dump`: comments are not part of it), by
/// the machine's python3.
fn python_ast(program: &str) -> Result<String, String> {
    use std::io::Write as _;
    let python = kvaudit::targets::python::python3().map_err(|e| e.to_string())?;
    let mut child = Command::new(python)
        .args([
            "-c",
            "import ast, sys; print(ast.dump(ast.parse(sys.stdin.buffer.read())))",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("python3: {e}"))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(program.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "does not parse: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// **The Python check.** A Python reproducer made from a finding whose free-text fields (kind,
/// target) hold a hostile string is the same program, as Python's parser reads it, as the one
/// made with clean text: comments are the only place the text may go. Its source holds no
/// character outside printable ASCII but its newlines. A hostile engine setting or a
/// non-integer in `expected` never reaches the program (refused, or dropped).
fn python_reproducer_is_the_same_program() -> Result<(), String> {
    use kvaudit::outputs::py_repro::{emit_py, parse_input};
    let base = base_mlx_repro();
    let emit = |v: &Value| -> Result<String, String> {
        emit_py(&parse_input(&v.to_string())?).map_err(|e| e.to_string())
    };
    let clean_program = emit(&base)?;
    let clean = python_ast(&clean_program)?;
    let mut failures = Vec::new();
    for (name, text) in python_hostile_strings() {
        let mut fields: Vec<(&str, Value)> = Vec::new();
        let mut v = base.clone();
        v["kind"] = json!(text);
        fields.push(("kind", v));
        let mut v = base.clone();
        v["target"] = json!(text);
        fields.push(("target", v));
        let mut v = base.clone();
        v["target"] = json!({ "name": text, "faults": [text] });
        fields.push(("target object", v));
        let mut v = base.clone();
        v["repro"] = json!(text);
        v["postmortem"] = json!(text);
        v["expected"]["cells"] = json!([0, text, 6]);
        fields.push(("repro, postmortem, expected", v));
        for (field, v) in fields {
            let program = emit(&v)?;
            if let Some(c) = program
                .chars()
                .find(|c| *c != '\n' && !(' '..='~').contains(c))
            {
                failures.push(format!(
                    "{name} in {field}: U+{:04X} in the source",
                    c as u32
                ));
            }
            match python_ast(&program) {
                Ok(t) if t == clean => {}
                Ok(_) => failures.push(format!("{name} in {field}: another program")),
                Err(e) => failures.push(format!("{name} in {field}: {e}")),
            }
        }
        let mut v = base.clone();
        v["trace"]["setup"]["engine"]["cache"] = json!(text);
        if let Ok(input) = parse_input(&v.to_string()) {
            failures.push(format!(
                "{name} as engine.cache: accepted ({:?})",
                input.trace.setup.engine
            ));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} hostile Python reproducers:\n{}",
            failures.len(),
            failures.join("\n")
        ))
    }
}

/// A report of a finding on mlx-lm with a hostile field keeps the clean report's layout, and
/// its program and exit code read back.
fn mlx_bug_report_keeps_its_layout() -> Result<(), String> {
    use kvaudit::outputs::bug_report::CheckedProgram;
    use kvaudit::outputs::mlx_bug_report::{bug_report, program_and_status};
    let program = "import sys\nsys.exit(1)\n";
    let render = |r: &Repro| {
        let checked = CheckedProgram {
            pin: r.targets[0].target.clone(),
            status: 1,
        };
        bug_report(r, program, Some(&checked))
    };
    let edits: [ReproEdit; 6] = [
        ("repro", |r, t| r.repro = t.into()),
        ("postmortem", |r, t| r.postmortem = t.into()),
        ("kind", |r, t| r.kind = t.into()),
        ("target", |r, t| r.targets[0].target = format!("mlx-lm@{t}")),
        ("observed", |r, t| r.observed = json!({ "crash": t })),
        ("expected", |r, t| r.expected = json!({ "note": t })),
    ];
    let base = || Repro::parse(&base_mlx_repro().to_string()).expect("the file parses");
    let mut failures = Vec::new();
    for (name, text) in python_hostile_strings() {
        for (field, edit) in edits {
            let mut clean_repro = base();
            edit(&mut clean_repro, "plain text");
            let clean = render(&clean_repro);
            check_markdown_tables(&clean)?;
            let mut r = base();
            edit(&mut r, &text);
            let md = render(&r);
            let mut problems = Vec::new();
            if let Err(e) = check_markdown_tables(&md) {
                problems.push(e.message);
            }
            if line_kinds(&md) != line_kinds(&clean) {
                problems.push("other lines than the clean report".into());
            }
            if outside_code(&md).matches('<').count() != outside_code(&clean).matches('<').count() {
                problems.push("another count of `<` outside code".into());
            }
            if program_and_status(&md) != Some((program.into(), Some(1))) {
                problems.push("the program or its exit code reads back otherwise".into());
            }
            if !problems.is_empty() {
                failures.push(format!("{name} in {field}: {}", problems.join("; ")));
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} hostile mlx-lm bug reports:\n{}",
            failures.len(),
            failures.join("\n")
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Markdown and terminal

/// A real report with a finding: the depth-3 seed audit of `native[refcount]` (its timing zeroed,
/// so the `report_json` fuzz seed made from it is the same on every run).
pub fn base_report() -> Result<Value, String> {
    use kvaudit::base::domain::Domain;
    use kvaudit::engines::explore::{run_exhaustive, ExhaustiveConfig};
    use kvaudit::records::report::Shard;
    use kvaudit::targets::registry::TargetSpec;
    let a = TargetSpec::new("native", &["refcount".into()]).factory()?;
    let cfg = ExhaustiveConfig {
        domain: Domain::preset("seed").unwrap(),
        depth: 3,
        shard: Shard::WHOLE,
        threads: 1,
        batch: 1024,
        oracles: kvaudit::oracles::Registry::builtin(),
    };
    let mut report =
        run_exhaustive(&cfg, a.as_ref(), None, &mut |_| {}).map_err(|e| e.to_string())?;
    if report.findings.is_empty() {
        return Err("the depth-3 seed audit of native[refcount] found nothing".into());
    }
    report.target.model = Some("model.gguf".into());
    report.timing = Default::default();
    serde_json::to_value(&report).map_err(|e| e.to_string())
}

/// What each line of Markdown is: heading level, table row, list item, fence, blank or text.
fn line_kinds(md: &str) -> Vec<String> {
    md.lines()
        .map(|l| {
            if l.starts_with('#') {
                format!("h{}", l.chars().take_while(|&c| c == '#').count())
            } else if l.starts_with('|') {
                "row".into()
            } else if l.starts_with("- ") {
                "item".into()
            } else if l.starts_with("```") {
                "fence".into()
            } else if l.trim().is_empty() {
                "blank".into()
            } else {
                "text".into()
            }
        })
        .collect()
}

/// The text of `md` outside fenced blocks and code spans (CommonMark: a run of N backticks opens
/// a span that the next run of exactly N backticks closes; an unmatched run is literal text).
fn outside_code(md: &str) -> String {
    let mut out = String::new();
    let mut in_fence = false;
    for line in md.lines() {
        if line.starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let b = line.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] != b'`' {
                let next = line[i..].find('`').map_or(b.len(), |k| i + k);
                out.push_str(&line[i..next]);
                i = next;
                continue;
            }
            let run = b[i..].iter().take_while(|&&c| c == b'`').count();
            let mut j = i + run;
            let mut close = None;
            while j < b.len() {
                if b[j] == b'`' {
                    let r = b[j..].iter().take_while(|&&c| c == b'`').count();
                    if r == run {
                        close = Some(j + r);
                        break;
                    }
                    j += r;
                } else {
                    j += 1;
                }
            }
            match close {
                Some(end) => i = end,
                None => {
                    out.push_str(&line[i..i + run]);
                    i += run;
                }
            }
        }
        out.push('\n');
    }
    out
}

fn markdown_and_terminal_keep_their_layout() -> Result<(), String> {
    let base = base_report()?;
    let render = |v: &Value| -> Result<(String, String), String> {
        let r = Report::parse(&v.to_string())?;
        Ok((r.to_markdown(), r.to_terminal()))
    };
    let (clean_md, clean_term) = render(&base)?;
    check_markdown_tables(&clean_md)?;
    let clean_kinds = line_kinds(&clean_md);
    let clean_lt = outside_code(&clean_md).matches('<').count();
    let mut failures = Vec::new();
    for (name, text) in hostile_strings() {
        let edits: [(&str, fn(&mut Value, &str)); 8] = [
            ("target.name", |v, t| v["target"]["name"] = json!(t)),
            ("target.version", |v, t| v["target"]["version"] = json!(t)),
            ("target.model", |v, t| v["target"]["model"] = json!(t)),
            ("target.faults", |v, t| v["target"]["faults"] = json!([t])),
            ("domain.name", |v, t| v["domain"]["name"] = json!(t)),
            ("finding kind", |v, t| v["findings"][0]["kind"] = json!(t)),
            ("finding target", |v, t| {
                v["findings"][0]["target"] = json!(t)
            }),
            ("finding observed", |v, t| {
                v["findings"][0]["observed"] = json!({ "note": t })
            }),
        ];
        for (field, edit) in edits {
            let mut v = base.clone();
            edit(&mut v, &text);
            let (md, term) = match render(&v) {
                Ok(x) => x,
                Err(e) => {
                    failures.push(format!("{name} in {field}: does not parse: {e}"));
                    continue;
                }
            };
            let mut problems = Vec::new();
            if let Err(e) = check_markdown_tables(&md) {
                problems.push(e.message);
            }
            if line_kinds(&md) != clean_kinds {
                problems.push("the Markdown has other lines than the clean report".into());
            }
            let lt = outside_code(&md).matches('<').count();
            if lt != clean_lt {
                problems.push(format!(
                    "{lt} `<` outside code, the clean report has {clean_lt}"
                ));
            }
            let acts = |c: char| {
                c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
            };
            if let Some(c) = term.chars().find(|&c| c != '\n' && acts(c)) {
                problems.push(format!("U+{:04X} reaches the terminal", c as u32));
            }
            if term.lines().count() != clean_term.lines().count() {
                problems.push(format!(
                    "the terminal text has {} lines, the clean one {}",
                    term.lines().count(),
                    clean_term.lines().count()
                ));
            }
            if !problems.is_empty() {
                failures.push(format!("{name} in {field}: {}", problems.join("; ")));
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} hostile reports:\n{}",
            failures.len(),
            failures.join("\n")
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Bug reports and pictures

/// The corpus file as a value, every free-text field set by `edit` (no parsing: the emitters
/// are what is tested, and a field a file could not hold is still text they must escape).
fn hostile_repro(text: &str, edit: fn(&mut Repro, &str)) -> Repro {
    let mut r = Repro::parse(&base_repro().to_string()).expect("the corpus file parses");
    edit(&mut r, text);
    r
}

type ReproEdit = (&'static str, fn(&mut Repro, &str));

const REPRO_EDITS: [ReproEdit; 6] = [
    ("repro", |r, t| r.repro = t.into()),
    ("postmortem", |r, t| r.postmortem = t.into()),
    ("kind", |r, t| r.kind = t.into()),
    ("target", |r, t| {
        r.targets[2].target = format!("llama.cpp@{t}")
    }),
    ("observed", |r, t| r.observed = json!({ "note": t })),
    ("expected", |r, t| r.expected = json!({ "note": t })),
];

fn bug_report_keeps_its_layout() -> Result<(), String> {
    use kvaudit::outputs::bug_report::{bug_report, program_and_status, CheckedProgram};
    let program = "int main(void) { return 1; }\n";
    let render = |r: &Repro| {
        let checked = CheckedProgram {
            pin: r.targets[2].target.clone(),
            status: 1,
        };
        bug_report(r, program, Some(&checked))
    };
    let mut failures = Vec::new();
    for (name, text) in hostile_strings() {
        for (field, edit) in REPRO_EDITS {
            // The same field holding plain text: what the layout must be.
            let clean = render(&hostile_repro("plain text", edit));
            check_markdown_tables(&clean)?;
            let clean_kinds = line_kinds(&clean);
            let clean_lt = outside_code(&clean).matches('<').count();
            let md = render(&hostile_repro(&text, edit));
            let mut problems = Vec::new();
            if let Err(e) = check_markdown_tables(&md) {
                problems.push(e.message);
            }
            if line_kinds(&md) != clean_kinds {
                problems.push("other lines than the clean report".into());
            }
            let lt = outside_code(&md).matches('<').count();
            if lt != clean_lt {
                problems.push(format!(
                    "{lt} `<` outside code, the clean report has {clean_lt}"
                ));
            }
            if program_and_status(&md) != Some((program.into(), Some(1))) {
                problems.push("the program or its exit code reads back otherwise".into());
            }
            if !problems.is_empty() {
                failures.push(format!("{name} in {field}: {}", problems.join("; ")));
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} hostile bug reports:\n{}",
            failures.len(),
            failures.join("\n")
        ))
    }
}

fn explain_svg_stays_one_clean_document() -> Result<(), String> {
    use kvaudit::outputs::explain::{explain_repro, to_svg};
    use kvaudit::targets::registry::TargetSpec;
    let spec = TargetSpec::new("native", &["refcount".into()]);
    let mut clean =
        explain_repro(&hostile_repro("clean", |_, _| {}), &spec).map_err(|e| e.to_string())?;
    let shape = |svg: &str| -> Result<Vec<String>, String> {
        let doc = roxmltree::Document::parse(svg).map_err(|e| format!("not XML: {e}"))?;
        Ok(doc
            .descendants()
            .filter(|n| n.is_element())
            .map(|n| {
                let attrs: Vec<&str> = n.attributes().map(|a| a.name()).collect();
                format!("{} {}", n.tag_name().name(), attrs.join(","))
            })
            .collect())
    };
    clean.verdict = vec!["plain".into(); 3];
    let clean_shape = shape(&to_svg(&clean))?;
    let mut failures = Vec::new();
    for (name, text) in hostile_strings() {
        let mut p = clean.clone();
        p.title = text.clone();
        p.target = text.clone();
        p.verdict = vec![text.clone(); 3];
        p.frames[0].call = text.clone();
        p.frames[0].label = text.clone();
        match shape(&to_svg(&p)) {
            Ok(s) if s == clean_shape => {}
            Ok(_) => failures.push(format!("{name}: other elements or attributes")),
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} hostile pictures:\n{}",
            failures.len(),
            failures.join("\n")
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Repro files, file names, outputs, limits

fn repro_files_refuse_or_round_trip() -> Result<(), String> {
    let base = base_repro();
    let mut failures = Vec::new();
    for (name, text) in hostile_strings() {
        let edits: [(&str, fn(&mut Value, &str)); 7] = [
            ("repro", |v, t| v["repro"] = json!(t)),
            ("postmortem", |v, t| v["postmortem"] = json!(t)),
            ("since", |v, t| v["since"] = json!(t)),
            ("kind", |v, t| v["kind"] = json!(t)),
            ("targets", |v, t| v["targets"][0]["target"] = json!(t)),
            ("targets", |v, t| v["targets"][0]["faults"] = json!([t])),
            ("targets", |v, t| v["targets"][0]["kind"] = json!(t)),
        ];
        let one_line = !text.chars().any(char::is_control);
        for (field, edit) in edits {
            let mut v = base.clone();
            edit(&mut v, &text);
            match Repro::parse(&v.to_string()) {
                Ok(r) if one_line => {
                    let again = Repro::parse(&r.to_text());
                    if again.as_ref() != Ok(&r) {
                        failures.push(format!(
                            "{name} in {field}: the file text does not round-trip"
                        ));
                    }
                    if safe_file_name(&r.file_name()) != r.file_name() {
                        failures.push(format!("{name} in {field}: unsafe file name"));
                    }
                }
                Ok(_) => failures.push(format!(
                    "{name} in {field}: a control character is accepted in a one-line field"
                )),
                Err(e) if one_line => failures.push(format!("{name} in {field}: refused: {e}")),
                Err(e) if !e.message.contains(field) || e.message.chars().any(char::is_control) => {
                    failures.push(format!(
                        "{name} in {field}: the error does not name the field safely: {e:?}"
                    ))
                }
                Err(_) => {}
            }
        }
    }
    // `observed` is printed as JSON, which escapes C0 controls but not C1 ones.
    let mut v = base.clone();
    v["observed"] = json!({ "pos_max": "\u{9b}31m" });
    match Repro::parse(&v.to_string()) {
        Err(e) if e.message.contains("observed") => {}
        other => failures.push(format!("a C1 control in observed: {other:?}")),
    }
    // An error quoting a hostile value does not carry its control characters.
    let mut v = base.clone();
    v["oracle"] = json!("\u{1b}[2J\u{9b}");
    match Repro::parse(&v.to_string()) {
        Err(e) if !e.message.chars().any(char::is_control) => {}
        other => failures.push(format!("a hostile oracle name: {other:?}")),
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

fn file_names_stay_in_their_folder() -> Result<(), String> {
    let dir = Path::new("/some/dir");
    let mut names: Vec<String> = hostile_strings().into_iter().map(|(_, s)| s).collect();
    names.extend(
        [
            "..",
            ".",
            "",
            "/",
            "/etc/passwd",
            "a/../../b",
            ".hidden",
            "..\\..\\x",
            "CON",
        ]
        .map(String::from),
    );
    names.push("x".repeat(1000) + ".json");
    for n in names {
        let safe = safe_file_name(&n);
        let joined = dir.join(&safe);
        if joined.parent() != Some(dir)
            || safe.starts_with('.')
            || safe.is_empty()
            || safe.len() > 120
            || !safe
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(format!(
                "{n:?} became {safe:?}, which leaves {}",
                dir.display()
            ));
        }
    }
    if !safe_file_name(&("x".repeat(1000) + ".json")).ends_with(".json") {
        return Err("a long name loses its extension".into());
    }
    Ok(())
}

fn outputs_are_not_written_through_symlinks() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "keep").unwrap();
    let link = dir.path().join("repro.c");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let e = write_output(&link, "overwritten")
        .err()
        .ok_or("a write through a symlink succeeded")?;
    if !e.message.contains("symbolic link") || std::fs::read_to_string(&victim).unwrap() != "keep" {
        return Err(format!(
            "the symlink was followed or the error is unclear: {e}"
        ));
    }
    let plain = dir.path().join("plain.c");
    write_output(&plain, "ok")?;
    Ok(())
}

fn oversized_inputs_are_refused_before_reading() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let big = dir.path().join("big.json");
    // A sparse file: refused from its length, never read.
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(MAX_REPRO_BYTES + 1).unwrap();
    let loaders: [(&str, Box<dyn Fn(&Path) -> Result<(), String>>); 4] = [
        (
            "repro",
            Box::new(|p| Repro::load(p).map(drop).map_err(String::from)),
        ),
        (
            "C input",
            Box::new(|p| {
                kvaudit::outputs::c_repro::read_input(p)
                    .map(drop)
                    .map_err(String::from)
            }),
        ),
        (
            "report",
            Box::new(|p| Report::load(p).map(drop).map_err(String::from)),
        ),
        (
            "domain",
            Box::new(|p| {
                kvaudit::base::domain::Domain::from_file(p)
                    .map(drop)
                    .map_err(String::from)
            }),
        ),
    ];
    for (what, load) in loaders {
        match load(&big) {
            Err(e) if e.contains("limit") && e.contains("big.json") => {}
            other => return Err(format!("{what}: a 64 MiB + 1 file: {other:?}")),
        }
    }
    Ok(())
}

fn unreadable_model_paths_are_one_line_errors() -> Result<(), String> {
    use kvaudit::model::gguf::GgufFile;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let a = dir.path().join("a.gguf");
    let b = dir.path().join("b.gguf");
    std::os::unix::fs::symlink(&b, &a).unwrap();
    std::os::unix::fs::symlink(&a, &b).unwrap();
    let missing = dir.path().join("missing.gguf");
    for path in [&a, &missing, &dir.path().to_path_buf()] {
        let e = GgufFile::open(path)
            .err()
            .ok_or_else(|| format!("{} opened", path.display()))?
            .to_string();
        if e.lines().count() != 1 || !e.contains(&path.display().to_string()) {
            return Err(format!("{}: {e:?}", path.display()));
        }
        let spec = kvaudit::targets::registry::TargetSpec {
            model: Some(path.clone()),
            ..kvaudit::targets::registry::TargetSpec::new("native+tensors", &[])
        };
        let e = spec
            .factory()
            .err()
            .ok_or_else(|| format!("native+tensors on {} started", path.display()))?;
        if e.message.lines().count() != 1 {
            return Err(format!("native+tensors on {}: {e:?}", path.display()));
        }
    }
    Ok(())
}
