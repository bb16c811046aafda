//! A bug report for the engine's tracker, in Markdown: a one-line summary, the llama.h contract
//! the finding breaks (quoted), the minimal trace as llama.h calls, observed against expected,
//! the standalone C program (with the exit code it had on a pin, when checked), the versions
//! that show it and those that do not, the build settings and the context's configuration;
//! and for a corpus file whose root cause has a fix (`corpora/fixes/`), the patch and what its
//! check found.
//!
//! The reader has llama.cpp, not kvaudit: nothing in the report needs kvaudit to be installed
//! (the C program needs llama.h and a GGUF model only). Text from the repro file (its summary,
//! postmortem, kind, target names) is hostile: it goes through `markdown_text` or
//! `markdown_code`; the program goes inside a fence longer than any backtick run in it.

use std::fmt::Write as _;

use super::llama_h::LlamaHClause;
use crate::base::op::{Op, Setup};
use crate::oracles::{OracleId, Registry};
use crate::outputs::c_repro::{default_model_file, model_command};
use crate::outputs::repro::{Expect, Repro};
use crate::records::report::{markdown_code, markdown_text};
use crate::targets::llama::pins::{Flag, Pin, Variant};

/// How the C program ended on a pin, for the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedProgram {
    /// The pin's label (`llama.cpp@0.1.156`).
    pub pin: String,
    /// The exit status as a shell reports it (128 + signal for a crash).
    pub status: i32,
}

/// The llama.h words the finding breaks: quoted lines, and whether llama.h states them (`false`:
/// llama.h is silent and the line says what the reference behaviour is): the oracle's
/// ([`super::llama_h::words`]).
pub fn contract_quote(repro: &Repro) -> (Vec<String>, bool) {
    let op = repro
        .trace
        .ops
        .get(repro.step.saturating_sub(1))
        .map(Op::name)
        .unwrap_or_default();
    let clause = match Registry::builtin().get(repro.oracle) {
        Some(o) => (super::llama_h::words(o.id).clause)(op, &repro.kind),
        None => LlamaHClause {
            lines: Vec::new(),
            documented: false,
        },
    };
    (clause.lines, clause.documented)
}

/// The oracle's check in plain words, for "expected".
fn what_is_checked(oracle: OracleId) -> &'static str {
    super::llama_h::words(oracle).in_words
}

/// The context configuration as a bullet list: every setting of the setup, as the C program
/// sets it (the model's architecture first: it decides the memory type).
fn configuration(setup: &Setup) -> String {
    let mut s = String::new();
    let arch = setup.arch;
    let _ = writeln!(
        s,
        "- model: `general.architecture` = `{arch}` ({} memory); `{}` writes the tiny model kvaudit ran",
        arch.memory(),
        model_command(arch)
    );
    for setting in setup.settings() {
        if let Some(fields) = setting.llama_h() {
            let line: Vec<String> = fields
                .iter()
                .map(|(field, value)| format!("`{field}` = {value}"))
                .collect();
            let _ = writeln!(s, "- {}", line.join(", "));
        }
    }
    if setup.embd_input {
        let _ = writeln!(
            s,
            "- decodes feed embeddings (`llama_batch.embd`, `n_embd` floats per token: `token_embd` of the C program), no token ids"
        );
    }
    let _ = writeln!(
        s,
        "- every other field as `llama_context_default_params()` sets it"
    );
    s
}

/// The build settings of a pin, in the words of llama.cpp's own build.
fn build_settings(label: &str) -> String {
    let Ok(pin) = Pin::parse(label) else {
        return format!("- {}\n", markdown_code(label));
    };
    let mut s = String::new();
    if let Ok(info) = pin.info() {
        let _ = writeln!(
            s,
            "- llama.cpp as vendored by the Rust crate {} version {} (`LLAMA_VERSION` {}, `GGML_VERSION` {})",
            markdown_code(&info.crate_name),
            markdown_text(&info.version),
            markdown_text(&info.llama_version),
            markdown_text(&info.ggml_version)
        );
    }
    let _ = writeln!(
        s,
        "- CPU backend only (`GGML_USE_CPU`), {}",
        build_in_words(pin.variant)
    );
    s
}

/// How a variant was built, for the report's environment list.
fn build_in_words(variant: Variant) -> String {
    let mut words = vec![if variant.has(Flag::Assert) {
        "`NDEBUG` not defined: `assert` is compiled in"
    } else {
        "a release build: `NDEBUG` defined, so `GGML_ASSERT` stays and `assert` is compiled out"
    }];
    for flag in variant.flags() {
        words.push(match flag {
            Flag::Assert => continue,
            Flag::Asan => {
                "built with AddressSanitizer (`-fsanitize=address -fno-omit-frame-pointer -g`)"
            }
            Flag::Ubsan => "built with UndefinedBehaviorSanitizer (`-fsanitize=undefined -g`)",
            Flag::Cov => {
                "its memory sources record the code they reach (`-fsanitize-coverage=trace-pc`)"
            }
        });
    }
    words.join("; ")
}

