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
//! use devcmd::workers::CopyWorkers;
//! let workers = CopyWorkers::new(3);
//! let src: Vec<u8> = (0..4u32 << 20).map(|i| i as u8).collect();
//! let mut dst = vec![0u8; src.len()];
//! // SAFETY: both hold `src.len()` bytes and do not overlap.
//! unsafe { workers.copy(dst.as_mut_ptr(), src.as_ptr(), src.len()) };
//! assert_eq!(dst, src);
//! ```

use alloc::sync::Arc;
use alloc::vec::Vec;
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes below which a part is not worth a thread: a copy is split into parts of at least this.
pub const MIN_PART: usize = 256 << 10;

/// How long an idle thread keeps looking for the next copy before it sleeps: the pieces of a
/// pipelined upload come one after another, and a sleeping thread takes tens of microseconds to
/// wake.
const SPIN: Duration = Duration::from_micros(200);

/// One copy being split: `parts` parts of `part` bytes (the last one shorter).
#[derive(Clone, Copy)]
struct Job {
    dst: *mut u8,
    src: *const u8,
    len: usize,
    part: usize,
    parts: usize,
}

// SAFETY: a job is only read while its caller blocks in `copy`, which owns both ranges then.
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
        unsafe { core::ptr::copy_nonoverlapping(self.src.add(start), self.dst.add(start), len) }
    }
}

/// The state the threads and the caller share.
struct State {
    job: Option<Job>,
    /// Bumped for every job: a spinning thread sees new work without the lock's wake-up.
    generation: u64,
    /// The next part nobody took.
    next: usize,
    /// Parts taken and not yet finished, plus parts not yet taken.
    left: usize,
    quit: bool,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    done: Condvar,
    generation: core::sync::atomic::AtomicU64,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panicking copy cannot leave the state half-changed (only counters under the lock).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the next part of the current job, if any.
    fn take(state: &mut State) -> Option<(Job, usize)> {
        let job = state.job?;
        if state.next >= job.parts {
            return None;
        }
        state.next += 1;
        Some((job, state.next - 1))
    }

    /// Marks one part done; wakes the caller after the last.
    fn finish(&self, state: &mut State) {
        state.left -= 1;
        if state.left == 0 {
            self.done.notify_all();
        }
    }
}

/// A pool of host threads that split large host copies among them (see the module docs).
pub struct CopyWorkers {
    threads: usize,
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
    /// A pool of `threads` helper threads (the caller's thread copies a part too, so a copy runs
    /// on up to `threads + 1` threads). 0 copies on the caller's thread only.
    pub fn new(threads: usize) -> Self {
        Self {
            threads,
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    job: None,
                    generation: 0,
                    next: 0,
                    left: 0,
                    quit: false,
                }),
                work: Condvar::new(),
                done: Condvar::new(),
                generation: core::sync::atomic::AtomicU64::new(0),
            }),
            busy: Mutex::new(()),
            started: OnceLock::new(),
        }
    }

    /// Helper threads a copy may use.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// A default thread count for a host: a quarter of its cores, between 1 and 7 (a DMA engine
    /// is fed by a few threads; more only compete with the host's own work).
    pub fn default_threads() -> usize {
        std::thread::available_parallelism().map_or(1, |n| (n.get() / 4).clamp(1, 7))
    }

    /// Copies `len` bytes from `src` to `dst`, split among the threads when it is large enough
    /// (parts of at least [`MIN_PART`] bytes) and no other copy holds them; returns once every
    /// byte is copied.
    ///
    /// # Safety
    ///
    /// `src` is valid for reads and `dst` for writes of `len` bytes, the two do not overlap, and
    /// nothing else touches either until the call returns.
    pub unsafe fn copy(&self, dst: *mut u8, src: *const u8, len: usize) {
        let parts = (len / MIN_PART).min(self.threads + 1);
        let guard = if parts >= 2 {
            self.busy.try_lock().ok()
        } else {
            None
        };
        let Some(_guard) = guard else {
            // SAFETY: the caller's contract.
            unsafe { core::ptr::copy_nonoverlapping(src, dst, len) };
            return;
        };
        self.start();
        let job = Job {
            dst,
            src,
            len,
            part: len.div_ceil(parts),
            parts,
        };
        let shared = &*self.shared;
        {
            let mut st = shared.lock();
            st.job = Some(job);
            st.next = 0;
            st.left = job.parts;
            st.generation += 1;
            shared
                .generation
                .store(st.generation, core::sync::atomic::Ordering::Release);
        }
        shared.work.notify_all();
        // The caller takes parts too.
        loop {
            let mut st = shared.lock();
            let Some((job, i)) = Shared::take(&mut st) else {
                while st.left > 0 {
                    st = shared.done.wait(st).unwrap_or_else(PoisonError::into_inner);
                }
                st.job = None;
                return;
            };
            drop(st);
            // SAFETY: this caller blocks here until every part is done; part `i` is taken once.
            unsafe { job.run(i) };
            shared.finish(&mut shared.lock());
        }
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

/// A helper thread: takes parts while there are any, spins briefly for the next copy, sleeps.
fn work(shared: &Shared) {
    let mut seen = 0u64;
    loop {
        let mut st = shared.lock();
        loop {
            if st.quit {
                return;
            }
            if let Some((job, i)) = Shared::take(&mut st) {
                drop(st);
                // SAFETY: the job's caller blocks until `left` reaches 0, which needs this part.
                unsafe { job.run(i) };
                st = shared.lock();
                shared.finish(&mut st);
                seen = st.generation;
                continue;
            }
            if st.generation != seen {
                // A job whose parts others took.
                seen = st.generation;
            }
            break;
        }
        drop(st);
        // Spin for the next copy, then sleep until one comes.
        let until = Instant::now() + SPIN;
        while shared
            .generation
            .load(core::sync::atomic::Ordering::Acquire)
            == seen
            && Instant::now() < until
        {
            core::hint::spin_loop();
        }
        let mut st = shared.lock();
        while st.generation == seen && !st.quit {
            st = shared.work.wait(st).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Drop for CopyWorkers {
    fn drop(&mut self) {
        self.shared.lock().quit = true;
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
        unsafe { w.copy(dst.as_mut_ptr(), src.as_ptr(), len) };
        assert_eq!(dst, src, "{threads} threads, {len} bytes");
    }

    #[test]
    fn every_byte_arrives_whatever_the_split() {
        for threads in [0, 1, 3] {
            for len in [0, 1, MIN_PART - 1, 2 * MIN_PART + 5, 5 * MIN_PART - 1] {
                check(threads, len);
            }
        }
    }

    #[test]
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
                        unsafe { w.copy(dst.as_mut_ptr(), src.as_ptr(), len) };
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
