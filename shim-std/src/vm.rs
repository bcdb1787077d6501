//! Virtual memory: address ranges reserved with no memory behind them and backed granule by
//! granule (the contract's `vm_reserve`, `vm_map`, `vm_unmap` and `vm_release`; CUDA's
//! `cuMemAddressReserve`, `cuMemCreate` + `cuMemMap`, `cuMemUnmap` + `cuMemRelease` and
//! `cuMemAddressFree`), made with `mmap` on Unix.
//!
//! Owns: the reserved ranges and the mappings in them ([`Vm`], held under the device state's
//! lock), the `mmap` calls, whether a span of device memory lies in mapped memory (adjacent
//! mappings of one reservation count as one span: the core maps an allocation granule by
//! granule), and the poison quarantine of unmapped ranges. Does not own: the accounting against
//! the device's memory and budget, fault injection and the capture rules (the `Shim`
//! implementation in `device.rs` applies them before it calls here).
//!
//! - **reserve**: `mmap(PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)` of the size plus
//!   one granule, the slack on both sides trimmed off with `munmap` so the range starts on a
//!   granule;
//! - **map**: `mmap(PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS)` over the
//!   part of a reservation: new memory, zeroed (the contract leaves it undefined);
//! - **unmap**: `mmap(PROT_NONE, MAP_FIXED | MAP_NORESERVE)` over it again, which gives the memory
//!   back to the system and keeps the address range reserved; in poison mode the range is filled
//!   with [`POISON_BYTE`] and kept readable in a bounded quarantine first, so late work reads
//!   poison instead of faulting (as freed pages are kept);
//! - **release**: `munmap` of the whole reservation.
//!
//! A reservation is one allocation as far as Rust is concerned: copies and kernels rebuild their
//! pointers from exposed addresses, and the `mmap`s inside a reservation change what backs its
//! bytes, not where it lies. That is what lets one copy cross from one mapping into the next.
//!
//! Every call checks its arguments against the bookkeeping before any system call, so a wrong
//! address or size is an error status (or, for the calls that cannot fail, a call ignored and
//! counted as misuse), never an `mmap` over memory that is not ours.

use crate::faults::status;
use crate::memory::{POISON_BYTE, QUARANTINE_BLOCKS, QUARANTINE_BYTES};
use std::collections::{BTreeMap, VecDeque};
use std::ptr;

/// The virtual-memory granule a [`StdShim`](crate::StdShim) reports unless its builder says
/// otherwise ([`StdShimBuilder::vm_granule`](crate::StdShimBuilder::vm_granule)): 2 MiB on Unix,
/// the granule of current CUDA GPUs, so the core meets the std shim as it meets a GPU; 0 (none)
/// on other targets and under Miri, which does not run these `mmap`s.
pub const DEFAULT_VM_GRANULE: u64 = if cfg!(all(unix, not(miri))) {
    2 << 20
} else {
    0
};

/// The granule a builder's `bytes` asks for: 0 stays 0 (off); anything else is rounded up to a
/// power of two and to at least the system's page size, or 0 where that overflows or the target
/// has no `mmap`.
pub(crate) fn normalise_granule(bytes: u64) -> u64 {
    if bytes == 0 || !os::AVAILABLE {
        return 0;
    }
    let page = os::page_size() as u64;
    bytes
        .max(page)
        .checked_next_power_of_two()
        .filter(|g| usize::try_from(*g).is_ok_and(|g| g <= isize::MAX as usize / 4))
        .unwrap_or(0)
}

/// One mapping: its length and the handle [`Vm::map`] returned for it.
#[derive(Debug, Clone, Copy)]
struct Mapping {
    len: usize,
    handle: u64,
}

/// What [`Vm::unmap`] does with the memory it unmaps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unmap {
    /// Gives it back at once (`PROT_NONE` over it).
    GiveBack,
    /// Poisons it and keeps it readable in the quarantine, giving back the oldest ranges past
    /// the quarantine's bounds.
    Poison,
    /// Leaves it mapped: the device is lost and a worker may still be running an operation that
    /// touches it; it goes back with its reservation.
    Keep,
}