/// The C program in a fenced block whose fence no line of it can close.
pub(crate) fn fenced(lang: &str, body: &str) -> String {
    let longest = body.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    format!(
        "{fence}{lang}\n{body}{}{fence}\n",
        if body.ends_with('\n') { "" } else { "\n" }
    )
}

/// The line that states a checked program's exit code (tests read it back).
pub fn exit_code_line(c: &CheckedProgram) -> String {
    format!(
        "Checked: compiled against {} and run: exit code {}.",
        markdown_code(&c.pin),
        c.status
    )
}

/// The Markdown bug report of `repro`; `program` is its C program (written for a model given as
/// `argv[1]`), `checked` how it ended on a pin, if it was run.
pub fn bug_report(repro: &Repro, program: &str, checked: Option<&CheckedProgram>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# {}\n", markdown_text(&repro.repro));
    let pins: Vec<(String, Expect)> = repro
        .targets
        .iter()
        .filter(|t| t.target.starts_with("llama.cpp@"))
        .map(|t| (t.target.clone(), t.expect))
        .collect();
    let affected: Vec<String> = pins
        .iter()
        .filter(|(_, e)| *e == Expect::Fails)
        .map(|(p, _)| markdown_code(p))
        .collect();
    let _ = writeln!(
        s,
        "**Summary.** {} {}{} after call {} of the trace below{}.\n",
        repro.oracle,
        markdown_text(&repro.kind),
        repro
            .seq
            .map(|q| format!(" (sequence {q})"))
            .unwrap_or_default(),
        repro.step,
        if affected.is_empty() {
            String::new()
        } else {
            format!(", on {}", affected.join(", "))
        }
    );
    let (quote, documented) = contract_quote(repro);
    let _ = writeln!(
        s,
        "## {}\n",
        if documented {
            "The llama.h contract it breaks"
        } else {
            "What it does (llama.h is silent here)"
        }
    );
    // One quoted paragraph per line of llama.h (consecutive `>` lines would run together).
    let quoted: Vec<String> = quote
        .iter()
        .map(|q| format!("> {}", markdown_text(q)))
        .collect();
    let _ = writeln!(s, "{}\n", quoted.join("\n>\n"));
    if !repro.postmortem.is_empty() {
        let _ = writeln!(
            s,
            "Cause, as far as known: {}\n",
            markdown_text(&repro.postmortem)
        );
    }
    let _ = writeln!(s, "## Minimal trace (llama.h calls)\n");
    let mut calls = String::new();
    for op in &repro.trace.setup.ops {
        let _ = writeln!(calls, "setup: {op}");
    }
    for (i, op) in repro.trace.ops.iter().enumerate() {
        let mark = if i + 1 == repro.step {
            "   <- here"
        } else {
            ""
        };
        let _ = writeln!(calls, "{:>2}. {op}{mark}", i + 1);
    }
    s.push_str(&fenced("text", &calls));
    let _ = writeln!(s, "\n## Observed vs expected\n");
    let seq = repro
        .seq
        .map(|q| format!(", sequence {q}"))
        .unwrap_or_default();
    let _ = writeln!(s, "After call {}{seq}:\n", repro.step);
    let _ = writeln!(
        s,
        "- observed: {}",
        markdown_code(&repro.observed.to_string())
    );
    let _ = writeln!(
        s,
        "- expected: {}",
        markdown_code(&repro.expected.to_string())
    );
    let _ = writeln!(
        s,
        "- the check: {}\n",
        markdown_text(what_is_checked(repro.oracle))
    );
    let _ = writeln!(s, "## Reproducer (C, llama.h only)\n");
    let _ = writeln!(
        s,
        "Build against llama.cpp (`include/` and `ggml/include/` on the include path, `libllama` and `libggml*` linked) and run with a small GGUF model of architecture `{arch}` ({memory} memory; `{command}` writes the one kvaudit ran): `./repro {file}`. Exit code 1: the bug reproduces (it prints `REPRODUCED`); 0: it does not; 2: the model or context could not be set up; a crash is the crash (the shell reports 128 + the signal).\n",
        arch = repro.trace.setup.arch,
        memory = repro.trace.setup.arch.memory(),
        command = model_command(repro.trace.setup.arch),
        file = default_model_file(repro.trace.setup.arch),
    );
    match checked {
        Some(c) => {
            let _ = writeln!(s, "{}\n", exit_code_line(c));
        }
        None => {
            let _ = writeln!(s, "Not run for this report.\n");
        }
    }
    s.push_str(&fenced("c", program));
    s.push_str(&fix_section(repro));
    let _ = writeln!(s, "\n## Versions\n");
    if pins.is_empty() {
        let _ = writeln!(s, "No llama.cpp version was checked.\n");
    } else {
        let _ = writeln!(s, "| version | shows it |\n|---|---|");
        for (p, e) in &pins {
            let _ = writeln!(
                s,
                "| {} | {} |",
                markdown_code(p),
                if *e == Expect::Fails { "yes" } else { "no" }
            );
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(
        s,
        "These are the versions this trace was checked on, not a bisection: the versions between them (a version matrix) are not listed yet.\n"
    );
    let _ = writeln!(s, "## Build settings\n");
    for (p, _) in &pins {
        // Never a line that starts with user text: a code span of three backticks opens a fence.
        let _ = writeln!(s, "On {}:\n", markdown_code(p));
        s.push_str(&build_settings(p));
        let _ = writeln!(s);
    }
    let _ = writeln!(s, "## Context configuration\n");
    s.push_str(&configuration(&repro.trace.setup));
    s
}

/// "A fix": the patches of the fixes whose files include `repro` (found by its contents among
/// the corpus built in), each with its check's result; empty for a file no fix is for.
fn fix_section(repro: &Repro) -> String {
    let Ok(corpus) = crate::outputs::corpus::Corpus::built_in() else {
        return String::new();
    };
    let Some((file, _)) = corpus.files.iter().find(|(_, r)| r == repro) else {
        return String::new();
    };
    let Ok(fixes) = crate::outputs::fixes::Fix::of_file(file) else {
        return String::new();
    };
    let mut s = String::new();
    for (fix, embedded) in fixes {
        let _ = writeln!(s, "\n## A fix\n");
        let _ = writeln!(
            s,
            "Cause ({}, {}): {}. The patch below applies to llama.cpp as vendored by `llama-cpp-sys-2` {} (`patch -p1` in its `llama.cpp/`).\n",
            markdown_text(&fix.name),
            markdown_code(&fix.source),
            markdown_text(&fix.cause),
            markdown_text(&fix.applies_to.join(", "))
        );
        match fix.current_check(embedded) {
            Some(c) => {
                let _ = writeln!(
                    s,
                    "Checked on {}: {} built and this trace, with every other trace of kvaudit's regression corpus, run on it and on {}: {}.\n",
                    markdown_text(&c.date),
                    markdown_code(&c.target),
                    markdown_code(&c.against),
                    markdown_text(&c.result)
                );
            }
            None => {
                let _ = writeln!(s, "Not checked with this patch yet.\n");
            }
        }
        s.push_str(&fenced("diff", embedded.patch));
    }
    s
}

/// The pin a report's program is checked on by default: the first llama.cpp pin the file
/// expects to fail, else the first it names.
pub fn default_pin(repro: &Repro) -> Option<String> {
    let pins = || {
        repro
            .targets
            .iter()
            .filter(|t| t.target.starts_with("llama.cpp@"))
    };
    pins()
        .find(|t| t.expect == Expect::Fails)
        .or_else(|| pins().next())
        .map(|t| t.target.clone())
}

/// The C program of a report, as the report prints it (between the fences after the heading
/// "Reproducer"), and the exit code it states; for tests and scripts that check a report.
pub fn program_and_status(report: &str) -> Option<(String, Option<i32>)> {
    let after = &report[report.find("## Reproducer")?..];
    let status = after
        .lines()
        .find(|l| l.starts_with("Checked: "))
        .and_then(|l| l.rsplit("exit code ").next())
        .and_then(|n| n.trim_end_matches('.').parse().ok());
    let mut lines = after.lines();
    let fence = lines
        .find(|l| l.len() > 3 && l.ends_with('c') && l[..l.len() - 1].bytes().all(|b| b == b'`'))?
        .trim_end_matches('c')
        .to_string();
    let mut body = String::new();
    for line in lines {
        if line == fence {
            return Some((body, status));
        }
        body.push_str(line);
        body.push('\n');
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outputs::corpus::Corpus;
    use crate::outputs::fixes::Fix;

    #[test]
    fn a_report_of_a_file_a_fix_is_for_carries_the_patch_and_its_check() {
        let corpus = Corpus::built_in().unwrap();
        for (fix, embedded) in Fix::all().unwrap() {
            let repro = &corpus
                .files
                .iter()
                .find(|(n, _)| n == &fix.files[0])
                .unwrap()
                .1;
            let md = bug_report(repro, "int main(void) { return 0; }\n", None);
            let section = &md[md.find("\n## A fix\n").expect("a fix section")..];
            assert!(
                section.contains(&fenced("diff", embedded.patch)),
                "{}",
                fix.name
            );
            let checked = fix.current_check(embedded).expect("checked");
            assert!(
                section.contains(&markdown_text(&checked.result)),
                "{}",
                fix.name
            );
        }
        // A file no fix is for has no such section.
        let (name, repro) = corpus
            .files
            .iter()
            .find(|(n, _)| Fix::of_file(n).unwrap().is_empty())
            .unwrap();
        let md = bug_report(repro, "", None);
        assert!(!md.contains("## A fix"), "{name}");
    }
}
