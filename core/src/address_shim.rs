//! A no-op, address-only device: the backend to start a shim from, to test a host's use of the
//! core without a device, or to measure the core alone.
//!
//! [`AddressShim`]'s pages are address ranges of a 64-bit space with no memory behind them,
//! handed out in order (aligned, never reused, a gap between two pages so they never touch),
//! limited by the device's memory, its largest page and a limit you can lower
//! ([`AddressShim::device_limit`]). It has streams whose work is always done: copies and launches
//! succeed and do nothing (so no byte moves: read nothing back from it; a kernel is just its
//! name). Virtual memory works
//! when the facts give a granule ([`AddressShim::with_vm`]); pinned host memory and graphs are
//! refused as `Unsupported` (the contract's defaults). Every counter and knob is a public
//! [`Cell`]: read what the core did (pages and bytes live, fences recorded and waited, granules
//! mapped), make the next fence fail ([`AddressShim::fail_next_wait`] and the others) or keep
//! fences busy ([`AddressShim::busy`]).
//!
//! It is the core's own unit-test device, devcmd-trace's `address` device and engine-bench's
//! null device. Built with the `address-shim` feature (and in the core's tests); the firmware
//! and the default build leave it out. Not `Sync`: one thread, like the device that holds it.
//!
//! ```
//! use devcmd::address_shim::AddressShim;
//! use devcmd::{Device, DeviceConfig, StreamId};
//!
//! let mut device = Device::new(AddressShim::new(1 << 30, 256, 1 << 28), DeviceConfig::default());
//! let handle = device.command(StreamId(0))?.empty(4096)?;
//! assert_eq!(device.shim().live_pages.get(), 1);
//! drop(handle);
//! # Ok::<(), devcmd::ServerError>(())
//! ```
//!
//! Owns [`AddressShim`] and [`AddressPage`]; what the calls promise is [`Shim`]'s.

use crate::copy::CopyLayout;
use crate::error::{DriverError, Fault, ShimOp};
use crate::shim::{DeviceAddr, DeviceFacts, DeviceSpan, HostMemory, KernelParam, LaunchDims, Shim};
use alloc::collections::BTreeMap;
use core::cell::{Cell, RefCell};
use core::convert::Infallible;
use core::ptr::NonNull;

/// The status codes an [`AddressShim`] reports, classified in one place ([`Shim::classify`]).
pub mod status {
    /// A page past the device's memory or its limit ([`Fault::OutOfMemory`](crate::Fault)).
    pub const OUT_OF_MEMORY: i32 = 2;
    /// A page larger than the largest the device makes ([`Fault::TooBig`](crate::Fault)).
    pub const TOO_BIG: i32 = 1;
    /// A fence refused on demand ([`Fault::Failed`](crate::Fault) unless a fault was given).
    pub const REFUSED: i32 = 99;
}

/// A device of address ranges only (see the module documentation).
///
/// `VM` is [`Shim::VIRTUAL_MEMORY`]: `false` makes a device whose granule pools compile out,
/// whatever its facts say ([`AddressShim::without_virtual_memory`]).
#[derive(Debug)]
pub struct AddressShim<const VM: bool = true> {
    /// What the device reports ([`Shim::facts`]).
    pub facts: DeviceFacts,
    next_addr: Cell<u64>,
    /// Bytes of live pages and mapped granules.
    pub live_bytes: Cell<u64>,
    /// Live pages.
    pub live_pages: Cell<u64>,
    /// Pages made so far (successful `device_alloc` calls).
    pub pages_made: Cell<u64>,
    /// Pages freed so far.
    pub pages_freed: Cell<u64>,
    /// Calls that changed the device's memory so far: pages made and freed, ranges reserved and
    /// released, granules mapped and unmapped.
    pub memory_calls: Cell<u64>,
    /// Refuse pages and maps past this many live bytes (the device's memory unless lowered).
    pub device_limit: Cell<u64>,
    /// Fences recorded so far.
    pub events_recorded: Cell<u32>,
    /// Host waits on fences so far.
    pub events_waited: Cell<u32>,
    /// The next host wait fails with this fault.
    pub fail_next_wait: Cell<Option<Fault>>,
    /// The next fence record fails with this fault.
    pub fail_next_record: Cell<Option<Fault>>,
    /// The next fence query fails with this fault.
    pub fail_next_query: Cell<Option<Fault>>,
    /// Queries answer "not yet" (the device is still busy); waits still return.
    pub busy: Cell<bool>,
    /// Granules mapped now (virtual memory).
    pub mapped: Cell<u64>,
    /// Ranges reserved now.
    pub ranges: Cell<u64>,
    /// Map calls that succeeded so far.
    pub maps: Cell<u64>,
    /// Unmap calls so far.
    pub unmaps: Cell<u64>,
    /// The memory handle and size of each mapping now, by address: an unmap must name what one
    /// map made there, whole, and a map must not overlap one (the shim panics otherwise: the
    /// core broke the contract). Kept while the checks are on ([`Self::check_mappings`]).
    pub mappings: RefCell<BTreeMap<u64, (u64, u64)>>,
    /// Whether map and unmap calls are checked against [`Self::mappings`].
    checks_mappings: Cell<bool>,
}

