//! Virtual memory through the raw shim: [`Shim::vm_reserve`], [`Shim::vm_map`],
//! [`Shim::vm_unmap`] and [`Shim::vm_release`], checked on the shim itself (no
//! [`devcmd::Device`]), so a shim's half of the contract is pinned whatever the core does with it.
//!
//! A shim whose facts give no granule ([`DeviceFacts::vm_granule`](devcmd::DeviceFacts) of 0)
//! is skipped, with a line the test runner shows ([`crate::skip`]).

use crate::harness::{FaultRule, Harness, Mode, Probe, TestArgs, TestKernel};
use crate::util::{expect_same, pattern, suspect};

/// The suspect when bytes over two adjacent mappings come back wrong.
const ADJACENT: &str = "vm_map (two granules mapped one after the other in a reservation are \
                        not one span of memory at the addresses they were mapped at)";
use devcmd::{CopyLayout, DeviceAddr, DeviceSpan, DriverError, Fault, HostMemory, Shim, ShimOp};

/// The shim under test with one stream, its granule and the mode, and what the checks share.
struct Vm<'a, S: Shim> {
    shim: &'a S,
    stream: S::Stream,
    g: u64,
    mode: Mode,
}

impl<S: Shim> Vm<'_, S> {
    /// Unwraps `r`, or panics naming the mode, `what` and the error.
    #[track_caller]
    fn ok<T>(&self, r: Result<T, DriverError>, what: &str) -> T {
        r.unwrap_or_else(|e| panic!("[{}] virtual_memory: {what}: {e}", self.mode))
    }

    /// Waits for everything enqueued on the stream.
    #[track_caller]
    fn sync(&self, what: &str) {
        let fence = self.ok(self.shim.record_event(&self.stream), what);
        self.ok(self.shim.event_wait(&fence), what);
    }

    /// Uploads `data` to `addr` in one copy and waits.
    #[track_caller]
    fn put(&self, addr: DeviceAddr, data: &[u8], what: &str) {
        // SAFETY: `data` outlives the wait below; the checks name mapped memory only.
        let r = unsafe {
            self.shim.copy_to_device(
                &self.stream,
                data.as_ptr(),
                HostMemory::Pageable,
                addr,
                CopyLayout::linear(data.len() as u64),
            )
        };
        self.ok(r, what);
        self.sync(what);
    }

    /// Reads `len` bytes at `addr` back in one copy and waits.
    #[track_caller]
    fn get(&self, addr: DeviceAddr, len: usize, what: &str) -> Vec<u8> {
        let mut out = vec![0u8; len];
        // SAFETY: `out` outlives the wait below and nothing else touches it; the checks name
        // mapped memory only.
        let r = unsafe {
            self.shim.copy_to_host(
                &self.stream,
                addr,
                out.as_mut_ptr(),
                HostMemory::Pageable,
                CopyLayout::linear(len as u64),
            )
        };
        self.ok(r, what);
        self.sync(what);
        out
    }

    /// Checks that `got` is `want`, naming the first difference and the shim calls most likely
    /// at fault (`suspects`).
    #[track_caller]
    fn same(&self, got: &[u8], want: &[u8], what: &str, suspects: &[&str]) {
        expect_same(
            got,
            want,
            &format!("[{}] virtual_memory: {what}", self.mode),
            suspects,
        );
    }

    /// A reservation of `size` bytes, checked aligned to the granule.
    #[track_caller]
    fn reserve(&self, size: u64, what: &str) -> DeviceAddr {
        let base = self.ok(self.shim.vm_reserve(size), what);
        assert!(
            base.0 != 0 && base.0.is_multiple_of(self.g),
            "[{}] virtual_memory: {what}: vm_reserve returned {:#x}, which is not aligned to \
             the granule ({} bytes)",
            self.mode,
            base.0,
            self.g
        );
        base
    }
}

