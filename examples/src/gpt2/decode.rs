//! Greedy decoding through devcmd, the same for every device: the weights uploaded once, the
//! step's buffers and the KV cache reserved once, then one step per position, run eagerly or
//! recorded once into a graph and replayed.
//!
//! **The step reads its position from device memory.** A small `state` buffer holds the
//! position (the cache length before the step); the embedding, the attention and the argmax read
//! it, and the last kernel of the step increments it. The prompt lives on the device too: the
//! embedding takes the prompt's token while the position is inside the prompt, and the previous
//! step's argmax after it. So every step is the same work on the same buffers — prompt positions
//! included — and a graph recorded once replays every step with nothing written by the host in
//! between; the host only reads each new token back (and, for `--check`, the logits).
//!
//! **KV cache: room held ahead, or grown** ([`KvCache`]). Each layer's keys and values are one
//! buffer of `[rows][heads][cap][head_dim]`. Held ahead (the default), `cap` is every position
//! the run feeds (prompt length + new tokens − 1), reserved before the first step: nothing is
//! reserved while decoding and a graph is recorded once. Grown, `cap` starts at the prompt
//! rounded up to [`GROW_FIRST`] positions and doubles when the next position does not fit: each
//! growth reserves the new buffers, copies the cached positions over (`copy_cache`), drops the
//! old ones and, with graphs, records the step again into the same graph
//! (`end_capture_update`), since the cache moved. Held ahead ships: one recording, no copies, and
//! the memory is known before the first token; growing holds less while the sequence is short
//! and costs a copy and a recording per doubling, with old and new cache live at once during a
//! growth.
//!
//! Owns the device side of the model ([`DeviceModel`], [`upload`]) and the loop ([`decode`]); the
//! step's buffers and work are `step.rs`'s. A device brings a [`Backend`]: its kernels and its
//! GEMM (library work).

use super::config::Config;
use super::kernels::{Kernels, SHARED_LIMIT, attention_shared_bytes, elem_dims, launch, u32s};
use super::split::{gemm_parts, split_k_from_env};
use super::step::{Workspace, enqueue_step, grow, workspace};
use super::weights::{DType, Found, ModelFile, Place, Tensors, to_f32};
use crate::exit::{self, BadInput};
use crate::serve::WeightsPath;
use devcmd::memory::AllocationMode;
use devcmd::{
    Command, Device, ExternalBytes, Gemm, GemmType, Graph, Handle, HostBuffer, HostOrigin, IoError,
    ReadFuture, ReadRequest, ServerError, Shim, StreamId,
};
use std::collections::VecDeque;
use std::error::Error;
use std::time::{Duration, Instant};

/// How the KV cache gets its room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCache {
    /// Every position of the run reserved before the first step.
    Ahead,
    /// Started small, doubled as the sequence grows.
    Grow,
}

/// A grown cache's first size is the prompt rounded up to a multiple of this many positions.
pub const GROW_FIRST: usize = 8;

/// The stream everything runs on.
pub const COMPUTE: StreamId = StreamId(0);
/// Token reads kept in flight before the oldest is awaited (the device runs ahead of the host by
/// this many steps).
pub const IN_FLIGHT: usize = 2;

/// What a device brings: the step's kernels, the element type it computes in, and its GEMM.
pub trait Backend<S: Shim> {
    /// The step's kernels.
    fn kernels(&self) -> &Kernels<S::Kernel>;

    /// The element type of weights and activations on the device.
    fn dtype(&self) -> DType;

    /// Enqueues `C = op(A) · op(B)` as `g` describes (`a`, `b` read, `c` written), named
    /// `name` in failure reports where the device can name it.
    ///
    /// # Errors
    ///
    /// The device's refusal.
    fn gemm(
        &self,
        cmd: &mut Command<'_, S>,
        name: &'static str,
        g: Gemm,
        a: &Handle,
        b: &Handle,
        c: &Handle,
    ) -> Result<(), ServerError>;

