//! libFuzzer target `seq_state`: the bytes of `llama_state_seq_get_data`, in both state formats.
//!
//! The body is `kvaudit::base::state::fuzz_seq_state`, which `tests/it/fuzz_seeds.rs` also runs over `fuzz/seeds/seq_state/` and
//! a fixed set of mutations on every `cargo test`; a crash found here goes into that folder.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kvaudit::base::state::fuzz_seq_state(data);
});
