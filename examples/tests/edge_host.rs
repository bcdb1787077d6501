//! The edge host as a user runs it: the built binary, its exit codes and messages, for the bad
//! inputs it must refuse (each with the flag, path or index at fault), for the save-then-map
//! round trip `scripts/test` runs, and for the GPU device on a machine without one (the host and
//! the GPU benchmark say "no CUDA driver found: ..." and exit non-zero, never panic; on a machine
//! with a driver that test prints `skipped:` and leaves the GPU to the GPU runs).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn edge_host<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    Command::new(env!("CARGO_BIN_EXE_edge-host"))
        .args(args)
        .output()
        .expect("run the edge host")
}

/// Exit code, stdout and stderr.
fn outcome(o: &Output) -> (Option<i32>, String, String) {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (o.status.code(), text(&o.stdout), text(&o.stderr))
}

/// A fresh directory for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("edge-host-{test}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

const WEIGHTS_BYTES: usize = (256 * 512 + 512 + 512 * 128 + 128 + 128 * 10 + 10) * 4;

#[test]
fn bad_flag_values_are_refused_up_front_naming_flag_and_value() {
    for (args, says) in [
        (
            &["--batch-size", "0"][..],
            "--batch-size got \"0\": expected",
        ),
        (&["--batches", "0"], "--batches got \"0\": expected"),
        (&["--batches", "lots"], "--batches got \"lots\": expected"),
        (&["--seed=-3"], "--seed got \"-3\": expected"),
        (&["--batch-size"], "--batch-size needs a value"),
        (
            &["--weights", "a.bin", "--save-weights", "b.bin"],
            "--save-weights and --weights cannot be used together",
        ),
    ] {
        let (code, stdout, stderr) = outcome(&edge_host(args));
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with(&format!("edge-host: {says}")),
            "{args:?}: {stderr}"
        );
        assert!(
            !stderr.contains("device"),
            "no device was involved: {stderr}"
        );
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
    }
}

#[test]
fn help_lists_every_flag_with_its_default() {
    let (code, stdout, _) = outcome(&edge_host(["--help"]));
    assert_eq!(code, Some(0));
    for default in [
        "[default: std]",
        "[default: 400]",
        "[default: 32]",
        "[default: off]",
        "[default: none, the weights are seeded from --seed]",
        "[default: none, nothing is written]",
        "[default: 7]",
    ] {
        assert!(stdout.contains(default), "{default} in:\n{stdout}");
    }
    assert!(
        stdout.contains(&format!("{WEIGHTS_BYTES} bytes")),
        "{stdout}"
    );
}

