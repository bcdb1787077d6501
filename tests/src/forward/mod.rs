//! One forwarding helper for wrapper shims: [`Forward`] is a shim around an inner shim that
//! routes every call through [`Hooks`], whose methods all forward by default.
//!
//! A test that needs a shim which bends a few calls (a broken shim, a counting one) writes the
//! few [`Hooks`] methods it changes instead of re-typing the whole [`Shim`] trait; every other
//! call, the optional ones included, reaches the inner shim. Re-typed wrappers silently turned a
//! forgotten call into the contract's `Unsupported` default; here a forgotten call forwards.
//!
//! ```
//! use devcmd::{DriverError, Shim};
//! use devcmd_std::StdShim;
//! use devcmd_tests::forward::{Forward, Hooks};
//!
//! /// Reports every fence as clean, whatever it covered.
//! #[derive(Debug)]
//! struct AlwaysClean;
//!
//! impl Hooks<StdShim> for AlwaysClean {
//!     fn event_wait(&self, inner: &StdShim, e: &<StdShim as Shim>::Event) -> Result<(), DriverError> {
//!         let _ = inner.event_wait(e);
//!         Ok(())
//!     }
//! }
//!
//! let shim = Forward { inner: StdShim::builder().build(), hooks: AlwaysClean };
//! // Everything else is the std shim's: its facts, its streams, its virtual memory.
//! assert_eq!(shim.facts(), shim.inner.facts());
//! let stream = shim.create_stream().unwrap();
//! let fence = shim.record_event(&stream).unwrap();
//! shim.event_wait(&fence).unwrap();
//! ```
//!
//! Owns [`Forward`] and its [`Shim`] impl; [`Hooks`] (hooks.rs) owns the defaults.

mod hooks;

pub use hooks::Hooks;

use devcmd::{
    CopyLayout, DeviceAddr, DeviceFacts, DeviceSpan, DriverError, HostCopy, HostMemory,
    KernelParam, LaunchDims, Shim, ShimOp,
};
use std::ptr::NonNull;

/// The shim `inner`, with each call routed through `hooks` (see the module documentation).
#[derive(Debug, Clone)]
pub struct Forward<S, H> {
    /// The shim every call reaches unless a hook bends it.
    pub inner: S,
    /// What the wrapper changes.
    pub hooks: H,
}

impl<S: Shim, H: Hooks<S>> Shim for Forward<S, H> {
    type Stream = S::Stream;
    type Event = S::Event;
    type DevicePage = S::DevicePage;
    type HostPage = S::HostPage;
    type Kernel = S::Kernel;
    type Registration = S::Registration;
    type Graph = S::Graph;
    type NativeStream = S::NativeStream;

