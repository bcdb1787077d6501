//! Device ids, and which devices are alive: so an error about a handle of another device can say
//! whether that device still exists.
//!
//! Owns the id counter and the list of ids of devices not dropped yet (a few entries: one per
//! live device). Does not own devices, nor what an error says.

use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, Ordering};

static NEXT_DEVICE: AtomicU32 = AtomicU32::new(1);
static LIVE: spin::Mutex<Vec<u32>> = spin::Mutex::new(Vec::new());

/// A new device id, counted as alive until [`retire`].
pub(crate) fn register() -> u32 {
    let id = NEXT_DEVICE.fetch_add(1, Ordering::Relaxed);
    LIVE.lock().push(id);
    id
}

/// The device `id` was dropped.
pub(crate) fn retire(id: u32) {
    let mut live = LIVE.lock();
    live.retain(|&d| d != id);
    if live.is_empty() {
        // With no device left the list holds no heap memory (a firmware host checks that).
        *live = Vec::new();
    }
}

/// Whether the device `id` was created and not dropped yet.
pub(crate) fn is_alive(id: u32) -> bool {
    LIVE.lock().contains(&id)
}
