//! Library work on a GPU: cuBLAS GEMMs through [`Cublas`] (devcmd's `Command::library`), and
//! streams borrowed from the caller's runtime. They run where a CUDA driver, a device and cuBLAS
//! are present and print a visible `skipped: ...` line (straight to stderr) and pass elsewhere.
//!
//! Every GEMM is checked against a CPU reference in f64 on fresh random non-zero data, by
//! ‖out − ref‖ / ‖ref‖ (f32: under 1e-5 on data that uses the whole mantissa, so TF32 would
//! fail it: cuBLAS's default math mode is full fp32; f16 in and out with fp32 accumulation:
//! under 2e-3, the output's rounding), and every element of an output written with `beta = 0`
//! was poisoned (NaN) before, so one left unwritten fails the check.

mod common;

use common::blas::{
    Rng, blas, decode, encode, operands, read, reference, relative_error, tolerance,
};
use common::{compile, say};
use devcmd::{
    Device, DeviceConfig, Gemm, GemmType, KernelParam, LaunchDims, LaunchError, ServerError, Shim,
    StreamId, Validation,
};
use devcmd_cuda::{Cublas, CudaShim, cublas_sys, sys};

const S0: StreamId = StreamId(0);
const S1: StreamId = StreamId(1);

/// Runs `g` on fresh operands on `stream` and checks C against the reference.
fn check_gemm(dev: &mut Device<CudaShim>, blas: &Cublas, g: Gemm, rng: &mut Rng, what: &str) {
    let (a, b, c) = operands(&g, rng);
    let mut cmd = dev.command(S0).unwrap();
    let ha = cmd.create(&encode(g.dtype, &a)).unwrap();
    let hb = cmd.create(&encode(g.dtype, &b)).unwrap();
    let hc = cmd.create(&encode(g.dtype, &c)).unwrap();
    blas.gemm(&mut cmd, g, &ha, &hb, &hc).unwrap();
    let out = decode(g.dtype, &read(dev, S0, &hc).unwrap());
    let want = reference(&g, &a, &b, &c);
    let err = relative_error(&g, &out, &want);
    say(&format!("{what}: {g:?}: relative error {err:.3e}"));
    assert!(
        err < tolerance(g.dtype),
        "{what}: relative error {err:e} for {g:?}"
    );
}

/// Products of several shapes: odd sizes, transposes, padded leading dimensions, alpha and
/// beta other than 1 and 0.
fn shapes(dtype: GemmType) -> Vec<Gemm> {
    let mut v = vec![
        Gemm::packed(dtype, 64, 64, 64),
        Gemm::packed(dtype, 67, 45, 33),
    ];
    let mut t = Gemm::packed(dtype, 40, 29, 51);
    (t.trans_a, t.trans_b, t.lda, t.ldb) = (true, true, 51 + 3, 29 + 5);
    (t.alpha, t.beta, t.ldc) = (1.5, -0.5, 40 + 2);
    v.push(t);
    let mut u = Gemm::packed(dtype, 17, 128, 96);
    (u.trans_b, u.ldb, u.alpha) = (true, 128, 0.25);
    v.push(u);
    // One column, as a decoding step's single row makes (A transposed, with a C to add; A as
    // stored, with B a row whose values lie `ldb` apart).
    let mut w = Gemm::packed(dtype, 77, 1, 53);
    (w.trans_a, w.lda, w.alpha, w.beta) = (true, 53 + 2, 1.25, 0.5);
    v.push(w);
    let mut x = Gemm::packed(dtype, 70, 1, 40);
    (x.trans_b, x.ldb, x.lda) = (true, 3, 70 + 1);
    v.push(x);
    v
}

#[test]
fn a_gemm_through_library_work_matches_a_cpu_reference_f32() {
    let test = "a_gemm_through_library_work_matches_a_cpu_reference_f32";
    let Some((shim, blas)) = blas(test) else {
        return;
    };
    say(&format!(
        "{test}: {} (cublasGetVersion {})",
        blas.library(),
        blas.version()
    ));
    let mut rng = Rng::seeded(test);
    let mut dev = Device::new(shim, DeviceConfig::default());
    for g in shapes(GemmType::F32) {
        check_gemm(&mut dev, &blas, g, &mut rng, "f32");
    }
}