/// The virtual-memory group (through the raw shim; skipped where the granule is 0). Checks:
///
/// - a reservation is aligned to the granule; two granules mapped by two calls, one after the
///   other, are one span for an upload and a read over both, a device-to-device copy and a
///   kernel ([`TestKernel::Fill`]) across their boundary;
/// - one of them unmapped and mapped again at the same address is usable again, and the other
///   keeps its bytes; everything unmapped, the range released;
/// - a map the device cannot hold (nearly its whole memory, on top of a granule already mapped)
///   fails with [`Fault::OutOfMemory`] (or [`Fault::TooBig`]) and leaves nothing mapped: a
///   granule maps there at once after, and is usable;
/// - with a probe: an injected refusal of `vm_map` is [`Fault::OutOfMemory`] and maps nothing;
///   the probe's counters count mapped bytes with the device's and reserved bytes, back to where
///   they started once everything is given back.
pub fn virtual_memory<H: Harness>(h: &H, mode: Mode) {
    let Some(shim) = h.shim(mode) else {
        crate::skip::skipped(
            "virtual_memory",
            mode,
            &format!("the shim has no {mode} mode"),
        );
        return;
    };
    let g = shim.facts().vm_granule;
    if g == 0 {
        crate::skip::skipped(
            "virtual_memory",
            mode,
            "no virtual memory: DeviceFacts::vm_granule is 0",
        );
        return;
    }
    let probe = h.probe(&shim);
    let counted = |p: &dyn Probe| {
        let c = p.counters();
        (c.device_bytes_live, c.vm_reserved_live)
    };
    let start = probe.as_deref().map(counted);
    let stream = shim
        .create_stream()
        .unwrap_or_else(|e| panic!("[{mode}] virtual_memory: create_stream: {e}"));
    let fill = h.kernel(&shim, TestKernel::Fill);
    let v = Vm {
        shim: &shim,
        stream,
        g,
        mode,
    };
    two_mappings_are_one_span(&v, &fill, probe.as_deref(), start);
    a_map_the_device_cannot_hold_leaves_nothing_mapped(&v);
    if let Some(p) = probe.as_deref() {
        an_injected_refusal_maps_nothing(&v, p);
    }
    if let (Some(p), Some(start)) = (probe.as_deref(), start) {
        assert_eq!(
            counted(p),
            start,
            "[{mode}] virtual_memory: (device bytes, reserved bytes) the probe counts are not \
             back to where they started once everything was unmapped and released"
        );
    }
}

fn two_mappings_are_one_span<S: Shim>(
    v: &Vm<'_, S>,
    fill: &S::Kernel,
    probe: Option<&dyn Probe>,
    start: Option<(u64, u64)>,
) {
    let (shim, g, mode) = (v.shim, v.g, v.mode);
    let gu = g as usize;
    let base = v.reserve(4 * g, "vm_reserve of 4 granules");
    let first = v.ok(shim.vm_map(base, g), "vm_map of the first granule");
    let second = v.ok(
        shim.vm_map(base.offset(g), g),
        "vm_map of the second granule, right after the first",
    );
    if let (Some(p), Some((bytes, reserved))) = (probe, start) {
        let c = p.counters();
        assert_eq!(
            (c.device_bytes_live, c.vm_reserved_live),
            (bytes + 2 * g, reserved + 4 * g),
            "[{mode}] virtual_memory: the probe counts (device bytes, reserved bytes) with two \
             granules mapped in a reservation of four"
        );
    }

    let data = pattern(2 * gu, 11);
    v.put(base, &data, "an upload over both mappings");
    let back = v.get(base, 2 * gu, "a read over both mappings");
    v.same(
        &back,
        &data,
        "an upload then a read over two mappings",
        &[ADJACENT, suspect::COPIES],
    );
    let at = gu - 4096.min(gu / 2);
    let window = v.get(
        base.offset(at as u64),
        2 * (gu - at),
        "a read across the boundary",
    );
    v.same(
        &window,
        &data[at..2 * gu - at],
        "a read across the boundary of two mappings",
        &[ADJACENT, suspect::COPIES],
    );

    // A device-to-device copy whose source crosses the boundary.
    let half = 512.min(gu / 2);
    // SAFETY: both spans lie in the two mappings; the wait below ends the copy.
    let r = unsafe {
        shim.copy_on_device(
            &v.stream,
            base.offset(g - half as u64),
            base.offset(16),
            CopyLayout::linear(2 * half as u64),
        )
    };
    v.ok(r, "a device-to-device copy from across the boundary");
    v.sync("a device-to-device copy from across the boundary");
    let mut want = data;
    want.copy_within(gu - half..gu + half, 16);
    // A kernel whose output crosses the boundary.
    let quarter = 256.min(gu / 2);
    let args = TestArgs::new(TestKernel::Fill, 0x5A, &[], &[2 * quarter as u64]);
    let spans = [DeviceSpan {
        addr: base.offset(g - quarter as u64),
        len: 2 * quarter as u64,
    }];
    // SAFETY: the span lies in the two mappings; the kernel writes only it.
    let r = unsafe { shim.launch(&v.stream, fill, args.dims(), &spans, &args.params()) };
    v.ok(r, "a launch whose output crosses the boundary");
    v.sync("a launch whose output crosses the boundary");
    want[gu - quarter..gu + quarter].fill(0x5A);
    let back = v.get(base, 2 * gu, "a read over both mappings");
    v.same(
        &back,
        &want,
        "a device-to-device copy and a kernel across the boundary of two mappings",
        &[
            "copy_on_device (a copy whose source crosses the boundary of two mappings)",
            "launch (a kernel whose output crosses the boundary of two mappings)",
            ADJACENT,
        ],
    );

    // Unmap the second, map it again at the same address: usable, and the first keeps its
    // bytes.
    // SAFETY: every copy and launch using it was waited for.
    unsafe { shim.vm_unmap(base.offset(g), g, second) };
    let again = v.ok(
        shim.vm_map(base.offset(g), g),
        "vm_map again at the address of a granule just unmapped",
    );
    let fresh = pattern(gu, 77);
    v.put(
        base.offset(g),
        &fresh,
        "an upload into the granule mapped again",
    );
    let back = v.get(base, 2 * gu, "a read over both mappings");
    v.same(
        &back[..gu],
        &want[..gu],
        "the first granule while the second was unmapped and mapped again",
        &["vm_unmap / vm_map (unmapping or mapping the second granule touched the first)"],
    );
    v.same(
        &back[gu..],
        &fresh,
        "the granule mapped again at the same address",
        &["vm_map (a granule mapped again where one was unmapped is not usable memory)"],
    );
    // SAFETY: every copy was waited for; then nothing is mapped in the range.
    unsafe {
        shim.vm_unmap(base, g, first);
        shim.vm_unmap(base.offset(g), g, again);
        shim.vm_release(base, 4 * g);
    }
}

