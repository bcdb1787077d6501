//! Device pages (`cuMemAlloc`), pinned host pages (`cuMemHostAlloc`) and copies
//! (`cuMemcpy*Async`, `cuMemcpy2DAsync` for pitched layouts).
//!
//! Every function here expects the device's context to be current on the calling thread; the
//! shim binds it before calling them.

use crate::device::Context;
use crate::faults::{check, classify, status};
use crate::stream::CudaStream;
use cudarc::driver::sys;
use devcmd::{CopyLayout, DeviceAddr, DriverError, ShimOp};
use std::ffi::c_void;
use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::Arc;

/// A device page: a `cuMemAlloc` allocation. Return it with
/// [`Shim::device_free`](devcmd::Shim::device_free); dropping it instead leaks it.
#[derive(Debug)]
pub struct CudaDevicePage {
    addr: u64,
    size: u64,
}

impl CudaDevicePage {
    /// The first device address.
    pub fn addr(&self) -> DeviceAddr {
        DeviceAddr(self.addr)
    }

    /// Bytes asked for (the allocation may be larger).
    pub fn size(&self) -> u64 {
        self.size
    }
}

/// A pinned host page: a `cuMemHostAlloc` allocation, portable, mapped into the device where it
/// can map host memory, never write-combined (the host reads it back). Return it with
/// [`Shim::host_free_pinned`](devcmd::Shim::host_free_pinned); dropping it instead leaks it.
///
/// The page keeps the device's context retained: the driver frees every pinned page of a
/// primary context when its last retain goes, so a page the core leaks on purpose (a host
/// buffer still lent out of it when the device is dropped) would otherwise vanish under the
/// buffer. A leaked page therefore leaks the context's retain too, and stays valid.
pub struct CudaHostPage {
    ptr: NonNull<u8>,
    size: usize,
    mapped: Option<DeviceAddr>,
    _context: Arc<Context>,
}

impl fmt::Debug for CudaHostPage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaHostPage")
            .field("ptr", &self.ptr)
            .field("size", &self.size)
            .field("mapped", &self.mapped)
            .finish_non_exhaustive()
    }
}

// SAFETY: the page is plain host memory owned by this value; the pointer is only handed out
// (`ptr`), never dereferenced here, and freeing it takes the page by value.
unsafe impl Send for CudaHostPage {}
// SAFETY: as for `Send`: `&CudaHostPage` gives out copies of the pointer and the sizes only.
unsafe impl Sync for CudaHostPage {}

impl CudaHostPage {
    /// The first host byte, valid for [`Self::size`] bytes until the page is freed.
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Bytes asked for.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The page's device address (`cuMemHostGetDevicePointer`) where the device maps host
    /// memory.
    pub fn mapped(&self) -> Option<DeviceAddr> {
        self.mapped
    }
}

/// `cuMemAlloc` of `size` bytes (one aligned unit for 0); past `total` bytes: too big.
pub(crate) fn device_alloc(size: u64, total: u64) -> Result<CudaDevicePage, DriverError> {
    const OP: ShimOp = ShimOp::DeviceAlloc;
    let bytes = usize::try_from(size.max(1))
        .ok()
        .filter(|_| size <= total)
        .ok_or(classify(OP, status::TOO_BIG))?;
    let mut addr = 0;
    // SAFETY: the pointer is valid for one write; the size is not zero.
    check(OP, unsafe { sys::cuMemAlloc_v2(&mut addr, bytes) })?;
    Ok(CudaDevicePage { addr, size })
}

/// `cuMemFree` of `page`; an error cannot be reported (a lost device answers with its sticky
/// error, and its memory goes with the context).
///
/// # Safety
///
/// No pending work uses the page.
pub(crate) unsafe fn device_free(page: CudaDevicePage) {
    // SAFETY: the address came from `cuMemAlloc` and is freed once (the page is taken by value);
    // the caller promises no work uses it.
    let _ = unsafe { sys::cuMemFree_v2(page.addr) };
}

/// The byte a poisoning shim ([`CudaShim::with_poison`](crate::CudaShim::with_poison)) fills
/// freed device and pinned host pages with (the std shim's too).
pub const POISON_BYTE: u8 = 0xDB;

