//! Kernels: Rust closures registered by name, run by a stream's worker over device spans.
//!
//! A launch's parameters ([`devcmd::KernelParam`]) are copied at launch, in the kernel's order. A
//! kernel reads a scalar by its parameter position with [`KernelCtx::scalar_u32`],
//! [`KernelCtx::scalar_u64`] or [`KernelCtx::scalar_f32`] (the size must match exactly, as on a
//! GPU), finds the buffer slot a parameter names with [`KernelCtx::slot`], and reaches the
//! buffers: typed, inputs shared and outputs mutable, with no allocation
//! ([`KernelCtx::io`]: `let ([w, x], [out]) = ctx.io::<f32, 2, 1>()?;`, or
//! [`KernelCtx::io_bytes`] for buffers of different types), or by slot ([`KernelCtx::buffer`],
//! [`KernelCtx::buffer_mut`], and [`KernelCtx::buffers_mut`], which allocates). The geometry is
//! there ([`KernelCtx::dims`]) but a CPU kernel runs once, looping over its data itself.
//!
//! Owns the kernel type, a launch's copied parameters and what a running kernel sees. Does not
//! own when a kernel runs (the stream's worker, `stream.rs`) nor the launch checks (the core's,
//! and `device.rs`'s admission).

use devcmd::{DeviceSpan, KernelParam, LaunchDims};
use std::fmt;
use std::sync::Arc;

/// What a kernel can report at run time. It surfaces at the queries and waits of the stream's
/// events recorded after the launch, once they completed (the three rules of [`devcmd::shim`]:
/// reported only by completed fences, sticky, carried to streams ordered after it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelFault {
    /// This launch failed while it ran; the device stays usable ([`devcmd::Fault::WorkFailed`]).
    Failed,
    /// The device is lost: nothing will run again ([`devcmd::Fault::DeviceLost`]).
    DeviceLost,
}

/// The body of a kernel. It must touch no memory but the context's buffers.
pub type KernelFn = dyn Fn(&mut KernelCtx<'_>) -> Result<(), KernelFault> + Send + Sync;

/// A loaded kernel: a name and a Rust function. Cheap to clone.
#[derive(Clone)]
pub struct StdKernel {
    name: &'static str,
    body: Arc<KernelFn>,
}

impl StdKernel {
    /// A kernel named `name` running `body`. Usually made by
    /// [`StdShim::register_kernel`](crate::StdShim::register_kernel).
    pub fn new(
        name: &'static str,
        body: impl Fn(&mut KernelCtx<'_>) -> Result<(), KernelFault> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name,
            body: Arc::new(body),
        }
    }

    /// The kernel's name, in every failure report of its launches ([`devcmd::Shim::kernel_name`]).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Runs the kernel; a panic is caught and reported as `Err(None)`.
    pub(crate) fn run(&self, ctx: &mut KernelCtx<'_>) -> Result<(), Option<KernelFault>> {
        let body = &self.body;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(ctx))) {
            Ok(r) => r.map_err(Some),
            Err(_) => Err(None),
        }
    }
}

impl fmt::Debug for StdKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StdKernel")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// One parameter of a launch, as the worker keeps it: a buffer slot, or a scalar's place in
/// [`Params::bytes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Param {
    Buffer(usize),
    Scalar { start: usize, len: usize },
}

/// A launch's parameters, copied when it is enqueued (the caller's scalars may be gone by the
/// time the kernel runs): a list, and every scalar's bytes in one vector. Both are reused from
/// launch to launch ([`LaunchArgs`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Params {
    list: Vec<Param>,
    bytes: Vec<u8>,
}

