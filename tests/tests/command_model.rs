//! Model-based property test of [`Command`] over three streams, and the regression tests of the
//! cross-stream order of `bind`.
//!
//! Owns the random-operation test: every operation of a command (`create`, `empty`, `lazy`,
//! `reserve`, `bind`, `initialize`, views, `write`, `write_from`, `write_layout` of sub-ranges and
//! pitched layouts, `read_async` whole and pitched, held or waited at once, `launch` of the suite's
//! fill and add kernels, `sync`, `flush_drops`, `poll_drops`, `memory_cleanup`, allocation modes,
//! drops of handles and of pending reads) on a random stream of three, so handles cross streams all
//! the time. The device is `devcmd-std` in lazy + poison mode: a stream runs nothing until a fence
//! of it is waited on, so any missing cross-stream order shows as wrong bytes, and freed memory is
//! poisoned, so an early free does too. The model is a plain byte vector per allocation (`None`
//! where nothing defined was written); every byte a read returns is checked against it, and every
//! error against the model's expectation (an operation on a lazy or handed-over handle, a bind on
//! another stream, a bind of too little room, a rebind of memory in use). At the end every handle
//! is dropped and every stream cleaned up: nothing may stay in use, and the shim gets every page
//! back.
//!
//! The inputs of the defects issue 7 found are part of every case: a bind of room another stream
//! used (ordered after that use, never refused), a self-bind (`SelfBind`), a launch whose output
//! overlaps its input (`AliasedLaunch`; disjoint views of one allocation are fine).
//!
//! Case counts: `DEVCMD_PROPTEST_CASES` (default 256).

use devcmd::error::NotFoundReason;
use devcmd::{
    AllocationMode, Command, CopyLayout, Device, DeviceConfig, DropPolicy, Handle, HostBuffer,
    IoError, Launch, LaunchDims, LaunchError, ReadFuture, ReadRequest, ServerError, StreamId,
    Validation,
};
use devcmd_std::{StdKernel, StdShim};
use devcmd_tests::{Harness, Mode, StdHarness, TestArgs, TestKernel};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const STREAMS: u8 = 3;
/// Reads held at once before the oldest is waited for.
const MAX_PENDING: usize = 4;

