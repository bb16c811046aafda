//! libFuzzer target: a trace drawn by `kvaudit::engines::fuzz::FuzzTrace` (the `arbitrary` twin of the
//! proptest generator), run on the native cache and judged on every step.
//!
//! It panics when an oracle listed in `KVAUDIT_FUZZ_ORACLES` (default `I1,crash`) is violated;
//! I2 is left out by default because an interior `seq_rm` breaks it by design. Faults come from
//! `KVAUDIT_FUZZ_INJECT` (e.g. `refcount`, a positive control). The panic message holds the
//! trace as JSON: save it to a file and run `kvaudit shrink FILE` for the minimal repro.
#![no_main]

use std::cell::RefCell;

use kvaudit::engines::fuzz::FuzzTrace;
use kvaudit::running::judge::Judge;
use kvaudit::oracles::OracleId;
use kvaudit::targets::registry::TargetSpec;
use libfuzzer_sys::fuzz_target;

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

thread_local! {
    static JUDGE: RefCell<(Judge, Vec<OracleId>)> = RefCell::new({
        let faults = env_list("KVAUDIT_FUZZ_INJECT", "");
        let factory = TargetSpec::new("native", &faults)
            .factory()
            .expect("KVAUDIT_FUZZ_INJECT names known faults");
        let judge = Judge::new(factory.as_ref(), None).expect("the native target starts");
        let oracles = env_list("KVAUDIT_FUZZ_ORACLES", "I1,crash")
            .iter()
            .map(|o| OracleId::from_name(o).expect("KVAUDIT_FUZZ_ORACLES names oracles"))
            .collect();
        (judge, oracles)
    });
}

fuzz_target!(|t: FuzzTrace| {
    JUDGE.with(|cell| {
        let (judge, oracles) = &mut *cell.borrow_mut();
        let verdict = judge.run(&t.0).expect("the native target does not break");
        if let Some(v) = verdict
            .violations
            .iter()
            .find(|v| oracles.contains(&v.violation.oracle))
        {
            panic!(
                "{} at step {}\n{}\ntrace (save it and run `kvaudit shrink FILE`):\n{}",
                v.violation,
                v.step,
                t.0,
                serde_json::to_string(&t.0).expect("traces serialize")
            );
        }
    });
});
