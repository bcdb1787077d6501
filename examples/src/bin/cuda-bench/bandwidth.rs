//! The bandwidth section: uploads from and readbacks into ordinary (pageable) memory through
//! devcmd (the pipeline of `devcmd::staging` from 128 KiB on; below, one staging copy through
//! pinned memory, for reads copied into the caller's buffer when the future resolves) against
//! raw DMA from and into pinned memory and against the driver's own pageable path, a
//! registration kept across writes, and a sweep of the pipeline's settings (host copy threads,
//! piece size, ring depth).
//!
//! Cached against evicted sources (BENCHMARKS.md, the issue 18 section). The main table's
//! uploads of 256 MiB and 1 GiB ran at about 0.40 of raw pinned while the sweep's ran at
//! 0.75–0.95 at 256 MiB; the likely difference is whether the source is still in the host's
//! last-level cache (300 MiB on the H200's host) when it is uploaded: in the sweep only devcmd's
//! readbacks (streaming stores from 2 MiB) run between two uploads, in the main table the rows
//! staged by hand (ordinary copies into and out of a pinned page of the same size) come before
//! each upload. So from 16 MiB
//! ([`CACHE_ROWS_FROM`]) each round times the same upload loop twice more (`devcmd_upload`, the
//! main row's own function, same reps), reported in a table of their own as ratios to the same
//! raw pinned median: "again", right after the main row's loop (the source as that loop left it
//! in the caches), and "evicted", after every core wrote its share of a 1 GiB scratch buffer
//! with ordinary stores ([`Evictor`]). The eviction precedes the loop only: its first write
//! reads the source from DRAM, later ones find whatever of it the loop left in the caches
//! (likely all of it at 16–64 MiB, whose loops run 64 and 16 writes; none of 1 GiB).
//!
//! `CUDA_BENCH_COPY_THREADS=7,11,15`: after the main table, the evicted upload and the readback
//! again at the same sizes on a device of each helper thread count (`with_copy_threads`, as the
//! sweep builds its devices), against raw pinned measured beside: whether more threads help an
//! upload bound by the host's DRAM.

use super::{Res, Rounds, S, bind, cu, gbps, human, median, met, sync};
use devcmd::staging::StagingPolicy;
use devcmd::{
    Device, DeviceConfig, ExternalBytes, HostBuffer, HostCopy, HostOrigin, ReadRequest, Shim,
};
use devcmd_cuda::{CudaShim, CudaStream, sys};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

/// Caller's bytes shared with the benchmark, for `Device::register_host`.
struct SharedBytes(Arc<Vec<u8>>);

// SAFETY: the vector is never modified while any clone of the `Arc` lives (the benchmark only
// reads it), so every call returns the same slice, alive until the value drops.
unsafe impl ExternalBytes for SharedBytes {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
    fn origin(&self) -> HostOrigin {
        HostOrigin::Heap
    }
}

/// Raw memory of one size: a device page, a pinned page and pageable bytes, freed on drop.
struct Raw<'a> {
    shim: &'a CudaShim,
    stream: &'a CudaStream,
    size: usize,
    dev: sys::CUdeviceptr,
    pin: *mut u8,
    page: Option<<CudaShim as Shim>::DevicePage>,
    pinned: Option<<CudaShim as Shim>::HostPage>,
}

impl<'a> Raw<'a> {
    fn new(shim: &'a CudaShim, stream: &'a CudaStream, data: &[u8]) -> Res<Self> {
        let size = data.len();
        let pinned = shim.host_alloc_pinned(size)?;
        let pin = shim.host_page_ptr(&pinned).as_ptr();
        // SAFETY: the page holds `size` bytes, written here only.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), pin, size) };
        let page = shim.device_alloc(size as u64)?;
        let dev = shim.device_page_addr(&page).0;
        Ok(Self {
            shim,
            stream,
            size,
            dev,
            pin,
            page: Some(page),
            pinned: Some(pinned),
        })
    }