/// One `Cublas` serves device after device: the lanes of a dropped device go (their handles
/// are reused for the next, also over the legacy default stream), and the products stay right. A view between two floats is refused
/// before cuBLAS sees it (it would fault on the GPU).
#[test]
fn a_cublas_outlives_devices_and_refuses_a_view_between_elements() {
    let test = "a_cublas_outlives_devices_and_refuses_a_view_between_elements";
    let Some((shim, blas)) = blas(test) else {
        return;
    };
    let mut rng = Rng::seeded(test);
    for round in 0..3 {
        let mut dev = Device::new(shim.clone(), DeviceConfig::default());
        check_gemm(
            &mut dev,
            &blas,
            Gemm::packed(GemmType::F32, 33, 17, 9),
            &mut rng,
            &format!("device {round}"),
        );
        // The devices before went with their workspaces: their lanes were pruned when this
        // device's stream was served.
        assert_eq!(blas.streams_held(), 1, "device {round}");
        // A second stream takes the other spare handle the device before left (none is
        // destroyed inside a call: that would synchronise the device).
        let mut cmd = dev.command(S1).unwrap();
        let (a, b, c) = (
            cmd.create(&[0u8; 64]).unwrap(),
            cmd.create(&[0u8; 64]).unwrap(),
            cmd.empty(64).unwrap(),
        );
        let g = Gemm::packed(GemmType::F32, 4, 4, 4);
        blas.gemm(&mut cmd, g, &a, &b, &c).unwrap();
        assert_eq!(read(&mut dev, S1, &c).unwrap(), vec![0u8; 64]);
        assert_eq!(blas.streams_held(), 2, "device {round}, stream 1");
    }
    // A device whose stream 0 is the legacy default stream (null) gets the handle the device
    // before used, which still points at that device's stream, destroyed with it: the first call
    // points it at null (a lane that took "null" for "never set" left it on the dead stream).
    {
        let mut dev = Device::new(shim.clone(), DeviceConfig::default());
        // SAFETY: the legacy default stream lives with the context, past this device; no other
        // stream of this device is over it, and nothing records it.
        unsafe { dev.borrow_stream(S0, &std::ptr::null_mut()) }.unwrap();
        check_gemm(
            &mut dev,
            &blas,
            Gemm::packed(GemmType::F32, 33, 17, 9),
            &mut rng,
            "device over the legacy default stream",
        );
        assert_eq!(blas.streams_held(), 1, "the dead device's lane went");
    }
    let mut dev = Device::new(shim, DeviceConfig::default());
    let mut cmd = dev.command(S0).unwrap();
    let g = Gemm::packed(GemmType::F32, 4, 4, 4);
    let (a, b) = (cmd.empty(64).unwrap(), cmd.empty(68).unwrap());
    let c = cmd.empty(64).unwrap();
    let odd = b.view(2, 64).unwrap();
    let e = blas.gemm(&mut cmd, g, &a, &odd, &c).unwrap_err();
    say(&format!("{test}: {e}"));
    assert!(
        matches!(
            e,
            ServerError::Validation(Validation::LibraryAlignment {
                operand: "B",
                offset: 2,
                ..
            })
        ),
        "{e:?}"
    );
}

