//! The recordings under way in this process, and the releases that wait for them to end.
//!
//! Owns: the count of streams recording into a graph through any [`CudaShim`](crate::CudaShim)
//! of the process, and the queue of releases (device and pinned host frees, unregistrations,
//! unmaps, reservations, module unloads) asked for while one records. Does not own: beginning
//! and ending a recording (`graph.rs`), the calls that release (`memory.rs`, `vm.rs`).
//!
//! CUDA's global capture mode, the mode the shim records in, is process-wide: while any thread
//! records a stream in it, a call that may wait for a device (`cuMemFree`, `cuMemFreeHost`,
//! `cuMemHostUnregister`, `cuMemUnmap`, `cuModuleUnload`) is refused, whichever thread and
//! whichever context makes it, and the recording is spoiled. The core defers its own device's
//! releases while that device records, but a second device (or a second shim over the same
//! device) cannot know that the first records. So every release of the shim goes through
//! [`release`], which runs it at once when nothing records and otherwise queues it until the
//! process's last recording ends ([`ended`]). Queuing is always safe: the core only releases
//! what no pending work uses, and later is still unused. The calls that cannot wait (a host wait,
//! an allocation) are refused before the driver instead ([`refuse_while_any`]): the caller gets
//! the error the driver would give, and the recording is not spoiled.
//!
//! The check and the call are not one step: a recording begun on another thread between them
//! still sees the call, as with any driver call made beside a recording begun concurrently.

use crate::device::Context;
use crate::faults::{classify, status};
use crate::memory::{self, CudaDevicePage, CudaHostPage, CudaRegistration};
use crate::vm;
use cudarc::driver::sys;
use devcmd::{DeviceAddr, DriverError, ShimOp};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Streams recording now, begun through any shim of the process and not yet ended.
static RECORDINGS: AtomicUsize = AtomicUsize::new(0);

/// Releases asked for while a stream recorded, run when the last recording ends.
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

/// Refuses `op` before the driver while a stream of the process records. Global capture mode
/// refuses a host wait or an allocation from any thread and any context then, and spoils that
/// recording over it (seen on the H200: status 900 for the call, 901 at the recording's end);
/// refused here with the same status, the recording stays valid.
pub(crate) fn refuse_while_any(op: ShimOp) -> Result<(), DriverError> {
    if any() {
        return Err(classify(op, status::STREAM_CAPTURE_UNSUPPORTED));
    }
    Ok(())
}

/// A stream began recording.
pub(crate) fn began() {
    RECORDINGS.fetch_add(1, Ordering::AcqRel);
}

/// A stream stopped recording (ended, spoiled or dropped). The last one runs the waiting
/// releases, then makes `current` the thread's context again (the releases bind their own).
pub(crate) fn ended(current: &Context) {
    if RECORDINGS.fetch_sub(1, Ordering::AcqRel) == 1 && run_waiting() {
        let _ = current.bind(ShimOp::GraphEnd);
    }
}

/// Releases waiting for the process's recordings to end: 0 whenever none records. A
/// diagnostic: memory a device gave back while another recorded is still held by the driver
/// until then.
pub fn releases_waiting() -> usize {
    waiting().len()
}

/// Runs `release` of `ctx` now, or when the process's last recording ends if one records.
///
/// # Safety
///
/// The release's own contract: no pending work uses what it gives back, and it was made by
/// `ctx` and is given back once (it is moved in).
pub(crate) unsafe fn release(ctx: &Arc<Context>, release: Release) {
    if any() {
        waiting().push(Waiting {
            ctx: Arc::clone(ctx),
            release,
        });
        // The last recording may have ended between the check and the push, and then ran the
        // queue without this one.
        if !any() {
            run_waiting();
        }
        return;
    }
    // SAFETY: the caller's promise.
    unsafe { run(ctx, release) }
}

/// Runs every waiting release; whether there were any.
fn run_waiting() -> bool {
    let queued = std::mem::take(&mut *waiting());
    let any_ran = !queued.is_empty();
    for w in queued {
        // SAFETY: each was queued by `release`, whose caller promised its contract; taken out of
        // the queue, it runs once.
        unsafe { run(&w.ctx, w.release) };
    }
    any_ran
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