/// Fills `page` with [`POISON_BYTE`]: `cuMemsetD8` on the legacy default stream, then
/// `cuStreamSynchronize` of that stream, so the fill has landed before the page is freed. Errors
/// are ignored: a free cannot report them, and a lost device runs nothing any more.
///
/// # Safety
///
/// No pending work uses the page (the caller is about to free it). The context is current.
pub(crate) unsafe fn poison_device(page: &CudaDevicePage) {
    // SAFETY: the page is a live `cuMemAlloc` allocation of at least `max(size, 1)` bytes (the
    // size `device_alloc` asked for); nothing else uses it (the caller's promise).
    unsafe { poison_range(page.addr(), page.size.max(1)) }
}

/// Fills `size` bytes of device memory at `addr` with [`POISON_BYTE`], as [`poison_device`]
/// does (a page, or a range of mapped memory about to be unmapped).
///
/// # Safety
///
/// The bytes are live device memory of this context that no pending work uses. The context is
/// current.
pub(crate) unsafe fn poison_range(addr: DeviceAddr, size: u64) {
    let bytes = usize::try_from(size).unwrap_or(usize::MAX);
    // SAFETY: the caller's promise.
    let r = unsafe { sys::cuMemsetD8_v2(addr.0, POISON_BYTE, bytes) };
    if r == sys::CUresult::CUDA_SUCCESS {
        // SAFETY: a null stream is the context's legacy default stream, where the fill runs.
        let _ = unsafe { sys::cuStreamSynchronize(ptr::null_mut()) };
    }
}

/// Fills the host bytes of `page` with [`POISON_BYTE`].
///
/// # Safety
///
/// No pending copy uses the page and nothing else reads or writes it (the caller is about to
/// free it).
pub(crate) unsafe fn poison_host(page: &CudaHostPage) {
    // SAFETY: the page is a live `cuMemHostAlloc` allocation of at least `size` bytes, and
    // nothing else touches it (the caller's promise).
    unsafe { ptr::write_bytes(page.ptr.as_ptr(), POISON_BYTE, page.size) };
}

/// `cuMemHostAlloc` of `size` bytes (at least one), mapped into the device when `map`.
pub(crate) fn host_alloc(
    context: &Arc<Context>,
    size: usize,
    map: bool,
) -> Result<CudaHostPage, DriverError> {
    const OP: ShimOp = ShimOp::HostAlloc;
    let mut flags = sys::CU_MEMHOSTALLOC_PORTABLE;
    if map {
        flags |= sys::CU_MEMHOSTALLOC_DEVICEMAP;
    }
    let mut p: *mut c_void = ptr::null_mut();
    // SAFETY: the pointer is valid for one write; the size is not zero.
    check(OP, unsafe {
        sys::cuMemHostAlloc(&mut p, size.max(1), flags)
    })?;
    let ptr = NonNull::new(p.cast::<u8>()).ok_or(classify(OP, status::OUT_OF_MEMORY))?;
    let mapped = map
        .then(|| {
            let mut d = 0;
            // SAFETY: `p` is a live allocation made with `CU_MEMHOSTALLOC_DEVICEMAP`; flags
            // must be 0.
            let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0) };
            (r == sys::CUresult::CUDA_SUCCESS).then_some(DeviceAddr(d))
        })
        .flatten();
    Ok(CudaHostPage {
        ptr,
        size,
        mapped,
        _context: Arc::clone(context),
    })
}

/// `cuMemFreeHost` of `page`; an error cannot be reported.
///
/// # Safety
///
/// No pending copy or work uses the page.
pub(crate) unsafe fn host_free(page: CudaHostPage) {
    // SAFETY: the pointer came from `cuMemHostAlloc` and is freed once (the page is taken by
    // value); the caller promises nothing uses it.
    let _ = unsafe { sys::cuMemFreeHost(page.ptr.as_ptr().cast()) };
}

