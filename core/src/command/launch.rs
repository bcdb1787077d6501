//! Kernel launches: the validation every launch gets, the failure rule (a launch whose input
//! carries a failure is skipped and passes it on), and the refusal of a launch.
//!
//! Owns which buffers a launch may name together (an output never aliases another buffer of the
//! same launch: one rule for every shim, checked before anything is enqueued). Does not own the
//! failure records (`failure.rs`).

use super::Command;
use crate::capture::Span;
use crate::error::{LaunchError, ServerError, Validation};
use crate::memory::Handle;
use crate::shim::{DeviceSpan, KernelParam, LaunchDims, Shim};

/// A kernel launch: the kernel, a name for failure reports, its geometry, the buffers it reads
/// and writes, and its parameters in the kernel's own order. Buffer slots count the inputs first,
/// then the outputs.
///
/// A kernel `axpy(float *y, const float *x, float a, unsigned n)` that reads `x` and writes `y`:
///
/// ```text
/// let (a, n) = (2.0f32.to_ne_bytes(), (len as u32).to_ne_bytes());
/// cmd.launch(Launch {
///     kernel: &axpy,
///     name: "axpy",
///     dims: LaunchDims::covering(len as u64, 256),
///     inputs: &[&x],
///     outputs: &[&y],
///     params: &[KernelParam::Buffer(1), KernelParam::Buffer(0), KernelParam::Scalar(&a),
///              KernelParam::Scalar(&n)],
/// })?;
/// ```
#[derive(Debug)]
pub struct Launch<'a, S: Shim> {
    /// The loaded kernel.
    pub kernel: &'a S::Kernel,
    /// Its name, carried in failure chains and named by a stream fault its launch may have caused.
    pub name: &'static str,
    /// Grid, block and dynamic shared memory.
    pub dims: LaunchDims,
    /// Buffers it reads.
    pub inputs: &'a [&'a Handle],
    /// Buffers it writes. None may overlap another buffer of the launch (input or output).
    pub outputs: &'a [&'a Handle],
    /// The kernel's parameters in its own order: buffers by slot, scalars by value.
    pub params: &'a [KernelParam<'a>],
}

