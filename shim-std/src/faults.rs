//! Status codes, their classification, fault injection and call counters.

use devcmd::{DriverError, Fault, ShimOp};
use std::fmt;
use std::sync::Arc;

/// The status codes of this shim. [`classify`] maps each to a [`Fault`]:
///
/// | code | name | fault | when |
/// |---|---|---|---|
/// | 2 | `OUT_OF_MEMORY` | `OutOfMemory` | live device pages and mapped memory + size > total memory, or the heap (the system, for `vm_map` and `vm_reserve`) refused |
/// | 3 | `TOO_BIG` | `TooBig` | size > max page size or > total memory (`vm_map`: > total memory) |
/// | 4 | `BAD_ADDRESS` | `Failed` | a device span outside every live page and every run of adjacent mappings of one reservation; a `vm_map` outside every reserved range |
/// | 5 | `BAD_ARGUMENT` | `Failed` | a null host pointer, a size past `usize`; a `vm_reserve` or `vm_map` size, or a `vm_map` address, that is not a multiple of the granule, or a size of 0 |
/// | 6 | `CAPTURE_STATE` | `Failed` | begin while recording, end while not recording; `borrow_stream` of a stream that records |
/// | 7 | `CAPTURE_INVALIDATED` | `Failed` | `device_alloc`, `host_alloc_pinned`, `vm_reserve` or `vm_map` while a stream records (refused), or `end_capture` of a recording invalidated by that, by a `device_free`, `host_free_pinned`, `vm_unmap` or `vm_release`, or by a wait that crosses it, as on CUDA |
/// | 8 | `CAPTURE_DOOMED` | `Failed` | `end_capture` with `doomed` |
/// | 9 | `ILLEGAL_IN_CAPTURE` | `Failed` | query or wait of an event recorded on a recording stream, or of any event while a stream records (CUDA's global capture mode: the recording is invalidated); a recording stream waiting on another stream's event (CUDA's capture isolation: invalidated too) |
/// | 10 | `UNSUPPORTED` | `Unsupported` | a stream waiting on an event recorded in another stream's recording; `vm_reserve` or `vm_map` on a device built with no virtual memory (a granule of 0) |
/// | 11 | `THREAD_SPAWN` | `Failed` | the worker thread of a new stream could not start |
/// | 12 | `BAD_LAUNCH` | `Failed` | a launch past CUDA's geometry limits (see [`StdShim`](crate::StdShim)'s `launch`) |
/// | 13 | `ALREADY_MAPPED` | `Failed` | a `vm_map` over a range that is mapped, in part or whole |
/// | 14 | `CAPTURE_ELSEWHERE` | `Busy` | `event_wait`, `device_alloc`, `host_alloc_pinned` or `host_register` while a stream of another device of the same [`Process`](crate::Process) records: refused for now, nothing done (what devcmd-cuda answers under CUDA's global capture mode; `event_query` answers "not yet" then) |
/// | 20 | `KERNEL_FAILED` | `WorkFailed` | a kernel returned [`KernelFault::Failed`](crate::KernelFault::Failed) (reported by the next fence, which completed) |
/// | 21 | `KERNEL_PANICKED` | `WorkFailed` | a kernel panicked (reported like `KERNEL_FAILED`) |
/// | 22 | `KERNEL_LOST_DEVICE` | `DeviceLost` | a kernel returned [`KernelFault::DeviceLost`](crate::KernelFault::DeviceLost) |
/// | 23 | `DEVICE_LOST` | `DeviceLost` | any call after the device was lost |
/// | 24 | `SOURCE_LOST` | `WorkFailed` | a copy from another device found that device lost when it ran (reported like `KERNEL_FAILED`) |
/// | 25 | `WORKER_PANICKED` | `WorkFailed` | the stream's worker panicked running or dropping an operation: a shim bug, or a value a host function captured whose drop panicked (reported like `KERNEL_FAILED`) |
/// | 30 | `BUDGET` | `OutOfMemory` | injected: `device_alloc` or `vm_map` past [`StdShim::set_alloc_budget`](crate::StdShim::set_alloc_budget) |
/// | 100 + op | `INJECTED` | `OutOfMemory` for allocations (`device_alloc`, `host_alloc_pinned`, `vm_map`), `Failed` otherwise | an [`Injection`](crate::Injection) fired |
/// | 200 + op | `INJECTED_LOSS` | `DeviceLost` | a [device-losing](crate::Injection::losing_device) injection fired |
/// | 300 + op | `INJECTED_AT_RUN` | `WorkFailed` | the work of a call accepted by a [while-running](crate::Injection::while_running) injection failed (reported like `KERNEL_FAILED`) |
///
/// `op` is the index of the [`ShimOp`] in declaration order (`StreamCreate` = 0 ...
/// `GraphLaunch` = 15, `VmReserve` = 16, `VmMap` = 17); [`status::injected`](crate::status::injected)
/// computes the code.
pub mod status {
    use devcmd::ShimOp;

