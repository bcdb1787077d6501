//! A sealed recording: the [`Graph`] a caller holds, and what it keeps alive.
//!
//! Owns the instantiated graph of the shim together with everything its replays touch: a binding
//! of every allocation the recording used (so none is freed or rebound under it), a guard on every
//! page they lie on (so nothing moves and nothing new is carved there), the host bytes of its
//! uploads, and the ranges it reads and writes (for the failure rule). All of it lives in one
//! shared [`Recorded`]: the caller's [`Graph`] holds it, and so does each replay's entry in its
//! stream's drop queue until the fence after that replay passes. A dropped graph goes back
//! through the device ([`GraphReturns`]), which lets it go only while no stream records: so the
//! shim's graph is destroyed, and registered host bytes unregistered, outside any recording.
//! Does not own replays or sealing (`command/capture.rs`).

use super::window::Span;
use crate::host::HostBuffer;
use crate::id::StreamId;
use crate::memory::{Binding, PageGuard, ReturnQueue};
use crate::shim::Shim;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::mem::ManuallyDrop;

/// Graphs dropped by their callers, on their way back to the device thread.
pub(crate) type GraphReturns<S> = Arc<ReturnQueue<Arc<Recorded<S>>>>;

/// What a graph keeps alive, shared by the caller's [`Graph`] and its replays in flight (a drop
/// queue holds one per replay: [`DropItem::Graph`](crate::drop_queue::DropItem::Graph)). Opaque.
pub struct Recorded<S: Shim> {
    /// The shim's graph. First, so it is destroyed before what it uses goes.
    pub(crate) exec: Arc<S::Graph>,
    pub(crate) name: &'static str,
    pub(crate) touched: Vec<Binding>,
    pub(crate) reads: Vec<Span>,
    pub(crate) writes: Vec<Span>,
    /// Kept, never read: the sources of the recorded uploads, dropped with the graph.
    #[allow(dead_code)]
    pub(crate) host: Owned<Vec<HostBuffer>>,
    /// Bytes of `host`.
    pub(crate) host_bytes: usize,
    pub(crate) guards: Vec<PageGuard>,
}

impl<S: Shim> Drop for Recorded<S> {
    fn drop(&mut self) {
        // The graph no longer keeps its allocations: their memory may change hands again.
        for b in &self.touched {
            b.release_graph();
        }
    }
}

/// A value only ever reached by whoever owns it (never through a shared reference), so sharing a
/// reference to the wrapper across threads shares nothing: the graph's host buffers are kept,
/// never read, while replays on several threads hold the graph.
pub(crate) struct Owned<T>(T);

impl<T> Owned<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(value)
    }
}

// SAFETY: `Owned` gives no access to its value through `&Owned` (no method takes `&self`), so a
// shared reference on another thread can neither read nor write it; moving it needs `T: Send`.
unsafe impl<T: Send> Sync for Owned<T> {}

impl<S: Shim> core::fmt::Debug for Recorded<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Recorded")
            .field("exec", &self.exec)
            .field("name", &self.name)
            .field("touched", &self.touched.len())
            .field("reads", &self.reads)
            .field("writes", &self.writes)
            .field("host_bytes", &self.host_bytes)
            .field("guards", &self.guards.len())
            .finish()
    }
}

/// A recording sealed by [`Command::end_capture`](crate::Command::end_capture): replay it with
/// [`Command::replay`](crate::Command::replay) on any stream of the device that recorded it, as
/// often as needed.
///
/// While it lives, every allocation its work touches stays allocated (also one the recording
/// freed), every page they lie on is guarded, and the host bytes of its uploads are its own.
/// Dropping it gives them back once a fence after its last replay passed (from any thread: the
/// device takes it back at its next command).
///
/// **Inputs between replays**: a replay re-sends the bytes each recorded upload had when it was
/// recorded. To feed new data, write it into a device buffer the graph reads (with
/// [`Command::write`](crate::Command::write), on the replay's stream or any other: the write is
/// ordered after earlier replays and before later ones), and record the graph to read that
/// buffer rather than upload into it.
pub struct Graph<S: Shim> {
    /// Moved into the device's queue when the graph drops (never dropped here: see `Drop`).
    pub(crate) recorded: ManuallyDrop<Arc<Recorded<S>>>,
    pub(crate) returns: GraphReturns<S>,
    pub(crate) device: u32,
    pub(crate) stream: u32,
}

impl<S: Shim> Graph<S> {
    /// The name given at [`Command::begin_capture`](crate::Command::begin_capture): a replay's
    /// failure chain and a stream fault after it name the graph by it.
    pub fn name(&self) -> &'static str {
        self.recorded.name
    }

    /// The stream it was recorded on.
    pub fn recorded_on(&self) -> StreamId {
        StreamId(self.stream)
    }

    /// Allocations its work touches (each kept while the graph lives).
    pub fn allocations(&self) -> usize {
        self.recorded.touched.len()
    }

    /// Pages it guards.
    pub fn guarded_pages(&self) -> usize {
        self.recorded.guards.len()
    }

    /// Host bytes it owns (the sources of its uploads).
    pub fn host_bytes(&self) -> usize {
        self.recorded.host_bytes
    }

    /// The shim's own graph, for code that measures or launches it outside the layer. Launching
    /// it that way is the caller's business: no order, no failure rule, no keep-alive.
    pub fn shim_graph(&self) -> &S::Graph {
        &self.recorded.exec
    }
}

impl<S: Shim> core::fmt::Debug for Graph<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Graph")
            .field("recorded", &self.recorded)
            .field("device", &self.device)
            .field("stream", &self.stream)
            .finish_non_exhaustive()
    }
}

impl<S: Shim> Drop for Graph<S> {
    fn drop(&mut self) {
        // The device lets it go at its next command, outside any recording (replays in flight
        // hold their own references until their fences pass). The graph's own reference is
        // moved into the queue, not cloned: a clone would leave this one to drop here, after
        // the device may have dropped the queued one, and the last reference (the shim's graph
        // destroyed, host bytes unregistered) would then go on this thread, maybe while a stream
        // records. Only a memory manager's queue is ever closed: this push always lands.
        // SAFETY: `recorded` is taken once, here, and the graph is not used after its drop.
        let recorded = unsafe { ManuallyDrop::take(&mut self.recorded) };
        let _ = self.returns.push(recorded);
    }
}
