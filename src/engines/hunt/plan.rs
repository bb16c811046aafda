//! A hunt's plan: what the target can run, as entries. Every preset (each with the memory type
//! its architecture selects), the caches users run into that no preset makes (full and
//! fragmented, small per-stream contexts, long decodes split into ubatches, streams with
//! multi-sequence batches on every memory type, both `swa_full` settings), and configuration
//! pairs; each entry with every oracle of the registry that can judge it and, on a target other
//! than the native model, the differential against `native` (which models every memory type,
//! `targets/native-kv/src/memory.rs`). The target's refusals are probed, not assumed: an entry
//! whose setup it refuses stays in the plan as unsupported.
//!
//! A target that declares its own entries gets its own plan ([`engine_plan`]): mlx-lm its cache
//! classes (`targets::mlx::HUNT_CONFIGURATIONS`), the reference worker the entries above its
//! cache runs (`targets::python::REFERENCE_HUNT_ENTRIES`); each entry with the oracles whose
//! observations the target declares, and without the op kinds it lacks.

use std::time::Instant;

use crate::base::cache::Observe;
use crate::base::config::Arch;
use crate::base::domain::{Domain, PRESETS, PRESET_SUMMARIES};
use crate::base::error::Error;
use crate::base::op::{Decode, ForeignDump, Op, SeqId, Setup, Slot, Trace};
use crate::base::op_kind::OpKind;
use crate::oracles::{Oracle, Reads, Registry};
use crate::records::hunt::{Pairing, PlanEntry, Support};
use crate::running::judge::Judge;
use crate::running::runner::{reconfigured_factory, RunnerFactory};
use crate::targets::mlx::{self, HuntConfiguration};
use crate::targets::registry::{TargetKind, TargetSpec};
use crate::targets::{native, python};

/// The configurations each memory type's base preset is paired with (`--vs-config`), beyond
/// those every memory type gets ([`PAIRS_EVERYWHERE`]).
const PAIRS_PER_PRESET: [(&str, &str); 2] = [
    // The quantized cache against an f16 one on the same model (llama_hd64: the tiny llama
    // model's heads of 16 are too narrow for q8_0 blocks of 32).
    ("quant", "type_k=f16,type_v=f16"),
    ("iswa", "swa_full=true"),
];

/// Configurations every memory type's base preset is paired with: one stream per sequence,
/// one-token ubatches, flash attention.
const PAIRS_EVERYWHERE: [&str; 3] = ["kv_unified=false", "n_ubatch=1", "flash_attn=on"];

/// The preset that runs each memory type's architecture.
fn base_preset(arch: Arch) -> &'static str {
    match arch {
        Arch::Llama => "seed",
        Arch::Gemma2 => "iswa",
        Arch::Mamba => "recurrent",
        Arch::Jamba => "hybrid",
        Arch::Lfm2 => "rollback",
        Arch::Lfm2Swa => "hybrid_iswa",
        Arch::MinimaxM3 => "msa",
        Arch::Qwen4exp => "hybrid_idx",
        Arch::Deepseek4 => "dsv4",
        Arch::GlmDsa => "dsa",
        Arch::Deepseek32 => "dsa_full",
        Arch::Dots3note => "dsa_iswa",
        Arch::LlamaHd64 => "quant",
        // qwen4exp_ple runs the hybrid_idx preset on its model: the entry `hybrid_idx+ple`.
        Arch::Qwen4expPle => "hybrid_idx",
    }
}

/// A preset by name (every name of [`PRESETS`] is one).
fn preset(name: &str) -> Domain {
    Domain::preset(name).expect("a built-in preset")
}

/// `d` under `config` (`key=value,...`, as `--vs-config` takes it), renamed `id`.
fn configured(d: &Domain, id: &str, config: &str) -> Domain {
    let mut d = d.clone();
    d.name = id.into();
    d.setup = d
        .setup
        .with_config(config)
        .expect("the plan's configurations parse");
    d
}

