//! Direct calls of a shim under test, for the checks of the rules made on the shim itself.
//!
//! Owns the shim, its kernels, and the pages and host buffers a check hands to it, and gives them
//! back only once every stream's last fence completed (a shim that breaks its promises cannot make
//! the suite touch freed memory). Does not own the checks (`on_shim`).

use super::{FAILED_BYTE, LEN, POLLS, RULE_COMPLETED, RULE_KIND, RULE_STICKY, RULE_WAIT, Source};
use crate::harness::{FaultRule, Harness, Mode, Probe, TestArgs, TestKernel};
use crate::util::{kernel_slot, load_kernels};
use devcmd::{CopyLayout, DeviceSpan, DriverError, Fault, HostMemory, Shim, ShimOp};
use std::ptr::NonNull;
use std::time::Duration;

/// How the first report classified the fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    Work,
    Lost,
}

/// How a polled fence answered.
pub(super) enum Polled {
    /// A query answered (the fence completed, cleanly or with a fault).
    Query(Result<(), DriverError>),
    /// The fence never completed while polled: a blocking wait answered.
    Wait(Result<(), DriverError>),
}

/// A shim under direct test: its kernels, the pages and host buffers the check hands to it.
///
/// Pages and host buffers are given back only once [`Bench::settle`] saw every stream's last
/// fence complete; otherwise (a check that failed, a fence of unknown outcome) they are leaked,
/// so a shim that breaks its promises cannot make the suite itself touch freed memory.
pub(super) struct Bench<H: Harness> {
    pub(super) what: String,
    pub(super) shim: H::S,
    probe: Option<Box<dyn Probe>>,
    kernels: Vec<<H::S as Shim>::Kernel>,
    pages: Vec<<H::S as Shim>::DevicePage>,
    /// Host buffers handed to copies, as raw boxed slices (freed by `Drop` once settled).
    hosts: Vec<(NonNull<u8>, usize)>,
    settled: bool,
}

impl<H: Harness> Bench<H> {
    /// A fresh shim in `mode` for `check` with `source`; `None` (after saying so) when the shim
    /// lacks the mode, or when `source` needs a probe the harness does not offer.
    pub(super) fn new(h: &H, mode: Mode, check: &str, source: Source) -> Option<Self> {
        let Some(shim) = h.shim(mode) else {
            crate::skip::skipped("work_faults", mode, &format!("the shim has no {mode} mode"));
            return None;
        };
        let probe = h.probe(&shim);
        if source == Source::InjectedUpload && probe.is_none() {
            crate::skip::skipped(
                "work_faults",
                mode,
                &format!("{check} with an injected upload fault: the harness has no probe"),
            );
            return None;
        }
        let what = format!("[{mode}] {check}, failing with {source}");
        Some(Self::with(h, shim, probe, what))
    }

    /// A fresh shim in `mode` for `check`, with no failure planned; `None` (after saying so) when
    /// the shim lacks the mode.
    pub(super) fn clean(h: &H, mode: Mode, check: &str) -> Option<Self> {
        let Some(shim) = h.shim(mode) else {
            crate::skip::skipped("work_faults", mode, &format!("the shim has no {mode} mode"));
            return None;
        };
        let probe = h.probe(&shim);
        Some(Self::with(h, shim, probe, format!("[{mode}] {check}")))
    }

    fn with(h: &H, shim: H::S, probe: Option<Box<dyn Probe>>, what: String) -> Self {
        let kernels = load_kernels(h, &shim);
        Self {
            what,
            shim,
            probe,
            kernels,
            pages: Vec::new(),
            hosts: Vec::new(),
            settled: false,
        }
    }

    pub(super) fn stream(&self) -> <H::S as Shim>::Stream {
        self.shim
            .create_stream()
            .unwrap_or_else(|e| panic!("{}: create_stream: {e}", self.what))
    }

