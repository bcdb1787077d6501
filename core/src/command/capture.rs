//! The capture operations of a command: begin a recording, end it into a [`Graph`] (or update a
//! graph in place with it), replay a graph, hold room ahead of a recording, and discard a
//! recording whose step failed.
//!
//! Owns the order of each transition's steps (the state changes first, so a refused call runs
//! nothing), sealing (guards on every touched page, the graph's upload) and the failure rule of a
//! replay. Does not own the state machine (`capture/state.rs`), what a recording collects
//! (`capture/window.rs`) nor what a sealed graph keeps (`capture/graph.rs`).

use super::Command;
use super::engine::Work;
use crate::capture::{CapturePhase, CaptureState, Graph, Owned, Recorded, Recording, Span, Window};
use crate::error::{CaptureError, ServerError};
use crate::failure::Failures;
use crate::memory::{PageGuard, PageRef};
use crate::shim::Shim;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::AtomicBool;

/// Marks every range of `spans` with a new failure whose root is `error`.
fn fail_spans(failures: &mut Failures, spans: &[Span], error: ServerError) {
    let f = failures.new_failure(error);
    for s in spans {
        failures.mark(s.id, s.start, s.end, f);
    }
    failures.prune(f);
}

impl<S: Shim> Command<'_, S> {
    /// Where this stream is in the capture cycle.
    pub fn capture_phase(&self) -> CapturePhase {
        self.device.capture.phase(self.stream)
    }

    /// Starts recording this stream into a graph named `name`: from now until
    /// [`Self::end_capture`], copies and launches enqueued on it are recorded, not run (see
    /// [`crate::capture`] for what a recording allows). Hold the room its reservations need
    /// first ([`Self::hold`], or a warm-up run of the same work).
    ///
    /// # Errors
    ///
    /// [`CaptureError::AnotherRecords`] while a recording of the device is open;
    /// [`CaptureError::Refused`] when the device refuses (a shim without graphs); the failures
    /// every operation begins with. Nothing changes on an error.
    pub fn begin_capture(&mut self, name: &'static str) -> Result<Recording, ServerError> {
        self.begin()?;
        let stream = self.stream as u32;
        if let Some(open) = self.device.capture.open() {
            return Err(CaptureError::AnotherRecords {
                stream,
                recording: open as u32,
            }
            .into());
        }
        let device = &mut *self.device;
        let s = device.streams[self.stream]
            .as_mut()
            .expect("a command's stream exists");
        let shim = &*device.shim;
        // Other streams wait on this for the stream's work before the recording (an event
        // recorded during it would lie inside it). The flag goes up before the shim's capture.
        let pre_event = shim.record_event(&s.raw);
        let began = pre_event.and_then(|pre| {
            device
                .capture
                .announce(|| shim.begin_capture(&s.raw).map(|()| pre))
        });
        let pre_event = began.map_err(|e| CaptureError::Refused {
            stream,
            cause: self.device.ledger.call_failed(e),
        })?;
        let abandoned = Arc::new(AtomicBool::new(false));
        let cursor = self.current().cursor;
        let window = Window::new(name, cursor, Some(pre_event), Arc::clone(&abandoned));
        self.device.capture.begin(self.stream, window)?;
        Ok(Recording {
            device: self.device.id,
            stream,
            abandoned,
            ended: false,
        })
    }

    /// Ends `recording` (begun on this stream) and seals it into a [`Graph`]: every page it
    /// touched is guarded and the graph is uploaded ahead of its first replay.
    ///
    /// # Errors
    ///
    /// [`CaptureError::Discarded`] when a step of the recording failed (the reason is inside);
    /// [`CaptureError::Refused`] when the device refuses to instantiate it (the buffers it would
    /// have written then carry that failure); [`CaptureError::NotRecording`] for a recording of
    /// another stream or device (which is then abandoned). The stream is idle again after any of
    /// them.
    pub fn end_capture(&mut self, recording: Recording) -> Result<Graph<S>, ServerError> {
        let (window, ended) = self.close(recording, |shim, raw| shim.end_capture(raw, false))?;
        let exec = self.instantiated(&window, ended)?;
        Ok(self.seal(*window, Arc::new(exec)))
    }

    /// Ends `recording` as [`Self::end_capture`] does, into `graph`: where the device can update
    /// `graph` in place (the same work with new parameters: CUDA's exec update), it does, and
    /// otherwise `graph` gets a new instantiation. Either way `graph` replays the new recording
    /// from now on; replays enqueued before keep what they were enqueued with, and what the old
    /// recording touched is released once they are done.
    ///
    /// # Errors
    ///
    /// As [`Self::end_capture`] (`graph` is then unchanged); [`CaptureError::ForeignGraph`] for a
    /// graph of another device (this stream's recording is then thrown away, nothing marked, and
    /// the stream is idle again at once; a recording of another stream is abandoned, and ends
    /// at the next command).
    pub fn end_capture_update(
        &mut self,
        recording: Recording,
        graph: &mut Graph<S>,
    ) -> Result<(), ServerError> {
        if graph.device != self.device.id {
            // This stream's recording ends now, thrown away, not at the next command: work this
            // command enqueues after the error runs instead of joining a recording nobody ends.
            let ours = recording.device == self.device.id && recording.stream == self.stream as u32;
            drop(recording);
            if ours {
                self.device.abort_capture();
            }
            return Err(CaptureError::ForeignGraph {
                recorded_on: graph.device,
                used_on: self.device.id,
            }
            .into());
        }
        let exec = Arc::clone(&graph.recorded.exec);
        let (window, ended) = self.close(recording, |shim, raw| {
            shim.end_capture_update(raw, false, &exec)
        })?;
        let exec = match self.instantiated(&window, ended)? {
            Some(new) => Arc::new(new),
            None => Arc::clone(&graph.recorded.exec),
        };
        let mut sealed = self.seal(*window, exec);
        // `graph` takes the new recording; `sealed`, holding the old one, drops as a graph does:
        // the old recording goes back through the device once its replays are done.
        core::mem::swap(&mut graph.recorded, &mut sealed.recorded);
        graph.stream = sealed.stream;
        drop(sealed);
        Ok(())
    }

    /// The shim's answer to the end of a recording; on a refusal the buffers the recording would
    /// have written carry it.
    fn instantiated<G>(
        &mut self,
        window: &Window<S>,
        ended: Result<G, crate::DriverError>,
    ) -> Result<G, ServerError> {
        ended.map_err(|e| {
            let error: ServerError = CaptureError::Refused {
                stream: self.stream as u32,
                cause: self.device.ledger.call_failed(e),
            }
            .into();
            fail_spans(&mut self.device.failures, &window.writes, error.clone());
            error
        })
    }

    /// Closes the recording `recording` names on this stream: `end_shim` ends the shim's
    /// capture, then the state goes back to idle and the drop queues thaw; returns what the
    /// recording collected and what the shim answered.
    fn close<R>(
        &mut self,
        mut recording: Recording,
        end_shim: impl FnOnce(&S, &S::Stream) -> R,
    ) -> Result<(alloc::boxed::Box<Window<S>>, R), ServerError> {
        let stream = self.stream as u32;
        if recording.device != self.device.id || recording.stream != stream {
            // Dropping `recording` abandons it: the next command (or operation) aborts it.
            return Err(CaptureError::NotRecording { stream }.into());
        }
        recording.ended = true;
        let index = self.stream;
        let (shim, raw, capture) = self.capture_parts();
        capture.end(index, || end_shim(shim, raw))
    }

    /// The shim, this stream's raw stream and the device's capture state, borrowed together (a
    /// transition ends the shim's capture inside itself).
    fn capture_parts(&mut self) -> (&S, &S::Stream, &mut CaptureState<S>) {
        let device = &mut *self.device;
        let raw = &device.streams[self.stream]
            .as_ref()
            .expect("a command's stream exists")
            .raw;
        (&*device.shim, raw, &mut device.capture)
    }

    /// Seals a closed recording around the shim's graph `exec`: a guard on every page it touched
    /// (each page once), then an upload ahead of the first replay (a refused upload only costs
    /// the first replay its time).
    fn seal(&mut self, window: Window<S>, exec: Arc<S::Graph>) -> Graph<S> {
        let Window {
            name,
            touched,
            reads,
            writes,
            host,
            ..
        } = window;
        let mut guarded: Vec<(usize, PageRef)> = Vec::new();
        let mut guards: Vec<PageGuard> = Vec::new();
        for b in &touched {
            let Ok((owner, _)) = self.device.owner_of(b) else {
                continue;
            };
            let Some(memory) = self.device.streams[owner].as_mut().map(|s| &mut s.memory) else {
                continue;
            };
            let Ok(page) = memory.resolve(b).map(|r| r.page) else {
                continue;
            };
            if guarded.contains(&(owner, page)) {
                continue;
            }
            if let Ok(guard) = memory.guard(b) {
                guarded.push((owner, page));
                guards.push(guard);
            }
        }
        let (shim, s) = self.parts();
        if let Err(e) = shim.graph_upload(&exec, &s.raw) {
            debug!("graph `{}` not uploaded ahead (status {})", name, e.status);
        }
        let host_bytes = host.iter().map(crate::HostBuffer::len).sum();
        // The graph counts rise only here, with nothing left that can fail or unwind before the
        // `Recorded` that lowers them again exists: a shim call above that panics (caught by the
        // caller) leaves no count raised, so the memory stays free to move.
        for b in &touched {
            b.keep_for_graph();
        }
        Graph {
            recorded: core::mem::ManuallyDrop::new(Arc::new(Recorded {
                exec,
                name,
                touched,
                reads,
                writes,
                host: Owned::new(host),
                host_bytes,
                guards,
            })),
            returns: Arc::clone(self.device.capture.returns()),
            device: self.device.id,
            stream: self.stream as u32,
        }
    }

    /// Discards this stream's recording after `reason` failed one of its steps: the shim's
    /// capture is ended and thrown away, the buffers the recording would have written carry the
    /// failure, and every operation on the stream that begins as the engine does (all but
    /// `flush_drops`, `poll_drops`, `reserve_host` and `lazy`) answers it until
    /// [`Self::end_capture`]. Does nothing unless this stream records.
    pub(super) fn discard_recording(&mut self, reason: &ServerError) {
        let stream = self.stream;
        let (shim, raw, capture) = self.capture_parts();
        // Ends the recording whatever it answers; a graph from a doomed end is dropped.
        let end = || drop(shim.end_capture(raw, true));
        let Some(window) = capture.discard(stream, reason.clone(), end) else {
            return;
        };
        if let Err(error) = self.device.capture.check_open(self.stream) {
            fail_spans(&mut self.device.failures, &window.writes, error);
        }
    }

    /// Enqueues one replay of `graph` on this stream, ordered after other streams' work on the
    /// memory it touches. A replay whose input carries a failure is skipped and its outputs
    /// carry the failure; a refused replay marks its outputs with the refusal; a fault while it
    /// runs is a fault of this stream's work (named after the graph). Replays in flight keep
    /// what the graph touches alive, whatever happens to `graph`.
    ///
    /// # Errors
    ///
    /// [`CaptureError::ForeignGraph`]; [`Validation::Recording`](crate::Validation::Recording) while this stream records (other
    /// streams replay while one records);
    /// [`CaptureError::RecordedElsewhere`] when another stream's recording uses its memory;
    /// [`ServerError::Skipped`] (named after the graph); [`LaunchError::Refused`](crate::LaunchError::Refused); the failures
    /// every operation begins with and those of cross-stream order.
    pub fn replay(&mut self, graph: &Graph<S>) -> Result<(), ServerError> {
        if graph.device != self.device.id {
            // The device's bookkeeping and the ledger come first, as for every operation.
            self.begin()?;
            return Err(CaptureError::ForeignGraph {
                recorded_on: graph.device,
                used_on: self.device.id,
            }
            .into());
        }
        let recorded = &graph.recorded;
        self.run(recorded.name, Work::Replay(recorded))
    }
}
