//! GPU tests of virtual memory: the granule the device reports, a reservation backed granule by
//! granule and used by copies and a kernel across the boundary of two mappings, a mapping undone
//! and made again at the same address, a map the device cannot hold that leaves nothing mapped,
//! refusals before the driver, and the latency of a map and an unmap per granule (printed).
//! Like `gpu.rs`, they run for real where a CUDA driver and device are present and print a
//! visible `skipped: ...` line (straight to stderr) and pass where none is, or where the device
//! has no virtual memory management (a granule of 0).

mod common;

use common::{bytes_of, download, gpu, pattern, say, upload, wait};
use devcmd::{CopyLayout, DeviceSpan, Fault, KernelParam, LaunchDims, Shim};
use devcmd_cuda::{CudaShim, status};
use std::time::Instant;

/// Hand-written PTX (no NVRTC involved): `fill(u32* out, u32 value, u64 n)`, one word a thread.
const FILL_PTX: &str = r#"
.version 7.4
.target sm_75
.address_size 64

.visible .entry fill(
    .param .u64 out,
    .param .u32 value,
    .param .u64 n
)
{
    .reg .pred %p;
    .reg .b32 %r<5>;
    .reg .b64 %rd<6>;

    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [value];
    ld.param.u64 %rd2, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mul.wide.u32 %rd3, %r2, %r3;
    cvt.u64.u32 %rd4, %r4;
    add.u64 %rd3, %rd3, %rd4;
    setp.ge.u64 %p, %rd3, %rd2;
    @%p bra DONE;
    cvta.to.global.u64 %rd5, %rd1;
    shl.b64 %rd4, %rd3, 2;
    add.u64 %rd5, %rd5, %rd4;
    st.global.u32 [%rd5], %r1;
DONE:
    ret;
}
"#;

/// The device under test and its granule, or `None` after saying why `test` is skipped.
fn vm_gpu(test: &str) -> Option<(CudaShim, u64)> {
    let shim = gpu(test)?;
    let g = shim.facts().vm_granule;
    if g == 0 {
        say(&format!(
            "skipped: no virtual memory management on {} ({test}): vm_granule is 0",
            shim.name()
        ));
        return None;
    }
    Some((shim, g))
}

#[test]
fn the_granule_is_reported() {
    let Some(shim) = gpu("the_granule_is_reported") else {
        return;
    };
    let g = shim.facts().vm_granule;
    say(&format!(
        "device {}: {} (compute capability {:?}, driver CUDA {}): vm_granule {g} bytes ({} MiB)",
        shim.ordinal(),
        shim.name(),
        shim.compute_capability(),
        shim.driver_version(),
        g >> 20
    ));
    assert!(g == 0 || g.is_power_of_two(), "{g}");
    if shim.compute_capability().0 >= 7 && !shim.facts().integrated {
        assert!(
            g >= 64 << 10,
            "a discrete GPU of compute capability 7 or later has virtual memory management, \
             but the shim reports a granule of {g}"
        );
    }
}

#[test]
fn two_mappings_are_one_span_for_copies_and_a_kernel() {
    let test = "two_mappings_are_one_span_for_copies_and_a_kernel";
    let Some((shim, g)) = vm_gpu(test) else {
        return;
    };
    let s = shim.create_stream().unwrap();
    let base = shim.vm_reserve(4 * g).unwrap();
    assert!(base.0 != 0 && base.0.is_multiple_of(g), "{:#x}", base.0);
    let first = shim.vm_map(base, g).unwrap();
    let second = shim.vm_map(base.offset(g), g).unwrap();
    assert_ne!(first, second);

    // One upload over both mappings, read back whole and across the boundary.
    let data = pattern(2 * g as usize, 7);
    upload(&shim, &s, &data[..], base);
    assert_eq!(download::<u8>(&shim, &s, base, data.len()), data);
    let at = (g - 4096) as usize;
    assert_eq!(
        download::<u8>(&shim, &s, base.offset(at as u64), 8192),
        data[at..at + 8192]
    );
    // A device-to-device copy whose source crosses the boundary.
    // SAFETY: both spans lie in the two mappings; the wait ends the copy.
    unsafe {
        shim.copy_on_device(
            &s,
            base.offset(g - 512),
            base.offset(64),
            CopyLayout::linear(1024),
        )
    }
    .unwrap();
    wait(&shim, &s);
    let mut want = data.clone();
    want.copy_within((g - 512) as usize..(g + 512) as usize, 64);
    // A kernel whose buffer crosses the boundary: 256 words on each side.
    let module = shim.load_ptx(FILL_PTX).unwrap();
    let fill = module.kernel_with_sizes("fill", &[8, 4, 8]).unwrap();
    let (value, words) = (0x5A5A_5A5Au32, 128u64);
    let span = [DeviceSpan {
        addr: base.offset(g - 256),
        len: words * 4,
    }];
    let params = [
        KernelParam::Buffer(0),
        KernelParam::Scalar(&value.to_ne_bytes()),
        KernelParam::Scalar(&words.to_ne_bytes()),
    ];
    // SAFETY: the span lies in the two mappings; the kernel writes `words` words of it.
    unsafe {
        shim.launch(&s, &fill, LaunchDims::covering(words, 256), &span, &params)
            .unwrap()
    };
    wait(&shim, &s);
    want[(g - 256) as usize..(g + 256) as usize].fill(0x5A);
    assert_eq!(download::<u8>(&shim, &s, base, want.len()), want);

    // Unmap the second mapping and map it again at the same address: usable again, and the
    // first keeps its bytes.
    // SAFETY: every copy and kernel using it was waited for.
    unsafe { shim.vm_unmap(base.offset(g), g, second) };
    let again = shim.vm_map(base.offset(g), g).unwrap();
    let fresh = pattern(g as usize, 99);
    upload(&shim, &s, &fresh[..], base.offset(g));
    let both = download::<u8>(&shim, &s, base, 2 * g as usize);
    assert_eq!(both[..g as usize], want[..g as usize]);
    assert_eq!(both[g as usize..], fresh[..]);

    // SAFETY: every copy was waited for; then nothing is mapped in the reservation.
    unsafe {
        shim.vm_unmap(base, g, first);
        shim.vm_unmap(base.offset(g), g, again);
        shim.vm_release(base, 4 * g);
    }
    // The range can be reserved and used again after its release.
    let base = shim.vm_reserve(g).unwrap();
    let h = shim.vm_map(base, g).unwrap();
    upload(&shim, &s, bytes_of(&[1u32, 2, 3]), base);
    assert_eq!(download::<u32>(&shim, &s, base, 3), [1, 2, 3]);
    // SAFETY: waited for; then nothing is mapped.
    unsafe {
        shim.vm_unmap(base, g, h);
        shim.vm_release(base, g);
    }
}

