//! Keeps the README honest: a short page that opens with the two commands a newcomer needs, the
//! test command being the one CI runs, and no relative link in README.md or docs/*.md pointing at
//! a file or heading that does not exist. Keeps docs/results.md's decision tables the corpus's:
//! the text between its markers is what `kvaudit corpus decisions --format markdown` prints. The manual lives in docs/ (nextest's README is a few lines and a
//! link); a README that grows back into a manual fails here.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use libtest_mimic::Trial;

use crate::{outcome, root};

/// The README's length limit, in lines.
const README_MAX_LINES: usize = 150;
/// Lines of prose allowed between the title and the opening code block.
const PROSE_BEFORE_COMMANDS_MAX: usize = 3;
/// How the README's first command starts: kvaudit, built in release, with its arguments after.
const CARGO_RUN: &str = "cargo run --release -- ";
/// The README's second command: every test, as `.ci/run` runs them.
const TEST_COMMAND: &str = "cargo test --release --workspace";

/// The checks, one trial each.
pub fn trials() -> Vec<Trial> {
    vec![
        Trial::test("docs::readme_is_short", || outcome(readme_is_short())),
        Trial::test("docs::readme_opens_with_the_two_commands", || {
            outcome(readme_opens_with_the_two_commands())
        }),
        Trial::test("docs::relative_links_resolve", || {
            outcome(relative_links_resolve())
        }),
        Trial::test("docs::results_decision_tables_are_the_corpus", || {
            outcome(results_decision_tables_are_the_corpus())
        }),
    ]
}