    /// `reps` uploads from `src` (pinned or pageable), one synchronisation after them: GB/s.
    fn upload(&self, src: *const u8, reps: usize) -> Res<f64> {
        bind(self.shim)?;
        let t = Instant::now();
        for _ in 0..reps {
            // SAFETY: both ranges hold `size` bytes and stay alive past the sync below.
            cu("cuMemcpyHtoDAsync", unsafe {
                sys::cuMemcpyHtoDAsync_v2(self.dev, src.cast(), self.size, self.stream.cu_stream())
            })?;
        }
        sync(self.stream)?;
        Ok(gbps(self.size * reps, t.elapsed()))
    }

    /// `reps` uploads of `src` (pageable) staged by hand: the shim's host copy into the pinned
    /// page, then the DMA from it, each synchronised (the next copy reuses the page): the
    /// unpipelined bound a staged upload should not cost more than. GB/s.
    fn upload_staged(&self, src: *const u8, reps: usize) -> Res<f64> {
        bind(self.shim)?;
        let t = Instant::now();
        for _ in 0..reps {
            // SAFETY: both hold `size` bytes, separate allocations; the page is idle (the last
            // DMA from it was synchronised).
            unsafe {
                self.shim
                    .host_copy(self.pin, src, self.size, HostCopy::Stage)
            };
            // SAFETY: both ranges hold `size` bytes; synchronised before the page is reused.
            cu("cuMemcpyHtoDAsync", unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    self.dev,
                    self.pin.cast(),
                    self.size,
                    self.stream.cu_stream(),
                )
            })?;
            sync(self.stream)?;
        }
        Ok(gbps(self.size * reps, t.elapsed()))
    }

    /// `reps` readbacks into `dst` (pageable) staged by hand: the DMA into the pinned page,
    /// synchronised, then the shim's host copy out of it: the bound a staged read should not
    /// cost more than. GB/s.
    fn readback_staged(&self, dst: *mut u8, reps: usize) -> Res<f64> {
        bind(self.shim)?;
        let t = Instant::now();
        for _ in 0..reps {
            // SAFETY: both ranges hold `size` bytes; synchronised before the page is read.
            cu("cuMemcpyDtoHAsync", unsafe {
                sys::cuMemcpyDtoHAsync_v2(
                    self.pin.cast(),
                    self.dev,
                    self.size,
                    self.stream.cu_stream(),
                )
            })?;
            sync(self.stream)?;
            // SAFETY: both hold `size` bytes, separate allocations; the DMA into the page is done.
            unsafe {
                self.shim
                    .host_copy(dst, self.pin, self.size, HostCopy::Unstage)
            };
        }
        Ok(gbps(self.size * reps, t.elapsed()))
    }

    /// `reps` readbacks into `dst` (pinned or pageable), each synchronised: GB/s.
    fn readback(&self, dst: *mut u8, reps: usize) -> Res<f64> {
        bind(self.shim)?;
        let t = Instant::now();
        for _ in 0..reps {
            // SAFETY: both ranges hold `size` bytes; synchronised before the next copy.
            cu("cuMemcpyDtoHAsync", unsafe {
                sys::cuMemcpyDtoHAsync_v2(dst.cast(), self.dev, self.size, self.stream.cu_stream())
            })?;
            sync(self.stream)?;
        }
        Ok(gbps(self.size * reps, t.elapsed()))
    }
}

impl Drop for Raw<'_> {
    fn drop(&mut self) {
        let _ = sync(self.stream);
        // SAFETY: the stream was synchronised after the last copy that used them.
        unsafe {
            if let Some(p) = self.page.take() {
                self.shim.device_free(p);
            }
            if let Some(p) = self.pinned.take() {
                self.shim.host_free_pinned(p);
            }
        }
    }
}

/// Copies of `size` bytes that move about 1 GiB, at least 4 and at most 2000.
fn reps_for(size: usize) -> usize {
    ((1usize << 30) / size).clamp(4, 2000)
}

/// The sizes from which the main table's rounds time the "again" and "evicted" uploads, and the
/// sizes of the helper thread table.
const CACHE_ROWS_FROM: usize = 16 << 20;

