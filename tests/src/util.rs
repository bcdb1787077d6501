//! Shared plumbing of the groups: a device with its kernels and probe, reads, leak checks, a
//! seeded random generator.

use crate::RELEASED_HOST_FILL;
use crate::harness::{Counters, Harness, Mode, Probe, TestArgs, TestKernel};
use devcmd::{
    Device, DeviceConfig, Handle, HostBuffer, KernelParam, Launch, LaunchDims, ReadRequest,
    ServerError, Shim, StreamId,
};
use std::fmt::Display;

/// A device configuration with small pages, for groups that make many devices (faster, same
/// rules).
pub(crate) fn small_pages() -> DeviceConfig {
    let mut config = DeviceConfig::default();
    config.memory.small_page_size = 512 << 10;
    config.memory.arena_min_page = 512 << 10;
    config.memory.arena_granule = 256 << 10;
    config.pinned.page_size = 1 << 20;
    config
}

/// Unwraps `r`, or panics naming `what` and the error.
#[track_caller]
pub(crate) fn must<T>(r: Result<T, ServerError>, what: impl Display) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{what}: unexpected error: {e}"),
    }
}

/// The position of `kernel` in [`TestKernel::ALL`] (the index of its loaded kernel and args).
pub(crate) fn kernel_slot(kernel: TestKernel) -> usize {
    TestKernel::ALL
        .iter()
        .position(|k| *k == kernel)
        .expect("every kernel is in TestKernel::ALL")
}

/// Every [`TestKernel`] loaded on `shim`, in [`TestKernel::ALL`] order.
pub(crate) fn load_kernels<H: Harness>(h: &H, shim: &H::S) -> Vec<<H::S as Shim>::Kernel> {
    TestKernel::ALL.map(|k| h.kernel(shim, k)).into()
}

/// A device under test, its kernels and (if the shim has one) its probe.
pub(crate) struct Ctx<H: Harness> {
    pub dev: Device<H::S>,
    pub probe: Option<Box<dyn Probe>>,
    pub mode: Mode,
    kernels: Vec<<H::S as Shim>::Kernel>,
}

impl<H: Harness> Ctx<H> {
    /// A fresh device in `mode` with `config`; `None` (after saying so) if the shim lacks the mode.
    pub fn new(h: &H, mode: Mode, config: DeviceConfig, group: &str) -> Option<Self> {
        let Some(shim) = h.shim(mode) else {
            crate::skip::skipped(group, mode, &format!("the shim has no {mode} mode"));
            return None;
        };
        Some(Self::over(h, shim, mode, config))
    }

    /// A second device in `mode` with `config`, in the same process as `first`'s
    /// ([`Harness::beside`]); `None` (after saying so) if the shim lacks the mode.
    pub fn beside(first: &Self, h: &H, config: DeviceConfig, group: &str) -> Option<Self> {
        let mode = first.mode;
        let Some(shim) = h.beside(first.dev.shim(), mode) else {
            crate::skip::skipped(group, mode, &format!("the shim has no {mode} mode"));
            return None;
        };
        Some(Self::over(h, shim, mode, config))
    }

    /// A device over `shim`.
    fn over(h: &H, shim: H::S, mode: Mode, config: DeviceConfig) -> Self {
        let probe = h.probe(&shim);
        let mut config = config;
        if mode.poison {
            // Released host buffers are poisoned too: a fence that passed too early shows up as
            // wrong bytes in the buffers the suite checks.
            config.drops.fill_released.get_or_insert(RELEASED_HOST_FILL);
        }
        let dev = Device::new(shim, config);
        let kernels = load_kernels(h, dev.shim());
        Self {
            dev,
            probe,
            mode,
            kernels,
        }
    }

    /// The probe's counters, or zeros without a probe.
    pub fn counters(&self) -> Counters {
        self.probe
            .as_ref()
            .map(|p| p.counters())
            .unwrap_or_default()
    }

    /// Launches `kernel` with `value` on `stream`.
    pub fn launch(
        &mut self,
        stream: StreamId,
        kernel: TestKernel,
        value: u8,
        inputs: &[&Handle],
        outputs: &[&Handle],
    ) -> Result<(), ServerError> {
        let slot = kernel_slot(kernel);
        let lens = |hs: &[&Handle]| hs.iter().map(|h| h.len()).collect::<Vec<_>>();
        let args = TestArgs::new(kernel, value, &lens(inputs), &lens(outputs));
        self.dev.command(stream)?.launch(Launch {
            kernel: &self.kernels[slot],
            dims: args.dims(),
            inputs,
            outputs,
            params: &args.params(),
        })
    }