    /// Enqueues `C = gelu(op(A) · op(B) + bias)` (the MLP's first layer; `bias` one value per
    /// output feature): by default the GEMM, then the `bias_gelu` kernel over `C`; a device whose
    /// library fuses the two (cuBLASLt's epilogue) does it in one launch.
    ///
    /// # Errors
    ///
    /// The device's refusal.
    fn gemm_bias_gelu(
        &self,
        cmd: &mut Command<'_, S>,
        g: Gemm,
        [a, b, bias]: [&Handle; 3],
        c: &Handle,
    ) -> Result<(), ServerError> {
        let (outputs, rows) = (g.m as usize, g.n as usize);
        self.gemm(cmd, "c_fc", g, a, b, c)?;
        launch(
            cmd,
            &self.kernels().bias_gelu,
            elem_dims(rows * outputs),
            &[bias],
            &[c],
            &[u32s(rows), u32s(outputs)],
        )
    }

    /// Whether [`Self::gemm_bias_gelu`] runs as one launch.
    fn fuses_bias_gelu(&self) -> bool {
        false
    }

    /// How many parts the step cuts the k of a projection that feeds its residual add into
    /// ([`Self::gemm_split_k`]); 1: no split. `GPT2_SPLIT_K=N` sets it on every device.
    fn split_k(&self) -> usize {
        split_k_from_env().unwrap_or(1)
    }

    /// Enqueues the product `g` (A and B untransposed, `beta = 0`) cut along k into `parts`
    /// equal parts: part `p`'s `m × n` result lands at element `p · m · n` of `partials`, and
    /// the partials sum to the product (the residual add sums them). By default one
    /// [`Self::gemm`] per part over views of A, B and `partials`; a device whose library
    /// batches them (cuBLAS's strided-batched GEMM) makes one call.
    ///
    /// # Errors
    ///
    /// The device's refusal; a `parts` that does not divide `g.k` is the caller's bug
    /// (`split_parts` picks a divisor) and is refused by the views.
    fn gemm_split_k(
        &self,
        cmd: &mut Command<'_, S>,
        name: &'static str,
        g: Gemm,
        parts: usize,
        operands: [&Handle; 2],
        partials: &Handle,
    ) -> Result<(), ServerError> {
        gemm_parts(self, cmd, name, g, parts, operands, partials)
    }

    /// Sets up what the GEMMs need on `cmd`'s stream before a recording (cuBLAS's handle and
    /// workspace, which cannot be made while a stream records).
    ///
    /// # Errors
    ///
    /// The device's refusal.
    fn prepare(&self, cmd: &mut Command<'_, S>) -> Result<(), ServerError> {
        let _ = cmd;
        Ok(())
    }

    /// Device bytes the GEMM library keeps on the decoding stream beside the model (cuBLAS's
    /// workspace; 0 where there is none): counted in the memory report's live bytes, told
    /// apart so a run can state held memory against weights + cache + activations alone.
    fn library_scratch_bytes(&self) -> u64 {
        0
    }

    /// Converts `elements` f32 values of `from` (a part of the file, uploaded) into `to`, which
    /// holds as many of [`Self::dtype`]; `None` when the device does not convert (the file must
    /// then hold its type already).
    ///
    /// # Errors
    ///
    /// The device's refusal.
    fn convert(
        &self,
        cmd: &mut Command<'_, S>,
        from: &Handle,
        to: &Handle,
        elements: usize,
    ) -> Option<Result<(), ServerError>> {
        let _ = (cmd, from, to, elements);
        None
    }
}

impl DType {
    /// The GEMM element type.
    pub fn gemm(self) -> GemmType {
        match self {
            Self::F32 => GemmType::F32,
            Self::F16 => GemmType::F16,
        }
    }
}

