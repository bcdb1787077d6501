//! The guide's skeleton shim (section 3 of [`devcmd::guide`], which shows this file in full): the
//! smallest complete [`Shim`], and the [`Harness`] that runs the conformance suite on it.
//!
//! [`HostShim`] is a *synchronous* device over host memory: every call runs to completion before
//! it returns, so every event is complete as soon as it is recorded. It has no pinned memory (the
//! core falls back to the heap) and no graphs; their types are uninhabited ([`Infallible`]), so
//! the compiler checks that nothing can ask for them after a refusal. A kernel ([`HostKernel`]) is
//! a Rust function over copies of its buffers; one that fails marks its stream, and the fault
//! travels with the stream's later events, as the contract of [`devcmd::shim`] asks. Every error
//! is built by [`Shim::classify`] from the device's status codes, in one place.
//!
//! [`HostHarness`] runs the suite on it (`tests/conformance_example_shim.rs`) in [`Mode::NORMAL`]
//! only: a synchronous device has no lazy streams and does not poison freed memory, so the groups
//! of the other modes are skipped. It has no probe of its own; wrap it in
//! [`CountedHarness`](crate::CountedHarness) for counters and fault injection.

use crate::harness::{Harness, Mode, SLOW_KERNEL_MS, TestKernel};
use core::cell::Cell;
use core::convert::Infallible;
use core::ptr::NonNull;
use devcmd::{
    CopyLayout, DeviceAddr, DeviceFacts, DeviceSpan, DriverError, Fault, HostMemory, KernelParam,
    LaunchDims, Shim, ShimOp,
};
use std::alloc::{Layout, alloc_zeroed, dealloc};

/// The device's status codes, classified in one place ([`Shim::classify`]).
mod status {
    pub const OUT_OF_MEMORY: i32 = 1;
    pub const TOO_BIG: i32 = 2;
    pub const UNSUPPORTED: i32 = 3;
    pub const KERNEL_FAILED: i32 = 4;
}

const TOTAL: u64 = 256 << 20;
const ALIGN: u64 = 256;