/// The caller's host memory page-locked in place (`cuMemHostRegister`, portable). Return it with
/// [`Shim::host_unregister`](devcmd::Shim::host_unregister); dropping it instead leaves the
/// memory locked until the context goes.
#[derive(Debug)]
pub struct CudaRegistration {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the registration names the caller's memory and never dereferences it; undoing it
// takes the value by value.
unsafe impl Send for CudaRegistration {}

impl CudaRegistration {
    /// The first registered byte.
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Bytes registered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is registered (never: an empty range is refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// `cuMemHostRegister` of `len` bytes at `ptr`, portable (usable from every context), and
/// read-only when `read_only` (the device then only reads them).
pub(crate) fn host_register(
    ptr: NonNull<u8>,
    len: usize,
    read_only: bool,
) -> Result<CudaRegistration, DriverError> {
    const OP: ShimOp = ShimOp::HostRegister;
    if len == 0 {
        return Err(classify(OP, status::INVALID_VALUE));
    }
    let mut flags = sys::CU_MEMHOSTREGISTER_PORTABLE;
    if read_only {
        flags |= sys::CU_MEMHOSTREGISTER_READ_ONLY;
    }
    // SAFETY: the driver only locks the pages of the range (the caller keeps the memory alive
    // until the registration is undone: `Shim::host_register`'s caller's contract).
    check(OP, unsafe {
        sys::cuMemHostRegister_v2(ptr.as_ptr().cast(), len, flags)
    })?;
    Ok(CudaRegistration { ptr, len })
}

/// `cuMemHostUnregister`; an error cannot be reported (a lost device's registrations go with
/// its context).
///
/// # Safety
///
/// No pending copy uses the registered memory.
pub(crate) unsafe fn host_unregister(registration: CudaRegistration) {
    // SAFETY: the pointer was registered by `host_register` and is unregistered once (taken by
    // value); the caller promises no copy uses it.
    let _ = unsafe { sys::cuMemHostUnregister(registration.ptr.as_ptr().cast()) };
}

/// One side of a copy: host memory (packed rows) or a device address (pitched rows).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Side {
    /// Host bytes; a source is only read.
    Host(*mut u8),
    /// A device address.
    Device(u64),
}

impl Side {
    /// This side `bytes` further on.
    ///
    /// # Safety
    ///
    /// A host side stays inside the allocation it points into.
    unsafe fn offset(self, bytes: usize) -> Self {
        match self {
            // SAFETY: the caller keeps the result inside the host allocation.
            Self::Host(p) => Self::Host(unsafe { p.add(bytes) }),
            Self::Device(d) => Self::Device(d + bytes as u64),
        }
    }

