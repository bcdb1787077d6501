//! cubecl-server 0.12.0-pre.1's `MemoryManagement` over its `BytesStorage`.
//!
//! - Constructor: `MemoryManagement::from_configuration(storage, &MemoryDeviceProperties::new(
//!   max_page_size = 1 GiB, alignment = 64), MemoryConfiguration::default() /* Adaptive */,
//!   Arc::new(ServerLogger::default()), MemoryManagementOptions::new("bench"))`. The allocation
//!   mode comes from cubecl's runtime config (no `cubecl.toml` here: `Auto`, persistent memory
//!   `Enabled`, so reservations go to the dynamic pools).
//! - Reserve: `reserve(size, PageUpdate::Allow, &mut ErrorGraph)`: runs the periodic cleanup
//!   (outdated arena pages that emptied go back) and then reserves, returning the slice's own
//!   `ManagedMemoryHandle`. No `bind` is made: the trace has no user handles.
//! - Free: dropping the `ManagedMemoryHandle`. The slice becomes free when only the pool holds its
//!   descriptor; neighbours coalesce lazily, on the next reservation that visits the page.
//! - Relocation (`relocate`) is never called: it needs the command layer's copy queue, and a bare
//!   `MemoryManagement` does not drive it on its own.
//!
//! `BytesStorage` allocates with `alloc_zeroed` (calloc: fresh mmap'd pages are not touched).
//! It is wrapped in [`CountingStorage`] to record the peak bytes held and the page calls, and to
//! free what is still held when the contender is dropped: `BytesStorage` has no `Drop`, and
//! `MemoryManagement` gives nothing back on drop, so without it every page would leak.

use crate::contender::{Contender, HeldStats};
use cubecl_ir::MemoryDeviceProperties;
use cubecl_server::logging::ServerLogger;
use cubecl_server::memory_management::{
    ErrorGraph, ManagedMemoryHandle, MemoryConfiguration, MemoryManagement,
    MemoryManagementOptions, PageUpdate,
};
use cubecl_server::server::IoError;
use cubecl_server::storage::{BytesStorage, ComputeStorage, StorageHandle, StorageId};
use std::collections::HashSet;
use std::sync::Arc;

/// A `ComputeStorage` that forwards to another and records the peak of the bytes it holds.
pub struct CountingStorage<S: ComputeStorage> {
    inner: S,
    peak: u64,
    allocs: u64,
    deallocs: u64,
    /// Pages held now, to free them on drop.
    ids: HashSet<StorageId>,
}

impl<S: ComputeStorage> Drop for CountingStorage<S> {
    fn drop(&mut self) {
        for id in core::mem::take(&mut self.ids) {
            self.inner.dealloc(id);
        }
    }
}

impl<S: ComputeStorage> ComputeStorage for CountingStorage<S> {
    type Resource = S::Resource;

    fn alignment(&self) -> usize {
        self.inner.alignment()
    }

    fn get(&mut self, handle: &StorageHandle) -> Result<Self::Resource, IoError> {
        self.inner.get(handle)
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let handle = self.inner.alloc(size)?;
        self.allocs += 1;
        self.ids.insert(handle.id);
        self.peak = self.peak.max(self.inner.bytes_allocated());
        Ok(handle)
    }

    fn dealloc(&mut self, id: StorageId) {
        self.deallocs += 1;
        self.ids.remove(&id);
        self.inner.dealloc(id)
    }

    fn flush(&mut self) {
        self.inner.flush()
    }

    fn bytes_allocated(&self) -> u64 {
        self.inner.bytes_allocated()
    }
}

pub struct Cubecl {
    mm: MemoryManagement<CountingStorage<BytesStorage>>,
    failures: ErrorGraph,
}

/// cubecl's device properties for the run: pages of at most 1 GiB, 64-byte alignment (what
/// `BytesStorage::ALIGNMENT` is).
pub const MAX_PAGE_SIZE: u64 = 1 << 30;

impl Cubecl {
    pub fn new() -> Self {
        let storage = CountingStorage {
            inner: BytesStorage::default(),
            peak: 0,
            allocs: 0,
            deallocs: 0,
            ids: HashSet::new(),
        };
        let props = MemoryDeviceProperties::new(MAX_PAGE_SIZE, BytesStorage::ALIGNMENT as u64);
        let mm = MemoryManagement::from_configuration(
            storage,
            &props,
            MemoryConfiguration::default(),
            Arc::new(ServerLogger::default()),
            MemoryManagementOptions::new("bench"),
        );
        Self {
            mm,
            failures: ErrorGraph::default(),
        }
    }
}

impl Contender for Cubecl {
    type Handle = ManagedMemoryHandle;

    fn name(&self) -> &'static str {
        "cubecl"
    }

    #[inline]
    fn alloc(&mut self, size: u64) -> Option<Self::Handle> {
        self.mm
            .reserve(size, PageUpdate::Allow, &mut self.failures)
            .ok()
    }

    #[inline]
    fn free(&mut self, handle: Self::Handle) {
        drop(handle);
    }

    fn take_stats(&mut self) -> HeldStats {
        let storage = self.mm.storage();
        let stats = HeldStats {
            peak_held: Some(storage.peak),
            held_after: Some(storage.bytes_allocated()),
            page_allocs: Some(storage.allocs),
            page_frees: Some(storage.deallocs),
        };
        storage.peak = storage.bytes_allocated();
        storage.allocs = 0;
        storage.deallocs = 0;
        stats
    }
}