/// The caches users run into that no preset makes, each from a preset: (id, domain, why).
fn user_caches() -> Vec<(String, Domain, String)> {
    let mut out = Vec::new();
    // Holes left by removals, then decodes that need more cells than a hole has: seq 0 fills
    // 160 of 256 cells, loses [40, 80) and [100, 140), and decodes of 24 and 60 tokens follow.
    let mut fragmented = preset("full");
    fragmented.name = "fragmented".into();
    fragmented.setup.ops = vec![
        Op::Decode(Decode::next(0, 160)),
        Op::SeqRm {
            seq: 0,
            p0: 40,
            p1: 80,
        },
        Op::SeqRm {
            seq: 0,
            p0: 100,
            p1: 140,
        },
    ];
    fragmented.ranges = vec![[30, 50], [90, 110], [150, -1], [-1, -1]];
    fragmented.decode_next = vec![1, 24, 60];
    out.push((
        "fragmented".into(),
        fragmented,
        "a fragmented cache: holes left by removals, then decodes longer than a hole".into(),
    ));
    // Four streams of 256 cells: llama.cpp pads a stream to 256 cells (`n_ctx_seq =
    // GGML_PAD(n_ctx / n_seq_max, 256)`, llama-context.cpp:297-305 in 0.1.161), so n_ctx 256
    // over 4 sequences was already 4 x 256 cells; n_ctx 1024 says so, and lets a decode exceed
    // a stream (a domain's decodes are at most n_ctx long).
    let mut small = configured(&preset("streams"), "small-ctx", "n_seq_max=4,n_ctx=1024");
    small.seqs = vec![0, 1, 2];
    // A decode of 300 tokens is one ubatch (n_ubatch 512) larger than a 256-cell stream:
    // find_slot refuses it (llama-kv-cache.cpp:1027-1029 in 0.1.161) and llama_decode returns 1.
    small.decode_next = vec![1, 30, 100, 300];
    out.push((
        "small-ctx".into(),
        small,
        "small per-stream contexts (4 streams of 256 cells) that decodes fill, and a decode larger than a stream".into(),
    ));
    let mut long = configured(&preset("batch"), "long-ubatch", "n_batch=32,n_ubatch=3");
    long.decode_next = vec![1, 7, 20];
    out.push((
        "long-ubatch".into(),
        long,
        "long decodes split into ubatches of 3".into(),
    ));
    for arch in [Arch::Gemma2, Arch::Mamba, Arch::Jamba] {
        let base = preset(base_preset(arch));
        let id = format!("{}+streams", base.name);
        let mut streams = configured(&base, &id, "kv_unified=false");
        streams.decode_shared = true;
        out.push((
            id,
            streams,
            format!(
                "{} memory with one stream per sequence and multi-sequence batches",
                arch.memory()
            ),
        ));
        let id = format!("{}+ubatch", base.name);
        // n_batch stays the default: the iswa setup decodes 250 tokens at once, and a decode
        // larger than n_batch is an abort in llama_decode, not a finding.
        let mut ubatch = configured(&base, &id, "n_ubatch=2");
        ubatch.decode_next = vec![1, 5];
        out.push((
            id,
            ubatch,
            format!("{} memory with decodes split into ubatches", arch.memory()),
        ));
    }
    // With flash attention the V cache is not transposed: saves, loads and clears of its rows
    // take other paths (`state_write_data`, `state_read_data`, `state_clear`), which no other
    // entry with state ops reaches (reports/coverage/README.md).
    out.push((
        "state+flash".into(),
        configured(&preset("state"), "state+flash", "flash_attn=on"),
        "state saves and loads of a V cache that is not transposed (flash attention)".into(),
    ));
    // Loads of dumps saved under another configuration (Setup::foreign): each a refusal
    // branch of llama_kv_cache::state_read_meta / state_read_data (llama-kv-cache.cpp:2171,
    // 2571-2683 in 0.1.161) or a load that applies (a sequence of a larger context). llama.h:
    // a load that cannot apply returns 0 (failed-restore judges what it leaves).
    let foreign_after = |slot: &str, config: &str, seq: Option<SeqId>, ops: Vec<Op>| ForeignDump {
        slot: Slot::new(slot).expect("a valid slot name"),
        config: config.into(),
        seq,
        ops,
    };
    let foreign =
        |slot: &str, config: &str, seq: Option<SeqId>| foreign_after(slot, config, seq, vec![]);
    let mut across = configured(&preset("state"), "state+foreign", "");
    across.setup.foreign = vec![
        foreign("xk", "type_k=f32", None),
        foreign("xv", "type_v=f32", None),
        foreign("xf", "flash_attn=on", None),
        foreign("xu", "kv_unified=false", None),
        foreign("xr", "arch=llama_hd64", None),
        foreign("xc", "n_ctx=512", Some(0)),
        foreign("xs", "type_k=f32", Some(0)),
    ];
    out.push((
        "state+foreign".into(),
        across,
        "loads of dumps saved under another configuration: K or V type, V layout, streams, row size (another model), a larger context".into(),
    ));
    // A quantized, rotated cache loading the dump of the same model's f16 cache: the key
    // rotation differs (n_rot_k 64 against 0, llama-kv-cache.cpp:2576).
    // With only V in f16 the key rotation agrees and the value rotation differs (n_rot_v 64
    // against 0, :2580-2582).
    let mut quant = configured(&preset("quant"), "quant+foreign", "");
    quant.setup.foreign = vec![
        foreign("xq", "type_k=f16,type_v=f16", None),
        foreign("xw", "type_v=f16", None),
    ];
    out.push((
        "quant+foreign".into(),
        quant,
        "a rotated q8_0 cache loading an f16 cache's dump of the same model, and one whose V alone is f16".into(),
    ));
    // With flash attention (V not transposed) a V of another type is refused on the untransposed
    // branch (:2629-2633), and a refused sequence load clears the V rows it wrote untransposed
    // (state_clear, :2775-2784).
    let mut flash = configured(&preset("state"), "state+flash+foreign", "flash_attn=on");
    flash.setup.foreign = vec![
        foreign("xv", "type_v=f32", None),
        foreign("xs", "type_v=f32", Some(0)),
        foreign("xk", "type_k=f32", Some(1)),
    ];
    out.push((
        "state+flash+foreign".into(),
        flash,
        "loads of dumps of another V or K type into a cache with flash attention (V not transposed)".into(),
    ));
    // A dump of another model with more layers: minimax-m3's K/V cache holds both of its
    // blocks, the llama audit model has one (mismatched layer count, :2560-2563). Apart from
    // state+foreign: a maker llama.cpp refused would make that whole entry unsupported.
    let mut layers = configured(&preset("state"), "state+foreign-layers", "");
    layers.setup.foreign = vec![
        foreign("xm", "arch=minimax-m3", None),
        foreign("xn", "arch=minimax-m3", Some(0)),
    ];
    out.push((
        "state+foreign-layers".into(),
        layers,
        "loads of dumps of a model with another layer count".into(),
    ));
    // Dumps of contexts that hold what this one cannot: a larger context's 300 more cells of
    // seq 0 (whole and seq 0: more cells than the cache, :2357-2359 and :2473-2475), and a
    // context of 8 sequences with cells of seq 5 (whole: a sequence id out of range,
    // :2504-2506).
    let mut cells = configured(&preset("state"), "state+foreign-cells", "");
    let more = vec![Op::Decode(Decode::next(0, 300))];
    cells.setup.foreign = vec![
        foreign_after("xc", "n_ctx=512", None, more.clone()),
        foreign_after("xd", "n_ctx=512", Some(0), more),
        foreign_after(
            "xi",
            "n_seq_max=8",
            None,
            vec![Op::Decode(Decode::next(5, 3))],
        ),
    ];
    out.push((
        "state+foreign-cells".into(),
        cells,
        "loads of dumps with more cells than the cache, and with a sequence id beyond n_seq_max"
            .into(),
    ));
    // The hybrid_idx preset on the qwen4exp model with a PLE layer: each decode gathers the
    // tokens before each token from the attention cache's cells (`get_prev_tokens`,
    // llama-kv-cache.cpp:1847-1908, through the context at :2954-2956), after removals, copies
    // and loads as well as in order; the recurrent state carries the PLE conv history.
    out.push((
        "hybrid_idx+ple".into(),
        configured(&preset("hybrid_idx"), "hybrid_idx+ple", "arch=qwen4exp_ple"),
        "qwen4exp with a PLE n-gram embedding: decodes that read earlier tokens back from the cache's cells".into(),
    ));
    // The same with embedding inputs (a multimodal client's chunks): the cache stands a token
    // id in for each embedding's cell ext and orders the ubatch by place
    // (llama-kv-cache.cpp:1159-1168, :1869-1896 in 0.1.161).
    out.push((
        "hybrid_idx+ple+embd".into(),
        configured(
            &preset("hybrid_idx"),
            "hybrid_idx+ple+embd",
            "arch=qwen4exp_ple,embd_input=on",
        ),
        "qwen4exp with a PLE n-gram embedding, decodes of embeddings instead of token ids".into(),
    ));
    // The iswa preset runs swa_full off with decodes that evict; llama.cpp's default is on.
    out.push((
        "iswa+swa_full".into(),
        configured(&preset("iswa"), "iswa+swa_full", "swa_full=true"),
        "iSWA memory with swa_full on (llama.cpp's default): a windowed cache that never evicts"
            .into(),
    ));
    out
}

