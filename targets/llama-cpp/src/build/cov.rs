//! The `+cov` variant's part of the recipe: which llama.cpp sources are instrumented (the memory
//! code: the KV caches, the recurrent and hybrid memories, batch splitting and the context's
//! state functions; `llama-kv-cells.h` is inlined into them), with which flag, and the runtime
//! that records what they reach (`shim/kvaudit_cov.c`, compiled into the shim's
//! unit). Only these sources are instrumented, so a point means "memory code reached". And the
//! map of a built `+cov` shared object's points to source lines ([`CodeMap`]), the denominator
//! of `kvaudit coverage`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::cache::verify_file;
use crate::error::{IoContext as _, LlamaError};
use crate::pins::Flag;
use crate::shim::BuiltShim;

/// `shim/kvaudit_cov.c`, as compiled into this binary.
pub const COV_SOURCE: &str = include_str!("../../shim/kvaudit_cov.c");

/// The runtime's file name in the shim directory.
pub(super) const COV_FILE: &str = "kvaudit_cov.c";

/// gcc's basic-block callback (gcc 12 has no `trace-pc-guard`); the callback is
/// `__sanitizer_cov_trace_pc` in [`COV_SOURCE`]. Without sibling calls: gcc otherwise ends a
/// block with `jmp __sanitizer_cov_trace_pc`, whose return address is then in whichever
/// function called the instrumented one (58 of 1,804 points of a 0.1.156 fuzz run were such
/// addresses in uninstrumented callers).
/// `-g1`: the line tables `addr2line` maps points with (and nothing else of DWARF).
pub(super) const COV_FLAGS: &[&str] = &[
    "-fsanitize-coverage=trace-pc",
    "-fno-optimize-sibling-calls",
    "-g1",
];

/// Every coverage point of a `+cov` build's shared object, mapped to its source line: the
/// denominator of `kvaudit coverage`. A point is the return address of a call of
/// `__sanitizer_cov_trace_pc` (what the runtime records), found in `objdump -d`; its line is
/// `addr2line`'s for the call itself (the address before the return address).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CodeMap {
    /// Per point (sorted by offset): the source file relative to the tree and the line.
    pub points: BTreeMap<u32, SourceLine>,
    /// Every point of the shared object, those outside the tree's `src/` included (the C++
    /// library's headers inlined into the memory sources).
    pub sites: BTreeSet<u32>,
    /// The llama.cpp tree the build compiled (the files are relative to it).
    pub tree: PathBuf,
}

/// A file and line of a llama.cpp tree.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourceLine {
    /// Relative to the tree, e.g. `src/llama-kv-cache.cpp` or `src/llama-kv-cells.h`.
    pub file: String,
    /// 1-based.
    pub line: u32,
}

impl CodeMap {
    /// The map of `built` (a `+cov` build): runs `objdump` and `addr2line` on its shared object,
    /// which is checked against the manifest's sha256 first. Points whose line is outside the
    /// tree's `src/` (the C++ library's headers inlined into the memory sources) are left out.
    pub fn of_build(built: &BuiltShim) -> Result<CodeMap, LlamaError> {
        if !built.pin.variant.has(Flag::Cov) {
            return Err(LlamaError::Compile {
                what: format!("mapping the coverage points of {}", built.pin),
                message: "not a coverage build: use the `+cov` variant".into(),
            });
        }
        verify_file(
            &built.so_path,
            &built.manifest.so_sha256,
            &built.dir,
            &built.pin.label(),
        )?;
        let so = &built.so_path;
        let disassembly = tool_output(
            Command::new("objdump")
                .args(["-d", "--no-show-raw-insn"])
                .arg(so),
            "objdump -d",
        )?;
        let returns = call_returns(&disassembly, "__sanitizer_cov_trace_pc");
        let mut addr2line = Command::new("addr2line");
        addr2line.arg("-e").arg(so);
        let input: String = returns.iter().map(|r| format!("{:x}\n", r - 1)).collect();
        let lines = tool_output_with_input(&mut addr2line, "addr2line", &input)?;
        let tree = fs::canonicalize(&built.manifest.source_dir)
            .unwrap_or_else(|_| built.manifest.source_dir.clone());
        let mut points = BTreeMap::new();
        for (&ret, text) in returns.iter().zip(lines.lines()) {
            if let Some(at) = source_line(text, &tree) {
                points.insert(ret, at);
            }
        }
        Ok(CodeMap {
            points,
            sites: returns.into_iter().collect(),
            tree,
        })
    }
}

