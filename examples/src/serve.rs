//! The serving loop, once for every device: weights loaded once in the persistent mode, then each
//! batch uploaded on a copy stream, run through the layers (matmul, bias + ReLU, bias + softmax)
//! on a compute stream ordered after the upload on the device, and read back asynchronously while
//! the next batches are enqueued; results are checked against the host reference.
//!
//! Owns the loop and the weights' upload (one copy of the whole weights, the tensors being views
//! of it; the weights page-locked in place first when the device is asked to, and what came of
//! that). Generic over the shim: a device brings only its [`Kernels`]. Does not own the model
//! ([`crate::model`]) nor a device's set-up ([`crate::std_device`], [`crate::cuda_device`]).

use crate::exit::BadInput;
use crate::model::{
    INPUT, Inputs, Kernels, LAYERS, bias_relu_dims, bias_softmax_dims, matmul_dims, params,
    put_floats, reference,
};
use crate::verify;
use crate::weights::{self, from_bytes};
use devcmd::memory::AllocationMode;
use devcmd::{
    Command, Device, ExternalBytes, Handle, HostBuffer, HostOrigin, Launch, ReadFuture,
    ServerError, Shim, StreamId,
};
use std::collections::VecDeque;
use std::error::Error;
use std::time::{Duration, Instant};

/// Reads kept in flight before the oldest is awaited.
pub const IN_FLIGHT: usize = 4;
/// The stream the layers run on (and the weights are uploaded on).
pub const COMPUTE: StreamId = StreamId(0);
/// The stream the inputs are uploaded on.
pub const COPY: StreamId = StreamId(1);

/// The weights before they reach a device.
#[derive(Debug)]
pub enum HostWeights {
    /// Seeded in memory, tensor by tensor (file order).
    Seeded(Vec<Vec<f32>>),
    /// A mapped weights file and its tensors' floats.
    Mapped(weights::Loaded),
}

impl HostWeights {
    /// Each tensor's floats, in file order (the host reference's weights).
    pub fn tensors(&self) -> &[Vec<f32>] {
        match self {
            Self::Seeded(t) => t,
            Self::Mapped(l) => &l.tensors,
        }
    }
}

/// How the weights reached the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightsPath {
    /// Seeded in heap memory, staged through pinned memory.
    Heap,
    /// Memory-mapped from a file and staged through pinned memory (not registered: not asked).
    FileStaged,
    /// Memory-mapped from a file and page-locked in place: copied by DMA, no staging copy.
    Registered,
    /// Registration was asked for and refused (the reason, as the shim gave it): staged.
    NotRegistered(String),
}

/// The weights on the device: one allocation, each tensor a view of it.
#[derive(Debug)]
pub struct DeviceWeights {
    /// The whole allocation (the tensors are views of it).
    pub all: Handle,
    /// The tensors in file order: W1 b1 W2 b2 W3 b3.
    pub tensors: Vec<Handle>,
    /// The host floats, for the reference.
    pub reference: Vec<Vec<f32>>,
    /// How they were uploaded.
    pub path: WeightsPath,
    /// Bytes uploaded.
    pub bytes: usize,
}

/// Uploads `weights` on the compute stream in the persistent mode: one allocation and one copy
/// for all tensors. With `register`, mapped weights are first page-locked in place
/// ([`Device::register_host`]); if the device refuses, they are staged and the reason kept.
///
/// # Errors
///
/// The device's refusal to reserve or copy.
pub fn load_weights<S>(
    device: &mut Device<S>,
    weights: HostWeights,
    register: bool,
) -> Result<DeviceWeights, Box<dyn Error>>
where
    S: Shim + Send + Sync + 'static,
    S::Registration: 'static,
{
    let reference: Vec<Vec<f32>> = weights.tensors().to_vec();
    let (data, path) = match weights {
        HostWeights::Seeded(t) => {
            let bytes: Vec<u8> = t.iter().flat_map(|w| weights::to_bytes(w)).collect();
            (HostBuffer::from_vec(bytes), WeightsPath::Heap)
        }
        HostWeights::Mapped(loaded) if register => {
            let (ptr, len) = (loaded.file.bytes().as_ptr(), loaded.file.len());
            let buffer = device.register_host(Box::new(loaded.file));
            if buffer.origin() == HostOrigin::Registered {
                (buffer, WeightsPath::Registered)
            } else {
                let why = refusal(device.shim(), ptr, len);
                (buffer, WeightsPath::NotRegistered(why))
            }
        }
        HostWeights::Mapped(loaded) => (
            HostBuffer::external(Box::new(loaded.file)),
            WeightsPath::FileStaged,
        ),
    };
    let bytes = data.len();
    let mut cmd = device.command(COMPUTE)?;
    cmd.allocation_mode(AllocationMode::Persistent);
    let all = cmd.empty(bytes as u64)?;
    cmd.write(&all, data)?;
    cmd.allocation_mode(AllocationMode::Auto);
    let mut tensors = Vec::with_capacity(reference.len());
    let mut offset = 0u64;
    for t in &reference {
        let len = (t.len() * 4) as u64;
        tensors.push(all.view(offset, len)?);
        offset += len;
    }
    Ok(DeviceWeights {
        all,
        tensors,
        reference,
        path,
        bytes,
    })
}

