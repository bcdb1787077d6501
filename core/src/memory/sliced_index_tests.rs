//! The sliced pool's free index as the pool uses it: room that fits is never passed over.

use super::*;
use alloc::vec;

const MIB: u64 = 1 << 20;

fn used(owner: u64, size: u64) -> Used {
    Used { owner, size }
}

/// A page whose only free room is nine blocks of one size class: eight of 40 KiB listed first,
/// then one of 43 KiB (`big`, returned).
fn nine_free_blocks_of_one_class() -> (SlicedPool<()>, u32) {
    const KIB: u64 = 1024;
    let mut pool = SlicedPool::new(2 * MIB);
    pool.add_page((), 0, 2 * MIB);
    let mut owner = 0;
    let mut carve = |pool: &mut SlicedPool<()>, s: u64| {
        owner += 1;
        (pool.try_carve(s, s, used(owner, s)).unwrap().block, owner)
    };
    // Each block between two that stay used, so none coalesces.
    let mut freed = vec![carve(&mut pool, 43 * KIB)];
    carve(&mut pool, KIB);
    for _ in 0..8 {
        freed.push(carve(&mut pool, 40 * KIB));
        carve(&mut pool, KIB);
    }
    let rest = pool.free_blocks().map(|(_, _, _, room)| room).sum::<u64>();
    carve(&mut pool, rest);
    // Freed in this order, each goes to the head of its class: the 43 KiB block ends ninth.
    for &(block, owner) in &freed {
        assert!(pool.free(block, owner).is_some());
    }
    (pool, freed[0].0)
}

#[test]
fn room_past_the_first_blocks_of_its_class_is_found() {
    // Only the ninth block holds 42 KiB; a first-fit walk bounded at eight passed it over, and
    // the manager then refused the request (`PageUpdateForbidden`) or added a page for it.
    let request = 42 * 1024;
    let (mut pool, big) = nine_free_blocks_of_one_class();
    let c = pool.try_carve(request, request, used(100, request));
    assert_eq!(c.map(|c| c.block), Some(big));
    let (mut pool, big) = nine_free_blocks_of_one_class();
    let c = pool.try_carve_scored(request, request, used(100, request), 8, |_, _| 1);
    assert_eq!(c.map(|c| c.block), Some(big));
    // Nothing larger than the largest block is found.
    let (mut pool, _) = nine_free_blocks_of_one_class();
    assert!(pool.try_carve(44 * 1024, 44 * 1024, used(100, 1)).is_none());
}