/// Cases per property: `DEVCMD_PROPTEST_CASES`, or `default`.
fn cases(default: u32) -> u32 {
    std::env::var("DEVCMD_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// Operations

/// A sub-range of a view, from raw numbers (so shrinking keeps it valid).
#[derive(Debug, Clone, Copy)]
struct Sel {
    whole: bool,
    a: u32,
    b: u32,
}

impl Sel {
    /// `(offset, len)` inside a view of `n` bytes.
    fn of(self, n: u64) -> (u64, u64) {
        if self.whole || n == 0 {
            return (0, n);
        }
        let off = u64::from(self.a) % (n + 1);
        let len = u64::from(self.b) % (n - off + 1);
        (off, len)
    }
}

/// A pitched layout inside a view, from raw numbers.
#[derive(Debug, Clone, Copy)]
struct Geom {
    a: u32,
    b: u32,
    c: u32,
    d: u32,
}

/// Where a layout lies in a view: the first row at `offset`, `height` rows of `width` bytes,
/// `pitch` bytes apart.
#[derive(Debug, Clone, Copy)]
struct Rows {
    offset: u64,
    width: u64,
    pitch: u64,
    height: u64,
}

impl Rows {
    fn layout(&self) -> CopyLayout {
        if self.height == 0 {
            return CopyLayout::linear(0);
        }
        CopyLayout::of(&[self.height, self.width], &[self.pitch, 1], 1)
            .expect("a row-major pitched layout")
    }

    /// Bytes the device side spans.
    fn span(&self) -> u64 {
        self.layout().device_span()
    }

    /// The byte ranges of the rows, from the start of the view.
    fn ranges(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.height).map(|r| {
            let start = (self.offset + r * self.pitch) as usize;
            (start, start + self.width as usize)
        })
    }
}

impl Geom {
    fn of(self, n: u64) -> Rows {
        if n == 0 {
            return Rows {
                offset: 0,
                width: 0,
                pitch: 0,
                height: 0,
            };
        }
        let offset = u64::from(self.a) % n;
        let room = n - offset;
        let width = 1 + u64::from(self.b) % room;
        let pitch = width + u64::from(self.c) % (room - width + 1);
        let max_height = (room - width) / pitch + 1;
        let height = 1 + u64::from(self.d) % max_height;
        Rows {
            offset,
            width,
            pitch,
            height,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    Fill,
    Add,
}

#[derive(Debug, Clone)]
enum Op {
    Create {
        s: u8,
        len: u64,
        seed: u8,
    },
    Empty {
        s: u8,
        len: u64,
    },
    Lazy {
        s: u8,
        len: u64,
    },
    Reserve {
        s: u8,
        len: u64,
    },
    /// `fit`: on the stream that owns the handle (otherwise on `s`).
    Initialize {
        s: u8,
        h: usize,
        fit: bool,
    },
    /// `fit`: room with memory, on its owner's stream, to a handle of that stream it can hold
    /// (otherwise any two handles, on `s`).
    Bind {
        s: u8,
        reserved: usize,
        target: usize,
        fit: bool,
    },
    Write {
        s: u8,
        h: usize,
        sel: Sel,
        seed: u8,
        borrowed: bool,
    },
    WriteLayout {
        s: u8,
        h: usize,
        geom: Geom,
        seed: u8,
    },
    /// Reads of handles (`None`: a sub-range, packed; `Some`: a pitched layout); held as a
    /// pending read or waited for at once.
    Read {
        s: u8,
        requests: Vec<(usize, Sel, Option<Geom>)>,
        hold: bool,
    },
    /// Waits for a pending read and checks it, or (`drop_only`) drops it unread.
    FinishRead {
        i: usize,
        drop_only: bool,
    },
    Launch {
        s: u8,
        kernel: Kernel,
        value: u8,
        input: (usize, Sel),
        output: (usize, Sel),
        /// A second output (fill only).
        second: Option<(usize, Sel)>,
        /// The output is the input's view itself.
        alias: bool,
    },
    Sync {
        s: u8,
    },
    Flush {
        s: u8,
    },
    Poll {
        s: u8,
    },
    Cleanup {
        s: u8,
    },
    /// Keeps a view of a handle as a handle of its own.
    View {
        h: usize,
        sel: Sel,
    },
    Drop {
        h: usize,
    },
    Mode {
        s: u8,
        mode: AllocationMode,
    },
}

fn len() -> impl Strategy<Value = u64> {
    prop_oneof![
        12 => 1..600u64,
        1 => Just(0u64),
        2 => 4_000..70_000u64,
        1 => 200_000..300_000u64,
    ]
}

fn sel() -> impl Strategy<Value = Sel> {
    (any::<bool>(), any::<u32>(), any::<u32>()).prop_map(|(whole, a, b)| Sel { whole, a, b })
}

fn geom() -> impl Strategy<Value = Geom> {
    (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(a, b, c, d)| Geom {
        a,
        b,
        c,
        d,
    })
}

fn stream() -> impl Strategy<Value = u8> {
    0..STREAMS
}

fn op() -> impl Strategy<Value = Op> {
    let handle = any::<usize>();
    prop_oneof![
        6 => (stream(), len(), any::<u8>()).prop_map(|(s, len, seed)| Op::Create { s, len, seed }),
        2 => (stream(), len()).prop_map(|(s, len)| Op::Empty { s, len }),
        2 => (stream(), len()).prop_map(|(s, len)| Op::Lazy { s, len }),
        2 => (stream(), len()).prop_map(|(s, len)| Op::Reserve { s, len }),
        3 => (stream(), handle, proptest::bool::weighted(0.8))
            .prop_map(|(s, h, fit)| Op::Initialize { s, h, fit }),
        4 => (stream(), handle, handle, proptest::bool::weighted(0.8))
            .prop_map(|(s, reserved, target, fit)| Op::Bind { s, reserved, target, fit }),
        6 => (stream(), handle, sel(), any::<u8>(), any::<bool>())
            .prop_map(|(s, h, sel, seed, borrowed)| Op::Write { s, h, sel, seed, borrowed }),
        3 => (stream(), handle, geom(), any::<u8>())
            .prop_map(|(s, h, geom, seed)| Op::WriteLayout { s, h, geom, seed }),
        8 => (
            stream(),
            proptest::collection::vec((handle, sel(), proptest::option::of(geom())), 1..3),
            any::<bool>(),
        )
            .prop_map(|(s, requests, hold)| Op::Read { s, requests, hold }),
        2 => (handle, proptest::bool::weighted(0.2))
            .prop_map(|(i, drop_only)| Op::FinishRead { i, drop_only }),
        8 => (
            stream(),
            prop_oneof![1 => Just(Kernel::Fill), 3 => Just(Kernel::Add)],
            any::<u8>(),
            (handle, sel()),
            (handle, sel()),
            proptest::option::weighted(0.2, (handle, sel())),
            proptest::bool::weighted(0.1),
        )
            .prop_map(|(s, kernel, value, input, output, second, alias)| Op::Launch {
                s,
                kernel,
                value,
                input,
                output,
                second,
                alias,
            }),
        2 => stream().prop_map(|s| Op::Sync { s }),
        1 => stream().prop_map(|s| Op::Flush { s }),
        1 => stream().prop_map(|s| Op::Poll { s }),
        1 => stream().prop_map(|s| Op::Cleanup { s }),
        2 => (handle, sel()).prop_map(|(h, sel)| Op::View { h, sel }),
        4 => handle.prop_map(|h| Op::Drop { h }),
        1 => (
            stream(),
            prop_oneof![
                2 => Just(AllocationMode::Auto),
                1 => Just(AllocationMode::Persistent),
                1 => Just(AllocationMode::Dedicated),
            ]
        )
            .prop_map(|(s, mode)| Op::Mode { s, mode }),
    ]
}

// ---------------------------------------------------------------------------------------------
// The model

/// Whether an allocation has memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mem {
    /// From `lazy`: no memory yet.
    Lazy,
    /// Memory it owns.
    Bound,
    /// Its room was given to another handle by `bind`.
    HandedOver,
}

#[derive(Debug)]
struct Alloc {
    owner: u8,
    size: u64,
    mem: Mem,
    /// The room it holds, byte by byte: what each must read as (`None`: anything). Empty without
    /// memory; longer than `size` when `bind` gave it more room than it asked for (the room
    /// keeps its size, and goes whole to a handle it is bound to next).
    bytes: Vec<Option<u8>>,
    /// Named by an operation on a stream other than its owner.
    foreign_used: bool,
}

/// A user handle (a whole allocation or a view of it) and its allocation in the model.
struct Held {
    alloc: usize,
    handle: Handle,
}

struct Pending {
    future: ReadFuture<StdShim>,
    expected: Vec<Vec<Option<u8>>>,
    what: String,
}

/// An error the model can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    NeverBound,
    HandedOver,
    WrongStream,
    OutOfRange,
    RoomTooSmall,
    InUse,
    SelfBind,
    Aliased,
}

fn kind(e: &ServerError) -> Option<Kind> {
    let io = match e {
        ServerError::Validation(Validation::AliasedLaunch { .. }) => return Some(Kind::Aliased),
        ServerError::Io(io) => io,
        ServerError::Launch(LaunchError::Buffer { cause, .. }) => cause,
        _ => return None,
    };
    Some(match io {
        IoError::NotFound {
            reason: NotFoundReason::NeverBound,
            ..
        } => Kind::NeverBound,
        IoError::NotFound {
            reason: NotFoundReason::HandedOver,
            ..
        } => Kind::HandedOver,
        IoError::WrongStream { .. } => Kind::WrongStream,
        IoError::OutOfRange { .. } => Kind::OutOfRange,
        IoError::RoomTooSmall { .. } => Kind::RoomTooSmall,
        IoError::InUse { .. } => Kind::InUse,
        IoError::SelfBind { .. } => Kind::SelfBind,
        _ => return None,
    })
}

/// What the model allows an operation to answer.
#[derive(Debug, Default)]
struct Expect {
    /// Errors that must be reported: with any of them, `Ok` is wrong.
    must: Vec<Kind>,
    /// Errors that may be reported (the outcome is the core's choice, e.g. refusing room that
    /// is still in use instead of ordering after its use); `Ok` is right too.
    may: Vec<Kind>,
    /// Any error may be reported (the rule is not settled, e.g. a self-bind); `Ok` is right too.
    any: bool,
}

impl Expect {
    fn state(&mut self, a: &Alloc, empty: bool) {
        let k = match a.mem {
            Mem::Bound => return,
            Mem::Lazy => Kind::NeverBound,
            Mem::HandedOver => Kind::HandedOver,
        };
        // An empty copy is checked for nothing (the design's rule); refusing it is fine too.
        if empty { &mut self.may } else { &mut self.must }.push(k);
    }

    /// Checks `r`; returns whether it succeeded.
    fn check<T>(&self, r: &Result<T, ServerError>, what: &str) -> Result<bool, TestCaseError> {
        match r {
            Ok(_) if self.must.is_empty() => Ok(true),
            Ok(_) => Err(TestCaseError::fail(format!(
                "{what}: succeeded, but the model expects one of {:?}",
                self.must
            ))),
            Err(e) => {
                let k = kind(e);
                let allowed =
                    self.any || k.is_some_and(|k| self.must.contains(&k) || self.may.contains(&k));
                if allowed {
                    prop_assert!(
                        !e.to_string().is_empty(),
                        "{}: an error without a message",
                        what
                    );
                    Ok(false)
                } else {
                    Err(TestCaseError::fail(format!(
                        "{what}: unexpected error {e:?} ({e}); the model expects {}",
                        if self.must.is_empty() && self.may.is_empty() {
                            "success".to_string()
                        } else {
                            format!("{:?} (or {:?})", self.must, self.may)
                        }
                    )))
                }
            }
        }
    }
}

fn pattern(n: u64, seed: u8) -> Vec<u8> {
    (0..n as usize)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

fn compare(got: &[u8], expected: &[Option<u8>], what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), expected.len(), "{}: length", what);
    if let Some(i) = got
        .iter()
        .zip(expected)
        .position(|(g, e)| e.is_some_and(|e| e != *g))
    {
        return Err(TestCaseError::fail(format!(
            "{what}: byte {i} reads {:#04x}, the model says {:#04x} ({} of {} bytes differ)",
            got[i],
            expected[i].unwrap_or_default(),
            got.iter()
                .zip(expected)
                .filter(|(g, e)| e.is_some_and(|e| e != **g))
                .count(),
            got.len()
        )));
    }
    Ok(())
}

