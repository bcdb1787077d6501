//! Round trips: bytes come back exactly as they went in, on one stream and across streams.

use crate::harness::{Harness, Mode, TestKernel};
use crate::util::{Ctx, expect_same, must, pattern, plus, suspect};
use devcmd::{DeviceConfig, HostBuffer, ReadRequest, StreamId};

/// The round-trip group. Checks, byte-exactly, for sizes from 0 bytes to several MiB (small
/// pool and arena):
///
/// - `create` then read, and then `read_to` into a heap buffer (staged through pinned memory, or
///   pipelined);
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
        let what = format!("[{mode}] round_trips: create -> read of {size} bytes");
        let a = must(c.create(s0, &data), &what);
        c.expect_read(
            s0,
            &a,
            &data,
            &what,
            &[suspect::COPIES, suspect::EARLY_WAIT],
        );
        // Into the caller's heap buffer: through pinned memory below the pipeline's threshold
        // (copied over when the future resolves), through the staging ring above it.
        let what = format!("[{mode}] round_trips: create -> read_to a heap buffer of {size} bytes");
        let back = must(
            c.dev.command(s0).and_then(|mut k| {
                k.read_to(ReadRequest::whole(&a), HostBuffer::zeroed(size))?
                    .wait()
            }),
            &what,
        );
        expect_same(
            back.as_slice(),
            &data,
            &what,
            &[suspect::COPIES, suspect::EARLY_WAIT],
        );

        let what = format!("[{mode}] round_trips: empty -> write -> read of {size} bytes");
        let b = must(c.empty(s0, size as u64), &what);
        let data = pattern(size, 100 + i as u8);
        must(c.write(s0, &b, &data), &what);
        c.expect_read(
            s0,
            &b,
            &data,
            &what,
            &[suspect::COPIES, suspect::EARLY_WAIT],
        );
        if size >= 16 {
            let what = format!(
                "[{mode}] round_trips: a write through a view at offset 5 of {size} bytes, then \
                 a read of the whole"
            );
            let v = b.view(5, size as u64 - 9).unwrap();
            let part = pattern(size - 9, 200);
            must(c.write(s0, &v, &part), &what);
            let mut expected = data.clone();
            expected[5..size - 4].copy_from_slice(&part);
            let back = must(c.read(s0, &b), &what);
            const AT_OFFSET: &str = "copy_to_device / copy_to_host at an address inside a page \
                                     (the copy ignored or misapplied the view's offset)";
            expect_same(&back, &expected, &what, &[AT_OFFSET, suspect::EARLY_WAIT]);
            let what =
                format!("[{mode}] round_trips: a read through a view at offset 5 of {size} bytes");
            c.expect_read(s0, &v, &part, &what, &[AT_OFFSET]);
        }

        let what =
            format!("[{mode}] round_trips: lazy -> initialize -> write -> read of {size} bytes");
        let l = must(c.dev.command(s1), &what).lazy(size as u64);
        must(c.dev.command(s1).and_then(|mut k| k.initialize(&l)), &what);
        must(c.write(s1, &l, &data), &what);
        c.expect_read(
            s1,
            &l,
            &data,
            &what,
            &[suspect::COPIES, suspect::EARLY_WAIT],
        );
    }

    // Upload on stream 1, kernel on stream 0, read on stream 0: no host sync in between.
    for size in [1usize, 1000, 70_000, 2 << 20] {
        let what = format!(
            "[{mode}] round_trips: upload on stream 1 -> kernel on stream 0 -> read on stream \
             0, {size} bytes"
        );
        let data = pattern(size, 42);
        let x = must(c.create(s1, &data), &what);
        let y = must(c.empty(s0, size as u64), &what);
        must(c.launch(s0, TestKernel::AddByte, 3, &[&x], &[&y]), &what);
        c.expect_read(
            s0,
            &y,
            &plus(&data, 3),
            &what,
            &[suspect::STREAM_WAIT, suspect::LAUNCH],
        );
        // The reverse: stream 1 reads what stream 0 wrote, and re-derives from it.
        let what = format!(
            "[{mode}] round_trips: kernel on stream 0 -> kernel on stream 1 -> read on stream \
             0, {size} bytes"
        );
        let z = must(c.empty(s1, size as u64), &what);
        must(c.launch(s1, TestKernel::AddByte, 4, &[&y], &[&z]), &what);
        c.expect_read(
            s0,
            &z,
            &plus(&data, 7),
            &what,
            &[suspect::STREAM_WAIT, suspect::LAUNCH],
        );
    }

    // A chain alternating between streams, read once at the end.
    let what = format!(
        "[{mode}] round_trips: a chain of 10 kernels alternating between two streams, each \
         adding 1, read once at the end"
    );
    let data = pattern(4096, 5);
    let mut cur = must(c.create(s1, &data), &what);
    for step in 0..10u32 {
        let s = StreamId(step % 2);
        let next = must(c.empty(s, 4096), &what);
        must(
            c.launch(s, TestKernel::AddByte, 1, &[&cur], &[&next]),
            format!("{what}: kernel {step}"),
        );
        cur = next;
    }
    c.expect_read(
        s1,
        &cur,
        &plus(&data, 10),
        &what,
        &[suspect::STREAM_WAIT, suspect::LAUNCH],
    );
    drop(cur);
    c.assert_no_leak("round_trips");
}
