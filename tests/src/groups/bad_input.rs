//! Bad input: a table of named cases, one or more per operation, each an error of the right
//! kind with a message, never a panic, and the device usable and leak-free afterwards.

use crate::harness::{Harness, Mode, TestKernel};
use crate::util::{Ctx, must, small_pages};
use devcmd::error::NotFoundReason;
use devcmd::memory::PoolKind;
use devcmd::{
    CopyLayout, ExternalBytes, Handle, HostBuffer, HostOrigin, IoError, KernelParam, LaunchDims,
    LaunchError, ReadRequest, ServerError, StreamId, Validation,
};
use std::any::Any;
use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind};

const TIB: u64 = 1 << 40;
const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId(0);
const S1: StreamId = StreamId(1);

/// What a case answers: `Ok` when the operation behaved as the table says, otherwise what it
/// did instead.
type Check = Result<(), String>;

/// One named case: the operation and what it must answer.
struct Case<H: Harness> {
    name: &'static str,
    run: fn(&mut Fx<H>) -> Check,
}

/// A fresh device with the handles the cases need, and a second device for foreign handles.
struct Fx<H: Harness> {
    c: Ctx<H>,
    other: Ctx<H>,
    /// 64 bytes of 1 on stream 0; left as they are by every case.
    mine: Handle,
    /// 64 bytes on stream 0, for outputs.
    out: Handle,
    /// 64 bytes of 3 on stream 1.
    on_s1: Handle,
    /// 64 bytes of 2 on the other device.
    foreign: Handle,
    /// Room given away by `bind` (handed over).
    stale: Handle,
    /// The handle that got `stale`'s room.
    target: Handle,
    /// A lazy handle never initialised.
    never: Handle,
    /// Room of a device that was dropped since.
    orphan: Handle,
}

impl<H: Harness> Fx<H> {
    fn new(h: &H, mode: Mode) -> Option<Self> {
        let mut c = Ctx::new(h, mode, small_pages(), "bad_input")?;
        let mut other = Ctx::new(h, mode, small_pages(), "bad_input")?;
        let mine = must(c.create(S0, &[1; 64]), "create");
        let out = must(c.empty(S0, 64), "empty");
        let on_s1 = must(c.create(S1, &[3; 64]), "create on stream 1");
        let foreign = must(other.create(S0, &[2; 64]), "create on the other device");
        let mut k = must(c.dev.command(S0), "command");
        let room = must(k.reserve(64), "reserve");
        let stale = room.clone();
        let target = k.lazy(64);
        must(k.bind(room, &target), "bind");
        let never = k.lazy(64);
        let orphan = {
            let mut gone = Ctx::new(h, mode, small_pages(), "bad_input")?;
            let orphan = must(gone.empty(S0, 64), "empty on a device about to be dropped");
            drop(gone);
            orphan
        };
        Some(Self {
            c,
            other,
            mine,
            out,
            on_s1,
            foreign,
            stale,
            target,
            never,
            orphan,
        })
    }

    /// The device still works, then no leak on either device.
    fn finish(mut self, mode: Mode, name: &str) {
        let got = must(
            self.c.read(S0, &self.mine),
            format!("[{mode}] {name}: read afterwards"),
        );
        assert!(
            got == [1; 64],
            "[{mode}] {name}: after the refused call, a buffer written before it reads back \
             wrong ({}): the refusal changed device memory, or the read returned before its \
             copy landed (event_wait returned early) or copy_to_host moved the wrong bytes",
            crate::util::first_diff(&got, &[1; 64])
        );
        let Self {
            c,
            other,
            mine,
            out,
            on_s1,
            foreign,
            stale,
            target,
            never,
            orphan,
        } = self;
        drop((mine, out, on_s1, foreign, stale, target, never, orphan));
        c.assert_no_leak(name);
        other.assert_no_leak(&format!("{name} (second device)"));
    }
}

/// `r` is an error that `ok` accepts, with a message.
fn err<T: Debug>(
    r: Result<T, ServerError>,
    want: &str,
    ok: impl Fn(&ServerError) -> bool,
) -> Check {
    match r {
        Err(e) if ok(&e) && !e.to_string().is_empty() => Ok(()),
        Err(e) if ok(&e) => Err(format!("{e:?} has no message")),
        other => Err(format!("expected {want}, got {other:?}")),
    }
}

/// `r` succeeded.
fn fine<T>(r: Result<T, ServerError>) -> Result<T, String> {
    r.map_err(|e| format!("expected success, got {e:?} ({e})"))
}