impl Params {
    /// A copy of `params`.
    #[cfg(test)]
    pub(crate) fn of(params: &[KernelParam<'_>]) -> Self {
        let mut out = Self::default();
        out.fill(params);
        out
    }

    /// Replaces the parameters with a copy of `params`, keeping the vectors' capacity.
    pub(crate) fn fill(&mut self, params: &[KernelParam<'_>]) {
        self.list.clear();
        self.bytes.clear();
        for p in params {
            self.list.push(match *p {
                KernelParam::Buffer(slot) => Param::Buffer(slot),
                KernelParam::Scalar(b) => {
                    let start = self.bytes.len();
                    self.bytes.extend_from_slice(b);
                    Param::Scalar {
                        start,
                        len: b.len(),
                    }
                }
            });
        }
    }
}

/// What a launch carries to the worker: its device spans and its parameters. A stream keeps the
/// ones its worker is done with and fills them again for its next launches, so a warm launch
/// allocates nothing.
#[derive(Debug, Default)]
pub(crate) struct LaunchArgs {
    pub(crate) spans: Vec<DeviceSpan>,
    pub(crate) params: Params,
}

impl LaunchArgs {
    /// Replaces the contents with copies of `spans` and `params`, keeping the capacity.
    pub(crate) fn fill(&mut self, spans: &[DeviceSpan], params: &[KernelParam<'_>]) {
        self.spans.clear();
        self.spans.extend_from_slice(spans);
        self.params.fill(params);
    }
}

/// What a running kernel sees: the geometry, its device buffers and its parameters.
#[derive(Debug)]
pub struct KernelCtx<'a> {
    dims: LaunchDims,
    spans: &'a [DeviceSpan],
    params: &'a Params,
}

impl<'a> KernelCtx<'a> {
    /// The context of one run.
    ///
    /// # Safety
    ///
    /// Every span lies in live, initialised memory that nothing else touches while the context
    /// lives (what [`devcmd::Shim::launch`]'s caller promises, for the time the launch runs).
    pub(crate) unsafe fn new(
        dims: LaunchDims,
        spans: &'a [DeviceSpan],
        params: &'a Params,
    ) -> Self {
        Self {
            dims,
            spans,
            params,
        }
    }

    /// The launch geometry (grid, block, dynamic shared memory).
    pub fn dims(&self) -> LaunchDims {
        self.dims
    }

    /// The device spans, by slot (the launch's inputs, then its outputs).
    pub fn spans(&self) -> &[DeviceSpan] {
        self.spans
    }

    /// How many parameters the launch passed.
    pub fn param_count(&self) -> usize {
        self.params.list.len()
    }

    /// The buffer slot parameter `i` names; [`KernelFault::Failed`] if it is no buffer.
    pub fn slot(&self, i: usize) -> Result<usize, KernelFault> {
        match self.params.list.get(i) {
            Some(Param::Buffer(slot)) => Ok(*slot),
            _ => Err(KernelFault::Failed),
        }
    }

    /// The bytes of scalar parameter `i`, which must be exactly `N` bytes long (as a GPU kernel's
    /// parameter has one size); [`KernelFault::Failed`] otherwise.
    fn scalar<const N: usize>(&self, i: usize) -> Result<[u8; N], KernelFault> {
        match self.params.list.get(i) {
            Some(&Param::Scalar { start, len }) if len == N => self.params.bytes
                [start..start + len]
                .try_into()
                .map_err(|_| KernelFault::Failed),
            _ => Err(KernelFault::Failed),
        }
    }

    /// Parameter `i` as a `u32` (4 bytes); [`KernelFault::Failed`] if it is not one.
    pub fn scalar_u32(&self, i: usize) -> Result<u32, KernelFault> {
        self.scalar(i).map(u32::from_ne_bytes)
    }

    /// Parameter `i` as a `u64` (8 bytes); [`KernelFault::Failed`] if it is not one.
    pub fn scalar_u64(&self, i: usize) -> Result<u64, KernelFault> {
        self.scalar(i).map(u64::from_ne_bytes)
    }

    /// Parameter `i` as an `f32` (4 bytes); [`KernelFault::Failed`] if it is not one.
    pub fn scalar_f32(&self, i: usize) -> Result<f32, KernelFault> {
        self.scalar(i).map(f32::from_ne_bytes)
    }

    fn raw(&self, i: usize) -> Result<(*mut u8, usize), KernelFault> {
        let span = self.spans.get(i).ok_or(KernelFault::Failed)?;
        let addr = usize::try_from(span.addr.0).map_err(|_| KernelFault::Failed)?;
        let len = usize::try_from(span.len).map_err(|_| KernelFault::Failed)?;
        Ok((std::ptr::with_exposed_provenance_mut(addr), len))
    }

    /// Buffer `i`, read only; [`KernelFault::Failed`] if there is no such buffer.
    pub fn buffer(&self, i: usize) -> Result<&[u8], KernelFault> {
        let (p, len) = self.raw(i)?;
        if len == 0 {
            return Ok(&[]);
        }
        // SAFETY: the span lies in live, initialised device memory nothing else touches while the
        // context lives (`KernelCtx::new`'s contract; pages are zeroed at allocation); the borrow
        // of `self` keeps `buffers_mut` from handing out a mutable view meanwhile.
        Ok(unsafe { std::slice::from_raw_parts(p, len) })
    }

    /// Buffer `i`, writable; [`KernelFault::Failed`] if there is no such buffer. One view at a
    /// time (the `&mut self` borrow), and no allocation: for kernels that write one output.
    pub fn buffer_mut(&mut self, i: usize) -> Result<&mut [u8], KernelFault> {
        let (p, len) = self.raw(i)?;
        if len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as in `buffer`; the `&mut self` borrow keeps every other view of any span out
        // while this one lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
    }

    /// Every buffer, writable, in slot order (the launch's inputs, then its outputs), in a new
    /// vector: [`Self::io`] gives inputs shared and outputs mutable without allocating.
    /// [`KernelFault::Failed`] if two non-empty spans overlap (a kernel that reads one buffer
    /// twice uses [`KernelCtx::buffer`]).
    pub fn buffers_mut(&mut self) -> Result<Vec<&mut [u8]>, KernelFault> {
        let mut ranges = Vec::with_capacity(self.spans.len());
        for i in 0..self.spans.len() {
            let (p, len) = self.raw(i)?;
            let start = p.addr();
            let end = start.checked_add(len).ok_or(KernelFault::Failed)?;
            let overlaps = ranges.iter().any(|&(_, s, e): &(*mut u8, usize, usize)| {
                len > 0 && s < e && s < end && start < e
            });
            if overlaps {
                return Err(KernelFault::Failed);
            }
            ranges.push((p, start, end));
        }
        Ok(ranges
            .into_iter()
            .map(|(p, start, end)| {
                if start == end {
                    return &mut [][..];
                }
                // SAFETY: as in `buffer`; the spans were checked pairwise disjoint, and the
                // `&mut self` borrow keeps any other view of them out while these live.
                unsafe { std::slice::from_raw_parts_mut(p, end - start) }
            })
            .collect())
    }
}

/// A kernel's buffers as [`KernelCtx::io`] hands them out: `I` inputs, shared, and `O` outputs,
/// mutable.
pub type Io<'a, T, const I: usize, const O: usize> = ([&'a [T]; I], [&'a mut [T]; O]);

impl KernelCtx<'_> {
    /// The launch's `I` inputs, read only, and its `O` outputs, writable, as bytes: what a kernel
    /// of a fixed signature takes, with no allocation. [`KernelFault::Failed`] if the launch has
    /// not exactly `I + O` buffers, or an output overlaps another buffer (inputs may share
    /// bytes: they are only read).
    pub fn io_bytes<const I: usize, const O: usize>(
        &mut self,
    ) -> Result<Io<'_, u8, I, O>, KernelFault> {
        if self.spans.len() != I + O {
            return Err(KernelFault::Failed);
        }
        for o in I..I + O {
            let (p, len) = self.raw(o)?;
            let (start, end) = (p.addr(), p.addr().saturating_add(len));
            for j in (0..I + O).filter(|&j| j != o) {
                let (q, qlen) = self.raw(j)?;
                let (s, e) = (q.addr(), q.addr().saturating_add(qlen));
                if len > 0 && s < e && s < end && start < e {
                    return Err(KernelFault::Failed);
                }
            }
        }
        let mut bad = false;
        let mut view = |i: usize| match self.raw(i) {
            Ok((_, 0)) => (std::ptr::NonNull::<u8>::dangling().as_ptr(), 0),
            Ok(raw) => raw,
            Err(_) => {
                bad = true;
                (std::ptr::NonNull::<u8>::dangling().as_ptr(), 0)
            }
        };
        let inputs: [(*mut u8, usize); I] = std::array::from_fn(&mut view);
        let outputs: [(*mut u8, usize); O] = std::array::from_fn(|k| view(I + k));
        if bad {
            return Err(KernelFault::Failed);
        }
        // SAFETY: each span lies in live, initialised device memory nothing else touches while
        // the context lives (`KernelCtx::new`'s contract), or is empty (a dangling, aligned
        // pointer of length 0); the outputs were checked to overlap no other buffer, so each
        // mutable view is the only view of its bytes, and the `&mut self` borrow keeps every
        // other view of the context out while these live.
        let inputs =
            inputs.map(|(p, len)| unsafe { std::slice::from_raw_parts(p.cast_const(), len) });
        // SAFETY: as above.
        let outputs = outputs.map(|(p, len)| unsafe { std::slice::from_raw_parts_mut(p, len) });
        Ok((inputs, outputs))
    }