/// The model on the device.
#[derive(Debug)]
pub struct DeviceModel {
    /// Its config.
    pub config: Config,
    /// The element type of its tensors on the device.
    pub dtype: DType,
    /// Every tensor (views of one upload, or converted copies).
    pub tensors: Tensors<Handle>,
    /// How the file reached the device.
    pub path: WeightsPath,
    /// Bytes of the file uploaded.
    pub bytes: usize,
    /// Device memory held at the end of the upload (converting: before the scratch goes, the
    /// most held): the run's peak counts it.
    pub load_peak: u64,
}

/// Uploads `file` on the compute stream in the persistent mode: the whole file in one copy
/// (page-locked in place first when `register`, as the edge host's `--weights`), each tensor a
/// view of it; converted to the backend's type where the file holds another.
///
/// # Errors
///
/// The device's refusal; a file of another type than the device computes in, on a device that
/// does not convert.
pub fn upload<S, B>(
    device: &mut Device<S>,
    backend: &B,
    file: ModelFile,
    config: &Config,
    register: bool,
) -> Result<DeviceModel, Box<dyn Error>>
where
    S: Shim + Send + Sync + 'static,
    S::Registration: 'static,
    B: Backend<S>,
{
    let ModelFile {
        file,
        dtype: file_dtype,
        places,
        found,
    } = file;
    let want = backend.dtype();
    let bytes = file.len();
    if file_dtype != want {
        return convert(device, backend, &file, &places, &found, config, file_dtype);
    }
    let (data, path) = if register {
        let (ptr, len) = (file.bytes().as_ptr(), file.len());
        let buffer = device.register_host(Box::new(file));
        if buffer.origin() == HostOrigin::Registered {
            (buffer, WeightsPath::Registered)
        } else {
            let why = crate::serve::refusal(device.shim(), ptr, len);
            (buffer, WeightsPath::NotRegistered(why))
        }
    } else {
        (
            HostBuffer::external(Box::new(file)),
            WeightsPath::FileStaged,
        )
    };
    let mut cmd = device.command(COMPUTE)?;
    cmd.allocation_mode(AllocationMode::Persistent);
    let all = cmd.empty(bytes as u64).map_err(|e| too_big(e, bytes))?;
    cmd.write(&all, data)?;
    let tensors = places.try_map(|p| all.view(p.offset as u64, p.len as u64))?;
    cmd.allocation_mode(AllocationMode::Auto);
    let load_peak = cmd.memory_report().held;
    Ok(DeviceModel {
        config: config.clone(),
        dtype: want,
        tensors,
        path,
        bytes,
        load_peak,
    })
}

/// Bytes of f32 weights converted at a time ([`convert`]): the most the device holds of them.
const CONVERT_PIECE: usize = 4 << 20;

