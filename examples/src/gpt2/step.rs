//! One decoding step's buffers and work: the [`Workspace`] (activations, the token history, the
//! position and the KV cache, reserved once for a run, or the cache grown by [`grow`]) and
//! [`enqueue_step`], the step's launches and GEMMs in order, the same for every device and for
//! eager runs and recordings (see [`super::decode`] for why the position lives on the device).
//!
//! Owns the step's buffers and its order of work. Does not own the kernels' sources and
//! geometry (`kernels.rs`), the device's kernels and GEMM ([`Backend`]) nor the loop
//! (`decode.rs`).

use super::decode::{Backend, DeviceModel};
use super::kernels::{
    argmax_dims, argmax_partials, attention_dims, elem_dims, f32s, head, launch, linear, rows_dims,
    u32s,
};
use super::split::projection_parts;
use devcmd::{Command, Handle, ServerError, Shim};

/// The step's buffers and the KV cache, reserved once for a run.
#[derive(Debug)]
pub struct Workspace {
    /// Batch rows.
    pub rows: usize,
    /// Prompt length.
    pub prompt_len: usize,
    /// Positions the KV cache holds.
    pub cap: usize,
    /// Positions the token history holds (every position of the run).
    pub history_cap: usize,
    /// The residual stream `[rows, embd]`.
    pub x: Handle,
    /// The normed residual `[rows, embd]`.
    pub h: Handle,
    /// Queries, keys, values `[rows, 3·embd]`.
    pub qkv: Handle,
    /// The attention's output `[rows, embd]`.
    pub attn: Handle,
    /// A projection's output `[parts][rows, embd]`: partials the residual add sums.
    pub y: Handle,
    /// Parts the attention's output projection is cut into (1: not cut).
    pub proj_parts: usize,
    /// Parts the MLP's output projection is cut into.
    pub out_parts: usize,
    /// The MLP's hidden layer `[rows, inner]`.
    pub f: Handle,
    /// The logits `[rows, vocab]`.
    pub logits: Handle,
    /// The tokens the last step chose `[rows]` (u32).
    pub next: Handle,
    /// Every step's tokens `[history_cap][rows]` (u32).
    pub history: Handle,
    /// The prompt `[prompt_len][rows]` (u32).
    pub prompt: Handle,
    /// `[position, 0, 0, 0]` (u32).
    pub state: Handle,
    /// The argmax's partials (u32 pairs, scratch).
    pub argmax_part: Handle,
    /// The argmax's count (u32, 0 between launches).
    pub argmax_count: Handle,
    /// Each layer's keys `[rows][heads][cap][head_dim]`.
    pub k: Vec<Handle>,
    /// Each layer's values.
    pub v: Vec<Handle>,
}

impl Workspace {
    /// Bytes of the KV cache.
    pub fn cache_bytes(&self) -> u64 {
        self.k.iter().chain(&self.v).map(Handle::len).sum()
    }
}

/// `u32`s as little-endian bytes.
fn u32_bytes(v: impl IntoIterator<Item = u32>) -> Vec<u8> {
    v.into_iter().flat_map(u32::to_le_bytes).collect()
}

