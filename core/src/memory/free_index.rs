//! The index of free blocks of a sliced pool: segregated lists by size class with a bitmap, so
//! finding a block that fits is a few bit operations, whatever the number of pages.
//!
//! Owns only the list heads and the bitmap; the links live in the blocks (`sliced.rs`), which
//! this module reaches through the [`Links`] trait.

/// No block.
pub(crate) const NIL: u32 = u32::MAX;

/// Sub-classes per power of two, as a shift. Eight per doubling (64-bit hosts) bound a good fit's
/// waste by 12.5 % and cut held/live by 2-3 points on the allocator trace, for a 2 KiB index per
/// pool; four (32-bit targets, where RAM is counted in kilobytes) keep the index at 1 KiB.
#[cfg(target_pointer_width = "64")]
const SUB_BITS: usize = 3;
#[cfg(not(target_pointer_width = "64"))]
const SUB_BITS: usize = 2;
const SUBS: usize = 1 << SUB_BITS;
/// Size classes: `SUBS` per power of two (sizes below `SUBS` have one class each).
const CLASSES: usize = 64 * SUBS;

/// The class a block of `size` bytes is listed under: every block in class `c` has a size in
/// `[lower(c), lower(c + 1))`.
fn class_of(size: u64) -> usize {
    if size < SUBS as u64 {
        return size as usize;
    }
    let fl = 63 - size.leading_zeros() as usize;
    let sl = ((size >> (fl - SUB_BITS)) as usize) & (SUBS - 1);
    fl * SUBS + sl
}

/// The first class all of whose blocks are at least `size` bytes.
fn class_holding(size: u64) -> usize {
    let c = class_of(size);
    if size < SUBS as u64 || lower_bound(c) == size {
        c
    } else {
        c + 1
    }
}

fn lower_bound(class: usize) -> u64 {
    if class < SUBS * SUB_BITS {
        // Classes SUBS..SUBS * SUB_BITS are never used: sizes from SUBS on start at class
        // SUBS * SUB_BITS.
        return class.min(SUBS) as u64;
    }
    let fl = class / SUBS;
    let sl = (class % SUBS) as u64;
    (1u64 << fl) | (sl << (fl - SUB_BITS))
}

/// Access to the free-list links stored in the blocks.
pub(crate) trait Links {
    fn size(&self, block: u32) -> u64;
    fn next_free(&self, block: u32) -> u32;
    fn set_links(&mut self, block: u32, prev: u32, next: u32);
    fn set_prev(&mut self, block: u32, prev: u32);
    fn set_next(&mut self, block: u32, next: u32);
    fn prev_free(&self, block: u32) -> u32;
}

/// Heads of the free lists and the bitmap of non-empty classes.
#[derive(Debug, Clone)]
pub(crate) struct FreeIndex {
    heads: [u32; CLASSES],
    bitmap: [u64; CLASSES / 64],
}

impl Default for FreeIndex {
    fn default() -> Self {
        Self {
            heads: [NIL; CLASSES],
            bitmap: [0; CLASSES / 64],
        }
    }
}

impl FreeIndex {
    #[inline]
    pub(crate) fn insert(&mut self, links: &mut impl Links, block: u32) {
        let c = class_of(links.size(block));
        let head = self.heads[c];
        links.set_links(block, NIL, head);
        if head != NIL {
            links.set_prev(head, block);
        }
        self.heads[c] = block;
        self.bitmap[c / 64] |= 1 << (c % 64);
    }

    #[inline]
    pub(crate) fn remove(&mut self, links: &mut impl Links, block: u32) {
        let prev = links.prev_free(block);
        let next = links.next_free(block);
        if prev != NIL {
            links.set_next(prev, next);
        } else {
            let c = class_of(links.size(block));
            debug_assert_eq!(self.heads[c], block);
            self.heads[c] = next;
            if next == NIL {
                self.bitmap[c / 64] &= !(1 << (c % 64));
            }
        }
        if next != NIL {
            links.set_prev(next, prev);
        }
    }

