//! Copies between two devices of one process ([`Shim::peer_access`], [`Shim::copy_peer`]):
//! two shims over one GPU share its primary context, so a copy between them is a plain
//! device-to-device copy; two GPUs copy with `cuMemcpyPeerAsync` once `cuDeviceCanAccessPeer`
//! allowed it and `cuCtxEnablePeerAccess` enabled it (once per pair of contexts, remembered by
//! the destination's context).
//!
//! Owns the peer-access decision and the copy call. Does not own the order around the copy (the
//! core's `command/across.rs`: events of one context waited by the other's stream, which
//! `cuStreamWaitEvent` allows across contexts).
//!
//! [`Shim::peer_access`]: devcmd::Shim::peer_access
//! [`Shim::copy_peer`]: devcmd::Shim::copy_peer

use crate::device::{Context, CudaShim};
use crate::faults::{check, code, status};
use crate::stream::CudaStream;
use cudarc::driver::sys;
use devcmd::{DeviceAddr, DriverError, ShimOp};

const OP: ShimOp = ShimOp::CopyDeviceToDevice;

/// Whether `this` (the destination's context) may copy from `src`'s: the same context always;
/// another GPU where the driver allows peer access, enabled here on first use and remembered.
pub(crate) fn access(this: &Context, src: &Context) -> bool {
    if this.raw() == src.raw() {
        return true;
    }
    let key = src.raw() as usize;
    let mut peers = this
        .peers
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(&(_, ok)) = peers.iter().find(|(k, _)| *k == key) {
        return ok;
    }
    // Only the driver's definite answers are kept: a call that failed (a context that could not
    // be bound, a device in trouble) is asked again next time.
    match enable(this, src) {
        Ok(ok) => {
            peers.push((key, ok));
            ok
        }
        Err(_) => false,
    }
}

/// `cuDeviceCanAccessPeer`, then `cuCtxEnablePeerAccess` with `this` current: `Ok(false)` where
/// the driver says the GPUs cannot, `Ok(true)` once enabled.
fn enable(this: &Context, src: &Context) -> Result<bool, DriverError> {
    // Enabling maps the peer's memory: not seen beside a recording, so not made beside one.
    crate::recording::refuse_while_any(OP)?;
    this.bind(OP)?;
    let mut can = 0;
    // SAFETY: both are valid device handles of a context the shims hold; `can` is written.
    check(OP, unsafe {
        sys::cuDeviceCanAccessPeer(&mut can, this.device(), src.device())
    })?;
    if can == 0 {
        return Ok(false);
    }
    // SAFETY: `this` is current on the calling thread (bound above); `src` is a live context.
    let r = unsafe { sys::cuCtxEnablePeerAccess(src.raw(), 0) };
    match code(r) {
        status::SUCCESS | status::PEER_ACCESS_ALREADY_ENABLED => Ok(true),
        // The driver's definite refusals: kept, so later copies do not ask again.
        status::TOO_MANY_PEERS | status::PEER_ACCESS_UNSUPPORTED => Ok(false),
        other => Err(crate::classify(OP, other)),
    }
}

/// The copy of `len` bytes from `src` (a page of `from`) to `dst` (a page of `to`) on
/// `stream`, a stream of `to`.
///
/// # Safety
///
/// As [`Shim::copy_peer`](devcmd::Shim::copy_peer): both ranges lie in live pages of their
/// shims and stay so until an event recorded on `stream` after the copy completes.
pub(crate) unsafe fn copy(
    to: &CudaShim,
    stream: &CudaStream,
    dst: DeviceAddr,
    from: &CudaShim,
    src: DeviceAddr,
    len: u64,
) -> Result<(), DriverError> {
    if len == 0 {
        return Ok(());
    }
    let ctx = to.bound(OP)?;
    let bytes = usize::try_from(len).map_err(|_| crate::classify(OP, status::BAD_ARGUMENT))?;
    let (dst_ctx, src_ctx) = (ctx.raw(), from.context().raw());
    let r = if dst_ctx == src_ctx {
        // SAFETY: one context: both addresses are its device memory, valid for `bytes` bytes
        // until the copy completes (the caller's promise); the context is current.
        unsafe { sys::cuMemcpyDtoDAsync_v2(dst.0, src.0, bytes, stream.cu_stream()) }
    } else {
        // SAFETY: as above, each address in its own context; peer access was enabled by
        // `access` (the core asks it before every copy).
        unsafe { sys::cuMemcpyPeerAsync(dst.0, dst_ctx, src.0, src_ctx, bytes, stream.cu_stream()) }
    };
    check(OP, r)
}
