//! devcmd's `MemoryManager` over devcmd-std's `StdShim`.
//!
//! >>> FILL IN once core/src/memory exposes the manager (placeholder until then). <<<

use crate::contender::{Contender, HeldStats};

pub struct Devcmd {}

impl Devcmd {
    pub fn new() -> Self {
        unimplemented!("devcmd contender: MemoryManager API not wired yet")
    }
}

impl Contender for Devcmd {
    type Handle = ();

    fn name(&self) -> &'static str {
        "devcmd"
    }

    fn alloc(&mut self, _size: u64) -> Option<()> {
        None
    }

    fn free(&mut self, _handle: ()) {}

    fn take_stats(&mut self) -> HeldStats {
        HeldStats::default()
    }
}