    fn facts(&self) -> DeviceFacts {
        self.hooks.facts(&self.inner)
    }
    fn classify(&self, op: ShimOp, status: i32) -> DriverError {
        self.hooks.classify(&self.inner, op, status)
    }
    fn create_stream(&self) -> Result<S::Stream, DriverError> {
        self.hooks.create_stream(&self.inner)
    }
    fn kernel_name(&self, kernel: &S::Kernel) -> &'static str {
        self.hooks.kernel_name(&self.inner, kernel)
    }
    fn native_stream<'a>(&self, stream: &'a S::Stream) -> &'a S::NativeStream {
        self.hooks.native_stream(&self.inner, stream)
    }
    unsafe fn borrow_stream(&self, native: &S::NativeStream) -> Result<S::Stream, DriverError> {
        // SAFETY: the caller's contract, handed on (the hook has the same).
        unsafe { self.hooks.borrow_stream(&self.inner, native) }
    }
    fn stream_wait_event(&self, stream: &S::Stream, event: &S::Event) -> Result<(), DriverError> {
        self.hooks.stream_wait_event(&self.inner, stream, event)
    }
    fn record_event(&self, stream: &S::Stream) -> Result<S::Event, DriverError> {
        self.hooks.record_event(&self.inner, stream)
    }
    fn event_query(&self, event: &S::Event) -> Result<bool, DriverError> {
        self.hooks.event_query(&self.inner, event)
    }
    fn event_wait(&self, event: &S::Event) -> Result<(), DriverError> {
        self.hooks.event_wait(&self.inner, event)
    }
    fn event_notify(&self, event: &S::Event, waker: &core::task::Waker) -> bool {
        self.hooks.event_notify(&self.inner, event, waker)
    }
    fn device_alloc(&self, size: u64) -> Result<S::DevicePage, DriverError> {
        self.hooks.device_alloc(&self.inner, size)
    }
    fn device_page_addr(&self, page: &S::DevicePage) -> DeviceAddr {
        self.hooks.device_page_addr(&self.inner, page)
    }
    unsafe fn device_free(&self, page: S::DevicePage) {
        // SAFETY: the caller's contract, handed on (the hook has the same).
        unsafe { self.hooks.device_free(&self.inner, page) }
    }
    fn vm_reserve(&self, size: u64) -> Result<DeviceAddr, DriverError> {
        self.hooks.vm_reserve(&self.inner, size)
    }
    unsafe fn vm_release(&self, addr: DeviceAddr, size: u64) {
        // SAFETY: the caller's contract, handed on (the hook has the same).
        unsafe { self.hooks.vm_release(&self.inner, addr, size) }
    }
    fn vm_map(&self, addr: DeviceAddr, size: u64) -> Result<u64, DriverError> {
        self.hooks.vm_map(&self.inner, addr, size)
    }
    unsafe fn vm_unmap(&self, addr: DeviceAddr, size: u64, memory: u64) {
        // SAFETY: the caller's contract, handed on (the hook has the same).
        unsafe { self.hooks.vm_unmap(&self.inner, addr, size, memory) }
    }
    fn host_alloc_pinned(&self, size: usize) -> Result<S::HostPage, DriverError> {
        self.hooks.host_alloc_pinned(&self.inner, size)
    }
    fn host_page_ptr(&self, page: &S::HostPage) -> NonNull<u8> {
        self.hooks.host_page_ptr(&self.inner, page)
    }
    fn host_page_device_addr(&self, page: &S::HostPage) -> Option<DeviceAddr> {
        self.hooks.host_page_device_addr(&self.inner, page)
    }
    unsafe fn host_free_pinned(&self, page: S::HostPage) {
        // SAFETY: the caller's contract, handed on (the hook has the same).
        unsafe { self.hooks.host_free_pinned(&self.inner, page) }
    }
    fn host_register(&self, ptr: NonNull<u8>, len: usize) -> Result<S::Registration, DriverError> {
        self.hooks.host_register(&self.inner, ptr, len)
    }
    unsafe fn host_unregister(&self, registration: S::Registration) {
        // SAFETY: the caller's contract, handed on (the hook has the same).
        unsafe { self.hooks.host_unregister(&self.inner, registration) }
    }
    unsafe fn host_copy(&self, dst: *mut u8, src: *const u8, len: usize, kind: HostCopy) {
        // SAFETY: the caller's contract, handed on (the hook has the same).
        unsafe { self.hooks.host_copy(&self.inner, dst, src, len, kind) }
    }
    unsafe fn copy_to_device(
        &self,
        stream: &S::Stream,
        src: *const u8,
        src_memory: HostMemory,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract, handed on (the hook has the same).
        unsafe {
            self.hooks
                .copy_to_device(&self.inner, stream, src, src_memory, dst, layout)
        }
    }
    unsafe fn copy_to_host(
        &self,
        stream: &S::Stream,
        src: DeviceAddr,
        dst: *mut u8,
        dst_memory: HostMemory,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract, handed on (the hook has the same).
        unsafe {
            self.hooks
                .copy_to_host(&self.inner, stream, src, dst, dst_memory, layout)
        }
    }
    unsafe fn copy_on_device(
        &self,
        stream: &S::Stream,
        src: DeviceAddr,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract, handed on (the hook has the same).
        unsafe {
            self.hooks
                .copy_on_device(&self.inner, stream, src, dst, layout)
        }
    }
    fn peer_access(&self, src: &Self) -> bool {
        self.hooks.peer_access(&self.inner, &src.inner)
    }
    unsafe fn copy_peer(
        &self,
        stream: &S::Stream,
        dst: DeviceAddr,
        src_device: &Self,
        src: DeviceAddr,
        len: u64,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract, handed on (the hook has the same).
        unsafe {
            self.hooks
                .copy_peer(&self.inner, stream, dst, &src_device.inner, src, len)
        }
    }
    unsafe fn launch(
        &self,
        stream: &S::Stream,
        kernel: &S::Kernel,
        dims: LaunchDims,
        buffers: &[DeviceSpan],
        params: &[KernelParam<'_>],
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract, handed on (the hook has the same).
        unsafe {
            self.hooks
                .launch(&self.inner, stream, kernel, dims, buffers, params)
        }
    }
    fn begin_capture(&self, stream: &S::Stream) -> Result<(), DriverError> {
        self.hooks.begin_capture(&self.inner, stream)
    }
    fn end_capture(&self, stream: &S::Stream, doomed: bool) -> Result<S::Graph, DriverError> {
        self.hooks.end_capture(&self.inner, stream, doomed)
    }
    fn end_capture_update(
        &self,
        stream: &S::Stream,
        doomed: bool,
        graph: &S::Graph,
    ) -> Result<Option<S::Graph>, DriverError> {
        self.hooks
            .end_capture_update(&self.inner, stream, doomed, graph)
    }
    fn graph_upload(&self, graph: &S::Graph, stream: &S::Stream) -> Result<(), DriverError> {
        self.hooks.graph_upload(&self.inner, graph, stream)
    }
    unsafe fn graph_launch(&self, graph: &S::Graph, stream: &S::Stream) -> Result<(), DriverError> {
        // SAFETY: the caller's contract, handed on (the hook has the same).
        unsafe { self.hooks.graph_launch(&self.inner, graph, stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use devcmd_std::StdShim;

    /// Bends nothing.
    #[derive(Debug)]
    struct Nothing;

    impl<S: Shim> Hooks<S> for Nothing {}

    /// The optional calls, whose defaults in [`Shim`] answer `Unsupported`, reach the inner shim.
    #[test]
    fn every_optional_call_reaches_the_inner_shim() {
        let f = Forward {
            inner: StdShim::builder().build(),
            hooks: Nothing,
        };
        let unsupported = |r: Result<(), DriverError>, call: &str| {
            if let Err(e) = r {
                panic!("{call} did not reach the std shim: {e}");
            }
        };
        let g = f.facts().vm_granule;
        if g != 0 {
            let addr = f.vm_reserve(g).map(|a| (a, ()));
            unsupported(addr.map(drop), "vm_reserve");
            let (addr, ()) = addr.unwrap();
            let memory = f.vm_map(addr, g).unwrap();
            // SAFETY: nothing was enqueued on the mapping; it is unmapped before it is released.
            unsafe {
                f.vm_unmap(addr, g, memory);
                f.vm_release(addr, g);
            }
        }
        let page = f.host_alloc_pinned(64);
        unsupported(page.as_ref().map(drop).map_err(|e| *e), "host_alloc_pinned");
        // SAFETY: no copy used the page.
        unsafe { f.host_free_pinned(page.unwrap()) };
        let bytes = [7u8; 64];
        let registered = f.host_register(NonNull::from(&bytes[..]).cast(), bytes.len());
        unsupported(
            registered.as_ref().map(drop).map_err(|e| *e),
            "host_register",
        );
        // SAFETY: no copy used the registered bytes.
        unsafe { f.host_unregister(registered.unwrap()) };
        let stream = f.create_stream().unwrap();
        let fence = f.record_event(&stream).unwrap();
        assert!(
            f.event_notify(&fence, std::task::Waker::noop()),
            "event_notify did not reach the std shim: it answered the contract's default (a shim \
             that cannot notify)"
        );
        unsupported(f.begin_capture(&stream), "begin_capture");
        unsupported(f.end_capture(&stream, false).map(drop), "end_capture");
    }
}
