//! How the targets that write llama.cpp's state layout are observed (llama.cpp itself, in
//! process or in its worker, and the native model): the accessors by call, the cells parsed
//! from the target's own per-sequence dump (`base/state`), never from its bookkeeping. Their
//! [`CacheUnderTest::observe_seq`] is [`observe_seq`]; their whole dump's cells
//! [`whole_cells`]. A target of another engine observes its own way (the JSON-lines workers
//! answer `observe` themselves, `isolation::jsonl`).
//!
//! Each distinct per-sequence dump is parsed once per thread ([`ParsedDumps`]).
//!
//! [`CacheUnderTest::observe_seq`]: crate::base::cache::CacheUnderTest::observe_seq

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use crate::base::cache::{HarnessError, SeqObservation};
use crate::base::op::{Pos, SeqId};
use crate::base::state::{parse_seq_state, parse_whole_state, ParseError, StateFormat, WholeCell};
use crate::base::word_hash::BuildWordHasher;

/// A target observed through llama.cpp's layout: what [`observe_seq`] asks of it.
pub trait DumpObserved {
    /// Who it is, for errors.
    fn dump_target_name(&self) -> String;
    /// The layout of its dumps under the current setup (its variant, the setup's memory type).
    fn dump_format(&self) -> StateFormat;
    /// `(seq_pos_min, seq_pos_max)` of `seq`, as the target answers them.
    fn accessors(&mut self, seq: SeqId) -> Result<(Pos, Pos), HarnessError>;
    /// The target's per-sequence dump of `seq` into `into` (its bytes replaced).
    fn dump_into(&mut self, seq: SeqId, into: &mut Vec<u8>) -> Result<(), HarnessError>;
}

/// Observes `seq` of `target` into `out`, every field of it written (its buffers kept where
/// large enough): the accessors, then the cells of its dump.
pub fn observe_seq<T: DumpObserved + ?Sized>(
    target: &mut T,
    seq: SeqId,
    out: &mut SeqObservation,
) -> Result<(), HarnessError> {
    out.seq = seq;
    (out.pos_min, out.pos_max) = target.accessors(seq)?;
    // One buffer per thread for the dumps it observes: their bytes are looked up in the memo
    // below, and kept there only when new.
    let mut bytes = DUMP_BUFFER.take();
    let read = target.dump_into(seq, &mut bytes);
    let format = target.dump_format();
    let parsed = read.map(|()| {
        PARSED_DUMPS.with(|memo| {
            let mut memo = memo.borrow_mut();
            let p = memo.positions(&bytes, format)?;
            out.cells.clone_from(&p.cells);
            out.second_cells.clone_from(&p.second);
            out.third_cells.clone_from(&p.third);
            Ok(())
        })
    });
    DUMP_BUFFER.set(bytes);
    parsed?.map_err(|source| HarnessError::State {
        target: target.dump_target_name(),
        seq,
        source,
    })
}

/// The cells of `whole`, a whole-context dump of `target`.
pub fn whole_cells<T: DumpObserved + ?Sized>(
    target: &T,
    whole: &[u8],
) -> Result<Option<Vec<WholeCell>>, HarnessError> {
    parse_whole_state(whole, target.dump_format())
        .map(Some)
        .map_err(|source| HarnessError::State {
            target: target.dump_target_name(),
            seq: -1,
            source,
        })
}

thread_local! {
    /// This thread's memo of parsed per-sequence dumps ([`ParsedDumps`]).
    static PARSED_DUMPS: RefCell<ParsedDumps> = RefCell::default();
    /// The buffer this thread reads per-sequence dumps into.
    static DUMP_BUFFER: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// How many bytes of dumps a [`ParsedDumps`] keeps as keys before it starts afresh.
const PARSED_DUMPS_BYTES: usize = 32 << 20;

/// The positions a per-sequence dump holds, by the dump's bytes: a dump is parsed once, and the
/// same bytes again (another trial that ends in the same cells) are answered from here. Parsing
/// is a function of the bytes and the format alone, so this changes no observation; it spares
/// a llama.cpp audit, whose states cannot be keyed ([`ObservationMemo`] keys only a target's
/// complete state), the parse and its allocations on every trial: the seed domain's depth-3
/// trials end in far fewer distinct dumps than the 240,198 a trial per sequence makes.
///
/// Dumps are looked up by a hash of their head and tail only ([`dump_hash`]), and the bytes of
/// each candidate are compared whole: hashing a whole dump (kilobytes of K/V rows) cost more
/// than parsing it, while two dumps with the same head (header, cells, first rows) and tail
/// that differ between them are rare and only cost a comparison more.
#[derive(Default)]
struct ParsedDumps {
    /// The format of every dump held (another one empties the memo).
    format: Option<StateFormat>,
    /// Bytes of the dumps held.
    held: usize,
    /// By [`dump_hash`]: the dumps of that hash and their positions.
    positions: HashMap<u64, Vec<(Box<[u8]>, DumpPositions)>, BuildWordHasher>,
}

/// How many bytes of a dump's head, and of its tail, [`dump_hash`] reads.
const DUMP_HASH_HEAD: usize = 512;
const DUMP_HASH_TAIL: usize = 64;

/// A hash of a dump's length, its first [`DUMP_HASH_HEAD`] bytes (the header and the cells'
/// positions and sequences come first) and its last [`DUMP_HASH_TAIL`].
fn dump_hash(bytes: &[u8]) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = BuildWordHasher.build_hasher();
    h.write_usize(bytes.len());
    if bytes.len() <= DUMP_HASH_HEAD + DUMP_HASH_TAIL {
        h.write(bytes);
    } else {
        h.write(&bytes[..DUMP_HASH_HEAD]);
        h.write(&bytes[bytes.len() - DUMP_HASH_TAIL..]);
    }
    h.finish()
}

/// What a per-sequence dump says of each part of the memory (`SeqObservation`'s cells).
#[derive(Clone)]
struct DumpPositions {
    cells: Vec<Pos>,
    second: Option<Vec<Pos>>,
    third: Option<Vec<Pos>>,
}

impl ParsedDumps {
    /// The positions in `bytes`, a per-sequence dump in `format`, parsed now or before.
    fn positions(
        &mut self,
        bytes: &[u8],
        format: StateFormat,
    ) -> Result<&DumpPositions, ParseError> {
        if self.format != Some(format) {
            self.positions.clear();
            self.held = 0;
            self.format = Some(format);
        }
        let hash = dump_hash(bytes);
        let known = self
            .positions
            .get(&hash)
            .and_then(|same_hash| same_hash.iter().position(|(b, _)| **b == *bytes));
        if let Some(at) = known {
            return Ok(&self.positions[&hash][at].1);
        }
        let parsed = parse_seq_state(bytes, format)?;
        let positions = DumpPositions {
            cells: parsed.resident_positions(),
            second: parsed.second_positions(),
            third: parsed.third_positions(),
        };
        if self.held + bytes.len() > PARSED_DUMPS_BYTES {
            self.positions.clear();
            self.held = 0;
        }
        self.held += bytes.len();
        let same_hash = self.positions.entry(hash).or_default();
        same_hash.push((bytes.into(), positions));
        Ok(&same_hash.last().expect("pushed").1)
    }
}
