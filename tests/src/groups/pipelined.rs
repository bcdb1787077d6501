//! Pipelined copies: uploads from and reads into ordinary memory cut into pieces through the
//! stream's staging ring ([`devcmd::staging`]).

use crate::harness::{FaultRule, Harness, Mode};
use crate::util::{Ctx, first_diff, must, pattern, pinned_in_use};
use devcmd::staging::StagingPolicy;
use devcmd::{
    CopyLayout, DeviceConfig, Handle, HostBuffer, ReadRequest, ServerError, ShimOp, StreamId,
};

/// Bytes per piece: odd, so no size or row below is a multiple of it by accident.
const CHUNK: u64 = 4099;

/// A device whose pipeline cuts everything from 1 byte on into pieces of [`CHUNK`] bytes through
/// a ring of three buffers.
fn config() -> DeviceConfig {
    DeviceConfig {
        staging: StagingPolicy {
            pipeline_from: 1,
            chunk: CHUNK,
            depth: 3,
            ..StagingPolicy::default()
        },
        ..DeviceConfig::default()
    }
}

/// Reads `layout` of `handle` into a heap buffer (the pipelined read) on `stream`.
fn read_heap<H: Harness>(
    c: &mut Ctx<H>,
    stream: StreamId,
    handle: &Handle,
    layout: CopyLayout,
) -> Result<Vec<u8>, ServerError> {
    let buffer = HostBuffer::zeroed(layout.packed_bytes() as usize);
    let back = c
        .dev
        .command(stream)?
        .read_to(ReadRequest { handle, layout }, buffer)?
        .wait()?;
    Ok(back.into_vec())
}

