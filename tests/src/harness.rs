//! What a shim author implements to run the suite: [`Harness`] (required) and [`Probe`]
//! (optional: call counters and fault injection), and the contract each method keeps.
//!
//! # The harness contract
//!
//! A [`Harness`] hands the suite fresh shims and the test kernels loaded on them; the suite builds
//! every [`devcmd::Device`] itself. What each method must do:
//!
//! - [`Harness::shim`]: a fresh device each call (no memory in use, nothing lost, no fault
//!   pending) in the asked [`Mode`], or `None` when the shim cannot offer that mode (the groups of
//!   that mode are then skipped, saying so on stderr). In a **lazy** mode no stream runs anything
//!   until one of its fences is queried or waited on (a stream waiting on another's event drives
//!   that one up to the event); in a **poison** mode every page given back, by
//!   [`Shim::device_free`] and by [`Shim::host_free_pinned`] alike (and mapped memory given back
//!   by [`Shim::vm_unmap`]), is overwritten before anything can use it again, so work that touches memory the core let go too early (because a fence
//!   completed early, or the core did not wait for it) reads or leaves wrong bytes the suite sees.
//! - [`Harness::kernel`]: the [`TestKernel`] asked for, loaded on that shim; each kernel's
//!   variant documents what it must do, [`TestKernel::WriteThenFail`] included (a kernel that
//!   fails while it runs: the suite checks the three rules of [`devcmd::shim`] with it).
//!   The suite launches each kernel with the parameters [`TestArgs`] lists, in the order of the
//!   kernel's CUDA C signature given on its variant, and the geometry [`TestArgs::dims`].
//! - [`Harness::probe`]: optional. With one, the suite also checks the shim's own counters and
//!   injects faults; without one those checks are skipped or weakened (each group says how).
//!   You need not write one: wrap your harness in [`CountedHarness`](crate::CountedHarness) and
//!   the suite's [`Counted`](crate::Counted) wrapper counts and injects for any shim.
//!
//! # What a probe counts
//!
//! [`Counters`] are cumulative from the shim's creation and compared only as differences:
//!
//! - `event_records`, `event_waits`, `event_queries`: every call of [`Shim::record_event`],
//!   [`Shim::event_wait`] and [`Shim::event_query`], whether it succeeded, failed, or was refused
//!   by an injected fault;
//! - `device_pages_live` / `device_bytes_live`: pages returned by a successful
//!   [`Shim::device_alloc`] and not yet given to [`Shim::device_free`], and their sizes as asked;
//!   `device_bytes_live` also counts the bytes of every successful [`Shim::vm_map`] not yet
//!   given to [`Shim::vm_unmap`];
//! - `host_pages_live`: pages returned by a successful [`Shim::host_alloc_pinned`] and not yet
//!   given to [`Shim::host_free_pinned`];
//! - `vm_reserved_live`: bytes of the ranges returned by a successful [`Shim::vm_reserve`] and
//!   not yet given to [`Shim::vm_release`].
//!
//! Nothing else counts: a page that failed to allocate is not live; frees cannot fail.
//!
//! # How an injected fault must look
//!
//! [`Probe::inject`] installs a [`FaultRule`]; the calls it names are counted from the moment of
//! the request. A fired rule must look to the core exactly as the real failure would:
//!
//! - a refused [`Shim::device_alloc`], [`Shim::host_alloc_pinned`] or [`Shim::vm_map`] is
//!   classified [`Fault::OutOfMemory`](devcmd::Fault::OutOfMemory) (a transient shortage: the
//!   core then reclaims and retries once, and reports [`IoError::OutOfMemory`](devcmd::IoError)
//!   naming the refusal; a refused pinned page falls back to heap memory);
//! - any other refused call is [`Fault::Failed`](devcmd::Fault::Failed), and the call has no
//!   effect (nothing enqueued, nothing allocated);
//! - [`FaultRule::LoseDevice`] is [`Fault::DeviceLost`](devcmd::Fault::DeviceLost) and every later
//!   call fails with `DeviceLost` too; no work may touch memory after the core hears of the loss
//!   (it frees everything at once), so queued work is finished or dropped first;
//! - [`FaultRule::WorkFails`] accepts the call, lets its work run, then reports
//!   [`Fault::WorkFailed`](devcmd::Fault::WorkFailed) at the fences after it, keeping the three
//!   rules of [`devcmd::shim`].
//!
//! Build the errors with the shim's own [`Shim::classify`] where its status codes allow it (as
//! the std shim does); otherwise build [`devcmd::DriverError`]s with those faults directly (as
//! [`Counted`](crate::Counted) does).