    /// The launch's `I` inputs and `O` outputs as slices of `T` (any plain-data type: `f32`,
    /// `u32`, `[f32; 4]` ...), inputs shared and outputs mutable, with no allocation:
    ///
    /// ```
    /// # let shim = devcmd_std::StdShim::new();
    /// // out[i] = w[i] * x[i] + bias
    /// let scale_add = shim.register_kernel("scale_add", |ctx| {
    ///     let bias = ctx.scalar_f32(3)?;
    ///     let ([w, x], [out]) = ctx.io::<f32, 2, 1>()?;
    ///     for ((o, w), x) in out.iter_mut().zip(w).zip(x) {
    ///         *o = w * x + bias;
    ///     }
    ///     Ok(())
    /// });
    /// ```
    ///
    /// [`KernelFault::Failed`] as [`Self::io_bytes`], or if a buffer's length is not a multiple
    /// of `T`'s size or its address not aligned for `T`. Kernels over buffers of different types
    /// take [`Self::io_bytes`] and cast each with [`as_typed`] and [`as_typed_mut`].
    pub fn io<T: devcmd::Pod, const I: usize, const O: usize>(
        &mut self,
    ) -> Result<Io<'_, T, I, O>, KernelFault> {
        let (inputs, outputs) = self.io_bytes::<I, O>()?;
        let mut bad = false;
        let inputs = inputs.map(|b| {
            as_typed(b).unwrap_or_else(|_| {
                bad = true;
                &[]
            })
        });
        let outputs = outputs.map(|b| {
            as_typed_mut(b).unwrap_or_else(|_| {
                bad = true;
                &mut []
            })
        });
        if bad {
            return Err(KernelFault::Failed);
        }
        Ok((inputs, outputs))
    }
}

