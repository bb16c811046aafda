//! The experiments of `kvaudit measure`, one function each: T1's state round trip, T1's rows and
//! logits against the native forward pass, T2's context shift against a context that never saw
//! the span (and its too-late control), T3's prefix splice against a recompute. Each records its
//! [`Experiment`] and its [`Figure`]s, with the tolerances stated before measuring.

use crate::base::cache::CacheUnderTest;
use crate::base::op::{Pos, Trace};
use crate::model::forward::{argmax, Model};
use crate::targets::llama::target::LlamaTarget;
use crate::targets::native_tensor::NativeTensorTarget;

use super::compare::{diff_rows, flips, greedy_detail, logits_diff, native_prefill, run_side};
use super::report::{Bound, Experiment, Figure};
use super::traces::{
    decode, extra_token, prompt, setup, suffix, t2_fresh_trace, t2_never_saw_trace,
    t2_too_late_trace, t3_fresh_trace, t3_splice_trace, PROMPT_LEN, T2_GREEDY, T2_SPAN, T3_GREEDY,
    T3_PREFIX, T3_SUFFIX,
};
use super::{ctx_of, MeasureError};

/// Collects figures as they are measured.
pub(super) struct Figures {
    pub(super) figures: Vec<Figure>,
}

impl Figures {
    pub(super) fn push(
        &mut self,
        quantity: &str,
        experiment: &str,
        value: f64,
        tolerance: Bound,
        detail: Option<String>,
    ) {
        self.figures.push(Figure {
            quantity: quantity.into(),
            experiment: experiment.into(),
            value,
            tolerance,
            within: tolerance.accepts(value),
            detail,
        });
    }

    pub(super) fn flag(
        &mut self,
        quantity: &str,
        experiment: &str,
        yes: bool,
        detail: Option<String>,
    ) {
        self.push(
            quantity,
            experiment,
            f64::from(u8::from(yes)),
            Bound::Is(1.0),
            detail,
        );
    }
}

// Stated tolerances (the issue's, before measuring). A rotation compiled with fused multiply-adds
// differs from an unfused one by a few ulps of values of order 1, hence 1e-5 for rows; logits
// compound that through two layers, hence the 1e-4 target; T2's composed rotations and
// their effect downstream are held to 1e-4 (K) and 1e-3 (logits).
const TOL_ROWS: Bound = Bound::AtMost(1e-5);
const TOL_LOGITS: Bound = Bound::AtMost(1e-4);
const TOL_T2_K: Bound = Bound::AtMost(1e-4);
pub(super) const TOL_T2_LOGITS: Bound = Bound::AtMost(1e-3);
const TOL_T3_LOGITS: Bound = Bound::AtMost(1e-5);
const EXACT: Bound = Bound::AtMost(0.0);
const NO_FLIP: Bound = Bound::Is(0.0);

fn ops_text(trace: &Trace) -> Vec<String> {
    trace.ops.iter().map(|o| o.to_string()).collect()
}

/// The targets the experiments run on and what they record.
pub(super) struct Lab<'a> {
    /// The pin label, for errors.
    pub(super) label: &'a str,
    /// The llama.cpp pin: a fresh context at every reset, F32 K and V caches.
    pub(super) llama: LlamaTarget,
    /// The native tensor cache, for contrast.
    pub(super) native: NativeTensorTarget,
    /// The native model (the forward pass of T1's reference).
    pub(super) model: &'a Model,
    /// The figures so far.
    pub(super) figures: Figures,
    /// The experiments so far.
    pub(super) experiments: Vec<Experiment>,
}

/// T1 decodes the prompt into seq 0 at 0.. in one batch.
fn prefill_trace() -> Trace {
    Trace {
        setup: setup(),
        ops: vec![decode(0, &prompt(), Some(0))],
    }
}