/// A page of an [`AddressShim`]: an address range.
#[derive(Debug)]
pub struct AddressPage {
    addr: u64,
    size: u64,
}

impl AddressShim {
    /// Where the first page starts (any non-zero address would do).
    const BASE: u64 = 1 << 32;

    /// A device of `total` bytes whose pages are aligned to `alignment` and at most `max_page`
    /// bytes, without virtual memory.
    pub fn new(total: u64, alignment: u64, max_page: u64) -> Self {
        Self::from_facts(DeviceFacts::new(total, alignment).with_max_page_size(max_page))
    }

    /// [`AddressShim::new`] with virtual memory of `granule` bytes.
    pub fn with_vm(total: u64, alignment: u64, max_page: u64, granule: u64) -> Self {
        Self::from_facts(
            DeviceFacts::new(total, alignment)
                .with_max_page_size(max_page)
                .with_vm_granule(granule),
        )
    }

    /// A device that reports `facts` (another shim's, to see the core act as it would there).
    pub fn from_facts(facts: DeviceFacts) -> Self {
        Self {
            facts,
            next_addr: Cell::new(Self::BASE),
            live_bytes: Cell::new(0),
            live_pages: Cell::new(0),
            pages_made: Cell::new(0),
            pages_freed: Cell::new(0),
            memory_calls: Cell::new(0),
            device_limit: Cell::new(facts.total_memory),
            events_recorded: Cell::new(0),
            events_waited: Cell::new(0),
            fail_next_wait: Cell::new(None),
            fail_next_record: Cell::new(None),
            fail_next_query: Cell::new(None),
            busy: Cell::new(false),
            mapped: Cell::new(0),
            ranges: Cell::new(0),
            maps: Cell::new(0),
            unmaps: Cell::new(0),
            mappings: RefCell::default(),
            checks_mappings: Cell::new(true),
        }
    }

    /// Turns the checks of map and unmap calls against [`Self::mappings`] on or off (on by
    /// default). Off times the core alone: the record is a tree the device keeps for the checks,
    /// and its updates cost more than the core's own bookkeeping of a map call (devcmd-trace's
    /// timed replays turn them off; its measured replay keeps them).
    ///
    /// # Panics
    ///
    /// While anything is mapped: the record would not match what is (an unmap of a mapping made
    /// with the checks off would be blamed on the core). Change it before the first map.
    pub fn check_mappings(&self, on: bool) {
        let live = self.mapped.get();
        assert!(
            live == 0,
            "AddressShim::check_mappings({on}) with {live} mappings live: the record of mappings \
             would not match them; turn the checks on or off before the first map"
        );
        self.checks_mappings.set(on);
    }

    /// The same device as a shim that says it never maps ([`Shim::VIRTUAL_MEMORY`] false).
    pub fn without_virtual_memory(self) -> AddressShim<false> {
        AddressShim {
            facts: self.facts,
            next_addr: self.next_addr,
            live_bytes: self.live_bytes,
            live_pages: self.live_pages,
            pages_made: self.pages_made,
            pages_freed: self.pages_freed,
            memory_calls: self.memory_calls,
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
            unmaps: self.unmaps,
            mappings: self.mappings,
            checks_mappings: self.checks_mappings,
        }
    }
}

impl<const VM: bool> AddressShim<VM> {
    /// Takes `size` bytes of address space aligned to `align` (and a gap of `align` after them,
    /// so two ranges never touch); `None` past the end of the 64-bit space.
    fn take_range(&self, size: u64, align: u64) -> Option<u64> {
        let align = align.max(1);
        let addr = self.next_addr.get().checked_next_multiple_of(align)?;
        let next = addr
            .checked_add(size.max(1))?
            .checked_next_multiple_of(align)?
            .checked_add(align)?;
        self.next_addr.set(next);
        Some(addr)
    }

