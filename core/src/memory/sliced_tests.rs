//! The sliced pool's rules: carving, freeing, guards, carving at an offset.

use super::*;
use crate::memory::report::Usage;
use alloc::vec;
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

fn used(owner: u64, size: u64) -> Used {
    Used { owner, size }
}

#[test]
fn carving_splits_and_freeing_coalesces() {
    let mut pool = SlicedPool::new(32 * MIB);
    pool.add_page((), 0x1000_0000, 32 * MIB);
    let sizes = [4 * MIB, 15 * MIB, 8 * MIB, 4 * MIB];
    let carved: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| pool.try_carve(s, s, used(i as u64, s)).unwrap())
        .collect();
    assert_eq!(carved[3].addr, 0x1000_0000 + 27 * MIB);
    assert!(
        pool.try_carve(8 * MIB, 8 * MIB, used(9, 8 * MIB)).is_none(),
        "1 MiB left"
    );
    pool.free(carved[1].block, 1).unwrap();
    pool.free(carved[2].block, 2).unwrap();
    // 15 + 8 coalesced: a 20 MiB request fits where neither alone would.
    let big = pool
        .try_carve(20 * MIB, 20 * MIB, used(10, 20 * MIB))
        .unwrap();
    assert_eq!(big.addr, 0x1000_0000 + 4 * MIB);
    assert_eq!(
        pool.usage(),
        Usage {
            allocations: 3,
            in_use: 28 * MIB,
            padding: 0,
            reserved: 32 * MIB
        }
    );
}

#[test]
fn a_block_is_freed_only_by_its_owner_and_once() {
    let mut pool = SlicedPool::new(MIB);
    pool.add_page((), 0, MIB);
    let c = pool.try_carve(100, 128, used(5, 100)).unwrap();
    assert_eq!(pool.free(c.block, 6), None);
    assert_eq!(pool.free(c.block, 5), Some(c.page));
    assert_eq!(pool.free(c.block, 5), None);
    assert_eq!(
        pool.usage(),
        Usage {
            allocations: 0,
            in_use: 0,
            padding: 0,
            reserved: MIB
        }
    );
    assert!(pool.remove_page_if_empty(c.page).is_some());
    assert_eq!(
        pool.usage(),
        Usage {
            allocations: 0,
            in_use: 0,
            padding: 0,
            reserved: 0
        }
    );
}

#[test]
fn a_guarded_page_serves_nothing_new_and_stays() {
    let mut pool = SlicedPool::new(MIB);
    let p = pool.add_page((), 0, MIB);
    pool.guard(p, true);
    assert!(pool.try_carve(10, 16, used(1, 10)).is_none());
    assert!(pool.remove_page_if_empty(p).is_none());
    pool.guard(p, false);
    assert!(pool.try_carve(10, 16, used(1, 10)).is_some());
}

#[test]
fn carving_at_an_offset_leaves_the_room_on_both_sides_free() {
    let mut pool = SlicedPool::new(MIB);
    pool.add_page((), 0, MIB);
    let (block, _, offset, size) = pool.free_blocks().next().unwrap();
    assert_eq!((offset, size), (0, MIB));
    let c = pool.carve_at(block, 4096, 100, 128, used(1, 100));
    assert_eq!(c.addr, 4096);
    let mut free: Vec<_> = pool.free_blocks().map(|(_, _, o, s)| (o, s)).collect();
    free.sort_unstable();
    assert_eq!(free, vec![(0, 4096), (4096 + 128, MIB - 4096 - 128)]);
    // Both sides serve new requests, and freeing coalesces back to one block.
    let a = pool.try_carve(4096, 4096, used(2, 4096)).unwrap();
    assert_eq!(a.addr, 0);
    pool.free(a.block, 2);
    pool.free(c.block, 1);
    let free: Vec<_> = pool.free_blocks().map(|(_, _, o, s)| (o, s)).collect();
    assert_eq!(free, vec![(0, MIB)]);
}