fn a_map_the_device_cannot_hold_leaves_nothing_mapped<S: Shim>(v: &Vm<'_, S>) {
    let (shim, g, mode) = (v.shim, v.g, v.mode);
    let total = shim.facts().total_memory;
    let most = total / g * g;
    let Some(range) = total
        .checked_next_multiple_of(g)
        .and_then(|r| r.checked_add(g))
    else {
        return;
    };
    if most == 0 {
        crate::skip::skipped(
            "virtual_memory's map the device cannot hold",
            mode,
            &format!("the device's {total} bytes are less than a granule"),
        );
        return;
    }
    let base = v.reserve(range, "vm_reserve of the device's memory and a granule");
    let first = v.ok(shim.vm_map(base, g), "vm_map of one granule");
    match shim.vm_map(base.offset(g), most) {
        Ok(_) => panic!(
            "[{mode}] virtual_memory: vm_map of {most} bytes on top of a granule already mapped \
             succeeded on a device of {total} bytes"
        ),
        Err(e) => assert!(
            matches!(e.fault, Fault::OutOfMemory | Fault::TooBig) && e.op == ShimOp::VmMap,
            "[{mode}] virtual_memory: vm_map of {most} bytes on top of a granule already mapped, \
             on a device of {total} bytes, must fail as a shortage (OutOfMemory) or as too big, \
             not: {e}"
        ),
    }
    let second = v.ok(
        shim.vm_map(base.offset(g), g),
        "vm_map of a granule where a map just failed (it must leave nothing mapped)",
    );
    let data = pattern(2 * g as usize, 5);
    v.put(base, &data, "an upload over both granules");
    let back = v.get(base, data.len(), "a read over both granules");
    v.same(
        &back,
        &data,
        "the granules mapped after a failed map",
        &["vm_map (the map that failed left something mapped, or broke the reservation)"],
    );
    // SAFETY: every copy was waited for; then nothing is mapped in the range.
    unsafe {
        shim.vm_unmap(base, g, first);
        shim.vm_unmap(base.offset(g), g, second);
        shim.vm_release(base, range);
    }
}

fn an_injected_refusal_maps_nothing<S: Shim>(v: &Vm<'_, S>, p: &dyn Probe) {
    let (shim, g, mode) = (v.shim, v.g, v.mode);
    let base = v.reserve(2 * g, "vm_reserve of 2 granules");
    p.inject(FaultRule::Once {
        op: ShimOp::VmMap,
        skip: 0,
    });
    let refused = shim.vm_map(base, g);
    p.clear();
    match refused {
        Ok(_) => panic!("[{mode}] virtual_memory: an injected refusal of vm_map did not fire"),
        Err(e) => assert_eq!(
            (e.op, e.fault),
            (ShimOp::VmMap, Fault::OutOfMemory),
            "[{mode}] virtual_memory: an injected refusal of vm_map must be a shortage: {e}"
        ),
    }
    let m = v.ok(
        shim.vm_map(base, g),
        "vm_map where an injected refusal just failed (it must leave nothing mapped)",
    );
    v.put(base, &[3; 64], "an upload after a refused map");
    v.same(
        &v.get(base, 64, "a read after a refused map"),
        &[3; 64],
        "the granule mapped after a refused map",
        &["vm_map (the refused map left something mapped, or broke the reservation)"],
    );
    p.inject(FaultRule::Once {
        op: ShimOp::VmReserve,
        skip: 0,
    });
    let refused = shim.vm_reserve(g);
    p.clear();
    assert!(
        refused.is_err(),
        "[{mode}] virtual_memory: an injected refusal of vm_reserve did not fire"
    );
    // SAFETY: every copy was waited for; then nothing is mapped in the range.
    unsafe {
        shim.vm_unmap(base, g, m);
        shim.vm_release(base, 2 * g);
    }
}
