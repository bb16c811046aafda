//! libFuzzer target: a trace drawn by `kvaudit::engines::fuzz::FuzzTrace` (the `arbitrary` twin of the
//! proptest generator), run on the native cache and judged on every step. The body is
//! `kvaudit::engines::fuzz::fuzz_trace` (its docs: `KVAUDIT_FUZZ_ORACLES`, `KVAUDIT_FUZZ_INJECT`);
//! `tests/it/fuzz_seeds.rs` runs it over `fuzz/seeds/trace/`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kvaudit::engines::fuzz::fuzz_trace(data);
});
