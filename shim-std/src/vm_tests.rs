//! Virtual memory through the `Shim` trait: reservations, mappings used by copies and kernels
//! across granule boundaries, refusals, accounting, injection, poison, capture and teardown.

use crate::faults::status;
use crate::*;
use devcmd::{
    CopyLayout, DeviceAddr, DeviceSpan, DriverError, Fault, HostMemory, KernelParam, LaunchDims,
    Shim, ShimOp,
};

/// A small granule, so the tests move little memory (the system's page size at least).
const G: u64 = 64 << 10;

fn shim() -> StdShim {
    StdShim::builder().vm_granule(G).build()
}

fn sync(shim: &StdShim, stream: &StdStream) -> Result<(), DriverError> {
    shim.event_wait(&shim.record_event(stream)?)
}

/// Uploads `data` to `addr` (pageable) and waits.
fn put(shim: &StdShim, s: &StdStream, addr: u64, data: &[u8]) -> Result<(), DriverError> {
    // SAFETY: `data` outlives the wait below; the caller names device memory (or expects the
    // refusal).
    unsafe {
        shim.copy_to_device(
            s,
            data.as_ptr(),
            HostMemory::Pageable,
            DeviceAddr(addr),
            CopyLayout::linear(data.len() as u64),
        )
    }?;
    sync(shim, s)
}

