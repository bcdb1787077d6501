//! Graphs: none yet.

/// An instantiated graph. **None can exist yet** (the type has no values): graphs by stream
/// capture (begin, end, instantiate, upload, launch) come with issue 8. Until then
/// [`Shim::begin_capture`](devcmd::Shim::begin_capture) and the other graph calls answer
/// [`Fault::Unsupported`](devcmd::Fault::Unsupported), and the core records nothing.
#[derive(Debug)]
pub enum CudaGraph {}
