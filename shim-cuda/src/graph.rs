//! Graphs by stream capture: `cuStreamBeginCapture` (global mode), `cuStreamEndCapture`,
//! `cuGraphInstantiateWithFlags` or `cuGraphExecUpdate`, `cuGraphUpload` and `cuGraphLaunch`.
//!
//! Owns: [`CudaGraph`] (an instantiated graph, destroyed with its context bound when it drops),
//! the capture's begin and end and what an end leaves behind. Does **not** own: which work may be
//! recorded (the core's capture rules), streams (`stream.rs`), the context (`device.rs`).
//!
//! # Capture
//!
//! A capture begins in `CU_STREAM_CAPTURE_MODE_GLOBAL`: a potentially unsafe call (a
//! `cuMemAlloc`, a synchronisation, a query of an event recorded in the capture) made while the
//! stream records fails and invalidates the capture rather than run, whichever thread makes it:
//! another thread of the process (a library of the host's) cannot slip one in. The core makes
//! none while a stream records. **End the capture on the thread that began it**: CUDA refuses an end from
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
    /// The modules of the kernels the recording launched (and those of every recording it was
    /// updated with): a replay runs their code, so they stay loaded while the graph lives.
    keep: std::sync::Mutex<Vec<Kept>>,
}

// SAFETY: a `CUgraphExec` is a driver handle usable from any thread; the shim binds the
// context on every call that needs it and in `Drop` (a launch runs in its stream's context).
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

/// A module a recording launched a kernel of, kept loaded.
type Kept = Arc<dyn Send + Sync>;