/// The pipelined group. Checks, byte-exactly:
///
/// - uploads (`write_from`, `write` of a heap buffer, `create`) and reads into heap memory of
///   sizes around the piece size (1 byte, a piece less one, a piece, a piece and one, many
///   pieces and a remainder), each read back both pipelined and through pinned memory;
/// - pitched layouts whose rows are shorter than a piece (several rows per piece) and longer
///   (rows cut across pieces), with the padding between rows left as it was;
/// - more copies in a row than the ring has buffers, across two streams (uploads on one,
///   pipelined reads on the other);
/// - a read into heap memory runs through the ring (a fresh stream's pinned pool holds its
///   buffer after it, where the shim serves pinned memory), and short reads in a row spread
///   over every buffer of the ring, each returning its own bytes;
/// - with a probe: a device copy refused in the middle of an upload fails the whole write (a
///   read of any of its bytes is refused) and leaves the ring usable; one refused in the middle
///   of a read fails the read, and the next read returns every byte;
/// - nothing leaked once every handle is dropped and the device cleaned up.
///
/// A piece that fails while it runs is [`pipelined_work_fault`] (it traps on a GPU).
pub fn pipelined<H: Harness>(h: &H, mode: Mode) {
    let Some(mut c) = Ctx::new(h, mode, config(), "pipelined") else {
        return;
    };
    let (s0, s1) = (StreamId(0), StreamId(1));
    let chunk = CHUNK as usize;
    for (i, size) in [1, chunk - 1, chunk, chunk + 1, 7 * chunk + 5]
        .into_iter()
        .enumerate()
    {
        let data = pattern(size, 3 + i as u8);
        let h1 = must(c.empty(s0, size as u64), "empty");
        must(
            c.dev.command(s0).and_then(|mut k| k.write_from(&h1, &data)),
            format!("[{mode}] pipelined write_from of {size} bytes"),
        );
        let layout = CopyLayout::linear(size as u64);
        for (how, back) in [
            ("pipelined read", read_heap(&mut c, s0, &h1, layout)),
            ("read through pinned memory", c.read(s0, &h1)),
        ] {
            let back = must(back, format!("[{mode}] {how} of {size} bytes"));
            assert!(
                back == data,
                "[{mode}] pipelined write_from of {size} bytes ({CHUNK}-byte pieces), then \
                 {how}: {}; a piece was copied from or into the wrong place, or a ring buffer \
                 was reused before its fence passed",
                first_diff(&back, &data)
            );
        }
        let owned = pattern(size, 50 + i as u8);
        must(c.write(s0, &h1, &owned), "pipelined write of a heap buffer");
        let h2 = must(c.create(s1, &owned), "pipelined create");
        for (what, handle, stream) in [("write", &h1, s1), ("create", &h2, s0)] {
            let back = must(
                read_heap(&mut c, stream, handle, layout),
                format!("[{mode}] pipelined read of {size} bytes on another stream"),
            );
            assert!(
                back == owned,
                "[{mode}] pipelined {what} of {size} bytes read back pipelined on the other \
                 stream: {}",
                first_diff(&back, &owned)
            );
        }
    }

    // Pitched: rows of 1000 bytes (4 to a piece) and of 10 000 bytes (cut across pieces).
    for (width, pitch, height) in [(1000u64, 1500u64, 13u64), (10_000, 10_240, 3)] {
        let span = (height - 1) * pitch + width;
        let before = pattern(span as usize, 9);
        let h = must(c.create(s0, &before), "create for a pitched write");
        let layout = CopyLayout::of(&[height, width], &[pitch, 1], 1).expect("pitched layout");
        let rows = pattern((width * height) as usize, 77);
        must(
            c.dev
                .command(s1)
                .and_then(|mut k| k.write_layout(&h, HostBuffer::from_vec(rows.clone()), layout)),
            format!("[{mode}] pipelined pitched write {height}x{width} (pitch {pitch})"),
        );
        let mut expected = before.clone();
        for r in 0..height as usize {
            let (d, p) = (r * pitch as usize, r * width as usize);
            expected[d..d + width as usize].copy_from_slice(&rows[p..p + width as usize]);
        }
        let whole = must(c.read(s0, &h), "read of the pitched allocation");
        assert!(
            whole == expected,
            "[{mode}] pipelined pitched write {height}x{width} (pitch {pitch}, {CHUNK}-byte \
             pieces): {}; rows or the padding between them are wrong",
            first_diff(&whole, &expected)
        );
        let back = must(read_heap(&mut c, s0, &h, layout), "pipelined pitched read");
        assert!(
            back == rows,
            "[{mode}] pipelined pitched read {height}x{width} (pitch {pitch}): {}",
            first_diff(&back, &rows)
        );
    }

    // The reads above ran through the ring, not around it: a fresh stream's pipelined read
    // leaves the ring's buffer in its pinned pool (where the shim serves pinned memory at all).
    let s3 = StreamId(3);
    let serves_pinned = must(
        must(c.dev.command(s3), "command").reserve_host(64, true),
        "reserve_host",
    )
    .origin()
        == devcmd::HostOrigin::Pinned;
    let h = must(c.create(s0, &pattern(3 * chunk, 5)), "create");
    must(
        read_heap(&mut c, s3, &h, CopyLayout::linear(3 * CHUNK)),
        "pipelined read on a fresh stream",
    );
    let ring = pinned_in_use(&mut c.dev, s3);
    assert!(
        !serves_pinned || ring >= CHUNK,
        "[{mode}] a read of 3 pieces into heap memory left {ring} bytes of pinned buffers in \
         use on its stream: it did not run through the staging ring (expected at least one \
         {CHUNK}-byte buffer)"
    );
    drop(h);

    // Reads spread over the ring: short reads in a row on a fresh stream land at walking
    // offsets of every buffer (`read_spread` is far above this ring's three buffers), each
    // returning its own bytes, not a line an earlier read left there.
    let s4 = StreamId(4);
    let short = 1000;
    let h = must(c.empty(s0, short as u64), "empty");
    for k in 0..13u8 {
        let data = pattern(short, 200 + k);
        must(
            c.dev
                .command(s0)
                .and_then(|mut cmd| cmd.write_from(&h, &data)),
            "write_from",
        );
        let back = must(
            read_heap(&mut c, s4, &h, CopyLayout::linear(short as u64)),
            "short pipelined read",
        );
        assert!(
            back == data,
            "[{mode}] short pipelined read {k} of {short} bytes (spread over the ring): {}",
            first_diff(&back, &data)
        );
    }
    let ring = pinned_in_use(&mut c.dev, s4);
    assert!(
        !serves_pinned || ring >= 3 * CHUNK,
        "[{mode}] 13 short reads in a row left {ring} bytes of pinned buffers in use on their \
         stream: the reads did not spread over the ring's three {CHUNK}-byte buffers"
    );
    drop(h);

    // More copies than the ring has buffers, uploads on one stream, reads on the other.
    let size = 2 * chunk + 11;
    let handles: Vec<(Handle, Vec<u8>)> = (0..7u8)
        .map(|k| {
            let data = pattern(size, 120 + k);
            let h = must(c.empty(s1, size as u64), "empty");
            must(
                c.dev.command(s1).and_then(|mut x| x.write_from(&h, &data)),
                "write_from",
            );
            (h, data)
        })
        .collect();
    for (k, (h, data)) in handles.iter().enumerate() {
        let back = must(
            read_heap(&mut c, s0, h, CopyLayout::linear(size as u64)),
            "read",
        );
        assert!(
            back == *data,
            "[{mode}] upload {k} of 7 in a row on stream 1 (a ring of 3 buffers), read \
             pipelined on stream 0: {}",
            first_diff(&back, data)
        );
    }
    drop(handles);

    if let Some(probe) = c.probe.take() {
        // A device copy refused mid-write: the third piece's.
        let size = 6 * chunk;
        let h = must(c.create(s0, &pattern(size, 1)), "create");
        probe.inject(FaultRule::Once {
            op: ShimOp::CopyHostToDevice,
            skip: 2,
        });
        let refused = c
            .dev
            .command(s0)
            .and_then(|mut k| k.write_from(&h, &pattern(size, 2)));
        probe.clear();
        assert!(
            refused.is_err(),
            "[{mode}] an upload whose third piece's copy_to_device was refused returned Ok"
        );
        let read = read_heap(&mut c, s0, &h, CopyLayout::linear(size as u64));
        assert!(
            matches!(read, Err(ServerError::Unwritten { .. })),
            "[{mode}] after a pipelined write failed on its third piece, a read of the range \
             must be refused as unwritten (the failure rule covers every piece); got {read:?}"
        );
        let data = pattern(size, 3);
        must(
            c.dev.command(s0).and_then(|mut k| k.write_from(&h, &data)),
            format!("[{mode}] a pipelined write after a refused one"),
        );
        let back = must(
            read_heap(&mut c, s0, &h, CopyLayout::linear(size as u64)),
            "read after a rewrite",
        );
        assert!(
            back == data,
            "[{mode}] the write after a refused pipelined write: {}",
            first_diff(&back, &data)
        );

        // A device copy refused mid-read: the read fails, returns no bytes, and the next one
        // reads them all.
        probe.inject(FaultRule::Once {
            op: ShimOp::CopyDeviceToHost,
            skip: 2,
        });
        let read = read_heap(&mut c, s0, &h, CopyLayout::linear(size as u64));
        probe.clear();
        assert!(
            read.is_err(),
            "[{mode}] a pipelined read whose third piece's copy_to_host was refused returned Ok"
        );
        let back = must(
            read_heap(&mut c, s0, &h, CopyLayout::linear(size as u64)),
            "read after a refused read",
        );
        assert!(
            back == data,
            "[{mode}] the read after a refused pipelined read: {}",
            first_diff(&back, &data)
        );
        drop(h);

        c.probe = Some(probe);
    }
    c.assert_no_leak("pipelined copies");
}

