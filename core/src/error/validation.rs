//! A call the layer refuses because of how it was made: [`Validation`].

use core::fmt;

/// A call the layer refuses because of how it was made, not because of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Validation {
    /// A stream index past the device's limit.
    StreamOutOfRange {
        /// The index asked for.
        stream: u32,
        /// How many streams the device allows.
        max: u32,
    },
    /// A stream borrowed ([`Device::borrow_stream`](crate::Device::borrow_stream)) under an id
    /// the device already uses.
    StreamInUse {
        /// The id asked for.
        stream: u32,
    },
    /// Host data whose length does not match the copy's layout.
    LengthMismatch {
        /// Bytes the layout needs.
        expected: u64,
        /// Bytes given.
        found: u64,
    },
    /// Typed data moved into or out of a [`HostBuffer`](crate::HostBuffer) whose length is not
    /// the buffer's.
    HostBufferLength {
        /// The operation (`"HostBuffer::copy_from"`, ...).
        op: &'static str,
        /// Bytes the buffer holds.
        buffer: u64,
        /// Bytes of the caller's data.
        given: u64,
    },
    /// A [`HostBuffer`](crate::HostBuffer) read as elements its length is no whole number of.
    NotWholeElements {
        /// Bytes the buffer holds.
        len: u64,
        /// Bytes of one element.
        element: u64,
    },
    /// A copy between two views of different lengths ([`Command::copy_from`](crate::Command::copy_from)).
    ViewLengths {
        /// Bytes of the destination's view.
        dst: u64,
        /// Bytes of the source's view.
        src: u64,
    },
    /// A copy whose device side passes the end of the handle's view.
    LayoutPastView {
        /// Bytes the layout spans on the device.
        span: u64,
        /// Bytes of the view.
        view: u64,
    },
    /// A host buffer that cannot be written (external, read-only bytes) given as a destination.
    ReadOnlyDestination,
    /// The operation is refused while a stream records a graph.
    Recording {
        /// The operation.
        op: &'static str,
    },
    /// A launch output overlaps another buffer of the same launch: kernels may run their blocks
    /// in any order, so a buffer both read and written (or written twice) gives no defined
    /// result.
    AliasedLaunch {
        /// The kernel.
        kernel: &'static str,
        /// Position of the output among the launch's buffers (inputs first).
        output: usize,
        /// Position of the buffer it overlaps.
        other: usize,
    },
    /// A kernel parameter names a buffer slot the launch does not have.
    LaunchParam {
        /// The kernel.
        kernel: &'static str,
        /// Position of the parameter.
        param: usize,
        /// The slot it names.
        slot: usize,
        /// Buffers the launch has (inputs and outputs).
        buffers: usize,
    },
    /// An operand of library work is shorter than the work needs (checked by a library wrapper
    /// such as a GEMM's, before the library sees it).
    LibraryOperand {
        /// The work.
        work: &'static str,
        /// The operand (`"A"`, `"B"`, `"C"` of a GEMM).
        operand: &'static str,
        /// Bytes the work reads or writes through it.
        needs: u64,
        /// Bytes the handle views.
        found: u64,
    },
    /// A leading dimension of library work below the rows of its operand's columns (BLAS asks
    /// at least `max(1, rows)`).
    LibraryLeadingDimension {
        /// The work.
        work: &'static str,
        /// The operand (`"A"`, `"B"`, `"C"` of a GEMM).
        operand: &'static str,
        /// The leading dimension's name (`"lda"`, ...).
        name: &'static str,
        /// Its value.
        value: u64,
        /// The least it may be.
        least: u64,
    },
    /// An operand of library work that does not start at a multiple of its element's size (the
    /// library reads whole elements: a misaligned one faults on a GPU).
    LibraryAlignment {
        /// The work.
        work: &'static str,
        /// The operand (`"A"`, `"B"`, `"C"` of a GEMM).
        operand: &'static str,
        /// Where the handle's view starts in its allocation, in bytes.
        offset: u64,
        /// The element's size in bytes.
        element: u64,
    },
    /// A dimension of library work past what the library's integers hold (BLAS's `int`).
    LibraryDimension {
        /// The work.
        work: &'static str,
        /// The dimension (`"m"`, `"lda"`, ...).
        dimension: &'static str,
        /// Its value.
        value: u64,
        /// The largest the library takes.
        max: u64,
    },
    /// A product split along k into parts (a split-K GEMM) whose part count does not divide k.
    LibrarySplit {
        /// The work.
        work: &'static str,
        /// The product's k.
        k: u64,
        /// The parts asked for.
        parts: u64,
    },
    /// Library work asked for a form its wrapper does not run (a transposed operand where only
    /// untransposed ones are taken, say).
    LibraryUnsupported {
        /// The work.
        work: &'static str,
        /// What it does not take.
        what: &'static str,
    },
    /// A launch extent (a grid or block dimension) is zero.
    LaunchDims {
        /// The kernel.
        kernel: &'static str,
        /// The geometry asked for.
        dims: crate::shim::LaunchDims,
    },
}

