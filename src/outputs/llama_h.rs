//! llama.h's words for each oracle: the clause a violation breaks, the check in plain words, and
//! the check in C (`oracles::c_check`), for llama.cpp's bug reports and C reproducers. An oracle
//! is a value that knows nothing of an engine ([`Oracle`]); what it means in llama.h's terms is
//! the llama.cpp outputs' (issue 43), as the Python reproducer's words are mlx-lm's.

use crate::oracles::c_check::{self, CCheck};
use crate::oracles::{self, contract, Oracle, OracleId};

/// The llama.h words a finding breaks ([`Oracle::llama_h_clause`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LlamaHClause {
    /// Quoted lines.
    pub lines: Vec<String>,
    /// Whether llama.h states them (`false`: llama.h is silent and the lines say what the
    /// reference behaviour is).
    pub documented: bool,
}

impl LlamaHClause {
    /// Lines llama.h states.
    pub fn documented(lines: &[&str]) -> LlamaHClause {
        LlamaHClause {
            lines: lines.iter().map(|l| l.to_string()).collect(),
            documented: true,
        }
    }
}

/// What the llama.cpp outputs say of one oracle.
#[derive(Clone, Copy)]
pub struct LlamaWords {
    /// The llama.h words a violation of `kind` after the op `op` (its JSON name) breaks.
    pub clause: fn(op: &str, kind: &str) -> LlamaHClause,
    /// The check in plain words, for a bug report's "expected" (the reader has llama.h, not
    /// kvaudit).
    pub in_words: &'static str,
    /// Its check in C, for standalone reproducers (`outputs/c_repro`); `None`: a C reproducer
    /// cannot state it (the reproducer refuses such a finding).
    pub c_check: Option<CCheck>,
}

impl LlamaWords {
    /// An oracle llama.h has no words for here: the op's documented clauses and that llama.h
    /// documents no abort for it; no C check.
    pub const DEFAULT: LlamaWords = LlamaWords {
        clause: documented_clauses_of_the_op,
        in_words: "the call does what llama.h says",
        c_check: None,
    };
}

/// The op's documented clauses ([`contract::documented_clauses`]), and that llama.h documents no
/// abort for it.
fn documented_clauses_of_the_op(op: &str, _kind: &str) -> LlamaHClause {
    let mut lines = contract::documented_clauses(op);
    lines.push(format!(
        "(llama.h documents no abort for llama_memory_{op} or the calls before it)"
    ));
    LlamaHClause {
        lines,
        documented: true,
    }
}

