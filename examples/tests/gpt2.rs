//! The GPT-2 decoding host as a user runs it: the tiny fixture (transformers' weights and
//! logits, `examples/fixtures/gpt2-tiny`) decoded on the std shim eagerly and with graphs, with
//! the KV cache held ahead and grown, and checked (tokens identical, logits within 1e-3); a fixture whose reference was changed fails
//! naming the step, row and position; bad prompts are refused; the GPU path without a driver
//! says so.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn gpt2<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    Command::new(env!("CARGO_BIN_EXE_gpt2"))
        .args(args)
        .output()
        .expect("run the gpt2 host")
}

fn outcome(o: &Output) -> (Option<i32>, String, String) {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (o.status.code(), text(&o.stdout), text(&o.stderr))
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/gpt2-tiny")
}

/// The output projections cut along k (`GPT2_SPLIT_K`, as cuBLAS runs them on the GPU; here one
/// GEMM per part) decode the fixture as transformers does, eagerly and with graphs.
#[test]
fn split_projections_decode_the_fixture_as_transformers_does() {
    for mode in [&[][..], &["--graph"]] {
        let mut args: Vec<OsString> = vec!["--check".into(), fixture().into()];
        args.extend(mode.iter().map(OsString::from));
        let out = Command::new(env!("CARGO_BIN_EXE_gpt2"))
            .args(&args)
            .env("GPT2_SPLIT_K", "4")
            .output()
            .expect("run the gpt2 host");
        let (code, stdout, stderr) = outcome(&out);
        assert_eq!(code, Some(0), "{mode:?}: {stdout}{stderr}");
        assert!(
            stdout.contains("k cut into 4 (attention) and 4 (MLP) parts"),
            "{stdout}"
        );
        assert!(
            stdout.contains("greedy tokens identical, max abs logit difference"),
            "{mode:?}: {stdout}"
        );
        assert!(stdout.contains("row 0: 47 211 38 53 204 116 152 249 | 43 43 43 43 43 43 43 43"));
    }
}

/// A copy of the fixture in a fresh directory, for a test to change.
fn copy_of_fixture(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("gpt2-{test}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    for entry in std::fs::read_dir(fixture()).expect("the fixture") {
        let path = entry.expect("an entry").path();
        std::fs::copy(&path, dir.join(path.file_name().expect("a name"))).expect("copy");
    }
    dir
}

#[test]
fn the_tiny_fixture_decodes_as_transformers_does_eagerly_and_with_graphs() {
    let dir = fixture();
    for mode in [
        &[][..],
        &["--graph"],
        &["--graph", "--lazy"],
        &["--kv", "grow"],
        &["--kv", "grow", "--graph"],
        &["--graph-update"],
        &["--graph-update", "--kv", "grow"],
    ] {
        let mut args: Vec<OsString> = vec!["--check".into(), dir.clone().into()];
        args.extend(mode.iter().map(OsString::from));
        let (code, stdout, stderr) = outcome(&gpt2(&args));
        assert_eq!(code, Some(0), "{mode:?}: {stdout}{stderr}");
        assert!(
            stdout.contains("greedy tokens identical, max abs logit difference"),
            "{mode:?}: {stdout}"
        );
        // transformers' greedy tokens (reference.json's tokens_fp32).
        assert!(stdout.contains("row 0: 47 211 38 53 204 116 152 249 | 43 43 43 43 43 43 43 43"));
        assert!(stdout.contains("row 1: 143 177 23 233 154 30 171 158 | 80 80 80 80 80 80 80 197"));
        let graph = mode.contains(&"--graph");
        assert_eq!(stdout.contains("recorded once"), graph, "{stdout}");
        assert_eq!(
            stdout.contains("graph updated in place before every replay after the first"),
            mode.contains(&"--graph-update"),
            "{stdout}"
        );
        assert!(stdout.contains("tokens/s"), "{stdout}");
        assert!(
            stdout.contains("memory report after the last step"),
            "{stdout}"
        );
        // The prompt (8) rounded up to 8 positions, doubled once to the run's 15.
        let grown = mode.contains(&"grow");
        assert_eq!(
            stdout.contains("grew 1 time from the prompt"),
            grown,
            "{stdout}"
        );
    }
}