    /// Out of device memory.
    pub const OUT_OF_MEMORY: i32 = 2;
    /// A size the device can never hold.
    pub const TOO_BIG: i32 = 3;
    /// A device span outside every live page.
    pub const BAD_ADDRESS: i32 = 4;
    /// A null pointer or a size that does not fit the host.
    pub const BAD_ARGUMENT: i32 = 5;
    /// A capture call out of order.
    pub const CAPTURE_STATE: i32 = 6;
    /// The recording was invalidated by an allocation.
    pub const CAPTURE_INVALIDATED: i32 = 7;
    /// The core doomed the recording.
    pub const CAPTURE_DOOMED: i32 = 8;
    /// An event recorded on a recording stream was queried or waited on.
    pub const ILLEGAL_IN_CAPTURE: i32 = 9;
    /// A call this shim does not support.
    pub const UNSUPPORTED: i32 = 10;
    /// A stream's worker thread could not start.
    pub const THREAD_SPAWN: i32 = 11;
    /// A launch past CUDA's geometry limits.
    pub const BAD_LAUNCH: i32 = 12;
    /// A `vm_map` over memory that is mapped already.
    pub const ALREADY_MAPPED: i32 = 13;
    /// A host wait or an allocation while a stream of another device of the same
    /// [`Process`](crate::Process) records: refused for now ([`Fault::Busy`](devcmd::Fault::Busy)).
    pub const CAPTURE_ELSEWHERE: i32 = 14;
    /// A kernel failed at run time.
    pub const KERNEL_FAILED: i32 = 20;
    /// A kernel panicked at run time.
    pub const KERNEL_PANICKED: i32 = 21;
    /// A kernel reported a fault that loses the device.
    pub const KERNEL_LOST_DEVICE: i32 = 22;
    /// The device is lost.
    pub const DEVICE_LOST: i32 = 23;
    /// A copy from another device found that device lost when it ran: the source's work up to
    /// the copy may not have run (a fault of the copying stream's work, not a loss of its
    /// device).
    pub const SOURCE_LOST: i32 = 24;
    /// The stream's worker panicked while it ran or dropped an operation (a bug of the shim, or
    /// a value a host function captured whose drop panicked): that work failed.
    pub const WORKER_PANICKED: i32 = 25;
    /// An allocation past the injected byte budget.
    pub const BUDGET: i32 = 30;
    /// Base of injected failures (plus the op index).
    pub const INJECTED: i32 = 100;
    /// Base of injected failures that lose the device (plus the op index).
    pub const INJECTED_LOSS: i32 = 200;
    /// Base of injected failures of work that ran (plus the op index).
    pub const INJECTED_AT_RUN: i32 = 300;

    /// The status code of an injected failure of `op` (losing the device or not).
    pub const fn injected(op: ShimOp, loses_device: bool) -> i32 {
        let base = if loses_device {
            INJECTED_LOSS
        } else {
            INJECTED
        };
        base + super::op_index(op) as i32
    }

    /// The status code of an injected failure of the work `op` enqueued, while it ran.
    pub const fn injected_at_run(op: ShimOp) -> i32 {
        INJECTED_AT_RUN + super::op_index(op) as i32
    }
}

const OP_COUNT: usize = ShimOp::ALL.len();

const OPS: [ShimOp; OP_COUNT] = ShimOp::ALL;

pub(crate) const fn op_index(op: ShimOp) -> usize {
    match op {
        ShimOp::StreamCreate => 0,
        ShimOp::StreamWaitEvent => 1,
        ShimOp::EventRecord => 2,
        ShimOp::EventQuery => 3,
        ShimOp::EventWait => 4,
        ShimOp::DeviceAlloc => 5,
        ShimOp::HostAlloc => 6,
        ShimOp::HostRegister => 7,
        ShimOp::CopyHostToDevice => 8,
        ShimOp::CopyDeviceToHost => 9,
        ShimOp::CopyDeviceToDevice => 10,
        ShimOp::Launch => 11,
        ShimOp::GraphBegin => 12,
        ShimOp::GraphEnd => 13,
        ShimOp::GraphUpload => 14,
        ShimOp::GraphLaunch => 15,
        ShimOp::VmReserve => 16,
        ShimOp::VmMap => 17,
    }
}