impl Lab<'_> {
    /// T1: a full-state round trip into a fresh context; the same bytes? the same next logits?
    pub(super) fn t1_round_trip(&mut self) -> Result<(), MeasureError> {
        let Lab {
            label,
            llama,
            figures,
            experiments,
            ..
        } = self;
        let label = *label;
        let prefill = prefill_trace();
        experiments.push(Experiment {
            name: "T1.round_trip".into(),
            about: format!(
                "decode the prompt into seq 0 at 0..{}, llama_state_get_data; a fresh context: \
             llama_state_set_data, llama_state_get_data (same bytes?); then token {} decoded at \
             position {} in both (same logits?)",
                PROMPT_LEN - 1,
                extra_token(),
                PROMPT_LEN
            ),
            under_test: ops_text(&prefill),
            partner: vec![
                "llama_state_set_data(<bytes>) into a fresh context".into(),
                "llama_state_get_data".into(),
            ],
        });
        let mut original = llama.fresh_copy();
        original.reset(&setup())?;
        let o = original.apply(&prefill.ops[0])?;
        if !o.took_effect() {
            return Err(MeasureError::Decode {
                label: label.into(),
                what: "prompt",
                outcome: o,
            });
        }
        let bytes = ctx_of(&mut original)?
            .state_get()
            .map_err(|cause| MeasureError::context(label, "state_get", cause))?;
        let mut restored = llama.fresh_copy();
        restored.reset(&setup())?;
        ctx_of(&mut restored)?
            .state_set(&bytes)
            .map_err(|cause| MeasureError::context(label, "state_set", cause))?;
        let again = ctx_of(&mut restored)?
            .state_get()
            .map_err(|cause| MeasureError::context(label, "state_get", cause))?;
        let first_diff = bytes.iter().zip(&again).position(|(a, b)| a != b);
        figures.flag(
            "T1.round_trip_bytes_equal",
            "T1.round_trip",
            bytes == again,
            Some(format!(
                "{} bytes, then {} bytes; first difference at {}",
                bytes.len(),
                again.len(),
                first_diff.map_or("none".into(), |i| format!("byte {i}"))
            )),
        );
        let probe = decode(0, &[extra_token()], None);
        let mut next = Vec::new();
        for t in [&mut original, &mut restored] {
            let o = t.apply(&probe)?;
            if !o.took_effect() {
                return Err(MeasureError::Decode {
                    label: label.into(),
                    what: "probe",
                    outcome: o,
                });
            }
            next.push(t.last_logits()?.unwrap_or_default());
        }
        let d = logits_diff(&next[0], &next[1]);
        figures.push(
            "T1.round_trip_logits_max_abs",
            "T1.round_trip",
            d.value,
            EXACT,
            Some(d.detail()),
        );
        Ok(())
    }

    /// T1: the rows and logits of the prompt against the native forward pass, and the greedy
    /// continuations.
    pub(super) fn t1_vs_native(&mut self) -> Result<(), MeasureError> {
        let Lab {
            llama,
            model: native_model,
            figures,
            experiments,
            ..
        } = self;
        let prefill = prefill_trace();
        let p = prompt();
        let hp = native_model.hparams().clone();
        let hd = hp.head_dim;
        experiments.push(Experiment {
            name: "T1.vs_native".into(),
            about: format!(
                "decode the prompt into seq 0 at 0..{} in one batch; K and V rows of \
             llama_state_seq_get_data(0) (F32; V transposed without flash attention) against the \
             native forward pass (Model::forward_tokens over a VecKvStore, same tokens and \
             positions), per (layer, position, KV head); the last logits against the native ones; \
             then {T2_GREEDY} greedy tokens on each",
                PROMPT_LEN - 1
            ),
            under_test: ops_text(&prefill),
            partner: vec!["native: Model::forward_tokens(prompt, 0..12, VecKvStore)".into()],
        });
        let side = run_side(llama, &prefill, 0, T2_GREEDY)?;
        let (native_rows, native_logits) = native_prefill(&native_model, &p);
        let rd = diff_rows(&side.rows, &native_rows, hd, 0..hp.n_layer);
        figures.flag(
            "T1.rows_positions_equal",
            "T1.vs_native",
            rd.positions_equal,
            Some(format!(
                "llama.cpp {:?}, native {:?}",
                rd.positions.0, rd.positions.1
            )),
        );
        figures.push(
            "T1.k_rows_vs_native_max_abs",
            "T1.vs_native",
            rd.k.value,
            TOL_ROWS,
            Some(rd.k.detail()),
        );
        figures.push(
            "T1.v_rows_vs_native_max_abs",
            "T1.vs_native",
            rd.v.value,
            TOL_ROWS,
            Some(rd.v.detail()),
        );
        let ld = logits_diff(&side.logits, &native_logits);
        figures.push(
            "logits_vs_native_max_abs",
            "T1.vs_native",
            ld.value,
            TOL_LOGITS,
            Some(ld.detail()),
        );
        let (am_l, am_n) = (argmax(&side.logits), argmax(&native_logits));
        figures.flag(
            "logits_vs_native_argmax_equal",
            "T1.vs_native",
            am_l == am_n,
            Some(format!("llama.cpp {am_l}, native {am_n}")),
        );
        let toks: Vec<u32> = p.iter().map(|&t| t as u32).collect();
        let native_greedy = native_model.greedy(&toks, T2_GREEDY);
        let (n, first) = flips(&side.greedy, &native_greedy);
        figures.push(
            "greedy32_vs_native_token_flips",
            "T1.vs_native",
            n as f64,
            NO_FLIP,
            Some(greedy_detail(&side.greedy, &native_greedy, first)),
        );
        Ok(())
    }

    /// T2: the context shift against a fresh context that never saw the span, in its two
    /// variants, on llama.cpp and on the native cache.
    pub(super) fn t2(&mut self) -> Result<(), MeasureError> {
        let Lab {
            llama,
            native,
            model,
            figures,
            experiments,
            ..
        } = self;
        let hp = model.hparams().clone();
        let hd = hp.head_dim;
        let fresh = t2_fresh_trace();
        let (s0, s1) = T2_SPAN;
        for (name, trace, about, control) in [
        (
            "T2",
            t2_never_saw_trace(),
            format!(
                "the survivors never attended the span: A (prompt 0..{s0}) and B (prompt \
                 {s1}..{PROMPT_LEN}) decoded together at 0..7 exactly as the fresh partner does; B \
                 moved to {s1}..{} (seq_add +{}); the span S (prompt {s0}..{s1}) decoded into seq 1 \
                 (sharing A) at {s0}..{} (this decode applies B's +{} K-shift) and copied into seq \
                 0, seq 1 dropped: seq 0 holds the prompt at 0..{}, and B never attended S; then the \
                 context shift seq_rm(0, {s0}, {s1}), seq_add(0, {s1}, -1, -{}) and token {} decoded \
                 at {} (llama.cpp applies the -{} K-shift here, composed onto B's rotated keys). \
                 Against a fresh context that decodes A and B at 0..7, then the same token: K and V \
                 rows of seq 0, the logits, {T2_GREEDY} greedy tokens",
                PROMPT_LEN as Pos - 1,
                s1 - s0,
                s1 - 1,
                s1 - s0,
                PROMPT_LEN - 1,
                s1 - s0,
                extra_token(),
                PROMPT_LEN as Pos - (s1 - s0),
                s1 - s0
            ),
            false,
        ),
        (
            "T2.too_late",
            t2_too_late_trace(),
            format!(
                "control, the plain context shift: the prompt decoded in one batch at 0..{}, then \
                 seq_rm(0, {s0}, {s1}), seq_add(0, {s1}, -1, -{}), token {} at {}. The survivors \
                 after the span attended it, so rows from layer 1 on, logits and greedy tokens are \
                 expected to differ from the fresh partner (the theorem's \"span-exact, not \
                 retroactive\"); layer 0's K rows depend on token and position only and measure \
                 one composed rotation",
                PROMPT_LEN - 1,
                s1 - s0,
                extra_token(),
                PROMPT_LEN as Pos - (s1 - s0)
            ),
            true,
        ),
    ] {
        experiments.push(Experiment {
            name: name.into(),
            about,
            under_test: ops_text(&trace),
            partner: ops_text(&fresh),
        });
        for (who, target) in [
            ("", llama as &mut dyn CacheUnderTest),
            (".native", native as &mut dyn CacheUnderTest),
        ] {
            let shifted = run_side(target, &trace, 0, T2_GREEDY)?;
            let partner = run_side(target, &fresh, 0, T2_GREEDY)?;
            let all = diff_rows(&shifted.rows, &partner.rows, hd, 0..hp.n_layer);
            let layer0 = diff_rows(&shifted.rows, &partner.rows, hd, 0..1);
            let ld = logits_diff(&shifted.logits, &partner.logits);
            let (n, first) = flips(&shifted.greedy, &partner.greedy);
            let q = |s: &str| format!("{name}{who}.{s}");
            // llama.cpp is held to the stated tolerances, the native cache to bit-exactness; the
            // too-late control only where it measures rotations alone (layer 0's K).
            let (tk, tl, tf, tk0) = match (control, who.is_empty()) {
                (false, true) => (TOL_T2_K, TOL_T2_LOGITS, NO_FLIP, TOL_T2_K),
                (false, false) => (EXACT, EXACT, NO_FLIP, EXACT),
                (true, true) => (Bound::Control, Bound::Control, Bound::Control, TOL_T2_K),
                (true, false) => (Bound::Control, Bound::Control, Bound::Control, EXACT),
            };
            figures.flag(
                &q("positions_equal"),
                name,
                all.positions_equal,
                Some(format!(
                    "shifted {:?}, fresh {:?}",
                    all.positions.0, all.positions.1
                )),
            );
            let k_name = if control { "k_max_abs" } else { "k_after_shift_max_abs" };
            figures.push(&q(k_name), name, all.k.value, tk, Some(all.k.detail()));
            figures.push(
                &q("k_layer0_max_abs"),
                name,
                layer0.k.value,
                tk0,
                Some(layer0.k.detail()),
            );
            let v_name = if control { "v_max_abs" } else { "v_after_shift_max_abs" };
            figures.push(&q(v_name), name, all.v.value, tk, Some(all.v.detail()));
            figures.push(&q("logits_max_abs"), name, ld.value, tl, Some(ld.detail()));
            figures.push(
                &q("greedy32_token_flips"),
                name,
                n as f64,
                tf,
                Some(greedy_detail(&shifted.greedy, &partner.greedy, first)),
            );
            figures.push(
                &q("greedy32_first_flip"),
                name,
                first.map_or(-1.0, |i| i as f64),
                Bound::Control,
                Some("index of the first differing greedy token, -1 when none".into()),
            );
        }
    }
        Ok(())
    }

    /// T3: the prefix splice against a recompute, on llama.cpp and on the native cache.
    pub(super) fn t3(&mut self) -> Result<(), MeasureError> {
        let Lab {
            llama,
            native,
            model,
            figures,
            experiments,
            ..
        } = self;
        let hp = model.hparams().clone();
        let hd = hp.head_dim;
        let splice = t3_splice_trace();
        let recompute = t3_fresh_trace();
        experiments.push(Experiment {
            name: "T3".into(),
            about: format!(
            "prefix splice: the prompt decoded into seq 0 at 0..{}, its first {T3_PREFIX} tokens \
             copied to seq 1 (seq_cp(0, 1, 0, {T3_PREFIX})), the suffix {:?} decoded into seq 1 at \
             {T3_PREFIX}..{}. Against a fresh context that decodes prefix and suffix into seq 0 in \
             one batch at 0..{}: logits after the suffix, K and V rows of seq 1 vs seq 0, cache \
             length (resident cells of the sequence), {T3_GREEDY} greedy tokens",
            PROMPT_LEN - 1,
            suffix(),
            T3_PREFIX + T3_SUFFIX - 1,
            T3_PREFIX + T3_SUFFIX - 1
        ),
            under_test: ops_text(&splice),
            partner: ops_text(&recompute),
        });
        for (who, target) in [
            ("", llama as &mut dyn CacheUnderTest),
            (".native", native as &mut dyn CacheUnderTest),
        ] {
            let spliced = run_side(target, &splice, 1, T3_GREEDY)?;
            let fresh = run_side(target, &recompute, 0, T3_GREEDY)?;
            let q = |s: &str| format!("T3{who}.{s}");
            let (tl, tr) = if who.is_empty() {
                (TOL_T3_LOGITS, TOL_ROWS)
            } else {
                (EXACT, EXACT)
            };
            let ld = logits_diff(&spliced.logits, &fresh.logits);
            figures.push(
                &q("prefix_logits_max_abs"),
                "T3",
                ld.value,
                tl,
                Some(ld.detail()),
            );
            figures.flag(
                &q("prefix_greedy_equal"),
                "T3",
                spliced.greedy == fresh.greedy,
                Some(format!(
                    "spliced {:?}, fresh {:?}",
                    spliced.greedy, fresh.greedy
                )),
            );
            // The rows were read before the greedy decodes: the cache as the suffix left it.
            let (ns, nf) = (spliced.rows.cells.len(), fresh.rows.cells.len());
            figures.flag(
                &q("cache_length_equal"),
                "T3",
                ns == nf,
                Some(format!(
                    "seq 1 spliced: {ns} cells, seq 0 fresh: {nf} cells"
                )),
            );
            let rd = diff_rows(&spliced.rows, &fresh.rows, hd, 0..hp.n_layer);
            figures.push(
                &q("k_rows_max_abs"),
                "T3",
                rd.k.value,
                tr,
                Some(rd.k.detail()),
            );
            figures.push(
                &q("v_rows_max_abs"),
                "T3",
                rd.v.value,
                tr,
                Some(rd.v.detail()),
            );
        }
        Ok(())
    }
}
