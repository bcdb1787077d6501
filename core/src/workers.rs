//! Host threads for staging copies, for shims that run on an OS (`std` feature).
//!
//! Owns a small pool of threads that split one host copy among them ([`CopyWorkers::copy`]):
//! what [`Shim::host_copy`](crate::Shim::host_copy) of shim-std and shim-cuda runs, so the
//! staging copy of a pipelined upload keeps up with a DMA engine one host thread cannot feed.
//! Does not own when a copy is staged or cut into pieces (`staging.rs`,
//! `command/pipeline.rs`): it copies what it is given, and returns once every byte is copied.
//!
//! One copy runs at a time; a copy asked for while another runs (a second stream's upload on
//! another thread) runs on its caller's thread alone, never waiting for the pool. Threads start
//! with the first copy large enough to split, not with the pool.
//!
//! ```
//! use devcmd::{HostCopy, workers::CopyWorkers};
//! let workers = CopyWorkers::new(3);
//! let src: Vec<u8> = (0..4u32 << 20).map(|i| i as u8).collect();
//! let mut dst = vec![0u8; src.len()];
//! // SAFETY: both hold `src.len()` bytes and do not overlap.
//! unsafe { workers.copy(dst.as_mut_ptr(), src.as_ptr(), src.len(), HostCopy::Stage) };
//! assert_eq!(dst, src);
//! ```

use crate::shim::HostCopy;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes below which a part is not worth a thread: a copy is split into parts of at least this.
pub const MIN_PART: usize = 64 << 10;

/// Copies out of a staging buffer ([`HostCopy::Unstage`]) of at least this many bytes write
/// with streaming stores where the target has them (x86-64): the caller's memory a read fills
/// is not read again soon, and bypassing the cache saves the read of every line before its
/// write. Smaller copies stay in the cache, where the next use finds them.
pub const STREAM_FROM: usize = 2 << 20;

/// Copies into a staging buffer ([`HostCopy::Stage`]) smaller than this write with streaming
/// stores: the device reads the buffer right after, and on the H200's host a DMA read of lines
/// still dirty in the copying cores' caches ran at a third of its rate; larger copies have left
/// the caches by the time the device reads them, and run faster through them (BENCHMARKS.md).
pub const STAGE_STREAM_BELOW: usize = 4 << 20;

/// How long an idle thread keeps looking for the next copy before it sleeps: the pieces of a
/// pipelined copy come one after another, and a sleeping thread takes tens of microseconds to
/// wake.
const SPIN: Duration = Duration::from_micros(300);

/// The most helper threads a pool starts, whatever it is asked for.
pub const MAX_THREADS: usize = 64;

/// Bits of [`Shared::cursor`] that count parts; the bits above hold the job's generation.
const PART_BITS: u32 = 16;

/// One copy being split: `parts` parts of `part` bytes (the last one shorter).
#[derive(Clone, Copy)]
struct Job {
    dst: *mut u8,
    src: *const u8,
    len: usize,
    part: usize,
    parts: usize,
    generation: u64,
    /// Streaming stores for every part ([`STREAM_FROM`]).
    stream: bool,
}

// SAFETY: a job is only run while its caller blocks in `copy`, which owns both ranges then.
unsafe impl Send for Job {}

impl Job {
    /// Copies part `i`.
    ///
    /// # Safety
    ///
    /// The job's caller still blocks in [`CopyWorkers::copy`]; each part is copied once.
    unsafe fn run(&self, i: usize) {
        let start = (i * self.part).min(self.len);
        let len = self.part.min(self.len - start);
        // SAFETY: `start + len <= self.len`; the caller of `copy` keeps both ranges valid and
        // untouched until every part is done, and parts do not overlap.
        unsafe { copy_bytes(self.dst.add(start), self.src.add(start), len, self.stream) }
    }
}

