//! The device a replay runs on: its facts, and where its pages come from.
//!
//! Owns [`Device`] (the facts the manager is fitted to), [`Pages`] (which device: `std` or
//! `address`), the [`ReplayShim`] trait both implement (building one from the facts, and the
//! counters of its pages that the figures and `--verify` read), and [`AddressShim`].
//!
//! - `std`: devcmd-std's [`StdShim`], the CPU device. Its pages are zeroed heap blocks of the
//!   page alignment; Rust's `alloc_zeroed` zeroes any block aligned past 16 bytes by writing it,
//!   so a replay touches every page it holds: it needs RAM for the held peak, and a cold replay's
//!   time is mostly that zeroing.
//! - `address`: [`AddressShim`], address ranges and nothing behind them (no memory, no copies,
//!   no kernels): the manager sees the same facts and the same failures past the device's memory,
//!   so its figures are the same, in no RAM and with nothing but the manager in the time.

use devcmd::{
    CopyLayout, DeviceAddr, DeviceFacts, DeviceSpan, DriverError, Fault, HostMemory, KernelParam,
    LaunchDims, Shim, ShimOp,
};
use devcmd_std::StdShim;
use std::cell::Cell;
use std::convert::Infallible;
use std::ptr::NonNull;

/// The device facts the replay runs with, and where its pages come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device {
    /// Bytes of device memory.
    pub total_memory: u64,
    /// Page alignment (every slice is aligned to it).
    pub alignment: u64,
    /// The largest page (`None`: the total memory, as the CUDA shim says).
    pub max_page: Option<u64>,
    /// Which device makes the pages.
    pub pages: Pages,
    /// Memory the manager lets go waits for a fence, as on a device (`--fenced`: see
    /// `replay::Fences`); otherwise it goes back at once.
    pub fenced: bool,
}

impl Default for Device {
    /// 140 GiB (about an H200's, the GPU the stored traces were captured on), CUDA's 256-byte
    /// alignment, no page limit below the total, pages of address ranges only (the figures are
    /// the same as devcmd-std's, with no RAM behind them and only the manager in the times).
    fn default() -> Self {
        Self {
            total_memory: 140 << 30,
            alignment: 256,
            max_page: None,
            pages: Pages::Address,
            fenced: false,
        }
    }
}

impl Device {
    /// The facts a device with these settings reports: devcmd-std's, for either device (so both
    /// round the alignment and clamp the largest page alike, and a field added to the facts
    /// later needs no change here).
    pub fn facts(&self) -> DeviceFacts {
        std_shim(*self).facts()
    }
}

fn std_shim(device: Device) -> StdShim {
    StdShim::builder()
        .total_memory(device.total_memory)
        .page_alignment(device.alignment)
        .max_page_size(device.max_page.unwrap_or(device.total_memory))
        .build()
}

/// Which device makes the pages (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pages {
    /// devcmd-std's CPU device: real, zeroed heap pages.
    Std,
    /// Address ranges only.
    Address,
}

impl Pages {
    /// Its name on the command line and in the report.
    pub fn name(self) -> &'static str {
        match self {
            Self::Std => "std",
            Self::Address => "address",
        }
    }
}

/// What a replay reads of its device's pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Pages allocated (successfully).
    pub allocated: u64,
    /// Pages freed.
    pub freed: u64,
    /// Bytes of live pages.
    pub bytes_live: u64,
    /// Calls that may have changed the device's memory (every counted call and every free): a
    /// check reads the manager's pages again when this moves.
    pub calls: u64,
    /// Granules mapped (`vm_map` calls that succeeded).
    pub maps: u64,
    /// Granules unmapped (`vm_unmap` calls).
    pub unmaps: u64,
}

impl Counters {
    /// Pages live.
    pub fn live(&self) -> u64 {
        self.allocated - self.freed
    }

    /// Calls that put memory behind an address or took it away: pages allocated and freed,
    /// granules mapped and unmapped (each costs about a `cuMemAlloc` on a GPU).
    pub fn map_calls(&self) -> u64 {
        self.allocated + self.freed + self.maps + self.unmaps
    }
}

/// A device a replay can build from [`Device`] and read page counters from.
pub trait ReplayShim: Shim + Sized {
    /// A device with `device`'s facts.
    fn build(device: Device) -> Self;
    /// Its page counters now.
    fn counters(&self) -> Counters;
}

impl ReplayShim for StdShim {
    fn build(device: Device) -> Self {
        std_shim(device)
    }

    fn counters(&self) -> Counters {
        let st = self.stats();
        Counters {
            allocated: st.device_frees + st.device_pages_live,
            freed: st.device_frees,
            bytes_live: st.device_bytes_live,
            calls: ShimOp::ALL.iter().map(|op| st.calls(*op)).sum::<u64>() + st.device_frees,
            maps: st.vm_maps,
            unmaps: st.vm_unmaps,
        }
    }
}

/// The status codes of [`AddressShim`], classified in one place.
mod status {
    pub const OUT_OF_MEMORY: i32 = 1;
    pub const TOO_BIG: i32 = 2;
    pub const UNSUPPORTED: i32 = 3;
}

/// A device of address ranges only: pages are ranges of a 64-bit address space handed out in
/// order (aligned, never reused), limited by the device's memory and largest page like any
/// device; it has one stream whose work is always done, and refuses copies, kernels and pinned
/// memory (a replay makes none).
#[derive(Debug)]
pub struct AddressShim {
    facts: DeviceFacts,
    next: Cell<u64>,
    counters: Cell<Counters>,
}

/// A page of an [`AddressShim`].
#[derive(Debug)]
pub struct AddressPage {
    addr: u64,
    size: u64,
}

