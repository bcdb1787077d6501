//! The engine: the one place that runs an operation's steps. Operations only declare what they
//! do (the handles they read and write, their host side, the device call); the engine runs the
//! same steps for all of them, once each:
//!
//! ```text
//!  begin ─▶ validate ─▶ resolve + order ─▶ capture stance ─▶ failure rule ─▶ device call ─▶ outcome ─▶ flush
//!  (once)   (refused:    (each handle      (run, record,    (an input that   (the shim, or  (marks, drop  (by the
//!           no trace)     once: spans)      or refuse)       failed: skip)    the library)   queue, window) policy)
//! ```
//!
//! Owns the order of those steps and the scratch they use (a launch's spans live on the stack up
//! to 16 buffers, past that in one vector the device keeps warm). Does not own what a step
//! decides: cross-stream order (`order.rs`), the failure records (`failure.rs`), the capture
//! rules (`capture/`), the host side of copies (`transfer.rs`).

use super::Command;
use crate::capture::Span;
use crate::error::{LaunchError, LibraryError, ServerError, Validation};
use crate::memory::Handle;
use crate::shim::{DeviceAddr, DeviceSpan, KernelParam, LaunchDims, Shim};

/// The device call of work that writes device memory from device memory: a kernel, library
/// work.
pub(super) enum Work<'a, S: Shim> {
    /// A kernel of the shim.
    Kernel {
        kernel: &'a S::Kernel,
        dims: LaunchDims,
        params: &'a [KernelParam<'a>],
    },
    /// Library work: called with the native stream and the spans.
    Library(&'a mut LibraryCall<'a, S>),
}

/// The call of library work, made at most once.
pub(super) type LibraryCall<'a, S> =
    dyn FnMut(&<S as Shim>::NativeStream, &[DeviceSpan]) -> Result<(), LibraryError> + 'a;

impl<S: Shim> Work<'_, S> {
    /// Makes the device call.
    ///
    /// # Safety
    ///
    /// Every span was resolved just now to a live range of its allocation and no written span
    /// overlaps another span; a kernel touches only its buffers (the shim's contract), library
    /// work only its ranges (the caller of [`Command::library`]'s).
    unsafe fn call(
        &mut self,
        name: &'static str,
        shim: &S,
        stream: &S::Stream,
        spans: &[DeviceSpan],
    ) -> Result<(), WorkError> {
        match self {
            Self::Kernel {
                kernel,
                dims,
                params,
            } => {
                // SAFETY: the caller's contract is the launch's.
                unsafe { shim.launch(stream, kernel, *dims, spans, params) }
                    .map_err(WorkError::Driver)
            }
            Self::Library(call) => call(shim.native_stream(stream), spans)
                .map_err(|error| WorkError::Library(LaunchError::Library { work: name, error })),
        }
    }
}

/// Why a device call of [`Work`] failed.
enum WorkError {
    /// The shim refused it (the ledger hears of it).
    Driver(crate::DriverError),
    /// The library refused it.
    Library(LaunchError),
}

/// Buffers of a launch whose spans are kept on the stack (more go to the device's warm vector).
const STACK_BUFFERS: usize = 16;

/// The whole view of `h` as a span of its allocation.
pub(super) fn view(h: &Handle) -> Span {
    Span {
        id: h.id(),
        start: h.offset(),
        end: h.offset() + h.len(),
    }
}

