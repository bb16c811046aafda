//! **Crash**: the target aborted, was killed by a signal or hung while running an op. Runners
//! report how a trial ended; a crash of the target is a finding of this oracle, never an error
//! of the harness (llama.cpp runs in a worker process, so its abort does not end the audit).
//!
//! A crash while *observing* an op that returned (the whole dump, the per-sequence dumps, the
//! twin round trip, the probe) is a class of its own, `observation crash (WHAT): ...`: the op is
//! not blamed, and the worker runs the trial again without that observation, so that the oracles
//! that do not read it still judge the trial ([`crate::running::runner::ObservationCrash`]).
//!
//! On a sanitizer build (`+asan`, `+ubsan`) the crash is the sanitizer's report: its class
//! (`heap-buffer-overflow`, `signed integer overflow`, ...) and its site, the first frame in
//! llama.cpp or the shim (`llama-batch.cpp:321`), are the crash's kind ([`sanitizer_report`]),
//! so a replay compares both.

use serde_json::json;

use super::{Oracle, OracleId, PositiveControl, Reads, Seen, Violation};
use crate::base::cache::Observation;

/// What glibc's allocator prints when it finds its heap corrupted and aborts. Which of them a
/// given corruption trips depends on the heap's layout (another build of the same sources, a
/// longer string elsewhere), so they are one class.
const GLIBC_HEAP_ABORTS: [&str; 7] = [
    "double free or corruption",
    "free(): ",
    "malloc(): ",
    "realloc(): ",
    "corrupted size vs. prev_size",
    "corrupted double-linked list",
    "munmap_chunk(): invalid pointer",
];

/// The class of heap-corruption aborts ([`crash_kind`]).
pub const HEAP_CORRUPTION: &str = "SIGABRT: heap corruption (glibc's allocator aborted)";

/// The class of a crash message, for telling crash findings apart: its first line, at most 80
/// characters; every abort of glibc's allocator on a corrupted heap is one class,
/// [`HEAP_CORRUPTION`] (the exact message stays in the violation's `observed`); a sanitizer's
/// report is its class and site ([`SanitizerReport::kind`]), whole.
pub fn crash_kind(message: &str) -> String {
    let first = message.lines().next().unwrap_or("crash");
    if let Some(rest) = first.strip_prefix("SIGABRT: ") {
        if GLIBC_HEAP_ABORTS.iter().any(|m| rest.starts_with(m)) {
            return HEAP_CORRUPTION.to_string();
        }
        if SANITIZERS.iter().any(|s| rest.starts_with(s)) {
            return rest.to_string();
        }
    }
    first.chars().take(80).collect()
}

/// The sanitizers whose reports [`sanitizer_report`] reads, as their reports name them.
const SANITIZERS: [&str; 2] = ["AddressSanitizer", "UndefinedBehaviorSanitizer"];

/// What a sanitizer report says: which sanitizer, the class of the error, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SanitizerReport {
    /// `AddressSanitizer` or `UndefinedBehaviorSanitizer`.
    pub sanitizer: &'static str,
    /// The class: ASan's error name (`heap-buffer-overflow`, `heap-use-after-free`,
    /// `attempting double-free`), UBSan's runtime error up to its details (`signed integer
    /// overflow`, `load of misaligned address`).
    pub class: String,
    /// The first frame in llama.cpp, ggml or the shim, as `FILE:LINE` with the file's name
    /// only; `None` when no frame has one (a build without `-g`).
    pub site: Option<String>,
}

impl SanitizerReport {
    /// The crash message's detail: `AddressSanitizer: heap-buffer-overflow at llama-batch.cpp:321`.
    pub fn kind(&self) -> String {
        match &self.site {
            Some(site) => format!("{}: {} at {site}", self.sanitizer, self.class),
            None => format!("{}: {}", self.sanitizer, self.class),
        }
    }
}

