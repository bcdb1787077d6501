//! A shim for the core's own unit tests: pages are address ranges (no memory behind them), with a
//! device limit and refusals on demand. The real CPU device is `devcmd-std`.

use crate::copy::CopyLayout;
use crate::error::{DriverError, Fault, ShimOp};
use crate::shim::{
    DeviceAddr, DeviceFacts, DeviceSpan, HostMemory, KernelParam, LaunchDims, Shim, unsupported,
};
use core::cell::Cell;
use core::ptr::NonNull;

/// `VM`: [`Shim::VIRTUAL_MEMORY`] (false: a shim whose granule pools compile out, whatever its
/// facts say).
pub(crate) struct TestShim<const VM: bool = true> {
    pub facts: DeviceFacts,
    next_addr: Cell<u64>,
    pub live_bytes: Cell<u64>,
    pub live_pages: Cell<u64>,
    /// Refuse device allocations past this many live bytes (the device's own limit).
    pub device_limit: Cell<u64>,
    pub events_recorded: Cell<u32>,
    pub events_waited: Cell<u32>,
    /// The next event wait fails with this fault.
    pub fail_next_wait: Cell<Option<Fault>>,
    /// The next event record fails with this fault.
    pub fail_next_record: Cell<Option<Fault>>,
    /// The next event query fails with this fault.
    pub fail_next_query: Cell<Option<Fault>>,
    /// Queries answer "not yet" (the device is still busy).
    pub busy: Cell<bool>,
    /// Granules mapped now, reserved ranges now, and map calls so far (virtual memory, when
    /// `facts.vm_granule` is set).
    pub mapped: Cell<u64>,
    pub ranges: Cell<u64>,
    pub maps: Cell<u64>,
    /// Memory handles of the granules mapped now, by address (to check unmaps match maps).
    pub mappings: core::cell::RefCell<alloc::collections::BTreeMap<u64, u64>>,
}

#[derive(Debug)]
pub(crate) struct TestPage {
    addr: u64,
    size: u64,
}

impl TestShim {
    pub fn new(total: u64, alignment: u64, max_page: u64) -> Self {
        Self {
            facts: DeviceFacts {
                total_memory: total,
                memory_budget: None,
                page_alignment: alignment,
                max_page_size: max_page,
                integrated: false,
                can_map_host: false,
                vm_granule: 0,
            },
            next_addr: Cell::new(1 << 32),
            live_bytes: Cell::new(0),
            live_pages: Cell::new(0),
            device_limit: Cell::new(total),
            events_recorded: Cell::new(0),
            events_waited: Cell::new(0),
            fail_next_wait: Cell::new(None),
            fail_next_record: Cell::new(None),
            fail_next_query: Cell::new(None),
            busy: Cell::new(false),
            mapped: Cell::new(0),
            ranges: Cell::new(0),
            maps: Cell::new(0),
            mappings: core::cell::RefCell::default(),
        }
    }

    /// The same device with virtual memory management of `granule` bytes.
    pub fn with_vm(total: u64, alignment: u64, max_page: u64, granule: u64) -> Self {
        let mut shim = Self::new(total, alignment, max_page);
        shim.facts.vm_granule = granule;
        shim
    }

    /// The same device as a shim that says it never maps ([`Shim::VIRTUAL_MEMORY`] false).
    pub fn without_virtual_memory(self) -> TestShim<false> {
        TestShim {
            facts: self.facts,
            next_addr: self.next_addr,
            live_bytes: self.live_bytes,
            live_pages: self.live_pages,
            device_limit: self.device_limit,
            events_recorded: self.events_recorded,
            events_waited: self.events_waited,
            fail_next_wait: self.fail_next_wait,
            fail_next_record: self.fail_next_record,
            fail_next_query: self.fail_next_query,
            busy: self.busy,
            mapped: self.mapped,
            ranges: self.ranges,
            maps: self.maps,
            mappings: self.mappings,
        }
    }
}

impl<const VM: bool> Shim for TestShim<VM> {
    const VIRTUAL_MEMORY: bool = VM;

    type Stream = ();
    type Event = ();
    type DevicePage = TestPage;
    type HostPage = NonNull<u8>;
    type Kernel = ();
    type Registration = core::convert::Infallible;
    type Graph = ();
    type NativeStream = ();