/// Holding arms on a repeat of the size last freed; a full ring releases a block to hold
/// another, but a free finds a slot a take emptied first (no held block is released then).
#[cfg(all(feature = "held-blocks", not(devcmd_no_held_blocks)))]
#[test]
fn a_free_fills_an_emptied_slot_before_it_releases_a_held_block() {
    let mut pool = SlicedPool::new(MIB);
    pool.add_page((), 0, MIB);
    let a = pool.carve_or_release(256, 256, used(1, 256)).unwrap();
    assert!(!pool.free_held(a.block, 1).unwrap().held, "not armed yet");
    // A repeat of the size last freed arms holding.
    let _keep = pool.carve_or_release(256, 256, used(2, 256)).unwrap();
    let sizes = [512u64, 768, 1024, 1280, 1536];
    let live: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            (
                pool.try_carve(s, s, used(10 + i as u64, s)).unwrap(),
                10 + i as u64,
            )
        })
        .collect();
    for (c, owner) in &live[..4] {
        let f = pool.free_held(c.block, *owner).unwrap();
        assert!(f.held && f.released.is_none());
    }
    assert_eq!(pool.held_count(), HELD);
    // A take of 768 empties a slot in the middle; the next free fills it, releasing nothing.
    let again = pool.take_held(768, 768, used(20, 768)).unwrap();
    assert_eq!(again.addr, live[1].0.addr);
    let (c, owner) = live[4];
    let f = pool.free_held(c.block, owner).unwrap();
    assert!(f.held && f.released.is_none(), "{f:?}");
    assert_eq!(pool.held_count(), HELD);
    // Full now: the next free releases the block next in turn.
    let f = pool.free_held(again.block, 20).unwrap();
    assert!(f.held && f.released.is_some());
    check(&pool);
}

/// A take tries the block held last first and, where its page is guarded now, an older block of
/// the same size on another page (the most recent first); a miss on every slot lowers holding.
#[cfg(all(feature = "held-blocks", not(devcmd_no_held_blocks)))]
#[test]
fn a_take_passes_over_a_held_block_on_a_guarded_page() {
    let mut pool = SlicedPool::new(MIB);
    pool.add_page((), 0, MIB);
    pool.add_page((), 4 * MIB, MIB);
    // Arm holding (a repeat of the size last freed), then hold blocks of 256 on both pages (the
    // filler takes the rest of the first one's page).
    let a = pool.carve_or_release(256, 256, used(1, 256)).unwrap();
    assert!(!pool.free_held(a.block, 1).unwrap().held);
    let older = pool.carve_or_release(256, 256, used(2, 256)).unwrap();
    let filler = pool
        .try_carve(MIB - 256, MIB - 256, used(3, MIB - 256))
        .unwrap();
    let last = pool.try_carve(256, 256, used(4, 256)).unwrap();
    let page_of = |addr: u64| u32::from(addr >= 4 * MIB);
    assert_ne!(
        page_of(older.addr),
        page_of(last.addr),
        "one block on each page"
    );
    assert!(pool.free_held(older.block, 2).unwrap().held);
    assert!(pool.free_held(last.block, 4).unwrap().held, "held last");
    // The page of the block held last guarded: the older block, on the other page, serves.
    pool.guard(page_of(last.addr), true);
    let c = pool
        .take_held(256, 256, used(5, 256))
        .expect("the older slot serves");
    assert_eq!(c.addr, older.addr);
    // Only the guarded block is left: a miss, which lowers holding (the next free coalesces).
    assert!(pool.take_held(256, 256, used(6, 256)).is_none());
    assert_eq!(
        pool.held_count(),
        1,
        "a miss takes nothing; the caller releases"
    );
    pool.release_held(|_, _| ());
    assert!(
        !pool.free_held(c.block, 5).unwrap().held,
        "holding lowered by the miss"
    );
    pool.guard(page_of(last.addr), false);
    assert!(pool.free_held(filler.block, 3).is_some());
    check(&pool);
}