/// A `Cublas` dropped while a stream records leaks its handles rather than destroy them
/// (`cublasDestroy` synchronises the device, which would invalidate the recording): the
/// recording ends whole and replays.
#[test]
fn a_cublas_dropped_while_a_stream_records_leaves_the_recording_whole() {
    let test = "a_cublas_dropped_while_a_stream_records_leaves_the_recording_whole";
    let Some((shim, blas)) = blas(test) else {
        return;
    };
    let mut dev = Device::new(shim, DeviceConfig::default());
    let x = {
        let mut cmd = dev.command(S0).unwrap();
        blas.prepare(&mut cmd).unwrap();
        let x = cmd.create(&[1u8; 256]).unwrap();
        let rec = cmd.begin_capture("fill").unwrap();
        drop(blas);
        cmd.write_from(&x, &[2u8; 256]).unwrap();
        let graph = cmd.end_capture(rec);
        assert!(graph.is_ok(), "{graph:?}");
        cmd.write_from(&x, &[3u8; 256]).unwrap();
        cmd.replay(&graph.unwrap()).unwrap();
        x
    };
    assert_eq!(read(&mut dev, S0, &x).unwrap(), [2u8; 256]);
}

#[test]
fn a_gemm_through_library_work_matches_a_cpu_reference_f16() {
    let test = "a_gemm_through_library_work_matches_a_cpu_reference_f16";
    let Some((shim, blas)) = blas(test) else {
        return;
    };
    let mut rng = Rng::seeded(test);
    let mut dev = Device::new(shim, DeviceConfig::default());
    for g in shapes(GemmType::F16) {
        check_gemm(&mut dev, &blas, g, &mut rng, "f16");
    }
}

/// A product cut along k (`Cublas::gemm_split_k`, one strided-batched call): the partials,
/// summed, match the reference of the whole product; every part was written (NaN-poisoned
/// first); parts that do not divide k, a transposed operand and a too-short output are refused
/// before anything is enqueued.
#[test]
fn a_split_k_gemm_sums_to_the_whole_product() {
    let test = "a_split_k_gemm_sums_to_the_whole_product";
    let Some((shim, blas)) = blas(test) else {
        return;
    };
    let mut rng = Rng::seeded(test);
    let mut dev = Device::new(shim, DeviceConfig::default());
    for dtype in [GemmType::F32, GemmType::F16] {
        // A decoding step's shapes (one and eight columns), and a padded ldc.
        let mut padded = Gemm::packed(dtype, 40, 3, 96);
        padded.ldc = 44;
        let mut strided = Gemm::packed(dtype, 48, 2, 64);
        (strided.lda, strided.ldb) = (50, 70);
        for (g, parts) in [
            (Gemm::packed(dtype, 96, 1, 384), 6u32),
            (Gemm::packed(dtype, 64, 8, 256), 4),
            (padded, 3),
            (strided, 4),
            (Gemm::packed(dtype, 32, 2, 64), 1),
        ] {
            let (a, b, _) = operands(&g, &mut rng);
            let part = (g.ldc * g.n) as usize;
            let poison = vec![f32::NAN; part * parts as usize];
            let mut cmd = dev.command(S0).unwrap();
            let ha = cmd.create(&encode(dtype, &a)).unwrap();
            let hb = cmd.create(&encode(dtype, &b)).unwrap();
            let hp = cmd.create(&encode(dtype, &poison)).unwrap();
            blas.gemm_split_k(&mut cmd, g, parts, &ha, &hb, &hp)
                .unwrap();
            let out = decode(dtype, &read(&mut dev, S0, &hp).unwrap());
            let mut sum = vec![0.0f32; part];
            for p in 0..parts as usize {
                for j in 0..g.n as usize {
                    for i in 0..g.m as usize {
                        let at = i + j * g.ldc as usize;
                        sum[at] += out[p * part + at];
                    }
                }
            }
            let want = reference(&g, &a, &b, &vec![0.0; part]);
            let err = relative_error(&g, &sum, &want);
            say(&format!(
                "split-K {dtype:?} {g:?} in {parts}: relative error {err:.3e}"
            ));
            assert!(err < tolerance(dtype), "{g:?} in {parts}: {err:e}");
        }
        // Refusals: nothing enqueued, the error names the rule.
        let g = Gemm::packed(dtype, 16, 1, 48);
        let mut cmd = dev.command(S0).unwrap();
        let ha = cmd.empty(16 * 48 * dtype.bytes()).unwrap();
        let hb = cmd.empty(48 * dtype.bytes()).unwrap();
        let hp = cmd.empty(16 * 4 * dtype.bytes()).unwrap();
        for parts in [0, 5] {
            let e = blas
                .gemm_split_k(&mut cmd, g, parts, &ha, &hb, &hp)
                .unwrap_err();
            assert!(
                matches!(
                    e,
                    ServerError::Validation(Validation::LibrarySplit { k: 48, .. })
                ),
                "{e}"
            );
        }
        let e = blas
            .gemm_split_k(&mut cmd, g, 6, &ha, &hb, &hp)
            .unwrap_err();
        assert!(e.to_string().contains("C (every product)"), "{e}");
        let mut t = g;
        t.trans_a = true;
        t.lda = 48;
        let e = blas
            .gemm_split_k(&mut cmd, t, 4, &ha, &hb, &hp)
            .unwrap_err();
        assert!(
            matches!(
                e,
                ServerError::Validation(Validation::LibraryUnsupported { .. })
            ),
            "{e}"
        );
    }
}

