//! What a kernel launch must say on its face, checked by the engine right after its begin and
//! before anything is resolved or enqueued: no zero extent in its geometry, no parameter naming a
//! buffer slot the launch lacks. One rule for every shim.
//!
//! Owns [`refused`]. Does not own what a launch declares (`launch.rs`) nor the alias rule
//! (`buffers.rs`).

use crate::error::Validation;
use crate::shim::{KernelParam, LaunchDims};

/// The first check a launch fails, right after the engine's begin: a zero extent, a parameter
/// naming a buffer slot the launch does not have. (An output overlapping another buffer is the
/// engine's check, for library work too: `buffers.rs`.)
#[inline]
pub(super) fn refused(
    name: &'static str,
    dims: LaunchDims,
    params: &[KernelParam<'_>],
    buffers: usize,
) -> Option<Validation> {
    let (g, b) = (dims.grid, dims.block);
    if g.x.min(g.y).min(g.z).min(b.x).min(b.y).min(b.z) == 0 {
        return Some(Validation::LaunchDims { kernel: name, dims });
    }
    for (param, p) in params.iter().enumerate() {
        if let KernelParam::Buffer(slot) = *p
            && slot >= buffers
        {
            return Some(Validation::LaunchParam {
                kernel: name,
                param,
                slot,
                buffers,
            });
        }
    }
    None
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
