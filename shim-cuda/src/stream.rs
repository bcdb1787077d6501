//! Streams and events: `cuStreamCreate` (non-blocking), streams borrowed from the caller's
//! runtime (`cuStreamGetCtx` checks they belong to the shim's context; never destroyed here),
//! `cuEventRecord` on events without timing, `cuStreamWaitEvent`, `cuEventQuery` and
//! `cuEventSynchronize`.
//!
//! Events are pooled: a dropped [`CudaEvent`] goes back to its context's pool and the next
//! record reuses it (re-recording re-arms a CUDA event; a stream that waits on an earlier record
//! waits on the record it saw when it was told to wait, so reuse cannot confuse it). Every event
//! is created with `CU_EVENT_DISABLE_TIMING`, the cheapest kind to record and query.
//!
//! Every function here expects the context to be current on the calling thread
//! ([`Context::bind`]); the shim binds before calling them, and the drops bind themselves.

use crate::device::Context;
use crate::faults::{check, classify, code, status};
use cudarc::driver::sys;
use devcmd::{DriverError, ShimOp};
use std::fmt;
use std::ptr;
use std::sync::{Arc, Mutex};

/// At most this many idle events stay in a context's pool; the rest are destroyed.
const POOLED_EVENTS: usize = 256;

/// A CUDA stream: created by the shim with `CU_STREAM_NON_BLOCKING` (it never synchronises with
/// the legacy default stream), or borrowed from the caller's runtime
/// ([`Shim::borrow_stream`](devcmd::Shim::borrow_stream)). Dropping a stream the shim created
/// destroys it (`cuStreamDestroy`: work already enqueued still runs), from any thread; dropping
/// a borrowed one leaves it to its owner.
pub struct CudaStream {
    raw: sys::CUstream,
    ctx: Arc<Context>,
    /// Borrowed from the caller's runtime: never destroyed here.
    borrowed: bool,
    /// While the stream records (between `begin_capture` and `end_capture`): what the kernels
    /// launched into the recording need alive (their modules), for the graph to keep.
    pub(crate) recorded: Mutex<Option<Vec<Arc<dyn Send + Sync>>>>,
}

// SAFETY: a `CUstream` is a driver handle usable from any thread; the shim binds the context
// on every call that needs it and in `Drop` (a launch runs in the stream's own context).
unsafe impl Send for CudaStream {}
// SAFETY: the driver API is thread-safe; `&CudaStream` only passes the handle to it.
unsafe impl Sync for CudaStream {}

impl CudaStream {
    /// The raw `CUstream`, for code that calls the driver itself (with the shim's context
    /// current). It stays valid while this value lives.
    pub fn cu_stream(&self) -> sys::CUstream {
        self.raw
    }

    /// Whether the stream was borrowed from the caller's runtime
    /// ([`Shim::borrow_stream`](devcmd::Shim::borrow_stream)): dropping it leaves it alive.
    pub fn is_borrowed(&self) -> bool {
        self.borrowed
    }

    /// The context the stream belongs to.
    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The raw `CUstream`, borrowed (the shim's `native_stream`).
    pub(crate) fn raw_ref(&self) -> &sys::CUstream {
        &self.raw
    }
}

impl fmt::Debug for CudaStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaStream")
            .field("raw", &self.raw)
            .field("borrowed", &self.borrowed)
            .finish()
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        let recording = self.recorded.get_mut().unwrap_or_else(|e| e.into_inner());
        let was_recording = recording.take().is_some();
        if was_recording && self.borrowed {
            // Dropped while recording: an owned stream's capture dies with it (below); a
            // borrowed one's is ended here, so the owner's stream does not record on (in CUDA's
            // global mode, refusing every host wait).
            let _ = self.ctx.bind(ShimOp::GraphEnd);
            let mut graph = ptr::null_mut();
            // SAFETY: the stream is the owner's and alive (the borrow's contract); the graph the
            // end returns, if any, is destroyed at once and never launched.
            unsafe {
                if sys::cuStreamEndCapture(self.raw, &mut graph) == sys::CUresult::CUDA_SUCCESS
                    && !graph.is_null()
                {
                    let _ = sys::cuGraphDestroy(graph);
                }
            }
        }
        // The caller's runtime owns a borrowed stream (and may destroy it once this value is
        // gone).
        if !self.borrowed {
            // Errors are ignored: a drop cannot report them, and after a sticky error the driver
            // has torn the context's work down anyway.
            let _ = self.ctx.bind(ShimOp::StreamCreate);
            // SAFETY: the stream was created by `create` and is destroyed once, here.
            let _ = unsafe { sys::cuStreamDestroy_v2(self.raw) };
        }
        if was_recording {
            // The capture is over (ended or destroyed above): releases that waited for it may
            // run now, if no other stream records.
            crate::recording::ended(&self.ctx);
        }
    }
}