#[test]
fn cublas_on_stream_1_is_ordered_after_an_upload_on_stream_0() {
    let test = "cublas_on_stream_1_is_ordered_after_an_upload_on_stream_0";
    let Some((shim, blas)) = blas(test) else {
        return;
    };
    let Some(module) = compile(&shim, common::SPIN, &[], test) else {
        return;
    };
    let spin = module.kernel_with_sizes("spin", &[8, 8]).unwrap();
    let mut rng = Rng::seeded(test);
    let g = Gemm::packed(GemmType::F32, 96, 80, 112);
    let (a_old, b, _) = operands(&g, &mut rng);
    let (a_new, _, c) = operands(&g, &mut rng);
    let mut dev = Device::new(shim, DeviceConfig::default());
    // Set up stream 1's handle and workspace first, so nothing below waits on the host.
    blas.prepare(&mut dev.command(S1).unwrap()).unwrap();
    let ha = dev
        .command(S0)
        .unwrap()
        .create(&encode(g.dtype, &a_old))
        .unwrap();
    let hb = dev
        .command(S1)
        .unwrap()
        .create(&encode(g.dtype, &b))
        .unwrap();
    let hc = dev
        .command(S1)
        .unwrap()
        .create(&encode(g.dtype, &c))
        .unwrap();
    // A first GEMM of the same shape on the old A: cuBLAS loads its kernel now, not below.
    blas.gemm(&mut dev.command(S1).unwrap(), g, &ha, &hb, &hc)
        .unwrap();
    let out = decode(g.dtype, &read(&mut dev, S1, &hc).unwrap());
    let err = relative_error(&g, &out, &reference(&g, &a_old, &b, &c));
    assert!(err < tolerance(g.dtype), "the warm-up GEMM: {err:e}");
    dev.command(S0).unwrap().sync().unwrap().wait().unwrap();
    let hc = dev
        .command(S1)
        .unwrap()
        .create(&encode(g.dtype, &c))
        .unwrap();
    dev.command(S1).unwrap().sync().unwrap().wait().unwrap();
    // Stream 0: 500 ms of spinning, then the upload of A's new values behind it.
    let scratch = dev.command(S0).unwrap().empty(256).unwrap();
    let ns = 500_000_000u64.to_ne_bytes();
    dev.command(S0)
        .unwrap()
        .launch(devcmd::Launch {
            kernel: &spin,
            dims: LaunchDims::SINGLE,
            inputs: &[],
            outputs: &[&scratch],
            params: &[KernelParam::Buffer(0), KernelParam::Scalar(&ns)],
        })
        .unwrap();
    dev.command(S0)
        .unwrap()
        .write_from(&ha, &encode(g.dtype, &a_new))
        .unwrap();
    // Stream 1: the GEMM reads A at once (no host wait in between): only the core's
    // cross-stream order keeps it from reading A's old values.
    let started = std::time::Instant::now();
    blas.gemm(&mut dev.command(S1).unwrap(), g, &ha, &hb, &hc)
        .unwrap();
    let enqueued = started.elapsed();
    assert!(
        enqueued.as_millis() < 400,
        "the GEMM's enqueue waited on the host ({enqueued:?}): the order must be the device's"
    );
    let out = decode(g.dtype, &read(&mut dev, S1, &hc).unwrap());
    let want = reference(&g, &a_new, &b, &c);
    let err = relative_error(&g, &out, &want);
    let stale = relative_error(&g, &out, &reference(&g, &a_old, &b, &c));
    say(&format!(
        "{test}: error against the new A {err:.3e}, against the old A {stale:.3e}"
    ));
    assert!(
        err < tolerance(g.dtype),
        "the GEMM on stream 1 did not see stream 0's upload: error {err:e} against the new A, \
         {stale:e} against the old one"
    );
}

