//! libFuzzer target `worker_wire`: a line of the worker wire, as a request and as a reply.
//!
//! The body is `kvaudit::targets::llama::worker::wire::fuzz_worker_wire`, which `tests/it/fuzz_seeds.rs` also runs over `fuzz/seeds/worker_wire/` and
//! a fixed set of mutations on every `cargo test`; a crash found here goes into that folder.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kvaudit::targets::llama::worker::wire::fuzz_worker_wire(data);
});
