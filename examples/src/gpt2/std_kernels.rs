//! The step's kernels on the std shim: plain Rust over device addresses, reading the parameters
//! of the CUDA C kernels ([`super::kernels`]) by position, f32 only. GEMMs are library work on
//! this device (`devcmd_std::blas`), not kernels.
//!
//! Token buffers are `u32`s, read and written through `f32` views as raw bits (every bit
//! pattern is a valid `f32`), so no other cast of device bytes is needed. A bad parameter or an
//! index outside a buffer fails the launch ([`KernelFault::Failed`]), never touches memory.

use super::kernels::Kernels;
use devcmd_std::{KernelCtx, KernelFault, StdKernel, StdShim, as_f32, as_f32_mut};

/// The step's kernels registered on `shim`.
pub fn kernels(shim: &StdShim) -> Kernels<StdKernel> {
    Kernels {
        embed: shim.register_kernel("embed", embed),
        attention: shim.register_kernel("attention", attention),
        residual_ln: shim.register_kernel("residual_ln", residual_ln),
        bias_gelu: shim.register_kernel("bias_gelu", bias_gelu),
        argmax: shim.register_kernel("argmax", argmax),
        copy_cache: shim.register_kernel("copy_cache", copy_cache),
    }
}

const F: KernelFault = KernelFault::Failed;

fn u(ctx: &KernelCtx<'_>, i: usize) -> Result<usize, KernelFault> {
    Ok(ctx.scalar_u32(i)? as usize)
}

/// `s[start..start + len]`, or a failed launch.
fn sub(s: &[f32], start: usize, len: usize) -> Result<&[f32], KernelFault> {
    s.get(start..start.checked_add(len).ok_or(F)?).ok_or(F)
}

fn sub_mut(s: &mut [f32], start: usize, len: usize) -> Result<&mut [f32], KernelFault> {
    s.get_mut(start..start.checked_add(len).ok_or(F)?).ok_or(F)
}

/// A `u32` kept in an `f32` slot.
fn bits(s: &[f32], i: usize) -> Result<usize, KernelFault> {
    s.get(i).map(|v| v.to_bits() as usize).ok_or(F)
}

/// The position a step works on: `state[0]`.
fn position(state: &[f32]) -> Result<usize, KernelFault> {
    bits(state, 0)
}

/// `out = (x - mean) / sqrt(var + eps) · g + b` over one row (mean and variance in f64).
fn norm_row(out: &mut [f32], x: &[f32], g: &[f32], b: &[f32], eps: f32) {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = x
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    let rstd = 1.0 / (var + f64::from(eps)).sqrt();
    for (((o, &v), &g), &b) in out.iter_mut().zip(x).zip(g).zip(b) {
        *o = ((f64::from(v) - mean) * rstd) as f32 * g + b;
    }
}

/// `embed(x, h | next, prompt, wte, wpe, state, g, b | rows, embd, prompt_len, vocab,
/// positions, eps)`: the embedding into `x`, its norm for the first layer into `h`.
fn embed(ctx: &mut KernelCtx<'_>) -> Result<(), KernelFault> {
    let (rows, embd, plen, vocab, npos) = (
        u(ctx, 9)?,
        u(ctx, 10)?,
        u(ctx, 11)?,
        u(ctx, 12)?,
        u(ctx, 13)?,
    );
    let eps = ctx.scalar_f32(14)?;
    let mut bufs = ctx.buffers_mut()?;
    let [next, prompt, wte, wpe, state, g, b, x, h] = bufs.as_mut_slice() else {
        return Err(F);
    };
    let (next, prompt, wte, wpe) = (as_f32(next)?, as_f32(prompt)?, as_f32(wte)?, as_f32(wpe)?);
    let (g, b) = (sub(as_f32(g)?, 0, embd)?, sub(as_f32(b)?, 0, embd)?);
    let pos = position(as_f32(state)?)?;
    let (x, h) = (as_f32_mut(x)?, as_f32_mut(h)?);
    if pos >= npos {
        return Err(F);
    }
    let pe = sub(wpe, pos * embd, embd)?;
    for r in 0..rows {
        let tok = if pos < plen {
            bits(prompt, pos * rows + r)?
        } else {
            bits(next, r)?
        };
        if tok >= vocab {
            return Err(F);
        }
        let te = sub(wte, tok * embd, embd)?;
        let xr = sub_mut(x, r * embd, embd)?;
        for ((o, &t), &p) in xr.iter_mut().zip(te).zip(pe) {
            *o = t + p;
        }
        norm_row(sub_mut(h, r * embd, embd)?, xr, g, b, eps);
    }
    Ok(())
}