/// Builds the error of a failed call of `op` with status `code`, classified by the table in
/// [`status`]. Unknown codes are [`Fault::Failed`].
pub fn classify(op: ShimOp, code: i32) -> DriverError {
    let injected = |base: i32| {
        code.checked_sub(base)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| OPS.get(i).copied())
    };
    let fault = match code {
        status::OUT_OF_MEMORY | status::BUDGET => Fault::OutOfMemory,
        status::TOO_BIG => Fault::TooBig,
        status::UNSUPPORTED => Fault::Unsupported,
        status::CAPTURE_ELSEWHERE => Fault::Busy,
        status::KERNEL_LOST_DEVICE | status::DEVICE_LOST => Fault::DeviceLost,
        status::KERNEL_FAILED
        | status::KERNEL_PANICKED
        | status::SOURCE_LOST
        | status::WORKER_PANICKED => Fault::WorkFailed,
        _ if injected(status::INJECTED_LOSS).is_some() => Fault::DeviceLost,
        _ if injected(status::INJECTED_AT_RUN).is_some() => Fault::WorkFailed,
        _ => match injected(status::INJECTED) {
            Some(ShimOp::DeviceAlloc | ShimOp::HostAlloc | ShimOp::VmMap) => Fault::OutOfMemory,
            _ => Fault::Failed,
        },
    };
    DriverError::new(op, code, fault)
}

/// A predicate over a call and its size in bytes (see [`Injection::when`]).
type Predicate = Arc<dyn Fn(ShimOp, u64) -> bool + Send + Sync>;

#[derive(Clone)]
enum Trigger {
    Nth(ShimOp, u64),
    After(ShimOp, u64),
    When(Predicate),
}

/// What a firing injection does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    /// The call fails and has no effect.
    Refuse,
    /// The call fails and the device is lost.
    LoseDevice,
    /// The call is accepted and its work runs, then fails while it runs.
    FailWhileRunning,
}

/// Whether `op` enqueues work on a stream (so its work can fail while it runs).
pub(crate) const fn enqueues_work(op: ShimOp) -> bool {
    matches!(
        op,
        ShimOp::StreamWaitEvent
            | ShimOp::CopyHostToDevice
            | ShimOp::CopyDeviceToHost
            | ShimOp::CopyDeviceToDevice
            | ShimOp::Launch
            | ShimOp::GraphLaunch
    )
}

/// A rule that makes calls fail on purpose. Install with [`StdShim::inject`](crate::StdShim::inject)
/// or [`StdShimBuilder::inject`](crate::StdShimBuilder::inject).
///
/// Calls are counted per [`ShimOp`] from 1 (the counts of [`Stats::calls`], which include failed
/// calls). An injected failure returns an error with the status [`status::injected`] and changes
/// nothing else, unless the rule is [device-losing](Injection::losing_device) or
/// [fails the work while it runs](Injection::while_running). Frees (`device_free`,
/// `host_free_pinned`, `vm_unmap`, `vm_release`) cannot fail and are never injected.
#[derive(Clone)]
pub struct Injection {
    trigger: Trigger,
    effect: Effect,
}

impl Injection {
    /// Fails the `n`th call (counting from 1) of `op`.
    pub fn nth(op: ShimOp, n: u64) -> Self {
        Self {
            trigger: Trigger::Nth(op, n),
            effect: Effect::Refuse,
        }
    }

    /// Fails every call of `op` after the first `n`.
    pub fn after(op: ShimOp, n: u64) -> Self {
        Self {
            trigger: Trigger::After(op, n),
            effect: Effect::Refuse,
        }
    }

    /// Fails every call for which `pred(op, size)` holds. `size` is the bytes of the call: the
    /// allocation size, the packed bytes of a copy, the sum of a launch's spans, 0 otherwise.
    /// The predicate runs under the shim's lock: it must not call the shim.
    pub fn when(pred: impl Fn(ShimOp, u64) -> bool + Send + Sync + 'static) -> Self {
        Self {
            trigger: Trigger::When(Arc::new(pred)),
            effect: Effect::Refuse,
        }
    }