/// The report a sanitizer printed in `stderr` (the first one), if any. ASan (gcc's libasan,
/// symbolized by its own libbacktrace or llvm-symbolizer) writes
/// `==PID==ERROR: AddressSanitizer: CLASS on address ...` and then frames
/// `#N 0xADDR in FUNCTION FILE:LINE[:COL]`; UBSan writes
/// `FILE:LINE:COL: runtime error: CLASS: details` and, with `print_stacktrace=1`, frames.
pub fn sanitizer_report(stderr: &str) -> Option<SanitizerReport> {
    let lines: Vec<&str> = stderr.lines().map(str::trim).collect();
    for (i, line) in lines.iter().enumerate() {
        if let Some(rest) = line
            .find("ERROR: AddressSanitizer: ")
            .map(|k| &line[k + "ERROR: AddressSanitizer: ".len()..])
        {
            let end = [
                " on address",
                " on unknown address",
                " on ",
                " at pc",
                " in thread",
                " (",
            ]
            .iter()
            .filter_map(|m| rest.find(m))
            .min()
            .unwrap_or(rest.len());
            return Some(SanitizerReport {
                sanitizer: SANITIZERS[0],
                class: rest[..end].trim_end_matches(':').trim().to_string(),
                site: first_source_frame(&lines[i + 1..]),
            });
        }
        // The runtime's own check, e.g. an interceptor without the real function behind it.
        if line.contains("AddressSanitizer: CHECK failed") {
            return Some(SanitizerReport {
                sanitizer: SANITIZERS[0],
                class: "CHECK failed".into(),
                site: first_source_frame(&lines[i + 1..]),
            });
        }
        if let Some(k) = line.find(": runtime error: ") {
            let details = &line[k + ": runtime error: ".len()..];
            let class = details.split(':').next().unwrap_or(details);
            let class: Vec<&str> = class
                .split(' ')
                .take_while(|w| !w.starts_with("0x"))
                .collect();
            let here = source_site(&line[..k]);
            let site = match here {
                Some((path, site)) if !outside_the_target(path) => Some(site),
                _ => first_source_frame(&lines[i + 1..]),
            };
            return Some(SanitizerReport {
                sanitizer: SANITIZERS[1],
                class: class.join(" "),
                site,
            });
        }
    }
    None
}

/// Sources that are not the target's: the sanitizer runtime, the C/C++ standard library's
/// headers (an inlined `std::vector::operator[]`), Rust.
fn outside_the_target(path: &str) -> bool {
    path.contains("libsanitizer")
        || path.contains("compiler-rt")
        || path.starts_with("/usr/")
        || path.ends_with(".rs")
}

/// `(path, "FILE:LINE")` of a location `PATH:LINE[:COL]`, the file's name only in the second.
fn source_site(location: &str) -> Option<(&str, String)> {
    let number = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    let (head, last) = location.rsplit_once(':')?;
    let (path, line) = match head.rsplit_once(':') {
        Some((path, line)) if number(line) && number(last) => (path, line),
        _ => (head, last),
    };
    if !number(line) {
        return None;
    }
    let file = path.rsplit('/').next().unwrap_or(path);
    let is_source = [".c", ".cpp", ".cc", ".h", ".hpp", ".inc"]
        .iter()
        .any(|e| file.ends_with(e));
    is_source.then(|| (path, format!("{file}:{line}")))
}

/// The site of the first stack frame (`#N 0xADDR in FUNCTION LOCATION`) in the target's sources.
fn first_source_frame(lines: &[&str]) -> Option<String> {
    lines
        .iter()
        .take_while(|l| !l.is_empty())
        .filter(|l| l.starts_with('#'))
        .filter_map(|l| source_site(l.rsplit(' ').next()?))
        .find(|(path, _)| !outside_the_target(path))
        .map(|(_, site)| site)
}

pub use crate::base::cache::OBSERVATION_CRASH;

/// The violation of a trial that crashed with `message`, while running its op, or while making
/// `observation` of what the op did.
pub fn crash_violation(message: &str, observation: Option<Observation>) -> Violation {
    match observation {
        None => Violation {
            oracle: OracleId::CRASH,
            kind: crash_kind(message),
            seq: None,
            observed: json!({ "crash": message }),
            expected: json!("the op returns"),
        },
        Some(what) => Violation {
            oracle: OracleId::CRASH,
            kind: format!(
                "{OBSERVATION_CRASH} ({}): {}",
                what.describe(),
                crash_kind(message)
            ),
            seq: None,
            observed: json!({ "crash": message, "observation": what.name() }),
            expected: json!("the op returns and is observed"),
        },
    }
}

