//! The sliced pool's rules: carving, freeing, guards, carving at an offset.

use super::*;
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

/// Checks the pool's records against each other: every page's blocks tile it (neighbours
/// linked both ways, no two free blocks side by side), and the index lists exactly the free
/// blocks of indexed pages, each in its size class, its links both ways, a class's bit set
/// exactly when its list is not empty.
fn check(pool: &SlicedPool<()>) {
    let mut free_indexed = Vec::new();
    for (pi, page) in pool.pages() {
        let (mut b, mut offset, mut prev, mut prev_free) = (page.first, 0, NIL, false);
        while b != NIL {
            let block = &pool.blocks[b as usize];
            assert_eq!(
                (block.page, block.offset, block.prev_phys),
                (pi, offset, prev)
            );
            let free = matches!(block.state, BlockState::Free { .. });
            assert!(
                !(free && prev_free),
                "free blocks {prev} and {b} side by side"
            );
            assert!(
                !matches!(block.state, BlockState::Vacant { .. }),
                "vacant {b} on a page"
            );
            if free && page.indexed {
                free_indexed.push(b);
            }
            (offset, prev, prev_free, b) = (offset + block.size, b, free, block.next_phys);
        }
        assert_eq!(offset, page.size, "page {pi}'s blocks do not tile it");
    }
    let mut listed = Vec::new();
    for (class, head, bit) in pool.index.classes() {
        assert_eq!(bit, head != NIL, "class {class}'s bit");
        let (mut b, mut prev) = (head, NIL);
        while b != NIL {
            let BlockState::Free { prev: p, next } = pool.blocks[b as usize].state else {
                panic!("listed block {b} is not free");
            };
            assert_eq!(p, prev, "block {b}'s back link");
            assert_eq!(FreeIndex::class(pool.blocks[b as usize].size), class);
            listed.push(b);
            (prev, b) = (b, next);
        }
    }
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
    CarveAt(usize, u64, u64),
    Free(usize),
    Guard(usize, bool),
    RemoveEmpty(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (1u64..64).prop_map(|kib| Op::AddPage(kib * 1024)),
        6 => (1u64..40_000, 0u32..10).prop_map(|(s, a)| Op::Carve(s, a)),
        2 => (any::<usize>(), 0u64..8192, 1u64..8192).prop_map(|(i, o, s)| Op::CarveAt(i, o, s)),
        6 => any::<usize>().prop_map(Op::Free),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(i, add)| Op::Guard(i, add)),
        1 => any::<usize>().prop_map(Op::RemoveEmpty),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    /// Any sequence of carves, frees, guards and pages keeps the records consistent, the live
    /// allocations apart and in their pages, and the usage equal to a plain list of them.
    #[test]
    fn the_index_and_the_blocks_agree_after_every_operation(ops in proptest::collection::vec(op(), 1..80)) {
        let mut pool = SlicedPool::new(64 * 1024);
        // (block, owner, page, address, size asked, bytes carved)
        let mut live: Vec<(u32, u64, u32, u64, u64, u64)> = Vec::new();
        let mut next_addr = 0x10_0000;
        for (owner, op) in ops.into_iter().enumerate() {
            let owner = owner as u64;
            match op {
                Op::AddPage(size) => {
                    pool.add_page((), next_addr, size);
                    next_addr += size + 4096;
                }
                Op::Carve(size, align) => {
                    let aligned = size.next_multiple_of(1 << align);
                    if let Some(c) = pool.try_carve(size, aligned, used(owner, size)) {
                        live.push((c.block, owner, c.page, c.addr, size, aligned));
                    }
                }
                Op::CarveAt(i, offset, size) => {
                    let free: Vec<_> = pool.free_blocks().collect();
                    if let Some(&(block, page, _, room)) = free.get(i % free.len().max(1))
                        && offset + size <= room
                    {
                        let c = pool.carve_at(block, offset, size, size, used(owner, size));
                        live.push((c.block, owner, page, c.addr, size, size));
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let (block, owner, page, ..) = live.swap_remove(i % live.len());
                    prop_assert_eq!(pool.free(block, owner), Some(page));
                    prop_assert_eq!(pool.free(block, owner), None, "freed twice");
                }
                Op::Free(_) => {}
                Op::Guard(i, add) => {
                    let pages: Vec<_> = pool.pages().map(|(p, _)| p).collect();
                    if let Some(&p) = pages.get(i % pages.len().max(1)) {
                        pool.guard(p, add);
                    }
                }
                Op::RemoveEmpty(i) => {
                    let pages: Vec<_> = pool.pages().map(|(p, _)| p).collect();
                    if let Some(&p) = pages.get(i % pages.len().max(1)) {
                        let empty = !live.iter().any(|l| l.2 == p)
                            && pool.page(p).is_some_and(|page| page.guards == 0);
                        prop_assert_eq!(pool.remove_page_if_empty(p).is_some(), empty);
                    }
                }
            }
            check(&pool);
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