fn io(e: &ServerError, f: impl Fn(&IoError) -> bool) -> bool {
    match e {
        ServerError::Io(i) => f(i),
        ServerError::Launch(LaunchError::Buffer { cause, .. }) => f(cause),
        _ => false,
    }
}

fn foreign(e: &ServerError) -> bool {
    io(e, |i| matches!(i, IoError::ForeignHandle { .. }))
}
fn not_found(e: &ServerError, why: NotFoundReason) -> bool {
    io(
        e,
        |i| matches!(i, IoError::NotFound { reason, .. } if *reason == why),
    )
}
fn handed_over(e: &ServerError) -> bool {
    not_found(e, NotFoundReason::HandedOver)
}
fn never_bound(e: &ServerError) -> bool {
    not_found(e, NotFoundReason::NeverBound)
}
fn too_big(e: &ServerError) -> bool {
    io(e, |i| matches!(i, IoError::BufferTooBig { .. }))
}
fn room_too_small(e: &ServerError) -> bool {
    io(e, |i| {
        matches!(
            i,
            IoError::RoomTooSmall {
                room: 64,
                needs: 128
            }
        )
    })
}
fn wrong_stream(e: &ServerError) -> bool {
    io(e, |i| matches!(i, IoError::WrongStream { .. }))
}
fn in_use(e: &ServerError) -> bool {
    io(e, |i| matches!(i, IoError::InUse { .. }))
}
fn past_view(e: &ServerError) -> bool {
    matches!(
        e,
        ServerError::Validation(Validation::LayoutPastView { .. })
    )
}
fn self_bind(e: &ServerError) -> bool {
    io(e, |i| matches!(i, IoError::SelfBind { .. }))
}
fn host_alloc_failed(e: &ServerError) -> bool {
    io(e, |i| matches!(i, IoError::HostAllocFailed { .. }))
}
fn launch_dims(e: &ServerError) -> bool {
    matches!(e, ServerError::Validation(Validation::LaunchDims { .. }))
}
fn launch_param(e: &ServerError) -> bool {
    matches!(e, ServerError::Validation(Validation::LaunchParam { .. }))
}
/// The refusal of an alias naming written buffer `output` and buffer `other`, by position.
fn aliased_pair(output: usize, other: usize) -> impl Fn(&ServerError) -> bool {
    move |e| {
        matches!(e, ServerError::Validation(Validation::AliasedLaunch { output: o, other: i, .. })
            if *o == output && *i == other)
    }
}
fn length_mismatch(e: &ServerError) -> bool {
    matches!(
        e,
        ServerError::Validation(Validation::LengthMismatch { .. })
    )
}

fn host_err(len: usize, pinned: bool, f: &mut Fx<impl Harness>) -> Check {
    let r =
        f.c.dev
            .command(S0)
            .and_then(|mut k| k.reserve_host(len, pinned));
    err(r, "HostAllocFailed", host_alloc_failed)
}

/// Reads `layout` of `handle` on stream 0 (the future is waited for): an error `ok` accepts.
fn read_layout(
    f: &mut Fx<impl Harness>,
    handle: &Handle,
    layout: CopyLayout,
    want: &str,
    ok: fn(&ServerError) -> bool,
) -> Check {
    let r =
        f.c.dev
            .command(S0)
            .and_then(|mut k| k.read_async(&[ReadRequest { handle, layout }]))
            .and_then(|future| future.wait());
    err(r, want, ok)
}

/// `CopyLayout::of` refuses the strides.
fn refused(shape: &[u64], strides: &[u64]) -> Check {
    match CopyLayout::of(shape, strides, 4) {
        Err(IoError::UnsupportedStrides { .. }) => Ok(()),
        other => Err(format!("expected UnsupportedStrides, got {other:?}")),
    }
}

/// A pitched layout: `height` rows of `width` bytes, `pitch` bytes apart.
fn pitched(height: u64, width: u64, pitch: u64) -> CopyLayout {
    CopyLayout::of(&[height, width], &[pitch, 1], 1).expect("a pitched layout")
}

/// Bytes the stream-0 pinned pool holds.
fn pinned_reserved(f: &mut Fx<impl Harness>) -> u64 {
    let report = f.c.dev.memory_report();
    report
        .streams
        .iter()
        .filter(|(id, _)| *id == S0)
        .flat_map(|(_, r)| r.pools.iter())
        .filter(|p| p.kind == PoolKind::PinnedHost)
        .map(|p| p.reserved)
        .sum()
}

