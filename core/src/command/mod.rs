//! Every operation on a device: a [`Command`] borrows the [`Device`] for one stream, and every
//! reservation, copy, launch, read and sync goes through one.
//!
//! A host gets one from [`Device::command`] (the stream is created on first use), runs a few
//! operations, and lets it go; the next batch takes a new one. What each operation does is on
//! [`Command`]; the futures a read or sync returns ([`ReadFuture`], [`ReadToFuture`],
//! [`SyncFuture`]) resolve once the device is done, and release what they held then.
//!
//! Cross-stream order is the core's job, not the host's: an operation on memory another stream
//! owns or used makes this stream wait for that stream on the device first, and keeps the memory
//! alive until this stream's work on it passed a fence. A stream whose work failed fails fast
//! ([`ServerError::StreamFaulted`]); the drop-queue calls
//! still give back what its fences covered.

// For contributors: operations only declare what they do, one file per role: `launch.rs`
// (kernels), `across.rs` (copies between two devices), `library.rs` (library work), `transfer.rs` (uploads and reads), `typed.rs` (typed
// host I/O over them), `capture.rs` (recording and replaying graphs), `memory.rs` (reservation
// with reclaim-and-retry, binding, holding room ahead, host buffers, cleanup, the drop queue),
// `window.rs` (scoped allocation-mode windows). The engine runs their steps (`engine.rs` for
// device work, `host_side.rs` for the host side of copies); `futures.rs` holds the fences a
// caller waits for. Every operation begins once (`Command::begin`: the device's bookkeeping, then
// the fault ledger and the capture state) and no operation calls another public one. The
// drop-queue calls and `reserve_host` check only that the device is not lost; `lazy`,
// `allocation_mode` and the lookups touch no device state. Does not own the pools (`memory/`), the
// fault decisions (`fault.rs`), cross-stream order (`order/`) nor the capture state (`capture/`).

mod across;
mod buffers;
mod capture;
mod engine;
mod futures;
mod host_side;
mod launch;
mod launch_check;
mod library;
mod memory;
#[cfg(feature = "pipeline")]
mod pipeline;
mod transfer;
mod typed;
mod window;

pub use across::CopyPath;
pub use futures::{ReadFuture, ReadToFuture, SyncFuture};
pub use launch::Launch;
pub use library::{Gemm, GemmType, LibraryWork};
pub use transfer::ReadRequest;
pub use window::ModeWindow;

use crate::capture::Stance;
use crate::device::{Device, DeviceReport};
use crate::error::{IoError, ServerError};
use crate::memory::{AllocationMode, AsBinding, Binding, Handle, PageUpdate, Resolved};
use crate::shim::Shim;
use crate::stream::{Stream, StreamId};

impl<S: Shim> Device<S> {
    /// A command on `stream` (created on first use).
    ///
    /// Cross-stream order is resolved by each operation for the handles it uses: an operation on
    /// memory another stream owns (or used) first makes this stream wait, on the device, for that
    /// stream's work, and keeps the memory alive until this stream's work on it passed a fence.
    ///
    /// # Errors
    ///
    /// [`ServerError::DeviceLost`]; a stream index past the limit; the shim's refusal to create
    /// the stream.
    pub fn command(&mut self, stream: StreamId) -> Result<Command<'_, S>, ServerError> {
        self.ledger.check_device()?;
        self.settle_captures();
        let index = self.ensure_stream(stream)?;
        // The command's work is issued at the new cursor: uses recorded by its operations carry
        // it, so a later waiter on this stream waits for this command's work, not only what came
        // before.
        if let Some(s) = self.streams[index].as_mut() {
            s.cursor += 1;
        }
        Ok(Command::new(self, index))
    }
}

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