/// A scratch buffer larger than the host's last-level cache (300 MiB on the H200's host),
/// allocated once: writing it evicts an upload's source from the caches.
struct Evictor(Vec<u64>);

impl Evictor {
    const BYTES: usize = 1 << 30;

    fn new() -> Self {
        Self(vec![0; Self::BYTES / 8])
    }

    /// Every word read and written back changed, with ordinary loads and stores (no `memset`,
    /// which streams past the caches at this size), split among the host's cores so their own
    /// caches are emptied as well as the shared one.
    fn evict(&mut self) {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let part = self.0.len().div_ceil(cores);
        std::thread::scope(|s| {
            for words in self.0.chunks_mut(part) {
                s.spawn(move || {
                    for w in words.iter_mut() {
                        *w = w.wrapping_add(1);
                    }
                    black_box(words);
                });
            }
        });
    }
}

fn pattern(size: usize) -> Vec<u8> {
    (0..size)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(7))
        .collect()
}

/// devcmd's upload on `device`: `reps` times `write_from` of `data`, one sync after them: GB/s.
fn devcmd_upload(
    device: &mut Device<CudaShim>,
    h: &devcmd::Handle,
    data: &[u8],
    reps: usize,
) -> Res<f64> {
    let mut cmd = device.command(S)?;
    let t = Instant::now();
    for _ in 0..reps {
        cmd.write_from(h, data)?;
    }
    cmd.sync()?.wait()?;
    Ok(gbps(data.len() * reps, t.elapsed()))
}

/// devcmd's readback on `device`: `reps` times `read_to` of `h` into the kept heap buffer
/// `back`, each waited for: GB/s.
fn devcmd_readback(
    device: &mut Device<CudaShim>,
    h: &devcmd::Handle,
    back: &mut Option<HostBuffer>,
    reps: usize,
) -> Res<f64> {
    let mut cmd = device.command(S)?;
    let t = Instant::now();
    let mut size = 0;
    for _ in 0..reps {
        let buffer = back.take().ok_or("the readback buffer is kept")?;
        size = buffer.len();
        *back = Some(cmd.read_to(ReadRequest::whole(h), buffer)?.wait()?);
    }
    Ok(gbps(size * reps, t.elapsed()))
}

/// devcmd's rates on `device` for `data`: (upload, readback), GB/s.
fn devcmd_rates(
    device: &mut Device<CudaShim>,
    h: &devcmd::Handle,
    data: &[u8],
    back: &mut Option<HostBuffer>,
    reps: usize,
) -> Res<(f64, f64)> {
    let up = devcmd_upload(device, h, data, reps)?;
    Ok((up, devcmd_readback(device, h, back, reps)?))
}

