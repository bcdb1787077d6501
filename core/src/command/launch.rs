//! Kernel launches: the validation every launch gets, the failure rule (a launch whose input
//! carries a failure is skipped and passes it on), and the refusal of a launch.
//!
//! Owns which buffers a launch may name together (an output never aliases another buffer of the
//! same launch: one rule for every shim, checked before anything is enqueued). Does not own the
//! failure records (`failure.rs`).

use super::Command;
use super::engine::{Buffers, Work};
use crate::error::{ServerError, Validation};
use crate::memory::Handle;
use crate::shim::{KernelParam, LaunchDims, Shim};

/// A kernel launch: the kernel, its geometry, the buffers it reads and writes, and its
/// parameters in the kernel's own order. Buffer slots count the inputs first, then the outputs.
/// Failure reports name the kernel as the shim does ([`Shim::kernel_name`]: the name it was
/// loaded or registered under).
///
/// A kernel `axpy(float *y, const float *x, float a, unsigned n)` that reads `x` and writes `y`:
///
/// ```text
/// let (a, n) = (2.0f32.to_ne_bytes(), (len as u32).to_ne_bytes());
/// cmd.launch(Launch {
///     kernel: &axpy,
///     dims: LaunchDims::covering(len as u64, 256),
///     inputs: &[&x],
///     outputs: &[&y],
///     params: &[KernelParam::Buffer(1), KernelParam::Buffer(0), KernelParam::Scalar(&a),
///              KernelParam::Scalar(&n)],
/// })?;
/// ```
#[derive(Debug)]
pub struct Launch<'a, S: Shim> {
    /// The loaded kernel (named in failure reports by [`Shim::kernel_name`]).
    pub kernel: &'a S::Kernel,
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
/// naming a buffer slot the launch does not have. (An output overlapping another buffer is the
/// engine's check, for library work too.)
fn refused(
    name: &'static str,
    dims: LaunchDims,
    params: &[KernelParam<'_>],
    buffers: usize,
) -> Option<Validation> {
    let extents = [dims.grid, dims.block];
    if extents.iter().any(|d| d.x == 0 || d.y == 0 || d.z == 0) {
        return Some(Validation::LaunchDims { kernel: name, dims });
    }
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
    None
}

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
    /// [`ServerError::Skipped`], [`LaunchError::Refused`](crate::LaunchError::Refused),
    /// [`ServerError::DeviceLost`], [`ServerError::StreamFaulted`].
    pub fn launch(&mut self, launch: Launch<'_, S>) -> Result<(), ServerError> {
        let Launch {
            kernel,
            dims,
            inputs,
            outputs,
            params,
        } = launch;
        let name = self.device.shim.kernel_name(kernel);
        if let Some(refusal) = refused(name, dims, params, inputs.len() + outputs.len()) {
            // The device's bookkeeping and the ledger come first, as for every operation.
            self.begin()?;
            return Err(refusal.into());
        }
        let work = Work::Kernel {
            kernel,
            dims,
            params,
            buffers: Buffers {
                inputs,
                updates: &[],
                outputs,
            },
        };
        self.run(name, work)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shim::Dim3;

    #[test]
    fn zero_extents_and_missing_slots_are_refused_first() {
        let n = 64u64.to_ne_bytes();
        let params = [KernelParam::Buffer(0), KernelParam::Scalar(&n)];
        let fine = LaunchDims::covering(64, 32);
        assert_eq!(refused("k", fine, &params, 1), None);
        let mut flat = fine;
        flat.block.z = 0;
        assert_eq!(
            refused("k", flat, &params, 1),
            Some(Validation::LaunchDims {
                kernel: "k",
                dims: flat
            })
        );
        let far = [KernelParam::Scalar(&n), KernelParam::Buffer(1)];
        assert_eq!(
            refused("k", fine, &far, 1),
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
