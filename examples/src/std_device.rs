//! The model's kernels on the std shim: plain Rust over device addresses, reading the parameters
//! of the CUDA C kernels ([`crate::model`]) by position, and the std device they run on.
//!
//! Owns the CPU kernels' bodies and the std device's set-up. The std shim runs a kernel once per
//! launch whatever its geometry, so each body loops over its data itself.

use crate::model::{Kernels, softmax_into};
use devcmd_std::{KernelCtx, KernelFault, StdKernel, StdShim, as_f32, as_f32_mut};

/// The std device of the edge host: 2 GiB of memory, lazy streams when asked.
pub fn shim(lazy: bool) -> StdShim {
    StdShim::builder().total_memory(2 << 30).lazy(lazy).build()
}

/// The model's kernels registered on `shim`.
pub fn kernels(shim: &StdShim) -> Kernels<StdKernel> {
    Kernels {
        matmul: shim.register_kernel("matmul", matmul_kernel),
        bias_relu: shim.register_kernel("bias_relu", bias_relu_kernel),
        bias_softmax: shim.register_kernel("bias_softmax", bias_softmax_kernel),
    }
}

/// out[m×n] = a[m×k] · b[k×n].
fn matmul_kernel(ctx: &mut KernelCtx<'_>) -> Result<(), KernelFault> {
    let (m, k, n) = (
        ctx.scalar_u32(3)? as usize,
        ctx.scalar_u32(4)? as usize,
        ctx.scalar_u32(5)? as usize,
    );
    let mut bufs = ctx.buffers_mut()?;
    let [a, b, out] = bufs.as_mut_slice() else {
        return Err(KernelFault::Failed);
    };
    let (a, b, out) = (as_f32(a)?, as_f32(b)?, as_f32_mut(out)?);
    if a.len() < m * k || b.len() < k * n || out.len() < m * n {
        return Err(KernelFault::Failed);
    }
    for row in 0..m {
        let o = &mut out[row * n..(row + 1) * n];
        o.fill(0.0);
        for (kk, &av) in a[row * k..(row + 1) * k].iter().enumerate() {
            for (ov, &bv) in o.iter_mut().zip(&b[kk * n..(kk + 1) * n]) {
                *ov += av * bv;
            }
        }
    }
    Ok(())
}

/// Runs `body(m, n, x, bias, out)` over the kernel's three buffers (x and out m×n, bias n),
/// checked against the parameters m and n.
fn bias_kernel(
    ctx: &mut KernelCtx<'_>,
    body: impl FnOnce(usize, usize, &[f32], &[f32], &mut [f32]),
) -> Result<(), KernelFault> {
    let (m, n) = (ctx.scalar_u32(3)? as usize, ctx.scalar_u32(4)? as usize);
    let mut bufs = ctx.buffers_mut()?;
    let [x, bias, out] = bufs.as_mut_slice() else {
        return Err(KernelFault::Failed);
    };
    let (x, bias, out) = (as_f32(x)?, as_f32(bias)?, as_f32_mut(out)?);
    if x.len() < m * n || bias.len() < n || out.len() < m * n {
        return Err(KernelFault::Failed);
    }
    body(m, n, x, bias, out);
    Ok(())
}

/// out = relu(x + bias) row by row.
fn bias_relu_kernel(ctx: &mut KernelCtx<'_>) -> Result<(), KernelFault> {
    bias_kernel(ctx, |m, n, x, bias, out| {
        for (i, o) in out[..m * n].iter_mut().enumerate() {
            *o = (x[i] + bias[i % n]).max(0.0);
        }
    })
}

/// out = softmax(x + bias) row by row.
fn bias_softmax_kernel(ctx: &mut KernelCtx<'_>) -> Result<(), KernelFault> {
    bias_kernel(ctx, |m, n, x, bias, out| {
        for row in 0..m {
            let logits: Vec<f32> = (0..n).map(|j| x[row * n + j] + bias[j]).collect();
            softmax_into(&logits, &mut out[row * n..(row + 1) * n]);
        }
    })
}