/// Upload and readback bandwidth (see the module documentation).
pub(super) fn bandwidth(shim: &CudaShim, rounds: Rounds, quick: bool) -> Res<()> {
    let asked = sizes_asked()?;
    let copy_threads = copy_threads_asked()?;
    let sizes: &[usize] = if let Some(asked) = &asked {
        asked
    } else if quick {
        &[4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
    } else {
        &[
            4 << 10,
            64 << 10,
            256 << 10,
            1 << 20,
            4 << 20,
            16 << 20,
            64 << 20,
            256 << 20,
            1 << 30,
        ]
    };
    let policy = StagingPolicy::default();
    let threads = devcmd::workers::CopyWorkers::default_threads();
    let mut device = Device::new(shim.clone(), DeviceConfig::default());
    let stream = shim.create_stream()?;
    let mut evictor = sizes
        .iter()
        .any(|&s| s >= CACHE_ROWS_FROM)
        .then(Evictor::new);
    println!(
        "## Upload and readback bandwidth, GB/s (median of {} rounds after {})\n",
        rounds.timed, rounds.warm
    );
    println!(
        "Upload: `Command::write_from` of pageable bytes, then one sync, against raw \
         `cuMemcpyHtoDAsync` from pinned memory (\"raw pinned\") and from the same pageable \
         bytes (\"raw pageable\", the driver's own staging), each synchronised once after the \
         loop. \"kept registration\": the bytes registered once (`Device::register_host`), \
         then `Command::write` of a `HostBuffer::share` of them per copy. Readback: \
         `Command::read_to` into a kept heap buffer, waited for, against raw \
         `cuMemcpyDtoHAsync` into pinned and into pageable memory + `cuStreamSynchronize`, per \
         copy. devcmd runs its defaults: copies of at least {} are pipelined through a ring of {} \
         pinned buffers of {} per stream (pieces of that size), the host copies on {} helper threads (`CopyWorkers::default_threads` on this \
         host) besides the caller's; smaller ones go through pinned memory once (a read lands \
         there and is copied into the caller's buffer when its future resolves).\n",
        human(policy.pipeline_from as usize),
        policy.depth,
        human(policy.chunk as usize),
        threads
    );
    println!(
        "| size | upload: devcmd | raw pinned | raw pageable | devcmd / pinned | devcmd / pageable | kept registration | kept / pinned | readback: devcmd | raw pinned | raw pageable | devcmd / pinned | devcmd / pageable |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut missed = Vec::new();
    let mut bounds = Vec::new();
    let mut cache_rows = Vec::new();
    let mut pinned_peak = 0u64;
    for &size in sizes {
        let reps = reps_for(size);
        let data = pattern(size);
        // The registered copy is its own allocation: registering `data` would make the raw
        // pageable rows pinned ones.
        let kept_bytes = Arc::new(data.clone());
        let kept = device.register_host(Box::new(SharedBytes(Arc::clone(&kept_bytes))));
        if kept.origin() != HostOrigin::Registered {
            return Err(format!("{}: the bytes could not be registered", human(size)).into());
        }
        let mut back_raw = vec![0u8; size];
        let raw = Raw::new(shim, &stream, &data)?;
        let h = device.command(S)?.empty(size as u64)?;
        let mut back = Some(HostBuffer::try_zeroed(size)?);
        let mut cols: [Vec<f64>; 9] = Default::default();
        // The "again" and "evicted" uploads (from CACHE_ROWS_FROM; the module documentation).
        let (mut again, mut evicted) = (Vec::new(), Vec::new());
        let mut cache = if size >= CACHE_ROWS_FROM {
            evictor.as_mut()
        } else {
            None
        };
        for round in 0..rounds.all() {
            let pinned_up = raw.upload(raw.pin, reps)?;
            let up = devcmd_upload(&mut device, &h, &data, reps)?;
            let again_up = match cache {
                Some(_) => devcmd_upload(&mut device, &h, &data, reps)?,
                None => f64::NAN,
            };
            let down = devcmd_readback(&mut device, &h, &mut back, reps)?;
            // After the readback, so devcmd's main rows follow what they followed before this
            // table (the readback an upload of the same bytes, the upload the rows by hand).
            let evicted_up = match &mut cache {
                Some(e) => {
                    e.evict();
                    devcmd_upload(&mut device, &h, &data, reps)?
                }
                None => f64::NAN,
            };
            let pageable_up = raw.upload(data.as_ptr(), reps)?;
            let mut cmd = device.command(S)?;
            let t = Instant::now();
            for _ in 0..reps {
                cmd.write(&h, kept.share().ok_or("a registered buffer shares")?)?;
            }
            cmd.sync()?.wait()?;
            let kept_up = gbps(size * reps, t.elapsed());
            let pinned_down = raw.readback(raw.pin, reps)?;
            let pageable_down = raw.readback(back_raw.as_mut_ptr(), reps)?;
            let staged_up = raw.upload_staged(data.as_ptr(), reps)?;
            let staged_down = raw.readback_staged(back_raw.as_mut_ptr(), reps)?;
            if round >= rounds.warm {
                again.push(again_up);
                evicted.push(evicted_up);
                for (c, v) in cols.iter_mut().zip([
                    up,
                    pinned_up,
                    pageable_up,
                    kept_up,
                    down,
                    pinned_down,
                    pageable_down,
                    staged_up,
                    staged_down,
                ]) {
                    c.push(v);
                }
            }
        }
        // The bytes made it both ways.
        device.command(S)?.write_from(&h, &data)?;
        let got = device
            .command(S)?
            .read_to(ReadRequest::whole(&h), back.take().ok_or("kept")?)?
            .wait()?;
        if got.as_slice() != data.as_slice() || back_raw != data {
            return Err(format!(
                "{}: the bytes read back differ from those written",
                human(size)
            )
            .into());
        }
        pinned_peak = pinned_peak.max(device.memory_report().pinned_host);
        drop((kept, h, raw));
        let m: Vec<f64> = cols.iter().map(|c| median(c)).collect();
        let (up_p, up_pg, kept_p) = (m[0] / m[1], m[0] / m[2], m[3] / m[1]);
        let (down_p, down_pg) = (m[4] / m[5], m[4] / m[6]);
        let big = size >= 16 << 20;
        let small = (64 << 10..=1 << 20).contains(&size);
        if (big && (up_p < 0.9 || down_p < 0.9 || up_pg < 3.0 || down_pg < 3.0))
            || (small && (up_p < 0.8 || down_p < 0.8))
            || (size >= 64 << 10 && kept_p < 0.95)
        {
            missed.push(human(size));
        }
        if cache.is_some() {
            cache_rows.push(format!(
                "| {} | {up_p:.2} | {:.2} | {:.2} |",
                human(size),
                median(&again) / m[1],
                median(&evicted) / m[1]
            ));
        }
        bounds.push(format!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            human(size),
            m[0],
            m[7],
            m[0] / m[7],
            m[4],
            m[8],
            m[4] / m[8]
        ));
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {up_p:.2} | {up_pg:.2} | {:.2} | {kept_p:.2} | {:.2} | {:.2} | {:.2} | {down_p:.2} | {down_pg:.2} |",
            human(size),
            m[0],
            m[1],
            m[2],
            m[3],
            m[4],
            m[5],
            m[6]
        );
    }
    println!(
        "\nPinned host memory held by stream 0's pool at most (the ring and the staging of small \
         copies): {}.\n",
        human(pinned_peak as usize)
    );
    println!(
        "Targets: ≥ 0.90× raw pinned and ≥ 3× raw pageable at ≥ 16 MiB both ways, ≥ 0.80× raw \
         pinned at 64 KiB–1 MiB both ways, kept registration ≥ 0.95× raw pinned from 64 KiB: {}{}\n",
        met(missed.is_empty()),
        if missed.is_empty() {
            String::new()
        } else {
            format!(" (missed at {})", missed.join(", "))
        }
    );
    println!(
        "Against staging by hand (same rounds): the shim's host copy into a pinned page, then \
         the DMA from it, synchronised per copy (upload); the DMA into the pinned page, \
         synchronised, then the host copy out (readback). A staged copy should cost no more \
         than these (issue 18), GB/s:\n"
    );
    println!(
        "| size | upload: devcmd | by hand | devcmd / by hand | readback: devcmd | by hand | devcmd / by hand |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for row in &bounds {
        println!("{row}");
    }
    println!();
    if !cache_rows.is_empty() {
        println!(
            "The source cached or evicted (same rounds, ratios to the raw pinned upload above): \
             the main row's upload loop timed again right after it (\"again\"), and after every \
             core wrote its share of a {} scratch buffer with ordinary stores, more than the \
             host's last-level cache (\"evicted\"; the loop's later writes may find the source \
             cached again). The main row's upload follows the previous round's rows staged by \
             hand.\n",
            human(Evictor::BYTES)
        );
        println!("| size | devcmd / pinned | again / pinned | evicted / pinned |");
        println!("|---:|---:|---:|---:|");
        for row in &cache_rows {
            println!("{row}");
        }
        println!();
    }
    if let (Some(threads), Some(evictor)) = (&copy_threads, &mut evictor) {
        let big: Vec<usize> = sizes
            .iter()
            .copied()
            .filter(|&s| s >= CACHE_ROWS_FROM)
            .collect();
        thread_counts(shim, &mut device, &stream, rounds, &big, threads, evictor)?;
    }
    if asked.is_some() {
        // A chosen set of sizes is a probe of the main table: no host copy table, no sweep.
        return Ok(());
    }
    host_copies(shim, quick)?;
    sweep(shim, &stream, quick)
}