/// A map of nearly the whole device on top of one granule already mapped: the driver has not
/// the memory (`CUDA_ERROR_OUT_OF_MEMORY`, a shortage), and nothing stays mapped (the same range
/// maps a granule at once after).
#[test]
fn a_map_the_device_cannot_hold_leaves_nothing_mapped() {
    let test = "a_map_the_device_cannot_hold_leaves_nothing_mapped";
    let Some((shim, g)) = vm_gpu(test) else {
        return;
    };
    let total = shim.facts().total_memory;
    let most = total / g * g;
    let range = total.next_multiple_of(g) + g;
    let base = shim.vm_reserve(range).unwrap();
    let first = shim.vm_map(base, g).unwrap();
    let started = Instant::now();
    let e = shim.vm_map(base.offset(g), most).unwrap_err();
    say(&format!(
        "a map of {} MiB on a device of {} MiB: {e} ({:.1} ms)",
        most >> 20,
        total >> 20,
        started.elapsed().as_secs_f64() * 1e3
    ));
    assert_eq!(
        (e.status, e.fault),
        (status::OUT_OF_MEMORY, Fault::OutOfMemory),
        "{e}"
    );
    let second = shim.vm_map(base.offset(g), g).unwrap();
    let s = shim.create_stream().unwrap();
    let data = pattern(2 * g as usize, 1);
    upload(&shim, &s, &data[..], base);
    assert_eq!(download::<u8>(&shim, &s, base, data.len()), data);
    // Too big for the device at all (whole granules past its memory): refused before the driver.
    let e = shim
        .vm_map(base.offset(2 * g), total.next_multiple_of(g) + g)
        .unwrap_err();
    assert_eq!((e.status, e.fault), (status::TOO_BIG, Fault::TooBig));
    // SAFETY: waited for; then nothing is mapped.
    unsafe {
        shim.vm_unmap(base, g, first);
        shim.vm_unmap(base.offset(g), g, second);
        shim.vm_release(base, range);
    }
}

/// Sizes and addresses that are not whole granules are refused before the driver; a map over a
/// mapping is refused by the driver, which stays usable.
#[test]
fn bad_ranges_are_refused() {
    let test = "bad_ranges_are_refused";
    let Some((shim, g)) = vm_gpu(test) else {
        return;
    };
    let bad = |e: devcmd::DriverError| {
        assert_eq!(
            (e.status, e.fault),
            (status::BAD_ARGUMENT, Fault::Failed),
            "{e}"
        );
    };
    bad(shim.vm_reserve(0).unwrap_err());
    bad(shim.vm_reserve(g + 1).unwrap_err());
    let base = shim.vm_reserve(2 * g).unwrap();
    bad(shim.vm_map(base, 0).unwrap_err());
    bad(shim.vm_map(base, g / 2).unwrap_err());
    bad(shim.vm_map(base.offset(4096), g).unwrap_err());
    let h = shim.vm_map(base, g).unwrap();
    let e = shim.vm_map(base, g).unwrap_err();
    say(&format!("a map over a mapping: {e}"));
    assert!(!e.loses_device(), "{e}");
    // Still usable.
    let s = shim.create_stream().unwrap();
    upload(&shim, &s, &[7u8; 64][..], base);
    assert_eq!(download::<u8>(&shim, &s, base, 64), [7u8; 64]);
    // SAFETY: waited for; then nothing is mapped.
    unsafe {
        shim.vm_unmap(base, g, h);
        shim.vm_release(base, 2 * g);
    }
}