/// The oracles of an entry: every oracle of the registry that judges observations of a run
/// with this pairing, from this setup (an oracle that has no reading of the setup's memory or
/// cache types, `Oracle::judges_setup`, would leave every trial not judged).
fn oracles_for(pairing: &Pairing, setup: &Setup) -> Registry {
    let with_vs = *pairing != Pairing::Alone;
    let setup = setup.clone();
    Registry::for_run(matches!(pairing, Pairing::Config { .. })).only(move |o| {
        o.reads().observed(with_vs) && o.reads() != Reads::Runs && o.judges_setup(&setup)
    })
}

/// A target's own plan, where it declares one (keyed by [`TargetKind`]): mlx-lm's
/// configurations, the reference worker's entries, each with the observations its worker
/// declares. `None`: the plan of llama.cpp's presets and memory types (llama.cpp and the
/// native caches).
fn engine_plan(target: &TargetSpec) -> Option<Vec<PlanEntry>> {
    match TargetKind::parse(&target.name).ok()? {
        TargetKind::Mlx => {
            let gives = mlx::declared_observations(&target.name).ok()?;
            Some(configured_plan(
                &mlx::HUNT_CONFIGURATIONS,
                gives,
                &mlx::LACKS,
            ))
        }
        TargetKind::PythonRef => Some(listed_plan(
            &python::REFERENCE_HUNT_ENTRIES,
            python::REFERENCE_OBSERVES,
            &python::REFERENCE_LACKS,
        )),
        TargetKind::Native | TargetKind::NativeTensors | TargetKind::Llama => None,
    }
}

