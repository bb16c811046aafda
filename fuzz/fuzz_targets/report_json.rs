//! libFuzzer target `report_json`: a JSON report read back (`kvaudit merge`): limits, then the terminal and Markdown
//! renderings (no control characters; tables keep their columns).
//!
//! The body is `kvaudit::records::report::fuzz_report_json`, which `tests/it/fuzz_seeds.rs` also runs over `fuzz/seeds/report_json/` and
//! a fixed set of mutations on every `cargo test`; a crash found here goes into that folder.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    kvaudit::records::report::fuzz_report_json(data);
});