/// The first check a launch fails before anything else is looked at: a zero extent, a parameter
/// naming a buffer slot the launch does not have, an output overlapping another buffer.
fn refused(
    name: &'static str,
    dims: LaunchDims,
    params: &[KernelParam<'_>],
    inputs: &[&Handle],
    outputs: &[&Handle],
) -> Option<Validation> {
    let extents = [dims.grid, dims.block];
    if extents.iter().any(|d| d.x == 0 || d.y == 0 || d.z == 0) {
        return Some(Validation::LaunchDims { kernel: name, dims });
    }
    let buffers = inputs.len() + outputs.len();
    let bad_slot = params.iter().enumerate().find_map(|(param, p)| match *p {
        KernelParam::Buffer(slot) if slot >= buffers => Some((param, slot)),
        _ => None,
    });
    if let Some((param, slot)) = bad_slot {
        return Some(Validation::LaunchParam {
            kernel: name,
            param,
            slot,
            buffers,
        });
    }
    aliased(inputs, outputs).map(|(output, other)| Validation::AliasedLaunch {
        kernel: name,
        output,
        other,
    })
}

/// Whether two views share a byte of the same allocation (an empty view shares none).
fn overlap(a: &Handle, b: &Handle) -> bool {
    a.issuer() == b.issuer()
        && a.id() == b.id()
        && !a.is_empty()
        && !b.is_empty()
        && a.offset() < b.offset() + b.len()
        && b.offset() < a.offset() + a.len()
}

/// The first pair (output, other buffer) of a launch whose views overlap, by position among the
/// launch's buffers (inputs first).
fn aliased(inputs: &[&Handle], outputs: &[&Handle]) -> Option<(usize, usize)> {
    let all = inputs.len() + outputs.len();
    let at = |i: usize| {
        if i < inputs.len() {
            inputs[i]
        } else {
            outputs[i - inputs.len()]
        }
    };
    (inputs.len()..all).find_map(|o| {
        (0..all)
            .filter(|&i| i != o)
            .find(|&i| overlap(at(o), at(i)))
            .map(|i| (o, i))
    })
}

/// Buffers of a launch whose spans are kept on the stack (more go to the heap).
const STACK_BUFFERS: usize = 16;

impl<S: Shim> Command<'_, S> {
    /// Launches a kernel. If an input carries a failure, the launch is skipped and its outputs
    /// carry the same failure; if the shim refuses it, its outputs carry the refusal. Flushes the
    /// drop queue when it is over its policy.
    ///
    /// **While this stream records**, the launch is recorded: the failure rule applies at each
    /// replay instead, and a refusal discards the recording.
    ///
    /// # Errors
    ///
    /// [`Validation::LaunchDims`] for a zero extent, [`Validation::LaunchParam`] for a parameter
    /// naming a slot the launch lacks, [`Validation::AliasedLaunch`] when an output overlaps
    /// another buffer of the launch;
    /// [`ServerError::Skipped`], [`ServerError::Launch`], [`ServerError::DeviceLost`],
    /// [`ServerError::StreamFaulted`].
    pub fn launch(&mut self, launch: Launch<'_, S>) -> Result<(), ServerError> {
        self.begin()?;
        let Launch {
            kernel,
            name,
            dims,
            inputs,
            outputs,
            params,
        } = launch;
        if let Some(refusal) = refused(name, dims, params, inputs, outputs) {
            return Err(refusal.into());
        }
        let count = inputs.len() + outputs.len();
        let mut stack = [DeviceSpan {
            addr: crate::shim::DeviceAddr(0),
            len: 0,
        }; STACK_BUFFERS];
        // Launches of more buffers reuse the device's list (warm: no allocation either).
        let mut heap = core::mem::take(&mut self.device.launch_spans);
        let spans: &mut [DeviceSpan] = if count <= STACK_BUFFERS {
            &mut stack[..count]
        } else {
            heap.clear();
            heap.resize(count, stack[0]);
            &mut heap
        };
        for (index, h) in inputs.iter().chain(outputs.iter()).enumerate() {
            // A handle that names no memory (the only I/O error ordering meets) is this launch's
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
            spans[index] = DeviceSpan {
                addr: r.addr,
                len: r.len,
            };
        }
        if self.current().capture.is_recording() {
            let recorded = self.record_launch(name, dims, kernel, spans, params, inputs, outputs);
            self.device.launch_spans = heap;
            return recorded;
        }
        let failures = &mut self.device.failures;
        if !failures.is_empty() {
            let carried = inputs
                .iter()
                .find_map(|h| failures.failure(h.id(), h.offset(), h.offset() + h.len()));
            if let Some(f) = carried {
                failures.skipped(f, name);
                for h in outputs {
                    failures.mark(h.id(), h.offset(), h.offset() + h.len(), f);
                }
                return Err(ServerError::Skipped {
                    kernel: name,
                    failure: f,
                });
            }
        }
        let (shim, s) = self.parts();
        // SAFETY: every span was resolved just now to a live range of its allocation, no output
        // overlaps another span (checked above), and the kernel's contract is to touch only its
        // buffers.
        let launched = unsafe { shim.launch(&s.raw, kernel, dims, spans, params) };
        self.device.launch_spans = heap;
        let failures = &mut self.device.failures;
        if let Err(e) = launched {
            let error: ServerError = LaunchError::Refused {
                kernel: name,
                cause: self.device.ledger.call_failed(e),
            }
            .into();
            let f = failures.new_failure(error.clone());
            for h in outputs {
                failures.mark(h.id(), h.offset(), h.offset() + h.len(), f);
            }
            failures.prune(f);
            return Err(error);
        }
        for h in outputs {
            failures.written(h.id(), h.offset(), h.offset() + h.len());
        }
        let s = self.current();
        s.last_kernel = Some(name);
        if s.drops.should_flush() {
            self.flush_after_enqueue()?;
        }
        Ok(())
    }
}

