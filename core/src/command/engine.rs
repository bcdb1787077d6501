//! The engine: the one place that runs an operation's steps. Operations only declare what they
//! do (the memory they read and write, their host side, the device call); the engine runs the
//! same steps for all of them, once each:
//!
//! ```text
//!  begin ─▶ check ─▶ resolve ─▶ check ─▶ order ─▶ stance ─▶ failure rule ─▶ device call ─▶ outcome ─▶ flush
//!  (book-   (a kernel's (each     (aliases: (after    (run,     (an input that  (shim, library, (marks,     (drop-queue
//!   keeping, geometry:  handle    refused,  other     record:   failed: skip,   or graph)       drop queue, policy)
//!   ledger)  no trace)  once)     no trace) streams)  window,   outputs carry)                  a refusal
//!                                                     refuse)                                   discards)
//! ```
//!
//! Device work (a kernel, library work, a graph's replay) runs through [`Command::run`]; copies
//! run the same steps with a host side (`host_side.rs`), which shares the steps below.
//!
//! Owns the order of the steps and the scratch they use (a launch's spans live on the stack up to
//! 8 buffers, past that in a vector the device keeps warm). Does not own what a step decides:
//! cross-stream order (`order/`), the failure records (`failure.rs`), the capture state
//! (`capture/`), the staging decision (`staging.rs`).

use super::Command;
use super::buffers::{Buffers, ranges_meet};
use crate::capture::{Recorded, Span, Stance};
use crate::error::{LaunchError, LibraryError, ServerError, Validation};
use crate::memory::Handle;
use crate::shim::{DeviceAddr, DeviceSpan, KernelParam, LaunchDims, Shim};
use alloc::sync::Arc;

/// The call of library work, made at most once.
pub(super) type LibraryCall<'a, S> =
    dyn FnMut(&<S as Shim>::NativeStream, &[DeviceSpan]) -> Result<(), LibraryError> + 'a;

/// How a device call refused: the shim's error (recorded in the ledger by the outcome), or a
/// library's own.
enum Refusal {
    Shim(crate::error::DriverError),
    Library(LibraryError),
}

/// What device work touches, as the engine reads it off the [`Work`].
enum Touches<'a, S: Shim> {
    /// Whole views of handles: a launch's or library work's buffers.
    Views(Buffers<'a>),
    /// What a recorded graph touches, reads and writes.
    Graph(&'a Arc<Recorded<S>>),
}

/// Device work: the call to make and what it touches.
pub(super) enum Work<'a, S: Shim> {
    /// A kernel of the shim over `buffers`.
    Kernel {
        kernel: &'a S::Kernel,
        dims: LaunchDims,
        params: &'a [KernelParam<'a>],
        buffers: Buffers<'a>,
    },
    /// Library work over `buffers`: called with the native stream and the spans.
    Library {
        call: &'a mut LibraryCall<'a, S>,
        buffers: Buffers<'a>,
    },
    /// One replay of a recorded graph.
    Replay(&'a Arc<Recorded<S>>),
}

impl<'a, S: Shim> Work<'a, S> {
    /// What the work touches (copied out: the call still needs the work).
    fn touches(&self) -> Touches<'a, S> {
        match self {
            Self::Kernel { buffers, .. } | Self::Library { buffers, .. } => {
                Touches::Views(*buffers)
            }
            Self::Replay(g) => Touches::Graph(g),
        }
    }
}

/// Buffers of a launch whose spans are kept on the stack (more go to the device's warm vectors).
const STACK_BUFFERS: usize = 8;

const NO_SPAN: DeviceSpan = DeviceSpan {
    addr: DeviceAddr(0),
    len: 0,
};

/// The whole view of `h` as a span of its allocation.
pub(super) fn view(h: &Handle) -> Span {
    Span {
        id: h.id(),
        start: h.offset(),
        end: h.offset() + h.len(),
    }
}

/// The refusal of work whose written buffer `output` overlaps buffer `other`.
#[cold]
#[inline(never)]
fn aliased_error(kernel: &'static str, output: usize, other: usize) -> ServerError {
    Validation::AliasedLaunch {
        kernel,
        output,
        other,
    }
    .into()
}

