//! The in-trace state buffers that `state_seq_save` / `state_save` write and the loads read:
//! one store per target, emptied at every reset, so a trace's buffers never outlive it.

use std::collections::BTreeMap;

use crate::base::cache::OpOutcome;
use crate::base::op::{damaged, Slot};

/// Named byte buffers of one trial.
#[derive(Clone, Debug, Default)]
pub struct SlotStore {
    slots: BTreeMap<Slot, Vec<u8>>,
}

impl SlotStore {
    /// Forgets every buffer (at reset).
    pub fn clear(&mut self) {
        // Most trials save nothing: an empty map is left as it is (clearing one still ran
        // the map's drop, once per trial).
        if !self.slots.is_empty() {
            self.slots.clear();
        }
    }

    /// Whether no buffer is held.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Stores `bytes` under `slot`, replacing what it held.
    pub fn save(&mut self, slot: &Slot, bytes: Vec<u8>) {
        self.slots.insert(slot.clone(), bytes);
    }

    /// Appends every buffer to a state key: the count, then each slot's name and bytes, each
    /// preceded by its length (a state-space search keys the context by this).
    pub fn write_key(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.slots.len() as u64).to_le_bytes());
        for (slot, bytes) in &self.slots {
            let name = slot.to_string();
            out.extend_from_slice(&(name.len() as u64).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            out.extend_from_slice(bytes);
        }
    }

    /// The bytes of `slot`, damaged as the load asks (`truncate`, `flip`); `Err` with the
    /// outcome to report when the slot was never written in this trial (a load of nothing is
    /// refused the same way on every target, so two targets still agree).
    pub fn load(
        &self,
        slot: &Slot,
        truncate: Option<u32>,
        flip: Option<u32>,
    ) -> Result<Vec<u8>, OpOutcome> {
        match self.slots.get(slot) {
            Some(bytes) => Ok(damaged(bytes, truncate, flip)),
            None => Err(OpOutcome::Refused {
                reason: format!("slot '{slot}' holds nothing: no save into it in this trial"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_see_saved_bytes_damaged_as_asked_and_nothing_after_clear() {
        let a = Slot::new("a").unwrap();
        let mut s = SlotStore::default();
        assert!(matches!(
            s.load(&a, None, None),
            Err(OpOutcome::Refused { .. })
        ));
        s.save(&a, vec![1, 2, 3, 4]);
        assert_eq!(s.load(&a, None, None).unwrap(), vec![1, 2, 3, 4]);
        assert_eq!(s.load(&a, Some(2), None).unwrap(), vec![1, 2]);
        assert_eq!(s.load(&a, None, Some(1)).unwrap(), vec![1, 0xfd, 3, 4]);
        assert_eq!(s.load(&a, Some(1), Some(3)).unwrap(), vec![1]);
        s.clear();
        assert!(s.load(&a, None, None).is_err());
    }
}
