//! The `commands` target: a byte string read as a sequence of `Command` operations on shim-std
//! (lazy and poisoned, so a missing order or an early free shows as wrong bytes), checked
//! against a plain model (the bytes each live handle's view must hold).
//!
//! Owns the reading of the bytes into operations and the model. Each operation takes one byte
//! (which operation, on which of two streams) and the few bytes it needs after it; missing bytes
//! read as 0. Every operation the model allows must succeed, and every read must return the
//! model's bytes. The staging policy is small (pipelined from 4 KiB, pieces of 3000 bytes, a
//! ring of three) so uploads and reads of a few KiB run through the pipeline in several pieces.
//! At the end every handle is read once more, dropped, and every stream cleaned up: nothing may
//! stay in use.

use devcmd::staging::StagingPolicy;
use devcmd::{Device, DeviceConfig, Handle, HostBuffer, ReadRequest, StreamId};
use devcmd_std::StdShim;

/// Most handles alive at once (a create beyond drops the oldest).
const LIVE: usize = 24;
/// Largest allocation (two bytes of the input, modulo this).
const MAX_LEN: usize = 24_000;

/// Bytes `len` long from `seed` (every byte depends on both, and on its offset's high bits: a
/// copy misplaced by a multiple of 256 bytes shows).
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ ((i >> 8) as u8).wrapping_mul(7) ^ seed)
        .collect()
}

/// The operations, read from `data` (see the module documentation).
struct Ops<'a> {
    data: &'a [u8],
    at: usize,
}

impl Ops<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    fn word(&mut self) -> usize {
        usize::from(self.byte()) << 8 | usize::from(self.byte())
    }
}

/// Runs the operations `data` spells; panics on any disagreement with the model.
pub fn run(data: &[u8]) {
    // No copy threads: a helper spinning between pieces takes a core from a fuzzer that runs
    // one input after another (`CopyWorkers` has its own tests).
    let shim = StdShim::builder()
        .lazy(true)
        .poison(true)
        .copy_threads(0)
        .total_memory(256 << 20)
        .build();
    let config = DeviceConfig {
        staging: StagingPolicy {
            pipeline_from: 4096,
            chunk: 3000,
            depth: 3,
            ..StagingPolicy::default()
        },
        // Small pinned pages: each input makes a new device, and its pages are zeroed and
        // poisoned whole.
        pinned: devcmd::pinned::PinnedConfig {
            page_size: 256 << 10,
            max_bytes: 16 << 20,
            alignment: 64,
        },
        ..DeviceConfig::default()
    };
    let mut dev = Device::new(shim.clone(), config);
    let mut live: Vec<(Handle, Vec<u8>)> = Vec::new();
    let mut ops = Ops { data, at: 0 };
    let read = |dev: &mut Device<StdShim>, s: StreamId, h: &Handle, heap: bool| -> Vec<u8> {
        let mut cmd = dev.command(s).expect("command");
        if heap {
            let buffer = HostBuffer::zeroed(h.len() as usize);
            let back = cmd.read_to(ReadRequest::whole(h), buffer).expect("read_to");
            back.wait().expect("read_to wait").into_vec()
        } else {
            let mut got = cmd
                .read_async(&[ReadRequest::whole(h)])
                .expect("read_async")
                .wait()
                .expect("read_async wait");
            got.pop().map(HostBuffer::into_vec).unwrap_or_default()
        }
    };
    while ops.at < data.len() {
        let op = ops.byte();
        let s = StreamId(u32::from(op >> 7));
        let pick = |ops: &mut Ops<'_>, n: usize| usize::from(ops.byte()) % n.max(1);
        match op % 8 {
            // Create.
            0 => {
                let len = ops.word() % MAX_LEN + 1;
                let bytes = pattern(len, ops.byte());
                let h = dev.command(s).and_then(|mut c| c.create(&bytes));
                let h = h.unwrap_or_else(|e| panic!("create of {len} bytes: {e}"));
                if live.len() == LIVE {
                    live.remove(0);
                }
                live.push((h, bytes));
            }
            // Write the whole view from borrowed bytes.
            1 if !live.is_empty() => {
                let i = pick(&mut ops, live.len());
                let bytes = pattern(live[i].1.len(), ops.byte());
                dev.command(s)
                    .and_then(|mut c| c.write_from(&live[i].0, &bytes))
                    .unwrap_or_else(|e| panic!("write_from of {} bytes: {e}", bytes.len()));
                live[i].1 = bytes;
            }
            // Write a sub-range through a view, from a heap buffer handed over.
            2 if !live.is_empty() => {
                let i = pick(&mut ops, live.len());
                let n = live[i].1.len();
                let off = ops.word() % n;
                let len = ops.word() % (n - off) + 1;
                let bytes = pattern(len, ops.byte());
                let view = live[i]
                    .0
                    .view(off as u64, len as u64)
                    .expect("view in range");
                dev.command(s)
                    .and_then(|mut c| c.write(&view, HostBuffer::from_vec(bytes.clone())))
                    .unwrap_or_else(|e| panic!("write of {len} bytes at {off}: {e}"));
                live[i].1[off..off + len].copy_from_slice(&bytes);
            }
            // Read back, into pinned memory or into a heap buffer.
            3 | 4 if !live.is_empty() => {
                let i = pick(&mut ops, live.len());
                let got = read(&mut dev, s, &live[i].0, op % 8 == 4);
                assert!(
                    got == live[i].1,
                    "read of handle {i} ({} bytes) on stream {}: differs from the model",
                    got.len(),
                    s.0
                );
            }
            // Drop a handle.
            5 if !live.is_empty() => {
                let i = pick(&mut ops, live.len());
                live.remove(i);
            }
            // Sync, or clean up, a stream.
            6 => dev
                .command(s)
                .and_then(|mut c| c.sync()?.wait())
                .expect("sync"),
            7 => dev
                .command(s)
                .and_then(|mut c| c.memory_cleanup())
                .expect("memory_cleanup"),
            _ => {}
        }
    }
    for (i, (h, bytes)) in live.iter().enumerate() {
        let got = read(&mut dev, StreamId(0), h, i % 2 == 0);
        assert!(
            got == *bytes,
            "final read of handle {i}: differs from the model"
        );
    }
    live.clear();
    for s in [StreamId(0), StreamId(1)] {
        dev.command(s)
            .and_then(|mut c| c.memory_cleanup())
            .expect("final cleanup");
    }
    let report = dev.memory_report();
    let in_use: u64 = report.streams.iter().map(|(_, r)| r.device().in_use).sum();
    assert_eq!(
        in_use, 0,
        "device bytes in use after every handle was dropped"
    );
}