/// `CUDA_BENCH_SIZES`: the main table's sizes in KiB, comma-separated (`256,1024,262144`), to
/// probe a few of them alone; unset, the full list.
fn sizes_asked() -> Res<Option<Vec<usize>>> {
    let Ok(list) = std::env::var("CUDA_BENCH_SIZES") else {
        return Ok(None);
    };
    list.split(',')
        .map(|k| match k.trim().parse::<usize>() {
            Ok(kib) if kib > 0 => Ok(kib << 10),
            _ => Err(format!(
                "CUDA_BENCH_SIZES={list}: `{k}` is no size; give sizes in KiB, comma-separated \
                 (256,1024)"
            )
            .into()),
        })
        .collect::<Res<Vec<_>>>()
        .map(Some)
}

/// Which device a row of the thread-count table runs on.
#[derive(Clone, Copy)]
enum Helpers {
    /// A new device over the shim with this many helper threads of its own.
    Count(usize),
    /// A new device over the shim and its own pool (the one the main table's device shares).
    ShimPool,
    /// The main table's device itself, after the table.
    Main,
}

/// `CUDA_BENCH_COPY_THREADS`: helper thread counts, comma-separated (`7,11,15`), for the table
/// of evicted uploads by thread count, with `shim` for a new device over the shim's own pool and
/// `main` for the main table's device; unset, no such table.
fn copy_threads_asked() -> Res<Option<Vec<Helpers>>> {
    let Ok(list) = std::env::var("CUDA_BENCH_COPY_THREADS") else {
        return Ok(None);
    };
    list.split(',')
        .map(|n| match (n.trim(), n.trim().parse::<usize>()) {
            ("shim", _) => Ok(Helpers::ShimPool),
            ("main", _) => Ok(Helpers::Main),
            (_, Ok(n)) if n <= devcmd::workers::MAX_THREADS => Ok(Helpers::Count(n)),
            _ => Err(format!(
                "CUDA_BENCH_COPY_THREADS={list}: `{n}` is no thread count; give counts of 0 to \
                 {}, `shim` or `main`, comma-separated (7,11,15,shim,main)",
                devcmd::workers::MAX_THREADS
            )
            .into()),
        })
        .collect::<Res<Vec<_>>>()
        .map(Some)
}

