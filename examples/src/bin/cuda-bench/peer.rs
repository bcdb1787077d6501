//! The peer section: copies between two devices, 16 MiB to 1 GiB, through devcmd
//! (`Command::copy_from` between two `Device`s, back to back, one sync at the end) against the
//! raw driver call on the destination's stream (`cuMemcpyPeerAsync` between two GPUs with peer
//! access enabled; `cuMemcpyDtoDAsync` where there is one GPU: two shims of GPU 0 share its
//! primary context, so the figure is the layer's overhead on a device-to-device copy).
//!
//! Owns these measurements only; the raw and devcmd rounds are interleaved, medians printed.

use super::{Res, Rounds, S, bind, cu, gbps, human, median, sync};
use devcmd::{CopyPath, Device, DeviceConfig, Shim};
use devcmd_cuda::{CudaShim, sys};
use std::time::Instant;

/// The peer section: device 0 (`src`) to device 1 (GPU 1 where there is one, else GPU 0 again).
pub fn peer(src: &CudaShim, rounds: Rounds, quick: bool) -> Res<()> {
    let gpus = CudaShim::device_count()?;
    let dst = CudaShim::new(if gpus >= 2 { 1 } else { 0 })?;
    let two = gpus >= 2;
    println!("\n## Copies between two devices\n");
    let peer = dst.peer_access(src);
    println!(
        "Source: GPU {} ({}); destination: GPU {} ({}); {}. devcmd: `copy_from` of a whole \
         allocation of one `Device` into one of the other, back to back, then one sync; raw: \
         the same number of `{}` on the destination's stream, then one sync. {} rounds after {} \
         warm-up.\n",
        src.ordinal(),
        src.name(),
        dst.ordinal(),
        dst.name(),
        if !two {
            "one GPU: two shims share its primary context"
        } else if peer {
            "peer access enabled"
        } else {
            "no peer access: devcmd stages through host memory"
        },
        if two {
            "cuMemcpyPeerAsync"
        } else {
            "cuMemcpyDtoDAsync"
        },
        rounds.timed,
        rounds.warm
    );
    println!("| size | raw GB/s | devcmd GB/s | devcmd / raw |");
    println!("|---:|---:|---:|---:|");
    let sizes: &[usize] = if quick {
        &[16 << 20, 256 << 20]
    } else {
        &[16 << 20, 64 << 20, 256 << 20, 1 << 30]
    };
    let mut a = Device::new(src.clone(), DeviceConfig::default());
    let mut b = Device::new(dst.clone(), DeviceConfig::default());
    let stream = dst.create_stream()?;
    for &size in sizes {
        let reps = ((4usize << 30) / size).clamp(2, 64);
        let from = a.command(S)?.empty(size as u64)?;
        let to = b.command(S)?.empty(size as u64)?;
        // Raw memory of the same size on each side.
        let raw_src = src.device_alloc(size as u64)?;
        let raw_dst = dst.device_alloc(size as u64)?;
        let (sa, da) = (
            src.device_page_addr(&raw_src).0,
            dst.device_page_addr(&raw_dst).0,
        );
        let raw_round = || -> Res<f64> {
            bind(&dst)?;
            let t = Instant::now();
            for _ in 0..reps {
                // SAFETY: both pages hold `size` bytes and outlive the sync below; peer access
                // was enabled by `peer_access` (two GPUs) or both are one context's.
                let r = unsafe {
                    if two {
                        sys::cuMemcpyPeerAsync(
                            da,
                            dst.cu_context(),
                            sa,
                            src.cu_context(),
                            size,
                            stream.cu_stream(),
                        )
                    } else {
                        sys::cuMemcpyDtoDAsync_v2(da, sa, size, stream.cu_stream())
                    }
                };
                cu("the raw copy", r)?;
            }
            sync(&stream)?;
            Ok(gbps(size * reps, t.elapsed()))
        };
        let mut ours_round = || -> Res<f64> {
            let t = Instant::now();
            let mut path = CopyPath::Empty;
            for _ in 0..reps {
                let mut source = a.command(S)?;
                path = b.command(S)?.copy_from(&to, &mut source, &from)?;
            }
            b.command(S)?.sync()?.wait()?;
            let rate = gbps(size * reps, t.elapsed());
            a.command(S)?.sync()?.wait()?;
            if path != CopyPath::Peer && peer {
                return Err(format!("the copy took the path {path:?}, not Peer").into());
            }
            Ok(rate)
        };
        let (mut raw, mut ours) = (Vec::new(), Vec::new());
        for round in 0..rounds.all() {
            let (r, o) = (raw_round()?, ours_round()?);
            if round >= rounds.warm {
                raw.push(r);
                ours.push(o);
            }
        }
        let (r, o) = (median(&raw), median(&ours));
        println!("| {} | {r:.1} | {o:.1} | {:.3} |", human(size), o / r);
        // SAFETY: the syncs above covered every copy that used the pages.
        unsafe {
            src.device_free(raw_src);
            dst.device_free(raw_dst);
        }
    }
    Ok(())
}
