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
//! A host wait or an allocation cannot be queued: it waits for the recordings of other threads
//! to end ([`take_turn`]) and is refused with the driver's status (900) while the calling thread
//! records itself (waiting for its own recording would never end; CUDA ends a global-mode
//! recording on the thread that began it). An event query answers "not yet" instead
//! ([`may_query`]), so a poller polls again later.
//!
//! A release runs under the lock that counts a recording in, and a recording is counted before
//! the driver begins it ([`begin`]), so no release reaches the driver inside a recording. A wait
//! or an allocation that found nothing recording is not made under the lock (it may block for
//! long): a recording begun on another thread at that moment still sees it, as with any driver
//! call made beside a recording begun concurrently.

use crate::device::Context;
use crate::faults::{classify, status};
use crate::memory::{self, CudaDevicePage, CudaHostPage, CudaRegistration};
use crate::vm;
use cudarc::driver::sys;
use devcmd::{DeviceAddr, DriverError, ShimOp};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, ThreadId};

/// Streams recording now, begun through any shim of the process and not yet ended: read
/// without the lock on the usual paths (nothing records), changed only under it.
static RECORDINGS: AtomicUsize = AtomicUsize::new(0);

/// The process's recordings and the releases waiting for them.
static OPEN: Mutex<Open> = Mutex::new(Open {
    threads: Vec::new(),
    waiting: Vec::new(),
});

/// Signalled whenever the last recording ends.
static QUIET: Condvar = Condvar::new();

/// Host waits and allocations blocked now until the recordings of other threads end.
static BLOCKED: AtomicUsize = AtomicUsize::new(0);

struct Open {
    /// The stream (`CUstream` address) and the thread of each recording.
    threads: Vec<(usize, ThreadId)>,
    /// Releases asked for while a stream recorded, oldest first.
    waiting: Vec<Waiting>,
}

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

fn open() -> MutexGuard<'static, Open> {
    OPEN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether a stream of this process records now (begun through a shim, not yet ended).
pub(crate) fn any() -> bool {
    RECORDINGS.load(Ordering::Acquire) != 0
}

/// Before a host wait or an allocation (`op`), which the driver refuses from any thread while a
/// stream of the process records, spoiling that recording: waits until the recordings of other
/// threads ended, and refuses with the driver's status (900) while this thread records.
pub(crate) fn take_turn(op: ShimOp) -> Result<(), DriverError> {
    if !any() {
        return Ok(());
    }
    let me = thread::current().id();
    let mut open = open();
    while !open.threads.is_empty() {
        if open.threads.iter().any(|&(_, t)| t == me) {
            return Err(classify(op, status::STREAM_CAPTURE_UNSUPPORTED));
        }
        BLOCKED.fetch_add(1, Ordering::AcqRel);
        open = QUIET.wait(open).unwrap_or_else(PoisonError::into_inner);
        BLOCKED.fetch_sub(1, Ordering::AcqRel);
    }
    Ok(())
}

/// Refuses `op` before the driver while a stream of the process records, with the driver's
/// status (900): for a call that may not block until the recordings end (it may itself be
/// recorded).
pub(crate) fn refuse_while_any(op: ShimOp) -> Result<(), DriverError> {
    if any() {
        return Err(classify(op, status::STREAM_CAPTURE_UNSUPPORTED));
    }
    Ok(())
}

/// Whether an event query may reach the driver now: not while a stream of the process records
/// (the driver would refuse it and spoil the recording); the query then answers "not yet".
pub(crate) fn may_query() -> bool {
    !any()
}

/// Begins a recording of `stream` (a `CUstream` address) on this thread: counted first, so a
/// release asked for meanwhile waits instead of reaching the driver inside it, then `begin` (the
/// driver's call); uncounted again if that fails.
pub(crate) fn begin(
    ctx: &Context,
    stream: usize,
    begin: impl FnOnce() -> Result<(), DriverError>,
) -> Result<(), DriverError> {
    {
        let mut open = open();
        open.threads.push((stream, thread::current().id()));
        RECORDINGS.fetch_add(1, Ordering::AcqRel);
    }
    begin().inspect_err(|_| ended(ctx, stream))
}

/// The recording of `stream` stopped (ended, spoiled, or its stream destroyed): call only once
/// the driver no longer records it. The last one runs the waiting releases, then makes `current`
/// the thread's context again (the releases bind their own), and wakes the waits.
pub(crate) fn ended(current: &Context, stream: usize) {
    let mut open = open();
    if let Some(i) = open.threads.iter().position(|&(s, _)| s == stream) {
        open.threads.swap_remove(i);
        RECORDINGS.fetch_sub(1, Ordering::AcqRel);
    }
    if !open.threads.is_empty() {
        return;
    }
    let queued = std::mem::take(&mut open.waiting);
    let any_ran = !queued.is_empty();
    for w in queued {
        // SAFETY: each was queued by `release`, whose caller promised its contract; taken out of
        // the queue, it runs once, under the lock, so no recording begins meanwhile.
        unsafe { run(&w.ctx, w.release) };
    }
    if any_ran {
        let _ = current.bind(ShimOp::GraphEnd);
    }
    drop(open);
    QUIET.notify_all();
}

/// Releases waiting for the process's recordings to end: 0 whenever none records. A
/// diagnostic: memory a device gave back while another recorded is still held by the driver
/// until then.
pub fn releases_waiting() -> usize {
    open().waiting.len()
}

/// Host waits and allocations blocked now until the recordings of other threads end (a
/// diagnostic: 0 whenever nothing records).
pub fn calls_waiting() -> usize {
    BLOCKED.load(Ordering::Acquire)
}

/// Runs `release` of `ctx` now, or when the process's last recording ends if one records and
/// the driver would refuse it then.
///
/// # Safety
///
/// The release's own contract: no pending work uses what it gives back, and it was made by
/// `ctx` and is given back once (it is moved in).
pub(crate) unsafe fn release(ctx: &Arc<Context>, release: Release) {
    let mut open = open();
    if !open.threads.is_empty() && release.must_wait() {
        open.waiting.push(Waiting {
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