#[test]
fn a_cublas_call_recorded_in_a_graph_replays_with_new_inputs() {
    let test = "a_cublas_call_recorded_in_a_graph_replays_with_new_inputs";
    let Some((shim, blas)) = blas(test) else {
        return;
    };
    let mut rng = Rng::seeded(test);
    let mut dev = Device::new(shim.clone(), DeviceConfig::default());
    for dtype in [GemmType::F32, GemmType::F16] {
        let mut g = Gemm::packed(dtype, 72, 40, 56);
        (g.trans_a, g.lda, g.alpha) = (true, 56, 0.75);
        let (a, b, c) = operands(&g, &mut rng);
        let mut cmd = dev.command(S0).unwrap();
        let ha = cmd.create(&encode(dtype, &a)).unwrap();
        let hb = cmd.create(&encode(dtype, &b)).unwrap();
        let hc = cmd.create(&encode(dtype, &c)).unwrap();
        // The first call on a stream is refused while it records (its set-up allocates), and
        // the recording goes on.
        if dtype == GemmType::F32 {
            let recording = dev.command(S0).unwrap().begin_capture("early").unwrap();
            let early = blas.gemm(&mut dev.command(S0).unwrap(), g, &ha, &hb, &hc);
            assert!(
                matches!(
                    early,
                    Err(ServerError::Validation(Validation::Recording { .. }))
                ),
                "the first cuBLAS call on a recording stream must be refused, got {early:?}"
            );
            say(&format!("{test}: refused as asked: {}", early.unwrap_err()));
            // An empty recording: whatever its end answers, the stream records no more.
            drop(dev.command(S0).unwrap().end_capture(recording));
            assert!(!shim.is_any_stream_capturing());
            blas.prepare(&mut dev.command(S0).unwrap()).unwrap();
        }
        let recording = dev.command(S0).unwrap().begin_capture("gemm").unwrap();
        assert!(shim.is_any_stream_capturing());
        blas.gemm(&mut dev.command(S0).unwrap(), g, &ha, &hb, &hc)
            .unwrap();
        let graph = dev.command(S0).unwrap().end_capture(recording).unwrap();
        assert!(!shim.is_any_stream_capturing());
        for (round, stream) in [(0, S0), (1, S1), (2, S0)] {
            let (a, b, _) = operands(&g, &mut rng);
            let mut cmd = dev.command(S0).unwrap();
            cmd.write_from(&ha, &encode(dtype, &a)).unwrap();
            cmd.write_from(&hb, &encode(dtype, &b)).unwrap();
            // Poisoned again, so a replay that wrote nothing fails.
            cmd.write_from(&hc, &encode(dtype, &c)).unwrap();
            dev.command(stream).unwrap().replay(&graph).unwrap();
            let out = decode(dtype, &read(&mut dev, S0, &hc).unwrap());
            let err = relative_error(&g, &out, &reference(&g, &a, &b, &c));
            say(&format!(
                "{test}: {dtype:?} replay {round} on stream {}: relative error {err:.3e}",
                stream.0
            ));
            assert!(
                err < tolerance(dtype),
                "{dtype:?} replay {round} on stream {}: relative error {err:e}",
                stream.0
            );
        }
    }
}