    /// Whether `size` more live bytes stay within the device's limit.
    fn fits(&self, size: u64) -> bool {
        self.live_bytes
            .get()
            .checked_add(size)
            .is_some_and(|b| b <= self.device_limit.get())
    }

    fn count_call(&self) {
        self.memory_calls.set(self.memory_calls.get() + 1);
    }

    fn refused(op: ShimOp, fault: Option<Fault>) -> Result<(), DriverError> {
        match fault {
            Some(fault) => Err(DriverError::new(op, status::REFUSED, fault)),
            None => Ok(()),
        }
    }
}

impl<const VM: bool> Shim for AddressShim<VM> {
    const VIRTUAL_MEMORY: bool = VM;

    type Stream = ();
    type Event = ();
    type DevicePage = AddressPage;
    type HostPage = Infallible;
    /// A kernel is its name: launching it does nothing.
    type Kernel = &'static str;
    type Registration = Infallible;
    type Graph = Infallible;
    type NativeStream = ();

    fn native_stream<'a>(&self, stream: &'a ()) -> &'a () {
        stream
    }

    fn kernel_name(&self, kernel: &&'static str) -> &'static str {
        kernel
    }

    fn facts(&self) -> DeviceFacts {
        self.facts
    }

    fn classify(&self, op: ShimOp, status: i32) -> DriverError {
        let fault = match status {
            status::OUT_OF_MEMORY => Fault::OutOfMemory,
            status::TOO_BIG => Fault::TooBig,
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
        Self::refused(ShimOp::EventRecord, self.fail_next_record.take())
    }

    fn event_query(&self, _: &()) -> Result<bool, DriverError> {
        Self::refused(ShimOp::EventQuery, self.fail_next_query.take())?;
        Ok(!self.busy.get())
    }

    fn event_wait(&self, _: &()) -> Result<(), DriverError> {
        self.events_waited.set(self.events_waited.get() + 1);
        Self::refused(ShimOp::EventWait, self.fail_next_wait.take())
    }

    fn device_alloc(&self, size: u64) -> Result<AddressPage, DriverError> {
        const OP: ShimOp = ShimOp::DeviceAlloc;
        if size > self.facts.max_page_size || size > self.facts.total_memory {
            return Err(self.classify(OP, status::TOO_BIG));
        }
        if !self.fits(size) {
            return Err(self.classify(OP, status::OUT_OF_MEMORY));
        }
        let addr = self
            .take_range(size, self.facts.page_alignment)
            .ok_or_else(|| self.classify(OP, status::OUT_OF_MEMORY))?;
        self.live_bytes.set(self.live_bytes.get() + size);
        self.live_pages.set(self.live_pages.get() + 1);
        self.pages_made.set(self.pages_made.get() + 1);
        self.count_call();
        Ok(AddressPage { addr, size })
    }

    fn device_page_addr(&self, page: &AddressPage) -> DeviceAddr {
        DeviceAddr(page.addr)
    }

    unsafe fn device_free(&self, page: AddressPage) {
        self.live_bytes.set(self.live_bytes.get() - page.size);
        self.live_pages.set(self.live_pages.get() - 1);
        self.pages_freed.set(self.pages_freed.get() + 1);
        self.count_call();
    }

    fn vm_reserve(&self, size: u64) -> Result<DeviceAddr, DriverError> {
        let addr = self
            .take_range(size, self.facts.vm_granule)
            .ok_or_else(|| self.classify(ShimOp::VmReserve, status::OUT_OF_MEMORY))?;
        self.ranges.set(self.ranges.get() + 1);
        self.count_call();
        Ok(DeviceAddr(addr))
    }

    unsafe fn vm_release(&self, _: DeviceAddr, _: u64) {
        self.ranges.set(self.ranges.get() - 1);
        self.count_call();
    }

    fn vm_map(&self, addr: DeviceAddr, size: u64) -> Result<u64, DriverError> {
        let granule = self.facts.vm_granule.max(1);
        assert!(
            addr.0.is_multiple_of(granule),
            "AddressShim::vm_map at {:#x}, not a multiple of the granule ({granule} bytes): the \
             caller broke Shim::vm_map's contract",
            addr.0
        );
        if !self.fits(size) {
            return Err(self.classify(ShimOp::VmMap, status::OUT_OF_MEMORY));
        }
        assert!(
            size > 0 && size.is_multiple_of(granule),
            "AddressShim::vm_map of {size} bytes, not a whole number of granules ({granule} \
             bytes): the caller broke Shim::vm_map's contract"
        );
        let memory = self.maps.get() + 1;
        if self.checks_mappings.get() {
            let mut mappings = self.mappings.borrow_mut();
            let before = mappings
                .range(..=addr.0)
                .next_back()
                .map(|(&a, &(_, n))| a + n);
            let after = mappings.range(addr.0..).next().map(|(&a, _)| a);
            assert!(
                before.is_none_or(|end| end <= addr.0) && after.is_none_or(|a| a >= addr.0 + size),
                "AddressShim::vm_map of {size} bytes at {:#x}, where a granule is mapped already: \
                 the caller broke Shim::vm_map's contract (unmap it first)",
                addr.0
            );
            mappings.insert(addr.0, (memory, size));
        }
        self.maps.set(memory);
        self.live_bytes.set(self.live_bytes.get() + size);
        self.mapped.set(self.mapped.get() + 1);
        self.count_call();
        Ok(memory)
    }

    unsafe fn vm_unmap(&self, addr: DeviceAddr, size: u64, memory: u64) {
        if self.checks_mappings.get() {
            let was = self.mappings.borrow_mut().remove(&addr.0);
            assert_eq!(
                was,
                Some((memory, size)),
                "AddressShim::vm_unmap at {:#x} of memory {memory}, {size} bytes: the caller broke \
                 Shim::vm_unmap's contract (found (memory, size) {was:?} mapped there)",
                addr.0
            );
        }
        self.live_bytes.set(self.live_bytes.get() - size);
        self.mapped.set(self.mapped.get() - 1);
        self.unmaps.set(self.unmaps.get() + 1);
        self.count_call();
    }

    fn host_page_ptr(&self, page: &Infallible) -> NonNull<u8> {
        match *page {}
    }

    unsafe fn host_free_pinned(&self, page: Infallible) {
        match page {}
    }

    unsafe fn copy_to_device(
        &self,
        _: &(),
        _: *const u8,
        _: HostMemory,
        _: DeviceAddr,
        _: CopyLayout,
    ) -> Result<(), DriverError> {
        Ok(())
    }

    unsafe fn copy_to_host(
        &self,
        _: &(),
        _: DeviceAddr,
        _: *mut u8,
        _: HostMemory,
        _: CopyLayout,
    ) -> Result<(), DriverError> {
        Ok(())
    }

    unsafe fn copy_on_device(
        &self,
        _: &(),
        _: DeviceAddr,
        _: DeviceAddr,
        _: CopyLayout,
    ) -> Result<(), DriverError> {
        Ok(())
    }

    unsafe fn launch(
        &self,
        _: &(),
        _: &&'static str,
        _: LaunchDims,
        _: &[DeviceSpan],
        _: &[KernelParam<'_>],
    ) -> Result<(), DriverError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 2 << 20;

    fn device() -> AddressShim {
        AddressShim::with_vm(1 << 30, 256, 1 << 28, G)
    }

    #[test]
    #[should_panic(expected = "where a granule is mapped already")]
    fn a_map_over_a_mapping_is_refused_while_checked() {
        let d = device();
        let base = d.vm_reserve(8 * G).unwrap();
        d.vm_map(DeviceAddr(base.0 + G), 2 * G).unwrap();
        let _ = d.vm_map(DeviceAddr(base.0 + 2 * G), G);
    }

    #[test]
    fn unchecked_calls_keep_no_record_and_count_the_same() {
        let d = device();
        d.check_mappings(false);
        let base = d.vm_reserve(8 * G).unwrap();
        let m = d.vm_map(DeviceAddr(base.0), 2 * G).unwrap();
        assert!(d.mappings.borrow().is_empty());
        // SAFETY: the address-only device runs no work; the mapping is the one just made.
        unsafe { d.vm_unmap(DeviceAddr(base.0), 2 * G, m) };
        assert_eq!((d.maps.get(), d.unmaps.get(), d.mapped.get()), (1, 1, 0));
        d.check_mappings(true);
    }

    #[test]
    #[should_panic(expected = "before the first map")]
    fn the_checks_change_only_while_nothing_is_mapped() {
        let d = device();
        let base = d.vm_reserve(8 * G).unwrap();
        d.vm_map(DeviceAddr(base.0), G).unwrap();
        d.check_mappings(false);
    }
}