/// One unit of work on one stream of a device: every operation goes through one. Made by
/// [`Device::command`].
///
/// What it does, by group (each method says what it checks and how it fails):
///
/// - **Memory**: [`empty`](Self::empty) and [`reserve`](Self::reserve) (an allocation; a
///   failure that reclaim might cure makes room on every stream and retries once),
///   [`lazy`](Self::lazy) with [`initialize`](Self::initialize) or [`bind`](Self::bind) (memory
///   later), [`hold`](Self::hold) (room ahead of a recording), the allocation-mode windows
///   ([`persistent`](Self::persistent), [`mode_window`](Self::mode_window),
///   [`allocation_mode`](Self::allocation_mode)), and [`memory_report`](Self::memory_report).
/// - **Uploads**: typed, [`create_typed`](Self::create_typed) and
///   [`write_typed`](Self::write_typed); bytes, [`create`](Self::create),
///   [`write_from`](Self::write_from) (borrowed), [`write`](Self::write) and
///   [`write_layout`](Self::write_layout) (an owned [`HostBuffer`](crate::HostBuffer), staged or
///   read in place, released after its fence); host buffers to fill, pinned where possible:
///   [`reserve_host`](Self::reserve_host).
/// - **Work**: [`launch`](Self::launch) (a kernel), [`library`](Self::library) (cuBLAS,
///   TensorRT, a C library on the stream), and graphs: [`begin_capture`](Self::begin_capture),
///   [`end_capture`](Self::end_capture), [`end_capture_update`](Self::end_capture_update),
///   [`replay`](Self::replay).
/// - **Reads**: [`read_async`](Self::read_async) (bytes, a [`ReadFuture`]),
///   [`read_to`](Self::read_to) (into the caller's buffer), [`read_owned`](Self::read_owned)
///   (in place on zero copy), [`read_typed`](Self::read_typed) (blocking, into `&mut [T]`), and
///   [`sync`](Self::sync).
/// - **Across devices**: [`copy_from`](Self::copy_from) (a range of another device's
///   allocation into one of this device's, peer to peer where the shims allow it).
/// - **Giving memory back**: [`poll_drops`](Self::poll_drops) (never blocks: a steady loop's
///   call), [`flush_drops`](Self::flush_drops), [`memory_cleanup`](Self::memory_cleanup).
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
    #[inline]
    fn begin(&mut self) -> Result<(), ServerError> {
        // The usual case: nothing rang and no fault is on record (one load).
        if !self.device.ledger.quiet() {
            self.begin_heard()?;
        } else {
            self.device.debug_assert_nothing_unrung();
        }
        // And no recording is open (one compare).
        if self.device.capture.is_idle() {
            return Ok(());
        }
        self.begin_beside_recording()
    }

    /// The part of [`Self::begin`] for a device with a recording open: a recording whose
    /// [`Recording`](crate::Recording) was dropped is aborted here, as the device's next command
    /// would (else this command would go on recording into it, and its work would never run);
    /// a discarded one fails this stream's operations with its reason.
    #[cold]
    #[inline(never)]
    fn begin_beside_recording(&mut self) -> Result<(), ServerError> {
        self.end_abandoned();
        self.device.capture.check_open(self.stream)
    }

    /// Aborts a recording whose [`Recording`](crate::Recording) was dropped: the step of
    /// [`Self::begin`] that the operations which do not begin (the drop queue's flush and poll,
    /// a host buffer's reservation) take too, so they see no recording that is already over.
    fn end_abandoned(&mut self) {
        if self.device.capture.abandoned() {
            self.device.abort_capture();
        }
    }

    /// The part of [`Self::begin`] for a device whose attention word has a flag up.
    #[cold]
    #[inline(never)]
    fn begin_heard(&mut self) -> Result<(), ServerError> {
        self.device.collect();
        self.device.ledger.check(self.stream)
    }

    /// What this command's operations do about the device's recording (the capture state's
    /// answer: run, record, or run beside another stream's recording).
    fn stance(&self) -> Stance {
        self.device.capture.stance(self.stream)
    }

    /// Refuses `op` while a stream of the device records: it would wait for or query a fence
    /// (illegal then on any stream: CUDA's global capture mode), or record one inside the
    /// recording.
    fn refuse_while_recording(&self, op: &'static str) -> Result<(), ServerError> {
        match self.stance() {
            Stance::Run => Ok(()),
            Stance::Record | Stance::OtherRecords(_) => {
                Err(crate::Validation::Recording { op }.into())
            }
        }
    }

    /// The shim the command's device runs on (a library wrapper checks it serves that device).
    pub fn shim(&self) -> &S {
        &self.device.shim
    }

    /// The id of the device this command runs on: the `device` of the
    /// [`Issuer`](crate::memory::Issuer) every handle its streams issue carries
    /// ([`Handle::issuer`]). A library wrapper keeps its per-stream state by it and the stream.
    pub fn device_id(&self) -> u32 {
        self.device.id
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
        match self.stance() {
            Stance::Run => PageUpdate::Allow,
            Stance::Record | Stance::OtherRecords(_) => PageUpdate::Forbidden,
        }
    }

    /// The device range `handle` names, resolved on the stream that owns it: to look at. Work
    /// the core does not see must not use the address (the memory may be lent to the host by
    /// [`Self::read_owned`], or reused once the handle goes): hand it out with
    /// [`Self::managed_resource`], which keeps the memory and marks it exposed.
    ///
    /// # Errors
    ///
    /// [`IoError::ForeignHandle`], [`IoError::NotFound`], [`IoError::OutOfRange`].
    pub fn resource(&mut self, handle: &impl AsBinding) -> Result<Resolved, IoError> {
        let (_, stream) = self.device.owner_of(handle)?;
        stream.memory.resolve_issued(handle)
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
    /// stream, by hand: the window stays open until closed, whatever happens in between.
    /// [`Self::persistent`] and [`Self::mode_window`] close it themselves.
    pub fn allocation_mode(&mut self, mode: AllocationMode) {
        self.current().memory.set_mode(mode);
    }
}