/// Why the shim would not page-lock `len` bytes at `ptr`, asked again of the shim itself (the
/// core logs the reason at debug level only). The bytes are alive: the buffer holding them was
/// just made from them.
pub(crate) fn refusal<S: Shim>(shim: &S, ptr: *const u8, len: usize) -> String {
    let Some(ptr) = std::ptr::NonNull::new(ptr.cast_mut()) else {
        return "the mapping is empty".to_owned();
    };
    match shim.host_register(ptr, len) {
        Err(e) => e.to_string(),
        Ok(registration) => {
            // SAFETY: nothing was ever copied from or to this registration: it is undone at once.
            unsafe { shim.host_unregister(registration) };
            "the shim refused once and accepted when asked again".to_owned()
        }
    }
}

/// How to serve.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Batches to serve.
    pub batches: usize,
    /// Requests per batch.
    pub batch_size: usize,
    /// Seeds the inputs.
    pub seed: u64,
    /// Checks every result against the host reference (the edge host always does).
    pub verify: bool,
    /// Shows a progress bar for long runs.
    pub progress: bool,
}

/// What a run served.
#[derive(Debug, Clone, Copy)]
pub struct Served {
    /// Requests served.
    pub requests: u128,
    /// Time from the first upload to the last result.
    pub elapsed: Duration,
    /// Outputs that differ from the reference (0 when not verified).
    pub mismatches: usize,
}

impl Served {
    /// Requests per second.
    pub fn per_second(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }
}

