//! Graphs by stream capture: `cuStreamBeginCapture` (thread-local mode), `cuStreamEndCapture`,
//! `cuGraphInstantiateWithFlags`, `cuGraphUpload` and `cuGraphLaunch`.
//!
//! Owns: [`CudaGraph`] (an instantiated graph, destroyed with its context bound when it drops),
//! the capture's begin and end and what an end leaves behind. Does **not** own: which work may be
//! recorded (the core's capture rules), streams (`stream.rs`), the context (`device.rs`).
//!
//! # Capture
//!
//! A capture begins in `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`: a call this thread makes that is
//! illegal while its stream records (a `cuMemAlloc`, a synchronisation, a query of an event
//! recorded in the capture) fails and invalidates the capture, rather than run; other threads
//! are not restricted. **End the capture on the thread that began it**: CUDA refuses an end from
//! another thread (`CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`), and that refusal ends the capture
//! too, so the recording is lost (seen on the H200, driver 580.159.04: the stream no longer
//! records, and a second end answers `CUDA_ERROR_ILLEGAL_STATE`).
//!
//! Every end leaves the stream no longer recording, error or not (the GPU tests check each
//! case): an invalidated capture ends with `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`; a `doomed`
//! one (the core saw a step fail while recording) is discarded with
//! [`status::CAPTURE_DOOMED`](crate::status::CAPTURE_DOOMED); an end on a stream not recording
//! is `CUDA_ERROR_ILLEGAL_STATE`; the template graph is destroyed in every case, and a failed
//! instantiation returns its error.
//! The recording never allocates memory (the shim uses no stream-ordered allocation, and a
//! `cuMemAlloc` during the capture invalidates it), so the contract's "discard a recording that
//! allocated" is the invalidated case.

use crate::device::Context;
use crate::faults::{check, classify, status};
use crate::stream::CudaStream;
use cudarc::driver::sys;
use devcmd::{DriverError, ShimOp};
use std::fmt;
use std::ptr;
use std::sync::Arc;

/// An instantiated graph (`CUgraphExec`) recorded from a stream. Dropping it destroys it
/// (`cuGraphExecDestroy`, with its context bound), from any thread; replays already enqueued
/// still run. It keeps the modules of the kernels it recorded loaded, so dropping a kernel or
/// module after the recording is safe.
pub struct CudaGraph {
    raw: sys::CUgraphExec,
    ctx: Arc<Context>,
    /// The modules of the kernels the recording launched: a replay runs their code, so they
    /// stay loaded while the graph lives.
    _keep: Vec<Arc<dyn Send + Sync>>,
}

// SAFETY: a `CUgraphExec` is a driver handle usable from any thread with its context current;
// the shim binds the context on every call and in `Drop`.
unsafe impl Send for CudaGraph {}
// SAFETY: the driver API is thread-safe; `&CudaGraph` only passes the handle to it (CUDA
// serialises launches of one graph exec itself).
unsafe impl Sync for CudaGraph {}

impl CudaGraph {
    /// The raw `CUgraphExec`, for code that calls the driver itself. Valid while `self` lives.
    pub fn cu_graph_exec(&self) -> sys::CUgraphExec {
        self.raw
    }
}

impl fmt::Debug for CudaGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CudaGraph").field(&self.raw).finish()
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // Errors are ignored: a drop cannot report them, and a lost context frees its graphs.
        let _ = self.ctx.bind(ShimOp::GraphLaunch);
        // SAFETY: the exec was instantiated by `end` and is destroyed once, here.
        let _ = unsafe { sys::cuGraphExecDestroy(self.raw) };
    }
}

/// A template graph, destroyed when dropped (after instantiation, or on any error).
struct Template(sys::CUgraph);

impl Drop for Template {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the graph came from `cuStreamEndCapture` and is destroyed once, here; an
            // instantiated exec does not depend on its template.
            let _ = unsafe { sys::cuGraphDestroy(self.0) };
        }
    }
}

/// Starts recording `stream` in thread-local mode. The context is current.
pub(crate) fn begin(stream: &CudaStream) -> Result<(), DriverError> {
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    // SAFETY: the stream is alive (held by `stream`); the context is current.
    check(ShimOp::GraphBegin, unsafe {
        sys::cuStreamBeginCapture_v2(stream.cu_stream(), mode)
    })?;
    *lock(&stream.recorded) = Some(Vec::new());
    Ok(())
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Ends the recording of `stream` and instantiates it, or discards it when `doomed` (see the
/// [module](self) docs). The context is current.
pub(crate) fn end(
    ctx: &Arc<Context>,
    stream: &CudaStream,
    doomed: bool,
) -> Result<CudaGraph, DriverError> {
    const OP: ShimOp = ShimOp::GraphEnd;
    // Every end leaves the stream not recording: what the recording kept goes with it.
    let keep = lock(&stream.recorded).take().unwrap_or_default();
    let mut graph = ptr::null_mut();
    // SAFETY: the stream is alive; the pointer is valid for one write; the context is current.
    let r = unsafe { sys::cuStreamEndCapture(stream.cu_stream(), &mut graph) };
    // Destroyed on every path below.
    let template = Template(graph);
    check(OP, r)?;
    if template.0.is_null() {
        // An invalidated capture returns a null graph (and an error, handled above).
        return Err(classify(OP, status::STREAM_CAPTURE_INVALIDATED));
    }
    if doomed {
        return Err(classify(OP, status::CAPTURE_DOOMED));
    }
    let mut exec = ptr::null_mut();
    // SAFETY: the template is alive until `template` drops, after this call; flags 0 asks for
    // nothing special; the pointer is valid for one write.
    check(OP, unsafe {
        sys::cuGraphInstantiateWithFlags(&mut exec, template.0, 0)
    })?;
    Ok(CudaGraph {
        raw: exec,
        ctx: Arc::clone(ctx),
        _keep: keep,
    })
}

/// Whether `stream` is recording (an active or an invalidated capture). The context is current.
pub(crate) fn is_capturing(stream: &CudaStream) -> Result<bool, DriverError> {
    let mut capture = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: the stream is alive; the pointer is valid for one write.
    check(ShimOp::GraphBegin, unsafe {
        sys::cuStreamIsCapturing(stream.cu_stream(), &mut capture)
    })?;
    Ok(capture != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Uploads `graph` ahead of its first launch on `stream`. The context is current.
pub(crate) fn upload(graph: &CudaGraph, stream: &CudaStream) -> Result<(), DriverError> {
    // SAFETY: both handles are alive; the context is current.
    check(ShimOp::GraphUpload, unsafe {
        sys::cuGraphUpload(graph.raw, stream.cu_stream())
    })
}

/// Enqueues one replay of `graph` on `stream`. The context is current.
///
/// # Safety
///
/// Every page and host buffer the recording touched is alive and unmoved.
pub(crate) unsafe fn launch(graph: &CudaGraph, stream: &CudaStream) -> Result<(), DriverError> {
    // SAFETY: both handles are alive; the caller promises the memory the graph touches.
    check(ShimOp::GraphLaunch, unsafe {
        sys::cuGraphLaunch(graph.raw, stream.cu_stream())
    })
}
