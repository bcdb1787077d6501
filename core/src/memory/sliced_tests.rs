//! The sliced pool's rules: carving, freeing, guards, carving at an offset.

use super::*;
use alloc::vec;

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