/// The reservations and mappings of one device. Dropping it `munmap`s every reservation left.
#[derive(Debug)]
pub(crate) struct Vm {
    /// The granule in bytes; 0: the device has no virtual memory.
    granule: usize,
    /// Reserved ranges: first address -> length.
    reserved: BTreeMap<usize, usize>,
    /// Mapped ranges, each inside one reservation: first address -> mapping.
    mapped: BTreeMap<usize, Mapping>,
    /// The handle of the next mapping (never 0).
    next_handle: u64,
    /// Unmapped ranges held poisoned and readable (poison mode), oldest first.
    quarantine: VecDeque<(usize, usize)>,
    /// Bytes in `quarantine`.
    quarantined: usize,
    /// Reservations released after the device was lost: unmapped only when this drops, after
    /// every stream worker has exited (as the device state's graveyard of blocks).
    graveyard: Vec<(usize, usize)>,
}

impl Vm {
    /// The bookkeeping of a device whose granule is `granule` (already normalised; 0: none).
    pub(crate) fn new(granule: u64) -> Self {
        Self {
            granule: usize::try_from(granule).unwrap_or(0),
            reserved: BTreeMap::new(),
            mapped: BTreeMap::new(),
            next_handle: 1,
            quarantine: VecDeque::new(),
            quarantined: 0,
            graveyard: Vec::new(),
        }
    }

    /// The granule in bytes (0: no virtual memory).
    pub(crate) fn granule(&self) -> usize {
        self.granule
    }

    /// Bytes of unmapped ranges held in the poison quarantine.
    pub(crate) fn quarantined(&self) -> usize {
        self.quarantined
    }

    /// `size` as a `usize` that is a non-zero multiple of the granule.
    fn granules(&self, size: u64) -> Result<usize, i32> {
        let size = usize::try_from(size).map_err(|_| status::TOO_BIG)?;
        if size == 0 || self.granule == 0 || !size.is_multiple_of(self.granule) {
            return Err(status::BAD_ARGUMENT);
        }
        Ok(size)
    }

    /// Reserves `size` bytes of address space (a non-zero multiple of the granule), aligned to
    /// the granule. Errors: [`status::BAD_ARGUMENT`] for a size of no granules or not a
    /// multiple, [`status::OUT_OF_MEMORY`] when the system has no such range left.
    pub(crate) fn reserve(&mut self, size: u64) -> Result<usize, i32> {
        let size = self.granules(size)?;
        let addr = os::reserve(size, self.granule).ok_or(status::OUT_OF_MEMORY)?;
        self.reserved.insert(addr, size);
        Ok(addr)
    }

    /// Checks that `size` bytes at `addr` can be mapped: multiples of the granule
    /// ([`status::BAD_ARGUMENT`]), inside one reservation ([`status::BAD_ADDRESS`]), and
    /// overlapping no mapping ([`status::ALREADY_MAPPED`]). Returns them as `usize`s.
    pub(crate) fn check_map(&self, addr: u64, size: u64) -> Result<(usize, usize), i32> {
        let len = self.granules(size)?;
        let a = usize::try_from(addr).map_err(|_| status::BAD_ADDRESS)?;
        if !a.is_multiple_of(self.granule) {
            return Err(status::BAD_ARGUMENT);
        }
        let end = a.checked_add(len).ok_or(status::BAD_ADDRESS)?;
        let inside = self
            .reserved
            .range(..=a)
            .next_back()
            .is_some_and(|(&s, &n)| end <= s + n);
        if !inside {
            return Err(status::BAD_ADDRESS);
        }
        let before = self
            .mapped
            .range(..end)
            .next_back()
            .is_some_and(|(&s, m)| s + m.len > a);
        if before {
            return Err(status::ALREADY_MAPPED);
        }
        Ok((a, len))
    }