/// `bytes` as `T`s; [`KernelFault::Failed`] if misaligned for `T` or not a multiple of its size.
pub fn as_typed<T: devcmd::Pod>(bytes: &[u8]) -> Result<&[T], KernelFault> {
    if bytes.is_empty() {
        return Ok(&[]);
    }
    bytemuck::try_cast_slice(bytes).map_err(|_| KernelFault::Failed)
}

/// `bytes` as mutable `T`s; [`KernelFault::Failed`] if misaligned for `T` or not a multiple of
/// its size.
pub fn as_typed_mut<T: devcmd::Pod>(bytes: &mut [u8]) -> Result<&mut [T], KernelFault> {
    if bytes.is_empty() {
        return Ok(&mut []);
    }
    bytemuck::try_cast_slice_mut(bytes).map_err(|_| KernelFault::Failed)
}

/// `bytes` as `f32`s; [`KernelFault::Failed`] if misaligned or not a multiple of 4 bytes.
pub fn as_f32(bytes: &[u8]) -> Result<&[f32], KernelFault> {
    if !bytes.len().is_multiple_of(4) || !bytes.as_ptr().cast::<f32>().is_aligned() {
        return Err(KernelFault::Failed);
    }
    // SAFETY: aligned for f32 (checked), `len / 4` f32s cover exactly the bytes, every bit
    // pattern is a valid f32, and the result borrows `bytes`.
    Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), bytes.len() / 4) })
}