/// The oracle, as a value ([`Oracle`]).
pub static CRASH: Oracle = Oracle {
    id: OracleId::CRASH,
    summary: "every op returns: no abort, no fatal signal, no hang",
    reads: Reads::Crash,
    kinds: &[
        "the first line of the crash message*",
        "observation crash (what was observed): the first line of the crash message*",
    ],
    positive_controls: &[
        PositiveControl {
            fault: "+assert: llama.cpp's asserts compiled in",
            target: "llama.cpp@0.1.156+assert",
            seed_depth: Some(2),
            evidence: "llama/assert_build_repeated_seq_cp_0.1.156.json",
        },
        PositiveControl {
            fault: "+asan: the shim's test hook writes one byte past a heap block at each decode (KVAUDIT_TEST_SHIM_OVERFLOW)",
            target: "llama.cpp@0.1.161+asan",
            seed_depth: None,
            evidence: "llama/sanitizer_control_asan_0.1.161.json",
        },
        PositiveControl {
            fault: "a zero hang timeout",
            target: "llama.cpp@0.1.161",
            seed_depth: None,
            evidence: "llama/hang_0.1.161.json",
        },
        PositiveControl {
            fault: "a worker hook: every whole dump dies of SIGSEGV (KVAUDIT_TEST_CRASH_OBSERVING=whole)",
            target: "llama.cpp@0.1.161",
            seed_depth: None,
            evidence: "llama/observation_crash_whole_0.1.161.json",
        },
        PositiveControl {
            fault: "a worker hook: every whole dump dies of SIGSEGV (KVAUDIT_TEST_CRASH_OBSERVING=whole)",
            target: "llama.cpp@0.1.161 (domain dsa)",
            seed_depth: None,
            evidence: "llama/observation_crash_whole_dsa_0.1.161.json",
        },
        PositiveControl {
            fault: "a worker hook: every whole dump dies of SIGSEGV (KVAUDIT_TEST_CRASH_OBSERVING=whole)",
            target: "llama.cpp@0.1.161 (domain dsv4)",
            seed_depth: None,
            evidence: "llama/observation_crash_whole_dsv4_0.1.161.json",
        },
        PositiveControl {
            fault: "a worker hook: every whole dump dies of SIGSEGV (KVAUDIT_TEST_CRASH_OBSERVING=whole)",
            target: "llama.cpp@0.1.161 (domain hybrid_idx)",
            seed_depth: None,
            evidence: "llama/observation_crash_whole_hybrid_idx_0.1.161.json",
        },
        PositiveControl {
            fault: "a worker hook: every whole dump dies of SIGSEGV (KVAUDIT_TEST_CRASH_OBSERVING=whole)",
            target: "llama.cpp@0.1.161 (domain hybrid_iswa)",
            seed_depth: None,
            evidence: "llama/observation_crash_whole_hybrid_iswa_0.1.161.json",
        },
        PositiveControl {
            fault: "a worker hook: every whole dump dies of SIGSEGV (KVAUDIT_TEST_CRASH_OBSERVING=whole)",
            target: "llama.cpp@0.1.161 (domain msa)",
            seed_depth: None,
            evidence: "llama/observation_crash_whole_msa_0.1.161.json",
        },
        PositiveControl {
            fault: "a worker hook: every whole dump dies of SIGSEGV (KVAUDIT_TEST_CRASH_OBSERVING=whole)",
            target: "llama.cpp@0.1.161 (domain dsa_iswa)",
            seed_depth: None,
            evidence: "llama/observation_crash_whole_dsa_iswa_0.1.161.json",
        },
        PositiveControl {
            fault: "llama.cpp's own abort: a partial seq_cp across streams (llama-kv-cache.cpp:524)",
            target: "llama.cpp@0.1.161 (domain msa)",
            seed_depth: None,
            evidence: "oracles/crash_msa_partial_cross_stream_seq_cp.json",
        },
        PositiveControl {
            fault: "llama.cpp's own abort: the K-shift after a seq_add (ggml-backend.cpp:345)",
            target: "llama.cpp@0.1.161 (domain dsv4)",
            seed_depth: None,
            evidence: "oracles/crash_dsv4_seq_add_aborts_in_the_k_shift.json",
        },
        PositiveControl {
            fault: "llama.cpp's own abort: a seq_add of an M-RoPE cache (llama-kv-cache.cpp:595)",
            target: "llama.cpp@0.1.161 (domain hybrid_idx)",
            seed_depth: None,
            evidence: "oracles/crash_hybrid_idx_seq_add_aborts_on_imrope.json",
        },
        PositiveControl {
            fault: "llama.cpp's own abort: the K-shift of a base cache without layers (ggml-backend.cpp:345)",
            target: "llama.cpp@0.1.161 (domain hybrid_iswa)",
            seed_depth: None,
            evidence: "oracles/crash_hybrid_iswa_k_shift_of_a_base_cache_without_layers.json",
        },
    PositiveControl { fault: "raise_in_trim", target: "mlx-lm@0.32.2[raise_in_trim]", seed_depth: None, evidence: "audits/mlx_raise_in_trim_d1.json" },
    ],
    // The message of a heap-corruption abort varies with the heap's layout: its class (the
    // kind) and the step are what a replay compares.
    observed_is_evidence: false,
    holds: Some(holds_on),
    check: violation_on,
    ..Oracle::DEFAULTS
};

fn holds_on(seen: &Seen<'_>) -> bool {
    !matches!(seen, Seen::Crash { .. })
}

