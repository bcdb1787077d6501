//! One unit of work against the device: every operation that touches memory or launches goes
//! through a [`Command`], so every policy rule is written once.
//!
//! A command borrows the device for one stream. Its operations live in one file per role:
//! `memory.rs` (reservation with reclaim-and-retry, binding, host buffers, cleanup, the drop
//! queue), `transfer.rs` (uploads and reads), `launch.rs` (kernels and the failure rule), and
//! `futures.rs` (the fences a caller waits for), `capture.rs` (recording, sealing and replaying
//! graphs, and holding room ahead). Each operation checks the fault ledger first
//! (`fault.rs`), orders itself after other streams for every handle it touches (`order.rs`), and
//! reports what fences reveal to the ledger. Every operation that enqueues device work or makes
//! room begins the same way (`Command::begin`): the device's bookkeeping runs (freed allocations
//! leave the failure and cross-stream records, retired pages go to the drop queue), then the
//! ledger is checked. The drop-queue calls (`flush_drops`, `poll_drops`) and `reserve_host` check
//! only that the device is not lost: a faulted stream still gives back what its fences covered.
//! `lazy`, `allocation_mode` and the lookups touch no device state.
//!
//! Does not own the pools (`memory/`), the fault decisions (`fault.rs`) nor cross-stream order
//! (`order.rs`).

mod capture;
mod engine;
mod futures;
mod launch;
mod library;
mod memory;
mod transfer;

pub use futures::{ReadFuture, ReadToFuture, SyncFuture};
pub use launch::Launch;
pub use library::{Gemm, GemmType, LibraryWork};
pub use transfer::ReadRequest;

use crate::device::{Device, DeviceReport};
use crate::error::{IoError, ServerError};
use crate::memory::{AllocationMode, AsBinding, Binding, Handle, PageUpdate, Resolved};
use crate::shim::Shim;
use crate::stream::{Stream, StreamId};

/// A device range resolved for a caller outside the layer, with the binding that keeps the
/// allocation alive (and unmoved) while this value lives.
#[derive(Debug, Clone)]
pub struct ManagedResource {
    /// The range.
    pub resource: Resolved,
    binding: Binding,
}

impl ManagedResource {
    /// The binding held.
    pub fn binding(&self) -> &Binding {
        &self.binding
    }
}

/// One unit of work on one stream of a device. See the module documentation.
#[derive(Debug)]
pub struct Command<'a, S: Shim> {
    device: &'a mut Device<S>,
    stream: usize,
}

impl<'a, S: Shim> Command<'a, S> {
    pub(crate) fn new(device: &'a mut Device<S>, stream: usize) -> Self {
        Self { device, stream }
    }

    fn current(&mut self) -> &mut Stream<S> {
        self.device.streams[self.stream]
            .as_mut()
            .expect("a command's stream exists")
    }

    /// The shim and this command's stream, borrowed together.
    fn parts(&mut self) -> (&S, &mut Stream<S>) {
        let stream = self.device.streams[self.stream]
            .as_mut()
            .expect("a command's stream exists");
        (&self.device.shim, stream)
    }

    /// How every operation begins: the device's bookkeeping runs (freed allocations leave the
    /// failure and cross-stream records, retired pages go to their drop queue), then the
    /// operation fails fast when the device is lost, this stream's work (or work it was ordered
    /// after) failed while it ran, or this stream's recording was discarded and not yet ended.
    fn begin(&mut self) -> Result<(), ServerError> {
        self.device.collect();
        self.device.ledger.check(self.stream)?;
        self.current().capture.check_open()
    }

    /// Refuses `op` while a stream of the device records: it would wait for or query a fence
    /// (illegal then on any stream: CUDA's global capture mode), or record one inside the
    /// recording.
    fn refuse_while_recording(&mut self, op: &'static str) -> Result<(), ServerError> {
        if self.device.recording().is_some() {
            return Err(crate::Validation::Recording { op }.into());
        }
        Ok(())
    }

    /// The stream this command runs on.
    pub fn stream_id(&self) -> StreamId {
        StreamId(self.stream as u32)
    }

    /// The stream's cursor: commands issued on it so far.
    pub fn cursor(&self) -> u64 {
        self.device.streams[self.stream]
            .as_ref()
            .map_or(0, |s| s.cursor)
    }

    /// What a reservation on this stream may do to the pages: nothing but use the room held while
    /// any stream of the device records (no page may be allocated or freed then, on any stream).
    fn page_update(&self) -> PageUpdate {
        if self.device.recording().is_some() {
            PageUpdate::Forbidden
        } else {
            PageUpdate::Allow
        }
    }

    /// The device range `handle` names, resolved on the stream that owns it.
    ///
    /// # Errors
    ///
    /// [`IoError::ForeignHandle`], [`IoError::NotFound`], [`IoError::OutOfRange`].
    pub fn resource(&mut self, handle: &impl AsBinding) -> Result<Resolved, IoError> {
        let owner = self.device.owner_of(handle)?;
        self.device.streams[owner]
            .as_ref()
            .expect("owner_of found it")
            .memory
            .resolve(handle)
    }

    /// The host address of the first byte of `resolved` (a range of `handle`), when it lies on a
    /// page the host reaches in place (zero copy: [`crate::DeviceConfig::zero_copy`]).
    pub(crate) fn host_view(
        &mut self,
        handle: &impl AsBinding,
        resolved: &Resolved,
    ) -> Option<(
        core::ptr::NonNull<u8>,
        alloc::sync::Arc<core::sync::atomic::AtomicU32>,
    )> {
        let owner = self.device.owner_of(handle).ok()?;
        let stream = self.device.streams[owner].as_ref()?;
        stream.memory.host_ptr(&self.device.shim, resolved)
    }

    /// The device range of `handle` with a binding that keeps it alive for a caller outside the
    /// layer. The allocation counts as exposed from then on: work the core does not see may use
    /// the address, so [`Self::read_owned`] always copies it.
    ///
    /// # Errors
    ///
    /// As [`Self::resource`].
    pub fn managed_resource(&mut self, handle: &Handle) -> Result<ManagedResource, IoError> {
        let resource = self.resource(handle)?;
        handle.expose();
        Ok(ManagedResource {
            resource,
            binding: handle.binding(),
        })
    }

    /// The memory report of the whole device (every stream, pinned pools included).
    pub fn memory_report(&mut self) -> DeviceReport {
        self.device.collect();
        self.device.memory_report()
    }

    /// Opens (`Persistent`, `Dedicated`) or closes (`Auto`) an allocation-mode window on this
    /// stream.
    pub fn allocation_mode(&mut self, mode: AllocationMode) {
        self.current().memory.set_mode(mode);
    }
}
