//! libFuzzer target `domain_toml`: a domain file (TOML): limits on its size, setup and op count.
//!
//! The body is `kvaudit::base::domain::fuzz_domain_toml`, which `tests/it/fuzz_seeds.rs` also runs over `fuzz/seeds/domain_toml/` and
//! a fixed set of mutations on every `cargo test`; a crash found here goes into that folder.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kvaudit::base::domain::fuzz_domain_toml(data);
});