/// A kernel: a function over copies of its buffers (inputs, then outputs) and its parameters.
pub type HostKernel = fn(&mut [Vec<u8>], &[KernelParam<'_>]) -> Result<(), KernelFailed>;

/// What a [`HostKernel`] returns when it fails while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelFailed;

/// A synchronous device over host memory (see the module documentation).
#[derive(Debug, Default)]
pub struct HostShim {
    live: Cell<u64>,
}

impl HostShim {
    /// Bytes of the device pages allocated and not yet freed.
    pub fn live_bytes(&self) -> u64 {
        self.live.get()
    }
}

/// A stream remembers the first fault of its work (sticky).
#[derive(Debug, Default)]
pub struct HostStream {
    failed: Cell<Option<DriverError>>,
}

/// An event is complete when recorded; it carries the fault its stream had by then.
#[derive(Debug)]
pub struct HostEvent {
    failed: Option<DriverError>,
}

/// A device page: a block of host memory.
#[derive(Debug)]
pub struct Block {
    ptr: NonNull<u8>,
    layout: Layout,
    size: u64,
}

fn host(addr: DeviceAddr) -> *mut u8 {
    std::ptr::with_exposed_provenance_mut(addr.0 as usize)
}

impl Shim for HostShim {
    type Stream = HostStream;
    type Event = HostEvent;
    type DevicePage = Block;
    type HostPage = Infallible;
    type Kernel = HostKernel;
    type Registration = Infallible;
    type Graph = Infallible;
    type NativeStream = ();

    fn native_stream<'a>(&self, _stream: &'a Self::Stream) -> &'a () {
        &()
    }

    fn facts(&self) -> DeviceFacts {
        DeviceFacts::new(TOTAL, ALIGN).with_max_page_size(TOTAL / 4)
    }

    fn classify(&self, op: ShimOp, status: i32) -> DriverError {
        let fault = match status {
            status::OUT_OF_MEMORY => Fault::OutOfMemory,
            status::TOO_BIG => Fault::TooBig,
            status::UNSUPPORTED => Fault::Unsupported,
            status::KERNEL_FAILED => Fault::WorkFailed,
            // A real device maps its sticky statuses to `Fault::DeviceLost` here.
            _ => Fault::Failed,
        };
        DriverError::new(op, status, fault)
    }

    fn create_stream(&self) -> Result<HostStream, DriverError> {
        Ok(HostStream::default())
    }

    fn stream_wait_event(&self, stream: &HostStream, event: &HostEvent) -> Result<(), DriverError> {
        // Nothing to wait for on a synchronous device, but a fault travels with the wait.
        if stream.failed.get().is_none() {
            stream.failed.set(event.failed);
        }
        Ok(())
    }

    fn record_event(&self, stream: &HostStream) -> Result<HostEvent, DriverError> {
        Ok(HostEvent {
            failed: stream.failed.get(),
        })
    }

    fn event_query(&self, event: &HostEvent) -> Result<bool, DriverError> {
        self.event_wait(event).map(|()| true)
    }

    fn event_wait(&self, event: &HostEvent) -> Result<(), DriverError> {
        event.failed.map_or(Ok(()), Err)
    }

    fn device_alloc(&self, size: u64) -> Result<Block, DriverError> {
        let refuse = |status| self.classify(ShimOp::DeviceAlloc, status);
        if size > self.facts().max_page_size {
            return Err(refuse(status::TOO_BIG));
        }
        if self.live.get() + size > TOTAL {
            return Err(refuse(status::OUT_OF_MEMORY));
        }
        let layout = Layout::from_size_align(size.max(1) as usize, ALIGN as usize)
            .map_err(|_| refuse(status::TOO_BIG))?;
        // SAFETY: the layout is at least one byte long.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })
            .ok_or_else(|| refuse(status::OUT_OF_MEMORY))?;
        self.live.set(self.live.get() + size);
        Ok(Block { ptr, layout, size })
    }

    fn device_page_addr(&self, page: &Block) -> DeviceAddr {
        DeviceAddr(page.ptr.as_ptr().expose_provenance() as u64)
    }

    unsafe fn device_free(&self, page: Block) {
        self.live.set(self.live.get() - page.size);
        // SAFETY: allocated by `device_alloc` with this layout; the core frees it once.
        unsafe { dealloc(page.ptr.as_ptr(), page.layout) };
    }

    fn host_alloc_pinned(&self, _size: usize) -> Result<Infallible, DriverError> {
        Err(self.classify(ShimOp::HostAlloc, status::UNSUPPORTED)) // the core uses the heap
    }

    fn host_page_ptr(&self, page: &Infallible) -> NonNull<u8> {
        match *page {}
    }

    fn host_page_device_addr(&self, page: &Infallible) -> Option<DeviceAddr> {
        match *page {}
    }

    unsafe fn host_free_pinned(&self, page: Infallible) {
        match page {}
    }

    unsafe fn copy_to_device(
        &self,
        _stream: &HostStream,
        src: *const u8,
        _src_memory: HostMemory,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        for row in layout.rows() {
            // SAFETY: the caller keeps the packed source valid and the device rows in a live page
            // (`Shim::copy_to_device`'s contract); host and device memory are distinct.
            unsafe {
                let to = host(dst.offset(row.device));
                core::ptr::copy_nonoverlapping(src.add(row.host as usize), to, row.len as usize);
            }
        }
        Ok(())
    }

    unsafe fn copy_to_host(
        &self,
        _stream: &HostStream,
        src: DeviceAddr,
        dst: *mut u8,
        _dst_memory: HostMemory,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        for row in layout.rows() {
            // SAFETY: as in `copy_to_device`, the other way round.
            unsafe {
                let from = host(src.offset(row.device));
                core::ptr::copy_nonoverlapping(from, dst.add(row.host as usize), row.len as usize);
            }
        }
        Ok(())
    }

    unsafe fn copy_on_device(
        &self,
        _stream: &HostStream,
        src: DeviceAddr,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        for row in layout.rows() {
            // SAFETY: both spans lie in live pages and do not overlap (the caller's contract).
            unsafe {
                let (from, to) = (host(src.offset(row.device)), host(dst.offset(row.device)));
                core::ptr::copy_nonoverlapping(from, to, row.len as usize);
            }
        }
        Ok(())
    }

    unsafe fn launch(
        &self,
        stream: &HostStream,
        kernel: &HostKernel,
        _dims: LaunchDims,
        buffers: &[DeviceSpan],
        params: &[KernelParam<'_>],
    ) -> Result<(), DriverError> {
        let mut copies: Vec<Vec<u8>> = buffers
            .iter()
            // SAFETY: every span lies in a live page (the caller's contract).
            .map(|s| unsafe { std::slice::from_raw_parts(host(s.addr), s.len as usize) }.to_vec())
            .collect();
        if kernel(&mut copies, params).is_err() {
            // Enqueued fine, failed while it ran: the stream's later fences report it.
            if stream.failed.get().is_none() {
                let fault = self.classify(ShimOp::Launch, status::KERNEL_FAILED);
                stream.failed.set(Some(fault));
            }
            return Ok(());
        }
        for (span, bytes) in buffers.iter().zip(&copies) {
            // SAFETY: the span lies in a live page; `bytes` is a heap copy, apart from it.
            unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), host(span.addr), bytes.len()) };
        }
        Ok(())
    }

    fn begin_capture(&self, _stream: &HostStream) -> Result<(), DriverError> {
        Err(self.classify(ShimOp::GraphBegin, status::UNSUPPORTED))
    }

    fn end_capture(&self, _stream: &HostStream, _doomed: bool) -> Result<Infallible, DriverError> {
        Err(self.classify(ShimOp::GraphEnd, status::UNSUPPORTED))
    }

    fn graph_upload(&self, graph: &Infallible, _stream: &HostStream) -> Result<(), DriverError> {
        match *graph {}
    }

    unsafe fn graph_launch(
        &self,
        graph: &Infallible,
        _stream: &HostStream,
    ) -> Result<(), DriverError> {
        match *graph {}
    }
}

