//! The plain values the shim contract passes: device addresses and spans, launch geometry,
//! kernel parameters, the kind of host memory of a copy, and the device's facts. A leaf.

/// A device address (CUDA's `CUdeviceptr`). On a CPU shim it is a host address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DeviceAddr(pub u64);

impl DeviceAddr {
    /// The address `bytes` further on.
    pub const fn offset(self, bytes: u64) -> Self {
        Self(self.0 + bytes)
    }
}

/// A range of device memory a launch touches: where it starts and how many bytes it spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct DeviceSpan {
    /// First byte.
    pub addr: DeviceAddr,
    /// Number of bytes.
    pub len: u64,
}

/// Three extents: a launch's grid (blocks) or its block (threads per block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Dim3 {
    /// Extent along x.
    pub x: u32,
    /// Extent along y.
    pub y: u32,
    /// Extent along z.
    pub z: u32,
}

impl Dim3 {
    /// One along every axis.
    pub const ONE: Self = Self::linear(1);

    /// `x` along x, one along y and z.
    pub const fn linear(x: u32) -> Self {
        Self { x, y: 1, z: 1 }
    }

    /// The product of the three extents (saturating at `u64::MAX`, which three `u32`s can pass).
    pub const fn count(self) -> u64 {
        (self.x as u64 * self.y as u64).saturating_mul(self.z as u64)
    }
}

/// What the hardware needs to start a kernel: the grid of blocks, the threads of a block and the
/// bytes of dynamic shared memory each block gets (CUDA's `cuLaunchKernel` geometry).
///
/// The core refuses a launch with an extent of zero ([`crate::Validation::LaunchDims`]); the
/// device's own limits (threads per block, shared memory) are the shim's to report.
///
/// ```
/// use devcmd::{Dim3, LaunchDims};
///
/// // 1,000,003 elements, 256 threads a block: 3,907 blocks, the last one partly idle.
/// let dims = LaunchDims::covering(1_000_003, 256);
/// assert_eq!((dims.grid, dims.block), (Dim3::linear(3_907), Dim3::linear(256)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct LaunchDims {
    /// Blocks in the grid.
    pub grid: Dim3,
    /// Threads in a block.
    pub block: Dim3,
    /// Bytes of dynamic shared memory per block.
    pub shared_bytes: u32,
}

impl LaunchDims {
    /// One block of one thread: for kernels (and CPU shims) that loop over their data themselves.
    pub const SINGLE: Self = Self::linear(1, 1);

    /// `blocks` blocks of `threads` threads along x, no dynamic shared memory.
    pub const fn linear(blocks: u32, threads: u32) -> Self {
        Self {
            grid: Dim3::linear(blocks),
            block: Dim3::linear(threads),
            shared_bytes: 0,
        }
    }

    /// The most blocks a grid may have along x: CUDA's limit (2³¹ − 1), which
    /// [`Self::covering`] never passes.
    pub const MAX_GRID_X: u32 = i32::MAX as u32;

    /// Enough blocks of `threads` threads along x for one thread per element of `elements`
    /// (at least one block; at most [`Self::MAX_GRID_X`] blocks, so a kernel over more elements
    /// than that many threads loops over its data, as a grid-stride kernel does).
    pub const fn covering(elements: u64, threads: u32) -> Self {
        let threads = if threads == 0 { 1 } else { threads };
        let blocks = elements.div_ceil(threads as u64);
        let blocks = if blocks == 0 {
            1
        } else if blocks > Self::MAX_GRID_X as u64 {
            Self::MAX_GRID_X
        } else {
            blocks as u32
        };
        Self::linear(blocks, threads)
    }
}

/// One parameter of a kernel, in the kernel's own order: a kernel written
/// `f(float *out, const float *in, size_t n)` with input `x` and output `y` is launched with
/// buffers `[x, y]` (inputs first, then outputs) and parameters
/// `[Buffer(1), Buffer(0), Scalar(&n.to_ne_bytes())]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelParam<'a> {
    /// The device address of the launch's buffer at this slot (inputs first, then outputs),
    /// passed as a 64-bit pointer.
    Buffer(usize),
    /// The bytes of a scalar parameter, in the device's byte order, exactly the parameter's size
    /// (a `size_t` is 8 bytes, an `int` 4).
    Scalar(&'a [u8]),
}