    /// Makes the failure lose the device: the call fails with a [`Fault::DeviceLost`] error and
    /// every later call fails too.
    pub fn losing_device(mut self) -> Self {
        self.effect = Effect::LoseDevice;
        self
    }

    /// Makes the call succeed and its work fail while it runs, as a kernel that fails does: the
    /// work runs (a copy copies, a kernel writes), then the stream's fences from there on report
    /// a [`Fault::WorkFailed`] with the status [`status::injected_at_run`], and so do the fences
    /// of streams ordered after it (the three rules of [`devcmd::shim`]).
    ///
    /// Only calls that enqueue work can fail this way: stream waits, copies, launches and graph
    /// launches. The rule never fires on other calls (nor counts them as firing).
    pub fn while_running(mut self) -> Self {
        self.effect = Effect::FailWhileRunning;
        self
    }

    /// Whether the rule fires on the `count`th call of `op` with `size` bytes.
    pub(crate) fn fires(&self, op: ShimOp, count: u64, size: u64) -> bool {
        if self.effect == Effect::FailWhileRunning && !enqueues_work(op) {
            return false;
        }
        match &self.trigger {
            Trigger::Nth(o, n) => *o == op && count == *n,
            Trigger::After(o, n) => *o == op && count > *n,
            Trigger::When(pred) => pred(op, size),
        }
    }

    /// What a firing does.
    pub(crate) fn effect(&self) -> Effect {
        self.effect
    }
}

impl fmt::Debug for Injection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Injection");
        match &self.trigger {
            Trigger::Nth(op, n) => d.field("op", op).field("nth", n),
            Trigger::After(op, n) => d.field("op", op).field("after", n),
            Trigger::When(_) => d.field("when", &"<predicate>"),
        };
        d.field("effect", &self.effect).finish()
    }
}

/// Counters of a [`StdShim`](crate::StdShim), as returned by
/// [`StdShim::stats`](crate::StdShim::stats).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    calls: [u64; OP_COUNT],
    /// Device pages freed.
    pub device_frees: u64,
    /// Pinned host pages freed.
    pub host_frees: u64,
    /// Bytes of live device pages (as asked for) and of memory mapped by
    /// [`devcmd::Shim::vm_map`] and not yet unmapped.
    pub device_bytes_live: u64,
    /// Live device pages.
    pub device_pages_live: u64,
    /// Bytes of live pinned host pages (as asked for).
    pub host_bytes_live: u64,
    /// Live pinned host pages.
    pub host_pages_live: u64,
    /// Live registrations of the caller's host memory ([`devcmd::Shim::host_register`]).
    pub registrations_live: u64,
    /// Copies enqueued whose host side was pageable, pinned and registered memory, in that order
    /// (indexed by [`devcmd::HostMemory`] as `Pageable`, `Pinned`, `Registered`).
    pub copies_by_host_memory: [u64; 3],
    /// Stream operations that ran (copies, launches, waits, replays); skipped ones not counted.
    pub ops_run: u64,
    /// Kernels that ran (also inside replays).
    pub kernels_run: u64,
    /// Asynchronous faults raised by running work (kernels that failed, panicked or lost the device).
    pub async_faults: u64,
    /// Bytes of freed blocks and unmapped ranges held in the poison quarantine.
    pub quarantined_bytes: u64,
    /// Bytes of address space reserved by [`devcmd::Shim::vm_reserve`] and not yet released.
    pub vm_reserved_live: u64,
    /// Bytes mapped by [`devcmd::Shim::vm_map`] and not yet unmapped (also counted in
    /// `device_bytes_live`).
    pub vm_mapped_live: u64,
    /// Successful [`devcmd::Shim::vm_map`] calls.
    pub vm_maps: u64,
    /// [`devcmd::Shim::vm_unmap`] calls that unmapped a mapping.
    pub vm_unmaps: u64,
    /// Calls that broke the virtual-memory contract and were ignored or cleaned up: a
    /// `vm_unmap` of something that is not exactly one mapping (address, size and handle), a
    /// `vm_release` of something that is not exactly one reservation, or of one with memory
    /// still mapped in it (unmapped with it). A correct core keeps it at 0.
    pub vm_misuse: u64,
}

impl Stats {
    /// How many times `op` was called (failed calls included).
    pub fn calls(&self, op: ShimOp) -> u64 {
        self.calls[op_index(op)]
    }