/// A pipelined upload whose second piece fails while it runs (with a probe:
/// [`FaultRule::WorkFails`]; the stream stays faulted, and on a GPU the process too): a fence
/// says so (the wait for a ring buffer, the read, or the sync), and no read returns its bytes as
/// data. Skipped without a probe.
pub fn pipelined_work_fault<H: Harness>(h: &H, mode: Mode) {
    let Some(mut c) = Ctx::new(h, mode, config(), "pipelined_work_fault") else {
        return;
    };
    let Some(probe) = c.probe.take() else {
        return;
    };
    let size = 6 * CHUNK as usize;
    let s2 = StreamId(2);
    let h = must(c.empty(s2, size as u64), "empty");
    probe.inject(FaultRule::WorkFails {
        op: ShimOp::CopyHostToDevice,
        skip: 1,
    });
    let wrote = c
        .dev
        .command(s2)
        .and_then(|mut k| k.write_from(&h, &pattern(size, 4)));
    probe.clear();
    let read = read_heap(&mut c, s2, &h, CopyLayout::linear(size as u64));
    let synced = c.sync(s2);
    assert!(
        wrote.is_err() || read.is_err() || synced.is_err(),
        "[{mode}] a pipelined upload whose second piece failed while it ran: the write, the \
         read and the sync all returned Ok (the fault was lost)"
    );
    assert!(
        read.is_err(),
        "[{mode}] a pipelined upload whose second piece failed while it ran was read back \
         as data"
    );
    drop(h);
}