/// `d` without the ops of the kinds a target `lacks` (only shifts have an axis of their own to
/// clear; every other kind a target has).
fn without_lacking(mut d: Domain, lacks: &[OpKind]) -> Domain {
    if lacks.contains(&OpKind::SeqAdd) {
        d.deltas.clear();
    }
    if lacks.contains(&OpKind::SeqDiv) {
        d.divisors.clear();
    }
    d
}

/// The presets and the caches users run into ([`user_caches`]): (id, domain, why).
fn caches() -> Vec<(String, Domain, String)> {
    PRESETS
        .iter()
        .zip(PRESET_SUMMARIES)
        .map(|(name, summary)| {
            debug_assert_eq!(*name, summary.0);
            (
                name.to_string(),
                preset(name),
                format!("preset: {}", summary.1),
            )
        })
        .chain(user_caches())
        .collect()
}

/// The plan of a target that runs the entries `ids` of [`caches`], each beside the native
/// model (a model of the same cache), with the oracles that judge from what it observes
/// (`gives`), without the op kinds it `lacks`.
fn listed_plan(ids: &[&str], gives: Observe, lacks: &[OpKind]) -> Vec<PlanEntry> {
    let caches = caches();
    ids.iter()
        .filter_map(|id| caches.iter().find(|(c, _, _)| c == id))
        .map(|(id, domain, why)| {
            plan_entry(
                id.clone(),
                without_lacking(domain.clone(), lacks),
                why.clone(),
                Pairing::Native,
                |o| gives_all(gives, o),
            )
        })
        .collect()
}

