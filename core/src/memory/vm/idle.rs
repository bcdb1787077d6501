//! What a granule pool gives back: the cache of mapped granules no allocation touches, the
//! list of retiring granules (handed to the drop queue to unmap after a fence), the compaction
//! that keeps both lists within twice the pool's granules, and at teardown every granule with
//! memory behind it.
//!
//! Owns those two lists and their bookkeeping on [`GranulePool`]. Does not own when a granule
//! is given back (the manager's policy) nor placement and the granules' use counts (`vm.rs`).

use super::{Backing, Granule, GranulePool};
use crate::memory::retire::{Retire, RetireToken};
use alloc::sync::Arc;
use alloc::vec::Vec;

impl GranulePool {
    /// Puts granule `g` on top of the cache. Entries go stale (a cached granule used again, or
    /// given back) and a granule used and freed over and over is pushed each time, so past
    /// twice the granules (at least 16 entries) the cache is compacted: stale entries go, and of
    /// a granule's entries only the last (the one taken first) stays. What
    /// [`Self::take_cached`] returns, and in what order, does not change; the cache stays
    /// within twice the pool's granules.
    pub(super) fn cache_push(&mut self, g: u32) {
        self.cache.push(g);
        let granules = &self.granules;
        compact(&mut self.cache, granules.len(), |c| idle(granules, c));
    }

    /// Whether granule `g` is mapped, unused and unguarded (what the cache should hold).
    fn idle(&self, g: u32) -> bool {
        idle(&self.granules, g)
    }

    /// Takes an idle granule out of the cache to give back: its index and the shim's memory
    /// handle; the granule is unmapped from the pool's point of view (the caller unmaps it, or
    /// retires it with [`Self::retire`]).
    pub(crate) fn take_cached(&mut self) -> Option<(u32, u64)> {
        while let Some(g) = self.cache.pop() {
            if !self.idle(g) {
                continue; // stale: used or given back since it was cached
            }
            let Backing::Mapped(memory) =
                core::mem::replace(&mut self.granules[g as usize].backing, Backing::Unmapped)
            else {
                continue;
            };
            self.mapped -= 1;
            self.unmaps += 1;
            return Some((g, memory));
        }
        None
    }

    /// Marks granule `g` (just taken from the cache) as retiring with `memory` until `token`
    /// says its fence passed: it still counts as held.
    pub(crate) fn retire(&mut self, g: u32, memory: u64, token: Arc<RetireToken>) {
        self.granules[g as usize].backing = Backing::Retiring(memory, token);
        self.mapped += 1;
        self.retiring_now += 1;
        self.retiring.push(g);
        // Entries go stale when a retiring granule is taken back before `settle` runs (a
        // reservation that trims idle granules and then places into one of them, over and
        // over): compacted as the cache is (`settle` reads only the granule).
        let granules = &self.granules;
        compact(&mut self.retiring, granules.len(), |r| {
            matches!(granules[r as usize].backing, Backing::Retiring(..))
        });
    }

    /// Forgets the retiring granules the drop queue has unmapped since (their fence passed):
    /// their memory and budget are gone, so they stop counting as held. Run before anything
    /// reads [`Self::held`] or [`Self::mapped`]. Returns how many went.
    pub(crate) fn settle(&mut self) -> u32 {
        let mut gone = 0;
        let granules = &mut self.granules;
        self.retiring.retain(|&g| {
            let gr = &mut granules[g as usize];
            let Backing::Retiring(_, token) = &gr.backing else {
                return false; // taken back (`need`) or drained since
            };
            match token.state() {
                Retire::Pending | Retire::Unmapping => true,
                Retire::Done => {
                    gr.backing = Backing::Unmapped;
                    gone += 1;
                    false
                }
                Retire::Cancelled => false,
            }
        });
        self.mapped -= gone;
        self.retiring_now -= gone;
        gone
    }

    /// Every granule with memory behind it, as (index, shim memory, retire token if retiring),
    /// for teardown: the pool forgets them.
    pub(crate) fn drain_backed(&mut self) -> Vec<(u32, u64, Option<Arc<RetireToken>>)> {
        let mut out = Vec::new();
        for (i, gr) in self.granules.iter_mut().enumerate() {
            match core::mem::replace(&mut gr.backing, Backing::Unmapped) {
                Backing::Unmapped => {}
                Backing::Mapped(m) => out.push((i as u32, m, None)),
                Backing::Retiring(m, t) => out.push((i as u32, m, Some(t))),
            }
        }
        self.mapped = 0;
        self.retiring_now = 0;
        self.cache.clear();
        self.retiring.clear();
        out
    }

    /// Entries in the retiring list, stale ones included.
    #[cfg(test)]
    pub(crate) fn retiring_len(&self) -> usize {
        self.retiring.len()
    }

    /// Entries in the cache, stale ones included, and the granules of the range.
    #[cfg(test)]
    pub(crate) fn cache_len(&self) -> (usize, usize) {
        (self.cache.len(), self.granules.len())
    }
}

/// Whether granule `g` of `granules` is mapped, unused and unguarded.
fn idle(granules: &[Granule], g: u32) -> bool {
    let gr = &granules[g as usize];
    gr.users == 0 && gr.guards == 0 && matches!(gr.backing, Backing::Mapped(_))
}

/// Keeps a list of granule indices whose entries go stale (`keep` says which still count)
/// within twice the `granules` (at least 16 entries): past that, the stale entries go, and of a
/// granule's entries only the last stays, in order. Amortised: at least `granules` pushes
/// separate two compactions.
fn compact(list: &mut Vec<u32>, granules: usize, keep: impl Fn(u32) -> bool) {
    if list.len() <= (2 * granules).max(16) {
        return;
    }
    let mut seen = alloc::vec![false; granules];
    let mut kept = Vec::with_capacity(granules);
    for &c in list.iter().rev() {
        if !core::mem::replace(&mut seen[c as usize], true) && keep(c) {
            kept.push(c);
        }
    }
    kept.reverse();
    *list = kept;
}