/// The words of every built-in oracle that has its own.
static WORDS: [(&Oracle, LlamaWords); 19] = [
    (
        &oracles::allocation::ALLOCATION,
        LlamaWords {
            clause: allocation_clause,
            in_words: "a context of n_ctx (llama_n_ctx) allocates n_ctx cells for its positions, one stream of n_ctx when unified or n_seq_max streams of n_ctx / n_seq_max, no windowed or compressed stream beyond that share, and one recurrent state per sequence",
            c_check: Some(oracles::allocation::C_CHECK),
            ..LlamaWords::DEFAULT
        },
    ),
    (
        &oracles::cache_invisible::CACHE_INVISIBLE,
        LlamaWords {
            c_check: Some(c_check::CACHE_INVISIBLE),
            ..LlamaWords::DEFAULT
        },
    ),
    (
        &oracles::config_differential::CONFIG_DIFFERENTIAL,
        LlamaWords {
            c_check: Some(c_check::CONFIG_DIFFERENTIAL),
            ..LlamaWords::DEFAULT
        },
    ),
    (
        &oracles::conservation::CONSERVATION,
        LlamaWords {
            clause: state_round_trip_clause,
            in_words: "the cells of llama_state_get_data are exactly the union of the sequences' cells in llama_state_seq_get_data",
            c_check: Some(c_check::CONSERVATION),
            ..LlamaWords::DEFAULT
        },
    ),
    (
        &oracles::contract::CONTRACT_QUESTION,
        LlamaWords {
            clause: clause_of_kind,
            c_check: Some(c_check::CONTRACT),
            ..LlamaWords::DEFAULT
        },
    ),
    (
        &oracles::contract::CONTRACT,
        LlamaWords {
            clause: clause_of_kind,
            c_check: Some(c_check::CONTRACT),
            ..LlamaWords::DEFAULT
        },
    ),
    (
        &oracles::crash::CRASH,
        LlamaWords {
            in_words: "the call returns",
            c_check: Some(c_check::CRASH),
            ..LlamaWords::DEFAULT
        },
    ),
    (
        &oracles::cross_logits::CROSS_LOGITS,
        LlamaWords {
            in_words: "two engines running the same model on the same calls give the same next-token logits",
            ..LlamaWords::DEFAULT
        },
    ),
    (
        &oracles::differential::DIFFERENTIAL,
        LlamaWords {
            in_words: "the same calls give the same seq_pos_min, seq_pos_max and cells as the reference behaviour",
            c_check: Some(c_check::DIFFERENTIAL),
            ..LlamaWords::DEFAULT
        },
    ),
    (
        &oracles::failed_restore::FAILED_RESTORE,
        LlamaWords {
            clause: failed_restore_clause,
            in_words: "after a state load that returns 0, no sequence but the destination changed and the destination is as it was or empty (a whole load: every sequence as it was, or every one empty)",
            c_check: Some(c_check::FAILED_RESTORE),
            ..LlamaWords::DEFAULT
        },
    ),
    (
        &oracles::i1::I1,
        LlamaWords {
            clause: i1_clause,
            in_words: "seq_pos_min/seq_pos_max equal the smallest/largest position among the sequence's cells in llama_state_seq_get_data (-1 when it has none)",
            c_check: Some(c_check::I1),
            ..LlamaWords::DEFAULT
        },
    ),
    (
        &oracles::i2::I2,
        LlamaWords {
            clause: i2_clause,
            in_words: "every position between the smallest and the largest of the sequence's cells in llama_state_seq_get_data is present",
            c_check: Some(c_check::I2),
            ..LlamaWords::DEFAULT
        },
    ),
    (
        &oracles::partial_restore::PARTIAL_RESTORE,
        LlamaWords {
            clause: partial_restore_clause,
            in_words: "a sequence's PARTIAL_ONLY state loaded back after one more decode (that decode's cell removed) gives the probe token the logits it had when the state was saved, and so does a second load of the same bytes",
            ..LlamaWords::DEFAULT
        },
    ),
    (
        &oracles::rollback::ROLLBACK,
        LlamaWords {
            c_check: Some(c_check::ROLLBACK),
            ..LlamaWords::DEFAULT
        },
    ),
    (
        &oracles::round_trip::ROUND_TRIP,
        LlamaWords {
            clause: state_round_trip_clause,
            in_words: "state saved with llama_state_get_data / llama_state_seq_get_data loads into a fresh context of the same configuration and reads back the same",
            c_check: Some(c_check::ROUND_TRIP),
            ..LlamaWords::DEFAULT
        },
    ),
    (
        &oracles::round_trip_logits::ROUND_TRIP_LOGITS,
        LlamaWords {
            clause: state_round_trip_clause,
            in_words: "state saved with llama_state_get_data / llama_state_seq_get_data and loaded into a fresh context of the same configuration gives each sequence the same next-token logits as the context it was saved from",
            c_check: Some(c_check::ROUND_TRIP_LOGITS),
            ..LlamaWords::DEFAULT
        },
    ),
    (
        &oracles::save_load_invisible::SAVE_LOAD_INVISIBLE,
        LlamaWords {
            clause: state_round_trip_clause,
            in_words: "state saved with llama_state_get_data / llama_state_seq_get_data and loaded back into the same context changes none of the next-token logits a later decode sees",
            c_check: Some(c_check::SAVE_LOAD_INVISIBLE),
            ..LlamaWords::DEFAULT
        },
    ),
    (
        &oracles::state_size::STATE_SIZE,
        LlamaWords {
            clause: state_size_clause,
            in_words: "llama_state_get_size and llama_state_seq_get_size(_ext) report exactly the bytes llama_state_get_data and llama_state_seq_get_data(_ext) write, and a sequence's size depends on its own cells only",
            c_check: Some(oracles::state_size::C_CHECK),
            ..LlamaWords::DEFAULT
        },
    ),
    (
        &oracles::swa_window::SWA_WINDOW,
        LlamaWords {
            c_check: Some(oracles::swa_window::C_CHECK),
            ..LlamaWords::DEFAULT
        },
    ),
];