/// Copies `len` bytes, with streaming stores when `stream` (where the target has them).
///
/// # Safety
///
/// As `copy_nonoverlapping`.
unsafe fn copy_bytes(dst: *mut u8, src: *const u8, len: usize, stream: bool) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if stream {
        // SAFETY: the caller's contract.
        unsafe { stream_copy(dst, src, len) };
        return;
    }
    let _ = stream;
    // SAFETY: the caller's contract.
    unsafe { core::ptr::copy_nonoverlapping(src, dst, len) }
}

/// `copy_nonoverlapping` with non-temporal stores for the aligned middle, then a store fence
/// (so the bytes are visible to whoever the caller tells next, the device included).
///
/// # Safety
///
/// As `copy_nonoverlapping`.
#[cfg(all(target_arch = "x86_64", not(miri)))]
unsafe fn stream_copy(dst: *mut u8, src: *const u8, len: usize) {
    use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let head = dst.align_offset(16).min(len);
    // SAFETY: every access below lies in `src .. src + len` and
    // `dst .. dst + len` (the caller's contract); the streamed stores are to 16-byte aligned
    // addresses (`head` aligns `dst`); SSE2 is part of every x86-64 target.
    unsafe {
        core::ptr::copy_nonoverlapping(src, dst, head);
        let (mut d, mut s, mut n) = (dst.add(head), src.add(head), len - head);
        while n >= 64 {
            let a = _mm_loadu_si128(s.cast::<__m128i>());
            let b = _mm_loadu_si128(s.add(16).cast::<__m128i>());
            let c = _mm_loadu_si128(s.add(32).cast::<__m128i>());
            let e = _mm_loadu_si128(s.add(48).cast::<__m128i>());
            _mm_stream_si128(d.cast::<__m128i>(), a);
            _mm_stream_si128(d.add(16).cast::<__m128i>(), b);
            _mm_stream_si128(d.add(32).cast::<__m128i>(), c);
            _mm_stream_si128(d.add(48).cast::<__m128i>(), e);
            d = d.add(64);
            s = s.add(64);
            n -= 64;
        }
        core::ptr::copy_nonoverlapping(s, d, n);
        _mm_sfence();
    }
}

/// The state the threads and the caller share.
struct Shared {
    /// The current job (read by a thread when it sees a new generation).
    job: Mutex<Option<Job>>,
    /// The generation of the current job (above [`PART_BITS`]) and the next part nobody took
    /// (below): a thread takes a part only of the job it read, by one compare-and-swap.
    cursor: AtomicU64,
    /// Parts of the current job not finished yet.
    left: AtomicUsize,
    /// Threads asleep on `work`; `quit` asks them to exit.
    sleep: Mutex<Sleep>,
    work: Condvar,
}

struct Sleep {
    sleepers: usize,
    quit: bool,
}

