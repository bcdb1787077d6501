//! Host buffers: bytes on the host side of a copy, and where they come from.
//!
//! Owns the ownership of those bytes until the device is done with them (they travel through the
//! drop queue). Does not own the pinned pool they may be carved from (`pinned.rs`).

use crate::memory::Handle;
use alloc::boxed::Box;
use alloc::vec::Vec;
use core::fmt;
use core::ptr::NonNull;

/// Where a host buffer's bytes live. Decides how a copy from it is staged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum HostOrigin {
    /// Ordinary heap memory.
    Heap,
    /// Pinned (page-locked) memory: the device reads it by DMA, no staging needed.
    Pinned,
    /// A memory-mapped file: it may still page-fault while the device reads it, so it is
    /// always staged.
    FileMapped,
}

/// Bytes owned by the caller that the core may hand to a copy (a memory-mapped file, a buffer of
/// the caller's own allocator).
///
/// # Safety
///
/// The device may read the bytes asynchronously until the value is dropped, through the address
/// the first call of [`ExternalBytes::bytes`] returned. So every call must return the same
/// slice (same address, same length), and its bytes must stay alive and unchanged until the value
/// is dropped.
pub unsafe trait ExternalBytes: Send {
    /// The bytes.
    fn bytes(&self) -> &[u8];
    /// Where they live.
    fn origin(&self) -> HostOrigin;
}

/// What keeps the bytes alive; the variants are held for their drop, not read.
#[allow(dead_code)]
enum Backing {
    Heap(Vec<u8>),
    /// A slice of a stream's pinned pool; dropping the handle returns it.
    Pinned(Handle),
    External(Box<dyn ExternalBytes>),
}

/// A host buffer for copies. Its address does not change while it lives, so a copy enqueued from
/// or into it stays valid as long as the buffer is kept (the drop queue keeps it).
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    origin: HostOrigin,
    backing: Backing,
}

// SAFETY: the buffer owns its bytes exclusively (heap vector, pinned slice held by its handle,
// or an `ExternalBytes` that is `Send`); the raw pointer only caches their address.
unsafe impl Send for HostBuffer {}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("len", &self.len)
            .field("origin", &self.origin)
            .finish()
    }
}

impl HostBuffer {
    /// A heap buffer of `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        Self::from_vec(alloc::vec![0; len])
    }

    /// A heap buffer of `len` zero bytes, or `None` when the heap cannot hold it (never a panic
    /// nor an abort).
    pub fn try_zeroed(len: usize) -> Option<Self> {
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(len).ok()?;
        bytes.resize(len, 0);
        Some(Self::from_vec(bytes))
    }

    /// A heap buffer owning `bytes`.
    pub fn from_vec(mut bytes: Vec<u8>) -> Self {
        let ptr = NonNull::new(bytes.as_mut_ptr()).unwrap_or(NonNull::dangling());
        Self {
            ptr,
            len: bytes.len(),
            origin: HostOrigin::Heap,
            backing: Backing::Heap(bytes),
        }
    }

    /// A buffer over bytes the caller owns (a mapped file, say).
    pub fn external(bytes: Box<dyn ExternalBytes>) -> Self {
        let slice = bytes.bytes();
        let ptr = NonNull::new(slice.as_ptr().cast_mut()).unwrap_or(NonNull::dangling());
        let (len, origin) = (slice.len(), bytes.origin());
        Self {
            ptr,
            len,
            origin,
            backing: Backing::External(bytes),
        }
    }

    /// A pinned slice at `ptr` of `len` bytes, kept by `handle`.
    ///
    /// # Safety
    ///
    /// `ptr .. ptr + len` is pinned memory owned by the slice `handle` keeps, valid until it drops.
    pub(crate) unsafe fn pinned(ptr: NonNull<u8>, len: usize, handle: Handle) -> Self {
        Self {
            ptr,
            len,
            origin: HostOrigin::Pinned,
            backing: Backing::Pinned(handle),
        }
    }

    /// Where the bytes live.
    pub fn origin(&self) -> HostOrigin {
        self.origin
    }

    /// Bytes in the buffer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` addresses `len` initialised bytes owned by `backing` for as long as self.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, to fill. External buffers are read-only and give an empty slice.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match self.backing {
            // SAFETY: heap and pinned bytes are owned exclusively by this buffer.
            Backing::Heap(_) | Backing::Pinned(_) => unsafe {
                core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len)
            },
            Backing::External(_) => &mut [],
        }
    }

    /// The first byte, for a copy.
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The first byte, for a copy that writes the buffer.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes as an owned vector (copies unless the buffer is a heap vector).
    pub fn into_vec(self) -> Vec<u8> {
        match self.backing {
            Backing::Heap(v) => v,
            _ => self.as_slice().to_vec(),
        }
    }
}