/// An entry judged by the oracles of [`oracles_for`] that the target can `judge`.
fn plan_entry(
    id: String,
    domain: Domain,
    why: String,
    pairing: Pairing,
    judge: impl Fn(&Oracle) -> bool,
) -> PlanEntry {
    PlanEntry {
        id,
        memory: domain.setup.arch.memory(),
        why,
        oracles: oracles_for(&pairing, &domain.setup)
            .iter()
            .filter(|o| judge(*o))
            .map(|o| o.id())
            .collect(),
        domain,
        pairing,
    }
}

/// Whether a target that observes `gives` makes every observation `o` reads: an oracle whose
/// observation the target cannot make would leave every trial "not judged". (The logits
/// vectors come with the logits probe.)
fn gives_all(gives: Observe, o: &Oracle) -> bool {
    let want = o.observes();
    let has = |w: bool, g: bool| !w || g;
    has(want.whole, gives.whole)
        && has(want.round_trip, gives.round_trip)
        && has(want.before, gives.before)
        && has(want.logits, gives.logits)
        && has(want.reload, gives.reload)
        && has(want.sizes, gives.sizes)
        && has(want.partial, gives.partial)
}

/// The plan of an engine's declared configurations: each on the `seed` preset, on the `state`
/// preset, and against itself under its `versus` configuration; alone (the native model is
/// llama.cpp's cell cache, not this engine's), each with the oracles that judge its setup from
/// what the target observes (`gives`); without the shifts of the op kinds it `lacks`.
fn configured_plan(
    configurations: &[HuntConfiguration],
    gives: Observe,
    lacks: &[OpKind],
) -> Vec<PlanEntry> {
    let entry = |id: String, domain: Domain, why: String, pairing: Pairing| {
        plan_entry(id, domain, why, pairing, |o| gives_all(gives, o))
    };
    let mut out = Vec::new();
    for c in configurations {
        let from = |name: &str, id: &str| {
            let mut d = without_lacking(configured(&preset(name), id, c.config), lacks);
            if c.shared {
                // Both sequences at the same offset, so that one token goes into both as one
                // batch from the first op on.
                d.setup.ops.push(Op::SeqCp {
                    src: 0,
                    dst: 1,
                    p0: 0,
                    p1: -1,
                });
                d.decode_shared = true;
            }
            d
        };
        out.push(entry(
            c.id.into(),
            from("seed", c.id),
            c.why.into(),
            Pairing::Alone,
        ));
        let id = format!("{}+state", c.id);
        out.push(entry(
            id.clone(),
            from("state", &id),
            format!("{}; saved and loaded, whole and per sequence", c.why),
            Pairing::Alone,
        ));
        if let Some(versus) = c.versus {
            let id = format!("{}~{versus}", c.id);
            out.push(entry(
                id.clone(),
                from("seed", &id),
                format!("{}, against the same caches under {versus}", c.why),
                Pairing::Config {
                    config: versus.into(),
                },
            ));
        }
    }
    out
}

