//! cuBLASLt's GELU-and-bias epilogue through [`Cublas::gemm_bias_gelu`] on a GPU: checked
//! against a CPU reference in f64, refused before anything runs when its operands are wrong,
//! and recorded into a graph (its first call of a shape included) and replayed with new inputs.
//! They run where a CUDA driver, a device, cuBLAS and cuBLASLt are present and print a visible
//! `skipped: ...` line (straight to stderr) and pass elsewhere.

mod common;

use common::blas::{Rng, blas, decode, encode, operands, read, relative_error};
use common::say;
use devcmd::{Device, DeviceConfig, Gemm, GemmType, ServerError, StreamId, Validation};
use devcmd_cuda::{Cublas, CudaShim};

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

/// `gelu(alpha op(A) op(B) + bias)` in f64 at C's stored places.
fn reference(g: &Gemm, a: &[f32], b: &[f32], bias: &[f32], c: &[f32]) -> Vec<f64> {
    let plain = Gemm { beta: 0.0, ..*g };
    let mut out = common::blas::reference(&plain, a, b, c);
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
    vec![
        Gemm::packed(dtype, 96, 1, 64),
        Gemm::packed(dtype, 67, 5, 33),
        Gemm::packed(dtype, 256, 8, 128),
        t,
    ]
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
        for g in shapes(dtype) {
            let (a, b, c) = operands(&g, &mut rng);
            let bias = rng.values(dtype, g.m as usize);
            let mut cmd = dev.command(S0).unwrap();
            let ha = cmd.create(&encode(dtype, &a)).unwrap();
            let hb = cmd.create(&encode(dtype, &b)).unwrap();
            let hbias = cmd.create(&encode(dtype, &bias)).unwrap();
            let hc = cmd.create(&encode(dtype, &c)).unwrap();
            blas.gemm_bias_gelu(&mut cmd, g, &ha, &hb, &hbias, &hc)
                .unwrap();
            let out = decode(dtype, &read(&mut dev, S0, &hc).unwrap());
            let err = relative_error(&g, &out, &reference(&g, &a, &b, &bias, &c));
            say(&format!("{test}: {g:?}: relative error {err:.3e}"));
            assert!(err < tolerance(dtype), "{g:?}: relative error {err:e}");
        }
    }
}

#[test]
fn a_short_bias_or_a_beta_is_refused_before_anything_runs() {
    let test = "a_short_bias_or_a_beta_is_refused_before_anything_runs";
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
    let bias = cmd.create(&[0u8; 32 * 4]).unwrap();
    let beta = Gemm { beta: 0.5, ..g };
    let e = blas
        .gemm_bias_gelu(&mut cmd, beta, &ha, &hb, &bias, &hc)
        .unwrap_err();
    assert!(
        matches!(
            e,
            ServerError::Validation(Validation::LibraryOperand {
                operand: "beta",
                ..
            })
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