    /// The memory type, host pointer, device address and pitch of this side in a
    /// `CUDA_MEMCPY2D`.
    fn memcpy2d(self, pitch: usize) -> (sys::CUmemorytype, *mut c_void, u64, usize) {
        match self {
            Self::Host(p) => (sys::CUmemorytype::CU_MEMORYTYPE_HOST, p.cast(), 0, pitch),
            Self::Device(d) => (
                sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                ptr::null_mut(),
                d,
                pitch,
            ),
        }
    }
}

/// The `usize` of a size of `op`, or a bad-argument error (only on hosts narrower than 64 bits).
fn to_usize(op: ShimOp, v: u64) -> Result<usize, DriverError> {
    usize::try_from(v).map_err(|_| classify(op, status::BAD_ARGUMENT))
}

/// Enqueues a copy of `layout` from `src` to `dst` on `stream`: host sides packed, device sides
/// pitched. A linear layout is one `cuMemcpy{HtoD,DtoH,DtoD}Async`; a pitched one is one
/// `cuMemcpy2DAsync`, or one linear copy per row when the pitch passes `max_pitch`
/// (`CU_DEVICE_ATTRIBUTE_MAX_PITCH`, the largest `cuMemcpy2DAsync` takes). The copy row by
/// row is refused (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`) while any stream of the process
/// records, on this stream or another: a row refused after others were enqueued is answered only
/// after a host wait for them, which no stream may make then.
///
/// # Safety
///
/// Both sides are valid for the layout (host sides for `layout.packed_bytes()` bytes, device
/// sides for `layout.device_span()` bytes of one live page) until an event recorded after this
/// call completes; a host destination is touched by nothing else meanwhile. The context is
/// current.
pub(crate) unsafe fn copy(
    op: ShimOp,
    stream: &CudaStream,
    src: Side,
    dst: Side,
    layout: CopyLayout,
    max_pitch: u64,
) -> Result<(), DriverError> {
    if [src, dst]
        .iter()
        .any(|s| matches!(s, Side::Host(p) if p.is_null()))
    {
        return Err(classify(op, status::BAD_ARGUMENT));
    }
    if layout.packed_bytes() == 0 {
        return Ok(());
    }
    to_usize(op, layout.device_span())?;
    if layout.is_linear() {
        let bytes = to_usize(op, layout.packed_bytes())?;
        // SAFETY: the caller's promise, for the one run of `bytes` bytes.
        return unsafe { linear(op, stream, src, dst, bytes) };
    }
    if layout.pitch() > max_pitch {
        // Row by row: a row refused after others were enqueued is answered only after a wait
        // for those (the caller lets the host side go on an error), and no host wait is legal
        // while a stream of the process records. Refused before any row instead.
        crate::recording::refuse_while_any(op)?;
        for (i, row) in layout.rows().enumerate() {
            let at = |side: Side| -> Result<Side, DriverError> {
                let off = match side {
                    Side::Host(_) => row.host,
                    Side::Device(_) => row.device,
                };
                // SAFETY: the row lies inside the layout, which the caller promises is valid.
                Ok(unsafe { side.offset(to_usize(op, off)?) })
            };
            // SAFETY: the caller's promise, for this row.
            let enqueued = to_usize(op, row.len)
                .and_then(|len| unsafe { linear(op, stream, at(src)?, at(dst)?, len) });
            if let Err(e) = enqueued {
                if i > 0 {
                    // Earlier rows are enqueued and may still read or write the host side, which
                    // the caller lets go on an error: wait for them first. Its own error is the
                    // stream's, reported by the next fence.
                    // SAFETY: the stream is live; the context is current.
                    let _ = unsafe { sys::cuStreamSynchronize(stream.cu_stream()) };
                }
                return Err(e);
            }
        }
        return Ok(());
    }
    let width = to_usize(op, layout.width())?;
    let pitch = to_usize(op, layout.pitch())?;
    let side_pitch = |s: Side| match s {
        Side::Host(_) => width,
        Side::Device(_) => pitch,
    };
    let (src_type, src_host, src_device, src_pitch) = src.memcpy2d(side_pitch(src));
    let (dst_type, dst_host, dst_device, dst_pitch) = dst.memcpy2d(side_pitch(dst));
    // Built field by field: the struct has enum fields with no zero value.
    let desc = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: src_type,
        srcHost: src_host.cast_const(),
        srcDevice: src_device,
        srcArray: ptr::null_mut(),
        srcPitch: src_pitch,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: dst_type,
        dstHost: dst_host,
        dstDevice: dst_device,
        dstArray: ptr::null_mut(),
        dstPitch: dst_pitch,
        WidthInBytes: width,
        Height: to_usize(op, layout.height())?,
    };
    // SAFETY: the descriptor lives across the call (the driver copies it); its sides are valid
    // for the rows by the caller's promise; the context is current.
    check(op, unsafe {
        sys::cuMemcpy2DAsync_v2(&desc, stream.cu_stream())
    })
}

/// One run of `bytes` bytes from `src` to `dst`.
///
/// # Safety
///
/// As [`copy`], for `bytes` bytes on each side.
unsafe fn linear(
    op: ShimOp,
    stream: &CudaStream,
    src: Side,
    dst: Side,
    bytes: usize,
) -> Result<(), DriverError> {
    let s = stream.cu_stream();
    let r = match (src, dst) {
        // SAFETY: the caller promises both sides valid for `bytes` bytes until the copy
        // completes; the context is current.
        (Side::Host(h), Side::Device(d)) => unsafe {
            sys::cuMemcpyHtoDAsync_v2(d, h.cast_const().cast(), bytes, s)
        },
        // SAFETY: as above; nothing else touches the host bytes meanwhile.
        (Side::Device(d), Side::Host(h)) => unsafe {
            sys::cuMemcpyDtoHAsync_v2(h.cast(), d, bytes, s)
        },
        // SAFETY: as above, both sides on the device.
        (Side::Device(from), Side::Device(to)) => unsafe {
            sys::cuMemcpyDtoDAsync_v2(to, from, bytes, s)
        },
        (Side::Host(_), Side::Host(_)) => return Err(classify(op, status::BAD_ARGUMENT)),
    };
    check(op, r)
}
