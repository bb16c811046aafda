//! What a sequence's accessors and dumps must agree on, per memory type: the ground of I1 and
//! I2 beyond the attention cache (docs/memory-types.md, "What `seq_pos_min`/`seq_pos_max` are,
//! per type", cites each source line).
//!
//! llama.h defines the accessors once for every memory: `seq_pos_min` "Returns the smallest
//! position present in the memory for the specified sequence", `seq_pos_max` the largest, -1 when
//! the sequence is empty, and "all positions in the range [pos_min, pos_max] are guaranteed to be
//! present in the memory". What "present" means depends on the memory's parts, all of which are
//! in the sequence's own dump ([`SeqObservation::cells`], [`SeqObservation::second_cells`]):
//!
//! - **kv**: a position is present when a cell of the sequence holds it.
//! - **recurrent**: the sequence's state cell holds the position of the last token it absorbed
//!   (`llama_memory_recurrent::seq_pos_min/max` are the extremes over the cells that hold the
//!   sequence, src/llama-memory-recurrent.cpp:364-395 / :390-416): the same rule on the state
//!   cells.
//! - **iswa**: the base (full-attention) cache holds every position; the windowed cache holds the
//!   last ones, and the llama.h note "typically non-zero only for SWA caches" says `pos_min` is
//!   the windowed cache's (`llama_kv_cache_iswa::seq_pos_min`, src/llama-kv-cache-iswa.cpp:142-149).
//!   The windowed *dump* leaves out cells masked for the next token that the windowed *cache*
//!   may still hold, so the dumps pin `pos_max` (the base cache's largest position) and bound
//!   `pos_min`: no smaller than the base cache's smallest position, no larger than the windowed
//!   dump's smallest one. The window itself is judged by [`super::swa_window`]. llama.cpp
//!   answers from the windowed cache alone, so once that cache has dropped positions the base
//!   cache still holds and an op brings them to the fore (a `seq_cp` below the window, a removal
//!   of its tail), the answers fall below the base cache's: I1 findings, real by llama.h's words
//!   (`corpora/i1_iswa_*.json`). A twin loaded from one sequence's dump is judged against the
//!   original's own answers instead ([`reloaded`]).
//! - **hybrid**: a position is present when both parts can serve it: the attention cache holds
//!   it and it lies within the recurrent states' range (`llama_memory_hybrid::seq_pos_min` is
//!   the max of the parts' minimums, `seq_pos_max` the min of their maximums,
//!   src/llama-memory-hybrid.cpp:172-180: the extremes of that intersection whenever it is not
//!   empty). Where the parts do not overlap nothing is present and llama.h's answer is -1.
//! - **hybrid_iswa**: the hybrid rule over the iSWA pair's base cells and the states
//!   (src/llama-memory-hybrid-iswa.cpp `seq_pos_min`/`seq_pos_max`), where the attention part's
//!   minimum is the windowed cache's: `pos_min` may lie up to the windowed dump's smallest
//!   position (no lower than the states' minimum), as for iswa.
//! - **dsv4**: the raw pair's base cache holds every position; `seq_pos_max` is its largest and
//!   `seq_pos_min` answers the same boundary by design (src/llama-kv-cache-dsv4.cpp:1555-1572),
//!   so I1 holds dsv4 to `pos_min == pos_max` (docs/results.md decides that reading).

use crate::base::cache::SeqObservation;
use crate::base::op::{MemoryType, Pos};

/// The accessor answers a sequence's dumps allow: `pos_min` in `min.0..=min.1`, `pos_max`
/// exactly `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allowed {
    /// The smallest and largest `pos_min` the dumps allow (equal except for iSWA).
    pub min: (Pos, Pos),
    /// The one `pos_max` the dumps allow.
    pub max: Pos,
}

impl Allowed {
    fn exact((min, max): (Pos, Pos)) -> Allowed {
        Allowed {
            min: (min, min),
            max,
        }
    }

    /// Exactly the accessors `s` answered.
    pub fn answered(s: &SeqObservation) -> Allowed {
        Allowed::exact((s.pos_min, s.pos_max))
    }

    /// Whether the sequence's accessors are allowed.
    pub fn admits(&self, s: &SeqObservation) -> bool {
        (self.min.0..=self.min.1).contains(&s.pos_min) && s.pos_max == self.max
    }
}

/// The extremes of sorted positions, -1/-1 when there are none.
fn extremes(sorted: impl DoubleEndedIterator<Item = Pos> + Clone) -> (Pos, Pos) {
    let min = sorted.clone().next().unwrap_or(-1);
    let max = sorted.last().unwrap_or(-1);
    (min, max)
}