impl AddressShim {
    /// Where the first page starts (any non-zero address would do).
    const BASE: u64 = 1 << 40;
}

impl ReplayShim for AddressShim {
    fn build(device: Device) -> Self {
        let facts = device.facts();
        Self {
            facts,
            next: Cell::new(Self::BASE),
            counters: Cell::new(Counters::default()),
        }
    }

    fn counters(&self) -> Counters {
        self.counters.get()
    }
}

impl Shim for AddressShim {
    type Stream = ();
    type Event = ();
    type DevicePage = AddressPage;
    type HostPage = Infallible;
    type Kernel = Infallible;
    type Registration = Infallible;
    type Graph = Infallible;
    type NativeStream = ();

    fn native_stream<'a>(&self, _stream: &'a Self::Stream) -> &'a () {
        &()
    }

    fn facts(&self) -> DeviceFacts {
        self.facts
    }

    fn classify(&self, op: ShimOp, status: i32) -> DriverError {
        let fault = match status {
            status::OUT_OF_MEMORY => Fault::OutOfMemory,
            status::TOO_BIG => Fault::TooBig,
            status::UNSUPPORTED => Fault::Unsupported,
            _ => Fault::Failed,
        };
        DriverError::new(op, status, fault)
    }

    fn create_stream(&self) -> Result<(), DriverError> {
        Ok(())
    }

    fn stream_wait_event(&self, _stream: &(), _event: &()) -> Result<(), DriverError> {
        Ok(())
    }

    fn record_event(&self, _stream: &()) -> Result<(), DriverError> {
        Ok(())
    }

    fn event_query(&self, _event: &()) -> Result<bool, DriverError> {
        Ok(true)
    }

    fn event_wait(&self, _event: &()) -> Result<(), DriverError> {
        Ok(())
    }

    fn device_alloc(&self, size: u64) -> Result<AddressPage, DriverError> {
        const OP: ShimOp = ShimOp::DeviceAlloc;
        let mut c = self.counters.get();
        if size > self.facts.max_page_size {
            return Err(self.classify(OP, status::TOO_BIG));
        }
        if c.bytes_live.saturating_add(size) > self.facts.total_memory {
            return Err(self.classify(OP, status::OUT_OF_MEMORY));
        }
        let addr = self.next.get();
        let end = addr
            .checked_add(size.max(1))
            .and_then(|e| e.checked_next_multiple_of(self.facts.page_alignment))
            .ok_or_else(|| self.classify(OP, status::OUT_OF_MEMORY))?;
        self.next.set(end);
        c.allocated += 1;
        c.calls += 1;
        c.bytes_live += size;
        self.counters.set(c);
        Ok(AddressPage { addr, size })
    }

    fn device_page_addr(&self, page: &AddressPage) -> DeviceAddr {
        DeviceAddr(page.addr)
    }

    unsafe fn device_free(&self, page: AddressPage) {
        let mut c = self.counters.get();
        c.freed += 1;
        c.calls += 1;
        c.bytes_live -= page.size;
        self.counters.set(c);
    }

    fn vm_reserve(&self, size: u64) -> Result<DeviceAddr, DriverError> {
        const OP: ShimOp = ShimOp::VmReserve;
        let granule = self.facts.vm_granule.max(1);
        let start = self
            .next
            .get()
            .checked_next_multiple_of(granule)
            .ok_or_else(|| self.classify(OP, status::OUT_OF_MEMORY))?;
        let end = start
            .checked_add(size)
            .ok_or_else(|| self.classify(OP, status::OUT_OF_MEMORY))?;
        self.next.set(end);
        let mut c = self.counters.get();
        c.calls += 1;
        self.counters.set(c);
        Ok(DeviceAddr(start))
    }

    unsafe fn vm_release(&self, _addr: DeviceAddr, _size: u64) {
        let mut c = self.counters.get();
        c.calls += 1;
        self.counters.set(c);
    }

    fn vm_map(&self, _addr: DeviceAddr, size: u64) -> Result<u64, DriverError> {
        let mut c = self.counters.get();
        if c.bytes_live.saturating_add(size) > self.facts.total_memory {
            return Err(self.classify(ShimOp::VmMap, status::OUT_OF_MEMORY));
        }
        c.bytes_live += size;
        c.calls += 1;
        c.maps += 1;
        self.counters.set(c);
        Ok(0)
    }

    unsafe fn vm_unmap(&self, _addr: DeviceAddr, size: u64, _memory: u64) {
        let mut c = self.counters.get();
        c.bytes_live -= size;
        c.calls += 1;
        c.unmaps += 1;
        self.counters.set(c);
    }

    fn host_page_ptr(&self, page: &Infallible) -> NonNull<u8> {
        match *page {}
    }

    unsafe fn host_free_pinned(&self, page: Infallible) {
        match page {}
    }

    unsafe fn copy_to_device(
        &self,
        _stream: &(),
        _src: *const u8,
        _src_memory: HostMemory,
        _dst: DeviceAddr,
        _layout: CopyLayout,
    ) -> Result<(), DriverError> {
        Err(self.classify(ShimOp::CopyHostToDevice, status::UNSUPPORTED))
    }

    unsafe fn copy_to_host(
        &self,
        _stream: &(),
        _src: DeviceAddr,
        _dst: *mut u8,
        _dst_memory: HostMemory,
        _layout: CopyLayout,
    ) -> Result<(), DriverError> {
        Err(self.classify(ShimOp::CopyDeviceToHost, status::UNSUPPORTED))
    }

    unsafe fn launch(
        &self,
        _stream: &(),
        kernel: &Infallible,
        _dims: LaunchDims,
        _buffers: &[DeviceSpan],
        _params: &[KernelParam<'_>],
    ) -> Result<(), DriverError> {
        match *kernel {}
    }
}
