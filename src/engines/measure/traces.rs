//! The fixed traces of the experiments: the 12-token prompt, T2's never-saw construction, its
//! too-late control and their fresh partner, T3's prefix splice and its recompute partner.

use crate::base::op::{default_token, Decode, Op, Pos, SeqId, Setup, Trace};

/// Context size of every experiment.
pub const N_CTX: u32 = 256;

/// Sequences of every context (T3 uses seq 1).
pub const N_SEQ_MAX: u32 = 2;

/// Tokens in the prompt.
pub const PROMPT_LEN: usize = 12;

/// The span T2 evicts, `[p0, p1)`.
pub const T2_SPAN: (Pos, Pos) = (4, 8);

/// Greedy tokens after T2's shift.
pub const T2_GREEDY: usize = 32;

/// Prompt tokens T3 copies to seq 1.
pub const T3_PREFIX: usize = 8;

/// Suffix tokens T3 decodes after the prefix.
pub const T3_SUFFIX: usize = 4;

/// Greedy tokens after T3's suffix.
pub const T3_GREEDY: usize = 8;

/// The prompt: `default_token(0..12)` = 12, 49, 23, 60, 34, 8, 45, 19, 56, 30, 4, 41.
pub fn prompt() -> Vec<i32> {
    (0..PROMPT_LEN as u32).map(default_token).collect()
}

/// The token decoded after the prompt (T1's round-trip probe) and after T2's shift:
/// `default_token(12)` = 15.
pub fn extra_token() -> i32 {
    default_token(PROMPT_LEN as u32)
}

/// T3's suffix: `default_token(12..16)` = 15, 52, 26, 63.
pub fn suffix() -> Vec<i32> {
    (PROMPT_LEN as u32..(PROMPT_LEN + T3_SUFFIX) as u32)
        .map(default_token)
        .collect()
}

pub(super) fn setup() -> Setup {
    Setup {
        n_ctx: N_CTX,
        n_seq_max: N_SEQ_MAX,
        ops: Vec::new(),
        ..Setup::default()
    }
}

pub(super) fn decode(seq: SeqId, tokens: &[i32], pos: Option<Pos>) -> Op {
    Op::Decode(Decode {
        pos,
        ..Decode::tokens(seq, tokens)
    })
}

/// The T2 survivors: the prompt without the span (A = tokens 0..4, B = tokens 8..12).
fn survivors() -> Vec<i32> {
    let p = prompt();
    let (s0, s1) = (T2_SPAN.0 as usize, T2_SPAN.1 as usize);
    p[..s0].iter().chain(&p[s1..]).copied().collect()
}

/// T2, the survivors never saw the span (the theorem's precondition). A and B are decoded first,
/// together, at positions 0..7, exactly as the fresh partner decodes them; B is moved up by 4
/// (`seq_add`); A is shared with seq 1, where the span S (prompt tokens 4..8) is decoded at 4..7
/// (this decode applies B's +4 K-shift); S is copied into seq 0 and seq 1 dropped. Seq 0 now
/// holds the 12-token prompt A S B at 0..11, and B never attended S. Then the context shift:
/// `seq_rm(0, 4, 8)`, `seq_add(0, 8, -1, -4)`, and the extra token, whose decode applies B's -4
/// K-shift. In exact arithmetic seq 0 equals the partner's; in llama.cpp B's keys are its
/// prefill keys rotated by +4 and then by -4, each rotation composed onto the rotated row.
pub fn t2_never_saw_trace() -> Trace {
    let p = prompt();
    let (s0, s1) = T2_SPAN;
    let span = s1 - s0;
    Trace {
        setup: setup(),
        ops: vec![
            decode(0, &survivors(), Some(0)),
            Op::SeqAdd {
                seq: 0,
                p0: s0,
                p1: -1,
                delta: span,
            },
            Op::SeqCp {
                src: 0,
                dst: 1,
                p0: 0,
                p1: s0,
            },
            decode(1, &p[s0 as usize..s1 as usize], Some(s0)),
            Op::SeqCp {
                src: 1,
                dst: 0,
                p0: s0,
                p1: s1,
            },
            Op::SeqRm {
                seq: 1,
                p0: -1,
                p1: -1,
            },
            Op::SeqRm {
                seq: 0,
                p0: s0,
                p1: s1,
            },
            Op::SeqAdd {
                seq: 0,
                p0: s1,
                p1: -1,
                delta: -span,
            },
            decode(0, &[extra_token()], None),
        ],
    }
}

/// T2, the plain context shift: the prompt decoded in one batch at 0..11, `seq_rm(0, 4, 8)`,
/// `seq_add(0, 8, -1, -4)`, the extra token. The survivors B attended the span before it was
/// evicted, so from layer 1 on their rows are not those of a context that never saw it (the seed's
/// "span-exact, not retroactive"): a control, expected to differ. Layer 0's K rows depend on the
/// token and the position only, so there they measure one composed rotation (-4 onto the row
/// rotated at 8..11).
pub fn t2_too_late_trace() -> Trace {
    let (s0, s1) = T2_SPAN;
    Trace {
        setup: setup(),
        ops: vec![
            decode(0, &prompt(), Some(0)),
            Op::SeqRm {
                seq: 0,
                p0: s0,
                p1: s1,
            },
            Op::SeqAdd {
                seq: 0,
                p0: s1,
                p1: -1,
                delta: -(s1 - s0),
            },
            decode(0, &[extra_token()], None),
        ],
    }
}

/// T2's partner: a fresh context that decodes the survivors at 0..7 in one batch, then the extra
/// token at 8.
pub fn t2_fresh_trace() -> Trace {
    Trace {
        setup: setup(),
        ops: vec![
            decode(0, &survivors(), Some(0)),
            decode(0, &[extra_token()], None),
        ],
    }
}

/// T3: the prompt decoded into seq 0 at 0..11, its first 8 tokens copied to seq 1
/// (`seq_cp(0, 1, 0, 8)`), the suffix decoded into seq 1 at 8..11. Observed: seq 1.
pub fn t3_splice_trace() -> Trace {
    Trace {
        setup: setup(),
        ops: vec![
            decode(0, &prompt(), Some(0)),
            Op::SeqCp {
                src: 0,
                dst: 1,
                p0: 0,
                p1: T3_PREFIX as Pos,
            },
            decode(1, &suffix(), None),
        ],
    }
}

/// T3's partner: prefix and suffix decoded fresh into seq 0 in one batch at 0..11.
pub fn t3_fresh_trace() -> Trace {
    let mut tokens = prompt()[..T3_PREFIX].to_vec();
    tokens.extend(suffix());
    Trace {
        setup: setup(),
        ops: vec![decode(0, &tokens, Some(0))],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prompt_and_suffix_are_the_documented_tokens() {
        assert_eq!(prompt(), [12, 49, 23, 60, 34, 8, 45, 19, 56, 30, 4, 41]);
        assert_eq!(extra_token(), 15);
        assert_eq!(suffix(), [15, 52, 26, 63]);
        assert_eq!(survivors(), [12, 49, 23, 60, 56, 30, 4, 41]);
    }
}