/// A poisoning shim fills the range before it unmaps it (as it fills a page before freeing it).
#[test]
fn a_poisoning_shim_unmaps_too() {
    let test = "a_poisoning_shim_unmaps_too";
    let Some((shim, g)) = vm_gpu(test) else {
        return;
    };
    let shim = shim.with_poison(true);
    let s = shim.create_stream().unwrap();
    let base = shim.vm_reserve(g).unwrap();
    let h = shim.vm_map(base, g).unwrap();
    upload(&shim, &s, &pattern(g as usize, 3)[..], base);
    // SAFETY: waited for; then nothing is mapped.
    unsafe {
        shim.vm_unmap(base, g, h);
        shim.vm_release(base, g);
    }
    let base = shim.vm_reserve(g).unwrap();
    let h = shim.vm_map(base, g).unwrap();
    upload(&shim, &s, &[1u8; 16][..], base);
    assert_eq!(download::<u8>(&shim, &s, base, 16), [1u8; 16]);
    // SAFETY: as above.
    unsafe {
        shim.vm_unmap(base, g, h);
        shim.vm_release(base, g);
    }
}

/// Median of `v` (sorted in place).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// What a map and an unmap of one granule cost (the core maps granule by granule), and of
/// spans of 4, 16 and 64 granules by one call (`MemoryConfig::map_spans`), next to `cuMemAlloc`
/// + `cuMemFree` of one granule; printed, not asserted.
#[test]
fn map_and_unmap_latency_per_granule() {
    let test = "map_and_unmap_latency_per_granule";
    let Some((shim, g)) = vm_gpu(test) else {
        return;
    };
    const N: u64 = 64;
    const ROUNDS: usize = 7;
    const LENS: [u64; 4] = [1, 4, 16, 64];
    let base = shim.vm_reserve(N * g).unwrap();
    // The range mapped as `len`-granule mappings then unmapped: µs per map call and per unmap
    // call.
    let pass = |len: u64| {
        let t = Instant::now();
        let handles: Vec<u64> = (0..N / len)
            .map(|i| shim.vm_map(base.offset(i * len * g), len * g).unwrap())
            .collect();
        let map = t.elapsed().as_secs_f64() * 1e6 / (N / len) as f64;
        let t = Instant::now();
        for (i, h) in handles.into_iter().enumerate() {
            // SAFETY: nothing ever used the range.
            unsafe { shim.vm_unmap(base.offset(i as u64 * len * g), len * g, h) };
        }
        (map, t.elapsed().as_secs_f64() * 1e6 / (N / len) as f64)
    };
    // One untimed pass of each length first (the driver's first maps cost tens of times more),
    // then the lengths in turn, so a drift of the host moves them alike.
    for len in LENS {
        let _ = pass(len);
    }
    let mut times = [(); LENS.len()].map(|()| (Vec::new(), Vec::new()));
    for _ in 0..ROUNDS {
        for (k, &len) in LENS.iter().enumerate() {
            let (m, u) = pass(len);
            times[k].0.push(m);
            times[k].1.push(u);
        }
    }
    let (mut map_us, mut unmap_us) = core::mem::take(&mut times[0]);
    // Spans of several granules mapped by one call each (`MemoryConfig::map_spans`).
    let mut spans = String::new();
    for (k, &len) in LENS.iter().enumerate().skip(1) {
        let (m, u) = &mut times[k];
        spans.push_str(&format!(
            "; {len} granules by one call: map {:.1} us, unmap {:.1} us",
            median(m),
            median(u)
        ));
    }
    // SAFETY: nothing is mapped.
    unsafe { shim.vm_release(base, N * g) };
    let (mut alloc_us, mut free_us) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let pages: Vec<_> = (0..N).map(|_| shim.device_alloc(g).unwrap()).collect();
        alloc_us.push(t.elapsed().as_secs_f64() * 1e6 / N as f64);
        let t = Instant::now();
        for p in pages {
            // SAFETY: nothing used the page.
            unsafe { shim.device_free(p) };
        }
        free_us.push(t.elapsed().as_secs_f64() * 1e6 / N as f64);
    }
    say(&format!(
        "vm latency on {} (granule {} MiB, {N} granules, median of {ROUNDS} rounds): \
         map {:.1} us/granule (cuMemCreate + cuMemMap + cuMemSetAccess), unmap {:.1} us/granule \
         (cuMemUnmap + cuMemRelease){spans}; for comparison cuMemAlloc {:.1} us, cuMemFree \
         {:.1} us per {} MiB page",
        shim.name(),
        g >> 20,
        median(&mut map_us),
        median(&mut unmap_us),
        median(&mut alloc_us),
        median(&mut free_us),
        g >> 20,
    ));
}