/// `residual_ln(x, h | y, bias, g, b | rows, n, parts, eps)`: `x += (Σ y's parts) + bias`,
/// `h = norm(x)`; `y` is `[parts][rows][n]`.
fn residual_ln(ctx: &mut KernelCtx<'_>) -> Result<(), KernelFault> {
    let (rows, n, parts) = (u(ctx, 6)?, u(ctx, 7)?, u(ctx, 8)?);
    let eps = ctx.scalar_f32(9)?;
    let mut bufs = ctx.buffers_mut()?;
    let [y, bias, g, b, x, h] = bufs.as_mut_slice() else {
        return Err(F);
    };
    let (y, bias, g, b) = (as_f32(y)?, as_f32(bias)?, as_f32(g)?, as_f32(b)?);
    let (x, h) = (as_f32_mut(x)?, as_f32_mut(h)?);
    let (bias, g, b) = (sub(bias, 0, n)?, sub(g, 0, n)?, sub(b, 0, n)?);
    let part = rows.checked_mul(n).ok_or(F)?;
    for r in 0..rows {
        let xr = sub_mut(x, r * n, n)?;
        for (j, (xv, &bv)) in xr.iter_mut().zip(bias).enumerate() {
            let mut s = bv;
            for p in 0..parts {
                s += *y.get(p * part + r * n + j).ok_or(F)?;
            }
            *xv += s;
        }
        norm_row(sub_mut(h, r * n, n)?, xr, g, b, eps);
    }
    Ok(())
}

/// `attention(out, kc, vc | qkv, bias, state | rows, heads, head_dim, cap, scale)`: writes this
/// position's key and value into the caches (`[rows][heads][cap][head_dim]`), then attends over
/// positions `0..=pos`.
fn attention(ctx: &mut KernelCtx<'_>) -> Result<(), KernelFault> {
    let (rows, heads, hd, cap) = (u(ctx, 6)?, u(ctx, 7)?, u(ctx, 8)?, u(ctx, 9)?);
    let scale = ctx.scalar_f32(10)?;
    let mut bufs = ctx.buffers_mut()?;
    let [qkv, bias, state, out, kc, vc] = bufs.as_mut_slice() else {
        return Err(F);
    };
    let (qkv, bias, pos) = (as_f32(qkv)?, as_f32(bias)?, position(as_f32(state)?)?);
    let (out, kc, vc) = (as_f32_mut(out)?, as_f32_mut(kc)?, as_f32_mut(vc)?);
    if pos >= cap {
        return Err(F);
    }
    let e = heads * hd;
    let bias = sub(bias, 0, 3 * e)?;
    let mut q = vec![0.0f32; hd];
    let mut scores = vec![0.0f32; pos + 1];
    for r in 0..rows {
        let row = sub(qkv, r * 3 * e, 3 * e)?;
        for h in 0..heads {
            let base = (r * heads + h) * cap;
            let c = h * hd;
            for d in 0..hd {
                q[d] = row[c + d] + bias[c + d];
            }
            let kn = sub_mut(kc, (base + pos) * hd, hd)?;
            for (d, k) in kn.iter_mut().enumerate() {
                *k = row[e + c + d] + bias[e + c + d];
            }
            let vn = sub_mut(vc, (base + pos) * hd, hd)?;
            for (d, v) in vn.iter_mut().enumerate() {
                *v = row[2 * e + c + d] + bias[2 * e + c + d];
            }
            let mut max = f32::NEG_INFINITY;
            for (t, s) in scores.iter_mut().enumerate() {
                let k = sub(kc, (base + t) * hd, hd)?;
                *s = q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale;
                max = max.max(*s);
            }
            let mut sum = 0.0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            let o = sub_mut(out, r * e + c, hd)?;
            o.fill(0.0);
            for (t, &p) in scores.iter().enumerate() {
                for (ov, &vv) in o.iter_mut().zip(sub(vc, (base + t) * hd, hd)?) {
                    *ov += p * vv;
                }
            }
            for ov in o.iter_mut() {
                *ov /= sum;
            }
        }
    }
    Ok(())
}