fn violation_on(seen: &Seen<'_>) -> Option<Violation> {
    match seen {
        Seen::Crash {
            message,
            observation,
            ..
        } => Some(crash_violation(message, *observation)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_corruption_aborts_are_one_class_and_other_crashes_keep_their_line() {
        for m in [
            "SIGABRT: double free or corruption (out)",
            "SIGABRT: free(): invalid next size (fast)",
            "SIGABRT: malloc(): corrupted top size",
        ] {
            assert_eq!(crash_kind(m), HEAP_CORRUPTION, "{m}");
        }
        let asan = "SIGABRT: AddressSanitizer: heap-buffer-overflow at a-file-name-long-enough-to-pass-eighty-characters.cpp:321";
        assert_eq!(crash_kind(asan), &asan["SIGABRT: ".len()..]);
        let assert_line = "GGML_ASSERT(x) failed at llama-kv-cache.cpp:300";
        assert_eq!(crash_kind(assert_line), assert_line);
        assert_eq!(crash_kind("SIGSEGV"), "SIGSEGV");
    }

    #[test]
    fn a_sanitizer_report_reads_as_its_class_and_first_target_frame() {
        let asan = "\
=================================================================
==4242==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x602000000034 at pc 0x7f00 bp 0x7f01 sp 0x7f02
WRITE of size 4 at 0x602000000034 thread T0
    #0 0x7f10 in __interceptor_memset ../../../../src/libsanitizer/sanitizer_common/sanitizer_common_interceptors.inc:799
    #1 0x7f11 in std::vector<int>::operator[](unsigned long) /usr/include/c++/12/bits/stl_vector.h:1123
    #2 0x7f12 in llama_batch_allocr::init(llama_batch const&) /root/.cargo/registry/src/x/llama-cpp-sys-2-0.1.161/llama.cpp/src/llama-batch.cpp:321:29
    #3 0x7f13 in kvaudit_shim_decode /tmp/shim/kvaudit_shim.c:400
    #4 0x55 in kvaudit::targets::llama::ffi::LlamaShim::decode /work/src/targets/llama/ffi.rs:10

0x602000000034 is located 0 bytes to the right of 4-byte region
SUMMARY: AddressSanitizer: heap-buffer-overflow src/llama-batch.cpp:321 in llama_batch_allocr::init
";
        let r = sanitizer_report(asan).unwrap();
        assert_eq!(
            r.kind(),
            "AddressSanitizer: heap-buffer-overflow at llama-batch.cpp:321"
        );
        let free = "==7==ERROR: AddressSanitizer: attempting double-free on 0x6 in thread T0:\n    #0 0x1 in free (/usr/lib/x86_64-linux-gnu/libasan.so.8+0x1)\n    #1 0x2 in f /src/ggml/src/ggml.c:12\n";
        assert_eq!(
            sanitizer_report(free).unwrap().kind(),
            "AddressSanitizer: attempting double-free at ggml.c:12"
        );
        let ubsan = "/src/llama.cpp/src/llama-kv-cells.h:88:21: runtime error: signed integer overflow: 2147483647 + 1 cannot be represented in type 'int'\n";
        assert_eq!(
            sanitizer_report(ubsan).unwrap().kind(),
            "UndefinedBehaviorSanitizer: signed integer overflow at llama-kv-cells.h:88"
        );
        let misaligned = "/usr/include/c++/12/bits/stl_algobase.h:5:1: runtime error: load of misaligned address 0x55 for type 'int', which requires 4 byte alignment\n    #0 0x1 in g /src/ggml/src/ggml-cpu/ops.cpp:77\n";
        assert_eq!(
            sanitizer_report(misaligned).unwrap().kind(),
            "UndefinedBehaviorSanitizer: load of misaligned address at ops.cpp:77"
        );
        assert_eq!(sanitizer_report("GGML_ASSERT(x) failed\n"), None);
        let check = "AddressSanitizer: CHECK failed: asan_interceptors.cpp:320 \"((__interception::real___cxa_throw)) != (0)\" (0x0, 0x0) (tid=1)\n    #0 0x1 in CheckUnwind ../../../../src/libsanitizer/asan/asan_rtl.cpp:67\n    #1 0x2 in llama_io_write_host::write(void const*, unsigned long) /x/llama.cpp/src/llama-context.cpp:2709\n";
        assert_eq!(
            sanitizer_report(check).unwrap().kind(),
            "AddressSanitizer: CHECK failed at llama-context.cpp:2709"
        );
        let unsymbolized = "==1==ERROR: AddressSanitizer: heap-use-after-free on address 0x1\n    #0 0x2 (/lib/libkvaudit_shim.so+0x10)\n";
        assert_eq!(
            sanitizer_report(unsymbolized).unwrap().kind(),
            "AddressSanitizer: heap-use-after-free"
        );
    }
}
