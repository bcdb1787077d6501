//! Bad input: each an error, never a panic.

use crate::harness::{Harness, Mode, TestKernel};
use crate::util::{Ctx, must};
use devcmd::error::NotFoundReason;
use devcmd::{
    CopyLayout, DeviceConfig, HostBuffer, IoError, LaunchError, ReadRequest, ServerError, StreamId,
    Validation,
};
use std::panic::{AssertUnwindSafe, catch_unwind};

#[track_caller]
fn expect_err<T: std::fmt::Debug>(
    mode: Mode,
    what: &str,
    f: impl FnOnce() -> Result<T, ServerError>,
    ok: impl Fn(&ServerError) -> bool,
) {
    let r = catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|_| panic!("[{mode}] {what}: panicked instead of returning an error"));
    match r {
        Err(e) if ok(&e) => assert!(!e.to_string().is_empty()),
        other => panic!("[{mode}] {what}: unexpected result {other:?}"),
    }
}

fn io(e: &ServerError, f: impl Fn(&IoError) -> bool) -> bool {
    match e {
        ServerError::Io(i) => f(i),
        ServerError::Launch(LaunchError::Buffer { cause, .. }) => f(cause),
        _ => false,
    }
}

/// The bad-input group. Checks that each of these is an error (of the right kind, with a
/// message), never a panic, and leaves the device usable:
///
/// - a handle of another device, in `command`, `write`, read, launch, `bind` and `resource`
///   (`ForeignHandle`);
/// - a stale handle: the reservation given away by `bind` (`NotFound { HandedOver }`), a lazy
///   handle never initialised (`NotFound { NeverBound }`), binding room to a larger handle
///   (`OutOfRange`);
/// - an out-of-range view (`OutOfRange`), a layout past the view (`LayoutPastView`), host data
///   of the wrong length (`LengthMismatch`);
/// - unsupported strides (`CopyLayout::of` answers `UnsupportedStrides`);
/// - impossible sizes: `u64::MAX` bytes and more than the device's memory (`BufferTooBig`),
///   an out-of-range stream (`StreamOutOfRange`).
pub fn bad_input<H: Harness>(h: &H, mode: Mode) {
    let Some(mut c) = Ctx::new(h, mode, DeviceConfig::default(), "bad_input") else {
        return;
    };
    let Some(mut other) = Ctx::new(h, mode, DeviceConfig::default(), "bad_input") else {
        return;
    };
    let s = StreamId(0);
    let mine = must(c.create(s, &[1; 64]), "create");
    let out = must(c.empty(s, 64), "empty");
    let foreign = must(other.create(s, &[2; 64]), "create on the other device");
    let is_foreign = |e: &ServerError| io(e, |i| matches!(i, IoError::ForeignHandle { .. }));

    expect_err(
        mode,
        "write to a foreign handle",
        || c.write(s, &foreign, &[0; 64]),
        is_foreign,
    );
    expect_err(
        mode,
        "read of a foreign handle",
        || c.read(s, &foreign),
        is_foreign,
    );
    expect_err(
        mode,
        "launch with a foreign input",
        || c.launch(s, TestKernel::AddByte, 1, &[&foreign], &[&out]),
        is_foreign,
    );
    expect_err(
        mode,
        "launch with a foreign output",
        || c.launch(s, TestKernel::AddByte, 1, &[&mine], &[&foreign]),
        is_foreign,
    );
    expect_err(
        mode,
        "resource of a foreign handle",
        || c.dev.command(s)?.resource(&foreign).map_err(Into::into),
        is_foreign,
    );
    expect_err(
        mode,
        "bind to a foreign handle",
        || {
            let mut k = c.dev.command(s)?;
            let r = k.reserve(64)?;
            k.bind(r, &foreign)
        },
        is_foreign,
    );

    // Stale: the reservation after bind; never bound; too large a target.
    let mut k = must(c.dev.command(s), "command");
    let reserved = must(k.reserve(64), "reserve");
    let stale = reserved.clone();
    let target = k.lazy(64);
    must(k.bind(reserved, &target), "bind");
    let never = k.lazy(64);
    let big = k.lazy(128);
    let handed_over = |e: &ServerError| {
        io(e, |i| {
            matches!(
                i,
                IoError::NotFound {
                    reason: NotFoundReason::HandedOver,
                    ..
                }
            )
        })
    };
    expect_err(
        mode,
        "write to a reservation after bind",
        || c.write(s, &stale, &[0; 64]),
        handed_over,
    );
    expect_err(
        mode,
        "read of a reservation after bind",
        || c.read(s, &stale),
        handed_over,
    );
    expect_err(
        mode,
        "launch on a reservation after bind",
        || c.launch(s, TestKernel::Fill, 1, &[], &[&stale]),
        handed_over,
    );
    expect_err(
        mode,
        "read of a lazy handle never initialised",
        || c.read(s, &never),
        |e| {
            io(e, |i| {
                matches!(
                    i,
                    IoError::NotFound {
                        reason: NotFoundReason::NeverBound,
                        ..
                    }
                )
            })
        },
    );
    expect_err(
        mode,
        "bind of 64 bytes of room to a 128-byte handle",
        || {
            let mut k = c.dev.command(s)?;
            let r = k.reserve(64)?;
            k.bind(r, &big)
        },
        |e| io(e, |i| matches!(i, IoError::OutOfRange { .. })),
    );
    must(c.write(s, &target, &[9; 64]), "write to the bound handle");
    assert_eq!(
        must(c.read(s, &target), "read"),
        vec![9; 64],
        "[{mode}] bound handle"
    );

    // Ranges and lengths.
    assert!(
        matches!(mine.view(10, 60), Err(IoError::OutOfRange { .. })),
        "[{mode}] view past the end"
    );
    assert!(
        matches!(mine.view(u64::MAX, 2), Err(IoError::OutOfRange { .. })),
        "[{mode}] view overflow"
    );
    for len in [65, 63, 0] {
        expect_err(
            mode,
            &format!("write of {len} bytes into the whole view of 64"),
            || c.write(s, &mine, &vec![0; len]),
            |e| {
                matches!(
                    e,
                    ServerError::Validation(Validation::LengthMismatch { expected: 64, found })
                        if *found == len as u64
                )
            },
        );
    }
    expect_err(
        mode,
        "data shorter than its layout",
        || {
            c.dev
                .command(s)?
                .write_layout(&mine, HostBuffer::zeroed(10), CopyLayout::linear(11))
        },
        |e| {
            matches!(
                e,
                ServerError::Validation(Validation::LengthMismatch { .. })
            )
        },
    );
    expect_err(
        mode,
        "pitched read past the view",
        || {
            let layout = CopyLayout::of(&[4, 8], &[12, 1], 4).map_err(ServerError::from)?;
            c.dev
                .command(s)?
                .read_async(&[ReadRequest {
                    handle: &mine,
                    layout,
                }])
                .map(drop)
        },
        |e| {
            matches!(
                e,
                ServerError::Validation(Validation::LayoutPastView { .. })
            )
        },
    );

    // Strides.
    for (shape, strides) in [
        (&[4u64, 8][..], &[1u64, 4][..]),
        (&[4, 8], &[0, 1]),
        (&[4, 8], &[6, 1]),
        (&[2, 3, 8], &[40, 12, 1]),
        (&[4, 8], &[8][..]),
        (&[u64::MAX, 8], &[16, 1]),
        (&[8], &[2]),
    ] {
        assert!(
            matches!(
                CopyLayout::of(shape, strides, 4),
                Err(IoError::UnsupportedStrides { .. })
            ),
            "[{mode}] shape {shape:?} strides {strides:?} must be UnsupportedStrides"
        );
    }

    // Impossible sizes and streams.
    let total = c.dev.facts().total_memory;
    for size in [u64::MAX, u64::MAX - 255, total.saturating_mul(2), total + 1] {
        expect_err(
            mode,
            &format!("a reservation of {size} bytes"),
            || c.empty(s, size),
            |e| io(e, |i| matches!(i, IoError::BufferTooBig { .. })),
        );
    }
    expect_err(
        mode,
        "a stream past the limit",
        || c.dev.command(StreamId(u32::MAX)).map(drop),
        |e| {
            matches!(
                e,
                ServerError::Validation(Validation::StreamOutOfRange { .. })
            )
        },
    );

    // Still usable.
    assert_eq!(
        must(c.read(s, &mine), "read"),
        vec![1; 64],
        "[{mode}] device usable afterwards"
    );
    drop((mine, out, stale, target, never, big));
    c.assert_no_leak("bad_input");
    drop(foreign);
    other.assert_no_leak("bad_input (second device)");
}