    /// Counts one call of `op` and returns the new count.
    pub(crate) fn count(&mut self, op: ShimOp) -> u64 {
        let c = &mut self.calls[op_index(op)];
        *c += 1;
        *c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_table_classifies() {
        let f = |code| classify(ShimOp::Launch, code).fault;
        assert_eq!(f(status::OUT_OF_MEMORY), Fault::OutOfMemory);
        assert_eq!(f(status::BUDGET), Fault::OutOfMemory);
        assert_eq!(f(status::TOO_BIG), Fault::TooBig);
        assert_eq!(f(status::UNSUPPORTED), Fault::Unsupported);
        assert_eq!(f(status::KERNEL_LOST_DEVICE), Fault::DeviceLost);
        assert_eq!(f(status::DEVICE_LOST), Fault::DeviceLost);
        assert_eq!(f(status::KERNEL_FAILED), Fault::WorkFailed);
        assert_eq!(f(status::KERNEL_PANICKED), Fault::WorkFailed);
        assert_eq!(f(-7), Fault::Failed);
        assert_eq!(
            f(status::injected(ShimOp::DeviceAlloc, false)),
            Fault::OutOfMemory
        );
        assert_eq!(f(status::injected(ShimOp::EventWait, false)), Fault::Failed);
        assert_eq!(
            f(status::injected(ShimOp::VmMap, false)),
            Fault::OutOfMemory,
            "a refused map is a shortage, as a refused allocation"
        );
        assert_eq!(f(status::injected(ShimOp::VmReserve, false)), Fault::Failed);
        assert_eq!(f(status::ALREADY_MAPPED), Fault::Failed);
        assert_eq!(
            f(status::injected(ShimOp::GraphLaunch, true)),
            Fault::DeviceLost
        );
        assert_eq!(
            f(status::injected_at_run(ShimOp::CopyHostToDevice)),
            Fault::WorkFailed
        );
        assert_eq!(
            f(status::injected_at_run(ShimOp::GraphLaunch)),
            Fault::WorkFailed
        );
        for (i, op) in OPS.iter().enumerate() {
            assert_eq!(op_index(*op), i);
        }
    }

    #[test]
    fn a_while_running_injection_lets_the_work_run_then_fails_its_fences() {
        use devcmd::{CopyLayout, Shim};
        let shim = crate::StdShim::builder().lazy(true).build();
        // Never fires on a call that enqueues nothing; fires on the second upload.
        shim.inject(Injection::nth(ShimOp::EventRecord, 1).while_running());
        shim.inject(Injection::nth(ShimOp::CopyHostToDevice, 2).while_running());
        let s = shim.create_stream().unwrap();
        let page = shim.device_alloc(8).unwrap();
        let (a, b, mut back) = ([1u8; 8], [2u8; 8], [0u8; 8]);
        let addr = shim.device_page_addr(&page);
        let clean = shim
            .record_event(&s)
            .expect("the EventRecord rule never fires");
        // SAFETY: the host arrays outlive the waits below; the page holds 8 bytes.
        unsafe {
            shim.copy_to_device(
                &s,
                a.as_ptr(),
                devcmd::HostMemory::Pageable,
                addr,
                CopyLayout::linear(8),
            )
            .unwrap();
            shim.copy_to_device(
                &s,
                b.as_ptr(),
                devcmd::HostMemory::Pageable,
                addr,
                CopyLayout::linear(8),
            )
            .expect("accepted: its work fails only while it runs");
            shim.copy_to_host(
                &s,
                addr,
                back.as_mut_ptr(),
                devcmd::HostMemory::Pageable,
                CopyLayout::linear(8),
            )
            .unwrap();
        }
        shim.event_wait(&clean).unwrap();
        let fence = shim.record_event(&s).unwrap();
        let e = shim.event_wait(&fence).unwrap_err();
        assert_eq!(
            (e.op, e.status, e.fault),
            (
                ShimOp::CopyHostToDevice,
                status::injected_at_run(ShimOp::CopyHostToDevice),
                Fault::WorkFailed
            )
        );
        assert_eq!(
            back, b,
            "the failed upload's work ran, and the work after it"
        );
        let later = shim.record_event(&s).unwrap();
        assert_eq!(shim.event_query(&later).unwrap_err(), e, "sticky");
        assert_eq!(shim.stats().async_faults, 1);
        // SAFETY: every fence after the page's last use completed.
        unsafe { shim.device_free(page) };
    }
}