/// The evicted upload (the main table's "evicted" row) and the readback at `sizes` on a device
/// of each helper thread count in `threads`, against raw pinned DMA measured in the same rounds:
/// whether more threads help an upload whose source comes from the host's DRAM.
fn thread_counts(
    shim: &CudaShim,
    main: &mut Device<CudaShim>,
    stream: &CudaStream,
    rounds: Rounds,
    sizes: &[usize],
    threads: &[Helpers],
    evictor: &mut Evictor,
) -> Res<()> {
    if sizes.is_empty() {
        return Ok(());
    }
    println!(
        "### Helper threads against an evicted source (`CUDA_BENCH_COPY_THREADS`; median of {} \
         rounds after {})\n",
        rounds.timed, rounds.warm
    );
    println!(
        "Per round: raw pinned upload, the scratch written, devcmd's upload loop (as \"evicted\" \
         above), devcmd's readback, raw pinned readback; a new device per thread count \
         (`CudaShim::with_copy_threads`), a new device over the shim's own pool (`shim`), or \
         the main table's device (`main`); default staging policy.\n"
    );
    println!("| helper threads | size | evicted upload / pinned | readback / pinned |");
    println!("|---:|---:|---:|---:|");
    for &size in sizes {
        let reps = reps_for(size);
        let data = pattern(size);
        let raw = Raw::new(shim, stream, &data)?;
        for &n in threads {
            let mut fresh = match n {
                Helpers::Count(n) => Some(shim.clone().with_copy_threads(n)),
                Helpers::ShimPool => Some(shim.clone()),
                Helpers::Main => None,
            }
            .map(|shim| Device::new(shim, DeviceConfig::default()));
            let device = fresh.as_mut().unwrap_or(&mut *main);
            let h = device.command(S)?.empty(size as u64)?;
            let mut back = Some(HostBuffer::try_zeroed(size)?);
            let mut cols: [Vec<f64>; 4] = Default::default();
            for round in 0..rounds.all() {
                let pinned_up = raw.upload(raw.pin, reps)?;
                evictor.evict();
                let up = devcmd_upload(device, &h, &data, reps)?;
                let down = devcmd_readback(device, &h, &mut back, reps)?;
                let pinned_down = raw.readback(raw.pin, reps)?;
                if round >= rounds.warm {
                    for (c, v) in cols.iter_mut().zip([up, pinned_up, down, pinned_down]) {
                        c.push(v);
                    }
                }
            }
            let m: Vec<f64> = cols.iter().map(|c| median(c)).collect();
            let label = match n {
                Helpers::Count(n) => n.to_string(),
                Helpers::ShimPool => "the shim's pool, new device".into(),
                Helpers::Main => "the main table's device".into(),
            };
            println!(
                "| {label} | {} | {:.2} | {:.2} |",
                human(size),
                m[0] / m[1],
                m[2] / m[3]
            );
        }
    }
    println!();
    Ok(())
}