fn shim() -> StdShim {
    StdHarness
        .shim(Mode::LAZY_POISON)
        .expect("shim-std offers lazy + poison")
}

/// Small pages (fast, same rules) and a drop queue that flushes often (the internal flushes run
/// too).
fn config() -> DeviceConfig {
    let mut config = DeviceConfig::default();
    config.memory.small_page_size = 512 << 10;
    config.memory.arena_min_page = 512 << 10;
    config.memory.arena_granule = 256 << 10;
    config.pinned.page_size = 1 << 20;
    config.drops = DropPolicy {
        max_items: 8,
        max_bytes: 1 << 20,
        fill_released: Some(devcmd_tests::RELEASED_HOST_FILL),
    };
    config
}

struct World {
    dev: Device<StdShim>,
    probe: StdShim,
    fill: StdKernel,
    add: StdKernel,
    allocs: Vec<Alloc>,
    held: Vec<Held>,
    pending: Vec<Pending>,
    step: usize,
    /// What each step did, resolved (handles by id), for failure messages.
    trace: Vec<String>,
}

impl World {
    fn new() -> Self {
        let shim = shim();
        let probe = shim.clone();
        let fill = StdHarness.kernel(&shim, TestKernel::Fill);
        let add = StdHarness.kernel(&shim, TestKernel::AddByte);
        Self {
            dev: Device::new(shim, config()),
            probe,
            fill,
            add,
            allocs: Vec::new(),
            held: Vec::new(),
            pending: Vec::new(),
            step: 0,
            trace: Vec::new(),
        }
    }