impl<S: Shim> Command<'_, S> {
    /// Runs device work that reads `inputs` and writes `outputs` (whole views): a launch or
    /// library work. See the module documentation for the steps.
    pub(super) fn run_work(
        &mut self,
        name: &'static str,
        inputs: &[&Handle],
        outputs: &[&Handle],
        mut work: Work<'_, S>,
    ) -> Result<(), ServerError> {
        self.begin()?;
        if let Some((output, other)) = super::launch::aliased(inputs, outputs) {
            return Err(Validation::AliasedLaunch {
                kernel: name,
                output,
                other,
            }
            .into());
        }
        let count = inputs.len() + outputs.len();
        let empty = DeviceSpan {
            addr: DeviceAddr(0),
            len: 0,
        };
        let mut stack = [empty; STACK_BUFFERS];
        let on_heap = count > STACK_BUFFERS;
        if on_heap {
            let heap = &mut self.device.launch_spans;
            heap.clear();
            heap.resize(count, empty);
        }
        for (index, h) in inputs.iter().chain(outputs.iter()).enumerate() {
            // A handle that names no memory (the only I/O error ordering meets) is this work's
            // buffer error, named by position.
            let r = self
                .device
                .order_after(self.stream, *h)
                .map_err(|e| match e {
                    ServerError::Io(cause) => LaunchError::Buffer {
                        kernel: name,
                        index,
                        cause,
                    }
                    .into(),
                    other => other,
                })?;
            let span = DeviceSpan {
                addr: r.addr,
                len: r.len,
            };
            if on_heap {
                self.device.launch_spans[index] = span;
            } else {
                stack[index] = span;
            }
        }
        let recording = self.current().capture.is_recording();
        if !recording && let Some(f) = self.carried(inputs.iter().map(|h| view(h))) {
            let failures = &mut self.device.failures;
            failures.skipped(f, name);
            outputs
                .iter()
                .map(|h| view(h))
                .for_each(|w| failures.mark(w.id, w.start, w.end, f));
            return Err(ServerError::Skipped {
                kernel: name,
                failure: f,
            });
        }
        let device = &mut *self.device;
        let spans: &[DeviceSpan] = if on_heap {
            &device.launch_spans
        } else {
            &stack[..count]
        };
        let s = device.streams[self.stream]
            .as_mut()
            .expect("a command's stream exists");
        // SAFETY: every span was resolved just now, no output overlaps another buffer (checked
        // above), and the work touches only its buffers (the callers' contracts).
        let called = unsafe { work.call(name, &device.shim, &s.raw, spans) };
        let called = called.map_err(|e| -> ServerError {
            match e {
                WorkError::Driver(cause) => LaunchError::Refused {
                    kernel: name,
                    cause: self.device.ledger.call_failed(cause),
                }
                .into(),
                WorkError::Library(e) => e.into(),
            }
        });
        if recording {
            if let Some(w) = self.current().capture.window_mut() {
                inputs.iter().for_each(|h| w.read(view(h)));
                outputs.iter().for_each(|h| w.write(view(h)));
            }
            if let Err(e) = &called {
                self.discard_recording(e);
            }
            return called;
        }
        self.settle_writes(outputs.iter().map(|h| view(h)), &called);
        called?;
        let s = self.current();
        s.last_kernel = Some(name);
        if s.drops.should_flush() {
            self.flush_after_enqueue()?;
        }
        Ok(())
    }

    /// The failure an input of `reads` carries, if any (the failure rule's question).
    pub(super) fn carried(&self, mut reads: impl Iterator<Item = Span>) -> Option<u64> {
        let failures = &self.device.failures;
        if failures.is_empty() {
            return None;
        }
        reads.find_map(|r| failures.failure(r.id, r.start, r.end))
    }

    /// The outcome of a device call for the ranges it writes: on success their failure marks go;
    /// on a refusal they carry a new failure whose root is the refusal.
    pub(super) fn settle_writes(
        &mut self,
        writes: impl Iterator<Item = Span> + Clone,
        outcome: &Result<(), ServerError>,
    ) {
        let failures = &mut self.device.failures;
        match outcome {
            Ok(()) => {
                if !failures.is_empty() {
                    writes.for_each(|w| failures.written(w.id, w.start, w.end));
                }
            }
            Err(error) => {
                let f = failures.new_failure(error.clone());
                writes.for_each(|w| failures.mark(w.id, w.start, w.end, f));
                failures.prune(f);
            }
        }
    }
}