/// The plan of a hunt on `target` (faults included): every entry, in order.
pub fn plan(target: &TargetSpec) -> Vec<PlanEntry> {
    if let Some(own) = engine_plan(target) {
        return own;
    }
    // The native model beside any other target; a native target is the model itself.
    let beside = match target.kind() {
        Ok(TargetKind::Native) => Pairing::Alone,
        Ok(
            TargetKind::NativeTensors | TargetKind::Llama | TargetKind::PythonRef | TargetKind::Mlx,
        )
        | Err(_) => Pairing::Native,
    };
    let entry = |id: String, domain: Domain, why: String, pairing: Pairing| {
        plan_entry(id, domain, why, pairing, |_| true)
    };
    // Where the native model lacks the memory type the entry runs alone (its other oracles
    // still judge), not as an entry the differential makes unsupported.
    // So do entries that load dumps of other configurations, which the native model does not.
    let beside_for = |d: &Domain| match (&beside, native::lacks_memory(d.setup.arch.memory())) {
        (Pairing::Native, Some(_)) => Pairing::Alone,
        (Pairing::Native, None) if !d.setup.foreign.is_empty() => Pairing::Alone,
        _ => beside.clone(),
    };
    let mut out = Vec::new();
    for (id, d, why) in caches() {
        let pairing = beside_for(&d);
        out.push(entry(id, d, why, pairing));
    }
    for arch in Arch::ALL {
        // qwen4exp_ple's memory type is qwen4exp's, whose pairs run: its one entry is
        // `hybrid_idx+ple` (user_caches).
        if arch == Arch::Qwen4expPle {
            continue;
        }
        let name = base_preset(arch);
        // llama_hd64 is the llama memory type again: its preset gets its own pairs only.
        let everywhere = if arch == Arch::LlamaHd64 {
            &[][..]
        } else {
            &PAIRS_EVERYWHERE[..]
        };
        let configs = everywhere.iter().copied().chain(
            PAIRS_PER_PRESET
                .iter()
                .filter(|(p, _)| *p == name)
                .map(|(_, c)| *c),
        );
        for config in configs {
            let id = format!("{name}~{config}");
            let mut d = preset(name);
            d.name = id.clone();
            out.push(entry(
                id,
                d,
                format!(
                    "{} memory: the {name} preset against itself under {config}",
                    arch.memory()
                ),
                Pairing::Config {
                    config: config.into(),
                },
            ));
        }
    }
    out
}

/// The runner factories of an entry on `target`: the target, and the second side of its
/// pairing; each observes what the entry's oracles read.
#[allow(clippy::type_complexity)]
pub fn factories(
    target: &TargetSpec,
    e: &PlanEntry,
) -> Result<
    (
        Box<RunnerFactory<'static>>,
        Option<Box<RunnerFactory<'static>>>,
    ),
    Error,
> {
    let observe = registry(e).observe();
    let a = target.clone().with_observe(observe);
    let b = match &e.pairing {
        Pairing::Alone => None,
        Pairing::Native => Some(
            TargetSpec::new("native", &[])
                .with_observe(observe)
                .factory()?,
        ),
        Pairing::Config { config } => Some(reconfigured_factory(a.factory()?, config.clone())),
    };
    Ok((a.factory()?, b))
}

/// The registry of an entry's oracles.
pub fn registry(e: &PlanEntry) -> Registry {
    let keep = e.oracles.clone();
    oracles_for(&e.pairing, &e.domain.setup).only(move |o| keep.contains(&o.id()))
}

/// Probe trials timed per entry (after one that starts the runners).
const PROBE_TRIALS: u32 = 3;