/// A progress bar for a long run that asked for one.
pub(crate) fn progress_bar(plan: &Plan) -> Option<indicatif::ProgressBar> {
    (plan.progress && plan.batches >= 200).then(|| {
        let bar = indicatif::ProgressBar::new(plan.batches as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} batches {per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    })
}

/// A batch whose result is being read back.
pub(crate) struct Pending<S: Shim> {
    pub(crate) batch: usize,
    pub(crate) input: Vec<f32>,
    pub(crate) read: ReadFuture<S>,
}

/// The bytes of each launch's output for a batch of `m` requests, in launch order (matmul, then
/// bias and activation, per layer).
pub fn layer_buffers(m: usize) -> Vec<u64> {
    LAYERS
        .iter()
        .flat_map(|&(_, kout)| [(m * kout * 4) as u64; 2])
        .collect()
}

/// Enqueues the model's six launches on `cmd` for a batch of `m` requests whose input is `x`:
/// `buffer(cmd, bytes)` gives each launch its output buffer in turn (a new reservation, eagerly or
/// inside a recording). Returns the last output (the class probabilities).
///
/// # Errors
///
/// The device's refusal of a reservation or a launch.
pub fn enqueue_layers<S: Shim>(
    cmd: &mut Command<'_, S>,
    k: &Kernels<S::Kernel>,
    w: &DeviceWeights,
    m: usize,
    x: Handle,
    mut buffer: impl FnMut(&mut Command<'_, S>, u64) -> Result<Handle, ServerError>,
) -> Result<Handle, ServerError> {
    let mut act = x;
    for (l, &(kin, kout)) in LAYERS.iter().enumerate() {
        let pre = buffer(cmd, (m * kout * 4) as u64)?;
        let shape = [m as u32, kin as u32, kout as u32].map(u32::to_ne_bytes);
        cmd.launch(Launch {
            kernel: &k.matmul,
            dims: matmul_dims(m, kout),
            inputs: &[&act, &w.tensors[2 * l]],
            outputs: &[&pre],
            params: &params(&shape),
        })?;
        let out = buffer(cmd, (m * kout * 4) as u64)?;
        let last = l + 1 == LAYERS.len();
        let shape = [m as u32, kout as u32].map(u32::to_ne_bytes);
        cmd.launch(Launch {
            kernel: if last { &k.bias_softmax } else { &k.bias_relu },
            dims: if last {
                bias_softmax_dims(m)
            } else {
                bias_relu_dims(m, kout)
            },
            inputs: &[&pre, &w.tensors[2 * l + 1]],
            outputs: &[&out],
            params: &params(&shape),
        })?;
        act = out;
    }
    Ok(act)
}

/// Enqueues one batch of `m` requests on `device`: the input uploaded on the copy stream
/// (through pinned staging), the layers on the compute stream ordered after it on the device
/// (no host sync), the result read back (in place where the device runs zero copy).
///
/// # Errors
///
/// The device's refusal of a reservation, a copy or a launch.
pub(crate) fn enqueue_batch<S: Shim>(
    device: &mut Device<S>,
    k: &Kernels<S::Kernel>,
    w: &DeviceWeights,
    m: usize,
    input: &[f32],
) -> Result<ReadFuture<S>, ServerError> {
    let x = {
        let mut cmd = device.command(COPY)?;
        let x = cmd.empty((m * INPUT * 4) as u64)?;
        let mut staged = cmd.reserve_host(m * INPUT * 4, true)?;
        put_floats(staged.as_mut_slice(), input);
        cmd.write(&x, staged)?;
        x
    };
    let mut cmd = device.command(COMPUTE)?;
    let act = enqueue_layers(&mut cmd, k, w, m, x, |cmd, bytes| cmd.empty(bytes))?;
    cmd.read_owned(act)
}

/// Serves `plan` on `device` with its kernels `k` and the weights loaded by [`load_weights`].
///
/// # Errors
///
/// The first error of the device, or a reference nothing can be verified against.
pub fn serve<S: Shim>(
    plan: &Plan,
    device: &mut Device<S>,
    k: &Kernels<S::Kernel>,
    w: &DeviceWeights,
) -> Result<Served, Box<dyn Error>> {
    let m = plan.batch_size;
    let progress = progress_bar(plan);
    let mut inputs = Inputs::new(plan.seed, m);
    let mut in_flight: VecDeque<Pending<S>> = VecDeque::new();
    let mut mismatches = 0usize;
    let started = Instant::now();
    for batch in 0..plan.batches {
        let input = inputs.next_batch();
        let read = enqueue_batch(device, k, w, m, &input)?;
        in_flight.push_back(Pending { batch, input, read });
        if in_flight.len() >= IN_FLIGHT {
            let p = in_flight.pop_front().expect("non-empty");
            mismatches += check(p, plan.verify, &w.reference, m)?;
        }
        if let Some(bar) = &progress {
            bar.inc(1);
        }
    }
    while let Some(p) = in_flight.pop_front() {
        mismatches += check(p, plan.verify, &w.reference, m)?;
    }
    let elapsed = started.elapsed();
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    Ok(Served {
        requests: plan.batches as u128 * m as u128, // no overflow, whatever was asked
        elapsed,
        mismatches,
    })
}

/// Waits for a batch's result and, when `verify`, counts the outputs that differ from the host
/// reference.
pub(crate) fn check<S: Shim>(
    p: Pending<S>,
    verify: bool,
    weights: &[Vec<f32>],
    m: usize,
) -> Result<usize, Box<dyn Error>> {
    let bytes = p.read.wait()?;
    if !verify {
        return Ok(0);
    }
    let got = from_bytes(bytes[0].as_slice());
    let want = reference(weights, &p.input, m);
    let bad = verify::compare(&got, &want)
        .map_err(|e| BadInput::boxed(format!("batch {}: {e}", p.batch)))?;
    if let Some((i, g, w)) = bad.first {
        let side = |v: Option<f32>| v.map_or_else(|| "nothing".to_owned(), |v| v.to_string());
        eprintln!(
            "batch {}: {} of {} outputs differ from the reference (first: output {i}, got {}, \
             want {})",
            p.batch,
            bad.count,
            want.len(),
            side(g),
            side(w)
        );
    }
    Ok(bad.count)
}

/// Prints the device's memory report and drop-queue statistics, after two flushes per stream
/// (everything pushed so far passes its fence and is released).
///
/// # Errors
///
/// A flush's failure.
pub fn report<S: Shim>(device: &mut Device<S>) -> Result<(), Box<dyn Error>> {
    for _ in 0..2 {
        for s in [COMPUTE, COPY] {
            device.command(s)?.flush_drops()?;
        }
    }
    println!("\nmemory report:\n{}", device.memory_report());
    println!("\ndrop queues:");
    for (id, st) in device.drop_stats() {
        println!(
            "  stream {}: {} flushes, {} fences waited, {} polled, {} items / {} bytes released, {} leaked",
            id.0,
            st.flushes,
            st.fences_waited,
            st.fences_polled,
            st.items_released,
            st.bytes_released,
            st.items_leaked
        );
    }
    Ok(())
}
