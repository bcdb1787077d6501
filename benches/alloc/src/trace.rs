//! The B1 trace: a clone of RMM's `random_allocations` benchmark
//! (`benchmarks/random_allocations/random_allocations.cpp`, `random_allocation_free`).
//!
//! # Generator
//!
//! PRNG: **SplitMix64** (Steele, Lea, Flood 2014; the `splitmix64.c` reference by Vigna):
//! `state += 0x9E37_79B9_7F4A_7C15; z = state; z = (z ^ z>>30) * 0xBF58_476D_1CE4_E5B9;
//! z = (z ^ z>>27) * 0x94D0_49BB_1331_11EB; return z ^ z>>31`, seeded with the cell's seed.
//! A uniform draw in `[0, n)` is `next() % n` (the bias is below 2^-37 for every range used here).
//!
//! Each of the `2·num` steps, in RMM's order:
//! 1. draw `size = 1 + next() % max` (uniform in `[1, max]` bytes);
//! 2. if something is live, draw `chance = next() % 100` and allocate when `chance < 73`, fewer
//!    than `num` allocations were made so far (RMM's `allocation_count`, which counts every
//!    allocation of the trace, not only the live ones) and `live_bytes + size < cap`; with
//!    nothing live, always allocate;
//! 3. otherwise free: draw `index = next() % live_count` and swap-remove that entry of the live
//!    list (RMM erases in place; the op list records the index into the swap-removed list, and
//!    every replay keeps its live list the same way).
//!
//! After the `2·num` steps the remaining live allocations are freed, last first (RMM frees them
//! after the loop too; here they are part of the timed replay).
//!
//! The op list is generated once per cell and replayed unchanged through every contender.

/// One operation of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Allocate this many bytes and push the allocation on the live list.
    Alloc(u64),
    /// Swap-remove entry `index` of the live list and free it.
    Free(u32),
}

/// SplitMix64.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Allocation probability, percent (RMM's `allocation_probability`).
pub const ALLOC_PERCENT: u64 = 73;

/// A generated trace and what it implies.
#[derive(Debug)]
pub struct Trace {
    pub ops: Vec<Op>,
    pub allocs: usize,
    /// Peak of the live requested bytes.
    pub live_peak: u64,
    /// Peak of the live allocation count.
    pub live_count_peak: usize,
}

/// Generate the trace for `num` allocations of at most `max` bytes under `cap` live bytes.
pub fn generate(num: usize, max: u64, cap: u64, seed: u64) -> Trace {
    let mut rng = SplitMix64::new(seed);
    let mut ops = Vec::with_capacity(2 * num + num);
    let mut live: Vec<u64> = Vec::with_capacity(num);
    let (mut live_bytes, mut live_peak, mut live_count_peak) = (0u64, 0u64, 0usize);
    let mut allocs = 0usize;

    for _ in 0..2 * num {
        let size = 1 + rng.below(max);
        let do_alloc = if live.is_empty() {
            true
        } else {
            let chance = rng.below(100);
            chance < ALLOC_PERCENT && allocs < num && live_bytes + size < cap
        };
        if do_alloc {
            ops.push(Op::Alloc(size));
            live.push(size);
            allocs += 1;
            live_bytes += size;
            live_peak = live_peak.max(live_bytes);
            live_count_peak = live_count_peak.max(live.len());
        } else {
            let index = rng.below(live.len() as u64) as usize;
            live_bytes -= live.swap_remove(index);
            ops.push(Op::Free(index as u32));
        }
    }
    while !live.is_empty() {
        let index = live.len() - 1;
        live.pop();
        ops.push(Op::Free(index as u32));
    }
    Trace {
        ops,
        allocs,
        live_peak,
        live_count_peak,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reference_values() {
        // First outputs of splitmix64.c seeded with 0.
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn trace_balances() {
        let t = generate(1000, 1 << 20, 4 << 30, 1);
        let mut live = 0i64;
        for op in &t.ops {
            match op {
                Op::Alloc(_) => live += 1,
                Op::Free(i) => {
                    assert!((*i as i64) < live);
                    live -= 1
                }
            }
        }
        assert_eq!(live, 0);
        assert!(t.allocs <= 1000);
    }
}