    fn native_stream<'a>(&self, _stream: &'a Self::Stream) -> &'a () {
        &()
    }

    fn facts(&self) -> DeviceFacts {
        self.facts
    }
    fn classify(&self, op: ShimOp, status: i32) -> DriverError {
        let fault = match status {
            2 => Fault::OutOfMemory,
            1 => Fault::TooBig,
            _ => Fault::Failed,
        };
        DriverError::new(op, status, fault)
    }
    fn create_stream(&self) -> Result<(), DriverError> {
        Ok(())
    }
    fn stream_wait_event(&self, _: &(), _: &()) -> Result<(), DriverError> {
        Ok(())
    }
    fn record_event(&self, _: &()) -> Result<(), DriverError> {
        self.events_recorded.set(self.events_recorded.get() + 1);
        match self.fail_next_record.take() {
            Some(fault) => Err(DriverError::new(ShimOp::EventRecord, 98, fault)),
            None => Ok(()),
        }
    }
    fn event_query(&self, _: &()) -> Result<bool, DriverError> {
        match self.fail_next_query.take() {
            Some(fault) => Err(DriverError::new(ShimOp::EventQuery, 97, fault)),
            None => Ok(!self.busy.get()),
        }
    }
    fn event_wait(&self, _: &()) -> Result<(), DriverError> {
        self.events_waited.set(self.events_waited.get() + 1);
        match self.fail_next_wait.take() {
            Some(fault) => Err(DriverError::new(ShimOp::EventWait, 99, fault)),
            None => Ok(()),
        }
    }
    fn device_alloc(&self, size: u64) -> Result<TestPage, DriverError> {
        if size > self.facts.total_memory {
            return Err(self.classify(ShimOp::DeviceAlloc, 1));
        }
        if self.live_bytes.get() + size > self.device_limit.get() {
            return Err(self.classify(ShimOp::DeviceAlloc, 2));
        }
        let addr = self.next_addr.get();
        // Leave a gap so distinct pages never touch.
        self.next_addr.set(
            addr + size.next_multiple_of(self.facts.page_alignment) + self.facts.page_alignment,
        );
        self.live_bytes.set(self.live_bytes.get() + size);
        self.live_pages.set(self.live_pages.get() + 1);
        Ok(TestPage { addr, size })
    }
    fn device_page_addr(&self, page: &TestPage) -> DeviceAddr {
        DeviceAddr(page.addr)
    }
    unsafe fn device_free(&self, page: TestPage) {
        self.live_bytes.set(self.live_bytes.get() - page.size);
        self.live_pages.set(self.live_pages.get() - 1);
    }
    fn vm_reserve(&self, size: u64) -> Result<DeviceAddr, DriverError> {
        let g = self.facts.vm_granule;
        let addr = self.next_addr.get().next_multiple_of(g);
        self.next_addr.set(addr + size + g);
        self.ranges.set(self.ranges.get() + 1);
        Ok(DeviceAddr(addr))
    }
    unsafe fn vm_release(&self, _: DeviceAddr, _: u64) {
        self.ranges.set(self.ranges.get() - 1);
    }
    fn vm_map(&self, addr: DeviceAddr, size: u64) -> Result<u64, DriverError> {
        assert_eq!(addr.0 % self.facts.vm_granule, 0, "maps whole granules");
        if self.live_bytes.get() + size > self.device_limit.get() {
            return Err(self.classify(ShimOp::VmMap, 2));
        }
        let memory = self.maps.get() + 1;
        let before = self.mappings.borrow_mut().insert(addr.0, memory);
        assert!(before.is_none(), "mapped twice at {:#x}", addr.0);
        self.maps.set(memory);
        self.live_bytes.set(self.live_bytes.get() + size);
        self.mapped.set(self.mapped.get() + 1);
        Ok(memory)
    }
    unsafe fn vm_unmap(&self, addr: DeviceAddr, size: u64, memory: u64) {
        let was = self.mappings.borrow_mut().remove(&addr.0);
        assert_eq!(
            was,
            Some(memory),
            "unmapped what was mapped at {:#x}",
            addr.0
        );
        self.live_bytes.set(self.live_bytes.get() - size);
        self.mapped.set(self.mapped.get() - 1);
    }
    fn host_alloc_pinned(&self, _: usize) -> Result<NonNull<u8>, DriverError> {
        Err(unsupported(ShimOp::HostAlloc))
    }
    fn host_page_ptr(&self, page: &NonNull<u8>) -> NonNull<u8> {
        *page
    }
    fn host_page_device_addr(&self, _: &NonNull<u8>) -> Option<DeviceAddr> {
        None
    }
    unsafe fn host_free_pinned(&self, _: NonNull<u8>) {}
    unsafe fn copy_to_device(
        &self,
        _: &(),
        _: *const u8,
        _: HostMemory,
        _: DeviceAddr,
        _: CopyLayout,
    ) -> Result<(), DriverError> {
        Err(unsupported(ShimOp::CopyHostToDevice))
    }
    unsafe fn copy_to_host(
        &self,
        _: &(),
        _: DeviceAddr,
        _: *mut u8,
        _: HostMemory,
        _: CopyLayout,
    ) -> Result<(), DriverError> {
        Err(unsupported(ShimOp::CopyDeviceToHost))
    }
    unsafe fn copy_on_device(
        &self,
        _: &(),
        _: DeviceAddr,
        _: DeviceAddr,
        _: CopyLayout,
    ) -> Result<(), DriverError> {
        Err(unsupported(ShimOp::CopyDeviceToDevice))
    }
    unsafe fn launch(
        &self,
        _: &(),
        _: &(),
        _: LaunchDims,
        _: &[DeviceSpan],
        _: &[KernelParam<'_>],
    ) -> Result<(), DriverError> {
        Err(unsupported(ShimOp::Launch))
    }
    fn begin_capture(&self, _: &()) -> Result<(), DriverError> {
        Err(unsupported(ShimOp::GraphBegin))
    }
    fn end_capture(&self, _: &(), _: bool) -> Result<(), DriverError> {
        Err(unsupported(ShimOp::GraphEnd))
    }
    fn graph_upload(&self, _: &(), _: &()) -> Result<(), DriverError> {
        Err(unsupported(ShimOp::GraphUpload))
    }
    unsafe fn graph_launch(&self, _: &(), _: &()) -> Result<(), DriverError> {
        Err(unsupported(ShimOp::GraphLaunch))
    }
}