/// The f32 file `file` as tensors of the backend's type: each tensor uploaded in pieces of at
/// most [`CONVERT_PIECE`] bytes into one scratch buffer and converted from there into its
/// place, so the device never holds the f32 weights beside the converted ones.
fn convert<S, B>(
    device: &mut Device<S>,
    backend: &B,
    file: &crate::weights::MappedFile,
    places: &Tensors<Place>,
    found: &Found,
    config: &Config,
    file_dtype: DType,
) -> Result<DeviceModel, Box<dyn Error>>
where
    S: Shim + Send + Sync + 'static,
    B: Backend<S>,
{
    let want = backend.dtype();
    if let (DType::F16, Some((name, index))) = (want, &found.past_half) {
        return Err(BadInput::boxed(format!(
            "the f32 weight {name} (element {index}) is past f16's range (65504): in f16 it \
             would be infinite and every logit garbage; run with --dtype f32"
        )));
    }
    if file_dtype != DType::F32 {
        return Err(BadInput::boxed(format!(
            "the weights are {} and this device computes in {}: pass --dtype {} where the \
             device offers it (f16 on --device cuda), or convert the file to f32",
            file_dtype.name(),
            want.name(),
            file_dtype.name()
        )));
    }
    let src = file.bytes();
    // At most a piece, and no more than the largest tensor needs.
    let mut largest = 0;
    places
        .try_map(|p| -> Result<(), ()> {
            largest = largest.max(p.len);
            Ok(())
        })
        .ok();
    let piece = CONVERT_PIECE.min(largest.next_multiple_of(4)).max(4);
    let mut cmd = device.command(COMPUTE)?;
    // The scratch in the default mode, so a cleanup gives its memory back once it goes; the
    // tensors in the persistent one.
    let scratch = cmd.empty(piece as u64)?;
    cmd.allocation_mode(AllocationMode::Persistent);
    let converted = places.try_map(|p| -> Result<Handle, Box<dyn Error>> {
        let elements = p.len / 4;
        let out = cmd.empty((elements * want.bytes()) as u64)?;
        let per = piece / 4;
        let mut at = 0;
        while at < elements {
            let n = per.min(elements - at);
            let part = scratch.view(0, (n * 4) as u64)?;
            let from = p.offset + at * 4;
            cmd.write_from(&part, &src[from..from + n * 4])?;
            let into = out.view((at * want.bytes()) as u64, (n * want.bytes()) as u64)?;
            match backend.convert(&mut cmd, &part, &into, n) {
                Some(done) => done?,
                None => {
                    return Err(BadInput::boxed(format!(
                        "this device runs {} only and the weights are f32: pass --dtype f32",
                        want.name()
                    )));
                }
            }
            at += n;
        }
        Ok(out)
    });
    let tensors = converted.map_err(|e| {
        let message = format!("converting the f32 weights to {}: {e}", want.name());
        match exit::code(&*e) {
            exit::BAD_INPUT => BadInput::boxed(message),
            _ => message.into(),
        }
    })?;
    cmd.allocation_mode(AllocationMode::Auto);
    // The most held: every tensor placed and the scratch still there (nothing went before).
    let load_peak = cmd.memory_report().held;
    drop(scratch);
    cmd.memory_cleanup()?;
    Ok(DeviceModel {
        config: config.clone(),
        dtype: want,
        tensors,
        // Read from the mapped file by `write_from`: staged through pinned memory.
        path: WeightsPath::FileStaged,
        bytes: file.len(),
        load_peak,
    })
}

/// A weights file larger than one buffer of the device, as bad input that says so; any other
/// refusal as it is.
fn too_big(e: ServerError, bytes: usize) -> Box<dyn Error> {
    match e {
        ServerError::Io(IoError::BufferTooBig { max_page, .. }) => BadInput::boxed(format!(
            "the weights file holds {bytes} bytes, more than the {max_page} this device holds \
             in one buffer: the host uploads the file whole, so a model this large does not \
             load here (on the std shim at most {max_page} bytes of weights; --device cuda \
             holds more)"
        )),
        other => other.into(),
    }
}

/// How to decode.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The prompt, one row per batch row, every row the same length (at least 1).
    pub prompt: Vec<Vec<u32>>,
    /// New tokens per row (at least 1).
    pub new_tokens: usize,
    /// Record one step into a graph and replay it.
    pub graph: bool,
    /// With `graph`: record the step again before every replay but the first, into the same
    /// graph (`end_capture_update`), instead of replaying the one recording.
    pub update_each_step: bool,
    /// Read every step's logits back (for `--check`).
    pub keep_logits: bool,
    /// How the KV cache gets its room.
    pub kv: KvCache,
}

impl Plan {
    /// Positions the run feeds: the prompt, then every new token but the last.
    pub fn passes(&self) -> usize {
        (self.prompt.first().map_or(0, Vec::len) + self.new_tokens).saturating_sub(1)
    }
}

/// Records the step again into `g` (`end_capture_update`): after the cache moved, or before
/// every replay with [`Plan::update_each_step`].
fn record_again<S: Shim, B: Backend<S>>(
    cmd: &mut Command<'_, S>,
    backend: &B,
    model: &DeviceModel,
    ws: &Workspace,
    g: &mut Graph<S>,
) -> Result<(), ServerError> {
    backend.prepare(cmd)?;
    let recording = cmd.begin_capture("gpt2_step")?;
    enqueue_step(cmd, backend, model, ws)?;
    cmd.end_capture_update(recording, g)
}

