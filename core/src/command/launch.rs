//! Kernel launches: what a launch declares ([`Launch`]) and what its geometry and parameters
//! must say on their face (no zero extent, no parameter naming a buffer slot the launch lacks:
//! one rule for every shim, which the engine checks after its begin, before anything is
//! resolved or enqueued).
//!
//! Does not own that check (`launch_check.rs`), which buffers a launch may name together
//! (`buffers.rs`: an output never aliases another buffer), the failure rule or the failure
//! records (`engine.rs`, `failure.rs`).

use super::Command;
use super::buffers::Buffers;
use super::engine::Work;
use crate::error::ServerError;
#[cfg(doc)]
use crate::error::Validation;
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
    #[inline]
    pub fn launch(&mut self, launch: Launch<'_, S>) -> Result<(), ServerError> {
        let Launch {
            kernel,
            dims,
            inputs,
            outputs,
            params,
        } = launch;
        let name = self.device.shim.kernel_name(kernel);
        // The engine checks the geometry and the parameters (`refused`) after its begin.
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