#[test]
fn a_cublas_error_fails_the_written_ranges_with_its_status_name() {
    let test = "a_cublas_error_fails_the_written_ranges_with_its_status_name";
    let Some((shim, blas)) = blas(test) else {
        return;
    };
    let mut rng = Rng::seeded(test);
    let g = Gemm::packed(GemmType::F32, 32, 32, 32);
    let (a, b, c) = operands(&g, &mut rng);
    let mut dev = Device::new(shim, DeviceConfig::default());
    let mut cmd = dev.command(S0).unwrap();
    let ha = cmd.create(&encode(g.dtype, &a)).unwrap();
    let hb = cmd.create(&encode(g.dtype, &b)).unwrap();
    let hc = cmd.create(&encode(g.dtype, &c)).unwrap();
    let hd = cmd.create(&encode(g.dtype, &c)).unwrap();
    // A shape the handles cannot hold is refused before cuBLAS sees it, nothing marked.
    let short = Gemm::packed(GemmType::F32, 33, 32, 32);
    let refused = blas.gemm(&mut cmd, short, &ha, &hb, &hc);
    assert!(
        matches!(
            refused,
            Err(ServerError::Validation(Validation::LibraryOperand { .. }))
        ),
        "{refused:?}"
    );
    say(&format!("{test}: {}", refused.unwrap_err()));
    // cuBLAS itself refuses lda = 0 (CUBLAS_STATUS_INVALID_VALUE), enqueuing nothing.
    // SAFETY: the call passes the handle's stream and the three declared ranges only.
    let failed = unsafe {
        blas.call(
            &mut cmd,
            "sgemm_bad_lda",
            &[&ha, &hb],
            &[],
            &[&hc],
            |h, s| {
                let (alpha, beta) = (1.0f32, 0.0f32);
                let n = cublas_sys::cublasOperation_t::CUBLAS_OP_N;
                cublas_sys::cublasSgemm_v2(
                    h,
                    n,
                    n,
                    32,
                    32,
                    32,
                    &alpha,
                    s[0].addr.0 as *const f32,
                    0,
                    s[1].addr.0 as *const f32,
                    32,
                    &beta,
                    s[2].addr.0 as *mut f32,
                    32,
                )
            },
        )
    };
    match &failed {
        Err(ServerError::Launch(LaunchError::Library { work, error })) => {
            assert_eq!(*work, "sgemm_bad_lda");
            assert_eq!(error.code, 7, "{error}");
            assert!(
                error.message.starts_with("CUBLAS_STATUS_INVALID_VALUE"),
                "{error}"
            );
        }
        other => panic!("cuBLAS's refusal must be LaunchError::Library, got {other:?}"),
    }
    say(&format!("{test}: {}", failed.unwrap_err()));
    // A GEMM reading the failed C is skipped, and its output carries the failure.
    let skipped = blas.gemm(&mut cmd, g, &hc, &hb, &hd);
    assert!(
        matches!(skipped, Err(ServerError::Skipped { .. })),
        "{skipped:?}"
    );
    for (name, h) in [("C", &hc), ("D", &hd)] {
        match read(&mut dev, S0, h) {
            Err(ServerError::Unwritten { root, chain, .. }) => {
                say(&format!(
                    "{test}: reading {name}: root {root}; chain {chain:?}"
                ));
                assert!(
                    root.to_string().contains("CUBLAS_STATUS_INVALID_VALUE"),
                    "{name}: the root keeps cuBLAS's status name: {root}"
                );
            }
            other => panic!("{name} must be unwritten, got {other:?}"),
        }
    }
    // A good GEMM into C clears it, and everything works on.
    blas.gemm(&mut dev.command(S0).unwrap(), g, &ha, &hb, &hc)
        .unwrap();
    let out = decode(g.dtype, &read(&mut dev, S0, &hc).unwrap());
    let err = relative_error(&g, &out, &reference(&g, &a, &b, &c));
    assert!(err < tolerance(g.dtype), "after the failure: {err:e}");
    // Bytes a product skips keep the failure D carries: with ldc = 32 a 16-row product leaves
    // rows 16.. of every column unwritten, so D is an update and the GEMM is skipped.
    let half = Gemm {
        lda: 32,
        ldc: 32,
        ..Gemm::packed(GemmType::F32, 16, 32, 32)
    };
    let mut cmd = dev.command(S0).unwrap();
    let skipped = blas.gemm(&mut cmd, half, &ha, &hb, &hd);
    assert!(
        matches!(skipped, Err(ServerError::Skipped { .. })),
        "{skipped:?}"
    );
    // A packed 16 × 16 product writes D's first 1 KiB only: that loses the failure, the rest
    // keeps it.
    let small = Gemm {
        lda: 32,
        ..Gemm::packed(GemmType::F32, 16, 16, 32)
    };
    blas.gemm(&mut cmd, small, &ha, &hb, &hd).unwrap();
    assert!(read(&mut dev, S0, &hd.view(0, 1024).unwrap()).is_ok());
    match read(&mut dev, S0, &hd.view(1024, 3072).unwrap()) {
        Err(ServerError::Unwritten { root, .. }) => say(&format!(
            "{test}: D past the product keeps its failure: {root}"
        )),
        other => panic!("D past the product must stay unwritten, got {other:?}"),
    }
}