use devcmd::{DeviceSpan, KernelParam, LaunchDims, LibraryError, Shim, ShimOp};
use std::fmt;

/// How long a [`TestKernel::SlowAdd`] must take at least, in milliseconds.
pub const SLOW_KERNEL_MS: u64 = 60;

/// The device behaviour a group runs under. A shim that cannot offer a mode answers `None` from
/// [`Harness::shim`] and the groups of that mode are skipped (with a message on stderr).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mode {
    /// Streams run nothing until one of their fences is queried or waited on, so every
    /// early-free or missing-order bug shows deterministically.
    pub lazy: bool,
    /// Freed device pages and freed pinned host pages are overwritten (poisoned) before anyone
    /// can reuse them, so a late read sees garbage instead of plausible old data.
    pub poison: bool,
}

impl Mode {
    /// An ordinary device.
    pub const NORMAL: Self = Self {
        lazy: false,
        poison: false,
    };
    /// Lazy streams.
    pub const LAZY: Self = Self {
        lazy: true,
        poison: false,
    };
    /// Poisoned frees.
    pub const POISON: Self = Self {
        lazy: false,
        poison: true,
    };
    /// Lazy streams and poisoned frees: the strictest mode.
    pub const LAZY_POISON: Self = Self {
        lazy: true,
        poison: true,
    };
    /// Every mode, ordinary first.
    pub const ALL: [Self; 4] = [Self::NORMAL, Self::LAZY, Self::POISON, Self::LAZY_POISON];
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match (self.lazy, self.poison) {
            (false, false) => "normal",
            (true, false) => "lazy",
            (false, true) => "poison",
            (true, true) => "lazy+poison",
        })
    }
}

/// The kernels the suite launches, each with the parameters of its CUDA C signature (built by
/// [`TestArgs`]): buffers as pointers with their lengths in bytes, then the byte `value` as an
/// `unsigned int`. A buffer the launch does not have is passed as a null pointer of length 0.
/// A CPU shim may ignore the geometry and loop over the bytes; a GPU kernel covers them with a
/// grid-stride loop over [`TestArgs::dims`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TestKernel {
    /// `fill(unsigned char *out, unsigned long long n, unsigned int value)`: no inputs; sets
    /// every byte of the output to `value`.
    Fill,
    /// `add(const unsigned char *in, unsigned long long n_in, unsigned char *out,
    /// unsigned long long n_out, unsigned int value)`: `out[i] = in[i] + value` (wrapping) for
    /// `i` below the shorter of the two lengths.
    AddByte,
    /// As [`TestKernel::AddByte`] (same signature), but waits at least [`SLOW_KERNEL_MS`] before
    /// it reads its input (so a buffer freed or overwritten too early shows in its output).
    SlowAdd,
    /// As [`TestKernel::Fill`] (same signature), then **fails while it runs**. Launching it succeeds; the failure surfaces at the fences
    /// recorded after it, as a fault of work that ran: [`devcmd::Fault::WorkFailed`], or
    /// [`devcmd::Fault::DeviceLost`] on a device that cannot survive a failed kernel (CUDA's
    /// sticky errors). With no outputs it writes nothing and fails all the same.
    ///
    /// On CUDA: a kernel that stores `value`, then traps. On a CPU shim: a function that writes,
    /// then returns the shim's run-time failure.
    WriteThenFail,
}

impl TestKernel {
    /// Every test kernel.
    pub const ALL: [Self; 4] = [
        Self::Fill,
        Self::AddByte,
        Self::SlowAdd,
        Self::WriteThenFail,
    ];

    /// The name the suite launches it under (carried in failure chains).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Fill => "fill",
            Self::AddByte => "add",
            Self::SlowAdd => "slow_add",
            Self::WriteThenFail => "write_then_fail",
        }
    }
}

