//! A pool whose every allocation is a device page of its own: the persistent pool (weights, reused
//! by exact size) and the dedicated pool (one page per reservation, released soon after it frees).
//!
//! Owns the pages and the free pages by size. Does not own when free pages go back: the manager
//! asks, at cleanup, for the free pages this pool's policy lets go.

use super::pool::MAX_BLOCKS;
use super::report::Usage;
use super::sliced::Used;
use alloc::vec::Vec;
use hashbrown::HashMap;

/// One page, one allocation.
#[derive(Debug)]
pub(crate) struct WholePage<P> {
    pub raw: P,
    pub addr: u64,
    /// Bytes of the page (the request rounded to the alignment).
    pub size: u64,
    pub used: Option<Used>,
    pub guards: u32,
}

/// Pages holding one allocation each, reused only by exact size.
#[derive(Debug)]
pub(crate) struct WholePagePool<P> {
    pages: Vec<Option<WholePage<P>>>,
    free_slots: Vec<u32>,
    /// Free pages by size, most recently freed last.
    free_by_size: HashMap<u64, Vec<u32>>,
    pub pages_live: u32,
    pub pages_peak: u32,
}

impl<P> Default for WholePagePool<P> {
    fn default() -> Self {
        Self {
            pages: Vec::new(),
            free_slots: Vec::new(),
            free_by_size: HashMap::new(),
            pages_live: 0,
            pages_peak: 0,
        }
    }
}

impl<P> WholePagePool<P> {
    /// Reuses a free page of exactly `aligned` bytes, if one is held.
    pub(crate) fn try_reuse(&mut self, aligned: u64, used: Used) -> Option<(u32, u64)> {
        let list = self.free_by_size.get_mut(&aligned)?;
        let i = list.pop()?;
        let page = self.pages[i as usize]
            .as_mut()
            .expect("free pages are live");
        page.used = Some(used);
        Some((i, page.addr))
    }

    /// The largest free page held for reuse (0 when none).
    pub(crate) fn largest_free(&self) -> u64 {
        self.free_by_size
            .iter()
            .filter(|(_, list)| !list.is_empty())
            .map(|(size, _)| *size)
            .max()
            .unwrap_or(0)
    }

    /// Adds a page already holding `used`.
    pub(crate) fn add(&mut self, raw: P, addr: u64, aligned: u64, used: Used) -> u32 {
        let page = WholePage {
            raw,
            addr,
            size: aligned,
            used: Some(used),
            guards: 0,
        };
        self.pages_live += 1;
        self.pages_peak = self.pages_peak.max(self.pages_live);
        match self.free_slots.pop() {
            Some(i) => {
                self.pages[i as usize] = Some(page);
                i
            }
            None => {
                let i = self.pages.len() as u32;
                // A handle packs the index with its pool in one word: see `MAX_BLOCKS`.
                assert!(
                    i < MAX_BLOCKS,
                    "a new page was asked of a pool that holds {i} already, the most it may; \
                     free pages first, or make fewer, larger allocations"
                );
                self.pages.push(Some(page));
                i
            }
        }
    }

    pub(crate) fn page(&self, i: u32) -> Option<&WholePage<P>> {
        self.pages.get(i as usize)?.as_ref()
    }

    pub(crate) fn used(&self, i: u32, owner: u64) -> Option<(Used, u64)> {
        let p = self.page(i)?;
        p.used.filter(|u| u.owner == owner).map(|u| (u, p.addr))
    }

    /// Binds the page `i` of `owner` to `new_owner`; false when `owner` holds no such page.
    pub(crate) fn rebind(&mut self, i: u32, owner: u64, new_owner: u64) -> bool {
        let used = self.pages.get_mut(i as usize).and_then(Option::as_mut);
        match used.and_then(|p| p.used.as_mut()) {
            Some(u) if u.owner == owner => {
                u.owner = new_owner;
                true
            }
            _ => false,
        }
    }