    /// Maps new memory over `len` bytes at `addr`, which [`Vm::check_map`] accepted; returns
    /// the mapping's handle. [`status::OUT_OF_MEMORY`] when the system refuses, with nothing
    /// mapped.
    pub(crate) fn map(&mut self, addr: usize, len: usize) -> Result<u64, i32> {
        self.evict_overlapping(addr, addr + len);
        // SAFETY: `check_map` put the range inside one of our reservations with no mapping in
        // it; quarantined memory there was just given back. Nothing else uses these addresses.
        if !unsafe { os::commit(addr, len) } {
            // Where the failed `mmap` already took the reservation's own `PROT_NONE` mapping
            // away, put it back, so the hole cannot go to someone else's `mmap`.
            // SAFETY: as above.
            unsafe { os::give_back(addr, len) };
            return Err(status::OUT_OF_MEMORY);
        }
        let handle = self.next_handle;
        self.next_handle += 1;
        self.mapped.insert(addr, Mapping { len, handle });
        Ok(handle)
    }

    /// Unmaps the mapping `handle` of `size` bytes at `addr`; returns its length, or `None` (and
    /// changes nothing) when no mapping is exactly that.
    ///
    /// # Safety
    ///
    /// With [`Unmap::GiveBack`] and [`Unmap::Poison`]: no work uses the range any more.
    pub(crate) unsafe fn unmap(
        &mut self,
        addr: u64,
        size: u64,
        handle: u64,
        how: Unmap,
    ) -> Option<usize> {
        let a = usize::try_from(addr).ok()?;
        let m = *self.mapped.get(&a)?;
        if m.handle != handle || u64::try_from(m.len).ok() != Some(size) {
            return None;
        }
        self.mapped.remove(&a);
        match how {
            Unmap::Keep => {}
            // SAFETY: the range was ours and mapped; the caller promises nothing uses it.
            Unmap::GiveBack => unsafe { os::give_back(a, m.len) },
            Unmap::Poison => {
                // SAFETY: the range is mapped read-write (it was mapped until now) and nothing
                // uses it (the caller's promise).
                unsafe {
                    ptr::write_bytes(
                        ptr::with_exposed_provenance_mut::<u8>(a),
                        POISON_BYTE,
                        m.len,
                    )
                };
                self.quarantine.push_back((a, m.len));
                self.quarantined += m.len;
                while self.quarantine.len() > 1
                    && (self.quarantine.len() > QUARANTINE_BLOCKS
                        || self.quarantined > QUARANTINE_BYTES)
                {
                    let Some((old, n)) = self.quarantine.pop_front() else {
                        break;
                    };
                    self.quarantined -= n;
                    // SAFETY: an unmapped range of a live reservation (a release or a new
                    // mapping over it would have taken it out of the quarantine).
                    unsafe { os::give_back(old, n) };
                }
            }
        }
        Some(m.len)
    }

    /// Releases the reservation of `size` bytes at `addr`; returns the bytes still mapped in it
    /// (the caller broke the contract; they are gone with it), or `None` (and changes nothing)
    /// when no reservation is exactly that. With `keep` (the device is lost) the range stays
    /// in place until the bookkeeping drops.
    ///
    /// # Safety
    ///
    /// Unless `keep`: no work uses the range any more.
    pub(crate) unsafe fn release(&mut self, addr: u64, size: u64, keep: bool) -> Option<usize> {
        let a = usize::try_from(addr).ok()?;
        let len = *self.reserved.get(&a)?;
        if u64::try_from(len).ok() != Some(size) {
            return None;
        }
        self.reserved.remove(&a);
        let end = a + len;
        let inside: Vec<usize> = self.mapped.range(a..end).map(|(&s, _)| s).collect();
        let mut still_mapped = 0;
        for s in inside {
            if let Some(m) = self.mapped.remove(&s) {
                still_mapped += m.len;
            }
        }
        // Quarantined ranges inside go with the reservation.
        self.quarantine.retain(|&(s, _)| s < a || s >= end);
        self.quarantined = self.quarantine.iter().map(|&(_, n)| n).sum();
        if keep {
            self.graveyard.push((a, len));
        } else {
            // SAFETY: the reservation was ours; the caller promises nothing uses it.
            unsafe { os::release(a, len) };
        }
        Some(still_mapped)
    }

