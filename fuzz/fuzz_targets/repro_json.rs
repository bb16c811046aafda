//! libFuzzer target `repro_json`: a repro file or a reproducer input (JSON): parse limits, the repro round trip, and the C
//! emitter's escaping (the program keeps its shape whatever the free text).
//!
//! The body is `kvaudit::outputs::c_repro::fuzz_repro_json`, which `tests/it/fuzz_seeds.rs` also runs over `fuzz/seeds/repro_json/` and
//! a fixed set of mutations on every `cargo test`; a crash found here goes into that folder.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kvaudit::outputs::c_repro::fuzz_repro_json(data);
});
