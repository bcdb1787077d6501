//! What a shim author implements to run the suite: [`Harness`] (required) and [`Probe`]
//! (optional: call counters and fault injection).

use devcmd::{Shim, ShimOp};
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
    /// Freed device and host memory is overwritten (poisoned) before anyone can reuse it, so a
    /// late read sees garbage instead of plausible old data.
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

/// The kernels the suite launches. Each takes one scalar argument, a byte `value`
/// ([`Harness::args`]). Buffers arrive as the core passes them: inputs first, then outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TestKernel {
    /// No inputs; sets every byte of every output to `value`.
    Fill,
    /// One input, one output: `out[i] = in[i].wrapping_add(value)` for `i` below the shorter of
    /// the two lengths.
    AddByte,
    /// As [`TestKernel::AddByte`], but waits at least [`SLOW_KERNEL_MS`] before it reads its
    /// input (so a buffer freed or overwritten too early shows in its output).
    SlowAdd,
}

/// Call counters of a shim, as far as it keeps them. Counts are cumulative since the shim was
/// made; the suite only compares differences.
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
    /// Bytes of those pages.
    pub device_bytes_live: u64,
    /// Pinned host pages allocated and not freed.
    pub host_pages_live: u64,
}

/// A fault the suite asks a [`Probe`] to inject. Counting starts at the moment of the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultRule {
    /// The call of `op` after the next `skip` ones fails once (not poisoning).
    Once {
        /// The call.
        op: ShimOp,
        /// Calls of `op` that still succeed first.
        skip: u64,
    },
    /// Every call of `op` from now fails (not poisoning), until [`Probe::clear`].
    Always {
        /// The call.
        op: ShimOp,
    },
    /// The next call of `op` fails with a fault that poisons the device (nothing runs again).
    Poison {
        /// The call.
        op: ShimOp,
    },
}

/// Optional hooks into a shim: counters and fault injection. Bound to one shim instance (made by
/// [`Harness::probe`]) and must stay usable after the device that owns the shim is dropped (the
/// suite reads the counters after teardown to check that every page went back).
pub trait Probe {
    /// The shim's counters now.
    fn counters(&self) -> Counters;
    /// Installs `rule`. Injected failures must be built by [`Shim::classify`] like real ones and
    /// change nothing else (the call has no effect).
    fn inject(&self, rule: FaultRule);
    /// Removes every injected rule (a poisoned device stays poisoned).
    fn clear(&self);
}

/// What a shim author implements to run the conformance suite (see the crate documentation).
///
/// Keep it thin: the suite builds the [`devcmd::Device`] itself (with the configurations its
/// checks need) from the shim you return.
pub trait Harness {
    /// The shim under test.
    type S: Shim;

    /// A fresh shim (a fresh device: no memory in use, nothing poisoned) in `mode`; `None` if the
    /// shim cannot offer that mode.
    fn shim(&self, mode: Mode) -> Option<Self::S>;

    /// `kernel`, loaded on `shim` (see [`TestKernel`] for what each must do).
    fn kernel(&self, shim: &Self::S, kernel: TestKernel) -> <Self::S as Shim>::Kernel;

    /// The launch arguments of `kernel` with the byte `value`.
    fn args(&self, kernel: TestKernel, value: u8) -> Box<<Self::S as Shim>::Args>;

    /// Counters and fault injection for `shim`, if the shim offers them. Without a probe the
    /// checks that need counters use the core's own statistics only, the failure-rule property
    /// runs without failing launches, and the fault-injection group is skipped.
    fn probe(&self, shim: &Self::S) -> Option<Box<dyn Probe>> {
        let _ = shim;
        None
    }
}