/// Buffer `index` of device work names no memory it may use.
#[cold]
#[inline(never)]
fn buffer_error(kernel: &'static str, index: usize, cause: crate::error::IoError) -> ServerError {
    LaunchError::Buffer {
        kernel,
        index,
        cause,
    }
    .into()
}

/// The refusal of device work whose buffer `index` names no memory it may use: an output
/// overlapping another buffer is refused first, as it is whatever the handles name.
#[cold]
#[inline(never)]
fn refuse_buffers(
    kernel: &'static str,
    buffers: Buffers<'_>,
    index: usize,
    cause: crate::error::IoError,
) -> ServerError {
    match buffers.aliased() {
        Some((output, other)) => aliased_error(kernel, output, other),
        None => buffer_error(kernel, index, cause),
    }
}

/// The shim's refusal of device work, recorded in the ledger.
#[cold]
#[inline(never)]
fn refused<S: Shim>(
    device: &crate::device::Device<S>,
    kernel: &'static str,
    error: crate::error::DriverError,
) -> ServerError {
    LaunchError::Refused {
        kernel,
        cause: device.ledger.call_failed(error),
    }
    .into()
}

/// A library's own error, kept whole.
#[cold]
#[inline(never)]
fn library_failed(work: &'static str, error: LibraryError) -> ServerError {
    LaunchError::Library { work, error }.into()
}

/// The ranges `writes` carry a new failure whose root is `error` (a refusal).
#[cold]
#[inline(never)]
fn fail_writes(
    failures: &mut crate::failure::Failures,
    writes: impl Iterator<Item = Span>,
    error: &ServerError,
) {
    let f = failures.new_failure(error.clone());
    writes.for_each(|w| failures.mark(w.id, w.start, w.end, f));
    failures.prune(f);
}

impl<'t, S: Shim> Touches<'t, S> {
    /// The spans the work reads (updates included).
    fn reads(&self) -> impl Iterator<Item = Span> + '_ {
        let (views, more, spans): (&[&Handle], &[&Handle], &[Span]) = match self {
            Self::Views(b) => (b.inputs, b.updates, &[]),
            Self::Graph(g) => (&[], &[], &g.reads),
        };
        let views = views.iter().chain(more).map(|h| view(h));
        views.chain(spans.iter().copied())
    }

    /// The spans the work writes (updates included).
    fn writes(&self) -> impl Iterator<Item = Span> + '_ {
        let (more, views, spans): (&[&Handle], &[&Handle], &[Span]) = match self {
            Self::Views(b) => (b.updates, b.outputs, &[]),
            Self::Graph(g) => (&[], &[], &g.writes),
        };
        let views = more.iter().chain(views).map(|h| view(h));
        views.chain(spans.iter().copied())
    }
}