/// GPT-2's tanh GELU (`gelu_new`).
pub fn gelu(v: f32) -> f32 {
    0.5 * v * (1.0 + (0.797_884_6_f32 * (v + 0.044_715 * v * v * v)).tanh())
}

/// `bias_gelu(f | bias | rows, n)`: `f = gelu(f + bias)` in place.
fn bias_gelu(ctx: &mut KernelCtx<'_>) -> Result<(), KernelFault> {
    let (rows, n) = (u(ctx, 2)?, u(ctx, 3)?);
    let mut bufs = ctx.buffers_mut()?;
    let [bias, f] = bufs.as_mut_slice() else {
        return Err(F);
    };
    let (bias, f) = (sub(as_f32(bias)?, 0, n)?, as_f32_mut(f)?);
    for r in 0..rows {
        for (v, &b) in sub_mut(f, r * n, n)?.iter_mut().zip(bias) {
            *v = gelu(*v + b);
        }
    }
    Ok(())
}

/// The index of the first largest value (NaNs never win; none at all gives 0).
pub fn argmax_of(l: &[f32]) -> usize {
    let mut best = (0, f32::NEG_INFINITY);
    for (j, &v) in l.iter().enumerate() {
        if v > best.1 {
            best = (j, v);
        }
    }
    best.0
}

/// `argmax(next, history, state, partials, count | logits | rows, vocab, cap)`: each row's
/// token into `next` and `history`, then the next step works on the next position (the
/// partials and count are the CUDA kernel's scratch: untouched here).
fn argmax(ctx: &mut KernelCtx<'_>) -> Result<(), KernelFault> {
    let (rows, vocab, cap) = (u(ctx, 6)?, u(ctx, 7)?, u(ctx, 8)?);
    let mut bufs = ctx.buffers_mut()?;
    let [logits, next, history, state, _, _] = bufs.as_mut_slice() else {
        return Err(F);
    };
    let logits = as_f32(logits)?;
    let (next, history, state) = (as_f32_mut(next)?, as_f32_mut(history)?, as_f32_mut(state)?);
    let pos = position(state)?;
    if pos >= cap {
        return Err(F);
    }
    for r in 0..rows {
        let tok = f32::from_bits(argmax_of(sub(logits, r * vocab, vocab)?) as u32);
        *next.get_mut(r).ok_or(F)? = tok;
        *history.get_mut(pos * rows + r).ok_or(F)? = tok;
    }
    let at = state.first_mut().ok_or(F)?;
    *at = f32::from_bits(at.to_bits().wrapping_add(1));
    Ok(())
}

/// `copy_cache(dst | src | blocks, old_cap, new_cap, head_dim)`: each block's `old_cap`
/// positions to the start of its `new_cap` positions.
fn copy_cache(ctx: &mut KernelCtx<'_>) -> Result<(), KernelFault> {
    let (blocks, old, new, hd) = (u(ctx, 2)?, u(ctx, 3)?, u(ctx, 4)?, u(ctx, 5)?);
    let mut bufs = ctx.buffers_mut()?;
    let [src, dst] = bufs.as_mut_slice() else {
        return Err(F);
    };
    let (src, dst) = (as_f32(src)?, as_f32_mut(dst)?);
    if old > new {
        return Err(F);
    }
    for b in 0..blocks {
        sub_mut(dst, b * new * hd, old * hd)?.copy_from_slice(sub(src, b * old * hd, old * hd)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_first_largest_and_skips_nans() {
        assert_eq!(argmax_of(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax_of(&[f32::NAN, -1.0, f32::NAN]), 1);
        assert_eq!(argmax_of(&[f32::NAN]), 0);
        assert!((gelu(1.0) - 0.841_192).abs() < 1e-6);
    }
}
