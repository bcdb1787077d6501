//! The recordings under way in this process, and the releases that wait for them to end.
//!
//! Owns: the count of streams recording into a graph through any [`CudaShim`](crate::CudaShim)
//! of the process, and the queue of releases (device and pinned host frees, unregistrations,
//! unmaps, reservations, module unloads) asked for while one records. Does not own: beginning
//! and ending a recording (`graph.rs`), the calls that release (`memory.rs`, `vm.rs`).
//!
//! CUDA's global capture mode, the mode the shim records in, is process-wide: while any thread
//! records a stream in it, a call that may wait for a device is refused, whichever thread and
//! whichever context makes it, and the recording is spoiled. Seen on an H100, driver 580
//! (`scripts/capture_probe.py`, status 900 for the call, 901 at the recording's end): refused
//! are `cuMemAlloc`, `cuMemFree`, `cuMemFreeAsync`, `cuMemHostAlloc`, `cuMemFreeHost`,
//! `cuMemHostRegister`, `cuMemHostUnregister`, `cuModuleUnload`, `cuEventQuery`,
//! `cuStreamQuery` and `cuStreamSynchronize`; taken are the virtual memory calls
//! (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, `cuMemUnmap`, `cuMemRelease`), module
//! loads, event and stream creation and destruction, event records, async copies on other
//! streams and other recordings' begins. The core defers its own device's
//! releases while that device records, but a second device (or a second shim over the same
//! device) cannot know that the first records. So every release of the shim goes through
//! [`release`], which runs it at once when nothing records and otherwise queues it until the
//! process's last recording ends ([`ended`]), in the order they were asked for. Queuing is
//! always safe: the core only releases what no pending work uses, and later is still unused.
//! A host wait or an allocation cannot be queued: it is refused before the driver with the
//! driver's own status (900) while any stream of the process records ([`refuse_while_any`]), so
//! the caller gets the error the driver would give and the recording is not spoiled; the status
//! is classified [`Fault::Busy`](devcmd::Fault::Busy), so the core keeps what a refused fence
//! covers for a later wait instead of leaking it. (Waiting
//! for the recordings to end instead was tried: a thread that waits while it holds a lock the
//! recording thread needs, or for a recording whose token was dropped, would hang for good.)
//! An event query answers "not yet" instead (`CudaShim::event_query`), so a poller polls again
//! later.
//!
//! A release runs under the lock that counts a recording in, and a recording is counted before
//! the driver begins it ([`begin`]), so no release reaches the driver inside a recording. A wait
//! or an allocation that found nothing recording is not made under the lock: a recording begun
//! on another thread at that moment still sees it, as with any driver call made beside a
//! recording begun concurrently.

use crate::device::Context;
use crate::faults::{classify, status};
use crate::memory::{self, CudaDevicePage, CudaHostPage, CudaRegistration};
use crate::vm;
use cudarc::driver::sys;
use devcmd::{DeviceAddr, DriverError, ShimOp};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Streams recording now, begun through any shim of the process and not yet ended: read
/// without the lock on the usual paths (nothing records), changed only under it.
static RECORDINGS: AtomicUsize = AtomicUsize::new(0);

/// Releases asked for while a stream recorded, oldest first; its lock also orders a
/// recording's count against the releases.
static WAITING: Mutex<Vec<Waiting>> = Mutex::new(Vec::new());

/// Something to give back to the driver.
pub(crate) enum Release {
    /// `cuMemFree`, after a poison fill when the flag says so.
    DevicePage(CudaDevicePage, bool),
    /// `cuMemFreeHost`, after a poison fill when the flag says so.
    HostPage(CudaHostPage, bool),
    /// `cuMemHostUnregister`.
    Registration(CudaRegistration),
    /// `cuMemUnmap` and `cuMemRelease` of a mapped range and its allocation handle, after a
    /// poison fill when the flag says so.
    Mapping {
        addr: DeviceAddr,
        size: u64,
        handle: u64,
        poison: bool,
    },
    /// `cuMemAddressFree` of a reservation with nothing mapped in it.
    Reservation { addr: DeviceAddr, size: u64 },
    /// `cuModuleUnload`.
    Module(sys::CUmodule),
}

impl Release {
    /// Whether the driver refuses this release while a stream of the process records, from any
    /// thread and any context, spoiling that recording. Seen on an H100, driver 580
    /// (`scripts/capture_probe.py`): `cuMemFree`, `cuMemFreeHost`, `cuMemHostUnregister` and
    /// `cuModuleUnload` are refused; `cuMemUnmap` and `cuMemRelease` are not, but a poison fill
    /// waits for the device, which is. `cuMemAddressFree` was not seen: it waits too.
    fn must_wait(&self) -> bool {
        !matches!(self, Self::Mapping { poison: false, .. })
    }
}