    /// Whether the bytes `[a, end)` (not empty) lie in mappings of one reservation, one after
    /// the other with no gap.
    pub(crate) fn holds(&self, a: usize, end: usize) -> bool {
        let in_one_reservation = self
            .reserved
            .range(..=a)
            .next_back()
            .is_some_and(|(&s, &n)| end <= s + n);
        if !in_one_reservation {
            return false;
        }
        let mut at = a;
        while at < end {
            match self.mapped.range(..=at).next_back() {
                Some((&s, m)) if s + m.len > at => at = s + m.len,
                _ => return false,
            }
        }
        true
    }

    /// Gives back the quarantined ranges that overlap `[a, end)` (about to be mapped again).
    fn evict_overlapping(&mut self, a: usize, end: usize) {
        let mut i = 0;
        while i < self.quarantine.len() {
            let (s, n) = self.quarantine[i];
            if s < end && a < s + n {
                self.quarantine.remove(i);
                self.quarantined -= n;
                // SAFETY: an unmapped range of a live reservation; nothing uses it.
                unsafe { os::give_back(s, n) };
            } else {
                i += 1;
            }
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let reserved = std::mem::take(&mut self.reserved);
        for (a, len) in reserved.into_iter().chain(self.graveyard.drain(..)) {
            // SAFETY: the bookkeeping drops with the device state, once every stream worker (each
            // holds the device) has exited: nothing can run that uses the range.
            unsafe { os::release(a, len) };
        }
    }
}

/// The system calls, on Unix.
#[cfg(unix)]
mod os {
    use libc::{
        MAP_ANONYMOUS, MAP_FAILED, MAP_FIXED, MAP_PRIVATE, PROT_NONE, PROT_READ, PROT_WRITE, c_int,
        c_void,
    };
    use std::ptr;

    /// Whether the target has these calls.
    pub(super) const AVAILABLE: bool = true;

    #[cfg(any(target_os = "linux", target_os = "android"))]
    const NORESERVE: c_int = libc::MAP_NORESERVE;
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    const NORESERVE: c_int = 0;

    /// The pointer to hand `mmap` for `addr` (an address inside a reservation of ours).
    fn at(addr: usize) -> *mut c_void {
        ptr::with_exposed_provenance_mut(addr)
    }

    /// The system's page size (4 KiB where it cannot be read).
    pub(super) fn page_size() -> usize {
        // SAFETY: `sysconf` only reads a system constant.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(n)
            .ok()
            .filter(|n| n.is_power_of_two())
            .unwrap_or(4096)
    }