/// Checks the pool's records against each other: every page's blocks tile it (neighbours
/// linked both ways, no two free blocks side by side), every other record is on the vacant
/// chain, a page is indexed exactly when it has no guard, and the index lists exactly the free
/// blocks of indexed pages, each in its size class, its links both ways, a class's bit set
/// exactly when its list is not empty.
fn check(pool: &SlicedPool<()>) {
    let mut free_indexed = Vec::new();
    let mut held_on_pages = Vec::new();
    let mut on_pages = 0;
    for (pi, page) in pool.pages() {
        assert_eq!(
            page.indexed,
            page.guards == 0,
            "page {pi} indexed with guards"
        );
        let (mut b, mut offset, mut prev, mut prev_free) = (page.first, 0, NIL, false);
        while b != NIL {
            let block = &pool.blocks[b as usize];
            assert_eq!(
                (block.page(), block.offset, block.prev_phys),
                (pi, offset, prev)
            );
            let free = block.is_free();
            assert!(
                !(free && prev_free),
                "free blocks {prev} and {b} side by side"
            );
            assert!(
                !matches!(block.state(), BlockState::Vacant { .. }),
                "vacant {b} on a page"
            );
            if free && page.indexed {
                free_indexed.push(b);
            }
            if block.state() == BlockState::Held {
                held_on_pages.push(b);
            }
            on_pages += 1;
            (offset, prev, prev_free, b) = (offset + block.size, b, free, block.next_phys);
        }
        assert_eq!(offset, page.size, "page {pi}'s blocks do not tile it");
    }
    let mut vacant = 0;
    let mut v = pool.vacant;
    while v != NIL {
        assert!(vacant < pool.blocks.len(), "a cycle on the vacant chain");
        let BlockState::Vacant { next } = pool.blocks[v as usize].state() else {
            panic!("block {v} on the vacant chain is not vacant");
        };
        vacant += 1;
        v = next;
    }
    assert_eq!(
        on_pages + vacant,
        pool.blocks.len(),
        "a block on no page and not vacant"
    );
    let mut listed = Vec::new();
    for (class, head, bit) in pool.index.classes() {
        assert_eq!(bit, head != NIL, "class {class}'s bit");
        let (mut b, mut prev) = (head, NIL);
        while b != NIL {
            assert!(
                listed.len() < pool.blocks.len(),
                "a cycle in class {class}'s list"
            );
            let BlockState::Free { prev: p, next } = pool.blocks[b as usize].state() else {
                panic!("listed block {b} is not free");
            };
            assert_eq!(p, prev, "block {b}'s back link");
            assert_eq!(FreeIndex::class(pool.blocks[b as usize].size), class);
            listed.push(b);
            (prev, b) = (b, next);
        }
    }
    // The ring names exactly the held blocks of the pages, each once, with its size.
    let mut ring: Vec<u32> = pool.held_blocks().map(|(b, ..)| b).collect();
    for (b, _, size) in pool.held_blocks() {
        assert_eq!(pool.blocks[b as usize].size, size, "held block {b}'s size");
    }
    assert_eq!(ring.len(), pool.held_count());
    ring.sort_unstable();
    held_on_pages.sort_unstable();
    assert_eq!(ring, held_on_pages, "the ring names the held blocks");
    free_indexed.sort_unstable();
    listed.sort_unstable();
    assert_eq!(
        listed, free_indexed,
        "the index lists the free blocks of indexed pages"
    );
}

