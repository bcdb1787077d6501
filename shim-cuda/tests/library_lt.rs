//! cuBLASLt's GELU-and-bias epilogue through [`Cublas::gemm_bias_gelu`] on a GPU: checked
//! against a CPU reference in f64 (operands at unaligned offsets and `beta != 0` included),
//! refused before anything runs when its bias is short or unaligned, and recorded into a graph
//! (its first call of a shape included) that keeps its own bias and replays with new inputs.
//! They run where a CUDA driver, a device, cuBLAS and cuBLASLt are present and print a visible
//! `skipped: ...` line (straight to stderr) and pass elsewhere.

mod common;

use common::blas::{Rng, blas, decode, encode, operands, read, relative_error};
use common::say;
use devcmd::{
    Device, DeviceConfig, Gemm, GemmType, Handle, LaunchError, ServerError, StreamId, Validation,
};
use devcmd_cuda::{Cublas, CudaShim, LT_SETUP};

const S0: StreamId = StreamId(0);

/// The device, cuBLAS and cuBLASLt, or `None` after printing why `test` is skipped.
fn lt(test: &str) -> Option<(CudaShim, Cublas)> {
    let (shim, blas) = blas(test)?;
    if let Err(why) = blas.lt() {
        say(&format!("skipped: no cuBLASLt ({test}): {why}"));
        return None;
    }
    Some((shim, blas))
}

/// GPT-2's tanh GELU in f64.
fn gelu(v: f64) -> f64 {
    0.5 * v * (1.0 + (0.797_884_560_802_865_4 * (v + 0.044_715 * v * v * v)).tanh())
}

/// `gelu(alpha op(A) op(B) + beta C + bias)` in f64 at C's stored places.
fn reference(g: &Gemm, a: &[f32], b: &[f32], bias: &[f32], c: &[f32]) -> Vec<f64> {
    let mut out = common::blas::reference(g, a, b, c);
    for j in 0..g.n {
        for i in 0..g.m {
            let idx = (i + j * g.ldc) as usize;
            out[idx] = gelu(out[idx] + f64::from(bias[i as usize]));
        }
    }
    out
}

/// f32: the epilogue's GELU is cuBLASLt's own (an approximation of tanh); f16: the output's
/// rounding.
fn tolerance(dtype: GemmType) -> f64 {
    match dtype {
        GemmType::F32 => 1e-4,
        GemmType::F16 => 3e-3,
    }
}

/// Decoding shapes (one column, a few), odd sizes, A transposed with a padded `lda`, alpha.
fn shapes(dtype: GemmType) -> Vec<Gemm> {
    let mut t = Gemm::packed(dtype, 40, 3, 51);
    (t.trans_a, t.lda, t.alpha) = (true, 51 + 3, 0.5);
    let mut u = Gemm::packed(dtype, 48, 2, 32);
    u.beta = 0.75;
    vec![
        Gemm::packed(dtype, 96, 1, 64),
        Gemm::packed(dtype, 67, 5, 33),
        Gemm::packed(dtype, 256, 8, 128),
        t,
        u,
    ]
}

/// `bytes` in a new allocation, seen through a view that starts `skip` bytes in (an operand
/// that does not start on the allocation's 256-byte boundary).
fn placed(cmd: &mut devcmd::Command<'_, CudaShim>, bytes: &[u8], skip: u64) -> Handle {
    let mut all = vec![0u8; skip as usize];
    all.extend_from_slice(bytes);
    let h = cmd.create(&all).unwrap();
    h.view(skip, bytes.len() as u64).unwrap()
}

#[test]
fn gelu_and_bias_in_the_epilogue_match_a_cpu_reference() {
    let test = "gelu_and_bias_in_the_epilogue_match_a_cpu_reference";
    let Some((shim, blas)) = lt(test) else {
        return;
    };
    let mut rng = Rng::seeded(test);
    let mut dev = Device::new(shim, DeviceConfig::default());
    for dtype in [GemmType::F32, GemmType::F16] {
        // A, B and C where allocations start, then one element past a 16-byte boundary (the
        // plan then asks cuBLASLt for algorithms of that alignment).
        let element = dtype.bytes();
        for (g, skip) in shapes(dtype)
            .into_iter()
            .map(|g| (g, 0))
            .chain(shapes(dtype).into_iter().take(2).map(|g| (g, 16 + element)))
        {
            let (a, b, c) = operands(&g, &mut rng);
            let bias = rng.values(dtype, g.m as usize);
            let mut cmd = dev.command(S0).unwrap();
            let ha = placed(&mut cmd, &encode(dtype, &a), skip);
            let hb = placed(&mut cmd, &encode(dtype, &b), skip);
            let hbias = cmd.create(&encode(dtype, &bias)).unwrap();
            let hc = placed(&mut cmd, &encode(dtype, &c), skip);
            blas.gemm_bias_gelu(&mut cmd, g, &ha, &hb, &hbias, &hc)
                .unwrap();
            let out = decode(dtype, &read(&mut dev, S0, &hc).unwrap());
            let err = relative_error(&g, &out, &reference(&g, &a, &b, &bias, &c));
            say(&format!(
                "{test}: {g:?} at {skip} bytes in: relative error {err:.3e}"
            ));
            assert!(err < tolerance(dtype), "{g:?}: relative error {err:e}");
        }
    }
}