    /// Reserves `len` bytes of address space aligned to `align` (a power of two, at least the
    /// page size; `len` a multiple of it), with no memory behind them; `None` if refused.
    pub(super) fn reserve(len: usize, align: usize) -> Option<usize> {
        let total = len.checked_add(align)?;
        // SAFETY: a new anonymous mapping where the kernel chooses: it touches no memory of
        // anyone else.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                total,
                PROT_NONE,
                MAP_PRIVATE | MAP_ANONYMOUS | NORESERVE,
                -1,
                0,
            )
        };
        if p == MAP_FAILED {
            return None;
        }
        let base = p.expose_provenance();
        // `base + total` did not overflow (the kernel mapped it), so neither does this.
        let start = base.next_multiple_of(align);
        let head = start - base;
        let tail = total - head - len;
        // SAFETY: both pieces lie in the mapping just made, which nobody else knows of; they are
        // page-aligned (`base` is, and `align` and `len` are multiples of the page size). A
        // failed trim leaves the slack reserved, which harms nothing.
        unsafe {
            if head > 0 {
                libc::munmap(p, head);
            }
            if tail > 0 {
                libc::munmap(p.byte_add(head + len), tail);
            }
        }
        #[cfg(test)]
        super::live::add(start, len);
        Some(start)
    }

    /// Backs `len` bytes at `addr` with new zeroed read-write memory; whether it worked.
    ///
    /// # Safety
    ///
    /// The range lies in a reservation of ours, and nothing uses what is mapped there now.
    pub(super) unsafe fn commit(addr: usize, len: usize) -> bool {
        // SAFETY: the caller's promise: the fixed mapping replaces only our own reservation.
        let p = unsafe {
            libc::mmap(
                at(addr),
                len,
                PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                -1,
                0,
            )
        };
        p != MAP_FAILED
    }

    /// Gives the memory of `len` bytes at `addr` back to the system, keeping the range reserved
    /// (`PROT_NONE` mapped over it). Where that `mmap` fails (the system's mapping limit),
    /// `MADV_DONTNEED` still gives the memory back, leaving the pages mapped.
    ///
    /// # Safety
    ///
    /// The range lies in a reservation of ours, and nothing uses it.
    pub(super) unsafe fn give_back(addr: usize, len: usize) {
        // SAFETY: the caller's promise: the fixed mapping replaces only our own memory.
        let p = unsafe {
            libc::mmap(
                at(addr),
                len,
                PROT_NONE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | NORESERVE,
                -1,
                0,
            )
        };
        if p == MAP_FAILED {
            // SAFETY: as above; discarding private anonymous pages only zeroes them.
            unsafe { libc::madvise(at(addr), len, libc::MADV_DONTNEED) };
        }
    }

    /// Unmaps the reservation of `len` bytes at `addr`.
    ///
    /// # Safety
    ///
    /// The whole range is a reservation of ours, and nothing uses it.
    pub(super) unsafe fn release(addr: usize, len: usize) {
        // SAFETY: the caller's promise.
        unsafe { libc::munmap(at(addr), len) };
        #[cfg(test)]
        super::live::remove(addr, len);
    }
}

/// No `mmap` on this target: the granule is always 0, so none of these is ever reached.
#[cfg(not(unix))]
mod os {
    pub(super) const AVAILABLE: bool = false;

    pub(super) fn page_size() -> usize {
        4096
    }

    pub(super) fn reserve(_len: usize, _align: usize) -> Option<usize> {
        None
    }

    pub(super) unsafe fn commit(_addr: usize, _len: usize) -> bool {
        false
    }

    pub(super) unsafe fn give_back(_addr: usize, _len: usize) {}

    pub(super) unsafe fn release(_addr: usize, _len: usize) {}
}

/// Reservations live in this process, for the tests that check a dropped shim leaves none.
/// Each gets a number of its own: tests run side by side, and a range released by one test may
/// be reserved again at once, at the same address and size, by another.
#[cfg(test)]
pub(crate) mod live {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    static LIVE: Mutex<BTreeMap<usize, (usize, u64)>> = Mutex::new(BTreeMap::new());
    static NEXT: AtomicU64 = AtomicU64::new(0);

    #[cfg_attr(not(unix), allow(dead_code))]
    pub(super) fn add(addr: usize, len: usize) {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        crate::lock(&LIVE).insert(addr, (len, n));
    }

    #[cfg_attr(not(unix), allow(dead_code))]
    pub(super) fn remove(addr: usize, len: usize) {
        let mut live = crate::lock(&LIVE);
        if live.get(&addr).map(|&(l, _)| l) == Some(len) {
            live.remove(&addr);
        }
    }

    /// The reservation live at `addr`: its length and its number.
    pub(crate) fn at(addr: u64) -> Option<(usize, u64)> {
        crate::lock(&LIVE).get(&(addr as usize)).copied()
    }
}