    /// Launches `kernel` with the geometry and parameters given as they are (for refusals).
    pub fn launch_raw(
        &mut self,
        stream: StreamId,
        kernel: TestKernel,
        dims: LaunchDims,
        inputs: &[&Handle],
        outputs: &[&Handle],
        params: &[KernelParam<'_>],
    ) -> Result<(), ServerError> {
        self.dev.command(stream)?.launch(Launch {
            kernel: &self.kernels[kernel_slot(kernel)],
            dims,
            inputs,
            outputs,
            params,
        })
    }

    /// A new allocation on `stream` holding `data`.
    pub fn create(&mut self, stream: StreamId, data: &[u8]) -> Result<Handle, ServerError> {
        self.dev.command(stream)?.create(data)
    }

    /// Uploads `data` into `handle`'s view from `stream`.
    pub fn write(
        &mut self,
        stream: StreamId,
        handle: &Handle,
        data: &[u8],
    ) -> Result<(), ServerError> {
        self.dev
            .command(stream)?
            .write(handle, HostBuffer::from_vec(data.to_vec()))
    }

    /// Reads `handle`'s whole view back on `stream` and waits for it.
    pub fn read(&mut self, stream: StreamId, handle: &Handle) -> Result<Vec<u8>, ServerError> {
        let future = self
            .dev
            .command(stream)?
            .read_async(&[ReadRequest::whole(handle)])?;
        let mut buffers = future.wait()?;
        Ok(buffers.pop().map(HostBuffer::into_vec).unwrap_or_default())
    }

    /// Reads `handle` on `stream` and checks it holds `want`; a failure names `what` (the mode
    /// and the scenario), where the bytes first differ and `suspects` ([`expect_same`]).
    #[track_caller]
    pub fn expect_read(
        &mut self,
        stream: StreamId,
        handle: &Handle,
        want: &[u8],
        what: &str,
        suspects: &[&str],
    ) {
        let got = must(self.read(stream, handle), format!("{what}: read"));
        expect_same(&got, want, what, suspects);
    }

    /// Waits for everything enqueued on `stream`.
    pub fn sync(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.dev.command(stream)?.sync()?.wait()
    }

    /// Explicit cleanup of every stream the device made, twice (a binding released by one
    /// stream's queue returns memory to another stream's pools).
    pub fn cleanup_all(&mut self) -> Result<(), ServerError> {
        for _ in 0..2 {
            let streams: Vec<StreamId> = self
                .dev
                .memory_report()
                .streams
                .iter()
                .map(|(id, _)| *id)
                .collect();
            for s in streams {
                self.dev.command(s)?.memory_cleanup()?;
            }
        }
        Ok(())
    }

    /// `(allocations, in_use)` over every stream and pool (pinned pools included).
    pub fn live(&mut self) -> (u64, u64) {
        let report = self.dev.memory_report();
        report.streams.iter().fold((0, 0), |(a, b), (_, r)| {
            let u = r.device() + r.pinned_host();
            (a + u.allocations, b + u.in_use)
        })
    }

    /// `(allocations, in_use)` of one stream's device pools (pinned host pool left out).
    pub fn live_on(&mut self, stream: StreamId) -> (u64, u64) {
        let report = self.dev.memory_report();
        report
            .streams
            .iter()
            .find(|(id, _)| *id == stream)
            .map_or((0, 0), |(_, r)| {
                r.pools
                    .iter()
                    .filter(|p| p.kind != devcmd::memory::PoolKind::PinnedHost)
                    .fold((0, 0), |(a, b), p| (a + p.allocations, b + p.in_use))
            })
    }

    /// Flushes `stream`'s drop queue.
    pub fn flush(&mut self, stream: StreamId) -> Result<(), ServerError> {
        self.dev.command(stream)?.flush_drops()
    }

    /// Polls `stream`'s drop queue.
    pub fn poll(&mut self, stream: StreamId) -> Result<bool, ServerError> {
        self.dev.command(stream)?.poll_drops()
    }

    /// An allocation of `size` bytes on `stream`.
    pub fn empty(&mut self, stream: StreamId, size: u64) -> Result<Handle, ServerError> {
        self.dev.command(stream)?.empty(size)
    }

    /// Bytes of pages (retired included) the device holds for `stream`'s pools, from the report.
    pub fn reserved_on(&mut self, stream: StreamId) -> u64 {
        let report = self.dev.memory_report();
        report
            .streams
            .iter()
            .find(|(id, _)| *id == stream)
            .map_or(0, |(_, r)| {
                r.pools
                    .iter()
                    .filter(|p| p.kind != devcmd::memory::PoolKind::PinnedHost)
                    .map(|p| p.reserved)
                    .sum()
            })
    }

    /// Cleans every stream up and checks that nothing is in use any more, that the failure
    /// records are gone, and (with a probe) that every device page went back after teardown.
    #[track_caller]
    pub fn assert_no_leak(mut self, what: &str) {
        let mode = self.mode;
        must(self.cleanup_all(), format!("[{mode}] {what}: cleanup"));
        let (allocations, in_use) = self.live();
        assert_eq!(
            (allocations, in_use),
            (0, 0),
            "[{mode}] {what}: allocations / bytes still in use after dropping every handle and \
             cleaning up:\n{}",
            self.dev.memory_report()
        );
        assert_eq!(
            self.dev.failures().len(),
            (0, 0),
            "[{mode}] {what}: failure records outlive the memory they describe"
        );
        let probe = self.probe.take();
        drop(self);
        if let Some(p) = probe {
            let c = p.counters();
            assert_eq!(
                (
                    c.device_pages_live,
                    c.device_bytes_live,
                    c.host_pages_live,
                    c.vm_reserved_live
                ),
                (0, 0, 0, 0),
                "[{mode}] {what}: the shim still holds device pages / device bytes (pages and \
                 mapped memory) / host pages / reserved address space after the device was \
                 dropped"
            );
        }
    }
}

/// splitmix64: a small seeded generator, so every failure names a seed that reproduces it.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn byte(&mut self) -> u8 {
        self.next() as u8
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// Bytes of pinned host buffers in use on `stream`'s pool (0 for a stream the report does not
/// list): what a staging ring holds after a copy.
pub fn pinned_in_use<S: devcmd::Shim>(
    dev: &mut devcmd::Device<S>,
    stream: devcmd::StreamId,
) -> u64 {
    dev.memory_report()
        .streams
        .iter()
        .find(|(id, _)| *id == stream)
        .map_or(0, |(_, r)| r.pinned_host().in_use)
}

/// `n` bytes of a recognisable pattern seeded by `seed`.
pub(crate) fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// `data` with `value` added to every byte.
pub(crate) fn plus(data: &[u8], value: u8) -> Vec<u8> {
    data.iter().map(|b| b.wrapping_add(value)).collect()
}

/// Where `got` first differs from `want`, for messages: the byte's index, what was read and
/// what was expected (and, when every byte read is the same, that byte: a fill or a poison
/// pattern says more than one position).
pub(crate) fn first_diff(got: &[u8], want: &[u8]) -> String {
    if got.len() != want.len() {
        return format!("got {} bytes, expected {}", got.len(), want.len());
    }
    match got.iter().zip(want).position(|(x, y)| x != y) {
        Some(i) => {
            let uniform = got.len() > 1 && got.iter().all(|&b| b == got[0]);
            format!(
                "first difference at byte {i} of {}: got {:#04x}, expected {:#04x}{}",
                got.len(),
                got[i],
                want[i],
                if uniform {
                    format!("; every byte read is {:#04x}", got[0])
                } else {
                    String::new()
                }
            )
        }
        None => "equal".into(),
    }
}

/// The shim calls most likely at fault when a read gives wrong bytes, by what the scenario did.
/// Failure messages name the ones that fit ([`expect_same`]).
pub(crate) mod suspect {
    /// The copies themselves moved the bytes wrong.
    pub const COPIES: &str = "copy_to_device / copy_to_host (the bytes moved wrong)";
    /// A host wait returned before what it covers landed (the read's copy, or the work it reads).
    pub const EARLY_WAIT: &str =
        "event_wait (it returned before the work it covers landed, so the read saw older bytes)";
    /// A fence reported complete too early, so the core released or reused memory under work
    /// still running.
    pub const EARLY_FENCE: &str = "event_query / event_wait (a fence reported complete before \
                                   the work it covers finished, so the core released or reused \
                                   memory that work still used)";
    /// A stream did not wait, on the device, for another stream's work.
    pub const STREAM_WAIT: &str = "stream_wait_event (the reading stream did not wait, on the \
                                   device, for the event the writing stream recorded)";
    /// The kernel ran on other spans or with other parameters than it was given.
    pub const LAUNCH: &str =
        "launch (the kernel read or wrote other spans, or other parameters, than it was given)";
    /// A replay ran other work than was recorded, or none.
    pub const GRAPH: &str = "begin_capture / end_capture (the recording kept other work than \
                             was enqueued) or graph_launch (the replay ran other work, or none)";
}

/// Checks that `got` is `want`; a failure names `what` (the mode and the scenario), where the
/// bytes first differ, and the shim calls most likely at fault (`suspects`, from [`suspect`]),
/// never a bare dump of bytes.
#[track_caller]
pub(crate) fn expect_same(got: &[u8], want: &[u8], what: &str, suspects: &[&str]) {
    if got == want {
        return;
    }
    panic!(
        "{what}: the read gave wrong bytes ({}); the shim call most likely at fault: {}",
        first_diff(got, want),
        suspects.join(", or ")
    );
}