/// docs/results.md's decision tables, between their markers, are those `kvaudit corpus
/// decisions --format markdown` prints from the corpus built in.
fn results_decision_tables_are_the_corpus() -> Result<(), String> {
    use kvaudit::outputs::decisions::{committed_tables, BEGIN_MARKER, END_MARKER};
    let results = read(&root().join("docs/results.md"))?;
    let committed = committed_tables(&results).ok_or(format!(
        "docs/results.md: no {BEGIN_MARKER} ... {END_MARKER}"
    ))?;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvaudit"))
        .args(["corpus", "decisions", "--format", "markdown"])
        .output()
        .map_err(|e| e.to_string())?;
    let (generated, _) = crate::exited(&out, 0)?;
    if committed.trim() != generated.trim() {
        let differs = committed
            .lines()
            .zip(generated.lines())
            .find(|(a, b)| a != b)
            .map_or("one is longer".into(), |(a, b)| {
                format!("committed:\n{a}\ngenerated:\n{b}")
            });
        return Err(format!(
            "docs/results.md's decision tables are not the corpus's (regenerate them with \
             `kvaudit corpus decisions --format markdown`): {differs}"
        ));
    }
    Ok(())
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn readme_is_short() -> Result<(), String> {
    let n = read(&root().join("README.md"))?.lines().count();
    if n > README_MAX_LINES {
        return Err(format!(
            "README.md has {n} lines, more than {README_MAX_LINES}: move the detail into docs/"
        ));
    }
    Ok(())
}

/// The two commands of the README's opening code block, after checking what comes before it.
fn opening_commands(readme: &str) -> Result<Vec<String>, String> {
    let mut lines = readme.lines();
    match lines.next() {
        Some(title) if title.starts_with("# ") => {}
        other => {
            return Err(format!(
                "README.md must start with a `# ` title, not {other:?}"
            ))
        }
    }
    let mut prose = 0;
    for line in lines.by_ref() {
        if line.starts_with("```") {
            let commands: Vec<String> = lines
                .by_ref()
                .take_while(|l| !l.starts_with("```"))
                .filter(|l| !l.trim().is_empty())
                .map(|l| l.trim().to_string())
                .collect();
            return Ok(commands);
        }
        if line.starts_with('#') {
            return Err(format!(
                "README.md reaches heading {line:?} before its opening code block"
            ));
        }
        if !line.trim().is_empty() {
            prose += 1;
            if prose > PROSE_BEFORE_COMMANDS_MAX {
                return Err(format!(
                    "README.md has more than {PROSE_BEFORE_COMMANDS_MAX} lines of prose before its \
                     opening code block: the two commands come first"
                ));
            }
        }
    }
    Err("README.md has no code block".into())
}

fn readme_opens_with_the_two_commands() -> Result<(), String> {
    let commands = opening_commands(&read(&root().join("README.md"))?)?;
    let [main_job, tests] = commands.as_slice() else {
        return Err(format!(
            "README.md's opening code block must hold exactly two commands, not {commands:?}"
        ));
    };
    let args: Vec<&str> = match main_job.strip_prefix(CARGO_RUN) {
        Some(args) if args.starts_with("audit ") => args.split_whitespace().collect(),
        _ => {
            return Err(format!(
                "README.md's first command must run an audit (`{CARGO_RUN}audit ...`), not \
                 `{main_job}`"
            ))
        }
    };
    if tests != TEST_COMMAND {
        return Err(format!(
            "README.md's second command must be `{TEST_COMMAND}`, not `{tests}`"
        ));
    }
    // The test command is the one CI runs, so "the tests pass" means the same thing in both.
    let ci = read(&root().join(".ci/run"))?;
    if !ci.lines().any(|l| l.trim() == TEST_COMMAND) {
        return Err(format!(
            ".ci/run no longer runs `{TEST_COMMAND}`: update README.md"
        ));
    }
    // The main job works on an embedded default: run it as written (it finishes with findings,
    // exit 1, since I2 breaks by design; 2 or 3 would mean the command is wrong or broken).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvaudit"))
        .args(&args)
        .arg("--quiet")
        .output()
        .map_err(|e| format!("cannot run kvaudit: {e}"))?;
    match out.status.code() {
        Some(0 | 1) => Ok(()),
        code => Err(format!(
            "README.md's first command `{main_job}` exits with {code:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

/// README.md and every Markdown file in docs/.
fn documents() -> Result<Vec<PathBuf>, String> {
    let mut docs = vec![root().join("README.md")];
    let dir = root().join("docs");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().and_then(|e| e.to_str()) == Some("md") {
            docs.push(path);
        }
    }
    docs.sort();
    Ok(docs)
}

/// The targets of the inline links `[text](target)` of a Markdown text, outside code blocks and
/// code spans, with their line numbers.
fn link_targets(markdown: &str) -> Vec<(usize, String)> {
    let mut targets = Vec::new();
    let mut in_code_block = false;
    for (i, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code_block = !in_code_block;
            continue;
        }
        if in_code_block {
            continue;
        }
        // Code spans are text, not links: drop every other backtick-delimited piece.
        let text: String = line
            .split('`')
            .enumerate()
            .filter(|(k, _)| k % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            targets.push((i + 1, after[..end].trim().to_string()));
            rest = &after[end + 1..];
        }
    }
    targets
}

/// The anchors GitHub gives the headings of a Markdown text: lower case, spaces as hyphens,
/// punctuation other than `-` and `_` dropped, `-1`, `-2`, ... after repeats.
fn heading_anchors(markdown: &str) -> HashSet<String> {
    let mut anchors = HashSet::new();
    let mut in_code_block = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_code_block = !in_code_block;
        }
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        if in_code_block {
            continue;
        }
        let slug: String = heading
            .trim_start_matches('#')
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut anchor = slug.clone();
        let mut repeat = 0;
        while !anchors.insert(anchor.clone()) {
            repeat += 1;
            anchor = format!("{slug}-{repeat}");
        }
    }
    anchors
}

fn relative_links_resolve() -> Result<(), String> {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents()? {
        let text = read(&doc)?;
        let shown = doc
            .strip_prefix(root())
            .unwrap_or(&doc)
            .display()
            .to_string();
        for (line, target) in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap_or(&root()).join(file)
            };
            if !path.exists() {
                broken.push(format!("{shown}:{line}: {target}: no such file"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if path.extension().and_then(|e| e.to_str()) != Some("md") {
                continue;
            }
            if !heading_anchors(&read(&path)?).contains(anchor) {
                broken.push(format!("{shown}:{line}: {target}: no such heading"));
            }
        }
    }
    if checked == 0 {
        return Err("no relative link found in README.md or docs/: is the parser broken?".into());
    }
    if broken.is_empty() {
        Ok(())
    } else {
        Err(format!("broken relative links:\n{}", broken.join("\n")))
    }
}