/// A raw stream of the shim's context, created the way a runtime (TensorRT, PyTorch) does.
fn raw_stream(shim: &CudaShim) -> sys::CUstream {
    let mut s = std::ptr::null_mut();
    // SAFETY: the shim's primary context is alive; the pointer is valid for one write.
    unsafe {
        assert_eq!(
            sys::cuCtxSetCurrent(shim.cu_context()),
            sys::CUresult::CUDA_SUCCESS
        );
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        assert_eq!(
            sys::cuStreamCreate(&mut s, flags),
            sys::CUresult::CUDA_SUCCESS
        );
    }
    s
}

/// The stream still takes work (a memset of a page of its own) and runs it.
fn still_usable(shim: &CudaShim, s: sys::CUstream, what: &str) {
    let page = shim.device_alloc(4096).unwrap();
    let addr = shim.device_page_addr(&page).0;
    // SAFETY: the stream is alive (the test destroys it only at its end); the page is live.
    unsafe {
        assert_eq!(
            sys::cuCtxSetCurrent(shim.cu_context()),
            sys::CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            sys::cuStreamQuery(s),
            sys::CUresult::CUDA_SUCCESS,
            "{what}: cuStreamQuery"
        );
        assert_eq!(
            sys::cuMemsetD8Async(addr, 0x5A, 4096, s),
            sys::CUresult::CUDA_SUCCESS,
            "{what}: a memset on the stream"
        );
        assert_eq!(
            sys::cuStreamSynchronize(s),
            sys::CUresult::CUDA_SUCCESS,
            "{what}: cuStreamSynchronize"
        );
        shim.device_free(page);
    }
}