    fn cmd(&mut self, s: u8) -> Result<Command<'_, StdShim>, TestCaseError> {
        self.dev
            .command(StreamId(u32::from(s)))
            .map_err(|e| TestCaseError::fail(format!("command on stream {s}: {e}")))
    }

    fn what(&self, op: &Op) -> String {
        format!("step {} {op:?}", self.step)
    }

    /// `handle` as the trace shows it: id, view, allocation, owner and state.
    fn name(&self, handle: &Handle, alloc: usize) -> String {
        let a = &self.allocs[alloc];
        format!(
            "#{}[{}+{}] (a{alloc} of {} B on s{}, {:?})",
            handle.id(),
            handle.offset(),
            handle.len(),
            a.size,
            a.owner,
            a.mem
        )
    }

    fn log(&mut self, line: String) {
        self.trace.push(format!("{}: {line}", self.step));
    }

    /// `e` with the last steps of the trace.
    fn explain(&self, e: TestCaseError) -> TestCaseError {
        let from = self.trace.len().saturating_sub(40);
        TestCaseError::fail(format!(
            "{e}\nlast steps:\n  {}",
            self.trace[from..].join("\n  ")
        ))
    }

    fn pick(&self, h: usize) -> Option<usize> {
        (!self.held.is_empty()).then(|| h % self.held.len())
    }

    /// A bind that can succeed: room with memory, its owner's stream, and a handle of that
    /// stream (another allocation) the room can hold. Returns `(stream, room, target)`.
    fn fitting_bind(&self, reserved: usize, target: usize) -> Option<(u8, usize, usize)> {
        let rooms: Vec<usize> = (0..self.held.len())
            .filter(|&i| self.allocs[self.held[i].alloc].mem == Mem::Bound)
            .collect();
        let r = *rooms.get(reserved % rooms.len().max(1))?;
        let room = &self.allocs[self.held[r].alloc];
        let targets: Vec<usize> = (0..self.held.len())
            .filter(|&i| {
                let a = &self.allocs[self.held[i].alloc];
                self.held[i].alloc != self.held[r].alloc
                    && a.owner == room.owner
                    && a.size <= room.bytes.len() as u64
            })
            .collect();
        let t = *targets.get(target % targets.len().max(1))?;
        Some((room.owner, r, t))
    }

    /// The view `sel` of held handle `h`: the handle, its allocation and its offset in it.
    fn view(&self, h: usize, sel: Sel) -> (Handle, usize, u64) {
        let held = &self.held[h];
        let (off, len) = sel.of(held.handle.len());
        let view = held.handle.view(off, len).expect("inside the view");
        (view, held.alloc, held.handle.offset() + off)
    }

    fn new_alloc(&mut self, s: u8, handle: Handle, mem: Mem, bytes: Vec<Option<u8>>) {
        self.allocs.push(Alloc {
            owner: s,
            size: handle.allocation_size(),
            mem,
            bytes,
            foreign_used: false,
        });
        self.held.push(Held {
            alloc: self.allocs.len() - 1,
            handle,
        });
    }

    fn note_use(&mut self, s: u8, alloc: usize) {
        let a = &mut self.allocs[alloc];
        if a.owner != s && a.mem == Mem::Bound {
            a.foreign_used = true;
        }
    }

    fn finish(&mut self, p: Pending, check: bool) -> Result<(), TestCaseError> {
        if !check {
            drop(p.future);
            return Ok(());
        }
        let got = p
            .future
            .wait()
            .map_err(|e| TestCaseError::fail(format!("{}: waiting: {e}", p.what)))?;
        prop_assert_eq!(got.len(), p.expected.len(), "{}: buffers", &p.what);
        for (i, (g, e)) in got.iter().zip(&p.expected).enumerate() {
            compare(g.as_slice(), e, &format!("{} request {i}", p.what))?;
        }
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        self.step += 1;
        let what = self.what(op);
        match *op {
            Op::Create { s, len, seed } => {
                let data = pattern(len, seed);
                let h = self
                    .cmd(s)?
                    .create(&data)
                    .map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
                let bytes = data.into_iter().map(Some).collect();
                self.log(format!("s{s} create #{} of {len} B (seed {seed})", h.id()));
                self.new_alloc(s, h, Mem::Bound, bytes);
            }
            Op::Empty { s, len } | Op::Reserve { s, len } => {
                let mut cmd = self.cmd(s)?;
                let r = if matches!(op, Op::Empty { .. }) {
                    cmd.empty(len)
                } else {
                    cmd.reserve(len)
                };
                let h = r.map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
                self.log(format!("s{s} empty/reserve #{} of {len} B", h.id()));
                self.new_alloc(s, h, Mem::Bound, vec![None; len as usize]);
            }
            Op::Lazy { s, len } => {
                let h = self.cmd(s)?.lazy(len);
                self.log(format!("s{s} lazy #{} of {len} B", h.id()));
                self.new_alloc(s, h, Mem::Lazy, Vec::new());
            }
            Op::Initialize { s, h, fit } => {
                let Some(h) = self.pick(h) else { return Ok(()) };
                let (handle, t) = (self.held[h].handle.clone(), self.held[h].alloc);
                let s = if fit { self.allocs[t].owner } else { s };
                let mut expect = Expect::default();
                let target = &self.allocs[t];
                if target.owner != s {
                    expect.must.push(Kind::WrongStream);
                }
                match target.mem {
                    Mem::Bound if handle.is_bound() => expect.must.push(Kind::InUse),
                    // Giving new room to a handle whose room went elsewhere: not settled.
                    Mem::HandedOver => expect.any = true,
                    _ => {}
                }
                let r = self.cmd(s)?.initialize(&handle);
                self.log(format!(
                    "s{s} initialize {}: {}",
                    self.name(&handle, t),
                    outcome(&r)
                ));
                if expect.check(&r, &what)? {
                    let a = &mut self.allocs[t];
                    a.mem = Mem::Bound;
                    a.bytes = vec![None; a.size as usize];
                }
            }
            Op::Bind {
                s,
                reserved,
                target,
                fit,
            } => {
                let (s, r, t) = if fit {
                    let Some((s, r, t)) = self.fitting_bind(reserved, target) else {
                        return Ok(());
                    };
                    (s, r, t)
                } else {
                    let (Some(r), Some(t)) = (self.pick(reserved), self.pick(target)) else {
                        return Ok(());
                    };
                    (s, r, t)
                };
                let (rh, ra) = (self.held[r].handle.clone(), self.held[r].alloc);
                let (th, ta) = (self.held[t].handle.clone(), self.held[t].alloc);
                let mut expect = Expect::default();
                if ra == ta {
                    // Refused, or a check that comes first refuses it.
                    let room = &self.allocs[ra];
                    expect.must.push(Kind::SelfBind);
                    if room.owner != s {
                        expect.must.push(Kind::WrongStream);
                    }
                    match room.mem {
                        Mem::Lazy => expect.must.push(Kind::NeverBound),
                        Mem::HandedOver => expect.must.push(Kind::HandedOver),
                        Mem::Bound => {}
                    }
                } else {
                    let (room, target) = (&self.allocs[ra], &self.allocs[ta]);
                    if target.owner != s || room.owner != s {
                        expect.must.push(Kind::WrongStream);
                    }
                    match room.mem {
                        Mem::Lazy => expect.must.push(Kind::NeverBound),
                        Mem::HandedOver => expect.must.push(Kind::HandedOver),
                        Mem::Bound => {}
                    }
                    if room.mem == Mem::Bound && target.size > room.bytes.len() as u64 {
                        expect.must.push(Kind::RoomTooSmall);
                    }
                    match target.mem {
                        Mem::Bound if th.is_bound() => expect.must.push(Kind::InUse),
                        Mem::HandedOver => expect.any = true,
                        _ => {}
                    }
                    // Room still used by in-flight work is not refused: the bind orders this
                    // stream after that work (a wrong byte read later would show it did not).
                }
                let line = format!(
                    "s{s} bind room {} (bound {}) to {} (bound {})",
                    self.name(&rh, ra),
                    rh.is_bound(),
                    self.name(&th, ta),
                    th.is_bound()
                );
                let r = self.cmd(s)?.bind(rh, &th);
                self.log(format!("{line}: {}", outcome(&r)));
                if expect.check(&r, &what)? && ra != ta {
                    let bytes = std::mem::take(&mut self.allocs[ra].bytes);
                    let used = self.allocs[ra].foreign_used;
                    self.allocs[ra].mem = Mem::HandedOver;
                    let target = &mut self.allocs[ta];
                    target.mem = Mem::Bound;
                    target.bytes = bytes;
                    target.foreign_used |= used;
                }
            }
            Op::Write {
                s,
                h,
                sel,
                seed,
                borrowed,
            } => {
                let Some(h) = self.pick(h) else { return Ok(()) };
                let (view, a, off) = self.view(h, sel);
                let data = pattern(view.len(), seed);
                let mut expect = Expect::default();
                expect.state(&self.allocs[a], data.is_empty());
                self.note_use(s, a);
                let mut cmd = self.cmd(s)?;
                let r = if borrowed {
                    cmd.write_from(&view, &data)
                } else {
                    cmd.write(&view, HostBuffer::from_vec(data.clone()))
                };
                self.log(format!(
                    "s{s} write {} (seed {seed}): {}",
                    self.name(&view, a),
                    outcome(&r)
                ));
                if expect.check(&r, &what)? && !data.is_empty() {
                    let off = off as usize;
                    for (m, d) in self.allocs[a].bytes[off..off + data.len()]
                        .iter_mut()
                        .zip(&data)
                    {
                        *m = Some(*d);
                    }
                }
            }
            Op::WriteLayout { s, h, geom, seed } => {
                let Some(h) = self.pick(h) else { return Ok(()) };
                let held = &self.held[h];
                let rows = geom.of(held.handle.len());
                // The view starts at the first row and runs to the end of the handle's view.
                let view = held
                    .handle
                    .view(rows.offset, held.handle.len() - rows.offset)
                    .expect("inside the view");
                let (a, base) = (held.alloc, held.handle.offset() as usize);
                let layout = rows.layout();
                let data = pattern(layout.packed_bytes(), seed);
                let mut expect = Expect::default();
                expect.state(&self.allocs[a], data.is_empty());
                self.note_use(s, a);
                let r =
                    self.cmd(s)?
                        .write_layout(&view, HostBuffer::from_vec(data.clone()), layout);
                self.log(format!(
                    "s{s} write_layout {} {rows:?} (seed {seed}): {}",
                    self.name(&view, a),
                    outcome(&r)
                ));
                if expect.check(&r, &what)? {
                    let bytes = &mut self.allocs[a].bytes;
                    for ((start, end), row) in
                        rows.ranges().zip(data.chunks(rows.width.max(1) as usize))
                    {
                        for (m, d) in bytes[base + start..base + end].iter_mut().zip(row) {
                            *m = Some(*d);
                        }
                    }
                }
            }
            Op::Read {
                s,
                ref requests,
                hold,
            } => {
                if self.held.is_empty() {
                    return Ok(());
                }
                let mut views = Vec::new();
                let mut names = Vec::new();
                let mut expected = Vec::new();
                let mut expect = Expect::default();
                for &(h, sel, geom) in requests {
                    let h = h % self.held.len();
                    let (view, a, off) = self.view(h, sel);
                    let rows = match geom {
                        None => Rows {
                            offset: 0,
                            width: view.len(),
                            pitch: view.len(),
                            height: u64::from(!view.is_empty()),
                        },
                        Some(g) => g.of(view.len()),
                    };
                    let bytes = &self.allocs[a].bytes;
                    let want: Vec<Option<u8>> = rows
                        .ranges()
                        .flat_map(|(start, end)| {
                            let (start, end) = (off as usize + start, off as usize + end);
                            // Without memory the read fails (or, empty, reads nothing).
                            (start..end).map(|i| bytes.get(i).copied().flatten())
                        })
                        .collect();
                    expect.state(&self.allocs[a], want.is_empty());
                    self.note_use(s, a);
                    // The request's view starts at the first row.
                    let view = view
                        .view(rows.offset, view.len() - rows.offset)
                        .expect("inside the view");
                    debug_assert!(rows.span() <= view.len());
                    names.push(format!("{} {rows:?}", self.name(&view, a)));
                    views.push((view, rows.layout()));
                    expected.push(want);
                }
                let reqs: Vec<ReadRequest<'_>> = views
                    .iter()
                    .map(|(handle, layout)| ReadRequest {
                        handle,
                        layout: *layout,
                    })
                    .collect();
                let r = self.cmd(s)?.read_async(&reqs);
                self.log(format!(
                    "s{s} read{} [{}]: {}",
                    if hold { " (held)" } else { "" },
                    names.join(", "),
                    outcome(&r)
                ));
                if expect.check(&r, &what)? {
                    let future = r.expect("checked");
                    // Bytes the model does not know (an empty, unbound or handed-over request)
                    // are not compared: an empty request reads nothing.
                    let p = Pending {
                        future,
                        expected,
                        what: what.clone(),
                    };
                    if hold {
                        if self.pending.len() >= MAX_PENDING {
                            let oldest = self.pending.remove(0);
                            self.finish(oldest, true)?;
                        }
                        self.pending.push(p);
                    } else {
                        self.finish(p, true)?;
                    }
                }
            }
            Op::FinishRead { i, drop_only } => {
                if !self.pending.is_empty() {
                    let p = self.pending.remove(i % self.pending.len());
                    self.log(format!(
                        "finish read of step {} (check {})",
                        p.what, !drop_only
                    ));
                    self.finish(p, !drop_only)?;
                }
            }
            Op::Launch {
                s,
                kernel,
                value,
                input,
                output,
                second,
                alias,
            } => {
                let (Some(i), Some(o)) = (self.pick(input.0), self.pick(output.0)) else {
                    return Ok(());
                };
                let (inp, ia, ioff) = self.view(i, input.1);
                let (out, oa, ooff) = if alias && kernel == Kernel::Add {
                    (inp.clone(), ia, ioff)
                } else {
                    self.view(o, output.1)
                };
                let mut expect = Expect::default();
                let mut outputs = vec![(out, oa, ooff)];
                if kernel == Kernel::Fill
                    && let Some((h, sel)) = second
                {
                    let second = self.view(h % self.held.len(), sel);
                    if second.1 != oa {
                        outputs.push(second);
                    }
                }
                if kernel == Kernel::Add && ia == oa {
                    let (a, b) = ((ioff, ioff + inp.len()), (ooff, ooff + outputs[0].0.len()));
                    // An output that overlaps the input is refused before anything else is
                    // checked; disjoint views of one allocation are an ordinary launch.
                    if a.0 < b.1 && b.0 < a.1 && !inp.is_empty() && !outputs[0].0.is_empty() {
                        expect.must.push(Kind::Aliased);
                    }
                }
                let inputs: Vec<(Handle, usize, u64)> = match kernel {
                    Kernel::Fill => Vec::new(),
                    Kernel::Add => vec![(inp, ia, ioff)],
                };
                for &(_, a, _) in inputs.iter().chain(&outputs) {
                    // A launch resolves every buffer, empty or not.
                    expect.state(&self.allocs[a], false);
                    self.note_use(s, a);
                }
                let in_refs: Vec<&Handle> = inputs.iter().map(|v| &v.0).collect();
                let out_refs: Vec<&Handle> = outputs.iter().map(|v| &v.0).collect();
                let r = {
                    let (k, test) = match kernel {
                        Kernel::Fill => (&self.fill, TestKernel::Fill),
                        Kernel::Add => (&self.add, TestKernel::AddByte),
                    };
                    let lens = |hs: &[&Handle]| hs.iter().map(|h| h.len()).collect::<Vec<_>>();
                    let args = TestArgs::new(test, value, &lens(&in_refs), &lens(&out_refs));
                    let mut cmd = self
                        .dev
                        .command(StreamId(u32::from(s)))
                        .map_err(|e| TestCaseError::fail(format!("{what}: command: {e}")))?;
                    cmd.launch(Launch {
                        kernel: k,
                        dims: args.dims(),
                        inputs: &in_refs,
                        outputs: &out_refs,
                        params: &args.params(),
                    })
                };
                self.log(format!(
                    "s{s} launch {kernel:?} +{value} [{}] -> [{}]: {}",
                    inputs
                        .iter()
                        .map(|(h, a, _)| self.name(h, *a))
                        .collect::<Vec<_>>()
                        .join(", "),
                    outputs
                        .iter()
                        .map(|(h, a, _)| self.name(h, *a))
                        .collect::<Vec<_>>()
                        .join(", "),
                    outcome(&r)
                ));
                if expect.check(&r, &what)? {
                    let source: Option<Vec<Option<u8>>> = inputs.first().map(|(h, a, off)| {
                        let off = *off as usize;
                        self.allocs[*a].bytes[off..off + h.len() as usize].to_vec()
                    });
                    for (h, a, off) in &outputs {
                        let off = *off as usize;
                        let bytes = &mut self.allocs[*a].bytes[off..off + h.len() as usize];
                        match &source {
                            None => bytes.iter_mut().for_each(|b| *b = Some(value)),
                            Some(src) => {
                                for (b, i) in bytes.iter_mut().zip(src) {
                                    *b = i.map(|i| i.wrapping_add(value));
                                }
                            }
                        }
                    }
                }
            }
            Op::Sync { s } => {
                self.log(format!("s{s} sync"));
                let r = self.cmd(s)?.sync().and_then(|f| f.wait());
                Expect::default().check(&r, &what)?;
            }
            Op::Flush { s } => {
                self.log(format!("s{s} flush_drops"));
                let r = self.cmd(s)?.flush_drops();
                Expect::default().check(&r, &what)?;
            }
            Op::Poll { s } => {
                self.log(format!("s{s} poll_drops"));
                let r = self.cmd(s)?.poll_drops();
                Expect::default().check(&r, &what)?;
            }
            Op::Cleanup { s } => {
                self.log(format!("s{s} memory_cleanup"));
                let r = self.cmd(s)?.memory_cleanup();
                Expect::default().check(&r, &what)?;
            }
            Op::View { h, sel } => {
                let Some(h) = self.pick(h) else { return Ok(()) };
                let (handle, alloc, _) = self.view(h, sel);
                self.log(format!("keep view {}", self.name(&handle, alloc)));
                self.held.push(Held { alloc, handle });
            }
            Op::Drop { h } => {
                if let Some(h) = self.pick(h) {
                    let held = self.held.swap_remove(h);
                    self.log(format!("drop {}", self.name(&held.handle, held.alloc)));
                }
            }
            Op::Mode { s, mode } => {
                self.log(format!("s{s} allocation mode {mode:?}"));
                self.cmd(s)?.allocation_mode(mode);
            }
        }
        prop_assert_eq!(
            self.dev.failures().len(),
            (0, 0),
            "{}: failure records without a failure",
            what
        );
        Ok(())
    }

    /// Finishes every pending read, drops every handle, cleans every stream up, then checks that
    /// nothing is in use and that the shim got every page back once the device is dropped.
    fn end(mut self) -> Result<(), TestCaseError> {
        for p in std::mem::take(&mut self.pending) {
            self.finish(p, true)?;
        }
        self.held.clear();
        for _ in 0..2 {
            for s in 0..STREAMS {
                let r = self.cmd(s)?.memory_cleanup();
                Expect::default().check(&r, "final cleanup")?;
            }
        }
        let report = self.dev.memory_report();
        let (allocations, in_use) = report.streams.iter().fold((0, 0), |(a, b), (_, r)| {
            let u = r.device() + r.pinned_host();
            (a + u.allocations, b + u.in_use)
        });
        prop_assert_eq!(
            (allocations, in_use),
            (0, 0),
            "allocations / bytes in use after dropping everything:\n{}",
            report
        );
        let probe = self.probe.clone();
        drop(self);
        let stats = probe.stats();
        prop_assert_eq!(
            (stats.device_pages_live, stats.host_pages_live),
            (0, 0),
            "pages the shim still holds after the device was dropped"
        );
        Ok(())
    }
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut world = World::new();
    for op in ops {
        if let Err(e) = world.apply(op) {
            return Err(world.explain(e));
        }
    }
    world.end()
}

