//! Host buffers: bytes on the host side of a copy, and where they come from.
//!
//! A [`HostBuffer`] holds the host side of an upload or a read until the device is done with it:
//! an upload's buffer waits in the stream's drop queue for the fence after the copy, a read's
//! comes back from its future. Its [`HostOrigin`] (heap, pinned, a mapped file, registered
//! memory) decides whether a copy is staged. Typed data goes in and out with
//! [`HostBuffer::copy_from`], [`HostBuffer::copy_to`] and [`HostBuffer::to_vec_of`]. Allocation
//! is fallible: a length the heap cannot provide is [`IoError::HostAllocFailed`], never a panic
//! ([`HostBuffer::try_zeroed`]).

// For contributors: owns the bytes until the device is done with them, and the heap allocation
// of host buffers. Does not own the pinned pool they may be carved from (`pinned.rs`): a pinned
// buffer holds the pool's slice token and gives the slice back when it drops.

use crate::error::IoError;
use crate::pinned::PinnedSlice;
use crate::shim::HostMemory;
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
    /// The caller's bytes, page-locked in place by the device
    /// ([`Device::register_host`](crate::Device::register_host)): the device reads them by DMA,
    /// no staging needed.
    Registered,
}

impl HostOrigin {
    /// The kind of host memory a copy from or to these bytes touches.
    pub const fn memory(self) -> HostMemory {
        match self {
            Self::Heap | Self::FileMapped => HostMemory::Pageable,
            Self::Pinned => HostMemory::Pinned,
            Self::Registered => HostMemory::Registered,
        }
    }
}

/// Bytes owned by the caller that the core may hand to a copy (a memory-mapped file, a buffer of
/// the caller's own allocator).
///
/// # Safety
///
/// The device may read the bytes asynchronously until the value is dropped, through the address
/// the first call of [`ExternalBytes::bytes`] returned. So every call must return the same
/// slice (same address, same length), and its bytes must stay alive and unchanged until the value
/// is dropped. [`ExternalBytes::origin`] must be true: [`HostOrigin::Pinned`] only for memory the
/// device can read by DMA as it is (page-locked for it). [`HostOrigin::Registered`] is never
/// taken from it: only [`Device::register_host`](crate::Device::register_host) registers bytes,
/// and [`HostBuffer::external`] treats that claim as a file mapping (staged).
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
    /// A slice of a stream's pinned pool; dropping the token returns it.
    Pinned(PinnedSlice),
    External(Box<dyn ExternalBytes>),
    /// Shared by every buffer [`HostBuffer::share`] made: the registration is undone when the
    /// last of them drops.
    Registered(alloc::sync::Arc<Registered>),
    /// A device allocation on a mapped page, handed over to the host (zero copy).
    Mapped(Lent),
}

/// What a host buffer lent out of a mapped page holds: the only handle of its allocation (kept
/// until the buffer drops), and the page's count of lent buffers (the page is never freed while
/// it is above zero).
struct Lent {
    #[allow(dead_code)]
    handle: crate::memory::Handle,
    count: alloc::sync::Arc<core::sync::atomic::AtomicU32>,
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.count
            .fetch_sub(1, core::sync::atomic::Ordering::AcqRel);
    }
}

/// Caller's bytes page-locked in place, and how to undo the registration. Undone before the
/// bytes are dropped (fields drop after `drop` runs), and never while a stream of the device
/// records (the device call is illegal then): a last drop inside a recording hands the
/// registration to the device's [`Unregisters`], which the device empties once none records.
/// A last drop on another thread that reads the flag just before a recording begins may still
/// unregister inside it (a check, then the act, as for host waits): the recording is then
/// spoiled, never memory freed early. The flag is the device's own: a recording on another
/// device of the process is not seen (CUDA's global capture mode would refuse the call there).
pub(crate) struct Registered {
    unregister: Option<Box<dyn FnOnce() + Send>>,
    #[allow(dead_code)]
    bytes: Option<Box<dyn ExternalBytes>>,
    defer: Option<Deferral>,
}

/// Registrations whose last buffer went while a stream of their device recorded, waiting for
/// the device to undo them outside any recording (`CaptureState::release_dropped_graphs`).
pub(crate) type Unregisters = alloc::sync::Arc<crate::memory::ReturnQueue<Registered>>;

/// What a registration needs to wait out a recording: the device's "a stream records" flag and
/// its queue of registrations to undo.
pub(crate) struct Deferral {
    pub(crate) recording: crate::capture::RecordingFlag,
    pub(crate) queue: Unregisters,
}