impl<S: Shim> Command<'_, S> {
    /// The end of a launch recorded into this stream's recording: its inputs and outputs become
    /// the graph's; a refusal discards the recording.
    #[allow(clippy::too_many_arguments)]
    fn record_launch(
        &mut self,
        name: &'static str,
        dims: LaunchDims,
        kernel: &S::Kernel,
        spans: &[DeviceSpan],
        params: &[KernelParam<'_>],
        inputs: &[&Handle],
        outputs: &[&Handle],
    ) -> Result<(), ServerError> {
        let (shim, s) = self.parts();
        // SAFETY: as in `launch`: the spans were resolved just now, no output overlaps another
        // span, and the recording keeps every allocation alive for its replays.
        let launched = unsafe { shim.launch(&s.raw, kernel, dims, spans, params) };
        let span = |h: &&Handle| Span {
            id: h.id(),
            start: h.offset(),
            end: h.offset() + h.len(),
        };
        if let Some(w) = self.current().capture.window_mut() {
            inputs.iter().map(span).for_each(|r| w.read(r));
            outputs.iter().map(span).for_each(|r| w.write(r));
        }
        launched.map_err(|e| {
            let error: ServerError = LaunchError::Refused {
                kernel: name,
                cause: self.device.ledger.call_failed(e),
            }
            .into();
            self.discard_recording(&error);
            error
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{Issuer, ReturnQueue};
    use crate::shim::Dim3;
    use alloc::sync::Arc;

    #[test]
    fn an_output_may_not_overlap_any_other_buffer() {
        let returns = Arc::new(ReturnQueue::default());
        let issuer = Issuer {
            device: 1,
            stream: 0,
        };
        let a = Handle::new(1, issuer, 64, &returns);
        let b = Handle::new(2, issuer, 64, &returns);
        assert_eq!(aliased(&[&a], &[&b]), None);
        assert_eq!(aliased(&[&a, &a], &[&b]), None, "inputs may repeat");
        assert_eq!(aliased(&[&a], &[&a]), Some((1, 0)));
        assert_eq!(aliased(&[], &[&b, &b]), Some((0, 1)));
        let low = a.view(0, 32).unwrap();
        let high = a.view(32, 32).unwrap();
        assert_eq!(aliased(&[&low], &[&high]), None, "disjoint views");
        let mid = a.view(16, 32).unwrap();
        assert_eq!(aliased(&[&low], &[&mid]), Some((1, 0)));
        let empty = a.view(16, 0).unwrap();
        assert_eq!(
            aliased(&[&a], &[&empty]),
            None,
            "an empty view shares no byte"
        );
    }

    #[test]
    fn zero_extents_and_missing_slots_are_refused_first() {
        let returns = Arc::new(ReturnQueue::default());
        let issuer = Issuer {
            device: 1,
            stream: 0,
        };
        let a = Handle::new(1, issuer, 64, &returns);
        let n = 64u64.to_ne_bytes();
        let params = [KernelParam::Buffer(0), KernelParam::Scalar(&n)];
        let fine = LaunchDims::covering(64, 32);
        assert_eq!(refused("k", fine, &params, &[], &[&a]), None);
        let mut flat = fine;
        flat.block.z = 0;
        assert_eq!(
            refused("k", flat, &params, &[], &[&a]),
            Some(Validation::LaunchDims {
                kernel: "k",
                dims: flat
            })
        );
        let far = [KernelParam::Scalar(&n), KernelParam::Buffer(1)];
        assert_eq!(
            refused("k", fine, &far, &[], &[&a]),
            Some(Validation::LaunchParam {
                kernel: "k",
                param: 1,
                slot: 1,
                buffers: 1
            })
        );
        assert_eq!(Dim3::ONE.count(), 1);
        assert_eq!(LaunchDims::covering(0, 256).grid, Dim3::linear(1));
        assert_eq!(
            LaunchDims::covering(u64::MAX, 1).grid.x,
            LaunchDims::MAX_GRID_X
        );
        let huge = Dim3 {
            x: u32::MAX,
            y: u32::MAX,
            z: u32::MAX,
        };
        assert_eq!(huge.count(), u64::MAX, "saturates, never panics");
    }
}