#[derive(Debug, Clone)]
enum Op {
    AddPage(u64),
    Carve(u64, u32),
    /// Carve from the free block picked, at an offset (0 half the time) with padding.
    CarveAt(usize, bool, u64, u64, u64),
    Scored(u64, u32, usize),
    Free(usize),
    /// Free with an owner that is not the block's.
    FreeWrong(usize),
    Rebind(usize),
    Guard(usize, bool),
    RemoveEmpty(usize),
    /// Free, held back where the pool may.
    FreeHeld(usize),
    /// A held block of the size, else a carve, else a carve after releasing what is held.
    Take(u64, u32),
    ReleaseHeld,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (1u64..64).prop_map(|kib| Op::AddPage(kib * 1024)),
        6 => (1u64..40_000, 0u32..10).prop_map(|(s, a)| Op::Carve(s, a)),
        2 => (any::<usize>(), any::<bool>(), 0u64..8192, 1u64..8192, 0u64..256)
            .prop_map(|(i, front, o, s, pad)| Op::CarveAt(i, front, o, s, pad)),
        1 => (1u64..40_000, 0u32..10, 1usize..10).prop_map(|(s, a, l)| Op::Scored(s, a, l)),
        6 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::FreeWrong),
        1 => any::<usize>().prop_map(Op::Rebind),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(i, add)| Op::Guard(i, add)),
        1 => any::<usize>().prop_map(Op::RemoveEmpty),
        6 => any::<usize>().prop_map(Op::FreeHeld),
        // Sizes of a few kinds, so held blocks are asked for again.
        4 => (prop_oneof![Just(100u64), Just(4096), Just(5000), 1u64..40_000], 0u32..3)
            .prop_map(|(s, a)| Op::Take(s, a)),
        1 => Just(Op::ReleaseHeld),
    ]
}