// SAFETY: nothing reads or writes a `Registered` through a shared reference (the buffers that
// share it read the bytes through their cached pointer, which the `ExternalBytes` contract keeps
// valid and unchanged); only its `Drop`, which has it exclusively, touches the fields. So sharing
// it between threads (an `Arc` of it in buffers on several threads) shares nothing. Keep it so:
// `bytes` is `Send` but not `Sync`, so an accessor that reached it through the `Arc` would be
// unsound.
unsafe impl Sync for Registered {}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(defer) = self.defer.take()
            && defer.recording.is_set()
        {
            let waiting = Registered {
                unregister: self.unregister.take(),
                bytes: self.bytes.take(),
                defer: None,
            };
            // A queue that refuses (its device gone) hands the registration back: undone here.
            if let Err(refused) = defer.queue.push(waiting) {
                drop(refused);
            }
            return;
        }
        if let Some(unregister) = self.unregister.take() {
            unregister();
        }
    }
}

/// A host buffer for copies. Its address does not change while it lives, so a copy enqueued from
/// or into it stays valid as long as the buffer is kept (the drop queue keeps it).
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    origin: HostOrigin,
    backing: Backing,
}

// SAFETY: the buffer owns its bytes exclusively (heap vector, pinned slice held by its token,
// or an `ExternalBytes` that is `Send`), or shares registered bytes that nobody writes (the
// `ExternalBytes` contract: unchanged until dropped) and that only the last holder touches, to
// drop them; the raw pointer only caches their address.
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
    ///
    /// # Panics
    ///
    /// When the heap cannot provide `len` bytes (as `vec![0; len]` does). For a length that
    /// comes from outside, use [`Self::try_zeroed`].
    pub fn zeroed(len: usize) -> Self {
        Self::from_vec(alloc::vec![0; len])
    }

    /// A heap buffer of `len` zero bytes, or an error when the heap cannot provide them.
    ///
    /// # Errors
    ///
    /// [`IoError::HostAllocFailed`] when `len` overflows what the heap can address or the
    /// allocator refuses it. Nothing panics or aborts, whatever `len`; but where the operating
    /// system overcommits memory (Linux by default), the allocator may grant more than the
    /// machine can back, and writing the zeros may then make the system stop the process (the
    /// out-of-memory killer): bound `len` by what the host has where it comes from outside.
    pub fn try_zeroed(len: usize) -> Result<Self, IoError> {
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(len)
            .map_err(|_| IoError::HostAllocFailed {
                // A `usize` always fits a `u64` on the targets devcmd builds for.
                len: u64::try_from(len).unwrap_or(u64::MAX),
            })?;
        // Zeroing writes the pages the allocator gave: a copy into the buffer writes them anyway.
        bytes.resize(len, 0);
        Ok(Self::from_vec(bytes))
    }

    /// A heap buffer holding a copy of `bytes` (one pass, no zeroing first), or an error when the
    /// heap cannot provide them.
    ///
    /// # Errors
    ///
    /// As [`Self::try_zeroed`].
    pub fn try_copy_of(bytes: &[u8]) -> Result<Self, IoError> {
        let mut copy = Vec::new();
        copy.try_reserve_exact(bytes.len())
            .map_err(|_| IoError::HostAllocFailed {
                len: u64::try_from(bytes.len()).unwrap_or(u64::MAX),
            })?;
        copy.extend_from_slice(bytes);
        Ok(Self::from_vec(copy))
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

    /// A buffer over bytes the caller owns (a mapped file, say). A claim of
    /// [`HostOrigin::Registered`] is not believed (nothing registered them here): such bytes are
    /// treated as a file mapping, always staged.
    pub fn external(bytes: Box<dyn ExternalBytes>) -> Self {
        let slice = bytes.bytes();
        let ptr = NonNull::new(slice.as_ptr().cast_mut()).unwrap_or(NonNull::dangling());
        let origin = match bytes.origin() {
            HostOrigin::Registered => HostOrigin::FileMapped,
            other => other,
        };
        let len = slice.len();
        Self {
            ptr,
            len,
            origin,
            backing: Backing::External(bytes),
        }
    }

    /// `bytes`, page-locked in place: `unregister` runs when the buffer drops, before the bytes
    /// are dropped.
    ///
    /// # Safety
    ///
    /// `unregister` undoes a registration of exactly `bytes.bytes()`, and the buffer is dropped
    /// only once no copy from or to it is pending (the drop queue's rule for every host buffer).
    pub(crate) unsafe fn registered(
        bytes: Box<dyn ExternalBytes>,
        unregister: Box<dyn FnOnce() + Send>,
        defer: Deferral,
    ) -> Self {
        let slice = bytes.bytes();
        let ptr = NonNull::new(slice.as_ptr().cast_mut()).unwrap_or(NonNull::dangling());
        let len = slice.len();
        Self {
            ptr,
            len,
            origin: HostOrigin::Registered,
            backing: Backing::Registered(alloc::sync::Arc::new(Registered {
                unregister: Some(unregister),
                bytes: Some(bytes),
                defer: Some(defer),
            })),
        }
    }

    /// Another buffer over the same registered bytes, for another upload: a registration kept
    /// across writes. Register once ([`Device::register_host`](crate::Device::register_host)),
    /// write a share of it as many times as needed (each [`Command::write`](crate::Command::write)
    /// takes one, and the drop queue keeps it until that copy's fence passed), and the
    /// registration is undone once the last share and the original are dropped: after the last
    /// fence. Every write runs by DMA from the bytes in place, with no staging copy and no
    /// registration of its own.
    ///
    /// `None` for any other buffer (heap, pinned, external: a pinned or heap buffer is written
    /// by the host and cannot be shared with a copy in flight; write those by
    /// [`Command::write_from`](crate::Command::write_from)).
    ///
    /// ```
    /// # use devcmd::{Device, DeviceConfig, ExternalBytes, HostOrigin, StreamId};
    /// # struct Frame(Vec<u8>);
    /// # // SAFETY: the vector is owned and never changed while the value lives.
    /// # unsafe impl ExternalBytes for Frame {
    /// #     fn bytes(&self) -> &[u8] { &self.0 }
    /// #     fn origin(&self) -> HostOrigin { HostOrigin::Heap }
    /// # }
    /// let mut device = Device::new(devcmd_std::StdShim::new(), DeviceConfig::default());
    /// let input = device.register_host(Box::new(Frame(vec![7; 4096])));
    /// assert_eq!(input.origin(), HostOrigin::Registered);
    /// let mut cmd = device.command(StreamId(0)).unwrap();
    /// let (a, b) = (cmd.empty(4096).unwrap(), cmd.empty(4096).unwrap());
    /// // Both writes run from the one registration; it is undone after the second's fence.
    /// cmd.write(&a, input.share().unwrap()).unwrap();
    /// cmd.write(&b, input).unwrap();
    /// ```
    pub fn share(&self) -> Option<Self> {
        match &self.backing {
            Backing::Registered(r) => Some(Self {
                ptr: self.ptr,
                len: self.len,
                origin: HostOrigin::Registered,
                backing: Backing::Registered(alloc::sync::Arc::clone(r)),
            }),
            _ => None,
        }
    }

    /// The `len` bytes at `ptr` of `handle`'s allocation, which lies on a pinned page the host and
    /// the device both address (zero copy); the allocation goes back to its pool when the buffer
    /// drops.
    ///
    /// # Safety
    ///
    /// `ptr .. ptr + len` is the host view of `handle`'s allocation on a mapped page whose count
    /// of lent buffers is `count` (the page is not freed while it is above zero); `handle` is
    /// the allocation's only owner, and no device work will touch it again once the buffer is
    /// handed to the caller.
    pub(crate) unsafe fn mapped(
        ptr: NonNull<u8>,
        len: usize,
        handle: crate::memory::Handle,
        count: alloc::sync::Arc<core::sync::atomic::AtomicU32>,
    ) -> Self {
        count.fetch_add(1, core::sync::atomic::Ordering::AcqRel);
        Self {
            ptr,
            len,
            origin: HostOrigin::Pinned,
            backing: Backing::Mapped(Lent { handle, count }),
        }
    }

    /// The bytes of a slice of a stream's pinned pool, kept by the slice's token.
    pub(crate) fn pinned(slice: PinnedSlice) -> Self {
        Self {
            ptr: slice.ptr(),
            len: slice.len(),
            origin: HostOrigin::Pinned,
            backing: Backing::Pinned(slice),
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
        // SAFETY: `ptr` addresses `len` initialised bytes owned by `backing` for as long as self
        // (heap bytes start zeroed; pinned and mapped pages are zeroed when allocated).
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, to fill. External and registered buffers are read-only and give an empty
    /// slice.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match self.backing {
            // SAFETY: heap, pinned and mapped bytes are owned exclusively by this buffer (a mapped
            // buffer holds the only handle of its allocation).
            Backing::Heap(_) | Backing::Pinned(_) | Backing::Mapped(_) => unsafe {
                core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len)
            },
            Backing::External(_) | Backing::Registered(_) => &mut [],
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

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    #[test]
    fn a_length_the_heap_cannot_hold_is_an_error_not_a_panic() {
        for len in [usize::MAX, isize::MAX as usize + 1] {
            let e = HostBuffer::try_zeroed(len).unwrap_err();
            assert_eq!(e, IoError::HostAllocFailed { len: len as u64 });
            let text = e.to_string();
            assert!(
                text.contains(&len.to_string()) && text.contains("host memory"),
                "{text}"
            );
        }
    }

    // A valid layout past any address space: the allocator itself refuses it. Miri would try to
    // provide it instead.
    #[cfg_attr(miri, ignore)]
    #[test]
    fn a_length_the_allocator_refuses_is_an_error_not_an_abort() {
        let len = 1usize << 62;
        assert_eq!(
            HostBuffer::try_zeroed(len).unwrap_err(),
            IoError::HostAllocFailed { len: len as u64 }
        );
    }

    #[test]
    fn a_fallible_buffer_is_zeroed_on_the_heap() {
        let b = HostBuffer::try_zeroed(100).unwrap();
        assert_eq!((b.len(), b.origin()), (100, HostOrigin::Heap));
        assert!(b.as_slice().iter().all(|&x| x == 0));
        assert!(HostBuffer::try_zeroed(0).unwrap().is_empty());
    }
}