/// An outcome as the trace shows it.
fn outcome<T>(r: &Result<T, ServerError>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => match kind(e) {
            Some(k) => format!("{k:?}"),
            None => format!("{e:?}"),
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(256),
        max_shrink_iters: 4000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn commands_match_the_model(ops in proptest::collection::vec(op(), 1..120)) {
        run(&ops)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Regression tests: bind and cross-stream order (issue 7, item 6, first defect)

struct Rig {
    dev: Device<StdShim>,
    slow: StdKernel,
    add: StdKernel,
    fill: StdKernel,
    one: TestArgs,
    seven: TestArgs,
}

fn rig(mode: Mode) -> Rig {
    let shim = StdHarness.shim(mode).expect("shim-std offers every mode");
    let slow = StdHarness.kernel(&shim, TestKernel::SlowAdd);
    let add = StdHarness.kernel(&shim, TestKernel::AddByte);
    let fill = StdHarness.kernel(&shim, TestKernel::Fill);
    Rig {
        dev: Device::new(shim, DeviceConfig::default()),
        slow,
        add,
        fill,
        one: TestArgs::new(TestKernel::AddByte, 1, &[64], &[64]),
        seven: TestArgs::new(TestKernel::Fill, 7, &[], &[64]),
    }
}

fn read(dev: &mut Device<StdShim>, s: u32, h: &Handle) -> Vec<u8> {
    let mut cmd = dev.command(StreamId(s)).unwrap();
    let mut got = cmd
        .read_async(&[ReadRequest::whole(h)])
        .unwrap()
        .wait()
        .unwrap();
    got.pop().unwrap().into_vec()
}

/// Stream 1 launches a kernel that reads `a` (created on stream 0); on stream 0, `lazy` makes
/// `t`, `bind(a, t)` gives `a`'s room to `t`, and a write to `t` follows. The write must not
/// overtake stream 1's kernel: either `bind` refuses room still in use, or the write waits for
/// stream 1. In lazy mode stream 0 is driven first, so a missing order shows as the new bytes
/// in the kernel's output; in the other modes the slow kernel gives the write time to land.
fn bind_of_room_another_stream_reads(mode: Mode) {
    let mut r = rig(mode);
    let (old, new) = ([5u8; 64], [200u8; 64]);
    let a = r.dev.command(StreamId(0)).unwrap().create(&old).unwrap();
    let o = r.dev.command(StreamId(1)).unwrap().empty(64).unwrap();
    let kernel = if mode.lazy { &r.add } else { &r.slow };
    r.dev
        .command(StreamId(1))
        .unwrap()
        .launch(Launch {
            kernel,
            dims: LaunchDims::SINGLE,
            inputs: &[&a],
            outputs: &[&o],
            params: &r.one.params(),
        })
        .unwrap();
    let mut cmd = r.dev.command(StreamId(0)).unwrap();
    let t = cmd.lazy(64);
    cmd.bind(a, &t)
        .unwrap_or_else(|e| panic!("[{mode}] bind of room another stream uses: {e:?}"));
    cmd.write(&t, HostBuffer::from_vec(new.to_vec())).unwrap();
    // Drive stream 0 first: its write runs now unless it waits for stream 1.
    cmd.sync().unwrap().wait().unwrap();
    assert_eq!(
        read(&mut r.dev, 0, &t),
        new,
        "[{mode}] t holds what was written"
    );
    let got = read(&mut r.dev, 1, &o);
    assert_eq!(
        got, [6u8; 64],
        "[{mode}] stream 1's kernel read bytes that stream 0 wrote after it was launched: bind \
         lost the order of stream 1's use of the room"
    );
}

/// As above with room from `reserve()` that stream 1 writes (a fill kernel's output) before
/// stream 0 binds it to `t` and writes `t`: the bind is accepted and the write lands after the
/// kernel.
fn bind_of_room_another_stream_writes(mode: Mode) {
    let mut r = rig(mode);
    let new = [200u8; 64];
    let room = r.dev.command(StreamId(0)).unwrap().reserve(64).unwrap();
    r.dev
        .command(StreamId(1))
        .unwrap()
        .launch(Launch {
            kernel: &r.fill,
            dims: LaunchDims::SINGLE,
            inputs: &[],
            outputs: &[&room],
            params: &r.seven.params(),
        })
        .unwrap();
    let mut cmd = r.dev.command(StreamId(0)).unwrap();
    let t = cmd.lazy(64);
    cmd.bind(room, &t)
        .unwrap_or_else(|e| panic!("[{mode}] bind of room another stream uses: {e:?}"));
    cmd.write(&t, HostBuffer::from_vec(new.to_vec())).unwrap();
    cmd.sync().unwrap().wait().unwrap();
    r.dev
        .command(StreamId(1))
        .unwrap()
        .sync()
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        read(&mut r.dev, 0, &t),
        new,
        "[{mode}] stream 1's fill landed after stream 0's write to the room it was \
             bound to: bind lost the order of stream 1's use of the room"
    );
}

#[test]
fn bind_keeps_the_order_of_another_streams_read_lazy_poison() {
    bind_of_room_another_stream_reads(Mode::LAZY_POISON);
}

#[test]
fn bind_keeps_the_order_of_another_streams_read() {
    bind_of_room_another_stream_reads(Mode::NORMAL);
}

#[test]
fn bind_keeps_the_order_of_another_streams_write_lazy_poison() {
    bind_of_room_another_stream_writes(Mode::LAZY_POISON);
}