/// What a probe of an entry found: whether the target takes its setup, and the seconds per
/// trial of two-op traces of the domain.
pub fn probe(target: &TargetSpec, e: &PlanEntry) -> Result<(Support, Option<f64>), Error> {
    let (a, b) = factories(target, e)?;
    let mut judge = Judge::new(a.as_ref(), b.as_deref())
        .map_err(|err| Error::harness(err.to_string()))?
        .with_oracles(registry(e));
    let ops = e.domain.ops();
    // Trial `i`: ops i and i + 1 (each trial another trace, so that no runner answers one
    // from a cache of the last).
    let trial = |i: usize| Trace {
        setup: e.domain.setup.clone(),
        ops: (i..i + 2)
            .filter_map(|k| ops.get(k % ops.len().max(1)).cloned())
            .collect(),
    };
    let first = judge
        .run(&trial(0))
        .map_err(|err| Error::harness(err.to_string()))?;
    if let Some((0, reason)) = &first.unsupported {
        return Ok((
            Support::Unsupported {
                reason: reason.to_string(),
            },
            None,
        ));
    }
    let clock = Instant::now();
    for i in 1..=PROBE_TRIALS {
        judge
            .run(&trial(i as usize))
            .map_err(|err| Error::harness(err.to_string()))?;
    }
    let per_trial = clock.elapsed().as_secs_f64() / f64::from(PROBE_TRIALS);
    Ok((Support::Runs, Some(per_trial)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_has_every_memory_type_unique_ids_and_valid_domains() {
        let p = plan(&TargetSpec::new("llama.cpp@0.1.161", &[]));
        let mut ids: Vec<&str> = p.iter().map(|e| e.id.as_str()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), p.len(), "entry ids are unique");
        for arch in Arch::ALL {
            assert!(p.iter().any(|e| e.memory == arch.memory()), "{arch}");
        }
        for e in &p {
            e.domain
                .validate()
                .unwrap_or_else(|err| panic!("{}: {err}", e.id));
            assert!(!e.oracles.is_empty(), "{}", e.id);
            for o in registry(e).iter() {
                assert!(o.judges_setup(&e.domain.setup), "{}: {}", e.id, o.id());
            }
        }
        let oracles_of = |id: &str| &p.iter().find(|e| e.id == id).expect(id).oracles;
        let swa = crate::oracles::Registry::builtin()
            .find("swa-window")
            .expect("registered")
            .id();
        assert!(!oracles_of("seed").contains(&swa));
        assert!(oracles_of("iswa").contains(&swa));
        assert!(p.iter().any(|e| e.pairing == Pairing::Native));
        let native = plan(&TargetSpec::new("native", &[]));
        assert!(native.iter().all(|e| e.pairing != Pairing::Native));
    }

    #[test]
    fn an_engine_that_declares_its_configurations_gets_its_own_plan() {
        let p = plan(&TargetSpec::new("mlx-lm@0.32.2", &[]));
        let ids: Vec<&str> = p.iter().map(|e| e.id.as_str()).collect();
        for c in mlx::HUNT_CONFIGURATIONS {
            assert!(ids.contains(&c.id), "{}", c.id);
            assert!(
                ids.contains(&format!("{}+state", c.id).as_str()),
                "{}",
                c.id
            );
            if let Some(v) = c.versus {
                assert!(ids.contains(&format!("{}~{v}", c.id).as_str()), "{}", c.id);
            }
        }
        assert!(
            !ids.contains(&"seed") && !ids.contains(&"fragmented"),
            "{ids:?}"
        );
        let find = |name: &str| Registry::builtin().find(name).expect("registered").id();
        let gives = mlx::declared_observations("mlx-lm@0.32.2").unwrap();
        for e in &p {
            e.domain
                .validate()
                .unwrap_or_else(|err| panic!("{}: {err}", e.id));
            assert_ne!(e.pairing, Pairing::Native, "{}", e.id);
            assert!(e
                .domain
                .ops()
                .iter()
                .all(|op| !mlx::LACKS.contains(&op.kind())));
            for o in registry(e).iter() {
                assert!(gives_all(gives, o), "{}: {}", e.id, o.id());
            }
            assert!(!e.oracles.contains(&find("conservation")), "{}", e.id);
            for judged in ["I1", "crash", "round-trip", "cache-invisible"] {
                assert!(e.oracles.contains(&find(judged)), "{}: {judged}", e.id);
            }
        }
        // Before 0.32 the worker declares no round trip.
        let old = plan(&TargetSpec::new("mlx-lm@0.30.7", &[]));
        assert_eq!(old.len(), p.len());
        assert!(old.iter().all(|e| !e.oracles.contains(&find("round-trip"))));
    }

    #[test]
    fn the_reference_worker_runs_its_listed_entries_beside_the_native_model() {
        let p = plan(&TargetSpec::new(python::REFERENCE, &[]));
        let ids: Vec<&str> = p.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(
            ids,
            python::REFERENCE_HUNT_ENTRIES,
            "every listed entry is planned"
        );
        let find = |name: &str| Registry::builtin().find(name).expect("registered").id();
        for e in &p {
            assert_eq!(e.pairing, Pairing::Native, "{}", e.id);
            assert!(e.domain.divisors.is_empty(), "{}: seq_div is lacking", e.id);
            for o in registry(e).iter() {
                assert!(
                    gives_all(python::REFERENCE_OBSERVES, o),
                    "{}: {}",
                    e.id,
                    o.id()
                );
            }
            for judged in ["I1", "crash", "round-trip", "differential"] {
                assert!(e.oracles.contains(&find(judged)), "{}: {judged}", e.id);
            }
            assert!(!e.oracles.contains(&find("cache-invisible")), "{}", e.id);
        }
    }
}