/// The address after each `call ... <callee>` of an `objdump -d` listing: the return address
/// the callee sees.
pub fn call_returns(disassembly: &str, callee: &str) -> Vec<u32> {
    let target = format!("<{callee}>");
    let address = |line: &str| -> Option<u32> {
        let (addr, _) = line.trim_start().split_once(':')?;
        u32::from_str_radix(addr, 16).ok()
    };
    let mut out = Vec::new();
    let mut pending = false;
    for line in disassembly.lines() {
        let Some(addr) = address(line) else {
            continue;
        };
        if pending {
            out.push(addr);
        }
        let mut words = line.split_whitespace();
        pending = words.any(|w| w == "call" || w == "callq") && line.trim_end().ends_with(&target);
    }
    out
}

/// `addr2line`'s `FILE:LINE[ (discriminator N)]` as a line of `tree`'s `src/`, if it is one.
pub fn source_line(text: &str, tree: &Path) -> Option<SourceLine> {
    let text = text.split(" (discriminator").next()?.trim();
    let (file, line) = text.rsplit_once(':')?;
    let line: u32 = line.parse().ok().filter(|&l| l > 0)?;
    let path = Path::new(file);
    let rel = path.strip_prefix(tree).ok()?;
    let rel = rel.to_str()?;
    rel.starts_with("src/").then(|| SourceLine {
        file: rel.to_string(),
        line,
    })
}

fn tool_output(cmd: &mut Command, what: &str) -> Result<String, LlamaError> {
    tool_output_with_input(cmd, what, "")
}

/// Runs a tool with `input` on its stdin; its stdout, or an error with what it printed.
fn tool_output_with_input(
    cmd: &mut Command,
    what: &str,
    input: &str,
) -> Result<String, LlamaError> {
    use std::io::Write as _;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context_io(|| format!("starting {what} (binutils)"))?;
    let mut stdin = child.stdin.take().expect("piped");
    let input = input.to_string();
    // Written from a thread: the tool's stdout fills while it reads.
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child
        .wait_with_output()
        .context_io(|| format!("running {what}"))?;
    let _ = writer.join();
    if !out.status.success() {
        return Err(LlamaError::Command {
            what: what.to_string(),
            status: out.status.to_string(),
            output: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::super::recipe::is_memory_source;
    use super::*;

    #[test]
    fn the_memory_sources_are_instrumented_and_nothing_else() {
        for rel in [
            "src/llama-kv-cache.cpp",
            "src/llama-kv-cache-iswa.cpp",
            "src/llama-kv-cache-unified.cpp",
            "src/llama-memory-recurrent.cpp",
            "src/llama-memory-hybrid.cpp",
            "src/llama-memory.cpp",
            "src/llama-batch.cpp",
            "src/llama-context.cpp",
        ] {
            assert!(is_memory_source(rel), "{rel}");
        }
        for rel in [
            "src/llama-model.cpp",
            "src/llama-graph.cpp",
            "src/models/llama.cpp",
            "src/llama-kv-cells.h",
            "ggml/src/ggml.c",
        ] {
            assert!(!is_memory_source(rel), "{rel}");
        }
    }

    #[test]
    fn call_sites_are_the_addresses_after_the_calls() {
        let listing = "\
  3af40:\tpush   %rbp
  3af46:\tcall   3caa70 <__sanitizer_cov_trace_pc>
  3af4b:\tmov    %rbx,%rdi
  3af50:\tcall   3c0000 <other>
  3af55:\tcall   3caa70 <__sanitizer_cov_trace_pc>
  3af5a:\tret
";
        assert_eq!(
            call_returns(listing, "__sanitizer_cov_trace_pc"),
            vec![0x3af4b, 0x3af5a]
        );
    }

    #[test]
    fn lines_outside_the_trees_src_are_left_out() {
        let tree = Path::new("/t/llama.cpp");
        assert_eq!(
            source_line(
                "/t/llama.cpp/src/llama-kv-cells.h:120 (discriminator 2)",
                tree
            ),
            Some(SourceLine {
                file: "src/llama-kv-cells.h".into(),
                line: 120
            })
        );
        assert_eq!(
            source_line("/usr/include/c++/12/bits/stl_vector.h:1123", tree),
            None
        );
        assert_eq!(source_line("??:0", tree), None);
        assert_eq!(source_line("/t/llama.cpp/ggml/src/ggml.c:7", tree), None);
    }
}
