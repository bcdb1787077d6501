//! Graphs: the operations a stream recorded, replayed as one operation.
//!
//! Owns [`StdGraph`] (the recorded list, replaceable in place by an update of the same shape),
//! the beginning and end of a recording, and the shape rule of an update. Does not own the
//! recording of operations (`stream.rs` diverts a recording stream's operations into its list)
//! nor what a recording forbids (`device.rs` refuses those calls and invalidates the recording).

use crate::device::StdShim;
use crate::faults::{classify, status};
use crate::lock;
use crate::stream::{Op, StdStream};
use devcmd::{DriverError, ShimOp};
use std::fmt;
use std::sync::{Arc, Mutex};

/// An instantiated recording: the list of operations enqueued on a stream between
/// [`Shim::begin_capture`](devcmd::Shim::begin_capture) and
/// [`Shim::end_capture`](devcmd::Shim::end_capture).
///
/// [`Shim::graph_launch`](devcmd::Shim::graph_launch) enqueues one operation that runs the list in
/// order. Copies keep the host pointers they were recorded with, so each replay re-reads the host
/// source bytes (and rewrites the host destination); launches keep the argument bytes they were
/// recorded with. Dropping a graph while a replay is pending is safe: the replay holds the list.
///
/// [`Shim::end_capture_update`](devcmd::Shim::end_capture_update) replaces the list in place when
/// the new recording has the same shape (as many operations, each of the same kind: a copy in
/// the same direction, a launch of the same kernel), as CUDA's exec update does; replays already
/// enqueued keep the list they were enqueued with.
pub struct StdGraph {
    ops: Mutex<Arc<Vec<Op>>>,
}

impl StdGraph {
    pub(crate) fn new(ops: Vec<Op>) -> Self {
        Self {
            ops: Mutex::new(Arc::new(ops)),
        }
    }

    /// The list a replay enqueued now runs.
    pub(crate) fn ops(&self) -> Arc<Vec<Op>> {
        Arc::clone(&lock(&self.ops))
    }

    /// Replaces the list with `ops` when they have the same shape; gives them back otherwise.
    pub(crate) fn update(&self, ops: Vec<Op>) -> Result<(), Vec<Op>> {
        let mut current = lock(&self.ops);
        if !same_shape(&current, &ops) {
            return Err(ops);
        }
        *current = Arc::new(ops);
        Ok(())
    }

    /// How many operations the recording holds.
    pub fn len(&self) -> usize {
        lock(&self.ops).len()
    }

    /// Whether the recording holds nothing.
    pub fn is_empty(&self) -> bool {
        lock(&self.ops).is_empty()
    }
}

impl fmt::Debug for StdGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StdGraph")
            .field("ops", &self.len())
            .finish()
    }
}

/// Whether two recordings have the same topology: the operations an update may change in place
/// are parameters (addresses, sizes, scalars, geometry), never their number or kinds.
fn same_shape(a: &[Op], b: &[Op]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|pair| match pair {
            (Op::Copy(x), Op::Copy(y)) => {
                (x.src_device, x.dst_device) == (y.src_device, y.dst_device)
            }
            // CUDA does not let an update change which contexts a copy joins.
            (Op::Peer(x, a), Op::Peer(y, b)) => {
                (x.src_device, x.dst_device) == (y.src_device, y.dst_device)
                    && std::sync::Arc::ptr_eq(a, b)
            }
            (Op::Launch { kernel: x, .. }, Op::Launch { kernel: y, .. }) => x.name() == y.name(),
            (Op::Wait { .. }, Op::Wait { .. })
            | (Op::Replay(_), Op::Replay(_))
            | (Op::Host(_), Op::Host(_))
            | (Op::Fail(_), Op::Fail(_)) => true,
            _ => false,
        })
}

impl StdShim {
    /// Starts recording `stream`.
    pub(crate) fn capture_begin(&self, stream: &StdStream) -> Result<(), DriverError> {
        self.enter(ShimOp::GraphBegin, 0)?;
        if !stream.shared.begin_capture() {
            return Err(classify(ShimOp::GraphBegin, status::CAPTURE_STATE));
        }
        self.inner.open_capture(stream.shared.id);
        Ok(())
    }

    /// Ends the recording of `stream` (always: the stream no longer records, whatever the
    /// answer) and returns what it recorded, unless it was doomed or invalidated.
    pub(crate) fn capture_end(
        &self,
        stream: &StdStream,
        doomed: bool,
    ) -> Result<Vec<Op>, DriverError> {
        const OP: ShimOp = ShimOp::GraphEnd;
        let recorded = stream.shared.end_capture();
        let invalidated = self.inner.close_capture(stream.shared.id);
        self.enter(OP, 0)?;
        let Some(ops) = recorded else {
            return Err(classify(OP, status::CAPTURE_STATE));
        };
        if doomed {
            return Err(classify(OP, status::CAPTURE_DOOMED));
        }
        if invalidated == Some(true) {
            return Err(classify(OP, status::CAPTURE_INVALIDATED));
        }
        Ok(ops)
    }
}