/// A live allocation of the model: block, owner, page, address, size asked, bytes carved.
type Live = (u32, u64, u32, u64, u64, u64);

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    /// Any sequence of carves, frees (held back or not), takes of held blocks, rebinds, guards
    /// and pages keeps the records consistent,
    /// the live allocations apart and in their pages, the usage equal to a plain list of them,
    /// and never refuses a request that an indexed free block holds.
    #[test]
    fn the_index_and_the_blocks_agree_after_every_operation(ops in proptest::collection::vec(op(), 1..80)) {
        let mut pool = SlicedPool::new(64 * 1024);
        let mut live: Vec<Live> = Vec::new();
        // Guards per page, as the model counts them.
        let mut guards: Vec<(u32, u32)> = Vec::new();
        let mut next_addr = 0x10_0000;
        for (owner, op) in ops.into_iter().enumerate() {
            let owner = owner as u64 + 1;
            let before = live.len();
            match op {
                Op::AddPage(size) => {
                    let p = pool.add_page((), next_addr, size);
                    guards.retain(|g| g.0 != p);
                    next_addr += size + 4096;
                }
                Op::Carve(size, align) | Op::Scored(size, align, _) | Op::Take(size, align) => {
                    let aligned = size.next_multiple_of(1 << align);
                    if let Op::Scored(.., limit) = op {
                        // A scorer that stops at the lowest score so far (returning any value at
                        // or above it) picks the same block as one that counts in full.
                        let full = |b: u32| ((pool.blocks[b as usize].offset / 64) % 7) as u32;
                        let whole = pool.index.find_scored(&pool.blocks, aligned, limit, |b, _| full(b));
                        let stopped = pool.index.find_scored(&pool.blocks, aligned, limit, |b, bound| { let s = full(b); if s >= bound { bound.saturating_add(b % 3) } else { s } });
                        prop_assert_eq!(whole, stopped, "a scorer stopping at the best so far chose another block");
                    }
                    let carved = match op {
                        Op::Scored(.., limit) => pool.try_carve_scored(size, aligned, used(owner, size), limit, |o, bound| ((o / 64) % 7).min(u64::from(bound)) as u32),
                        Op::Take(..) => pool.carve_or_release(size, aligned, used(owner, size)),
                        _ => pool.try_carve(size, aligned, used(owner, size)),
                    };
                    match carved {
                        Some(c) => live.push((c.block, owner, c.page, c.addr, size, aligned)),
                        // Refused only when no free block holds the request.
                        None => {
                            prop_assert!(
                                pool.free_blocks().all(|(_, _, _, room)| room < aligned),
                                "a request of {} bytes refused while a free block holds it", aligned
                            );
                        }
                    }
                }
                Op::CarveAt(i, front, offset, size, pad) => {
                    let free: Vec<_> = pool.free_blocks().collect();
                    let offset = if front { 0 } else { offset };
                    let aligned = size + pad;
                    if let Some(&(block, page, _, room)) = free.get(i % free.len().max(1))
                        && offset + aligned <= room
                    {
                        let c = pool.carve_at(block, offset, size, aligned, used(owner, size));
                        live.push((c.block, owner, page, c.addr, size, aligned));
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let (block, owner, page, ..) = live.swap_remove(i % live.len());
                    prop_assert_eq!(pool.free(block, owner), Some(page));
                    prop_assert_eq!(pool.free(block, owner), None, "freed twice");
                }
                Op::FreeWrong(i) if !live.is_empty() => {
                    let (block, owner, ..) = live[i % live.len()];
                    prop_assert_eq!(pool.free(block, owner + 1_000_000), None);
                }
                Op::Rebind(i) if !live.is_empty() => {
                    let n = live.len();
                    let l = &mut live[i % n];
                    prop_assert!(!pool.rebind(l.0, l.1 + 1_000_000, owner), "rebound by another owner");
                    prop_assert!(pool.rebind(l.0, l.1, owner));
                    l.1 = owner;
                }
                Op::FreeHeld(i) if !live.is_empty() => {
                    let (block, owner, page, ..) = live.swap_remove(i % live.len());
                    let f = pool.free_held(block, owner);
                    prop_assert_eq!(f.map(|f| f.page), Some(page));
                    let guarded = guards.iter().any(|g| g.0 == page && g.1 > 0);
                    if f.is_some_and(|f| f.held) {
                        prop_assert!(!guarded, "held on a guarded page");
                    }
                    prop_assert_eq!(pool.free(block, owner), None, "freed twice");
                    prop_assert!(pool.free_held(block, owner).is_none(), "freed twice");
                }
                Op::ReleaseHeld => {
                    pool.release_held(|_, _| ());
                    prop_assert_eq!(pool.held_count(), 0);
                }
                Op::Free(_) | Op::FreeWrong(_) | Op::Rebind(_) | Op::FreeHeld(_) => {}
                Op::Guard(i, add) => {
                    let pages: Vec<_> = pool.pages().map(|(p, _)| p).collect();
                    if let Some(&p) = pages.get(i % pages.len().max(1)) {
                        pool.guard(p, add);
                        match guards.iter_mut().find(|g| g.0 == p) {
                            Some(g) if add => g.1 += 1,
                            Some(g) => g.1 = g.1.saturating_sub(1),
                            None if add => guards.push((p, 1)),
                            None => {}
                        }
                    }
                }
                Op::RemoveEmpty(i) => {
                    let pages: Vec<_> = pool.pages().map(|(p, _)| p).collect();
                    if let Some(&p) = pages.get(i % pages.len().max(1)) {
                        let guarded = guards.iter().any(|g| g.0 == p && g.1 > 0);
                        let empty = !live.iter().any(|l| l.2 == p) && !guarded;
                        prop_assert_eq!(pool.remove_page_if_empty(p).is_some(), empty);
                    }
                }
            }
            let carved = live.len() > before;
            check(&pool);
            // A guarded page serves nothing new.
            if carved && let Some(l) = live.last() {
                prop_assert!(!guards.iter().any(|g| g.0 == l.2 && g.1 > 0), "carved from guarded page {}", l.2);
            }
            prop_assert_eq!(pool.pages().count() as u32, pool.pages_live);
            let mut spans: Vec<_> = live.iter().map(|l| (l.3, l.3 + l.5)).collect();
            spans.sort_unstable();
            prop_assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "live allocations overlap");
            for &(block, owner, page, addr, size, aligned) in &live {
                prop_assert_eq!(pool.used(block, owner), Some((used(owner, size), page, addr)));
                let p = pool.page(page).expect("a live allocation's page");
                prop_assert!(p.addr <= addr && addr + aligned <= p.addr + p.size);
            }
            let usage = pool.usage();
            prop_assert_eq!(usage.allocations, live.len() as u64);
            prop_assert_eq!(usage.in_use, live.iter().map(|l| l.4).sum::<u64>());
            prop_assert_eq!(usage.padding, live.iter().map(|l| l.5 - l.4).sum::<u64>());
        }
    }
}
