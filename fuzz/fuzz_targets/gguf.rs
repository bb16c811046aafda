//! libFuzzer target `gguf`: a GGUF file: the header limits, and every key and tensor of a file that opens.
//!
//! The body is `kvaudit::model::gguf::fuzz_gguf`, which `tests/it/fuzz_seeds.rs` also runs over `fuzz/seeds/gguf/` and
//! a fixed set of mutations on every `cargo test`; a crash found here goes into that folder.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kvaudit::model::gguf::fuzz_gguf(data);
});