    /// A free block of at least `size` bytes, if any: first fit among the first blocks of the
    /// request's own class, else the head of the smallest class whose blocks all fit, else
    /// first fit in the rest of the own class. `None` only when no free block fits.
    pub(crate) fn find(&self, links: &impl Links, size: u64) -> Option<u32> {
        let own = class_of(size);
        let mut b = self.heads[own];
        // A short first-fit walk of the request's own class keeps waste low without an
        // unbounded scan.
        let mut steps = 0;
        while b != NIL && steps < 8 {
            if links.size(b) >= size {
                return Some(b);
            }
            b = links.next_free(b);
            steps += 1;
        }
        let from = class_holding(size).max(own + 1);
        if let Some(c) = self.first_non_empty(from) {
            return Some(self.heads[c]);
        }
        // Nothing larger: the rest of the own class, so room that fits is never passed over
        // (the caller would refuse or add a page).
        self.rest_of_class(links, b, size)
    }

    /// The first block from `b` on along its class's list that holds `size` bytes.
    #[cold]
    fn rest_of_class(&self, links: &impl Links, mut b: u32, size: u64) -> Option<u32> {
        while b != NIL {
            if links.size(b) >= size {
                return Some(b);
            }
            b = links.next_free(b);
        }
        None
    }

    /// Like [`Self::find`], but looks at up to `limit` fitting blocks, in the order `find` would
    /// prefer them (the request's own class, then the smallest classes that fit, each list in
    /// order), and returns the one `score` rates lowest (the first of them on a tie; at once on
    /// a score of 0). Bounded: at most `limit` blocks and one walk of the bitmap, unless nothing
    /// fits there: then, as `find`, first fit in the rest of the own class. `score` gets
    /// the block and the lowest score so far (`u32::MAX` for the first): it may stop counting
    /// there, as a score at or above it loses anyway.
    pub(crate) fn find_scored(
        &self,
        links: &impl Links,
        size: u64,
        limit: usize,
        mut score: impl FnMut(u32, u32) -> u32,
    ) -> Option<u32> {
        let mut best: Option<(u32, u32)> = None;
        let mut seen = 0;
        let mut consider = |b: u32| {
            let s = score(b, best.map_or(u32::MAX, |(low, _)| low));
            if best.is_none_or(|(low, _)| s < low) {
                best = Some((s, b));
            }
            seen += 1;
            s == 0 || seen >= limit
        };
        let own = class_of(size);
        let mut b = self.heads[own];
        let mut steps = 0;
        while b != NIL && steps < 8 {
            if links.size(b) >= size && consider(b) {
                return best.map(|(_, b)| b);
            }
            b = links.next_free(b);
            steps += 1;
        }
        let mut from = class_holding(size).max(own + 1);
        while let Some(c) = self.first_non_empty(from) {
            let mut b = self.heads[c];
            while b != NIL {
                if consider(b) {
                    return best.map(|(_, b)| b);
                }
                b = links.next_free(b);
            }
            from = c + 1;
        }
        if best.is_none() {
            // Nothing larger and nothing among the first of the own class: the rest of it, so
            // room that fits is never passed over (the caller would refuse or add a page).
            return self.rest_of_class(links, b, size);
        }
        best.map(|(_, b)| b)
    }

    fn first_non_empty(&self, from: usize) -> Option<usize> {
        let mut word = from / 64;
        if word >= self.bitmap.len() {
            return None;
        }
        let mut bits = self.bitmap[word] & (!0u64 << (from % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            if word == self.bitmap.len() {
                return None;
            }
            bits = self.bitmap[word];
        }
    }
}

#[cfg(test)]
impl FreeIndex {
    /// Every class with its list's head and whether its bit is set, for checks.
    pub(crate) fn classes(&self) -> impl Iterator<Item = (usize, u32, bool)> + '_ {
        (0..CLASSES).map(|c| (c, self.heads[c], self.bitmap[c / 64] & (1 << (c % 64)) != 0))
    }

    /// The class a block of `size` bytes is listed under, for checks.
    pub(crate) fn class(size: u64) -> usize {
        class_of(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_bound_their_sizes() {
        for size in (1..5000u64).chain([1 << 20, (1 << 20) + 1, u64::MAX / 2, u64::MAX]) {
            let c = class_of(size);
            assert!(lower_bound(c) <= size, "size {size} below its class {c}");
            if c + 1 < CLASSES {
                assert!(size < lower_bound(c + 1), "size {size} past its class {c}");
            }
            let h = class_holding(size);
            assert!(h >= CLASSES || lower_bound(h) >= size);
        }
    }
}