impl fmt::Display for Validation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StreamOutOfRange { stream, max } if *max >= 1 << 16 => write!(
                f,
                "stream {stream} asked for but a device has at most {max} streams (a handle's id \
                 names its stream in 16 bits); use 0..{max}"
            ),
            Self::StreamOutOfRange { stream, max } => write!(
                f,
                "stream {stream} asked for but this device allows {max} streams; use 0..{max} \
                 or raise `DeviceConfig::max_streams`"
            ),
            Self::StreamInUse { stream } => write!(
                f,
                "stream {stream} already exists on this device, so it cannot be borrowed; borrow \
                 a native stream under an id no command has used yet"
            ),
            Self::LengthMismatch { expected, found } => write!(
                f,
                "the copy's layout needs {expected} host bytes but {found} were given; \
                 pass data of the layout's packed size"
            ),
            Self::HostBufferLength { op, buffer, given } => write!(
                f,
                "`{op}` was given {given} bytes of data for a host buffer of {buffer}; pass \
                 exactly {buffer} bytes (or reserve a buffer of {given})"
            ),
            Self::NotWholeElements { len, element } => write!(
                f,
                "the host buffer's {len} bytes are no whole number of {element}-byte elements; \
                 read it as bytes, or use a buffer whose length is a multiple of {element}"
            ),
            Self::ViewLengths { dst, src } => write!(
                f,
                "the copy's destination views {dst} bytes but its source {src}; pass views of \
                 equal length (Handle::view)"
            ),
            Self::LayoutPastView { span, view } => write!(
                f,
                "the copy spans {span} device bytes but the handle views {view}; \
                 use a larger handle or a smaller layout"
            ),
            Self::ReadOnlyDestination => f.write_str(
                "a read-only (external) host buffer was given as a copy destination; \
                 reserve a host buffer with `reserve_host`",
            ),
            Self::Recording { op } => write!(
                f,
                "`{op}` is refused while a stream records a graph; call it after the capture ends"
            ),
            Self::AliasedLaunch {
                kernel,
                output,
                other,
            } => write!(
                f,
                "buffer {output} of the launch of `{kernel}` is an output that overlaps buffer \
                 {other} of the same launch; give the kernel a separate output buffer"
            ),
            Self::LaunchParam {
                kernel,
                param,
                slot,
                buffers,
            } => write!(
                f,
                "parameter {param} of the launch of `{kernel}` names buffer slot {slot}, but the \
                 launch has {buffers} buffers (inputs first, then outputs); name a slot below \
                 {buffers}"
            ),
            Self::LibraryOperand {
                work,
                operand,
                needs,
                found,
            } if *needs == u64::MAX => write!(
                f,
                "operand {operand} of `{work}` views {found} bytes but the work's shape spans \
                 more bytes than any address space holds; pass smaller dimensions (leading \
                 dimensions included)"
            ),
            Self::LibraryOperand {
                work,
                operand,
                needs,
                found,
            } => write!(
                f,
                "operand {operand} of `{work}` views {found} bytes but the work touches {needs}; \
                 pass a larger handle or smaller dimensions (leading dimensions included)"
            ),
            Self::LibraryLeadingDimension {
                work,
                operand,
                name,
                value,
                least,
            } => write!(
                f,
                "{name} of `{work}` is {value}, but operand {operand}'s columns hold {least} \
                 rows, so {name} must be at least {least}; pass {name} of {least} or more"
            ),
            Self::LibraryAlignment {
                work,
                operand,
                offset,
                element,
            } => write!(
                f,
                "operand {operand} of `{work}` starts {offset} bytes into its allocation, not a \
                 multiple of its {element}-byte elements; pass a view that starts at a multiple of \
                 {element} bytes"
            ),
            Self::LibraryDimension {
                work,
                dimension,
                value,
                max,
            } => write!(
                f,
                "dimension {dimension} of `{work}` is {value}, past the {max} the library takes; \
                 split the work into smaller products"
            ),
            Self::LibrarySplit { work, k, parts } => write!(
                f,
                "`{work}` splits k = {k} into {parts} parts, but the parts must be at least 1 and \
                 divide k; pass a divisor of k (1 for no split)"
            ),
            Self::LibraryUnsupported { work, what } => write!(
                f,
                "`{work}` does not take {what}; pass the form it takes, or use the plain call"
            ),
            Self::LaunchDims { kernel, dims } => write!(
                f,
                "the launch of `{kernel}` asks for grid {}x{}x{} and block {}x{}x{}, but every \
                 extent must be at least 1; give each at least 1 (LaunchDims::covering makes a \
                 grid over n elements)",
                dims.grid.x, dims.grid.y, dims.grid.z, dims.block.x, dims.block.y, dims.block.z
            ),
        }
    }
}

impl core::error::Error for Validation {}