/// What a run decoded and how long it took.
#[derive(Debug, Clone)]
pub struct Decoded {
    /// The new tokens, `[row][step]`.
    pub tokens: Vec<Vec<u32>>,
    /// Each step's logits as f32, `[step][row · vocab]` (with `keep_logits`).
    pub logits: Vec<Vec<f32>>,
    /// From the first enqueue to the first new token on the host (the prompt's steps and one).
    pub first_token: Duration,
    /// The time between consecutive new tokens reaching the host (one per step after the
    /// first).
    pub step_times: Vec<Duration>,
    /// From the first enqueue to the last token.
    pub elapsed: Duration,
    /// How long recording the step took (with `graph`).
    pub record: Option<Duration>,
    /// Bytes of the KV cache at the end.
    pub cache_bytes: u64,
    /// Times the cache grew (and the graph was recorded again).
    pub growths: usize,
    /// The device's memory report after the last step, with the weights, the cache and the
    /// step's buffers still live.
    pub memory: String,
    /// The most device memory held (pages, the budget's count) at any point of the run, read
    /// after the buffers were reserved, after each growth and after each step's enqueue.
    pub held_peak: u64,
    /// Bytes the live allocations asked for after the last step: weights, cache, buffers.
    pub live: u64,
}

/// A step whose tokens are being read back.
struct Pending<S: Shim> {
    read: ReadFuture<S>,
}

