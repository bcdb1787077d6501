//! Graphs: the operations a stream recorded, replayed as one operation.

use crate::stream::Op;
use std::fmt;
use std::sync::Arc;

/// An instantiated recording: the list of operations enqueued on a stream between
/// [`Shim::begin_capture`](devcmd::Shim::begin_capture) and
/// [`Shim::end_capture`](devcmd::Shim::end_capture).
///
/// [`Shim::graph_launch`](devcmd::Shim::graph_launch) enqueues one operation that runs the list in
/// order. Copies keep the host pointers they were recorded with, so each replay re-reads the host
/// source bytes (and rewrites the host destination); launches keep the argument bytes they were
/// recorded with. Dropping a graph while a replay is pending is safe: the replay holds the list.
pub struct StdGraph {
    pub(crate) ops: Arc<Vec<Op>>,
}

impl StdGraph {
    /// How many operations the recording holds.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether the recording holds nothing.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

impl fmt::Debug for StdGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StdGraph")
            .field("ops", &self.ops.len())
            .finish()
    }
}