/// Reserves the buffers of a run of `passes` positions over `prompt` (`[rows][prompt_len]`)
/// with `cap` cached positions, and uploads the prompt and the starting state; the projections'
/// output holds `split` partials ([`projection_parts`]).
///
/// # Errors
///
/// The device's refusal.
pub fn workspace<S: Shim>(
    cmd: &mut Command<'_, S>,
    model: &DeviceModel,
    prompt: &[Vec<u32>],
    cap: usize,
    passes: usize,
    split: usize,
) -> Result<Workspace, ServerError> {
    let c = &model.config;
    let (proj_parts, out_parts) = projection_parts(c, split);
    let rows = prompt.len();
    let prompt_len = prompt.first().map_or(0, Vec::len);
    let es = model.dtype.bytes();
    let mut buf = |elements: usize| cmd.empty((elements * es) as u64);
    let x = buf(rows * c.embd)?;
    let h = buf(rows * c.embd)?;
    let qkv = buf(rows * 3 * c.embd)?;
    let attn = buf(rows * c.embd)?;
    let y = buf(proj_parts.max(out_parts) * rows * c.embd)?;
    let f = buf(rows * c.inner)?;
    let logits = buf(rows * c.vocab)?;
    let per_layer = rows * c.embd * cap;
    let mut k = Vec::with_capacity(c.layers);
    let mut v = Vec::with_capacity(c.layers);
    for _ in 0..c.layers {
        k.push(buf(per_layer)?);
        v.push(buf(per_layer)?);
    }
    let by_position = (0..prompt_len).flat_map(|p| prompt.iter().map(move |row| row[p]));
    let prompt = cmd.create(&u32_bytes(by_position))?;
    let next = cmd.create(&u32_bytes(vec![0; rows]))?;
    let history = cmd.create(&u32_bytes(vec![0; rows * passes]))?;
    let state = cmd.create(&u32_bytes([0; 4]))?;
    let argmax_part = cmd.empty((argmax_partials(rows) * 4) as u64)?;
    let argmax_count = cmd.create(&u32_bytes([0]))?;
    Ok(Workspace {
        rows,
        prompt_len,
        cap,
        history_cap: passes,
        x,
        h,
        qkv,
        attn,
        y,
        proj_parts,
        out_parts,
        f,
        logits,
        next,
        history,
        prompt,
        state,
        argmax_part,
        argmax_count,
        k,
        v,
    })
}

/// Moves the KV cache of `ws` to room for `cap` positions: new buffers, the cached positions
/// copied over on the device, the old buffers dropped (back to the pool once the copies ran).
///
/// # Errors
///
/// The device's refusal.
pub fn grow<S: Shim, B: Backend<S>>(
    cmd: &mut Command<'_, S>,
    be: &B,
    model: &DeviceModel,
    ws: &mut Workspace,
    cap: usize,
) -> Result<(), ServerError> {
    let c = &model.config;
    let (hd, blocks) = (c.head_dim(), ws.rows * c.heads);
    let bytes = (ws.rows * c.embd * cap * model.dtype.bytes()) as u64;
    for old in ws.k.iter_mut().chain(ws.v.iter_mut()) {
        let new = cmd.empty(bytes)?;
        launch(
            cmd,
            &be.kernels().copy_cache,
            elem_dims(blocks * ws.cap * hd),
            &[old],
            &[&new],
            &[u32s(blocks), u32s(ws.cap), u32s(cap), u32s(hd)],
        )?;
        *old = new;
    }
    ws.cap = cap;
    Ok(())
}

/// Kernel launches and GEMMs of one step for a model of `layers` layers (`fused`: the MLP's
/// bias and GELU ride its first GEMM).
pub fn launches_per_step(layers: usize, fused: bool) -> usize {
    // embed (and the first norm); per layer 4 GEMMs, attention, 2 residual norms, GELU (unless
    // fused); head GEMM, argmax (which advances the position).
    1 + (8 - usize::from(fused)) * layers + 2
}

/// An output projection into `y`: the plain GEMM, or cut along k into `parts` partials.
fn project<S: Shim, B: Backend<S>>(
    cmd: &mut Command<'_, S>,
    be: &B,
    name: &'static str,
    g: devcmd::Gemm,
    parts: usize,
    [w, x]: [&Handle; 2],
    y: &Handle,
) -> Result<(), ServerError> {
    if parts <= 1 {
        be.gemm(cmd, name, g, w, x, y)
    } else {
        be.gemm_split_k(cmd, name, g, parts, [w, x], y)
    }
}