/// Decodes `plan` on `device` with `backend` and the uploaded `model`.
///
/// # Errors
///
/// The device's first error; a prompt longer than the model's positions.
pub fn decode<S: Shim, B: Backend<S>>(
    device: &mut Device<S>,
    backend: &B,
    model: &DeviceModel,
    plan: &Plan,
) -> Result<Decoded, Box<dyn Error>> {
    let rows = plan.prompt.len();
    let passes = plan.passes();
    let prompt_len = plan.prompt.first().map_or(0, Vec::len);
    if prompt_len == 0 || plan.new_tokens == 0 || rows == 0 {
        return Err(BadInput::boxed(
            "nothing to decode: the prompt and the new tokens need at least one token",
        ));
    }
    if let Some((r, row)) = plan
        .prompt
        .iter()
        .enumerate()
        .find(|(_, r)| r.len() != prompt_len)
    {
        return Err(BadInput::boxed(format!(
            "prompt row {r} has {} tokens and row 0 has {prompt_len}: every row needs the same \
             length",
            row.len()
        )));
    }
    let vocab = model.config.vocab;
    if let Some(t) = plan.prompt.iter().flatten().find(|&&t| t as usize >= vocab) {
        return Err(BadInput::boxed(format!(
            "prompt token {t} is past the vocabulary ({vocab} tokens): use ids below {vocab}"
        )));
    }
    // The attention kernel keeps a row's query (and, 64 wide, the new key and value), scores
    // and partial sums in shared memory.
    let head_dim = model.config.embd / model.config.heads;
    let shared = attention_shared_bytes(head_dim, passes);
    if shared > SHARED_LIMIT {
        let most = SHARED_LIMIT.saturating_sub(attention_shared_bytes(head_dim, 0)) / 4;
        return Err(BadInput::boxed(format!(
            "attention over {passes} positions with {head_dim}-wide heads needs {shared} bytes \
             of shared memory, past the {SHARED_LIMIT} the kernel may use; decode fewer \
             positions (at most {most}) or use narrower heads"
        )));
    }
    if passes > model.config.positions {
        return Err(BadInput::boxed(format!(
            "the prompt ({prompt_len}) and the new tokens ({}) need {passes} positions, the \
             model has {} (n_positions)",
            plan.new_tokens, model.config.positions
        )));
    }
    let cap = match plan.kv {
        KvCache::Ahead => passes,
        KvCache::Grow => prompt_len.next_multiple_of(GROW_FIRST).min(passes),
    };
    let mut ws = workspace(
        &mut device.command(COMPUTE)?,
        model,
        &plan.prompt,
        cap,
        passes,
        backend.split_k(),
    )?;
    let mut record = None;
    let mut graph = if plan.graph {
        let started = Instant::now();
        let mut cmd = device.command(COMPUTE)?;
        // cuBLAS's handle and workspace are made before the recording (they allocate).
        backend.prepare(&mut cmd)?;
        let recording = cmd.begin_capture("gpt2_step")?;
        enqueue_step(&mut cmd, backend, model, &ws)?;
        let graph = cmd.end_capture(recording)?;
        record = Some(started.elapsed());
        Some(graph)
    } else {
        None
    };
    let mut growths = 0;
    let mut held_peak = device.budget().held().max(model.load_peak);
    let mut tokens = vec![Vec::with_capacity(plan.new_tokens); rows];
    let mut logits = Vec::new();
    let mut arrivals = Vec::with_capacity(plan.new_tokens);
    let mut in_flight: VecDeque<Pending<S>> = VecDeque::new();
    let mut take = |p: Pending<S>, arrivals: &mut Vec<Instant>| -> Result<(), Box<dyn Error>> {
        let bytes = p.read.wait()?;
        arrivals.push(Instant::now());
        for (r, c) in bytes[0].as_slice().chunks_exact(4).enumerate() {
            tokens[r].push(u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        }
        if let Some(l) = bytes.get(1) {
            logits.push(to_f32(l.as_slice(), model.dtype));
        }
        Ok(())
    };
    let started = Instant::now();
    for pass in 0..passes {
        let mut cmd = device.command(COMPUTE)?;
        let grows = pass >= ws.cap;
        if grows {
            let cap = (ws.cap * 2).min(passes);
            grow(&mut cmd, backend, model, &mut ws, cap)?;
            growths += 1;
            held_peak = held_peak.max(cmd.memory_report().held);
        }
        // The step is recorded again where the cache moved, and before every replay but the
        // first with `update_each_step`.
        if let Some(g) = graph
            .as_mut()
            .filter(|_| grows || (plan.update_each_step && pass > 0))
        {
            record_again(&mut cmd, backend, model, &ws, g)?;
        }
        if grows {
            // The old cache (and the graph's old recording, which keeps it) goes back once a
            // fence after its last use passes: queue a fence for it now.
            cmd.flush_drops()?;
        }
        // Release what passed fences cover, without blocking.
        cmd.poll_drops()?;
        match &graph {
            Some(g) => cmd.replay(g)?,
            None => enqueue_step(&mut cmd, backend, model, &ws)?,
        }
        // Pass `p` works on position p and chooses the token of position p + 1: from the last
        // prompt position on, that is a new token.
        if pass + 1 >= prompt_len {
            let next_req = ReadRequest::whole(&ws.next);
            let read = if plan.keep_logits {
                cmd.read_async(&[next_req, ReadRequest::whole(&ws.logits)])?
            } else {
                cmd.read_async(&[next_req])?
            };
            in_flight.push_back(Pending { read });
            held_peak = held_peak.max(device.budget().held());
            if in_flight.len() > IN_FLIGHT {
                let p = in_flight.pop_front().expect("non-empty");
                take(p, &mut arrivals)?;
            }
        }
    }
    while let Some(p) = in_flight.pop_front() {
        take(p, &mut arrivals)?;
    }
    let elapsed = started.elapsed();
    let report = device.memory_report();
    held_peak = held_peak.max(report.held);
    let live = report.streams.iter().map(|(_, r)| r.device().in_use).sum();
    let memory = report.to_string();
    let first_token = arrivals.first().map_or(elapsed, |t| *t - started);
    let step_times = arrivals.windows(2).map(|w| w[1] - w[0]).collect();
    Ok(Decoded {
        tokens,
        logits,
        first_token,
        step_times,
        elapsed,
        record,
        cache_bytes: ws.cache_bytes(),
        growths,
        memory,
        held_peak,
        live,
    })
}
