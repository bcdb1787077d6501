//! What a granule pool gives back: the cache of mapped granules no allocation touches (a mapping
//! goes back whole, once every granule of it is idle), the list of retiring mappings (handed to
//! the drop queue to unmap after a fence), the compaction that keeps both lists within twice the
//! pool's granules, and at teardown every mapping with memory behind it.
//!
//! Owns those two lists and their bookkeeping on [`GranulePool`]. Does not own when a mapping
//! is given back (the manager's policy), placement and the granules' use counts (`vm.rs`), nor
//! the mappings and their counts of granules in use (`vm/mapping.rs`).

use super::bits::MappedBits;
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
    #[inline]
    pub(super) fn cache_push(&mut self, g: u32) {
        self.cache.push(g);
        self.compact_cache();
    }

    /// Drops the cache's stale entries once it holds more than twice the pool's granules.
    #[inline]
    pub(super) fn compact_cache(&mut self) {
        if self.cache.len() > compact_past(self.granules.len()) {
            let (uses, bits) = (&self.uses, &self.mapped_bits);
            compact(&mut self.cache, uses.len(), |c| idle(uses, bits, c));
        }
    }

    /// Whether granule `g` is mapped, unused and unguarded (what the cache should hold).
    pub(super) fn idle(&self, g: u32) -> bool {
        idle(&self.uses, &self.mapped_bits, g)
    }

    /// Takes a mapping whose every granule is idle out of the cache to give back: its first
    /// granule, its granules and the shim's memory handle; it is unmapped from the pool's point
    /// of view (the caller unmaps it, or retires it with [`Self::retire`]). An idle granule
    /// whose mapping is still partly in use leaves the cache: the mapping's last granule to go
    /// idle is pushed then, and brings the whole mapping back.
    pub(crate) fn take_cached(&mut self) -> Option<(u32, u32, u64)> {
        while let Some(g) = self.cache.pop() {
            if !self.idle(g) {
                continue; // stale: used or given back since it was cached
            }
            let (head, len) = self.mapping(g);
            if self.mapping_in_use(head) {
                continue; // part of its mapping is in use
            }
            let Backing::Mapped(memory) = self.granules[head as usize].backing else {
                continue;
            };
            for gr in &mut self.granules[head as usize..(head + len) as usize] {
                gr.backing = Backing::Unmapped;
            }
            self.mapped_bits.set(head, len, false);
            self.mapped -= len;
            self.unmaps += 1;
            return Some((head, len, memory));
        }
        None
    }

    /// Marks the mapping of `len` granules from `head` (just taken from the cache) as retiring
    /// with `memory` until `token` says its fence passed: it still counts as held.
    pub(crate) fn retire(&mut self, head: u32, len: u32, memory: u64, token: Arc<RetireToken>) {
        // Just taken from the cache: unmapped in the pool's records and bits.
        debug_assert!((head..head + len).all(|g| {
            matches!(self.granules[g as usize].backing, Backing::Unmapped)
                && !self.mapped_bits.get(g)
        }));
        for gr in &mut self.granules[head as usize..(head + len) as usize] {
            gr.backing = Backing::Retiring(memory, Arc::clone(&token));
        }
        self.mapped += len;
        self.retiring_now += len;
        self.retiring.push(head);
        // Entries go stale when a retiring mapping is taken back before `settle` runs (a
        // reservation that trims idle granules and then places into one of them, over and
        // over): compacted as the cache is (`settle` reads only the granules).
        if self.retiring.len() > compact_past(self.granules.len()) {
            let granules = &self.granules;
            compact(&mut self.retiring, granules.len(), |r| {
                retiring_head(granules, r)
            });
        }
    }

    /// Forgets the retiring granules the drop queue has unmapped since (their fence passed):
    /// their memory and budget are gone, so they stop counting as held. Run before anything
    /// reads [`Self::held`] or [`Self::mapped`]. Returns how many went.
    #[inline]
    pub(crate) fn settle(&mut self) -> u32 {
        if self.retiring.is_empty() {
            return 0; // nothing retiring (always, under `PageRelease::Immediate`)
        }
        let mut gone = 0;
        let granules = &mut self.granules;
        self.retiring.retain(|&g| {
            let gr = &granules[g as usize];
            let (Backing::Retiring(_, token), true) = (&gr.backing, gr.head == g) else {
                return false; // taken back (`need`) or drained since
            };
            match token.state() {
                Retire::Pending | Retire::Unmapping => true,
                Retire::Done => {
                    let len = gr.len;
                    for u in &mut granules[g as usize..(g + len) as usize] {
                        u.backing = Backing::Unmapped;
                    }
                    gone += len;
                    false
                }
                Retire::Cancelled => false,
            }
        });
        self.mapped -= gone;
        self.retiring_now -= gone;
        gone
    }

    /// Every mapping with memory behind it, as (first granule, granules, shim memory, retire
    /// token if retiring), for teardown: the pool forgets them.
    pub(crate) fn drain_backed(&mut self) -> Vec<(u32, u32, u64, Option<Arc<RetireToken>>)> {
        let mut out = Vec::new();
        for (i, gr) in self.granules.iter_mut().enumerate() {
            let head = gr.head == i as u32;
            match core::mem::replace(&mut gr.backing, Backing::Unmapped) {
                Backing::Unmapped => {}
                _ if !head => {}
                Backing::Mapped(m) => out.push((i as u32, gr.len, m, None)),
                Backing::Retiring(m, t) => out.push((i as u32, gr.len, m, Some(t))),
            }
        }
        self.mapped_bits.clear_all();
        self.mapped = 0;
        self.retiring_now = 0;
        self.pinned = 0;
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

/// Whether granule `g` is mapped (its bit, set while its backing is
/// [`Backing::Mapped`]), unused and unguarded (no `uses`).
fn idle(uses: &[u32], bits: &MappedBits, g: u32) -> bool {
    uses[g as usize] == 0 && bits.get(g)
}

/// Whether granule `g` of `granules` is the first of a retiring mapping (what the retiring list
/// should hold).
fn retiring_head(granules: &[Granule], g: u32) -> bool {
    let gr = &granules[g as usize];
    gr.head == g && matches!(gr.backing, Backing::Retiring(..))
}

/// The length past which [`compact`] compacts a list over `granules` granules.
#[inline]
fn compact_past(granules: usize) -> usize {
    (2 * granules).max(16)
}

/// Keeps a list of granule indices whose entries go stale (`keep` says which still count)
/// within twice the `granules` (at least 16 entries): past that, the stale entries go, and of a
/// granule's entries only the last stays, in order. Amortised: at least `granules` pushes
/// separate two compactions.
#[inline(never)]
fn compact(list: &mut Vec<u32>, granules: usize, keep: impl Fn(u32) -> bool) {
    if list.len() <= compact_past(granules) {
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
