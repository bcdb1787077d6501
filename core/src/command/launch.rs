//! Kernel launches: the validation every launch gets, the failure rule (a launch whose input
//! carries a failure is skipped and passes it on), and the refusal of a launch.
//!
//! Owns which buffers a launch may name together (an output never aliases another buffer of the
//! same launch: one rule for every shim, checked before anything is enqueued). Does not own the
//! failure records (`failure.rs`).

use super::Command;
use crate::error::{LaunchError, ServerError, Validation};
use crate::memory::Handle;
use crate::shim::{DeviceSpan, Grid, Shim};
use alloc::vec::Vec;

/// A kernel launch: the kernel, a name for failure reports, the grid, the buffers it reads and
/// writes, and its scalar arguments. The shim receives the inputs' spans then the outputs'.
#[derive(Debug)]
pub struct Launch<'a, S: Shim> {
    /// The loaded kernel.
    pub kernel: &'a S::Kernel,
    /// Its name, carried in failure chains and named by a stream fault its launch may have caused.
    pub name: &'static str,
    /// The grid.
    pub grid: Grid,
    /// Buffers it reads.
    pub inputs: &'a [&'a Handle],
    /// Buffers it writes. None may overlap another buffer of the launch (input or output).
    pub outputs: &'a [&'a Handle],
    /// Scalar arguments, passed through.
    pub args: &'a S::Args,
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
    let all: Vec<&Handle> = inputs.iter().chain(outputs).copied().collect();
    (inputs.len()..all.len()).find_map(|o| {
        (0..all.len())
            .filter(|&i| i != o)
            .find(|&i| overlap(all[o], all[i]))
            .map(|i| (o, i))
    })
}

impl<S: Shim> Command<'_, S> {
    /// Launches a kernel. If an input carries a failure, the launch is skipped and its outputs
    /// carry the same failure; if the shim refuses it, its outputs carry the refusal. Flushes the
    /// drop queue when it is over its policy.
    ///
    /// # Errors
    ///
    /// [`Validation::AliasedLaunch`] when an output overlaps another buffer of the launch;
    /// [`ServerError::Skipped`], [`ServerError::Launch`], [`ServerError::DeviceLost`],
    /// [`ServerError::StreamFaulted`].
    pub fn launch(&mut self, launch: Launch<'_, S>) -> Result<(), ServerError> {
        self.begin()?;
        let Launch {
            kernel,
            name,
            grid,
            inputs,
            outputs,
            args,
        } = launch;
        if let Some((output, other)) = aliased(inputs, outputs) {
            return Err(Validation::AliasedLaunch {
                kernel: name,
                output,
                other,
            }
            .into());
        }
        let mut spans = Vec::with_capacity(inputs.len() + outputs.len());
        for (index, h) in inputs.iter().chain(outputs.iter()).enumerate() {
            let r = self.resource(*h).map_err(|cause| LaunchError::Buffer {
                kernel: name,
                index,
                cause,
            })?;
            self.device.order_after(self.stream, *h)?;
            spans.push(DeviceSpan {
                addr: r.addr,
                len: r.len,
            });
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
        // SAFETY: every span was resolved just now to a live range of its allocation, and the
        // kernel's contract is to touch only its buffers.
        let launched = unsafe { shim.launch(&s.raw, kernel, grid, &spans, args) };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{Issuer, ReturnQueue};
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
}