#[test]
fn a_short_or_unaligned_bias_is_refused_before_anything_runs() {
    let test = "a_short_or_unaligned_bias_is_refused_before_anything_runs";
    let Some((shim, blas)) = lt(test) else {
        return;
    };
    let mut dev = Device::new(shim, DeviceConfig::default());
    let g = Gemm::packed(GemmType::F32, 32, 2, 16);
    let mut cmd = dev.command(S0).unwrap();
    let ha = cmd.create(&[0u8; 32 * 16 * 4]).unwrap();
    let hb = cmd.create(&[0u8; 16 * 2 * 4]).unwrap();
    let hc = cmd.create(&[7u8; 32 * 2 * 4]).unwrap();
    let short = cmd.create(&[0u8; 31 * 4]).unwrap();
    let e = blas
        .gemm_bias_gelu(&mut cmd, g, &ha, &hb, &short, &hc)
        .unwrap_err();
    say(&format!("{test}: {e}"));
    assert!(
        matches!(
            e,
            ServerError::Validation(Validation::LibraryOperand {
                operand: "bias",
                needs: 128,
                found: 124,
                ..
            })
        ),
        "{e:?}"
    );
    // Eight bytes past a 16-byte boundary: the epilogue reads the bias 16 bytes at a time.
    let wide = cmd.create(&[0u8; 40 * 4]).unwrap();
    let unaligned = wide.view(8, 32 * 4).unwrap();
    let e = blas
        .gemm_bias_gelu(&mut cmd, g, &ha, &hb, &unaligned, &hc)
        .unwrap_err();
    say(&format!("{test}: {e}"));
    assert!(
        matches!(
            &e,
            ServerError::Launch(LaunchError::Library { work, error })
                if *work == LT_SETUP && error.message.contains("16-byte boundary")
        ),
        "{e:?}"
    );
    // Nothing ran: C keeps its bytes and carries no failure.
    assert_eq!(read(&mut dev, S0, &hc).unwrap(), vec![7u8; 32 * 2 * 4]);
}

#[test]
fn the_epilogue_recorded_in_a_graph_replays_with_new_inputs() {
    let test = "the_epilogue_recorded_in_a_graph_replays_with_new_inputs";
    let Some((shim, blas)) = lt(test) else {
        return;
    };
    let mut rng = Rng::seeded(test);
    let mut dev = Device::new(shim.clone(), DeviceConfig::default());
    blas.prepare(&mut dev.command(S0).unwrap()).unwrap();
    let dtype = GemmType::F16;
    // A shape no call made before: its plan is made while the stream records.
    let g = Gemm::packed(dtype, 136, 1, 72);
    let (a, b, c) = operands(&g, &mut rng);
    let bias = rng.values(dtype, g.m as usize);
    let mut cmd = dev.command(S0).unwrap();
    let ha = cmd.create(&encode(dtype, &a)).unwrap();
    let hb = cmd.create(&encode(dtype, &b)).unwrap();
    let hbias = cmd.create(&encode(dtype, &bias)).unwrap();
    let hc = cmd.create(&encode(dtype, &c)).unwrap();
    let recording = dev.command(S0).unwrap().begin_capture("fused").unwrap();
    blas.gemm_bias_gelu(&mut dev.command(S0).unwrap(), g, &ha, &hb, &hbias, &hc)
        .unwrap();
    let graph = dev.command(S0).unwrap().end_capture(recording).unwrap();
    assert!(!shim.is_any_stream_capturing());
    // An eager call of the same shape with another bias sets the plan's bias pointer anew: the
    // graph keeps the one it was recorded with.
    let other_bias = rng.values(dtype, g.m as usize);
    let mut cmd = dev.command(S0).unwrap();
    let hother = cmd.create(&encode(dtype, &other_bias)).unwrap();
    blas.gemm_bias_gelu(&mut cmd, g, &ha, &hb, &hother, &hc)
        .unwrap();
    let out = decode(dtype, &read(&mut dev, S0, &hc).unwrap());
    let err = relative_error(&g, &out, &reference(&g, &a, &b, &other_bias, &c));
    assert!(err < tolerance(dtype), "eager call: relative error {err:e}");
    for round in 0..2 {
        let (a, b, _) = operands(&g, &mut rng);
        let mut cmd = dev.command(S0).unwrap();
        cmd.write_from(&ha, &encode(dtype, &a)).unwrap();
        cmd.write_from(&hb, &encode(dtype, &b)).unwrap();
        cmd.write_from(&hc, &encode(dtype, &c)).unwrap();
        cmd.replay(&graph).unwrap();
        let out = decode(dtype, &read(&mut dev, S0, &hc).unwrap());
        let err = relative_error(&g, &out, &reference(&g, &a, &b, &bias, &c));
        say(&format!("{test}: replay {round}: relative error {err:.3e}"));
        assert!(
            err < tolerance(dtype),
            "replay {round}: relative error {err:e}"
        );
    }
}
