//! Why a call was refused, a restore failed or a decode was rejected.

use std::fmt;

use crate::{Pos, SeqId};

/// Why a call was refused. llama.cpp aborts (`GGML_ASSERT`) on these; this model refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheError {
    /// A sequence id outside `0..n_seq_max` (or outside `-1..n_seq_max` where -1 means all).
    /// llama.cpp: with one stream per sequence, `GGML_ASSERT(seq_id < seq_to_stream.size())`
    /// aborts; unified, it accepts ids up to `LLAMA_MAX_SEQ` (256), which this model does not
    /// track (one `u64` per cell).
    InvalidSeq(SeqId),
    /// `seq_div` with a divisor of 0 (llama.cpp divides by zero).
    ZeroDivisor,
    /// A `seq_cp` between two streams of part of a sequence: llama.cpp aborts with
    /// `GGML_ASSERT(is_full && "seq_cp() is only supported for full KV buffers")`.
    PartialCrossStreamCopy {
        /// Source sequence.
        src: SeqId,
        /// Destination sequence.
        dst: SeqId,
        /// Range start as given.
        p0: Pos,
        /// Range end as given.
        p1: Pos,
    },
}

impl fmt::Display for CacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheError::InvalidSeq(s) => write!(f, "invalid sequence id {s}"),
            CacheError::ZeroDivisor => write!(f, "seq_div with divisor 0"),
            CacheError::PartialCrossStreamCopy { src, dst, p0, p1 } => write!(
                f,
                "seq_cp({src}, {dst}, {p0}, {p1}) copies part of a sequence across streams: \
                 llama.cpp aborts (GGML_ASSERT: seq_cp() is only supported for full KV buffers)"
            ),
        }
    }
}

impl std::error::Error for CacheError {}

/// Why serialized state could not be restored: `llama_state_seq_set_data` returns 0 in these
/// cases (and empties the destination sequence once it has started to fill it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestoreError {
    /// Byte offset at which the problem was found.
    pub offset: usize,
    /// What was wrong there.
    pub message: String,
}

impl fmt::Display for RestoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "state byte {}: {}", self.offset, self.message)
    }
}

impl std::error::Error for RestoreError {}

/// Why a decode was refused, with the return code `llama_decode` gives for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The batch failed validation (`llama_batch_allocr::init` returned false): rc -1.
    InvalidBatch(String),
    /// No free cells for the batch (`find_slot` failed): rc 1.
    NoSlot,
}

impl DecodeError {
    /// The value `llama_decode` returns in this case.
    pub fn return_code(&self) -> i32 {
        match self {
            DecodeError::InvalidBatch(_) => -1,
            DecodeError::NoSlot => 1,
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::InvalidBatch(why) => write!(f, "invalid batch: {why}"),
            DecodeError::NoSlot => write!(f, "no free KV cells for the batch"),
        }
    }
}

impl std::error::Error for DecodeError {}