#[test]
fn a_borrowed_stream_runs_devcmd_work_and_outlives_the_device() {
    let test = "a_borrowed_stream_runs_devcmd_work_and_outlives_the_device";
    let Some((shim, blas)) = blas(test) else {
        return;
    };
    let raw = raw_stream(&shim);
    // The shim alone: borrowed, dropped, still the caller's.
    // SAFETY: `raw` is a live stream of the shim's context, destroyed only at the end.
    let borrowed = unsafe { shim.borrow_stream(&raw) }.unwrap();
    assert!(borrowed.is_borrowed());
    assert_eq!(*shim.native_stream(&borrowed), raw);
    drop(borrowed);
    still_usable(&shim, raw, "after the shim's stream was dropped");
    // The per-thread default stream is refused (it is another stream on every thread).
    // SAFETY: refused before the driver sees it.
    let per_thread = unsafe { shim.borrow_stream(&(2usize as sys::CUstream)) };
    assert_eq!(
        per_thread.unwrap_err().status,
        devcmd_cuda::status::BAD_ARGUMENT
    );
    // A stream its owner is recording into a graph is refused (devcmd's fences would join it).
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: `raw` is live and idle; the capture is ended just below.
    unsafe {
        assert_eq!(
            sys::cuStreamBeginCapture_v2(raw, mode),
            sys::CUresult::CUDA_SUCCESS
        );
    }
    // SAFETY: as above.
    let capturing = unsafe { shim.borrow_stream(&raw) };
    let mut graph = std::ptr::null_mut();
    // SAFETY: the capture begun above, on this thread; the graph (empty) is destroyed at once.
    unsafe {
        assert_eq!(
            sys::cuStreamEndCapture(raw, &mut graph),
            sys::CUresult::CUDA_SUCCESS
        );
        sys::cuGraphDestroy(graph);
    }
    assert_eq!(
        capturing.unwrap_err().status,
        devcmd_cuda::status::STREAM_CAPTURE_UNSUPPORTED
    );
    // A borrower that begins a recording and is dropped ends it: the owner's stream records no
    // more (in CUDA's global mode a capture left open would refuse every host wait).
    // SAFETY: as above.
    let borrowed = unsafe { shim.borrow_stream(&raw) }.unwrap();
    shim.begin_capture(&borrowed).unwrap();
    drop(borrowed);
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
    // SAFETY: `raw` is live; the pointer is valid for one write.
    unsafe {
        assert_eq!(
            sys::cuStreamIsCapturing(raw, &mut status),
            sys::CUresult::CUDA_SUCCESS
        );
    }
    assert_eq!(
        status,
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE,
        "the borrower's recording was left open on the owner's stream"
    );
    still_usable(&shim, raw, "after a borrower dropped mid-recording");

    // A device over it: uploads, a GEMM, a read, then the device and cuBLAS dropped.
    let mut rng = Rng::seeded(test);
    let g = Gemm::packed(GemmType::F32, 48, 40, 24);
    let (a, b, c) = operands(&g, &mut rng);
    let mut dev = Device::new(shim.clone(), DeviceConfig::default());
    // SAFETY: as above; the device is dropped before the stream is destroyed.
    unsafe { dev.borrow_stream(S1, &raw) }.unwrap();
    // SAFETY: as above.
    let again = unsafe { dev.borrow_stream(S1, &raw) };
    assert!(
        matches!(
            again,
            Err(ServerError::Validation(Validation::StreamInUse {
                stream: 1
            }))
        ),
        "{again:?}"
    );
    let mut cmd = dev.command(S1).unwrap();
    let ha = cmd.create(&encode(g.dtype, &a)).unwrap();
    let hb = cmd.create(&encode(g.dtype, &b)).unwrap();
    let hc = cmd.create(&encode(g.dtype, &c)).unwrap();
    let mut native = std::ptr::null_mut();
    // SAFETY: the closure only reads the handle it is given and enqueues nothing.
    unsafe {
        cmd.library(devcmd::LibraryWork::new("peek", &[], &[]), |s, _| {
            native = *s;
            Ok(())
        })
    }
    .unwrap();
    assert_eq!(native, raw, "library work on S1 gets the borrowed stream");
    blas.gemm(&mut cmd, g, &ha, &hb, &hc).unwrap();
    let out = decode(g.dtype, &read(&mut dev, S1, &hc).unwrap());
    let err = relative_error(&g, &out, &reference(&g, &a, &b, &c));
    assert!(
        err < tolerance(g.dtype),
        "GEMM on the borrowed stream: {err:e}"
    );
    drop((ha, hb, hc));
    drop(dev);
    drop(blas);
    still_usable(&shim, raw, "after the device and cuBLAS were dropped");
    // SAFETY: the stream is the test's, nothing uses it any more.
    let destroyed = unsafe { sys::cuStreamDestroy_v2(raw) };
    assert_eq!(
        destroyed,
        sys::CUresult::CUDA_SUCCESS,
        "the owner destroys it"
    );
}
