//! Which granules of a granule pool are mapped, one bit each, beside the pool's records.
//!
//! Owns the bits and counting them over a span. Does not own when a granule is mapped or
//! unmapped (the pool sets the bits wherever a granule's backing becomes or stops being
//! [`Backing::Mapped`](super::Backing::Mapped): `vm/mapping.rs`, `vm/idle.rs`), nor what a
//! retiring granule counts as (`vm.rs`'s scoring looks at those one by one).

use alloc::vec::Vec;

/// One bit per granule, set while it is [`Backing::Mapped`](super::Backing::Mapped): a
/// placement scores its candidates from a few words of these instead of reading a record per
/// granule (the records of a range span megabytes; the candidates lie anywhere in it), and
/// `touch`, a granule going into or out of use and the cache's idle test read them too, so they
/// change with the backing, before any of those looks.
#[derive(Debug)]
pub(super) struct MappedBits(Vec<u64>);

impl MappedBits {
    pub(super) fn new(granules: usize) -> Self {
        Self(alloc::vec![0; granules.div_ceil(64)])
    }

    /// Sets (`on`) or clears the bits of the `len` granules from `first`.
    pub(super) fn set(&mut self, first: u32, len: u32, on: bool) {
        for g in first..first + len {
            let (word, bit) = ((g / 64) as usize, 1u64 << (g % 64));
            if on {
                self.0[word] |= bit;
            } else {
                self.0[word] &= !bit;
            }
        }
    }

    pub(super) fn clear_all(&mut self) {
        self.0.fill(0);
    }

    pub(super) fn get(&self, g: u32) -> bool {
        self.0[(g / 64) as usize] & (1 << (g % 64)) != 0
    }

    /// Granules of `[first, last]` not mapped.
    #[inline]
    pub(super) fn unmapped_in(&self, first: u32, last: u32) -> u32 {
        let (fw, lw) = ((first / 64) as usize, (last / 64) as usize);
        let low = !0u64 << (first % 64);
        let high = !0u64 >> (63 - last % 64);
        let mapped = if fw == lw {
            (self.0[fw] & low & high).count_ones()
        } else {
            (self.0[fw] & low).count_ones()
                + self.0[fw + 1..lw]
                    .iter()
                    .map(|w| w.count_ones())
                    .sum::<u32>()
                + (self.0[lw] & high).count_ones()
        };
        last - first + 1 - mapped
    }
}

#[cfg(test)]
mod tests {
    use super::MappedBits;
    use proptest::prelude::*;

    proptest! {
        /// The count over any span agrees with a plain list of the granules set.
        #[test]
        fn unmapped_in_counts_what_a_plain_list_says(
            n in 1u32..300,
            sets in proptest::collection::vec((0u32..300, 1u32..80, any::<bool>()), 0..20),
            spans in proptest::collection::vec((0u32..300, 0u32..300), 1..20),
        ) {
            let mut bits = MappedBits::new(n as usize);
            let mut plain = alloc::vec![false; n as usize];
            for (first, len, on) in sets {
                let first = first % n;
                let len = len.min(n - first);
                bits.set(first, len, on);
                plain[first as usize..(first + len) as usize].fill(on);
            }
            for (a, b) in spans {
                let (first, last) = ((a % n).min(b % n), (a % n).max(b % n));
                let want = plain[first as usize..=last as usize].iter().filter(|&&m| !m).count() as u32;
                prop_assert_eq!(bits.unmapped_in(first, last), want, "span {}..={}", first, last);
            }
            for g in 0..n {
                prop_assert_eq!(bits.get(g), plain[g as usize]);
            }
            bits.clear_all();
            prop_assert_eq!(bits.unmapped_in(0, n - 1), n);
        }
    }
}