#[test]
fn file_errors_name_the_path_and_what_was_being_done() {
    let dir = scratch("file-errors");
    let shown = dir.display().to_string();
    let (code, _, stderr) = outcome(&edge_host([Path::new("--weights"), &dir]));
    assert_eq!(code, Some(2), "bad input: {stderr}");
    assert!(
        stderr.contains(&format!("the weights path {shown} is a directory")),
        "{stderr}"
    );

    let nowhere = dir.join("missing").join("w.bin");
    let (code, _, stderr) = outcome(&edge_host([Path::new("--save-weights"), &nowhere]));
    assert_eq!(code, Some(2), "bad input: {stderr}");
    let want = format!("cannot write the seeded weights to {}: ", nowhere.display());
    assert!(stderr.contains(&want), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn non_finite_weights_are_refused_and_never_verified() {
    let dir = scratch("non-finite");
    let nans = dir.join("nan.bin");
    std::fs::write(&nans, f32::NAN.to_le_bytes().repeat(WEIGHTS_BYTES / 4)).expect("write");
    let (code, stdout, stderr) = outcome(&edge_host([Path::new("--weights"), &nans]));
    assert_eq!(code, Some(2), "bad input: {stderr}");
    let want = format!(
        "the weights file {} holds NaN at float index 0",
        nans.display()
    );
    assert!(stderr.contains(&want), "{stderr}");
    assert!(!stdout.contains("verified"), "{stdout}");

    // Finite weights large enough to overflow the reference: an error, never a pass.
    let saved = dir.join("saved.bin");
    let run = edge_host([
        Path::new("--batches"),
        Path::new("1"),
        Path::new("--save-weights"),
        &saved,
    ]);
    assert_eq!(run.status.code(), Some(0), "{:?}", outcome(&run));
    let mut bytes = std::fs::read(&saved).expect("read the saved weights");
    let w3 = (256 * 512 + 512 + 512 * 128 + 128) * 4;
    for v in bytes[w3..w3 + 128 * 10 * 4].chunks_exact_mut(4) {
        v.copy_from_slice(&3e38f32.to_le_bytes());
    }
    let huge = dir.join("huge.bin");
    std::fs::write(&huge, bytes).expect("write");
    let run = edge_host([
        Path::new("--batches"),
        Path::new("1"),
        Path::new("--weights"),
        &huge,
    ]);
    let (code, stdout, stderr) = outcome(&run);
    assert_eq!(code, Some(2), "bad input (not a mismatch): {stderr}");
    assert!(
        stderr.contains("batch 0: the host reference of output 0 is NaN"),
        "{stderr}"
    );
    assert!(!stdout.contains("verified"), "{stdout}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn saved_weights_serve_again_memory_mapped() {
    let dir = scratch("round-trip");
    let file = dir.join("w.bin");
    let arg = |s: &str| Path::new(s).to_owned();
    let save = edge_host([
        arg("--batches"),
        arg("2"),
        arg("--batch-size"),
        arg("3"),
        arg("--save-weights"),
        file.clone(),
    ]);
    let (code, stdout, stderr) = outcome(&save);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains(&format!("wrote seeded weights to {}", file.display())),
        "{stdout}"
    );
    assert!(stdout.contains("all results verified"), "{stdout}");
    let load = edge_host([
        arg("--batches"),
        arg("2"),
        arg("--lazy"),
        arg("--weights"),
        file,
    ]);
    let (code, stdout, stderr) = outcome(&load);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains(&format!("{WEIGHTS_BYTES} from a mapped file")),
        "{stdout}"
    );
    assert!(
        stdout.contains("0 mismatches") && stdout.contains("all results verified"),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn graphs_serve_and_verify_in_every_std_mode() {
    for lazy in [false, true] {
        let mut args = vec!["--graph", "--batches", "11", "--batch-size", "5"];
        if lazy {
            args.push("--lazy");
        }
        let (code, stdout, stderr) = outcome(&edge_host(args));
        assert_eq!(code, Some(0), "lazy {lazy}: {stderr}");
        assert!(
            stdout.contains("graphs: one batch's 6 launches recorded 5 times"),
            "{stdout}"
        );
        assert!(
            stdout.contains("55 requests") && stdout.contains("0 mismatches"),
            "{stdout}"
        );
        assert!(stdout.contains("all results verified"), "{stdout}");
    }
}

#[test]
fn several_std_devices_serve_and_verify_with_weights_copied_device_to_device() {
    for lazy in [false, true] {
        let mut args = vec!["--devices", "3", "--batches", "13", "--batch-size", "5"];
        if lazy {
            args.push("--lazy");
        }
        let (code, stdout, stderr) = outcome(&edge_host(args));
        assert_eq!(code, Some(0), "lazy {lazy}: {stderr}");
        for line in [
            "copied the weights to device 1 (device to device",
            "copied the weights to device 2 (device to device",
            "65 requests across 3 devices",
            "0 mismatches",
            "3 device(s): device memory held",
            "all results verified",
        ] {
            assert!(stdout.contains(line), "lazy {lazy}: {line:?} in:\n{stdout}");
        }
    }
}

#[test]
fn an_unknown_device_is_refused_by_name() {
    for name in ["tpu", "gpu", "CUDA"] {
        let (code, stdout, stderr) = outcome(&edge_host(["--device", name]));
        assert_eq!(code, Some(2), "{name}: {stderr}");
        assert!(
            stderr.starts_with(&format!(
                "edge-host: --device got {name:?}: expected std (the CPU device) or cuda (the \
                 first NVIDIA GPU)"
            )),
            "{stderr}"
        );
        assert!(stdout.is_empty(), "{stdout}");
    }
    let (code, _, stderr) = outcome(&edge_host(["--device", "cuda", "--lazy"]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.starts_with("edge-host: --lazy and --device cuda cannot be used together"),
        "{stderr}"
    );
}

#[test]
fn without_a_cuda_driver_the_gpu_host_and_bench_say_so_and_exit_non_zero() {
    if let Some(lib) = devcmd_cuda::driver_library() {
        println!(
            "skipped: a CUDA driver library loads here ({lib}); the GPU runs cover --device cuda"
        );
        return;
    }
    let (code, stdout, stderr) = outcome(&edge_host(["--device", "cuda", "--batches", "1"]));
    assert_eq!(code, Some(3), "no device: {stderr}");
    assert!(
        stderr.starts_with("edge-host: no CUDA driver found: "),
        "{stderr}"
    );
    assert!(stderr.contains("libcuda.so.1"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stdout.contains("served"), "{stdout}");

    let bench = Command::new(env!("CARGO_BIN_EXE_cuda-bench"))
        .arg("--quick")
        .output()
        .expect("run the GPU benchmark");
    let (code, stdout, stderr) = outcome(&bench);
    assert_eq!(code, Some(3), "no device: {stderr}");
    assert!(
        stderr.starts_with("cuda-bench: no CUDA driver found: "),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");

    let bench = Command::new(env!("CARGO_BIN_EXE_graph-bench"))
        .arg("--quick")
        .output()
        .expect("run the graph benchmark");
    let (code, stdout, stderr) = outcome(&bench);
    assert_eq!(code, Some(3), "no device: {stderr}");
    assert!(
        stderr.starts_with("graph-bench: no CUDA driver found: "),
        "{stderr}"
    );
    assert!(stdout.is_empty(), "{stdout}");
}