/// llama.h's words for `oracle` ([`LlamaWords::DEFAULT`] for one with none of its own).
pub fn words(oracle: OracleId) -> LlamaWords {
    WORDS
        .iter()
        .find(|(o, _)| o.id == oracle)
        .map_or(LlamaWords::DEFAULT, |(_, w)| *w)
}

fn allocation_clause(_op: &str, _kind: &str) -> LlamaHClause {
    LlamaHClause::documented(&[
        "llama_context_params::n_ctx: \"text context, 0 = from model\"",
        "llama_context_params::n_seq_max: \"max number of sequences (i.e. distinct states for recurrent models)\"",
        "llama_context_params::kv_unified: \"use a unified buffer across the input sequences when computing the attention\"",
    ])
}

/// llama.h's words on a state saved and loaded back (`oracles::round_trip::LLAMA_H`): the
/// clause of every oracle that judges the state's bytes or what a decode does with them.
fn state_round_trip_clause(_op: &str, _kind: &str) -> LlamaHClause {
    LlamaHClause::documented(&oracles::round_trip::LLAMA_H)
}

fn failed_restore_clause(op: &str, _kind: &str) -> LlamaHClause {
    let mut lines = vec![
        "llama_state_seq_set_data: \"Copy the sequence data ... into the specified sequence. Returns: Positive: Ok, Zero: Failed to load\"".to_string(),
        "llama_state_set_data: \"Set the state reading from the specified address. Returns the number of bytes read\"".to_string(),
    ];
    lines.push(if op == "state_load" {
        "(read as: a whole load that failed loaded nothing: the memory is as it was, or empty since the load empties it first; never part of the bytes)".into()
    } else {
        "(read as: a load that failed loaded nothing: no other sequence changed, and the destination is as it was, or empty since the load removes its cells first)".into()
    });
    LlamaHClause {
        lines,
        documented: false,
    }
}

fn i1_clause(_op: &str, _kind: &str) -> LlamaHClause {
    LlamaHClause::documented(&oracles::i1::LLAMA_H)
}

fn i2_clause(_op: &str, _kind: &str) -> LlamaHClause {
    LlamaHClause::documented(&oracles::i2::LLAMA_H)
}

fn partial_restore_clause(_op: &str, _kind: &str) -> LlamaHClause {
    let mut lines: Vec<String> = oracles::partial_restore::LLAMA_H
        .iter()
        .map(|l| l.to_string())
        .collect();
    lines.push("(read as: the partial bytes put back the part seq_rm cannot roll back as it was when they were saved, every time they are loaded)".into());
    LlamaHClause {
        lines,
        documented: false,
    }
}

fn state_size_clause(_op: &str, _kind: &str) -> LlamaHClause {
    LlamaHClause::documented(&[
        "llama_state_get_size: \"Returns the *actual* size in bytes of the state (logits, embedding and memory)\"",
        "llama_state_seq_get_size: \"Get the exact size needed to copy the state of a single sequence\"",
    ])
}

/// The clause a contract finding of `kind` breaks, quoted; the op's documented clauses when no
/// clause has that kind (a finding from another version of the table).
fn clause_of_kind(op: &str, kind: &str) -> LlamaHClause {
    match contract::CLAUSES.iter().find(|c| c.kind == kind) {
        Some(c) => LlamaHClause {
            lines: vec![c.promise.to_string()],
            documented: c.documented,
        },
        None => LlamaHClause {
            lines: contract::documented_clauses(op),
            documented: true,
        },
    }
}