impl Shared {
    /// Takes the next part of `job`, if it is still the current one and has parts left.
    fn take(&self, job: &Job) -> Option<usize> {
        let mut cur = self.cursor.load(Ordering::Acquire);
        loop {
            let (generation, next) = (cur >> PART_BITS, (cur & ((1 << PART_BITS) - 1)) as usize);
            if generation != job.generation || next >= job.parts {
                return None;
            }
            match self.cursor.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(next),
                Err(now) => cur = now,
            }
        }
    }

    /// Runs parts of `job` while there are any.
    fn help(&self, job: &Job) {
        while let Some(i) = self.take(job) {
            // SAFETY: the job's caller blocks until `left` reaches 0, which needs this part;
            // `take` hands each part out once.
            unsafe { job.run(i) };
            self.left.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn lock_sleep(&self) -> std::sync::MutexGuard<'_, Sleep> {
        // Only counters under the lock: a panic cannot leave them half-changed.
        self.sleep.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A pool of host threads that split large host copies among them (see the module docs).
pub struct CopyWorkers {
    threads: usize,
    /// [`HostCopy::Unstage`] copies of at least this many bytes use streaming stores.
    stream_from: usize,
    /// [`HostCopy::Stage`] copies below this many bytes use streaming stores.
    stage_stream_below: usize,
    shared: Arc<Shared>,
    /// Held for the whole of one split copy.
    busy: Mutex<()>,
    started: OnceLock<Vec<JoinHandle<()>>>,
}

impl core::fmt::Debug for CopyWorkers {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CopyWorkers")
            .field("threads", &self.threads)
            .finish_non_exhaustive()
    }
}

impl CopyWorkers {
    /// A pool of `threads` helper threads, at most [`MAX_THREADS`] (the caller's thread copies a
    /// part too, so a copy runs on up to `threads + 1` threads). 0 copies on the caller's thread
    /// only.
    pub fn new(threads: usize) -> Self {
        Self {
            threads: threads.min(MAX_THREADS),
            stream_from: STREAM_FROM,
            stage_stream_below: STAGE_STREAM_BELOW,
            shared: Arc::new(Shared {
                job: Mutex::new(None),
                cursor: AtomicU64::new(0),
                left: AtomicUsize::new(0),
                sleep: Mutex::new(Sleep {
                    sleepers: 0,
                    quit: false,
                }),
                work: Condvar::new(),
            }),
            busy: Mutex::new(()),
            started: OnceLock::new(),
        }
    }

    /// This pool, with streaming stores for [`HostCopy::Unstage`] copies of at least
    /// `unstage_from` bytes (default [`STREAM_FROM`]; `usize::MAX` never) and [`HostCopy::Stage`]
    /// copies below `stage_below` bytes (default [`STAGE_STREAM_BELOW`]; 0 never).
    pub fn streaming(mut self, unstage_from: usize, stage_below: usize) -> Self {
        self.stream_from = unstage_from;
        self.stage_stream_below = stage_below;
        self
    }

    /// Helper threads a copy may use.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// A default thread count for a host: half its cores less one, between 1 and 15. One host
    /// thread copies at a fraction of a DMA engine's rate on a server (5–20 GB/s against
    /// 55 GB/s on the H200's host), so it takes several; on that host 7 helpers fed the DMA
    /// engine from a 256 MiB source where 9 to 15 competed for memory and did worse
    /// (BENCHMARKS.md). They only run while a large copy does.
    pub fn default_threads() -> usize {
        std::thread::available_parallelism()
            .map_or(1, |n| (n.get() / 2).saturating_sub(1).clamp(1, 15))
    }

    /// Copies `len` bytes from `src` to `dst`, split among the threads when it is large enough
    /// (parts of at least [`MIN_PART`] bytes) and no other copy holds them; returns once every
    /// byte is copied. A [`HostCopy::Unstage`] copy of at least [`STREAM_FROM`] bytes and a
    /// [`HostCopy::Stage`] copy below [`STAGE_STREAM_BELOW`] write with streaming stores.
    ///
    /// # Safety
    ///
    /// `src` is valid for reads and `dst` for writes of `len` bytes, the two do not overlap, and
    /// nothing else touches either until the call returns.
    pub unsafe fn copy(&self, dst: *mut u8, src: *const u8, len: usize, kind: HostCopy) {
        let stream = match kind {
            HostCopy::Unstage => len >= self.stream_from,
            HostCopy::Stage => len < self.stage_stream_below,
        };
        let parts = (len / MIN_PART).min(self.threads + 1);
        let guard = if parts >= 2 {
            self.busy.try_lock().ok()
        } else {
            None
        };
        let Some(_guard) = guard else {
            // SAFETY: the caller's contract.
            unsafe { copy_bytes(dst, src, len, stream) };
            return;
        };
        self.start();
        let shared = &*self.shared;
        let generation = (shared.cursor.load(Ordering::Acquire) >> PART_BITS) + 1;
        let job = Job {
            dst,
            src,
            len,
            part: len.div_ceil(parts),
            parts,
            generation,
            stream,
        };
        *shared.job.lock().unwrap_or_else(PoisonError::into_inner) = Some(job);
        shared.left.store(parts, Ordering::Release);
        shared
            .cursor
            .store(generation << PART_BITS, Ordering::Release);
        if shared.lock_sleep().sleepers > 0 {
            shared.work.notify_all();
        }
        // The caller takes parts too, then waits for the parts others took: at most one part's
        // time, so it spins (yielding, for a host with fewer cores than threads).
        shared.help(&job);
        let mut spins = 0u32;
        while shared.left.load(Ordering::Acquire) > 0 {
            spins += 1;
            if spins.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                core::hint::spin_loop();
            }
        }
        *shared.job.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Starts the threads, once.
    fn start(&self) {
        self.started.get_or_init(|| {
            (0..self.threads)
                .filter_map(|i| {
                    let shared = Arc::clone(&self.shared);
                    std::thread::Builder::new()
                        .name(alloc::format!("devcmd-copy-{i}"))
                        .spawn(move || work(&shared))
                        // A thread the OS refuses is one helper fewer: the caller copies
                        // what no thread takes.
                        .ok()
                })
                .collect()
        });
    }
}

/// A helper thread: helps with each new job, spins briefly for the next one, then sleeps.
fn work(shared: &Shared) {
    let mut seen = 0u64;
    loop {
        let generation = shared.cursor.load(Ordering::Acquire) >> PART_BITS;
        if generation != seen {
            seen = generation;
            let job = *shared.job.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(job) = job.filter(|j| j.generation == generation) {
                shared.help(&job);
            }
            continue;
        }
        let until = Instant::now() + SPIN;
        while shared.cursor.load(Ordering::Acquire) >> PART_BITS == seen && Instant::now() < until {
            core::hint::spin_loop();
        }
        let mut sleep = shared.lock_sleep();
        if sleep.quit {
            return;
        }
        if shared.cursor.load(Ordering::Acquire) >> PART_BITS == seen {
            sleep.sleepers += 1;
            // The caller publishes the job before it looks for sleepers under this lock, so a
            // thread that counted itself here is woken.
            while shared.cursor.load(Ordering::Acquire) >> PART_BITS == seen && !sleep.quit {
                sleep = shared
                    .work
                    .wait(sleep)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            sleep.sleepers -= 1;
            if sleep.quit {
                return;
            }
        }
    }
}

impl Drop for CopyWorkers {
    fn drop(&mut self) {
        self.shared.lock_sleep().quit = true;
        self.shared.work.notify_all();
        if let Some(threads) = self.started.take() {
            for t in threads {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(threads: usize, len: usize) {
        let w = CopyWorkers::new(threads);
        let src: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        let mut dst = alloc::vec![0u8; len];
        // SAFETY: both hold `len` bytes and do not overlap.
        unsafe { w.copy(dst.as_mut_ptr(), src.as_ptr(), len, HostCopy::Unstage) };
        assert_eq!(dst, src, "{threads} threads, {len} bytes");
    }

    #[test]
    fn every_byte_arrives_whatever_the_split() {
        // Under miri (slow per byte) one split with one helper: the threads and the raw
        // pointers across them are what it checks.
        let (threads, lens): (&[usize], &[usize]) = if cfg!(miri) {
            (&[1], &[2 * MIN_PART + 5])
        } else {
            (
                &[0, 1, 3],
                &[
                    0,
                    1,
                    MIN_PART - 1,
                    2 * MIN_PART + 5,
                    5 * MIN_PART - 1,
                    3 << 20,
                ],
            )
        };
        for &t in threads {
            for &len in lens {
                check(t, len);
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "megabytes of patterns per thread: minutes under miri")]
    fn copies_from_several_threads_at_once_all_land() {
        let w = Arc::new(CopyWorkers::new(2));
        let handles: Vec<_> = (0..4)
            .map(|k| {
                let w = Arc::clone(&w);
                std::thread::spawn(move || {
                    for round in 0..8 {
                        let len = 3 * MIN_PART + k * 1000 + round;
                        let src: Vec<u8> = (0..len).map(|i| (i + k + round) as u8).collect();
                        let mut dst = alloc::vec![0u8; len];
                        // SAFETY: both hold `len` bytes and do not overlap.
                        unsafe { w.copy(dst.as_mut_ptr(), src.as_ptr(), len, HostCopy::Unstage) };
                        assert_eq!(dst, src);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}
