//! GPU tests of copies between two devices through the raw shim: two `CudaShim`s of the device
//! under test share its primary context (peer access always; the copy is `cuMemcpyDtoDAsync`),
//! and, where the machine has a second GPU that `cuDeviceCanAccessPeer` allows, a copy to it
//! (`cuMemcpyPeerAsync`), its order by an event of the other device (`cuStreamWaitEvent` across
//! contexts). Like `gpu.rs`, they run for real where a CUDA driver and device are present and
//! print a visible `skipped: ...` line (straight to stderr) and pass where none is.

mod common;

use common::{download, gpu, page, pattern, say, upload};
use devcmd::Shim;
use devcmd_cuda::CudaShim;

/// Copies 3 MiB + 5 bytes at an odd offset from `a`'s page to `b`'s on `b`'s stream, after a
/// wait on `a`'s event, and checks them.
fn copy_between(a: &CudaShim, b: &CudaShim) {
    assert!(b.peer_access(a), "peer access between the two");
    let n = 3 * (1 << 20) + 5;
    let (sa, sb) = (a.create_stream().unwrap(), b.create_stream().unwrap());
    let (pa, aa) = page(a, n + 16);
    let (pb, ab) = page(b, n + 16);
    let data = pattern(n + 16, 3);
    upload(a, &sa, &data, aa);
    upload(b, &sb, &vec![0u8; n + 16], ab);
    let before = a.record_event(&sa).unwrap();
    b.stream_wait_event(&sb, &before).unwrap();
    // SAFETY: both ranges lie in live pages, which outlive the download (a sync) below.
    unsafe { b.copy_peer(&sb, ab.offset(7), a, aa.offset(3), n as u64) }.unwrap();
    let got: Vec<u8> = download(b, &sb, ab, n + 16);
    assert_eq!(&got[7..7 + n], &data[3..3 + n], "the copied bytes");
    assert!(
        got[..7].iter().chain(&got[7 + n..]).all(|&x| x == 0),
        "around them"
    );
    // SAFETY: the download synchronised `sb`; `sa` was synchronised by the upload.
    unsafe {
        a.device_free(pa);
        b.device_free(pb);
    }
}

#[test]
fn two_shims_of_one_gpu_copy_device_to_device() {
    let (Some(a), Some(b)) = (gpu("two_shims_of_one_gpu"), gpu("two_shims_of_one_gpu")) else {
        return;
    };
    copy_between(&a, &b);
    copy_between(&b, &a);
}

#[test]
fn two_gpus_copy_peer_to_peer_where_the_driver_allows_it() {
    let Some(a) = gpu("two_gpus") else {
        return;
    };
    let count = CudaShim::device_count().unwrap();
    if count < 2 {
        say(&format!("skipped: one GPU only (two_gpus): {count} listed"));
        return;
    }
    let b = CudaShim::new(if a.ordinal() == 0 { 1 } else { 0 }).unwrap();
    if !b.peer_access(&a) {
        say("skipped: the driver allows no peer access between GPUs 0 and 1 (two_gpus)");
        return;
    }
    copy_between(&a, &b);
    copy_between(&b, &a);
}