/// Where the host side of a copy lives: it decides whether a device can copy it asynchronously.
///
/// On CUDA a copy from or to [`HostMemory::Pageable`] memory goes through the driver's own
/// staging buffer, and a device-to-host copy into it returns only once it is done; pinned and
/// registered memory are read and written by DMA, asynchronously.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum HostMemory {
    /// Ordinary memory the operating system may page out or move.
    Pageable,
    /// Page-locked memory from [`Shim::host_alloc_pinned`](crate::Shim::host_alloc_pinned).
    Pinned,
    /// The caller's memory, page-locked in place by [`Shim::host_register`](crate::Shim::host_register).
    Registered,
}

/// Which way a host copy of a pipelined copy goes ([`Shim::host_copy`](crate::Shim::host_copy)):
/// it decides how the bytes are best written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum HostCopy {
    /// Into a staging buffer the device reads next (an upload): written through the cache,
    /// where the device's read finds them.
    Stage,
    /// Out of a staging buffer into the caller's memory (a read): the destination is not read
    /// again soon, so a large copy may bypass the cache.
    Unstage,
}

/// What the core needs to know of a device before it allocates anything.
///
/// A shim builds it with [`DeviceFacts::new`] and the `with_*` methods, never field by field: it
/// is `#[non_exhaustive]`, so a fact added later (with a default that keeps today's behaviour)
/// breaks no shim. The fields stay public to read.
///
/// ```
/// use devcmd::DeviceFacts;
///
/// // A discrete device of 8 GiB with 256-byte alignment, pages of at most 1 GiB.
/// let facts = DeviceFacts::new(8 << 30, 256).with_max_page_size(1 << 30);
/// assert_eq!((facts.memory_budget, facts.vm_granule), (None, 0));
/// assert!(!facts.integrated && !facts.can_map_host);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub struct DeviceFacts {
    /// Bytes of memory the device has in all.
    pub total_memory: u64,
    /// Bytes of device pages the core may hold at once; `None` for no limit beyond the device's.
    pub memory_budget: Option<u64>,
    /// Alignment in bytes of every page and of every slice the core carves (a power of two; the
    /// core rounds it up to one, and honours at most 2 GiB for slices: a slice's padding is kept
    /// in 32 bits).
    pub page_alignment: u64,
    /// The largest page the core may ask for.
    pub max_page_size: u64,
    /// Host memory is device memory (Jetson and other integrated GPUs).
    pub integrated: bool,
    /// Pinned host pages can be mapped into the device's address space.
    pub can_map_host: bool,
    /// The granule of the device's virtual memory management, in bytes (CUDA's
    /// `cuMemGetAllocationGranularity`, 2 MiB on current GPUs), or 0 where the device has none.
    /// Where it is not 0 the core may reserve address ranges and back them with memory granule
    /// by granule ([`Shim::vm_reserve`](crate::Shim::vm_reserve), [`Shim::vm_map`](crate::Shim::vm_map)), so freed granules go back to the
    /// device without moving anything; elsewhere it keeps whole pages.
    pub vm_granule: u64,
}

impl DeviceFacts {
    /// A discrete device with `total_memory` bytes and pages aligned to `page_alignment` bytes
    /// (a power of two): no budget below the device's memory, pages up to `total_memory`, host
    /// memory apart from device memory and not mapped into it, no virtual memory management.
    pub const fn new(total_memory: u64, page_alignment: u64) -> Self {
        Self {
            total_memory,
            memory_budget: None,
            page_alignment,
            max_page_size: total_memory,
            integrated: false,
            can_map_host: false,
            vm_granule: 0,
        }
    }

    /// The same, with [`Self::memory_budget`] set.
    pub const fn with_memory_budget(mut self, budget: Option<u64>) -> Self {
        self.memory_budget = budget;
        self
    }

    /// The same, with [`Self::max_page_size`] set.
    pub const fn with_max_page_size(mut self, bytes: u64) -> Self {
        self.max_page_size = bytes;
        self
    }

    /// The same, with [`Self::integrated`] set.
    pub const fn with_integrated(mut self, integrated: bool) -> Self {
        self.integrated = integrated;
        self
    }

    /// The same, with [`Self::can_map_host`] set.
    pub const fn with_can_map_host(mut self, can_map_host: bool) -> Self {
        self.can_map_host = can_map_host;
        self
    }

    /// The same, with [`Self::vm_granule`] set.
    pub const fn with_vm_granule(mut self, granule: u64) -> Self {
        self.vm_granule = granule;
        self
    }
}