/// The parameters of one launch of a [`TestKernel`], in its signature's order, and its geometry.
///
/// ```
/// use devcmd::KernelParam;
/// use devcmd_tests::{TestArgs, TestKernel};
///
/// // add(in, n_in, out, n_out, value) over a 100-byte input and a 64-byte output:
/// let args = TestArgs::new(TestKernel::AddByte, 7, &[100], &[64]);
/// let p = args.params();
/// assert_eq!((p[0], p[2]), (KernelParam::Buffer(0), KernelParam::Buffer(1)));
/// assert_eq!(p[3], KernelParam::Scalar(&64u64.to_ne_bytes()));
/// assert_eq!(p[4], KernelParam::Scalar(&7u32.to_ne_bytes()));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestArgs {
    kernel: TestKernel,
    /// Slot of the input and of the output, if the launch has them.
    input: Option<usize>,
    output: Option<usize>,
    input_len: [u8; 8],
    output_len: [u8; 8],
    value: [u8; 4],
    /// The widest buffer, for the geometry.
    widest: u64,
}

/// A null device pointer, for a buffer the launch does not have.
const NULL: [u8; 8] = [0; 8];

impl TestArgs {
    /// The parameters of `kernel` with the byte `value` over buffers of `inputs` and `outputs`
    /// bytes (the first of each is passed; the others are the launch's but not the kernel's).
    pub fn new(kernel: TestKernel, value: u8, inputs: &[u64], outputs: &[u64]) -> Self {
        let takes_input = matches!(kernel, TestKernel::AddByte | TestKernel::SlowAdd);
        let input = (takes_input && !inputs.is_empty()).then_some(0);
        let output = (!outputs.is_empty()).then_some(inputs.len());
        let len = |slot: Option<usize>, lens: &[u64]| {
            let n = if slot.is_some() { lens[0] } else { 0 };
            n.to_ne_bytes()
        };
        Self {
            kernel,
            input,
            output,
            input_len: len(input, inputs),
            output_len: len(output, outputs),
            value: u32::from(value).to_ne_bytes(),
            widest: inputs.iter().chain(outputs).copied().max().unwrap_or(0),
        }
    }

    /// The parameters, in the kernel's order.
    pub fn params(&self) -> Vec<KernelParam<'_>> {
        let pointer = |slot: Option<usize>| match slot {
            Some(s) => KernelParam::Buffer(s),
            None => KernelParam::Scalar(&NULL),
        };
        let mut out = Vec::with_capacity(5);
        if matches!(self.kernel, TestKernel::AddByte | TestKernel::SlowAdd) {
            out.push(pointer(self.input));
            out.push(KernelParam::Scalar(&self.input_len));
        }
        out.push(pointer(self.output));
        out.push(KernelParam::Scalar(&self.output_len));
        out.push(KernelParam::Scalar(&self.value));
        out
    }

    /// One thread per byte of the widest buffer, 256 to a block.
    pub fn dims(&self) -> LaunchDims {
        LaunchDims::covering(self.widest, 256)
    }
}

/// Call counters of a shim, as far as it keeps them (see the module documentation for which
/// calls count). Counts are cumulative since the shim was made; the suite only compares
/// differences.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Calls of [`Shim::record_event`].
    pub event_records: u64,
    /// Calls of [`Shim::event_wait`] (blocking).
    pub event_waits: u64,
    /// Calls of [`Shim::event_query`] (non-blocking).
    pub event_queries: u64,
    /// Device pages allocated and not freed.
    pub device_pages_live: u64,
    /// Bytes of those pages, and of memory mapped ([`Shim::vm_map`]) and not unmapped.
    pub device_bytes_live: u64,
    /// Pinned host pages allocated and not freed.
    pub host_pages_live: u64,
    /// Bytes of device address space reserved ([`Shim::vm_reserve`]) and not released.
    pub vm_reserved_live: u64,
}