    /// Frees the allocation bound to `owner`; the page is kept for reuse until released.
    pub(crate) fn free(&mut self, i: u32, owner: u64) -> bool {
        let Some(page) = self.pages.get_mut(i as usize).and_then(Option::as_mut) else {
            return false;
        };
        if page.used.is_none_or(|u| u.owner != owner) {
            return false;
        }
        page.used = None;
        if page.guards == 0 {
            self.free_by_size.entry(page.size).or_default().push(i);
        }
        true
    }

    /// Takes every free, unguarded page out, for release.
    pub(crate) fn take_free(&mut self, out: &mut Vec<WholePage<P>>) {
        for (_, list) in self.free_by_size.drain() {
            for i in list {
                if let Some(p) = self.pages[i as usize].take() {
                    out.push(p);
                    self.free_slots.push(i);
                    self.pages_live -= 1;
                }
            }
        }
    }

    /// Adds or removes one guard of page `i`; `true` when the removal left a freed page
    /// unguarded (listed free again).
    pub(crate) fn guard(&mut self, i: u32, add: bool) -> bool {
        let Some(p) = self.pages.get_mut(i as usize).and_then(Option::as_mut) else {
            return false;
        };
        if add {
            p.guards += 1;
            if p.guards == 1
                && p.used.is_none()
                && let Some(list) = self.free_by_size.get_mut(&p.size)
            {
                list.retain(|&j| j != i);
            }
        } else if p.guards > 0 {
            // (A guard's removal with none on record changes nothing: listing the page free
            // twice would hand it to two reservations.)
            p.guards -= 1;
            if p.guards == 0 && p.used.is_none() {
                self.free_by_size.entry(p.size).or_default().push(i);
                return true;
            }
        }
        false
    }

    pub(crate) fn pages(&self) -> impl Iterator<Item = (u32, &WholePage<P>)> + '_ {
        self.pages
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.as_ref().map(|p| (i as u32, p)))
    }

    /// Totals over the pool (a page's room past its allocation counts as padding).
    pub(crate) fn usage(&self) -> Usage {
        self.pages()
            .map(|(_, p)| match p.used {
                Some(used) => Usage {
                    allocations: 1,
                    in_use: used.size,
                    padding: p.size - used.size,
                    reserved: p.size,
                },
                None => Usage {
                    reserved: p.size,
                    ..Usage::default()
                },
            })
            .sum()
    }

    /// Every page, for teardown.
    pub(crate) fn into_pages(self) -> impl Iterator<Item = WholePage<P>> {
        self.pages.into_iter().flatten()
    }

    /// The largest page (for the report's page size).
    pub(crate) fn largest_page(&self) -> u64 {
        self.pages().map(|(_, p)| p.size).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn used(owner: u64, size: u64) -> Used {
        Used { owner, size }
    }

    #[test]
    fn reuse_is_by_exact_size_only_once_freed() {
        let mut pool = WholePagePool::default();
        assert!(pool.try_reuse(1028, used(1, 1025)).is_none());
        let i = pool.add((), 0x100, 1028, used(1, 1025));
        assert!(pool.try_reuse(1028, used(2, 1025)).is_none(), "held");
        assert!(pool.free(i, 1));
        assert!(pool.try_reuse(1024, used(2, 1024)).is_none(), "other size");
        assert_eq!(pool.try_reuse(1028, used(2, 1026)), Some((i, 0x100)));
        assert_eq!(
            pool.usage(),
            Usage {
                allocations: 1,
                in_use: 1026,
                padding: 2,
                reserved: 1028
            }
        );
    }

    #[test]
    fn only_free_unguarded_pages_are_taken() {
        let mut pool = WholePagePool::default();
        let a = pool.add((), 0, 64, used(1, 64));
        let b = pool.add((), 64, 64, used(2, 64));
        pool.guard(b, true);
        pool.free(a, 1);
        pool.free(b, 2);
        let mut out = Vec::new();
        pool.take_free(&mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(
            pool.usage(),
            Usage {
                allocations: 0,
                in_use: 0,
                padding: 0,
                reserved: 64
            }
        );
        pool.guard(b, false);
        pool.take_free(&mut out);
        assert_eq!(out.len(), 2);
    }
}