/// A launch with the same memory as input and output: refused up front (one rule, in the
/// core), and the stream still usable.
fn aliased(f: &mut Fx<impl Harness>, input: (u64, u64), output: (u64, u64)) -> Check {
    let x = fine(f.c.create(S0, &[10; 64]))?;
    let i = x.view(input.0, input.1).map_err(|e| e.to_string())?;
    let o = x.view(output.0, output.1).map_err(|e| e.to_string())?;
    let r = f.c.launch(S0, TestKernel::AddByte, 1, &[&i], &[&o]);
    err(
        r,
        "AliasedLaunch { output: 1, other: 0 }",
        aliased_pair(1, 0),
    )?;
    fine(f.c.read(S0, &x)).and_then(|got| {
        (got == [10; 64])
            .then_some(())
            .ok_or(format!("read back {got:?}"))
    })
}

/// Read-only bytes for `read_into`.
struct Constant([u8; 64]);

// SAFETY: the bytes are a field of the boxed value: the same slice every call, alive and
// unchanged until it drops.
unsafe impl ExternalBytes for Constant {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
    fn origin(&self) -> HostOrigin {
        HostOrigin::Heap
    }
}

macro_rules! case {
    ($name:expr, $run:expr) => {
        Case {
            name: $name,
            run: $run,
        }
    };
}

