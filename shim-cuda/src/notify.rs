//! Futures that sleep: [`Shim::event_notify`](devcmd::Shim::event_notify) on CUDA.
//!
//! Owns the notifier streams of a context (one per stream fences are recorded on, so a future
//! never waits behind another stream's work: events of one stream complete in order anyway)
//! and the wake-up of a waiting future: the first notify of an event makes its stream's notifier
//! wait for it (`cuStreamWaitEvent`) and adds a callback behind the wait (`cuStreamAddCallback`,
//! which the driver calls on one of its own threads once the event completed, and also when the
//! context failed, with the error, unlike `cuLaunchHostFunc`), holding the event's waker slot.
//! Later notifies of the same event value only replace the waker in the slot (an executor may
//! make a new waker at every poll). The callback takes the waker and wakes it; it makes no
//! driver call itself (the executor's wake runs on that thread). Nothing is armed while a stream
//! of the process records a graph (the core then polls). Does not own the events (`stream.rs`)
//! nor what a future does once woken (the core's `futures.rs`).

use crate::device::Context;
use crate::faults::check;
use crate::stream::CudaEvent;
use cudarc::driver::sys;
use devcmd::ShimOp;
use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Waker;

/// The waker of one event value: replaced at each notify, taken (and woken) by the callback.
#[derive(Default)]
pub(crate) struct Slot {
    waker: Mutex<Option<Waker>>,
    /// The callback ran: the event completed (or the context failed).
    fired: AtomicBool,
}

impl Slot {
    /// Stores `waker` for the callback; wakes it at once when the callback already ran.
    fn set(&self, waker: &Waker) {
        let mut slot = self.waker.lock().unwrap_or_else(PoisonError::into_inner);
        if self.fired.load(Ordering::Acquire) {
            drop(slot);
            waker.wake_by_ref();
            return;
        }
        match slot.as_mut() {
            Some(w) => w.clone_from(waker),
            None => *slot = Some(waker.clone()),
        }
    }
}

/// The callback: runs on a driver thread once the notifier stream passed the event.
///
/// # Safety
///
/// `data` is a pointer from `Arc::into_raw` of a `Slot`, handed over to this call (it runs once).
unsafe extern "C" fn fired(_stream: sys::CUstream, _status: sys::CUresult, data: *mut c_void) {
    // SAFETY: the caller's contract: this call owns one count of the `Arc`.
    let slot = unsafe { Arc::from_raw(data.cast_const().cast::<Slot>()) };
    let waker = {
        let mut w = slot.waker.lock().unwrap_or_else(PoisonError::into_inner);
        slot.fired.store(true, Ordering::Release);
        w.take()
    };
    if let Some(w) = waker {
        w.wake();
    }
}

/// Most notifier streams a context makes; fences of further streams share the last one.
const NOTIFIERS: usize = 64;

impl Context {
    /// The notifier stream for fences recorded on `source`, made on first use (non-blocking:
    /// it never waits for the legacy stream); `None` if it cannot be made.
    fn notifier(&self, source: sys::CUstream) -> Option<sys::CUstream> {
        let mut notifiers = self
            .notifiers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(&(_, n)) = notifiers.iter().find(|(s, _)| *s == source) {
            return Some(n);
        }
        if notifiers.len() >= NOTIFIERS {
            return notifiers.last().map(|&(_, n)| n);
        }
        let mut raw = ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the pointer is valid for one write; the shim bound the context.
        check(ShimOp::StreamCreate, unsafe {
            sys::cuStreamCreate(&mut raw, flags)
        })
        .ok()?;
        notifiers.push((source, raw));
        Some(raw)
    }
}

/// Arranges for `waker` to be woken once `event` completes (see the module documentation);
/// `false` when it cannot (the notifier stream, the wait or the callback refused), and the core
/// then polls. The context is current (the shim bound it).
pub(crate) fn notify(ctx: &Arc<Context>, event: &CudaEvent, waker: &Waker) -> bool {
    if let Some(slot) = event.notify.get() {
        slot.set(waker);
        return true;
    }
    let slot = Arc::new(Slot::default());
    slot.set(waker);
    let Some(stream) = ctx.notifier(event.source) else {
        return false;
    };
    // SAFETY: both handles are alive (the notifier lives as long as the context; the event is
    // held by `event`).
    let waited = unsafe { sys::cuStreamWaitEvent(stream, event.cu_event(), 0) };
    if check(ShimOp::StreamWaitEvent, waited).is_err() {
        return false;
    }
    let data = Arc::into_raw(Arc::clone(&slot)).cast_mut().cast::<c_void>();
    // SAFETY: the stream is alive; `fired` takes over the count `data` holds when the driver
    // calls it, once.
    let added = unsafe { sys::cuStreamAddCallback(stream, Some(fired), data, 0) };
    if check(ShimOp::StreamWaitEvent, added).is_err() {
        // SAFETY: the driver refused the callback, so it never runs: the count is ours again.
        drop(unsafe { Arc::from_raw(data.cast_const().cast::<Slot>()) });
        return false;
    }
    // A second notify of this value replaces the waker in this slot.
    let _ = event.notify.set(slot);
    true
}