/// The host copy alone (`CopyWorkers::copy`) from pageable memory into pinned memory: threads,
/// streaming stores or not, into one pinned buffer or four in turn (as the ring does).
fn host_copies(shim: &CudaShim, quick: bool) -> Res<()> {
    use devcmd::HostCopy;
    use devcmd::workers::CopyWorkers;
    const ROUNDS: usize = 3;
    let sizes: &[usize] = if quick {
        &[1 << 20, 8 << 20]
    } else {
        &[1 << 20, 8 << 20, 64 << 20]
    };
    println!(
        "### The staging copy alone, pageable into pinned memory, GB/s (median of {ROUNDS})\n"
    );
    println!("| bytes | helper threads | streaming stores | into | GB/s |");
    println!("|---:|---:|---|---|---:|");
    let biggest = *sizes.last().unwrap_or(&0);
    let src = pattern(biggest);
    let pages = (0..4)
        .map(|_| shim.host_alloc_pinned(biggest))
        .collect::<Result<Vec<_>, _>>()?;
    for &size in sizes {
        let reps = reps_for(size).min(512);
        for threads in [0, 7, 11] {
            for stream in [false, true] {
                let w = CopyWorkers::new(threads).streaming(if stream { 0 } else { usize::MAX }, 0);
                for rotate in [1usize, 4] {
                    let mut rates = Vec::new();
                    for _ in 0..ROUNDS {
                        let t = Instant::now();
                        for r in 0..reps {
                            let dst = shim.host_page_ptr(&pages[r % rotate]).as_ptr();
                            // SAFETY: the page holds `biggest >= size` bytes, used by nothing
                            // else; `src` holds as many.
                            unsafe { w.copy(dst, src.as_ptr(), size, HostCopy::Unstage) };
                        }
                        rates.push(gbps(size * reps, t.elapsed()));
                    }
                    println!(
                        "| {} | {threads} | {} | {} | {:.2} |",
                        human(size),
                        if stream { "yes" } else { "no" },
                        if rotate == 1 {
                            "one buffer"
                        } else {
                            "four in turn"
                        },
                        median(&rates)
                    );
                }
            }
        }
    }
    for p in pages {
        // SAFETY: no copy uses the pages any more (the host copies above returned).
        unsafe { shim.host_free_pinned(p) };
    }
    println!();
    Ok(())
}