/// The table.
fn cases<H: Harness>() -> Vec<Case<H>> {
    vec![
        // Streams: every operation starts with `command`.
        case!("command: stream u32::MAX", |f| err(
            f.c.dev.command(StreamId(u32::MAX)).map(drop),
            "StreamOutOfRange",
            |e| matches!(
                e,
                ServerError::Validation(Validation::StreamOutOfRange { .. })
            )
        )),
        case!("command: the first stream past the limit (16)", |f| err(
            f.c.dev.command(StreamId(16)).map(drop),
            "StreamOutOfRange",
            |e| matches!(
                e,
                ServerError::Validation(Validation::StreamOutOfRange { .. })
            )
        )),
        // reserve / empty / create.
        case!("reserve: u64::MAX bytes", |f| err(
            f.c.dev.command(S0).and_then(|mut k| k.reserve(u64::MAX)),
            "BufferTooBig",
            too_big
        )),
        case!("empty: u64::MAX bytes", |f| err(
            f.c.empty(S0, u64::MAX),
            "BufferTooBig",
            too_big
        )),
        case!(
            "empty: u64::MAX - 255 bytes (alignment overflows)",
            |f| err(f.c.empty(S0, u64::MAX - 255), "BufferTooBig", too_big)
        ),
        case!("empty: 1 TiB", |f| err(
            f.c.empty(S0, TIB),
            "BufferTooBig",
            too_big
        )),
        case!("empty: the device's memory + 1", |f| {
            let total = f.c.dev.facts().total_memory;
            err(f.c.empty(S0, total + 1), "BufferTooBig", too_big)
        }),
        case!("empty: zero bytes (defined: succeeds)", |f| {
            let h = fine(f.c.empty(S0, 0))?;
            fine(f.c.read(S0, &h)).and_then(|b| {
                b.is_empty()
                    .then_some(())
                    .ok_or(format!("{} bytes", b.len()))
            })
        }),
        case!("create: no bytes (defined: succeeds)", |f| {
            let h = fine(f.c.create(S1, &[]))?;
            h.is_empty()
                .then_some(())
                .ok_or(format!("{} bytes", h.len()))
        }),
        // lazy / initialize.
        case!("initialize: a lazy handle of u64::MAX bytes", |f| err(
            f.c.dev.command(S0).and_then(|mut k| {
                let h = k.lazy(u64::MAX);
                k.initialize(&h)
            }),
            "BufferTooBig",
            too_big
        )),
        case!("initialize: a lazy handle of 1 TiB", |f| err(
            f.c.dev.command(S0).and_then(|mut k| {
                let h = k.lazy(TIB);
                k.initialize(&h)
            }),
            "BufferTooBig",
            too_big
        )),
        case!(
            "initialize: a lazy handle of zero bytes (defined: succeeds)",
            |f| fine(f.c.dev.command(S0).and_then(|mut k| {
                let h = k.lazy(0);
                k.initialize(&h)
            }))
        ),
        case!("initialize: a foreign handle", |f| {
            let h = f.foreign.clone();
            err(
                f.c.dev.command(S0).and_then(|mut k| k.initialize(&h)),
                "ForeignHandle",
                foreign,
            )
        }),
        case!("initialize: a handle of another stream", |f| {
            let h = f.never.clone();
            err(
                f.c.dev.command(S1).and_then(|mut k| k.initialize(&h)),
                "WrongStream",
                wrong_stream,
            )
        }),
        case!("initialize: a handle another stream's work uses", |f| {
            let dst = f.on_s1.clone();
            let x = fine(f.c.create(S0, &[4; 64]))?;
            fine(f.c.launch(S1, TestKernel::AddByte, 1, &[&x], &[&dst]))?;
            err(
                f.c.dev.command(S0).and_then(|mut k| k.initialize(&x)),
                "InUse",
                in_use,
            )
        }),
        // bind.
        case!("bind: a foreign target", |f| {
            let h = f.foreign.clone();
            err(
                f.c.dev.command(S0).and_then(|mut k| {
                    let r = k.reserve(64)?;
                    k.bind(r, &h)
                }),
                "ForeignHandle",
                foreign,
            )
        }),
        case!("bind: foreign room", |f| {
            let room = fine(f.other.dev.command(S0).and_then(|mut k| k.reserve(64)))?;
            let t = f.never.clone();
            err(
                f.c.dev.command(S0).and_then(|mut k| k.bind(room, &t)),
                "ForeignHandle",
                foreign,
            )
        }),
        case!("bind: stale room (handed over by an earlier bind)", |f| {
            let (room, t) = (f.stale.clone(), f.never.clone());
            err(
                f.c.dev.command(S0).and_then(|mut k| k.bind(room, &t)),
                "NotFound(HandedOver)",
                handed_over,
            )
        }),
        case!("bind: room never bound (a lazy handle)", |f| err(
            f.c.dev.command(S0).and_then(|mut k| {
                let (room, t) = (k.lazy(64), k.lazy(64));
                k.bind(room, &t)
            }),
            "NotFound(NeverBound)",
            never_bound
        )),
        case!("bind: 64 bytes of room to a 128-byte handle", |f| err(
            f.c.dev.command(S0).and_then(|mut k| {
                let (room, t) = (k.reserve(64)?, k.lazy(128));
                k.bind(room, &t)
            }),
            "RoomTooSmall",
            room_too_small
        )),
        case!("bind: room of another stream", |f| {
            let room = fine(f.c.dev.command(S1).and_then(|mut k| k.reserve(64)))?;
            let t = f.never.clone();
            err(
                f.c.dev.command(S0).and_then(|mut k| k.bind(room, &t)),
                "WrongStream",
                wrong_stream,
            )
        }),
        case!("bind: a target of another stream", |f| {
            let t = f.never.clone();
            err(
                f.c.dev.command(S1).and_then(|mut k| {
                    let room = k.reserve(64)?;
                    k.bind(room, &t)
                }),
                "WrongStream",
                wrong_stream,
            )
        }),
        case!("bind: a target another stream's work uses", |f| {
            let dst = f.on_s1.clone();
            let x = fine(f.c.create(S0, &[4; 64]))?;
            fine(f.c.launch(S1, TestKernel::AddByte, 1, &[&x], &[&dst]))?;
            err(
                f.c.dev.command(S0).and_then(|mut k| {
                    let room = k.reserve(64)?;
                    k.bind(room, &x)
                }),
                "InUse",
                in_use,
            )
        }),
        case!(
            "bind: fresh room to an idle handle that has memory (defined: succeeds)",
            |f| {
                let t = f.target.clone();
                fine(f.c.dev.command(S0).and_then(|mut k| {
                    let room = k.reserve(64)?;
                    k.bind(room, &t)
                }))?;
                fine(f.c.write(S0, &t, &[6; 64]))?;
                let got = fine(f.c.read(S1, &t))?;
                (got == [6; 64])
                    .then_some(())
                    .ok_or(format!("read back {got:?}"))
            }
        ),
        case!("bind: a handle to itself", |f| {
            let x = fine(f.c.create(S0, &[4; 64]))?;
            err(
                f.c.dev.command(S0).and_then(|mut k| k.bind(x.clone(), &x)),
                "SelfBind",
                self_bind,
            )
        }),
        case!("bind: a handle to a view of itself", |f| {
            let x = fine(f.c.create(S0, &[4; 64]))?;
            let v = x.view(8, 16).map_err(|e| e.to_string())?;
            err(
                f.c.dev.command(S0).and_then(|mut k| k.bind(x.clone(), &v)),
                "SelfBind",
                self_bind,
            )
        }),
        // write / write_from / write_layout.
        case!("write: a foreign handle", |f| {
            let h = f.foreign.clone();
            err(f.c.write(S0, &h, &[0; 64]), "ForeignHandle", foreign)
        }),
        case!("write: a handle of a device dropped since", |f| {
            let h = f.orphan.clone();
            err(f.c.write(S0, &h, &[0; 64]), "ForeignHandle", foreign)
        }),
        case!("read_async: a handle of a device dropped since", |f| {
            let h = f.orphan.clone();
            err(f.c.read(S1, &h), "ForeignHandle", foreign)
        }),
        case!("launch: a handle of a device dropped since", |f| {
            let h = f.orphan.clone();
            err(
                f.c.launch(S0, TestKernel::Fill, 1, &[], &[&h]),
                "ForeignHandle",
                foreign,
            )
        }),
        case!("write: stale room (handed over)", |f| {
            let h = f.stale.clone();
            err(
                f.c.write(S0, &h, &[0; 64]),
                "NotFound(HandedOver)",
                handed_over,
            )
        }),
        case!("write: a lazy handle never initialised", |f| {
            let h = f.never.clone();
            err(
                f.c.write(S1, &h, &[0; 64]),
                "NotFound(NeverBound)",
                never_bound,
            )
        }),
        case!("write: 65 bytes into 64", |f| {
            let h = f.out.clone();
            err(
                f.c.write(S0, &h, &[0; 65]),
                "LengthMismatch",
                length_mismatch,
            )
        }),
        case!("write: 63 bytes into the whole view of 64", |f| {
            let h = f.out.clone();
            err(
                f.c.write(S0, &h, &[0; 63]),
                "LengthMismatch",
                length_mismatch,
            )
        }),
        case!("write: no bytes into the whole view of 64", |f| {
            let h = f.out.clone();
            err(f.c.write(S0, &h, &[]), "LengthMismatch", length_mismatch)
        }),
        case!("write_from: a foreign handle", |f| {
            let h = f.foreign.clone();
            err(
                f.c.dev
                    .command(S1)
                    .and_then(|mut k| k.write_from(&h, &[0; 64])),
                "ForeignHandle",
                foreign,
            )
        }),
        case!("write_from: 65 bytes into 64", |f| {
            let h = f.out.clone();
            err(
                f.c.dev
                    .command(S0)
                    .and_then(|mut k| k.write_from(&h, &[0; 65])),
                "LengthMismatch",
                length_mismatch,
            )
        }),
        case!("write_layout: data shorter than its layout", |f| {
            let h = f.out.clone();
            err(
                f.c.dev.command(S0).and_then(|mut k| {
                    k.write_layout(&h, HostBuffer::zeroed(10), CopyLayout::linear(11))
                }),
                "LengthMismatch",
                length_mismatch,
            )
        }),
        case!("write_layout: a layout of u64::MAX bytes", |f| {
            let h = f.out.clone();
            err(
                f.c.dev.command(S0).and_then(|mut k| {
                    k.write_layout(&h, HostBuffer::zeroed(64), CopyLayout::linear(u64::MAX))
                }),
                "LengthMismatch",
                length_mismatch,
            )
        }),
        case!(
            "write_layout: a pitched layout one byte past the view",
            |f| {
                let h = f.out.clone();
                // 4 rows of 8 bytes, 19 apart: 3 * 19 + 8 = 65 bytes.
                err(
                    f.c.dev.command(S0).and_then(|mut k| {
                        k.write_layout(&h, HostBuffer::zeroed(32), pitched(4, 8, 19))
                    }),
                    "LayoutPastView",
                    past_view,
                )
            }
        ),
        case!("write_layout: a pitched layout spanning 1 TiB", |f| {
            let h = f.out.clone();
            err(
                f.c.dev.command(S0).and_then(|mut k| {
                    k.write_layout(&h, HostBuffer::zeroed(2), pitched(2, 1, TIB))
                }),
                "LayoutPastView",
                past_view,
            )
        }),
        case!(
            "write_layout: a pitched layout into a view past its end",
            |f| {
                let h = f.out.view(40, 24).map_err(|e| e.to_string())?;
                err(
                    f.c.dev.command(S0).and_then(|mut k| {
                        // 2 rows of 8 bytes, 17 apart: 25 bytes of a 24-byte view.
                        k.write_layout(&h, HostBuffer::zeroed(16), pitched(2, 8, 17))
                    }),
                    "LayoutPastView",
                    past_view,
                )
            }
        ),
        // read_async / read_into.
        case!("read_async: a foreign handle", |f| {
            let h = f.foreign.clone();
            err(f.c.read(S0, &h), "ForeignHandle", foreign)
        }),
        case!("read_async: stale room (handed over)", |f| {
            let h = f.stale.clone();
            err(f.c.read(S1, &h), "NotFound(HandedOver)", handed_over)
        }),
        case!("read_async: a lazy handle never initialised", |f| {
            let h = f.never.clone();
            err(f.c.read(S0, &h), "NotFound(NeverBound)", never_bound)
        }),
        case!("read_async: 65 bytes of a 64-byte handle", |f| {
            let h = f.mine.clone();
            read_layout(f, &h, CopyLayout::linear(65), "LayoutPastView", past_view)
        }),
        case!("read_async: a pitched layout one byte past the view", |f| {
            let h = f.mine.clone();
            err(
                f.c.dev.command(S0).and_then(|mut k| {
                    k.read_async(&[ReadRequest {
                        handle: &h,
                        layout: pitched(4, 8, 19),
                    }])
                    .map(drop)
                }),
                "LayoutPastView",
                past_view,
            )
        }),
        case!("read_async: a pitched layout spanning 1 TiB", |f| {
            let h = f.mine.clone();
            err(
                f.c.dev.command(S0).and_then(|mut k| {
                    k.read_async(&[ReadRequest {
                        handle: &h,
                        layout: pitched(2, 1, TIB),
                    }])
                    .map(drop)
                }),
                "LayoutPastView",
                past_view,
            )
        }),
        case!(
            "read_async: a layout of u64::MAX bytes on a 64-byte handle",
            |f| {
                let h = f.mine.clone();
                read_layout(
                    f,
                    &h,
                    CopyLayout::linear(u64::MAX),
                    "LayoutPastView",
                    past_view,
                )
            }
        ),
        case!("read_async: a layout of 1 TiB on a 64-byte handle", |f| {
            let h = f.mine.clone();
            read_layout(f, &h, CopyLayout::linear(TIB), "LayoutPastView", past_view)
        }),
        case!(
            "read_async: a layout of 200 MiB on a 64-byte handle pins nothing",
            |f| {
                let h = f.mine.clone();
                let before = pinned_reserved(f);
                read_layout(
                    f,
                    &h,
                    CopyLayout::linear(200 * MIB),
                    "LayoutPastView",
                    past_view,
                )?;
                let after = pinned_reserved(f);
                (after <= before)
                    .then_some(())
                    .ok_or(format!("pinned bytes held went from {before} to {after}"))
            }
        ),
        case!("read_async: a bad request after a good one", |f| {
            let (a, b) = (f.mine.clone(), f.out.clone());
            err(
                f.c.dev.command(S0).and_then(|mut k| {
                    k.read_async(&[
                        ReadRequest::whole(&a),
                        ReadRequest {
                            handle: &b,
                            layout: CopyLayout::linear(65),
                        },
                    ])
                    .map(drop)
                }),
                "LayoutPastView",
                past_view,
            )
        }),
        case!(
            "read_async: an empty layout (defined: reads nothing)",
            |f| {
                let h = f.mine.clone();
                let got = fine(
                    f.c.dev
                        .command(S0)
                        .and_then(|mut k| {
                            k.read_async(&[ReadRequest {
                                handle: &h,
                                layout: CopyLayout::linear(0),
                            }])
                        })
                        .and_then(|future| future.wait()),
                )?;
                (got.len() == 1 && got[0].is_empty())
                    .then_some(())
                    .ok_or(format!("{got:?}"))
            }
        ),
        case!("read_into: a read-only destination", |f| {
            let h = f.mine.clone();
            let mut dst = HostBuffer::external(Box::new(Constant([0; 64])));
            err(
                f.c.dev.command(S0).and_then(|mut k| {
                    // SAFETY: the read is refused before anything is enqueued.
                    unsafe { k.read_into(ReadRequest::whole(&h), &mut dst) }
                }),
                "ReadOnlyDestination",
                |e| matches!(e, ServerError::Validation(Validation::ReadOnlyDestination)),
            )
        }),
        case!("read_into: a destination shorter than the layout", |f| {
            let h = f.mine.clone();
            let mut dst = HostBuffer::zeroed(63);
            err(
                f.c.dev.command(S0).and_then(|mut k| {
                    // SAFETY: the read is refused before anything is enqueued.
                    unsafe { k.read_into(ReadRequest::whole(&h), &mut dst) }
                }),
                "LengthMismatch",
                length_mismatch,
            )
        }),
        // launch.
        case!("launch: a foreign input", |f| {
            let (i, o) = (f.foreign.clone(), f.out.clone());
            err(
                f.c.launch(S0, TestKernel::AddByte, 1, &[&i], &[&o]),
                "ForeignHandle",
                foreign,
            )
        }),
        case!("launch: a foreign output", |f| {
            let (i, o) = (f.mine.clone(), f.foreign.clone());
            err(
                f.c.launch(S1, TestKernel::AddByte, 1, &[&i], &[&o]),
                "ForeignHandle",
                foreign,
            )
        }),
        case!("launch: stale room (handed over) as output", |f| {
            let o = f.stale.clone();
            err(
                f.c.launch(S0, TestKernel::Fill, 1, &[], &[&o]),
                "NotFound(HandedOver)",
                handed_over,
            )
        }),
        case!("launch: a lazy handle never initialised as input", |f| {
            let (i, o) = (f.never.clone(), f.on_s1.clone());
            err(
                f.c.launch(S1, TestKernel::AddByte, 1, &[&i], &[&o]),
                "NotFound(NeverBound)",
                never_bound,
            )
        }),
        case!("launch: the same handle as input and output", |f| aliased(
            f,
            (0, 64),
            (0, 64)
        )),
        case!(
            "launch: overlapping views of one handle as input and output",
            |f| aliased(f, (0, 48), (16, 48))
        ),
        case!("launch: the same handle as two outputs", |f| {
            let o = fine(f.c.empty(S0, 64))?;
            let r = f.c.launch(S0, TestKernel::Fill, 1, &[], &[&o, &o]);
            err(
                r,
                "AliasedLaunch { output: 0, other: 1 }",
                aliased_pair(0, 1),
            )?;
            fine(f.c.sync(S0))
        }),
        case!(
            "launch: an output aliasing an input beside a handle that names no memory",
            |f| {
                // The alias is refused first, whatever the other handles name (the engine
                // resolves before it compares, and must still answer the alias).
                let (never, o) = (f.never.clone(), fine(f.c.empty(S0, 64))?);
                let r = f.c.launch(S0, TestKernel::AddByte, 1, &[&never, &o], &[&o]);
                err(
                    r,
                    "AliasedLaunch { output: 2, other: 1 }",
                    aliased_pair(2, 1),
                )?;
                fine(f.c.sync(S0))
            }
        ),
        case!("launch: a grid with a zero extent", |f| {
            let o = fine(f.c.empty(S0, 64))?;
            let mut dims = LaunchDims::covering(64, 32);
            dims.grid.y = 0;
            let v = 1u32.to_ne_bytes();
            let params = [KernelParam::Buffer(0), KernelParam::Scalar(&v)];
            let r =
                f.c.launch_raw(S0, TestKernel::Fill, dims, &[], &[&o], &params);
            err(r, "LaunchDims", launch_dims)?;
            fine(f.c.sync(S0))
        }),
        case!("launch: a block of zero threads", |f| {
            let o = fine(f.c.empty(S0, 64))?;
            let dims = LaunchDims::linear(1, 0);
            let r = f.c.launch_raw(S0, TestKernel::Fill, dims, &[], &[&o], &[]);
            err(r, "LaunchDims", launch_dims)?;
            fine(f.c.sync(S0))
        }),
        case!(
            "launch: a parameter naming a buffer slot past the launch's",
            |f| {
                let o = fine(f.c.empty(S0, 64))?;
                let v = 1u32.to_ne_bytes();
                let params = [KernelParam::Buffer(1), KernelParam::Scalar(&v)];
                let dims = LaunchDims::covering(64, 32);
                let r =
                    f.c.launch_raw(S0, TestKernel::Fill, dims, &[], &[&o], &params);
                err(r, "LaunchParam", launch_param)?;
                fine(f.c.sync(S0))
            }
        ),
        case!("launch: empty views (defined: succeeds)", |f| {
            let (i, o) = (
                f.mine.view(64, 0).map_err(|e| e.to_string())?,
                f.out.view(0, 0).map_err(|e| e.to_string())?,
            );
            fine(f.c.launch(S0, TestKernel::AddByte, 1, &[&i], &[&o]))
        }),
        // resource / managed_resource.
        case!("resource: a foreign handle", |f| {
            let h = f.foreign.clone();
            err(
                f.c.dev
                    .command(S0)
                    .and_then(|mut k| k.resource(&h).map_err(Into::into)),
                "ForeignHandle",
                foreign,
            )
        }),
        case!("resource: stale room (handed over)", |f| {
            let h = f.stale.clone();
            err(
                f.c.dev
                    .command(S0)
                    .and_then(|mut k| k.resource(&h).map_err(Into::into)),
                "NotFound(HandedOver)",
                handed_over,
            )
        }),
        case!("resource: a lazy handle never initialised", |f| {
            let h = f.never.clone();
            err(
                f.c.dev
                    .command(S1)
                    .and_then(|mut k| k.resource(&h).map_err(Into::into)),
                "NotFound(NeverBound)",
                never_bound,
            )
        }),
        case!("managed_resource: a foreign handle", |f| {
            let h = f.foreign.clone();
            err(
                f.c.dev
                    .command(S0)
                    .and_then(|mut k| k.managed_resource(&h).map_err(Into::into)),
                "ForeignHandle",
                foreign,
            )
        }),
        // reserve_host.
        case!("reserve_host: usize::MAX bytes, pinned", |f| host_err(
            usize::MAX,
            true,
            f
        )),
        case!("reserve_host: usize::MAX bytes, heap", |f| host_err(
            usize::MAX,
            false,
            f
        )),
        case!(
            "reserve_host: 1 TiB, heap (an error, or a buffer where the host grants it)",
            |f| {
                let mut k = fine(f.c.dev.command(S0))?;
                match k.reserve_host(TIB as usize, false) {
                    Err(e) if host_alloc_failed(&e) => Ok(()),
                    Err(e) => Err(format!("expected HostAllocFailed, got {e:?}")),
                    Ok(b) if b.len() as u64 != TIB => Err(format!("{} bytes", b.len())),
                    Ok(_) => Ok(()),
                }
            }
        ),
        case!("reserve_host: zero bytes (defined: succeeds)", |f| {
            let mut k = fine(f.c.dev.command(S0))?;
            let b = k.reserve_host(0, true).map_err(|e| e.to_string())?;
            b.is_empty()
                .then_some(())
                .ok_or(format!("{} bytes", b.len()))
        }),
        // Views.
        case!("view: past the end", |f| match f.mine.view(10, 60) {
            Err(IoError::OutOfRange { .. }) => Ok(()),
            other => Err(format!("expected OutOfRange, got {other:?}")),
        }),
        case!(
            "view: offset u64::MAX (overflows)",
            |f| match f.mine.view(u64::MAX, 2) {
                Err(IoError::OutOfRange { .. }) => Ok(()),
                other => Err(format!("expected OutOfRange, got {other:?}")),
            }
        ),
        case!("view: of a view, past that view's end", |f| {
            let v = f.mine.view(32, 32).map_err(|e| e.to_string())?;
            match v.view(16, 17) {
                Err(IoError::OutOfRange { .. }) => Ok(()),
                other => Err(format!("expected OutOfRange, got {other:?}")),
            }
        }),
        // Layouts the core cannot copy (misaligned, overlapping or overflowing strides).
        case!("CopyLayout::of: column-major", |_| refused(
            &[4, 8],
            &[1, 4]
        )),
        case!("CopyLayout::of: a zero row stride", |_| refused(
            &[4, 8],
            &[0, 1]
        )),
        case!(
            "CopyLayout::of: rows that overlap (stride below the width)",
            |_| { refused(&[4, 8], &[6, 1]) }
        ),
        case!(
            "CopyLayout::of: outer dimension not packed over the rows",
            |_| { refused(&[2, 3, 8], &[40, 12, 1]) }
        ),
        case!(
            "CopyLayout::of: fewer strides than dimensions",
            |_| refused(&[4, 8], &[8])
        ),
        case!("CopyLayout::of: u64::MAX rows (overflows)", |_| refused(
            &[u64::MAX, 8],
            &[16, 1]
        )),
        case!(
            "CopyLayout::of: a row stride of u64::MAX (span overflows)",
            |_| { refused(&[2, 1], &[u64::MAX, 1]) }
        ),
        case!("CopyLayout::of: elements not contiguous", |_| refused(
            &[8],
            &[2]
        )),
    ]
}