/// A fence: a CUDA event (without timing) recorded on a stream. Dropping it returns it to its
/// context's pool, from any thread.
pub struct CudaEvent {
    raw: sys::CUevent,
    ctx: Arc<Context>,
    /// The waker slot of a future waiting on this record, once one asked (`notify.rs`).
    pub(crate) notify: std::sync::OnceLock<Arc<crate::notify::Slot>>,
    /// The stream it was recorded on (only compared: it picks the notifier stream).
    pub(crate) source: sys::CUstream,
}

// SAFETY: a `CUevent` is a driver handle usable from any thread; see `CudaStream`.
unsafe impl Send for CudaEvent {}
// SAFETY: the driver API is thread-safe; `&CudaEvent` only passes the handle to it.
unsafe impl Sync for CudaEvent {}

impl CudaEvent {
    /// The raw `CUevent`, for code that calls the driver itself. It stays valid while this value
    /// lives.
    pub fn cu_event(&self) -> sys::CUevent {
        self.raw
    }
}

impl fmt::Debug for CudaEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CudaEvent").field(&self.raw).finish()
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        self.ctx.give_event(self.raw);
    }
}

impl Context {
    /// An idle event of the pool, or a new one (`CU_EVENT_DISABLE_TIMING`).
    fn take_event(&self, op: ShimOp) -> Result<sys::CUevent, DriverError> {
        if let Some(event) = self.events.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(event);
        }
        let mut event = ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: the pointer is valid for one write; the context is current (module docs).
        check(op, unsafe { sys::cuEventCreate(&mut event, flags) })?;
        Ok(event)
    }

    /// Returns an event no [`CudaEvent`] holds any more to the pool (or destroys it when the
    /// pool is full).
    fn give_event(&self, event: sys::CUevent) {
        let mut pool = self.events.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < POOLED_EVENTS {
            pool.push(event);
            return;
        }
        drop(pool);
        let _ = self.bind(ShimOp::EventRecord);
        // SAFETY: the event is owned by the caller alone and destroyed once, here. An event
        // still pending is released by the driver once it completes.
        let _ = unsafe { sys::cuEventDestroy_v2(event) };
    }
}

/// A new non-blocking stream of `ctx` (current on this thread).
pub(crate) fn create(ctx: &Arc<Context>) -> Result<CudaStream, DriverError> {
    let mut raw = ptr::null_mut();
    let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
    // SAFETY: the pointer is valid for one write; the context is current (module docs).
    check(ShimOp::StreamCreate, unsafe {
        sys::cuStreamCreate(&mut raw, flags)
    })?;
    Ok(CudaStream {
        raw,
        ctx: Arc::clone(ctx),
        borrowed: false,
        recorded: Mutex::new(None),
    })
}