/// The positions present in the memory for the sequence, sorted, that I2 judges contiguous and,
/// but for an iSWA memory's `pos_min`, I1 judges the accessors against.
pub fn present(
    memory: MemoryType,
    s: &SeqObservation,
) -> impl DoubleEndedIterator<Item = Pos> + Clone + '_ {
    // Hybrid: the attention cells within the recurrent states' range (an empty range when the
    // recurrent part holds nothing: min -1 > max -2).
    let (lo, hi) = match s.recurrent_cells(memory) {
        Some(recurrent) => match extremes(recurrent.iter().copied()) {
            (-1, -1) => (-1, -2),
            range => range,
        },
        None => (Pos::MIN, Pos::MAX),
    };
    s.cells
        .iter()
        .copied()
        .filter(move |&p| (lo..=hi).contains(&p))
}

/// The accessor answers a twin may give after loading only `s`'s per-sequence dump
/// (`llama_state_seq_set_data` into an emptied twin), judged against the original's own
/// accessors, not against its cells. An iSWA memory answers both accessors from the windowed
/// cache (src/llama-kv-cache-iswa.cpp:141-148), whose per-sequence dump leaves out the cells
/// masked for the sequence's next token (src/llama-kv-cache.cpp:2098-2102): the twin's windowed
/// cache holds the dump alone, so its `pos_min` may rise from the original's to the dump's
/// smallest position, and its `pos_max`, the dump's largest (never masked), is the original's.
/// The original's own -1 comes back as -1, whatever its base cache holds.
pub fn reloaded(memory: MemoryType, s: &SeqObservation) -> Allowed {
    match s.windowed_cells(memory) {
        Some(windowed) => Allowed {
            min: (
                s.pos_min,
                windowed
                    .first()
                    .copied()
                    .unwrap_or(s.pos_min)
                    .max(s.pos_min),
            ),
            max: s.pos_max,
        },
        _ => Allowed::answered(s),
    }
}