/// One setting of the sweep: host copy threads, and the staging policy.
struct Setting {
    threads: usize,
    policy: StagingPolicy,
}

/// The settings swept at `size`: below 2 MiB, the pipeline against one staging copy (the path
/// below `pipeline_from`), with and without helper threads; from 2 MiB, threads, piece size and
/// ring depth.
fn settings(size: usize, quick: bool) -> Vec<Setting> {
    let base = StagingPolicy::default();
    let mut out = Vec::new();
    if size < 2 << 20 {
        for pipeline_from in [1, u64::MAX] {
            for threads in [0, devcmd::workers::CopyWorkers::default_threads()] {
                out.push(Setting {
                    threads,
                    policy: StagingPolicy {
                        pipeline_from,
                        ..base
                    },
                });
            }
        }
        return out;
    }
    let threads: &[usize] = if quick {
        &[11]
    } else {
        &[7, devcmd::workers::CopyWorkers::default_threads()]
    };
    for &threads in threads {
        for (chunk, depth) in [
            (1u64 << 20, 8),
            (2 << 20, 8),
            (4 << 20, 4),
            (4 << 20, 8),
            (8 << 20, 8),
        ] {
            out.push(Setting {
                threads,
                policy: StagingPolicy {
                    chunk,
                    depth,
                    ..base
                },
            });
        }
    }
    out
}

/// The pipeline's settings swept at a few sizes: which host copy threads, piece size and ring
/// depth reach the DMA engine's rate, and whether small copies gain from the pipeline.
fn sweep(shim: &CudaShim, stream: &CudaStream, quick: bool) -> Res<()> {
    let sizes: &[usize] = if quick {
        &[1 << 20, 64 << 20]
    } else {
        &[64 << 10, 1 << 20, 16 << 20, 256 << 20]
    };
    const ROUNDS: usize = 3;
    println!(
        "### The pipeline's settings (median of {ROUNDS} rounds; ratios to raw pinned DMA measured beside)\n"
    );
    println!(
        "| size | pipelined | host copy threads | piece | ring depth | ring holds | upload GB/s | / pinned | readback GB/s | / pinned |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &size in sizes {
        let reps = reps_for(size).min(256);
        let data = pattern(size);
        let raw = Raw::new(shim, stream, &data)?;
        let mut pin_up = Vec::new();
        let mut pin_down = Vec::new();
        for _ in 0..ROUNDS {
            pin_up.push(raw.upload(raw.pin, reps)?);
            pin_down.push(raw.readback(raw.pin, reps)?);
        }
        let (pin_up, pin_down) = (median(&pin_up), median(&pin_down));
        drop(raw);
        for Setting { threads, policy } in settings(size, quick) {
            let config = DeviceConfig {
                staging: policy,
                ..DeviceConfig::default()
            };
            let mut device = Device::new(shim.clone().with_copy_threads(threads), config);
            let h = device.command(S)?.empty(size as u64)?;
            let mut back = Some(HostBuffer::try_zeroed(size)?);
            let (mut ups, mut downs) = (Vec::new(), Vec::new());
            // One warm-up round fills the ring and the pools.
            devcmd_rates(&mut device, &h, &data, &mut back, reps.min(8))?;
            for _ in 0..ROUNDS {
                let (u, d) = devcmd_rates(&mut device, &h, &data, &mut back, reps)?;
                ups.push(u);
                downs.push(d);
            }
            let (u, d) = (median(&ups), median(&downs));
            let pipelined = policy.pipelines(size as u64);
            let held = if pipelined {
                human((policy.chunk * u64::from(policy.depth)) as usize)
            } else {
                "-".into()
            };
            println!(
                "| {} | {} | {threads} | {} | {} | {held} | {u:.2} | {:.2} | {d:.2} | {:.2} |",
                human(size),
                if pipelined { "yes" } else { "no" },
                human(policy.chunk as usize),
                policy.depth,
                u / pin_up,
                d / pin_down
            );
        }
    }
    println!();
    Ok(())
}