/// A fault the suite asks a [`Probe`] to inject. Counting starts at the moment of the request.
/// See the module documentation for how each must be classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultRule {
    /// The call of `op` after the next `skip` ones fails once (the device is not lost).
    Once {
        /// The call.
        op: ShimOp,
        /// Calls of `op` that still succeed first.
        skip: u64,
    },
    /// Every call of `op` from now fails (the device is not lost), until [`Probe::clear`].
    Always {
        /// The call.
        op: ShimOp,
    },
    /// The next call of `op` fails with a fault that loses the device (nothing runs again).
    LoseDevice {
        /// The call.
        op: ShimOp,
    },
    /// The call of `op` after the next `skip` ones succeeds and its work runs (a copy copies, a
    /// kernel writes), then fails while it runs: the stream's fences from there on report a
    /// [`Fault::WorkFailed`](devcmd::Fault::WorkFailed), and so do those of streams ordered
    /// after it (the three rules of [`devcmd::shim`]). `op` is a call that enqueues work:
    /// [`ShimOp::CopyHostToDevice`], [`ShimOp::CopyDeviceToHost`],
    /// [`ShimOp::CopyDeviceToDevice`], [`ShimOp::Launch`], [`ShimOp::GraphLaunch`] or
    /// [`ShimOp::StreamWaitEvent`].
    WorkFails {
        /// The call.
        op: ShimOp,
        /// Calls of `op` that still succeed first.
        skip: u64,
    },
}

/// Optional hooks into a shim: counters and fault injection. Bound to one shim instance (made by
/// [`Harness::probe`]) and must stay usable after the device that owns the shim is dropped (the
/// suite reads the counters after teardown to check that every page went back).
pub trait Probe {
    /// The shim's counters now.
    fn counters(&self) -> Counters;
    /// Installs `rule`. An injected failure looks to the core exactly like a real one (see the
    /// module documentation): a refused call changes nothing else.
    fn inject(&self, rule: FaultRule);
    /// Removes every injected rule (a poisoned device stays poisoned, a fault of work that ran
    /// stays reported).
    fn clear(&self);
}

/// What a shim author implements to run the conformance suite (see the crate documentation and
/// the module documentation for the contract of each method).
///
/// Keep it thin: the suite builds the [`devcmd::Device`] itself (with the configurations its
/// checks need) from the shim you return.
pub trait Harness {
    /// The shim under test.
    type S: Shim;

    /// A fresh shim (a fresh device: no memory in use, nothing poisoned) in `mode`; `None` if the
    /// shim cannot offer that mode.
    fn shim(&self, mode: Mode) -> Option<Self::S>;

    /// A fresh shim in `mode` for a second device of the same process as `first` (the several
    /// devices group): where the shim models what a process shares (CUDA's one capture mode for
    /// every device of a process; the std shim's [`Process`](devcmd_std::Process)), the two
    /// must share it. By default [`Self::shim`]: right for a shim whose devices share nothing,
    /// and for CUDA, where every shim of a process shares it anyway.
    fn beside(&self, first: &Self::S, mode: Mode) -> Option<Self::S> {
        let _ = first;
        self.shim(mode)
    }

    /// `kernel`, loaded on `shim` (see [`TestKernel`] for what each must do).
    fn kernel(&self, shim: &Self::S, kernel: TestKernel) -> <Self::S as Shim>::Kernel;

    /// Counters and fault injection for `shim`, if the shim offers them. Without a probe the
    /// checks that need counters use the core's own statistics only, the failure-rule property
    /// runs without failing launches, the three fault rules are checked with
    /// [`TestKernel::WriteThenFail`] only, and the fault-injection group is skipped.
    fn probe(&self, shim: &Self::S) -> Option<Box<dyn Probe>> {
        let _ = shim;
        None
    }

    /// The suite's stand-in for a vendor library, for the library-work group
    /// ([`crate::groups::library_work()`]): enqueues on `native` a copy of `src` into `dst` (as
    /// long as each other) the way a library enqueues its kernels, and returns without waiting.
    /// `None` when the shim offers no library work (the group is then skipped with a visible
    /// line).
    ///
    /// # Safety
    ///
    /// `src` and `dst` lie in live device memory of `shim` that stays alive and unmoved until the
    /// stream under `native` passed the copy (the core's promise to library work).
    unsafe fn library_copy(
        &self,
        native: &<Self::S as Shim>::NativeStream,
        src: DeviceSpan,
        dst: DeviceSpan,
    ) -> Option<Result<(), LibraryError>> {
        let _ = (native, src, dst);
        None
    }
}