/// Reads `len` bytes at `addr` back and waits.
fn get(shim: &StdShim, s: &StdStream, addr: u64, len: usize) -> Result<Vec<u8>, DriverError> {
    let mut out = vec![0u8; len];
    // SAFETY: `out` outlives the wait below; as in `put` for the device side.
    unsafe {
        shim.copy_to_host(
            s,
            DeviceAddr(addr),
            out.as_mut_ptr(),
            HostMemory::Pageable,
            CopyLayout::linear(len as u64),
        )
    }?;
    sync(shim, s)?;
    Ok(out)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

fn fill_kernel(shim: &StdShim) -> StdKernel {
    shim.register_kernel("fill", |ctx| {
        let value = ctx.scalar_u32(0)? as u8;
        ctx.buffers_mut()?.into_iter().for_each(|b| b.fill(value));
        Ok(())
    })
}

/// Launches the fill kernel over `len` bytes at `addr` with `value`.
fn fill(
    shim: &StdShim,
    s: &StdStream,
    k: &StdKernel,
    addr: u64,
    len: u64,
    value: u32,
) -> Result<(), DriverError> {
    let spans = [DeviceSpan {
        addr: DeviceAddr(addr),
        len,
    }];
    // SAFETY: the span is device memory (or the call is expected to refuse it).
    unsafe {
        shim.launch(
            s,
            k,
            LaunchDims::SINGLE,
            &spans,
            &[KernelParam::Scalar(&value.to_ne_bytes())],
        )
    }?;
    sync(shim, s)
}

#[track_caller]
fn refused(r: Result<impl std::fmt::Debug, DriverError>, op: ShimOp, code: i32) {
    let e = r.expect_err("refused");
    assert_eq!((e.op, e.status), (op, code), "{e}");
    assert_ne!(e.fault, Fault::DeviceLost, "{e}");
}

#[test]
fn the_granule_is_2_mib_by_default_set_by_the_builder_and_0_turns_it_off() {
    assert_eq!(DEFAULT_VM_GRANULE, 2 << 20);
    assert_eq!(StdShim::new().facts().vm_granule, 2 << 20);
    assert_eq!(shim().facts().vm_granule, G);
    let off = StdShim::builder().vm_granule(0).build();
    assert_eq!(off.facts().vm_granule, 0);
    let odd = StdShim::builder()
        .vm_granule(3000)
        .build()
        .facts()
        .vm_granule;
    assert!(odd.is_power_of_two() && odd >= 3000, "{odd}");
    assert_eq!(
        StdShim::builder()
            .vm_granule(u64::MAX)
            .build()
            .facts()
            .vm_granule,
        0
    );
    // Without a granule the calls are unsupported, as the contract's defaults are.
    let e = off.vm_reserve(G).unwrap_err();
    assert_eq!(
        (e.status, e.fault),
        (status::UNSUPPORTED, Fault::Unsupported)
    );
    let e = off.vm_map(DeviceAddr(1 << 30), G).unwrap_err();
    assert_eq!(
        (e.status, e.fault),
        (status::UNSUPPORTED, Fault::Unsupported)
    );
}

/// The whole life of a reservation: two granules mapped one by one, used by copies and a kernel
/// across their boundary; one unmapped and refused to copies (an error, not a crash), mapped
/// again at the same address; everything given back.
#[test]
fn two_adjacent_mappings_are_one_span_for_copies_and_kernels() {
    let shim = shim();
    let s = shim.create_stream().unwrap();
    let base = shim.vm_reserve(4 * G).unwrap().0;
    let live = crate::vm::live::at(base).expect("the reservation is live");
    assert!(base != 0 && base.is_multiple_of(G), "{base:#x}");
    assert_eq!(shim.stats().vm_reserved_live, 4 * G);
    refused(
        put(&shim, &s, base, &[1; 16]),
        ShimOp::CopyHostToDevice,
        status::BAD_ADDRESS,
    );
    let first = shim.vm_map(DeviceAddr(base), G).unwrap();
    let second = shim.vm_map(DeviceAddr(base + G), G).unwrap();
    assert_ne!(first, second);
    let st = shim.stats();
    assert_eq!(
        (st.device_bytes_live, st.vm_mapped_live, st.vm_maps),
        (2 * G, 2 * G, 1 + 1)
    );
    assert_eq!(st.device_pages_live, 0, "mappings are not pages");

    // One copy over both granules, read back whole and across the boundary.
    let data = pattern(2 * G as usize, 7);
    put(&shim, &s, base, &data).unwrap();
    assert_eq!(get(&shim, &s, base, data.len()).unwrap(), data);
    let (at, n) = (G - 4096, 8192usize);
    assert_eq!(
        get(&shim, &s, base + at, n).unwrap(),
        data[at as usize..at as usize + n]
    );
    // A device-to-device copy whose source crosses the boundary.
    // SAFETY: both spans lie in the two mappings; the wait below ends the copy.
    unsafe {
        shim.copy_on_device(
            &s,
            DeviceAddr(base + G - 512),
            DeviceAddr(base + 64),
            CopyLayout::linear(1024),
        )
    }
    .unwrap();
    sync(&shim, &s).unwrap();
    let mut want = data.clone();
    want.copy_within((G - 512) as usize..(G + 512) as usize, 64);
    // A kernel whose buffer crosses the boundary.
    let k = fill_kernel(&shim);
    fill(&shim, &s, &k, base + G - 256, 512, 0x5A).unwrap();
    want[(G - 256) as usize..(G + 256) as usize].fill(0x5A);
    assert_eq!(get(&shim, &s, base, want.len()).unwrap(), want);
    // Past the mapped part of the reservation: refused.
    refused(
        get(&shim, &s, base + 2 * G - 8, 16),
        ShimOp::CopyDeviceToHost,
        status::BAD_ADDRESS,
    );

    // Unmap the second granule: copies and kernels into it, or across into it, are refused.
    // SAFETY: every copy and kernel using it was waited for.
    unsafe { shim.vm_unmap(DeviceAddr(base + G), G, second) };
    let st = shim.stats();
    assert_eq!(
        (st.device_bytes_live, st.vm_mapped_live, st.vm_unmaps),
        (G, G, 1)
    );
    refused(
        put(&shim, &s, base + G, &[1; 64]),
        ShimOp::CopyHostToDevice,
        status::BAD_ADDRESS,
    );
    refused(
        get(&shim, &s, base + G - 32, 64),
        ShimOp::CopyDeviceToHost,
        status::BAD_ADDRESS,
    );
    refused(
        fill(&shim, &s, &k, base + G - 32, 64, 1),
        ShimOp::Launch,
        status::BAD_ADDRESS,
    );
    assert_eq!(
        get(&shim, &s, base, G as usize).unwrap(),
        want[..G as usize],
        "the first granule keeps its bytes"
    );

    // Map it again at the same address: new (zeroed) memory, usable again.
    let again = shim.vm_map(DeviceAddr(base + G), G).unwrap();
    assert_ne!(again, second);
    assert_eq!(
        get(&shim, &s, base + G, G as usize).unwrap(),
        vec![0; G as usize]
    );
    let fresh = pattern(G as usize, 99);
    put(&shim, &s, base + G, &fresh).unwrap();
    let both = get(&shim, &s, base, 2 * G as usize).unwrap();
    assert_eq!(both[..G as usize], want[..G as usize]);
    assert_eq!(both[G as usize..], fresh[..]);

    // SAFETY: every copy was waited for.
    unsafe {
        shim.vm_unmap(DeviceAddr(base), G, first);
        shim.vm_unmap(DeviceAddr(base + G), G, again);
        shim.vm_release(DeviceAddr(base), 4 * G);
    }
    let st = shim.stats();
    assert_eq!(
        (
            st.device_bytes_live,
            st.vm_mapped_live,
            st.vm_reserved_live,
            st.vm_maps,
            st.vm_unmaps,
            st.vm_misuse
        ),
        (0, 0, 0, 3, 3, 0)
    );
    assert_ne!(crate::vm::live::at(base), Some(live), "released");
}

/// A mapping made in one call (several granules) is one span, and a mapping larger than a
/// granule is unmapped as one.
#[test]
fn a_mapping_of_several_granules_is_one_span() {
    let shim = shim();
    let s = shim.create_stream().unwrap();
    let base = shim.vm_reserve(3 * G).unwrap().0;
    let h = shim.vm_map(DeviceAddr(base), 3 * G).unwrap();
    let data = pattern(3 * G as usize, 3);
    put(&shim, &s, base, &data).unwrap();
    assert_eq!(get(&shim, &s, base, data.len()).unwrap(), data);
    // SAFETY: the copies were waited for.
    unsafe { shim.vm_unmap(DeviceAddr(base), 3 * G, h) };
    assert_eq!(shim.stats().device_bytes_live, 0);
    // SAFETY: nothing is mapped any more.
    unsafe { shim.vm_release(DeviceAddr(base), 3 * G) };
}

/// Every argument the contract rules out is an error status (or, for the calls that cannot
/// fail, ignored and counted as misuse), never an `mmap` over memory that is not the shim's.
#[test]
fn bad_arguments_are_refused_not_mapped() {
    let shim = shim();
    let r = ShimOp::VmReserve;
    refused(shim.vm_reserve(0), r, status::BAD_ARGUMENT);
    refused(shim.vm_reserve(G + 1), r, status::BAD_ARGUMENT);
    let a = shim.vm_reserve(2 * G).unwrap().0;
    let b = shim.vm_reserve(2 * G).unwrap().0;
    let m = ShimOp::VmMap;
    refused(shim.vm_map(DeviceAddr(a), 0), m, status::BAD_ARGUMENT);
    refused(shim.vm_map(DeviceAddr(a), G / 2), m, status::BAD_ARGUMENT);
    refused(
        shim.vm_map(DeviceAddr(a + 4096), G),
        m,
        status::BAD_ARGUMENT,
    );
    refused(shim.vm_map(DeviceAddr(a), 3 * G), m, status::BAD_ADDRESS);
    refused(
        shim.vm_map(DeviceAddr(a + G), 2 * G),
        m,
        status::BAD_ADDRESS,
    );
    // Memory the shim never reserved: a device page, a host buffer, nothing at all.
    let page = shim.device_alloc(G).unwrap();
    let page_addr = shim.device_page_addr(&page);
    let e = shim.vm_map(page_addr, G).unwrap_err();
    assert!(
        [status::BAD_ARGUMENT, status::BAD_ADDRESS].contains(&e.status),
        "a device page is not reserved address space: {e}"
    );
    let host = vec![0u8; 4 * G as usize];
    let host_at = (host.as_ptr().expose_provenance() as u64).next_multiple_of(G);
    refused(shim.vm_map(DeviceAddr(host_at), G), m, status::BAD_ADDRESS);
    refused(shim.vm_map(DeviceAddr(0), G), m, status::BAD_ADDRESS);
    refused(
        shim.vm_map(DeviceAddr(u64::MAX - G + 1), G),
        m,
        status::BAD_ADDRESS,
    );
    // Over a mapping, in whole or in part.
    let h = shim.vm_map(DeviceAddr(a), G).unwrap();
    refused(shim.vm_map(DeviceAddr(a), G), m, status::ALREADY_MAPPED);
    refused(shim.vm_map(DeviceAddr(a), 2 * G), m, status::ALREADY_MAPPED);
    assert_eq!(shim.stats().vm_maps, 1, "nothing else was mapped");
    // A span from one reservation into the next is refused even where they touch.
    let s = shim.create_stream().unwrap();
    let hb = shim.vm_map(DeviceAddr(b), G).unwrap();
    let h2 = shim.vm_map(DeviceAddr(a + G), G).unwrap();
    if a + 2 * G == b {
        refused(
            get(&shim, &s, b - 8, 16),
            ShimOp::CopyDeviceToHost,
            status::BAD_ADDRESS,
        );
    }
    // Unmaps and releases that are not exactly one mapping or one reservation: ignored.
    // SAFETY: nothing runs on the device; the wrong calls must change nothing.
    unsafe {
        shim.vm_unmap(DeviceAddr(a), G, h + 100);
        shim.vm_unmap(DeviceAddr(a), 2 * G, h);
        shim.vm_unmap(DeviceAddr(a + 4096), G, h);
        shim.vm_release(DeviceAddr(a), G);
        shim.vm_release(DeviceAddr(a + G), 2 * G);
    }
    let st = shim.stats();
    assert_eq!((st.vm_misuse, st.vm_mapped_live), (5, 3 * G));
    put(&shim, &s, a, &[9; 64]).unwrap();
    // A release with memory still mapped gives that memory back too (and counts as misuse).
    // SAFETY: nothing runs on the device.
    unsafe {
        shim.vm_unmap(DeviceAddr(b), G, hb);
        shim.vm_release(DeviceAddr(b), 2 * G);
        shim.vm_release(DeviceAddr(a), 2 * G);
        shim.device_free(page);
    }
    let st = shim.stats();
    assert_eq!(
        (
            st.vm_misuse,
            st.vm_mapped_live,
            st.device_bytes_live,
            st.vm_reserved_live
        ),
        (6, 0, 0, 0)
    );
    let _ = h2;
    drop(host);
}

/// Mapped memory counts with device pages against the total memory and the allocation budget;
/// a refused map maps nothing.
#[test]
fn maps_count_against_total_memory_and_the_budget() {
    let shim = StdShim::builder().vm_granule(G).total_memory(4 * G).build();
    let base = shim.vm_reserve(8 * G).unwrap().0;
    let m = ShimOp::VmMap;
    let e = shim.vm_map(DeviceAddr(base), 5 * G).unwrap_err();
    assert_eq!((e.status, e.fault), (status::TOO_BIG, Fault::TooBig));
    let h0 = shim.vm_map(DeviceAddr(base), 2 * G).unwrap();
    let page = shim.device_alloc(G).unwrap();
    let e = shim.vm_map(DeviceAddr(base + 2 * G), 2 * G).unwrap_err();
    assert_eq!(
        (e.op, e.status, e.fault),
        (m, status::OUT_OF_MEMORY, Fault::OutOfMemory)
    );
    assert_eq!(shim.stats().device_bytes_live, 3 * G);
    // Nothing stayed mapped: the first granule of that range maps now, and the device is full.
    let h1 = shim.vm_map(DeviceAddr(base + 2 * G), G).unwrap();
    let e = shim.device_alloc(1).unwrap_err();
    assert_eq!(e.fault, Fault::OutOfMemory);
    // The budget counts mappings too.
    // SAFETY: nothing runs on the device.
    unsafe { shim.vm_unmap(DeviceAddr(base + 2 * G), G, h1) };
    shim.set_alloc_budget(Some(3 * G));
    let e = shim.vm_map(DeviceAddr(base + 2 * G), G).unwrap_err();
    assert_eq!((e.status, e.fault), (status::BUDGET, Fault::OutOfMemory));
    shim.set_alloc_budget(None);
    let h1 = shim.vm_map(DeviceAddr(base + 2 * G), G).unwrap();
    // SAFETY: nothing runs on the device.
    unsafe {
        shim.vm_unmap(DeviceAddr(base), 2 * G, h0);
        shim.vm_unmap(DeviceAddr(base + 2 * G), G, h1);
        shim.vm_release(DeviceAddr(base), 8 * G);
        shim.device_free(page);
    }
    let st = shim.stats();
    assert_eq!((st.device_bytes_live, st.vm_misuse), (0, 0));
}

/// Injected refusals: `vm_map` is a shortage (an allocation), `vm_reserve` a plain failure;
/// neither changes anything. A loss fails later calls, and the range goes back all the same.
#[test]
fn injected_refusals_and_loss() {
    let shim = shim();
    shim.inject(Injection::nth(ShimOp::VmReserve, 1));
    let e = shim.vm_reserve(G).unwrap_err();
    assert_eq!(
        (e.status, e.fault),
        (status::injected(ShimOp::VmReserve, false), Fault::Failed)
    );
    assert_eq!(shim.stats().vm_reserved_live, 0);
    let base = shim.vm_reserve(2 * G).unwrap().0;
    let live = crate::vm::live::at(base).expect("the reservation is live");
    shim.inject(Injection::nth(ShimOp::VmMap, 1));
    let e = shim.vm_map(DeviceAddr(base), G).unwrap_err();
    assert_eq!(
        (e.status, e.fault),
        (status::injected(ShimOp::VmMap, false), Fault::OutOfMemory)
    );
    assert_eq!(shim.stats().device_bytes_live, 0);
    let h = shim.vm_map(DeviceAddr(base), G).unwrap();
    // A predicate sees the size.
    shim.inject(Injection::when(|op, size| op == ShimOp::VmMap && size == G));
    assert_eq!(
        shim.vm_map(DeviceAddr(base + G), G).unwrap_err().fault,
        Fault::OutOfMemory
    );
    shim.clear_injections();
    let s = shim.create_stream().unwrap();
    put(&shim, &s, base, &[5; 128]).unwrap();
    shim.inject(
        Injection::nth(ShimOp::VmMap, shim.stats().calls(ShimOp::VmMap) + 1).losing_device(),
    );
    let e = shim.vm_map(DeviceAddr(base + G), G).unwrap_err();
    assert_eq!(e.fault, Fault::DeviceLost);
    assert_eq!(shim.vm_reserve(G).unwrap_err().fault, Fault::DeviceLost);
    // After the loss the core frees everything at once: the calls still keep the books.
    // SAFETY: the device is lost; nothing runs.
    unsafe {
        shim.vm_unmap(DeviceAddr(base), G, h);
        shim.vm_release(DeviceAddr(base), 2 * G);
    }
    let st = shim.stats();
    assert_eq!(
        (
            st.device_bytes_live,
            st.vm_reserved_live,
            st.vm_misuse,
            st.calls(ShimOp::VmMap)
        ),
        (0, 0, 0, 4)
    );
    drop(s);
    drop(shim);
    assert!(
        crate::vm::live::at(base) != Some(live),
        "a range released after the loss goes back when the device drops"
    );
}

/// In poison mode an unmapped range is poisoned and kept readable for a while, so work the core
/// let run past the unmap reads poison instead of faulting; mapping it again gives new memory.
#[test]
fn poison_mode_keeps_unmapped_memory_readable_as_poison() {
    let shim = StdShim::builder().vm_granule(G).poison(true).build();
    let s = shim.create_stream().unwrap();
    let base = shim.vm_reserve(2 * G).unwrap().0;
    let h = shim.vm_map(DeviceAddr(base), 2 * G).unwrap();
    put(&shim, &s, base, &pattern(2 * G as usize, 1)).unwrap();
    // SAFETY: the upload was waited for.
    unsafe { shim.vm_unmap(DeviceAddr(base), 2 * G, h) };
    assert_eq!(shim.stats().quarantined_bytes, 2 * G);
    let p = std::ptr::with_exposed_provenance::<u8>(base as usize);
    // SAFETY: the quarantine keeps the range mapped and readable; nothing writes it.
    let late = unsafe { std::slice::from_raw_parts(p, 2 * G as usize) };
    assert!(late.iter().all(|&b| b == POISON_BYTE));
    refused(
        get(&shim, &s, base, 16),
        ShimOp::CopyDeviceToHost,
        status::BAD_ADDRESS,
    );
    let h = shim.vm_map(DeviceAddr(base + G), G).unwrap();
    assert_eq!(
        shim.stats().quarantined_bytes,
        0,
        "mapping over it evicts it"
    );
    assert_eq!(
        get(&shim, &s, base + G, G as usize).unwrap(),
        vec![0; G as usize]
    );
    // SAFETY: nothing runs.
    unsafe {
        shim.vm_unmap(DeviceAddr(base + G), G, h);
        shim.vm_release(DeviceAddr(base), 2 * G);
    }
    let st = shim.stats();
    assert_eq!((st.quarantined_bytes, st.device_bytes_live), (0, 0));
}

/// Mapping while a stream records is refused and invalidates the recording, as `device_alloc`
/// is; unmapping invalidates it, as `device_free` does.
#[test]
fn maps_while_recording_invalidate_the_recording() {
    let shim = shim();
    let s = shim.create_stream().unwrap();
    let base = shim.vm_reserve(2 * G).unwrap().0;
    shim.begin_capture(&s).unwrap();
    refused(
        shim.vm_map(DeviceAddr(base), G),
        ShimOp::VmMap,
        status::CAPTURE_INVALIDATED,
    );
    refused(
        shim.vm_reserve(G),
        ShimOp::VmReserve,
        status::CAPTURE_INVALIDATED,
    );
    assert_eq!(
        shim.end_capture(&s, false).unwrap_err().status,
        status::CAPTURE_INVALIDATED
    );
    let h = shim.vm_map(DeviceAddr(base), G).unwrap();
    shim.begin_capture(&s).unwrap();
    // SAFETY: nothing runs on the device.
    unsafe { shim.vm_unmap(DeviceAddr(base), G, h) };
    assert_eq!(
        shim.end_capture(&s, false).unwrap_err().status,
        status::CAPTURE_INVALIDATED
    );
    // SAFETY: nothing is mapped.
    unsafe { shim.vm_release(DeviceAddr(base), 2 * G) };
}

/// The core releases its reservations; a shim dropped with some left still unmaps them.
#[test]
fn a_dropped_shim_unmaps_the_reservations_left() {
    let shim = shim();
    let size = 5 * G;
    let base = shim.vm_reserve(size).unwrap().0;
    let _h = shim.vm_map(DeviceAddr(base), 2 * G).unwrap();
    let live = crate::vm::live::at(base).expect("the reservation is live");
    let clone = shim.clone();
    drop(shim);
    assert_eq!(
        crate::vm::live::at(base),
        Some(live),
        "a clone still holds the device"
    );
    drop(clone);
    assert_ne!(
        crate::vm::live::at(base),
        Some(live),
        "released with the last clone"
    );
}

/// Integrated devices (host pages are device memory) have virtual memory too, and both kinds of
/// device memory stay usable side by side.
#[test]
fn integrated_devices_map_too() {
    let shim = StdShim::builder().vm_granule(G).integrated(true).build();
    assert_eq!(shim.facts().vm_granule, G);
    let s = shim.create_stream().unwrap();
    let base = shim.vm_reserve(G).unwrap().0;
    let h = shim.vm_map(DeviceAddr(base), G).unwrap();
    let host = shim.host_alloc_pinned(256).unwrap();
    let host_dev = shim.host_page_device_addr(&host).unwrap();
    put(&shim, &s, base, &[3; 256]).unwrap();
    // SAFETY: both spans are device memory of 256 bytes; the wait ends the copy.
    unsafe { shim.copy_on_device(&s, DeviceAddr(base), host_dev, CopyLayout::linear(256)) }
        .unwrap();
    sync(&shim, &s).unwrap();
    assert_eq!(get(&shim, &s, host_dev.0, 256).unwrap(), vec![3; 256]);
    // SAFETY: nothing runs.
    unsafe {
        shim.host_free_pinned(host);
        shim.vm_unmap(DeviceAddr(base), G, h);
        shim.vm_release(DeviceAddr(base), G);
    }
}
