//! The op kinds, each declared once: its JSON name, the llama.h function it stands for, its
//! group, its weight in the fuzzer's generators and the domain fields that enumerate it.
//!
//! Everything else that tells ops apart is an exhaustive `match` over [`Op`](super::op::Op) or
//! [`OpKind`], so that a new kind is a compiler error in every place that must handle it
//! (`tidy::ops_matched_exhaustively` keeps `_ =>` and `matches!` over ops out of the rest of the
//! code; `ops::every_kind_*` in `tests/it` walks [`OpKind::ALL`] through every renderer, the
//! generators, the shrinker's moves and the domain). ARCHITECTURE.md, "Adding an op", lists
//! the places.

/// Declares the kinds and [`OpKind::ALL`] from one list, so that the list cannot miss a kind.
macro_rules! op_kinds {
    ($($(#[$doc:meta])* $kind:ident,)*) => {
        /// The kind of an [`Op`](super::op::Op): its variant without arguments.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum OpKind {
            $($(#[$doc])* $kind,)*
        }

        impl OpKind {
            /// Every kind, in the order of [`Op`](super::op::Op)'s variants.
            pub const ALL: &'static [OpKind] = &[$(OpKind::$kind,)*];
        }
    };
}

op_kinds! {
    /// `llama_memory_seq_rm`.
    SeqRm,
    /// `llama_memory_seq_cp`.
    SeqCp,
    /// `llama_memory_seq_keep`.
    SeqKeep,
    /// `llama_memory_seq_add`.
    SeqAdd,
    /// `llama_memory_seq_div`.
    SeqDiv,
    /// `llama_memory_clear`.
    Clear,
    /// `llama_decode`.
    Decode,
    /// `llama_state_seq_get_data`.
    StateSeqSave,
    /// `llama_state_seq_set_data`.
    StateSeqLoad,
    /// `llama_state_get_data`.
    StateSave,
    /// `llama_state_set_data`.
    StateLoad,
}

/// The two families of ops: the memory API with decode, and state save/load. The generators
/// draw a group first ([`OpGroup::weight`]), then a kind of it ([`OpKind::weight`]); a domain
/// enumerates the state group only when asked (`state = true`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpGroup {
    /// `llama_memory_*` and `llama_decode`.
    Memory,
    /// `llama_state_*`.
    State,
}

impl OpGroup {
    /// The group's weight when a generator draws from both (memory ops five times as often as
    /// state ops: a state op needs memory ops before it to have something to save).
    pub const fn weight(self) -> u32 {
        match self {
            OpGroup::Memory => 5,
            OpGroup::State => 1,
        }
    }

    /// The kinds of this group, in [`OpKind::ALL`] order.
    pub fn kinds(self) -> impl Iterator<Item = OpKind> {
        OpKind::ALL
            .iter()
            .copied()
            .filter(move |k| k.group() == self)
    }
}

/// What is declared of each kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KindInfo {
    /// The JSON `op` field (`seq_rm`), also the op's name in reports and coverage.
    pub name: &'static str,
    /// The llama.h function the op calls (a state op with non-zero flags calls its `_ext` form).
    pub llama_fn: &'static str,
    /// The op's family.
    pub group: OpGroup,
    /// Its weight among the kinds of its group in the fuzzer's random generators (proptest's
    /// and `arbitrary`'s draw with the same weights).
    pub weight: u32,
    /// The fields of a `Domain` that enumerate the kind: with all of them empty (or off) a
    /// domain lists none of it, with the others empty it still does.
    pub domain_fields: &'static [&'static str],
}

impl OpKind {
    /// The declaration of this kind: the one table.
    pub const fn info(self) -> KindInfo {
        use OpGroup::{Memory, State};
        let (name, llama_fn, group, weight, domain_fields): (_, _, _, _, &[&str]) = match self {
            OpKind::SeqRm => (
                "seq_rm",
                "llama_memory_seq_rm",
                Memory,
                8,
                &["seqs", "ranges", "rm_all", "beyond_seqs"],
            ),
            OpKind::SeqCp => (
                "seq_cp",
                "llama_memory_seq_cp",
                Memory,
                6,
                &["copies", "seqs", "ranges", "copy_ranges"],
            ),
            OpKind::SeqKeep => (
                "seq_keep",
                "llama_memory_seq_keep",
                Memory,
                3,
                &["keep", "seqs"],
            ),
            OpKind::SeqAdd => (
                "seq_add",
                "llama_memory_seq_add",
                Memory,
                6,
                &["seqs", "ranges", "deltas"],
            ),
            OpKind::SeqDiv => (
                "seq_div",
                "llama_memory_seq_div",
                Memory,
                3,
                &["seqs", "ranges", "divisors"],
            ),
            OpKind::Clear => ("clear", "llama_memory_clear", Memory, 1, &["clear"]),
            OpKind::Decode => (
                "decode",
                "llama_decode",
                Memory,
                10,
                &["seqs", "decode_next", "decode_shared", "beyond_seqs"],
            ),
            OpKind::StateSeqSave => (
                "state_seq_save",
                "llama_state_seq_get_data",
                State,
                3,
                &["state", "seqs", "state_flags"],
            ),
            OpKind::StateSeqLoad => (
                "state_seq_load",
                "llama_state_seq_set_data",
                State,
                3,
                &["state", "seqs", "state_flags", "load_truncate"],
            ),
            OpKind::StateSave => ("state_save", "llama_state_get_data", State, 1, &["state"]),
            OpKind::StateLoad => (
                "state_load",
                "llama_state_set_data",
                State,
                1,
                &["state", "load_truncate"],
            ),
        };
        KindInfo {
            name,
            llama_fn,
            group,
            weight,
            domain_fields,
        }
    }

    /// Whether the op moves positions (`seq_add`, `seq_div`): what a memory that cannot shift
    /// refuses (`Arch::can_shift`).
    pub const fn moves_positions(self) -> bool {
        match self {
            OpKind::SeqAdd | OpKind::SeqDiv => true,
            OpKind::SeqRm
            | OpKind::SeqCp
            | OpKind::SeqKeep
            | OpKind::Clear
            | OpKind::Decode
            | OpKind::StateSeqSave
            | OpKind::StateSeqLoad
            | OpKind::StateSave
            | OpKind::StateLoad => false,
        }
    }

    /// The JSON `op` field.
    pub const fn name(self) -> &'static str {
        self.info().name
    }

    /// The llama.h function.
    pub const fn llama_fn(self) -> &'static str {
        self.info().llama_fn
    }

    /// The family.
    pub const fn group(self) -> OpGroup {
        self.info().group
    }

    /// The generator weight within the group.
    pub const fn weight(self) -> u32 {
        self.info().weight
    }

    /// The domain fields that enumerate it.
    pub const fn domain_fields(self) -> &'static [&'static str] {
        self.info().domain_fields
    }

    /// The kind called `name` (a JSON `op` field), if any.
    pub fn from_name(name: &str) -> Option<OpKind> {
        OpKind::ALL.iter().copied().find(|k| k.name() == name)
    }
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
