//! Round trips: bytes come back exactly as they went in, on one stream and across streams.

use crate::harness::{Harness, Mode, TestKernel};
use crate::util::{Ctx, first_diff, must, pattern, plus};
use devcmd::{DeviceConfig, StreamId};

/// The round-trip group. Checks, byte-exactly, for sizes from 0 bytes to several MiB (small
/// pool and arena):
///
/// - `create` then read;
/// - `empty` then `write` then read, whole and through a view at an offset;
/// - a lazy handle: `lazy` then `initialize` then `write` then read;
/// - across streams with no host synchronisation in between: upload on stream 1, a kernel on
///   stream 0 reading it, read on stream 0; and the reverse direction (stream 1 reads stream 0's
///   output), and a chain of kernels alternating between the streams.
pub fn round_trips<H: Harness>(h: &H, mode: Mode) {
    let Some(mut c) = Ctx::new(h, mode, DeviceConfig::default(), "round_trips") else {
        return;
    };
    let (s0, s1) = (StreamId(0), StreamId(1));
    for (i, size) in [0usize, 1, 7, 256, 4096, 65_537, 3 << 20]
        .into_iter()
        .enumerate()
    {
        let data = pattern(size, i as u8);
        let a = must(c.create(s0, &data), format!("[{mode}] create {size}"));
        let back = must(c.read(s0, &a), "read");
        assert!(
            back == data,
            "[{mode}] create -> read of {size} bytes: {}",
            first_diff(&back, &data)
        );

        let b = must(c.empty(s0, size as u64), "empty");
        let data = pattern(size, 100 + i as u8);
        must(c.write(s0, &b, &data), "write");
        let back = must(c.read(s0, &b), "read");
        assert!(
            back == data,
            "[{mode}] empty -> write -> read of {size} bytes: {}",
            first_diff(&back, &data)
        );
        if size >= 16 {
            let v = b.view(5, size as u64 - 9).unwrap();
            let part = pattern(size - 9, 200);
            must(c.write(s0, &v, &part), "write view");
            let mut expected = data.clone();
            expected[5..size - 4].copy_from_slice(&part);
            let back = must(c.read(s0, &b), "read");
            assert!(
                back == expected,
                "[{mode}] write through a view of {size} bytes: {}",
                first_diff(&back, &expected)
            );
            let back = must(c.read(s0, &v), "read view");
            assert!(back == part, "[{mode}] read through a view");
        }

        let l = must(c.dev.command(s1), "command").lazy(size as u64);
        must(
            c.dev.command(s1).and_then(|mut k| k.initialize(&l)),
            "initialize",
        );
        must(c.write(s1, &l, &data), "write lazy");
        let back = must(c.read(s1, &l), "read lazy");
        assert!(
            back == data,
            "[{mode}] lazy handle round trip of {size} bytes"
        );
    }

    // Upload on stream 1, kernel on stream 0, read on stream 0: no host sync in between.
    for size in [1usize, 1000, 70_000, 2 << 20] {
        let data = pattern(size, 42);
        let x = must(c.create(s1, &data), "create on stream 1");
        let y = must(c.empty(s0, size as u64), "empty on stream 0");
        must(
            c.launch(s0, TestKernel::AddByte, 3, &[&x], &[&y]),
            "kernel on stream 0",
        );
        let back = must(c.read(s0, &y), "read on stream 0");
        let expected = plus(&data, 3);
        assert!(
            back == expected,
            "[{mode}] upload on stream 1 -> kernel on stream 0 -> read on stream 0, {size} \
             bytes: {}",
            first_diff(&back, &expected)
        );
        // The reverse: stream 1 reads what stream 0 wrote, and re-derives from it.
        let z = must(c.empty(s1, size as u64), "empty on stream 1");
        must(
            c.launch(s1, TestKernel::AddByte, 4, &[&y], &[&z]),
            "kernel on stream 1",
        );
        let back = must(c.read(s0, &z), "read on stream 0");
        assert!(
            back == plus(&data, 7),
            "[{mode}] stream 0 -> stream 1 -> read on stream 0, {size} bytes"
        );
    }

    // A chain alternating between streams, read once at the end.
    let data = pattern(4096, 5);
    let mut cur = must(c.create(s1, &data), "create");
    for step in 0..10u32 {
        let s = StreamId(step % 2);
        let next = must(c.empty(s, 4096), "empty");
        must(
            c.launch(s, TestKernel::AddByte, 1, &[&cur], &[&next]),
            "chain",
        );
        cur = next;
    }
    let back = must(c.read(s1, &cur), "read chain");
    assert!(
        back == plus(&data, 10),
        "[{mode}] a 10-kernel chain across two streams"
    );
    drop(cur);
    c.assert_no_leak("round_trips");
}