fn message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// The bad-input group: every case of the table on a fresh device (and a second one for
/// foreign handles), in `mode`. Each must answer as the table says (an error of the named kind
/// with a message; zero sizes are defined and succeed), never panic, and leave the device usable
/// with nothing leaked. The operations: `command`, `reserve`, `empty`, `create`, `lazy` +
/// `initialize`, `bind`, `write`, `write_from`, `write_layout`, `read_async`, `read_into`,
/// `launch`, `resource`, `managed_resource`, `reserve_host`, handle views and
/// `CopyLayout::of`; the inputs: zero sizes, `u64::MAX`, 1 TiB, past the end, pitched layouts
/// past the view or with strides the core cannot copy, foreign handles, handles of a device
/// dropped since, stale (handed-over) and never-bound handles, handles of another stream or in
/// use, self-binds and aliased launches.
///
/// Each case runs under `catch_unwind`, so a panic fails the group with the case's name.
pub fn bad_input<H: Harness>(h: &H, mode: Mode) {
    for case in cases::<H>() {
        let Some(mut fx) = Fx::new(h, mode) else {
            return;
        };
        match catch_unwind(AssertUnwindSafe(|| (case.run)(&mut fx))) {
            Ok(Ok(())) => fx.finish(mode, case.name),
            Ok(Err(m)) => panic!("[{mode}] bad input `{}`: {m}", case.name),
            Err(panic) => panic!(
                "[{mode}] bad input `{}` panicked: {}",
                case.name,
                message(&*panic)
            ),
        }
    }
}