/// The accessor answers the sequence's dumps allow under `memory`. With a windowed cache
/// (iswa, hybrid_iswa) `pos_min` is that cache's, or for hybrid_iswa the larger of it and the
/// states' minimum, so it may lie up to the windowed dump's smallest position (raised to the
/// states' range).
pub fn allowed(memory: MemoryType, s: &SeqObservation) -> Allowed {
    let (min, max) = extremes(present(memory, s));
    if memory == MemoryType::Dsv4 {
        // dsv4 answers `seq_pos_min` with the raw cache's `seq_pos_max` on purpose: "the
        // compressed DSV4 state cannot be rolled back within that window. Report only the
        // current boundary" (llama-kv-cache-dsv4.cpp:1555-1564); docs/results.md decides it.
        return Allowed::exact((max, max));
    }
    match s.windowed_cells(memory) {
        Some(windowed) if max >= 0 => {
            let states_min = s
                .recurrent_cells(memory)
                .and_then(|r| r.first().copied())
                .unwrap_or(Pos::MIN);
            let highest = windowed.first().copied().unwrap_or(max).max(states_min);
            Allowed {
                min: (min, highest.clamp(min, max)),
                max,
            }
        }
        _ => Allowed::exact((min, max)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(pos_min: Pos, pos_max: Pos, cells: &[Pos], second: Option<&[Pos]>) -> SeqObservation {
        SeqObservation {
            seq: 0,
            pos_min,
            pos_max,
            cells: cells.to_vec(),
            second_cells: second.map(<[Pos]>::to_vec),
            third_cells: None,
        }
    }

    #[test]
    fn kv_and_recurrent_are_the_cells_extremes() {
        for memory in [MemoryType::Kv, MemoryType::Recurrent] {
            assert_eq!(
                allowed(memory, &seq(0, 0, &[2, 3, 7], None)),
                Allowed::exact((2, 7))
            );
            assert_eq!(
                allowed(memory, &seq(0, 0, &[], None)),
                Allowed::exact((-1, -1))
            );
        }
    }

    #[test]
    fn iswa_pins_pos_max_and_bounds_pos_min_by_the_windowed_dump() {
        // Measured on both pins (memtypes_load_gemma2_*): base 0..4, windowed dump 1..4,
        // accessors 0/4.
        let s = seq(0, 4, &[0, 1, 2, 3, 4], Some(&[1, 2, 3, 4]));
        let a = allowed(MemoryType::Iswa, &s);
        assert_eq!(
            a,
            Allowed {
                min: (0, 1),
                max: 4
            }
        );
        assert!(a.admits(&s));
        assert!(
            !a.admits(&seq(2, 4, &[], None)),
            "pos_min above the windowed dump"
        );
        assert!(
            !a.admits(&seq(0, 3, &[], None)),
            "pos_max below the base cache's"
        );
        let empty = seq(-1, -1, &[], Some(&[]));
        assert!(allowed(MemoryType::Iswa, &empty).admits(&empty));
    }

    #[test]
    fn a_reloaded_iswa_sequence_answers_what_its_windowed_cache_answered() {
        // Measured on both pins (fuzz-gemma2, case 27): seq_add(0, 0, 1, 1), a decode that
        // overwrote the masked cells of positions 1, seq_cp(0, 1, 0, 2): the base cache gives
        // seq 1 positions 1, 1, the windowed cache nothing, and the accessors answer -1/-1.
        // A twin loaded from seq 1's dump answers -1/-1 too: the original's own answer.
        let s = seq(-1, -1, &[1, 1], Some(&[]));
        assert!(reloaded(MemoryType::Iswa, &s).admits(&s));
        assert!(
            !allowed(MemoryType::Iswa, &s).admits(&s),
            "I1 still judges the original against its base cache"
        );
        // The windowed cache held masked cells below the dump: the twin's pos_min may rise to
        // the dump's smallest position, no further, and its pos_max stays.
        let s = seq(0, 4, &[0, 1, 2, 3, 4], Some(&[1, 2, 3, 4]));
        let r = reloaded(MemoryType::Iswa, &s);
        assert!(r.admits(&seq(1, 4, &[], None)) && r.admits(&s));
        assert!(!r.admits(&seq(2, 4, &[], None)) && !r.admits(&seq(1, 3, &[], None)));
        for memory in [MemoryType::Kv, MemoryType::Recurrent, MemoryType::Hybrid] {
            assert_eq!(reloaded(memory, &s), Allowed::exact((0, 4)));
        }
    }

    #[test]
    fn hybrid_iswa_is_the_intersection_with_the_windowed_pos_min() {
        // Measured (memtypes_load_lfm2_swa_*): base 0..5, windowed dump 2..5, state at 5: 5/5.
        let mut s = seq(5, 5, &[0, 1, 2, 3, 4, 5], Some(&[2, 3, 4, 5]));
        s.third_cells = Some(vec![5]);
        assert_eq!(allowed(MemoryType::HybridIswa, &s), Allowed::exact((5, 5)));
        // The state at 5 after a copy of cells 0..2: nothing is present in both parts.
        let mut split = seq(5, 2, &[0, 1, 2], Some(&[0, 1, 2]));
        split.third_cells = Some(vec![5]);
        assert!(!allowed(MemoryType::HybridIswa, &split).admits(&split));
        // The state below the window: pos_min may lie anywhere up to the windowed dump's first
        // position, as for iswa (the windowed cache may hold masked cells the dump leaves out).
        // (States at 0 and 5 span every base position.)
        let mut low = seq(0, 5, &[0, 1, 2, 3, 4, 5], Some(&[2, 3, 4, 5]));
        low.third_cells = Some(vec![0, 5]);
        let a = allowed(MemoryType::HybridIswa, &low);
        assert_eq!(
            a,
            Allowed {
                min: (0, 2),
                max: 5
            }
        );
        assert!(a.admits(&low) && !a.admits(&seq(3, 5, &[], None)));
        // The second part is the windowed cache here, not the states.
        assert_eq!(
            low.recurrent_cells(MemoryType::HybridIswa),
            Some(&[0, 5][..])
        );
        assert_eq!(
            low.recurrent_cells(MemoryType::Hybrid),
            Some(&[2, 3, 4, 5][..])
        );
    }

    #[test]
    fn hybrid_is_the_intersection_of_its_parts() {
        // Consistent: attention 0..5, recurrent state at 5 (measured: accessors 5/5).
        let s = seq(5, 5, &[0, 1, 2, 3, 4, 5], Some(&[5]));
        assert_eq!(allowed(MemoryType::Hybrid, &s), Allowed::exact((5, 5)));
        // A partial copy: the attention part got 0..2, the recurrent part the whole state at 5.
        // llama.cpp's formula answers max(0, 5) / min(2, 5) = 5/2; nothing is present in both.
        let split = seq(5, 2, &[0, 1, 2], Some(&[5]));
        assert_eq!(
            allowed(MemoryType::Hybrid, &split),
            Allowed::exact((-1, -1))
        );
        assert!(!allowed(MemoryType::Hybrid, &split).admits(&split));
        // One part empty.
        let no_state = seq(-1, -1, &[0, 1], Some(&[]));
        assert!(allowed(MemoryType::Hybrid, &no_state).admits(&no_state));
        assert_eq!(present(MemoryType::Hybrid, &no_state).count(), 0);
    }
}