/// Adds `item` to `list` unless it is there already (one entry per module, however many
/// launches or updated recordings use it: a graph updated every step keeps a bounded list).
pub(crate) fn keep_once(list: &mut Vec<Kept>, item: Kept) {
    let same = |k: &Kept| core::ptr::addr_eq(Arc::as_ptr(k), Arc::as_ptr(&item));
    if !list.iter().any(same) {
        list.push(item);
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

/// Starts recording `stream` in global mode. The context is current.
pub(crate) fn begin(stream: &CudaStream) -> Result<(), DriverError> {
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
    let call = || {
        // SAFETY: the stream is alive (held by `stream`); the context is current.
        check(ShimOp::GraphBegin, unsafe {
            sys::cuStreamBeginCapture_v2(stream.cu_stream(), mode)
        })
    };
    let mut recorded = lock(&stream.recorded);
    if recorded.is_some() {
        // Recording already: the driver refuses a second begin, and it is not counted twice.
        return call();
    }
    crate::recording::begin(stream.context(), call)?;
    *recorded = Some(Vec::new());
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
    let (template, keep) = end_capture(stream, doomed)?;
    instantiate(ctx, &template, keep)
}

/// Ends the recording of `stream` as [`end`] does, then updates `graph` in place with it
/// (`cuGraphExecUpdate`: the same topology, new parameters; replays already enqueued run what
/// they were enqueued with): `None` when updated, otherwise the recording instantiated anew.
/// The context is current.
pub(crate) fn end_update(
    ctx: &Arc<Context>,
    stream: &CudaStream,
    doomed: bool,
    graph: &CudaGraph,
) -> Result<Option<CudaGraph>, DriverError> {
    let (template, keep) = end_capture(stream, doomed)?;
    // SAFETY: both handles are alive (the template until it drops below); the context is
    // current; the result out-parameters are written by the driver and never read.
    let updated = unsafe { exec_update(graph.raw, template.0) };
    if updated == sys::CUresult::CUDA_SUCCESS {
        // The graph now runs the new recording's kernels too (earlier replays, the old ones).
        let mut kept = lock(&graph.keep);
        for k in keep {
            keep_once(&mut kept, k);
        }
        return Ok(None);
    }
    // Another topology (or anything else the update refuses): a new instantiation, which
    // reports a real error if there is one.
    instantiate(ctx, &template, keep).map(Some)
}

/// `cuGraphExecUpdate_v2` of `exec` with `template`'s parameters, where the driver has it; the
/// driver's answer (`CUDA_ERROR_NOT_SUPPORTED` without it: the caller instantiates anew).
///
/// # Safety
///
/// Both handles are alive and the context is current.
#[cfg(not(feature = "cuda-11040"))]
unsafe fn exec_update(exec: sys::CUgraphExec, template: sys::CUgraph) -> sys::CUresult {
    static DRIVER_HAS_IT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !*DRIVER_HAS_IT.get_or_init(|| crate::driver::has_symbol("cuGraphExecUpdate_v2")) {
        return sys::CUresult::CUDA_ERROR_NOT_SUPPORTED;
    }
    let mut info = std::mem::MaybeUninit::uninit();
    // SAFETY: the caller's contract; the out-pointer is valid for one write; the driver has the
    // function (checked above: cudarc would panic on a missing one).
    unsafe { sys::cuGraphExecUpdate_v2(exec, template, info.as_mut_ptr()) }
}

/// With the CUDA 11.4 bindings: no update in place (the caller instantiates anew).
///
/// # Safety
///
/// None needed; kept `unsafe` like the other variant.
#[cfg(feature = "cuda-11040")]
unsafe fn exec_update(_exec: sys::CUgraphExec, _template: sys::CUgraph) -> sys::CUresult {
    sys::CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// Ends the capture of `stream` (always: the stream no longer records after any answer) and
/// returns its template graph with the modules it launched kernels of, unless the capture was
/// invalidated or `doomed`.
fn end_capture(stream: &CudaStream, doomed: bool) -> Result<(Template, Vec<Kept>), DriverError> {
    const OP: ShimOp = ShimOp::GraphEnd;
    // Every end leaves the stream not recording: what the recording kept goes with it.
    let keep = lock(&stream.recorded).take();
    let mut graph = ptr::null_mut();
    // SAFETY: the stream is alive; the pointer is valid for one write; the context is current.
    let r = unsafe { sys::cuStreamEndCapture(stream.cu_stream(), &mut graph) };
    // Destroyed on every path.
    let template = Template(graph);
    if keep.is_some() {
        // Releases asked for while it recorded run now, if no other stream records.
        crate::recording::ended(stream.context());
    }
    let keep = keep.unwrap_or_default();
    check(OP, r)?;
    if template.0.is_null() {
        // An invalidated capture returns a null graph (and an error, handled above).
        return Err(classify(OP, status::STREAM_CAPTURE_INVALIDATED));
    }
    if doomed {
        return Err(classify(OP, status::CAPTURE_DOOMED));
    }
    Ok((template, keep))
}

/// Ends the recording of `stream` and throws it away, whatever the driver answers: for an end
/// that cannot go on (the context could not be made current), so the process's count of
/// recordings drops and the releases waiting for it run, instead of both waiting for the
/// stream's drop. The driver takes the context from the stream.
pub(crate) fn discard(stream: &CudaStream) {
    let _ = end_capture(stream, true);
}

/// Instantiates `template`, keeping `keep` loaded. The context is current.
fn instantiate(
    ctx: &Arc<Context>,
    template: &Template,
    keep: Vec<Kept>,
) -> Result<CudaGraph, DriverError> {
    let mut exec = ptr::null_mut();
    // SAFETY: the template is alive while borrowed; flags 0 asks for nothing special; the
    // pointer is valid for one write.
    check(ShimOp::GraphEnd, unsafe {
        sys::cuGraphInstantiateWithFlags(&mut exec, template.0, 0)
    })?;
    Ok(CudaGraph {
        raw: exec,
        ctx: Arc::clone(ctx),
        keep: std::sync::Mutex::new(keep),
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

/// Enqueues one replay of `graph` on `stream`, in the stream's context (current on this thread or not).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_is_kept_once_however_often_it_is_recorded() {
        let (m1, m2): (Kept, Kept) = (Arc::new(1u8), Arc::new(2u8));
        let mut list = Vec::new();
        for _ in 0..1000 {
            keep_once(&mut list, Arc::clone(&m1));
            keep_once(&mut list, Arc::clone(&m2));
        }
        assert_eq!(list.len(), 2);
        assert_eq!(Arc::strong_count(&m1), 2, "the list holds one reference");
    }
}