// The suite's kernels ([`TestKernel`]): each reads the byte `value`, its last parameter (an
// `unsigned int`), and works on every buffer it was given.

/// The last parameter as a byte: the suite's `value`.
fn value(params: &[KernelParam<'_>]) -> Result<u8, KernelFailed> {
    match params.last() {
        Some(KernelParam::Scalar(b)) => {
            let v: [u8; 4] = (*b).try_into().map_err(|_| KernelFailed)?;
            Ok(u32::from_ne_bytes(v) as u8)
        }
        _ => Err(KernelFailed),
    }
}

/// Sets every byte of every buffer to `value`.
pub fn fill(bufs: &mut [Vec<u8>], params: &[KernelParam<'_>]) -> Result<(), KernelFailed> {
    let value = value(params)?;
    bufs.iter_mut().for_each(|b| b.fill(value));
    Ok(())
}

/// One input, one output: `out[i] = in[i].wrapping_add(value)`.
pub fn add(bufs: &mut [Vec<u8>], params: &[KernelParam<'_>]) -> Result<(), KernelFailed> {
    let (value, [input, output]) = (value(params)?, bufs) else {
        return Err(KernelFailed);
    };
    for (o, i) in output.iter_mut().zip(input.iter()) {
        *o = i.wrapping_add(value);
    }
    Ok(())
}

/// As [`add`], after a sleep of [`SLOW_KERNEL_MS`].
pub fn slow_add(bufs: &mut [Vec<u8>], params: &[KernelParam<'_>]) -> Result<(), KernelFailed> {
    std::thread::sleep(std::time::Duration::from_millis(SLOW_KERNEL_MS));
    add(bufs, params)
}

/// As [`fill`], then fails while it runs: the stream's later fences report it.
pub fn write_then_fail(
    bufs: &mut [Vec<u8>],
    params: &[KernelParam<'_>],
) -> Result<(), KernelFailed> {
    fill(bufs, params)?;
    Err(KernelFailed)
}

/// Runs the conformance suite on [`HostShim`], in [`Mode::NORMAL`] only.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostHarness;

impl Harness for HostHarness {
    type S = HostShim;

    fn shim(&self, mode: Mode) -> Option<HostShim> {
        // A synchronous device has no lazy streams and does not poison freed memory.
        (mode == Mode::NORMAL).then(HostShim::default)
    }

    fn kernel(&self, _shim: &HostShim, kernel: TestKernel) -> HostKernel {
        match kernel {
            TestKernel::Fill => fill,
            TestKernel::AddByte => add,
            TestKernel::SlowAdd => slow_add,
            TestKernel::WriteThenFail => write_then_fail,
        }
    }
}