/// A release and the context it belongs to (kept alive until it ran).
struct Waiting {
    ctx: Arc<Context>,
    release: Release,
}

// SAFETY: every handle in a `Release` is a driver handle or address usable from any thread
// with its context current (`run` binds it); the queue owns each one alone until it runs.
unsafe impl Send for Waiting {}

fn waiting() -> MutexGuard<'static, Vec<Waiting>> {
    WAITING.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether a stream of this process records now (begun through a shim, not yet ended).
pub(crate) fn any() -> bool {
    RECORDINGS.load(Ordering::Acquire) != 0
}

/// Refuses `op` (a host wait or an allocation) before the driver while a stream of the process
/// records, with the driver's status (900): the driver would refuse it from any thread and any
/// context, and spoil that recording.
pub(crate) fn refuse_while_any(op: ShimOp) -> Result<(), DriverError> {
    if any() {
        return Err(classify(op, status::STREAM_CAPTURE_UNSUPPORTED));
    }
    Ok(())
}

/// Begins a recording: counted first, so a release asked for meanwhile waits instead of
/// reaching the driver inside it, then `begin` (the driver's call); uncounted again if that
/// fails.
pub(crate) fn begin(
    ctx: &Context,
    begin: impl FnOnce() -> Result<(), DriverError>,
) -> Result<(), DriverError> {
    {
        let _counted = waiting();
        RECORDINGS.fetch_add(1, Ordering::AcqRel);
    }
    begin().inspect_err(|_| ended(ctx))
}

/// A recording stopped (ended, spoiled, or its stream destroyed): call once per [`begin`] that
/// succeeded, once the driver no longer records it. The last one runs the waiting releases,
/// then makes `current` the thread's context again (the releases bind their own).
pub(crate) fn ended(current: &Context) {
    let mut queue = waiting();
    if RECORDINGS.fetch_sub(1, Ordering::AcqRel) != 1 {
        return;
    }
    let queued = std::mem::take(&mut *queue);
    let any_ran = !queued.is_empty();
    for w in queued {
        // SAFETY: each was queued by `release`, whose caller promised its contract; taken out of
        // the queue, it runs once, under the lock, so no recording begins meanwhile.
        unsafe { run(&w.ctx, w.release) };
    }
    if any_ran {
        let _ = current.bind(ShimOp::GraphEnd);
    }
}

/// Releases waiting for the process's recordings to end: 0 whenever none records. A
/// diagnostic: memory a device gave back while another recorded is still held by the driver
/// until then.
pub fn releases_waiting() -> usize {
    waiting().len()
}

/// Runs `release` of `ctx` now, or when the process's last recording ends if one records and
/// the driver would refuse it then.
///
/// # Safety
///
/// The release's own contract: no pending work uses what it gives back, and it was made by
/// `ctx` and is given back once (it is moved in).
pub(crate) unsafe fn release(ctx: &Arc<Context>, release: Release) {
    let mut queue = waiting();
    if any() && release.must_wait() {
        queue.push(Waiting {
            ctx: Arc::clone(ctx),
            release,
        });
        return;
    }
    // Nothing records, so nothing waits (the last recording's end ran the queue), or the
    // driver takes this release beside a recording: it runs now, under the lock, so no
    // recording begins meanwhile.
    // SAFETY: the caller's promise.
    unsafe { run(ctx, release) }
}

/// Binds `ctx` and makes the call. Errors cannot be reported: a release has no caller to tell,
/// and a lost device's memory goes with its context.
///
/// # Safety
///
/// As [`release`].
unsafe fn run(ctx: &Context, release: Release) {
    let _ = ctx.bind(ShimOp::DeviceAlloc);
    // SAFETY: in every arm, the caller's promise; the context is current.
    unsafe {
        match release {
            Release::DevicePage(page, poison) => {
                if poison {
                    memory::poison_device(&page);
                }
                memory::device_free(page);
            }
            Release::HostPage(page, poison) => {
                if poison {
                    memory::poison_host(&page);
                }
                memory::host_free(page);
            }
            Release::Registration(registration) => memory::host_unregister(registration),
            Release::Mapping {
                addr,
                size,
                handle,
                poison,
            } => {
                if poison {
                    memory::poison_range(addr, size);
                }
                vm::unmap(addr, size, handle);
            }
            Release::Reservation { addr, size } => vm::release(addr, size),
            Release::Module(module) => {
                let _ = sys::cuModuleUnload(module);
            }
        }
    }
}