/// Enqueues one decoding step on `cmd` (eagerly, or into a recording).
///
/// # Errors
///
/// The device's refusal of a launch or a GEMM.
pub fn enqueue_step<S: Shim, B: Backend<S>>(
    cmd: &mut Command<'_, S>,
    be: &B,
    m: &DeviceModel,
    ws: &Workspace,
) -> Result<(), ServerError> {
    let c = &m.config;
    let t = &m.tensors;
    let k = be.kernels();
    let (rows, e, gt) = (ws.rows, c.embd, m.dtype.gemm());
    let eps = f32s(c.eps);
    let (proj_parts, out_parts) = (ws.proj_parts, ws.out_parts);
    let first = &t.layers[0];
    launch(
        cmd,
        &k.embed,
        rows_dims(rows, e, m.dtype.bytes()),
        &[
            &ws.next,
            &ws.prompt,
            &t.wte,
            &t.wpe,
            &ws.state,
            &first.ln1_g,
            &first.ln1_b,
        ],
        &[&ws.x, &ws.h],
        &[
            u32s(rows),
            u32s(e),
            u32s(ws.prompt_len),
            u32s(c.vocab),
            u32s(c.positions),
            eps,
        ],
    )?;
    for (l, layer) in t.layers.iter().enumerate() {
        let qkv = linear(gt, rows, e, 3 * e);
        be.gemm(cmd, "c_attn", qkv, &layer.attn_w, &ws.h, &ws.qkv)?;
        launch(
            cmd,
            &k.attention,
            attention_dims(rows, c.heads, c.head_dim(), ws.cap),
            &[&ws.qkv, &layer.attn_b, &ws.state],
            &[&ws.attn, &ws.k[l], &ws.v[l]],
            &[
                u32s(rows),
                u32s(c.heads),
                u32s(c.head_dim()),
                u32s(ws.cap),
                f32s(c.attn_scale(l)),
            ],
        )?;
        let proj = linear(gt, rows, e, e);
        project(
            cmd,
            be,
            "attn.c_proj",
            proj,
            proj_parts,
            [&layer.proj_w, &ws.attn],
            &ws.y,
        )?;
        launch(
            cmd,
            &k.residual_ln,
            rows_dims(rows, e, m.dtype.bytes()),
            &[&ws.y, &layer.proj_b, &layer.ln2_g, &layer.ln2_b],
            &[&ws.x, &ws.h],
            &[u32s(rows), u32s(e), u32s(proj_parts), eps],
        )?;
        let fc = linear(gt, rows, e, c.inner);
        be.gemm_bias_gelu(cmd, fc, [&layer.fc_w, &ws.h, &layer.fc_b], &ws.f)?;
        let out = linear(gt, rows, c.inner, e);
        project(
            cmd,
            be,
            "mlp.c_proj",
            out,
            out_parts,
            [&layer.out_w, &ws.f],
            &ws.y,
        )?;
        // The residual, then the next layer's first norm (or the final one).
        let (g, b) = match t.layers.get(l + 1) {
            Some(next) => (&next.ln1_g, &next.ln1_b),
            None => (&t.lnf_g, &t.lnf_b),
        };
        launch(
            cmd,
            &k.residual_ln,
            rows_dims(rows, e, m.dtype.bytes()),
            &[&ws.y, &layer.out_b, g, b],
            &[&ws.x, &ws.h],
            &[u32s(rows), u32s(e), u32s(out_parts), eps],
        )?;
    }
    let head = head(gt, rows, e, c.vocab);
    be.gemm(cmd, "lm_head", head, t.head(), &ws.h, &ws.logits)?;
    launch(
        cmd,
        &k.argmax,
        argmax_dims(rows),
        &[&ws.logits],
        &[
            &ws.next,
            &ws.history,
            &ws.state,
            &ws.argmax_part,
            &ws.argmax_count,
        ],
        &[u32s(rows), u32s(c.vocab), u32s(ws.history_cap)],
    )
}