/// Adds `delta` to the fp32 reference logit of `token` at `step` and `row` (2 rows of 256).
fn nudge(dir: &Path, step: usize, row: usize, token: usize, delta: f32) {
    let path = dir.join("logits-fp32.raw");
    let mut raw = std::fs::read(&path).expect("read the logits");
    let at = ((step * 2 + row) * 256 + token) * 4;
    let v = f32::from_le_bytes(raw[at..at + 4].try_into().expect("4 bytes")) + delta;
    raw[at..at + 4].copy_from_slice(&v.to_le_bytes());
    std::fs::write(&path, raw).expect("write the logits");
}

#[test]
fn a_reference_the_run_misses_fails_naming_step_row_and_position() {
    let dir = copy_of_fixture("nudged");
    nudge(&dir, 3, 1, 5, 5e-4);
    let (code, stdout, stderr) = outcome(&gpt2(["--check".as_ref(), dir.as_os_str()]));
    assert_eq!(code, Some(0), "within 1e-3 passes: {stdout}{stderr}");
    nudge(&dir, 3, 1, 5, 1e-3);
    for graph in [false, true] {
        let mut args: Vec<OsString> = vec!["--check".into(), dir.clone().into()];
        if graph {
            args.push("--graph".into());
        }
        let (code, _, stderr) = outcome(&gpt2(&args));
        assert_eq!(code, Some(1), "{stderr}");
        assert!(
            stderr.contains("failed: step 3, row 1 (position 10): logit of token 5 is "),
            "{stderr}"
        );
    }
    // A greedy token that differs: transformers' row 1 ends in 197.
    let dir = copy_of_fixture("token");
    let reference = dir.join("reference.json");
    let text = std::fs::read_to_string(&reference).expect("read");
    std::fs::write(&reference, text.replace("197", "196")).expect("write");
    let (code, _, stderr) = outcome(&gpt2(["--check".as_ref(), dir.as_os_str()]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("step 7, row 1 (position 14): greedy token 197, transformers chose 196"),
        "{stderr}"
    );
}

#[test]
fn a_prompt_decodes_in_a_batch_and_bad_prompts_are_refused() {
    let dir = fixture();
    let model = dir.as_os_str();
    let json = copy_of_fixture("json").join("summary.json");
    let (code, stdout, stderr) = outcome(&gpt2([
        "--model".as_ref(),
        model,
        "--prompt".as_ref(),
        "1 2 3".as_ref(),
        "--batch".as_ref(),
        "3".as_ref(),
        "--new-tokens".as_ref(),
        "4".as_ref(),
        "--graph".as_ref(),
        "--json".as_ref(),
        json.as_os_str(),
    ]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("--json wrote")).expect("JSON");
    assert_eq!(summary["batch"], 3);
    assert_eq!(summary["graph"], true);
    assert_eq!(summary["graph_update"], false);
    // The std shim's GEMMs keep no workspace on the device.
    assert_eq!(summary["library_scratch_bytes"], 0);
    assert_eq!(summary["step_us"]["steps"], 3);
    assert_eq!(summary["tokens"].as_array().map(Vec::len), Some(3));
    let (held, live) = (&summary["held_peak_bytes"], &summary["live_bytes"]);
    assert!(
        held.as_u64() >= live.as_u64() && live.as_u64() > Some(484_936),
        "{summary}"
    );
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("row ")).collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    let generated: Vec<&str> = rows
        .iter()
        .map(|r| r.split(" | ").nth(1).unwrap_or(""))
        .collect();
    assert!(
        generated
            .iter()
            .all(|g| g.split(' ').count() == 4 && *g == generated[0])
    );

    for (prompt, says) in [
        ("1 2; 3", "every row needs the same number"),
        ("1 256", "token 256 is outside the vocabulary (0 to 255)"),
        ("1 x", "--prompt: line 1: \"x\" is not a token id"),
    ] {
        let (code, _, stderr) = outcome(&gpt2([
            "--model".as_ref(),
            model,
            "--prompt".as_ref(),
            prompt.as_ref(),
        ]));
        assert_eq!(code, Some(2), "bad input: {prompt}: {stderr}");
        assert!(stderr.contains(says), "{prompt}: {stderr}");
        // Said once: no "caused by" that repeats the message.
        assert!(!stderr.contains("caused by"), "{prompt}: {stderr}");
    }
    let (code, _, stderr) = outcome(&gpt2([
        "--model".as_ref(),
        model,
        "--new-tokens".as_ref(),
        "65".as_ref(),
    ]));
    assert_eq!(code, Some(2), "bad input: {stderr}");
    assert!(
        stderr.contains(
            "need 65 positions, the model has 64 (n_positions): pass --new-tokens 64 or fewer"
        ),
        "{stderr}"
    );
    // A prompt longer than the model's positions, with the default new tokens: says so.
    let long = vec!["5"; 64].join(" ");
    let (code, _, stderr) = outcome(&gpt2([
        "--model".as_ref(),
        model,
        "--prompt".as_ref(),
        long.as_ref(),
    ]));
    assert_eq!(code, Some(2), "bad input: {stderr}");
    assert!(
        stderr.contains("a prompt of 64 tokens and 16 new tokens (the default) need 79 positions")
            && stderr.contains("pass --new-tokens 1 or fewer"),
        "{stderr}"
    );
    // An empty prompt file is named.
    let empty = copy_of_fixture("empty-prompt").join("empty.txt");
    std::fs::write(&empty, "\n").expect("write");
    let (code, _, stderr) = outcome(&gpt2([
        "--model".as_ref(),
        model,
        "--prompt-file".as_ref(),
        empty.as_os_str(),
    ]));
    assert_eq!(code, Some(2), "bad input: {stderr}");
    assert!(
        stderr.contains(&format!("the prompt file {}", empty.display())),
        "{stderr}"
    );
    // A --json path that cannot be written stops the run before anything is loaded.
    let (code, stdout, stderr) = outcome(&gpt2([
        "--model".as_ref(),
        model,
        "--json".as_ref(),
        "/no/such/dir/x.json".as_ref(),
    ]));
    assert_eq!(code, Some(2), "bad input: {stderr}");
    assert!(
        stderr.contains("cannot write --json /no/such/dir/x.json"),
        "{stderr}"
    );
    assert!(!stdout.contains("decode:"), "{stdout}");
    // A NaN among the weights: refused, naming the tensor and the element.
    let nan = copy_of_fixture("nan-weight");
    let mut bytes = std::fs::read(nan.join("model.safetensors")).expect("weights");
    let at = {
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
        let view = st
            .tensor("transformer.h.1.ln_2.weight")
            .or_else(|_| st.tensor("h.1.ln_2.weight"))
            .expect("the tensor");
        view.data().as_ptr().addr() - bytes.as_ptr().addr() + 3 * 4
    };
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(nan.join("model.safetensors"), &bytes).expect("write");
    let (code, _, stderr) = outcome(&gpt2(["--model".as_ref(), nan.as_os_str()]));
    assert_eq!(code, Some(2), "bad input: {stderr}");
    assert!(
        stderr.contains("a NaN or infinite value in h.1.ln_2.weight (element 3)"),
        "{stderr}"
    );
    // Tensors the model does not use (an older file's mask buffer): decoded, with a note that
    // they are uploaded too.
    let extra = copy_of_fixture("extra-tensor");
    let bytes = std::fs::read(extra.join("model.safetensors")).expect("weights");
    let mask = vec![0u8; 4 * 16];
    let with_mask = {
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
        let mut tensors = st.tensors();
        tensors.push((
            "transformer.h.0.attn.bias".to_owned(),
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![16], &mask)
                .expect("a view"),
        ));
        safetensors::serialize(tensors, None).expect("serialize")
    };
    std::fs::write(extra.join("model.safetensors"), with_mask).expect("write");
    let (code, stdout, stderr) = outcome(&gpt2([
        "--model".as_ref(),
        extra.as_os_str(),
        "--new-tokens".as_ref(),
        "2".as_ref(),
    ]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("holds 64 bytes of tensors the model does not use"),
        "{stdout}"
    );
    // A config of fewer layers than the file holds: the file's extra layer is named.
    let fewer = copy_of_fixture("fewer-layers");
    let config = std::fs::read_to_string(fewer.join("config.json")).expect("config");
    let mut json: serde_json::Value = serde_json::from_str(&config).expect("JSON");
    json["n_layer"] = 1.into();
    std::fs::write(fewer.join("config.json"), json.to_string()).expect("write");
    let (code, _, stderr) = outcome(&gpt2(["--model".as_ref(), fewer.as_os_str()]));
    assert_eq!(code, Some(2), "bad input: {stderr}");
    assert!(
        stderr.contains("a layer past the config's n_layer = 1"),
        "{stderr}"
    );
    let (code, _, stderr) = outcome(&gpt2(["--model", "/no/such/model"]));
    assert_eq!(code, Some(2), "bad input: {stderr}");
    assert!(
        stderr.contains("cannot read the model config /no/such/model/config.json"),
        "{stderr}"
    );
    // The OS error is in the message once, not again as a cause.
    assert!(!stderr.contains("caused by"), "{stderr}");
    // A run that fails after its --json file was checked leaves that file as it was.
    let bare = copy_of_fixture("no-weights");
    std::fs::remove_file(bare.join("model.safetensors")).expect("remove");
    let keep = bare.join("keep.json");
    std::fs::write(&keep, "{\"keep\": 1}").expect("write");
    let (code, _, stderr) = outcome(&gpt2([
        "--model".as_ref(),
        bare.as_os_str(),
        "--json".as_ref(),
        keep.as_os_str(),
    ]));
    assert_eq!(code, Some(2), "bad input: {stderr}");
    assert!(stderr.contains("model.safetensors"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&keep).expect("read"),
        "{\"keep\": 1}"
    );
}

#[test]
fn the_gpu_path_without_a_driver_says_so() {
    let dir = fixture();
    let (code, stdout, stderr) = outcome(&gpt2([
        "--check".as_ref(),
        dir.as_os_str(),
        "--device".as_ref(),
        "cuda".as_ref(),
    ]));
    if code == Some(0) {
        println!("skipped: a CUDA driver is here; the GPU runs check it ({stdout})");
        return;
    }
    assert_eq!(code, Some(3), "no device: {stderr}");
    assert!(
        stderr.contains("no CUDA driver found") || stderr.contains("NVRTC"),
        "{stderr}"
    );
}

/// Decodes the fixture's prompt on a fresh std device as `graph`, `update` (the step recorded
/// again before every replay) and `kv` say.
fn decode_fixture(
    (graph, update): (bool, bool),
    kv: devcmd_examples::gpt2::decode::KvCache,
) -> devcmd_examples::gpt2::decode::Decoded {
    use devcmd::{Device, DeviceConfig};
    use devcmd_examples::gpt2::{check, config, decode, devices, weights};
    use devcmd_examples::weights::Mapping;
    let dir = fixture();
    let f = check::load(&dir).expect("the fixture");
    let c = config::load(&dir.join("config.json")).expect("the config");
    let file =
        weights::load(&dir.join("model.safetensors"), &c, Mapping::ReadOnly).expect("the weights");
    let shim = devices::std_shim(false);
    let backend = devices::StdBackend::new(&shim);
    let mut device = Device::new(shim, DeviceConfig::default());
    let model = decode::upload(&mut device, &backend, file, &c, false).expect("upload");
    let plan = decode::Plan {
        prompt: f.prompt.clone(),
        new_tokens: f.new_tokens,
        graph,
        update_each_step: update,
        keep_logits: true,
        kv,
    };
    decode::decode(&mut device, &backend, &model, &plan).expect("decode")
}

#[test]
fn graphs_and_a_grown_cache_decode_bit_for_bit_as_eager() {
    use devcmd_examples::gpt2::decode::KvCache;
    let eager = decode_fixture((false, false), KvCache::Ahead);
    assert_eq!(eager.logits.len(), 8);
    for (graph, update, kv) in [
        (true, false, KvCache::Ahead),
        (false, false, KvCache::Grow),
        (true, false, KvCache::Grow),
        (true, true, KvCache::Ahead),
        (true, true, KvCache::Grow),
    ] {
        let other = decode_fixture((graph, update), kv);
        assert_eq!(
            other.tokens, eager.tokens,
            "graph {graph}, update {update}, {kv:?}"
        );
        let bits = |d: &devcmd_examples::gpt2::decode::Decoded| -> Vec<u32> {
            d.logits.iter().flatten().map(|v| v.to_bits()).collect()
        };
        assert_eq!(
            bits(&other),
            bits(&eager),
            "graph {graph}, update {update}, {kv:?}"
        );
        assert_eq!(other.growths, usize::from(kv == KvCache::Grow));
        assert_eq!(other.record.is_some(), graph);
    }
}
