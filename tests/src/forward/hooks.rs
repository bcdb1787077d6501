//! The calls a wrapper shim may bend: one method per [`Shim`] call, each forwarding to the inner
//! shim unless the wrapper overrides it.

use devcmd::{
    CopyLayout, DeviceAddr, DeviceFacts, DeviceSpan, DriverError, HostCopy, HostMemory,
    KernelParam, LaunchDims, Shim, ShimOp,
};
use std::ptr::NonNull;

/// What a wrapper around the shim `S` does to each call. Every method has a default that makes
/// the same call on `inner`, so a wrapper overrides only the calls it bends and every other call
/// reaches the inner shim: a call forgotten here forwards, it never turns into the contract's
/// `Unsupported` default. Each unsafe method has the precondition of the [`Shim`] call it
/// stands for, and hands it on.
pub trait Hooks<S: Shim>: std::fmt::Debug {
    /// [`Shim::facts`].
    fn facts(&self, inner: &S) -> DeviceFacts {
        inner.facts()
    }
    /// [`Shim::classify`].
    fn classify(&self, inner: &S, op: ShimOp, status: i32) -> DriverError {
        inner.classify(op, status)
    }
    /// [`Shim::create_stream`].
    fn create_stream(&self, inner: &S) -> Result<S::Stream, DriverError> {
        inner.create_stream()
    }
    /// [`Shim::kernel_name`].
    fn kernel_name(&self, inner: &S, kernel: &S::Kernel) -> &'static str {
        inner.kernel_name(kernel)
    }
    /// [`Shim::native_stream`].
    fn native_stream<'a>(&self, inner: &S, stream: &'a S::Stream) -> &'a S::NativeStream {
        inner.native_stream(stream)
    }
    /// [`Shim::borrow_stream`].
    ///
    /// # Safety
    ///
    /// As [`Shim::borrow_stream`].
    unsafe fn borrow_stream(
        &self,
        inner: &S,
        native: &S::NativeStream,
    ) -> Result<S::Stream, DriverError> {
        // SAFETY: the caller's contract, handed on.
        unsafe { inner.borrow_stream(native) }
    }
    /// [`Shim::stream_wait_event`].
    fn stream_wait_event(
        &self,
        inner: &S,
        stream: &S::Stream,
        event: &S::Event,
    ) -> Result<(), DriverError> {
        inner.stream_wait_event(stream, event)
    }
    /// [`Shim::record_event`].
    fn record_event(&self, inner: &S, stream: &S::Stream) -> Result<S::Event, DriverError> {
        inner.record_event(stream)
    }
    /// [`Shim::event_query`].
    fn event_query(&self, inner: &S, event: &S::Event) -> Result<bool, DriverError> {
        inner.event_query(event)
    }
    /// [`Shim::event_wait`].
    fn event_wait(&self, inner: &S, event: &S::Event) -> Result<(), DriverError> {
        inner.event_wait(event)
    }
    /// [`Shim::event_notify`].
    fn event_notify(&self, inner: &S, event: &S::Event, waker: &core::task::Waker) -> bool {
        inner.event_notify(event, waker)
    }
    /// [`Shim::device_alloc`].
    fn device_alloc(&self, inner: &S, size: u64) -> Result<S::DevicePage, DriverError> {
        inner.device_alloc(size)
    }
    /// [`Shim::device_page_addr`].
    fn device_page_addr(&self, inner: &S, page: &S::DevicePage) -> DeviceAddr {
        inner.device_page_addr(page)
    }
    /// [`Shim::device_free`].
    ///
    /// # Safety
    ///
    /// As [`Shim::device_free`].
    unsafe fn device_free(&self, inner: &S, page: S::DevicePage) {
        // SAFETY: the caller's contract, handed on.
        unsafe { inner.device_free(page) }
    }
    /// [`Shim::vm_reserve`].
    fn vm_reserve(&self, inner: &S, size: u64) -> Result<DeviceAddr, DriverError> {
        inner.vm_reserve(size)
    }
    /// [`Shim::vm_release`].
    ///
    /// # Safety
    ///
    /// As [`Shim::vm_release`].
    unsafe fn vm_release(&self, inner: &S, addr: DeviceAddr, size: u64) {
        // SAFETY: the caller's contract, handed on.
        unsafe { inner.vm_release(addr, size) }
    }
    /// [`Shim::vm_map`].
    fn vm_map(&self, inner: &S, addr: DeviceAddr, size: u64) -> Result<u64, DriverError> {
        inner.vm_map(addr, size)
    }
    /// [`Shim::vm_unmap`].
    ///
    /// # Safety
    ///
    /// As [`Shim::vm_unmap`].
    unsafe fn vm_unmap(&self, inner: &S, addr: DeviceAddr, size: u64, memory: u64) {
        // SAFETY: the caller's contract, handed on.
        unsafe { inner.vm_unmap(addr, size, memory) }
    }
    /// [`Shim::host_alloc_pinned`].
    fn host_alloc_pinned(&self, inner: &S, size: usize) -> Result<S::HostPage, DriverError> {
        inner.host_alloc_pinned(size)
    }
    /// [`Shim::host_page_ptr`].
    fn host_page_ptr(&self, inner: &S, page: &S::HostPage) -> NonNull<u8> {
        inner.host_page_ptr(page)
    }
    /// [`Shim::host_page_device_addr`].
    fn host_page_device_addr(&self, inner: &S, page: &S::HostPage) -> Option<DeviceAddr> {
        inner.host_page_device_addr(page)
    }
    /// [`Shim::host_free_pinned`].
    ///
    /// # Safety
    ///
    /// As [`Shim::host_free_pinned`].
    unsafe fn host_free_pinned(&self, inner: &S, page: S::HostPage) {
        // SAFETY: the caller's contract, handed on.
        unsafe { inner.host_free_pinned(page) }
    }
    /// [`Shim::host_register`].
    fn host_register(
        &self,
        inner: &S,
        ptr: NonNull<u8>,
        len: usize,
    ) -> Result<S::Registration, DriverError> {
        inner.host_register(ptr, len)
    }
    /// [`Shim::host_unregister`].
    ///
    /// # Safety
    ///
    /// As [`Shim::host_unregister`].
    unsafe fn host_unregister(&self, inner: &S, registration: S::Registration) {
        // SAFETY: the caller's contract, handed on.
        unsafe { inner.host_unregister(registration) }
    }
    /// [`Shim::host_copy`].
    ///
    /// # Safety
    ///
    /// As [`Shim::host_copy`].
    unsafe fn host_copy(
        &self,
        inner: &S,
        dst: *mut u8,
        src: *const u8,
        len: usize,
        kind: HostCopy,
    ) {
        // SAFETY: the caller's contract, handed on.
        unsafe { inner.host_copy(dst, src, len, kind) }
    }
    /// [`Shim::copy_to_device`].
    ///
    /// # Safety
    ///
    /// As [`Shim::copy_to_device`].
    unsafe fn copy_to_device(
        &self,
        inner: &S,
        stream: &S::Stream,
        src: *const u8,
        src_memory: HostMemory,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract, handed on.
        unsafe { inner.copy_to_device(stream, src, src_memory, dst, layout) }
    }
    /// [`Shim::copy_to_host`].
    ///
    /// # Safety
    ///
    /// As [`Shim::copy_to_host`].
    unsafe fn copy_to_host(
        &self,
        inner: &S,
        stream: &S::Stream,
        src: DeviceAddr,
        dst: *mut u8,
        dst_memory: HostMemory,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract, handed on.
        unsafe { inner.copy_to_host(stream, src, dst, dst_memory, layout) }
    }
    /// [`Shim::copy_on_device`].
    ///
    /// # Safety
    ///
    /// As [`Shim::copy_on_device`].
    unsafe fn copy_on_device(
        &self,
        inner: &S,
        stream: &S::Stream,
        src: DeviceAddr,
        dst: DeviceAddr,
        layout: CopyLayout,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract, handed on.
        unsafe { inner.copy_on_device(stream, src, dst, layout) }
    }
    /// [`Shim::peer_access`] (`src` is the other device's inner shim).
    fn peer_access(&self, inner: &S, src: &S) -> bool {
        inner.peer_access(src)
    }
    /// [`Shim::copy_peer`] (`src_device` is the other device's inner shim).
    ///
    /// # Safety
    ///
    /// As [`Shim::copy_peer`].
    unsafe fn copy_peer(
        &self,
        inner: &S,
        stream: &S::Stream,
        dst: DeviceAddr,
        src_device: &S,
        src: DeviceAddr,
        len: u64,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract, handed on.
        unsafe { inner.copy_peer(stream, dst, src_device, src, len) }
    }
    /// [`Shim::launch`].
    ///
    /// # Safety
    ///
    /// As [`Shim::launch`].
    unsafe fn launch(
        &self,
        inner: &S,
        stream: &S::Stream,
        kernel: &S::Kernel,
        dims: LaunchDims,
        buffers: &[DeviceSpan],
        params: &[KernelParam<'_>],
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract, handed on.
        unsafe { inner.launch(stream, kernel, dims, buffers, params) }
    }
    /// [`Shim::begin_capture`].
    fn begin_capture(&self, inner: &S, stream: &S::Stream) -> Result<(), DriverError> {
        inner.begin_capture(stream)
    }
    /// [`Shim::end_capture`].
    fn end_capture(
        &self,
        inner: &S,
        stream: &S::Stream,
        doomed: bool,
    ) -> Result<S::Graph, DriverError> {
        inner.end_capture(stream, doomed)
    }
    /// [`Shim::end_capture_update`].
    fn end_capture_update(
        &self,
        inner: &S,
        stream: &S::Stream,
        doomed: bool,
        graph: &S::Graph,
    ) -> Result<Option<S::Graph>, DriverError> {
        inner.end_capture_update(stream, doomed, graph)
    }
    /// [`Shim::graph_upload`].
    fn graph_upload(
        &self,
        inner: &S,
        graph: &S::Graph,
        stream: &S::Stream,
    ) -> Result<(), DriverError> {
        inner.graph_upload(graph, stream)
    }
    /// [`Shim::graph_launch`].
    ///
    /// # Safety
    ///
    /// As [`Shim::graph_launch`].
    unsafe fn graph_launch(
        &self,
        inner: &S,
        graph: &S::Graph,
        stream: &S::Stream,
    ) -> Result<(), DriverError> {
        // SAFETY: the caller's contract, handed on.
        unsafe { inner.graph_launch(graph, stream) }
    }
}
