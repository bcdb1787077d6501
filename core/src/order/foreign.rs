//! The record of foreign uses: which streams used an allocation besides its owner, and at which
//! cursor. A leaf: the device holds it, `order/mod.rs` reads and writes it.

use alloc::vec::Vec;
use hashbrown::HashMap;

/// Allocations used by streams other than their owner: which streams, at which cursor. A later
/// use on any other stream (the owner included) waits for those; entries go when the owner has
/// waited for them all or the allocation is freed.
#[derive(Debug, Default)]
pub(crate) struct ForeignUses(HashMap<u64, Vec<(usize, u64)>>);

impl ForeignUses {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The allocation `id` is gone: nothing can use it again.
    pub fn forget(&mut self, id: u64) {
        self.0.remove(&id);
    }

    /// The memory of allocation `from` now belongs to `to` (a bind): its uses follow it, for a
    /// later use of `to` to wait for (a bind inside a recording cannot wait itself).
    pub fn hand_over(&mut self, from: u64, to: u64) {
        if let Some(uses) = self.0.remove(&from) {
            for (stream, cursor) in uses {
                self.record(to, stream, cursor);
            }
        }
    }

    pub fn record(&mut self, id: u64, stream: usize, cursor: u64) {
        let uses = self.0.entry(id).or_default();
        match uses.iter_mut().find(|u| u.0 == stream) {
            Some(u) => u.1 = cursor,
            None => uses.push((stream, cursor)),
        }
    }

    /// The uses of `id` by streams other than `current` and `owner`.
    pub fn others(&self, id: u64, current: usize, owner: usize) -> Vec<(usize, u64)> {
        self.0.get(&id).map_or_else(Vec::new, |uses| {
            uses.iter()
                .copied()
                .filter(|&(user, _)| user != current && user != owner)
                .collect()
        })
    }
}