/// `bytes` as mutable `f32`s; [`KernelFault::Failed`] if misaligned or not a multiple of 4 bytes.
pub fn as_f32_mut(bytes: &mut [u8]) -> Result<&mut [f32], KernelFault> {
    if !bytes.len().is_multiple_of(4) || !bytes.as_ptr().cast::<f32>().is_aligned() {
        return Err(KernelFault::Failed);
    }
    // SAFETY: as in `as_f32`; the result borrows `bytes` mutably, so it is the only view.
    Ok(unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast(), bytes.len() / 4) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use devcmd::DeviceAddr;

    #[test]
    fn arguments_and_buffers_are_checked() {
        let mut a = [1u8, 2, 3, 4];
        let mut b = [0u8; 8];
        let span = |s: &mut [u8]| DeviceSpan {
            addr: DeviceAddr(s.as_mut_ptr().expose_provenance() as u64),
            len: s.len() as u64,
        };
        let spans = [span(&mut a), span(&mut b)];
        let seven = 7u32.to_ne_bytes();
        let args = Params::of(&[
            KernelParam::Buffer(1),
            KernelParam::Scalar(&seven),
            KernelParam::Buffer(0),
        ]);
        let dims = LaunchDims::SINGLE;
        // SAFETY: the spans are the two local arrays, untouched while the context lives.
        let mut ctx = unsafe { KernelCtx::new(dims, &spans, &args) };
        assert_eq!(ctx.scalar_u32(1), Ok(7));
        assert_eq!(
            ctx.scalar_u64(1),
            Err(KernelFault::Failed),
            "size must match"
        );
        assert_eq!(
            ctx.scalar_u32(0),
            Err(KernelFault::Failed),
            "a buffer is no scalar"
        );
        assert_eq!(ctx.scalar_u32(3), Err(KernelFault::Failed));
        assert_eq!((ctx.slot(0), ctx.slot(2)), (Ok(1), Ok(0)));
        assert_eq!(ctx.slot(1), Err(KernelFault::Failed));
        assert_eq!(ctx.param_count(), 3);
        assert_eq!(ctx.buffer(0).map(<[u8]>::to_vec), Ok(vec![1, 2, 3, 4]));
        assert!(ctx.buffer(2).is_err());
        let mut views = ctx.buffers_mut().unwrap();
        views[1][0] = 9;
        let overlapping = [spans[0], spans[0]];
        // SAFETY: as above.
        let mut ctx = unsafe { KernelCtx::new(dims, &overlapping, &args) };
        assert!(ctx.buffers_mut().is_err());
        // An empty span inside another shares no byte, whichever comes first.
        let inside = DeviceSpan {
            addr: spans[0].addr.offset(2),
            len: 0,
        };
        for pair in [[inside, spans[0]], [spans[0], inside]] {
            // SAFETY: as above.
            let mut ctx = unsafe { KernelCtx::new(dims, &pair, &args) };
            assert_eq!(ctx.buffers_mut().map(|v| v.len()), Ok(2), "{pair:?}");
        }
        assert_eq!(b[0], 9);
        let words = [0f32; 2];
        // SAFETY: reading the bytes of an f32 array is always valid.
        let bytes = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), 8) };
        assert_eq!(as_f32(bytes).map(<[f32]>::len), Ok(2));
        assert!(as_f32(&bytes[1..5]).is_err());
    }

    #[test]
    fn io_hands_out_inputs_shared_and_outputs_mutable() {
        let mut a = [1f32, 2.0];
        let mut b = [10f32, 20.0];
        let mut out = [0f32; 2];
        let span = |s: &mut [f32]| DeviceSpan {
            addr: DeviceAddr(s.as_mut_ptr().expose_provenance() as u64),
            len: (s.len() * 4) as u64,
        };
        let spans = [span(&mut a), span(&mut b), span(&mut out)];
        let args = Params::default();
        // SAFETY: the spans are the three local arrays, untouched while the context lives.
        let mut ctx = unsafe { KernelCtx::new(LaunchDims::SINGLE, &spans, &args) };
        {
            let ([a, b], [out]) = ctx.io::<f32, 2, 1>().unwrap();
            for ((o, a), b) in out.iter_mut().zip(a).zip(b) {
                *o = a + b;
            }
        }
        assert!(ctx.io::<f32, 1, 1>().is_err(), "three buffers, not two");
        assert!(
            ctx.io::<[f32; 3], 2, 1>().is_err(),
            "8 bytes are no whole number of 12-byte elements"
        );
        let shared_input = [spans[0], spans[0], spans[2]];
        // SAFETY: as above.
        let mut ctx = unsafe { KernelCtx::new(LaunchDims::SINGLE, &shared_input, &args) };
        assert!(ctx.io::<f32, 2, 1>().is_ok(), "an input read twice is fine");
        let aliased = [spans[0], spans[2], spans[2]];
        // SAFETY: as above.
        let mut ctx = unsafe { KernelCtx::new(LaunchDims::SINGLE, &aliased, &args) };
        assert!(
            ctx.io::<f32, 1, 2>().is_err(),
            "two outputs over one buffer"
        );
        assert_eq!(out, [11.0, 22.0]);
    }
}