/// A stream over `native`, a stream of `ctx` (current on this thread) that the caller's runtime
/// created and owns: checked to belong to `ctx` (`cuStreamGetCtx`), never destroyed here.
///
/// The legacy default stream (null, or `CU_STREAM_LEGACY`) is accepted: it synchronises with
/// blocking streams only, and every stream the shim creates is non-blocking; CUDA cannot record
/// it into a graph, so a recording of it is refused when it begins. The per-thread default
/// stream (`CU_STREAM_PER_THREAD`) is refused: it names another stream on every thread, and the
/// core may drive a device from several threads in turn. A stream being captured into a graph
/// is refused (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`).
///
/// # Safety
///
/// `native` is a live stream and stays alive while the returned value lives; its owner does not
/// begin a capture of it while devcmd uses it.
pub(crate) unsafe fn borrow(
    ctx: &Arc<Context>,
    native: sys::CUstream,
) -> Result<CudaStream, DriverError> {
    const OP: ShimOp = ShimOp::StreamCreate;
    /// `CU_STREAM_PER_THREAD`, a handle by convention.
    const PER_THREAD: usize = 0x2;
    if native as usize == PER_THREAD {
        return Err(classify(OP, status::BAD_ARGUMENT));
    }
    let mut owner = ptr::null_mut();
    // SAFETY: the caller promises a live stream; the pointer is valid for one write.
    check(OP, unsafe { sys::cuStreamGetCtx(native, &mut owner) })?;
    if owner != ctx.raw() {
        return Err(classify(OP, status::INVALID_CONTEXT));
    }
    // A stream its owner records (a CUDA graph capture by PyTorch, say): devcmd's fences would
    // become nodes of that graph and its queries would break the capture.
    let mut capture = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: the stream is live (the caller's promise); the pointer is valid for one write.
    check(OP, unsafe {
        sys::cuStreamIsCapturing(native, &mut capture)
    })?;
    if capture != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        return Err(classify(OP, status::STREAM_CAPTURE_UNSUPPORTED));
    }
    Ok(CudaStream {
        raw: native,
        ctx: Arc::clone(ctx),
        borrowed: true,
        recorded: Mutex::new(None),
    })
}

/// Records an event of `ctx` (current on this thread) at the tail of `stream`.
pub(crate) fn record(ctx: &Arc<Context>, stream: &CudaStream) -> Result<CudaEvent, DriverError> {
    const OP: ShimOp = ShimOp::EventRecord;
    // Held by a `CudaEvent` at once, so it goes back to the pool if the record fails.
    let event = CudaEvent {
        raw: ctx.take_event(OP)?,
        ctx: Arc::clone(ctx),
        notify: std::sync::OnceLock::new(),
        source: stream.raw,
    };
    // SAFETY: both handles are alive (held by `event` and `stream`).
    check(OP, unsafe { sys::cuEventRecord(event.raw, stream.raw) })?;
    Ok(event)
}

/// Makes `stream` wait on the device for `event` (`cuStreamWaitEvent`; the host does not block).
pub(crate) fn wait_event(stream: &CudaStream, event: &CudaEvent) -> Result<(), DriverError> {
    // SAFETY: both handles are alive; flags 0 is `CU_EVENT_WAIT_DEFAULT`.
    check(ShimOp::StreamWaitEvent, unsafe {
        sys::cuStreamWaitEvent(stream.raw, event.raw, 0)
    })
}

/// Whether `event` has completed, without blocking: `CUDA_ERROR_NOT_READY` is `Ok(false)`.
pub(crate) fn query(event: &CudaEvent) -> Result<bool, DriverError> {
    // SAFETY: the handle is alive (held by `event`).
    match code(unsafe { sys::cuEventQuery(event.raw) }) {
        status::SUCCESS => Ok(true),
        status::NOT_READY => Ok(false),
        s => Err(classify(ShimOp::EventQuery, s)),
    }
}

/// Blocks until `event` completes (`cuEventSynchronize`).
pub(crate) fn synchronize(event: &CudaEvent) -> Result<(), DriverError> {
    // SAFETY: the handle is alive (held by `event`).
    check(ShimOp::EventWait, unsafe {
        sys::cuEventSynchronize(event.raw)
    })
}
