//! What handles and the return queue share between threads: two atomics and a lock. The core's
//! and `spin`'s in every build, loom's in the model tests (`cfg(loom)`, `loom_tests.rs`), so loom
//! explores every interleaving of the real code.
//!
//! Owns nothing but the choice. The identity (`handle.rs`) and the queue (`return_queue.rs`)
//! take their atomics and lock from here and nowhere else.

#[cfg(not(all(test, loom)))]
pub(crate) use core::sync::atomic::{AtomicU32, AtomicUsize};
#[cfg(all(test, loom))]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicUsize};

#[cfg(not(all(test, loom)))]
pub(crate) use spin::Mutex;

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