    /// A device page of [`LEN`] bytes; its index.
    pub(super) fn page(&mut self) -> usize {
        let page = self
            .shim
            .device_alloc(LEN as u64)
            .unwrap_or_else(|e| panic!("{}: device_alloc: {e}", self.what));
        self.pages.push(page);
        self.pages.len() - 1
    }

    fn span(&self, page: usize) -> DeviceSpan {
        DeviceSpan {
            addr: self.shim.device_page_addr(&self.pages[page]),
            len: LEN as u64,
        }
    }

    /// A host buffer of [`LEN`] bytes holding `byte`; its index.
    pub(super) fn host(&mut self, byte: u8) -> usize {
        let boxed: Box<[u8]> = vec![byte; LEN].into_boxed_slice();
        let ptr = NonNull::new(Box::into_raw(boxed).cast::<u8>()).expect("a box is never null");
        self.hosts.push((ptr, LEN));
        self.hosts.len() - 1
    }

    /// The bytes of host buffer `i` now.
    pub(super) fn read_host(&self, i: usize) -> Vec<u8> {
        let (ptr, len) = self.hosts[i];
        // SAFETY: the buffer is a live allocation of `len` bytes until the bench drops. The shim
        // writes it only through a copy the check enqueued; the check reads it once a fence after
        // that copy completed (a shim that breaks rule 1 may still be writing: that is what the
        // check looks for, with plain bytes that any value is valid for).
        unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len).to_vec() }
    }

    pub(super) fn launch(
        &self,
        stream: &<H::S as Shim>::Stream,
        kernel: TestKernel,
        value: u8,
        inputs: &[usize],
        outputs: &[usize],
    ) {
        let spans: Vec<DeviceSpan> = inputs
            .iter()
            .chain(outputs)
            .map(|&p| self.span(p))
            .collect();
        let slot = kernel_slot(kernel);
        let lens = |pages: &[usize]| pages.iter().map(|&p| self.span(p).len).collect::<Vec<_>>();
        let args = TestArgs::new(kernel, value, &lens(inputs), &lens(outputs));
        // SAFETY: every span is a whole live page of this bench (freed only once settled), and
        // each test kernel touches only its buffers (the harness contract).
        let launched = unsafe {
            self.shim.launch(
                stream,
                &self.kernels[slot],
                args.dims(),
                &spans,
                &args.params(),
            )
        };
        launched.unwrap_or_else(|e| panic!("{}: launch of {}: {e}", self.what, kernel.name()));
    }

    /// Enqueues a copy of device page `page` into host buffer `host`.
    pub(super) fn download(&self, stream: &<H::S as Shim>::Stream, page: usize, host: usize) {
        let (dst, len) = self.hosts[host];
        // SAFETY: `dst` is a live allocation of `len` bytes that only this copy writes, kept
        // until the bench is settled (or leaked); the page is live and `len` bytes long.
        let copied = unsafe {
            self.shim.copy_to_host(
                stream,
                self.span(page).addr,
                dst.as_ptr(),
                HostMemory::Pageable,
                CopyLayout::linear(len as u64),
            )
        };
        copied.unwrap_or_else(|e| panic!("{}: copy_to_host: {e}", self.what));
    }

    /// Enqueues a copy of host buffer `host` into device page `page`.
    fn upload(&self, stream: &<H::S as Shim>::Stream, host: usize, page: usize) {
        let (src, len) = self.hosts[host];
        // SAFETY: `src` is a live allocation of `len` bytes nothing writes, kept until the bench
        // is settled (or leaked); the page is live and `len` bytes long.
        let copied = unsafe {
            self.shim.copy_to_device(
                stream,
                src.as_ptr(),
                HostMemory::Pageable,
                self.span(page).addr,
                CopyLayout::linear(len as u64),
            )
        };
        copied.unwrap_or_else(|e| panic!("{}: copy_to_device: {e}", self.what));
    }

    /// Enqueues work on `stream` that writes `page`, then fails while it runs.
    pub(super) fn fail(&mut self, stream: &<H::S as Shim>::Stream, source: Source, page: usize) {
        match source {
            Source::Kernel => {
                self.launch(stream, TestKernel::WriteThenFail, FAILED_BYTE, &[], &[page])
            }
            Source::InjectedUpload => {
                let src = self.host(FAILED_BYTE);
                let probe = self.probe.as_ref().expect("checked by Bench::new");
                probe.inject(FaultRule::WorkFails {
                    op: ShimOp::CopyHostToDevice,
                    skip: 0,
                });
                self.upload(stream, src, page);
                self.probe.as_ref().expect("checked").clear();
            }
        }
    }

    pub(super) fn record(&self, stream: &<H::S as Shim>::Stream) -> <H::S as Shim>::Event {
        self.shim
            .record_event(stream)
            .unwrap_or_else(|e| panic!("{}: record_event: {e}", self.what))
    }

    pub(super) fn wait_on(
        &self,
        stream: &<H::S as Shim>::Stream,
        event: &<H::S as Shim>::Event,
    ) -> Result<(), DriverError> {
        self.shim.stream_wait_event(stream, event)
    }

    /// Queries `event` until it completes (1 ms apart), then at most [`POLLS`] times before
    /// waiting on it instead: a slow device makes the check wait, never fail.
    pub(super) fn poll(&self, event: &<H::S as Shim>::Event) -> Polled {
        for _ in 0..POLLS {
            match self.shim.event_query(event) {
                Ok(false) => std::thread::sleep(Duration::from_millis(1)),
                Ok(true) => return Polled::Query(Ok(())),
                Err(e) => return Polled::Query(Err(e)),
            }
        }
        Polled::Wait(self.shim.event_wait(event))
    }

    /// The class of `e`, reported at `step`, or a panic naming [`RULE_KIND`].
    pub(super) fn class(&self, e: DriverError, step: &str) -> Class {
        match e.fault {
            Fault::WorkFailed => Class::Work,
            Fault::DeviceLost => Class::Lost,
            _ => panic!(
                "{}: {RULE_KIND}: {step} answered {e} ({:?})",
                self.what, e.fault
            ),
        }
    }

    /// Expects `r`, the answer of a completed fence at `step`, to report the fault; a clean
    /// answer breaks `rule`.
    #[track_caller]
    pub(super) fn expect_fault(&self, r: Result<(), DriverError>, rule: &str, step: &str) -> Class {
        match r {
            Ok(()) => panic!(
                "{}: {rule}: {step} completed clean, as if the work before it had not failed",
                self.what
            ),
            Err(e) => self.class(e, step),
        }
    }

    /// Waits on `event`, a fence after the failed work, and expects the fault. A clean answer is
    /// told apart by asking the same fence again: a query that answers "not yet", or that now
    /// reports the fault, means the wait returned early ([`RULE_WAIT`]: the shim call at fault is
    /// `event_wait`); a query that agrees it is clean means the fault was forgotten (`rule`).
    #[track_caller]
    pub(super) fn expect_wait_fault(
        &self,
        event: &<H::S as Shim>::Event,
        rule: &str,
        step: &str,
    ) -> Class {
        let waited = self.shim.event_wait(event);
        if waited.is_ok() {
            self.diagnose_clean(event, "event_wait", rule, step);
        }
        self.expect_fault(waited, rule, step)
    }

    /// Panics for a fence after the failed work that answered clean to `call`, naming the call
    /// and the rule it most likely broke (see [`Self::expect_wait_fault`]).
    #[track_caller]
    fn diagnose_clean(
        &self,
        event: &<H::S as Shim>::Event,
        call: &str,
        rule: &str,
        step: &str,
    ) -> ! {
        let what = &self.what;
        let (again, other) = if call == "event_wait" {
            (self.shim.event_query(event), "a query")
        } else {
            (self.shim.event_wait(event).map(|()| true), "a wait")
        };
        match again {
            Ok(false) => panic!(
                "{what}: {RULE_WAIT}: {step}: {call} answered clean, but {other} on the same fence \
                 right after answers \"not yet\": {call} returned before its fence completed \
                 (the shim call at fault is {call}: it returns early; not a forgotten fault)"
            ),
            Err(e) => panic!(
                "{what}: {RULE_WAIT}: {step}: {call} answered clean, then {other} on the same \
                 fence reported {e}: {call} returned before the failed work finished (the shim \
                 call at fault is {call}: it returns early; not a forgotten fault)"
            ),
            Ok(true) => panic!(
                "{what}: {rule}: {step} completed clean, as if the work before it had not failed, \
                 and {other} on the same fence agrees: the shim forgot the fault (the calls at \
                 fault: event_query / event_wait, which must report it at every fence at or after \
                 the failed work)"
            ),
        }
    }

    /// Expects a query of `event`, which completed (a wait on it returned), to report the fault.
    #[track_caller]
    pub(super) fn expect_query_fault(&self, event: &<H::S as Shim>::Event, rule: &str, step: &str) {
        match self.shim.event_query(event) {
            Ok(false) => panic!(
                "{}: {RULE_COMPLETED}: {step}: a query answered \"not yet\" although a wait on \
                 the fence had returned",
                self.what
            ),
            r => {
                self.expect_fault(r.map(drop), rule, step);
            }
        }
    }

    /// Expects `polled`, the answer of `event` to [`Self::poll`], to report the fault; a clean
    /// answer is told apart as in [`Self::expect_wait_fault`] (a query that completed clean and
    /// early names `event_query`, [`RULE_WAIT`]).
    #[track_caller]
    pub(super) fn expect_polled_fault(
        &self,
        event: &<H::S as Shim>::Event,
        polled: Polled,
        rule: &str,
        step: &str,
    ) -> Class {
        match polled {
            Polled::Query(Ok(())) => self.diagnose_clean(event, "event_query", rule, step),
            Polled::Wait(Ok(())) => self.diagnose_clean(event, "event_wait", rule, step),
            Polled::Query(r) | Polled::Wait(r) => self.expect_fault(r, rule, step),
        }
    }

    /// On a device the fault lost: every later call fails with `DeviceLost`, or its fence does.
    pub(super) fn lost_stays_lost(&self, stream: &<H::S as Shim>::Stream) {
        let later = self
            .shim
            .record_event(stream)
            .and_then(|e| self.shim.event_wait(&e));
        match later {
            Err(e) if e.fault == Fault::DeviceLost => {}
            other => panic!(
                "{}: {RULE_STICKY}: the failed work lost the device, but a later fence answered \
                 {other:?}",
                self.what
            ),
        }
    }

    /// Waits for a last fence of every stream; the pages and host buffers are given back at drop
    /// only if every one completed (cleanly or over the failed work, or on a lost device).
    pub(super) fn settle(&mut self, streams: &[&<H::S as Shim>::Stream]) {
        self.settled = streams.iter().all(|s| {
            let done = self
                .shim
                .record_event(s)
                .and_then(|e| self.shim.event_wait(&e));
            match done {
                Ok(()) => true,
                Err(e) => matches!(e.fault, Fault::WorkFailed | Fault::DeviceLost),
            }
        });
    }
}

impl<H: Harness> Drop for Bench<H> {
    fn drop(&mut self) {
        let pages = std::mem::take(&mut self.pages);
        let hosts = std::mem::take(&mut self.hosts);
        if !self.settled || std::thread::panicking() {
            // Work may still use them: leak rather than free under it.
            std::mem::forget(pages);
            return;
        }
        for page in pages {
            // SAFETY: `settle` saw a fence after every use of the page complete on every stream.
            unsafe { self.shim.device_free(page) };
        }
        for (ptr, len) in hosts {
            let slice = std::ptr::slice_from_raw_parts_mut(ptr.as_ptr(), len);
            // SAFETY: made by `Box::into_raw` of a `[u8]` of `len` bytes in `host`, freed only
            // here, once; every copy that used it completed (`settle`).
            drop(unsafe { Box::from_raw(slice) });
        }
    }
}