impl<S: Shim> Command<'_, S> {
    /// Runs device work named `name`: a launch, library work or a replay. See the module
    /// documentation for the steps.
    pub(super) fn run(
        &mut self,
        name: &'static str,
        mut work: Work<'_, S>,
    ) -> Result<(), ServerError> {
        // Begin, then what a kernel's geometry and parameters say on their face.
        self.begin()?;
        if let Work::Kernel {
            dims,
            params,
            buffers,
            ..
        } = &work
            && let Some(refusal) = super::launch_check::refused(name, *dims, params, buffers.len())
        {
            return Err(refusal.into());
        }
        // Check, resolve each handle once, then order after other streams. The usual path falls
        // through: what is rare (a refusal, a graph, the failure rule's skip, a recording) is
        // in functions of its own, out of the way of the hot code.
        let touches = work.touches();
        let stance = self.stance();
        let mut spans = [NO_SPAN; STACK_BUFFERS];
        let count = match touches {
            Touches::Views(buffers) => self.resolve_views(name, buffers, &mut spans)?,
            Touches::Graph(g) => {
                self.order_graph(g, stance)?;
                0
            }
        };
        // The failure rule: recorded work applies it at each replay instead.
        let no_failures = self.device.failures.is_empty();
        if stance != Stance::Record && !no_failures {
            self.failure_rule(name, &touches)?;
        }
        // A recording takes the work's touches before the call, so what a panicking library
        // call enqueued is still kept alive and guarded for the graph.
        if stance == Stance::Record {
            self.note_recorded(&touches);
        }
        // The device call. What the usual outcome needs (the stream's flush policy, whether a
        // failure is on record) is read before it, and the stream's last kernel is written before
        // it (put back if the call is refused): the driver's call leaves the core's lines out of
        // the caches, and a clean success then touches none of them again.
        let device = &mut *self.device;
        let spans: &[DeviceSpan] = if count > STACK_BUFFERS {
            &device.launch_spans
        } else {
            &spans[..count]
        };
        let s = device.streams[self.stream]
            .as_mut()
            .expect("a command's stream exists");
        let flush_due = s.drops.should_flush();
        let last_kernel = s.last_kernel;
        if stance != Stance::Record {
            s.last_kernel = Some(name);
        }
        let raw = &s.raw;
        let shim = &*device.shim;
        let called: Result<(), Refusal> = match &mut work {
            Work::Kernel {
                kernel,
                dims,
                params,
                ..
            } => {
                // SAFETY: every span was resolved just now to a live range of its allocation,
                // no output overlaps another buffer (checked above), and the kernel touches only
                // its buffers (the shim's contract).
                unsafe { shim.launch(raw, kernel, *dims, spans, params) }.map_err(Refusal::Shim)
            }
            Work::Library { call, .. } => {
                call(shim.native_stream(raw), spans).map_err(Refusal::Library)
            }
            Work::Replay(g) => {
                // SAFETY: the graph keeps every allocation it touches alive and every page they
                // lie on guarded (no move, no reuse), and its host bytes are its own; the drop
                // queue keeps all of it until a fence after this replay passes.
                unsafe { shim.graph_launch(&g.exec, raw) }.map_err(Refusal::Shim)
            }
        };
        // The usual outcome: a clean success, nothing on record, no flush due, not a graph.
        if called.is_ok()
            && no_failures
            && !flush_due
            && stance != Stance::Record
            && matches!(touches, Touches::Views(_))
        {
            return Ok(());
        }
        self.outcome(name, &touches, stance, last_kernel, called)
    }

    /// The outcome of device work past the usual case: a refusal (the stream's last kernel put
    /// back, the writes failed), a recording, failures on record to settle, a graph for the drop
    /// queue, or a flush due.
    #[inline(never)]
    fn outcome(
        &mut self,
        name: &'static str,
        touches: &Touches<'_, S>,
        stance: Stance,
        last_kernel: Option<&'static str>,
        called: Result<(), Refusal>,
    ) -> Result<(), ServerError> {
        let called = called.map_err(|r| {
            if stance != Stance::Record {
                self.current().last_kernel = last_kernel;
            }
            match r {
                Refusal::Shim(e) => refused(self.device, name, e),
                Refusal::Library(e) => library_failed(name, e),
            }
        });
        if stance == Stance::Record {
            return self.record_outcome(called);
        }
        if called.is_err() || !self.device.failures.is_empty() {
            self.settle_writes(touches.writes(), &called);
        }
        called?;
        let s = self.current();
        if let Touches::Graph(g) = touches {
            s.drops.push_graph(g);
        }
        // Flush by policy.
        if s.drops.should_flush() {
            self.flush_after_enqueue()?;
        }
        Ok(())
    }

    /// Orders this stream after other streams' work on everything a replayed graph touches
    /// (its memory stays alive through the graph, which rides the drop queue). A graph inside a
    /// recording is refused: CUDA would need a child-graph node.
    #[inline(never)]
    fn order_graph(&mut self, g: &Recorded<S>, stance: Stance) -> Result<(), ServerError> {
        if stance == Stance::Record {
            return Err(Validation::Recording { op: "replay" }.into());
        }
        for b in &g.touched {
            self.device.order_kept(self.stream, b)?;
        }
        Ok(())
    }

    /// The failure rule, once some failure is on record: when an input carries one, the work is
    /// skipped, the ranges it writes carry the same failure, and the skip is the answer.
    #[cold]
    #[inline(never)]
    fn failure_rule(
        &mut self,
        name: &'static str,
        touches: &Touches<'_, S>,
    ) -> Result<(), ServerError> {
        let Some(f) = self.carried(touches.reads()) else {
            return Ok(());
        };
        let failures = &mut self.device.failures;
        failures.skipped(f, name);
        touches
            .writes()
            .for_each(|w| failures.mark(w.id, w.start, w.end, f));
        Err(ServerError::Skipped {
            kernel: name,
            failure: f,
        })
    }

    /// The ranges of work this stream records join the recording's window (before the device
    /// call: see `run`).
    #[cold]
    #[inline(never)]
    fn note_recorded(&mut self, touches: &Touches<'_, S>) {
        if let Some(w) = self.device.capture.window_mut() {
            touches.reads().for_each(|r| w.read(r));
            touches.writes().for_each(|r| w.write(r));
        }
    }

    /// The outcome of work made while this stream records: a refusal discards the recording.
    #[cold]
    #[inline(never)]
    fn record_outcome(&mut self, called: Result<(), ServerError>) -> Result<(), ServerError> {
        if let Err(e) = &called {
            self.discard_recording(e);
        }
        called
    }

    /// Resolves every buffer of device work once (no side effect: a handle that names no memory
    /// is the work's buffer error, named by position), then orders this stream after other
    /// streams' work on each. The spans land in `spans` (or the device's warm vector past
    /// [`STACK_BUFFERS`]); returns how many.
    fn resolve_views(
        &mut self,
        name: &'static str,
        buffers: Buffers<'_>,
        spans: &mut [DeviceSpan; STACK_BUFFERS],
    ) -> Result<usize, ServerError> {
        let count = buffers.len();
        let on_heap = count > STACK_BUFFERS;
        if on_heap {
            self.device.launch_spans.clear();
            self.device.launch_spans.resize(count, NO_SPAN);
        }
        // Whether some buffer is owned by another stream (only such memory is ordered when the
        // order is quiet: see below).
        let mut foreign = false;
        let mut index = 0;
        for list in buffers.lists() {
            for h in list {
                let t = match self.device.target(*h) {
                    Ok(t) => t,
                    Err(cause) => return Err(refuse_buffers(name, buffers, index, cause)),
                };
                foreign |= t.owner != self.stream;
                let span = t.span;
                if on_heap {
                    self.device.launch_spans[index] = span;
                } else {
                    spans[index] = span;
                }
                index += 1;
            }
        }
        // No written buffer may overlap another: the views' device ranges are at hand (on the
        // stack up to 8 buffers), so the usual case (no two ranges meet) reads nothing else; a meeting pair is judged by
        // the handles (only views of one allocation alias; its views meet in device addresses).
        let resolved = if on_heap {
            &self.device.launch_spans[..]
        } else {
            &spans[..count]
        };
        if count > 1
            && ranges_meet(resolved, buffers.inputs.len())
            && let Some((output, other)) = buffers.aliased()
        {
            return Err(aliased_error(name, output, other));
        }
        // Nothing to wait for in the usual case (asked once, not per buffer): only memory
        // another stream owns is ordered then.
        if foreign || !self.device.order_is_quiet() {
            self.order_buffers(buffers)?;
        }
        Ok(count)
    }

    /// Orders this stream after other streams' work on each buffer (all resolved: the checks
    /// passed, so ordering's side effects may start; the order skips what has nothing to wait
    /// for itself).
    #[inline(never)]
    fn order_buffers(&mut self, buffers: Buffers<'_>) -> Result<(), ServerError> {
        for list in buffers.lists() {
            for h in list {
                // The owner, found by `target` already (not kept: the firmware's stack is
                // small); found again the same way, which reads no line `target` did not.
                let owner = self.device.owner_of(*h)?.0;
                self.device.order_after(self.stream, *h, owner)?;
            }
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
        writes: impl Iterator<Item = Span>,
        outcome: &Result<(), ServerError>,
    ) {
        let failures = &mut self.device.failures;
        match outcome {
            Ok(()) => {
                if !failures.is_empty() {
                    writes.for_each(|w| failures.written(w.id, w.start, w.end));
                }
            }
            Err(error) => fail_writes(failures, writes, error),
        }
    }

    /// Flushes the drop queue after an enqueue that asked for it. The enqueue itself succeeded:
    /// a fault the flush's fence reveals belongs to earlier work, so only a lost device fails
    /// this call (see [`crate::fault`]).
    pub(super) fn flush_after_enqueue(&mut self) -> Result<(), ServerError> {
        let (shim, s) = self.parts();
        let fenced = s.flush(shim);
        self.device.ledger.defer(self.stream, fenced)
    }
}
