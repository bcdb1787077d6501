//! The atomics and the lock that a handle's return path shares between threads: the core's and
//! `spin`'s in every build, loom's in the model tests (`cfg(loom)`, `memory/loom_tests.rs`), so
//! loom explores the interleavings of the real code: the identity's counts and location
//! (`memory/handle.rs`), the return queue (`memory/return_queue.rs`) and the device's attention
//! word it rings (`attention.rs`) take theirs from here and nowhere else, and so does a retiring
//! mapping's token (`memory/retire.rs`), with its wait.
//!
//! Owns the choice only. Does not own what uses them, nor what loom cannot see: the queue's
//! `Arc` (loom does not check that memory outlives its last use; miri's runs of the core's tests
//! do) and the other atomics of the core.

#[cfg(not(all(test, loom)))]
pub(crate) use core::sync::atomic::{AtomicU8, AtomicU32, AtomicUsize};
#[cfg(all(test, loom))]
pub(crate) use loom::sync::atomic::{AtomicU8, AtomicU32, AtomicUsize};

#[cfg(not(all(test, loom)))]
pub(crate) use spin::Mutex;

/// One turn of a wait for another thread: a pause hint, or under loom a yield (a model must
/// let the other thread run, or it never ends).
#[inline(always)]
pub(crate) fn spin_wait() {
    #[cfg(not(all(test, loom)))]
    core::hint::spin_loop();
    #[cfg(all(test, loom))]
    loom::thread::yield_now();
}

/// A plain store into an atomic no other thread can see (`&mut`): `get_mut` on the core's
/// atomics, `with_mut` on loom's, which have no `get_mut`.
pub(crate) trait SetMut<T> {
    fn set_mut(&mut self, value: T);
}

macro_rules! set_mut {
    ($atomic:ty, $t:ty) => {
        impl SetMut<$t> for $atomic {
            #[inline(always)]
            fn set_mut(&mut self, value: $t) {
                #[cfg(not(all(test, loom)))]
                {
                    *self.get_mut() = value;
                }
                #[cfg(all(test, loom))]
                self.with_mut(|v| *v = value);
            }
        }
    };
}
set_mut!(AtomicU32, u32);
set_mut!(AtomicUsize, usize);

/// loom's lock with `spin`'s face: `lock` gives the guard (loom's lock is never poisoned in
/// these tests: nothing panics while holding it).
#[cfg(all(test, loom))]
#[derive(Debug)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(all(test, loom))]
impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(loom::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        self.0
            .lock()
            .expect("no test panics while holding the queue's lock")
    }
}
