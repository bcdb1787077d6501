//! Kernels: Rust closures registered by name, run by a stream's worker over device spans.
//!
//! The launch arguments ([`devcmd::Shim::Args`]) are raw scalar bytes (`[u8]`) in native byte
//! order, copied at launch; a kernel reads them with [`KernelCtx::arg_u32`], [`KernelCtx::arg_u64`]
//! and [`KernelCtx::arg_f32`] at byte offsets it agrees on with the launcher.

use devcmd::{DeviceSpan, Grid};
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
    name: Arc<str>,
    body: Arc<KernelFn>,
}

impl StdKernel {
    /// A kernel named `name` running `body`. Usually made by
    /// [`StdShim::register_kernel`](crate::StdShim::register_kernel).
    pub fn new(
        name: &str,
        body: impl Fn(&mut KernelCtx<'_>) -> Result<(), KernelFault> + Send + Sync + 'static,
    ) -> Self {
        Self {
            name: name.into(),
            body: Arc::new(body),
        }
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
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

/// What a running kernel sees: the grid, its device buffers and its scalar argument bytes.
#[derive(Debug)]
pub struct KernelCtx<'a> {
    grid: Grid,
    spans: &'a [DeviceSpan],
    args: &'a [u8],
}

impl<'a> KernelCtx<'a> {
    /// The context of one run.
    ///
    /// # Safety
    ///
    /// Every span lies in live, initialised memory that nothing else touches while the context
    /// lives (what [`devcmd::Shim::launch`]'s caller promises, for the time the launch runs).
    pub(crate) unsafe fn new(grid: Grid, spans: &'a [DeviceSpan], args: &'a [u8]) -> Self {
        Self { grid, spans, args }
    }

    /// The launch grid.
    pub fn grid(&self) -> Grid {
        self.grid
    }

    /// The device spans, in parameter order.
    pub fn spans(&self) -> &[DeviceSpan] {
        self.spans
    }

    /// The raw argument bytes.
    pub fn args(&self) -> &[u8] {
        self.args
    }

    fn arg<const N: usize>(&self, offset: usize) -> Result<[u8; N], KernelFault> {
        let end = offset.checked_add(N).ok_or(KernelFault::Failed)?;
        let bytes = self.args.get(offset..end).ok_or(KernelFault::Failed)?;
        bytes.try_into().map_err(|_| KernelFault::Failed)
    }

    /// The `u32` at byte `offset` of the arguments; [`KernelFault::Failed`] past their end.
    pub fn arg_u32(&self, offset: usize) -> Result<u32, KernelFault> {
        self.arg(offset).map(u32::from_ne_bytes)
    }

    /// The `u64` at byte `offset` of the arguments; [`KernelFault::Failed`] past their end.
    pub fn arg_u64(&self, offset: usize) -> Result<u64, KernelFault> {
        self.arg(offset).map(u64::from_ne_bytes)
    }

    /// The `f32` at byte `offset` of the arguments; [`KernelFault::Failed`] past their end.
    pub fn arg_f32(&self, offset: usize) -> Result<f32, KernelFault> {
        self.arg(offset).map(f32::from_ne_bytes)
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

    /// Every buffer, writable, in parameter order. [`KernelFault::Failed`] if two non-empty spans
    /// overlap (a kernel that reads one buffer twice uses [`KernelCtx::buffer`]).
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
        let args = 7u32.to_ne_bytes();
        // SAFETY: the spans are the two local arrays, untouched while the context lives.
        let mut ctx = unsafe { KernelCtx::new(Grid::linear(1), &spans, &args) };
        assert_eq!(ctx.arg_u32(0), Ok(7));
        assert_eq!(ctx.arg_u32(1), Err(KernelFault::Failed));
        assert_eq!(ctx.buffer(0).map(<[u8]>::to_vec), Ok(vec![1, 2, 3, 4]));
        assert!(ctx.buffer(2).is_err());
        let mut views = ctx.buffers_mut().unwrap();
        views[1][0] = 9;
        let overlapping = [spans[0], spans[0]];
        // SAFETY: as above.
        let mut ctx = unsafe { KernelCtx::new(Grid::linear(1), &overlapping, &args) };
        assert!(ctx.buffers_mut().is_err());
        // An empty span inside another shares no byte, whichever comes first.
        let inside = DeviceSpan {
            addr: spans[0].addr.offset(2),
            len: 0,
        };
        for pair in [[inside, spans[0]], [spans[0], inside]] {
            // SAFETY: as above.
            let mut ctx = unsafe { KernelCtx::new(Grid::linear(1), &pair, &args) };
            assert_eq!(ctx.buffers_mut().map(|v| v.len()), Ok(2), "{pair:?}");
        }
        assert_eq!(b[0], 9);
        let words = [0f32; 2];
        // SAFETY: reading the bytes of an f32 array is always valid.
        let bytes = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), 8) };
        assert_eq!(as_f32(bytes).map(<[f32]>::len), Ok(2));
        assert!(as_f32(&bytes[1..5]).is_err());
    }
}
