//! devcmd-std: a CPU device for [`devcmd`] that behaves like a GPU where it matters.
//!
//! [`StdShim`] implements every call of [`devcmd::Shim`] for real:
//!
//! - **Streams** ([`StdStream`]) are worker threads that run their queue in order, asynchronously
//!   from the host and from each other. Dropping a stream lets its queue finish, then joins it.
//! - **Events** ([`StdEvent`]) are sequence numbers: an event completes once its stream has run
//!   every operation enqueued before it. [`Shim::stream_wait_event`] enqueues an operation that
//!   blocks the *waiting stream's worker*, never the host.
//! - **Pages** ([`StdDevicePage`], [`StdHostPage`]) are zeroed, aligned heap blocks; a device
//!   address is the block's host address, so copies are `memcpy`s and kernels plain Rust, run when
//!   the stream reaches them.
//! - **Kernels** ([`StdKernel`]) are Rust closures registered by name
//!   ([`StdShim::register_kernel`]); a kernel reads its parameters by position
//!   ([`KernelCtx::scalar_u32`] and friends, [`KernelCtx::slot`]) and its buffers by slot.
//! - **Library work** ([`devcmd::Command::library`]): a stream is its own native handle; a
//!   library enqueues host functions on its worker ([`StdStream::enqueue_host`]), in stream
//!   order, recorded and replayed like any operation. [`blas::gemm`] is a CPU GEMM
//!   (`matrixmultiply`) offered that way, the counterpart of devcmd-cuda's cuBLAS.
//! - **Graphs** ([`StdGraph`]) are the list of operations a stream recorded between
//!   [`Shim::begin_capture`] and [`Shim::end_capture`], replayed as one operation.
//! - **Virtual memory** (on Unix; granule [`DEFAULT_VM_GRANULE`], 2 MiB, as a CUDA GPU's, or
//!   [`StdShimBuilder::vm_granule`]): [`Shim::vm_reserve`] reserves address space with `mmap`
//!   (`PROT_NONE`), [`Shim::vm_map`] backs a part of it with new memory (counted like device
//!   pages), [`Shim::vm_unmap`] gives that memory back, [`Shim::vm_release`] unmaps the range.
//!   Copies and kernels use mapped memory as pages, across adjacent mappings too.
//! - **Several devices**: each `StdShim` is its own address space: its calls accept only
//!   addresses inside its own pages and mappings, so an address of another `StdShim` is refused
//!   ([`status::BAD_ADDRESS`]). [`Shim::copy_peer`] copies from another `StdShim`'s page into
//!   this one's, on the destination stream's worker, and streams wait on another shim's events
//!   ([`Shim::peer_access`] is `true` for every pair). Devices built in one [`Process`] also
//!   share CUDA's per-process rule for recordings: while a stream of one records, the others
//!   refuse host waits and allocations for now ([`status::CAPTURE_ELSEWHERE`]).
//!
//! For tests it offers a **lazy** mode (a stream runs nothing until one of its events is waited
//! on or queried), **poisoning** of freed memory (device pages and pinned host pages alike, filled
//! with [`POISON_BYTE`] and kept in a quarantine, so work that touches a page after the core let
//! it go reads poison), **fault injection** for every call, refusing it, losing the device or
//! making its work fail while it runs ([`Injection`], [`StdShim::inject`]), and call counters
//! ([`StdShim::stats`]). Every error is built by [`classify`] from a status code of the
//! table in [`status`].
//!
//! ```
//! use devcmd::{CopyLayout, HostMemory, Shim};
//! use devcmd_std::StdShim;
//!
//! let shim = StdShim::new();
//! let stream = shim.create_stream().unwrap();
//! let page = shim.device_alloc(16).unwrap();
//! let (src, mut dst) = ([7u8; 16], [0u8; 16]);
//! // SAFETY: both host buffers outlive the event wait below; the page holds 16 bytes.
//! unsafe {
//!     let addr = shim.device_page_addr(&page);
//!     let layout = CopyLayout::linear(16);
//!     shim.copy_to_device(&stream, src.as_ptr(), HostMemory::Pageable, addr, layout).unwrap();
//!     shim.copy_to_host(&stream, addr, dst.as_mut_ptr(), HostMemory::Pageable, layout).unwrap();
//! }
//! shim.event_wait(&shim.record_event(&stream).unwrap()).unwrap();
//! assert_eq!(dst, src);
//! // SAFETY: the event after the page's last use has completed.
//! unsafe { shim.device_free(page) };
//! ```
#![deny(missing_docs)]

pub mod blas;
mod device;
mod faults;
mod graph;
mod kernel;
mod memory;
#[cfg(test)]
mod notify_tests;
#[cfg(test)]
mod peer_tests;
mod process;
mod stream;
#[cfg(test)]
mod tests;
mod vm;
#[cfg(all(test, unix, not(miri)))]
mod vm_tests;

pub use device::{CUDA_LIMITS, LaunchLimits, StdRegistration, StdShim, StdShimBuilder};
pub use faults::{Injection, Stats, classify, status};
pub use graph::StdGraph;
pub use kernel::{
    Io, KernelCtx, KernelFault, KernelFn, StdKernel, as_f32, as_f32_mut, as_typed, as_typed_mut,
};
pub use memory::{FRESH_HOST_BYTE, POISON_BYTE, StdDevicePage, StdHostPage};
pub use process::Process;
pub use stream::{HostFn, StdEvent, StdStream};
pub use vm::DEFAULT_VM_GRANULE;

#[cfg(doc)]
use devcmd::Shim;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// Locks `m`, going on with the data of a mutex poisoned by a panic: a panic elsewhere must not
/// cascade into panics here (in particular in `Drop`).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Waits on `cv` with `guard`, tolerating a poisoned mutex like [`lock`].
pub(crate) fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(PoisonError::into_inner)
}
