//! The failure rule as a seeded property: a read returns bytes if and only if every byte it
//! returns was last written by work that succeeded, checked against a plain model.

use crate::harness::{FaultRule, Harness, Mode, TestKernel};
use crate::util::{Ctx, Rng, must, small_pages, suspect};
use devcmd::{Handle, LaunchError, ServerError, ShimOp, StreamId};

const STREAMS: u32 = 4;
const MAX_LIVE: usize = 24;

/// What the model knows of one byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Byte {
    /// Never written since allocation: any value may come back.
    Unknown,
    /// Last written by work that succeeded.
    Known(u8),
    /// Last claimed by work that failed (or was skipped): reads must fail.
    Failed,
}

struct Buf {
    handle: Handle,
    bytes: Vec<Byte>,
}

fn view_of(rng: &mut Rng, len: usize) -> (usize, usize) {
    if len == 0 || rng.chance(50) {
        return (0, len);
    }
    let off = rng.below(len);
    let n = 1 + rng.below(len - off);
    (off, n)
}

/// One run of `ops` random operations from `seed`. Panics with the seed and the step on the
/// first disagreement with the model.
fn run<H: Harness>(h: &H, mode: Mode, seed: u64, ops: usize) -> bool {
    let Some(mut c) = Ctx::new(h, mode, small_pages(), "failure_rule") else {
        return false;
    };
    let can_fail = c.probe.is_some();
    let mut rng = Rng::new(seed);
    let mut bufs: Vec<Buf> = Vec::new();
    let trace = std::cell::RefCell::new(Vec::<String>::new());
    let ctx = |step: usize, what: &str| {
        let t = trace.borrow();
        let from = t.len().saturating_sub(40);
        format!(
            "[{mode}] failure_rule seed {seed} step {step}: {what}\nlast operations:\n  {}",
            t[from..].join("\n  ")
        )
    };
    let log = |line: String| trace.borrow_mut().push(line);
    for step in 0..ops {
        let s = StreamId(rng.below(STREAMS as usize) as u32);
        let roll = rng.below(100);
        match roll {
            // Allocate (with data, or empty).
            0..=14 if bufs.len() < MAX_LIVE => {
                let len = if rng.chance(10) {
                    rng.range(65_000, 70_000)
                } else {
                    rng.range(1, 600)
                } as usize;
                if rng.chance(70) {
                    let data = rng.bytes(len);
                    let handle = must(c.create(s, &data), ctx(step, "create"));
                    log(format!(
                        "{step}: create #{} ({len} B) on {s:?}",
                        handle.id()
                    ));
                    let bytes = data.into_iter().map(Byte::Known).collect();
                    bufs.push(Buf { handle, bytes });
                } else {
                    let handle = must(c.empty(s, len as u64), ctx(step, "empty"));
                    log(format!("{step}: empty #{} ({len} B) on {s:?}", handle.id()));
                    bufs.push(Buf {
                        handle,
                        bytes: vec![Byte::Unknown; len],
                    });
                }
            }
            // Host write of a view.
            15..=29 if !bufs.is_empty() => {
                let b = rng.below(bufs.len());
                let (off, n) = view_of(&mut rng, bufs[b].bytes.len());
                let data = rng.bytes(n);
                let view = bufs[b].handle.view(off as u64, n as u64).unwrap();
                must(c.write(s, &view, &data), ctx(step, "write"));
                log(format!(
                    "{step}: write #{} [{off}..+{n}] on {s:?}",
                    view.id()
                ));
                for (m, v) in bufs[b].bytes[off..off + n].iter_mut().zip(&data) {
                    *m = Byte::Known(*v);
                }
            }
            // Launch: fill, add, or a launch the device refuses.
            30..=59 if bufs.len() >= 2 => {
                let o = rng.below(bufs.len());
                let mut i = rng.below(bufs.len() - 1);
                if i >= o {
                    i += 1;
                }
                let value = rng.byte();
                let fail = can_fail && rng.chance(30);
                let fill = rng.chance(25);
                let olen = bufs[o].bytes.len();
                let ilen = bufs[i].bytes.len();
                let n = 1 + rng.below(olen.min(ilen));
                let (oo, io) = (rng.below(olen - n + 1), rng.below(ilen - n + 1));
                let out = bufs[o].handle.view(oo as u64, n as u64).unwrap();
                let inp = bufs[i].handle.view(io as u64, n as u64).unwrap();
                if fail && let Some(p) = &c.probe {
                    p.inject(FaultRule::Once {
                        op: ShimOp::Launch,
                        skip: 0,
                    });
                }
                let result = if fill {
                    c.launch(s, TestKernel::Fill, value, &[], &[&out])
                } else {
                    c.launch(s, TestKernel::AddByte, value, &[&inp], &[&out])
                };
                if let Some(p) = &c.probe {
                    p.clear();
                }
                log(format!(
                    "{step}: launch fill={fill} fail={fail} #{}[{io}..+{n}] -> #{}[{oo}..+{n}] \
                     +{value} on {s:?}: {}",
                    inp.id(),
                    out.id(),
                    if result.is_ok() { "ok" } else { "err" }
                ));
                let carried = !fill && bufs[i].bytes[io..io + n].contains(&Byte::Failed);
                match (&result, carried, fail) {
                    (Err(ServerError::Skipped { .. }), true, _) => {}
                    (Err(ServerError::Launch(LaunchError::Refused { cause, .. })), false, true)
                        if cause.op == ShimOp::Launch => {}
                    (Ok(()), false, false) => {}
                    _ => panic!(
                        "{}: launch (fill {fill}, input failed {carried}, refused by an \
                         injected fault {fail}) returned {result:?}; expected Skipped when the \
                         input failed, a Launch refusal naming the shim's launch when refused, \
                         Ok otherwise: the failure rule in the core, or the shim's launch \
                         answered other than it was made to",
                        ctx(step, "launch")
                    ),
                }
                if result.is_err() {
                    bufs[o].bytes[oo..oo + n].fill(Byte::Failed);
                } else if fill {
                    bufs[o].bytes[oo..oo + n].fill(Byte::Known(value));
                } else {
                    let src: Vec<Byte> = bufs[i].bytes[io..io + n].to_vec();
                    for (m, v) in bufs[o].bytes[oo..oo + n].iter_mut().zip(src) {
                        *m = match v {
                            Byte::Known(x) => Byte::Known(x.wrapping_add(value)),
                            other => other,
                        };
                    }
                }
            }
            // Read a view, checked byte-exactly.
            60..=84 if !bufs.is_empty() => {
                let b = rng.below(bufs.len());
                let (off, n) = view_of(&mut rng, bufs[b].bytes.len());
                let view = bufs[b].handle.view(off as u64, n as u64).unwrap();
                let model = &bufs[b].bytes[off..off + n];
                let failed = model.contains(&Byte::Failed);
                log(format!(
                    "{step}: read #{} [{off}..+{n}] on {s:?}",
                    view.id()
                ));
                match c.read(s, &view) {
                    Err(ServerError::Unwritten { .. }) if failed => {}
                    Err(e) => panic!(
                        "{}: read of {n} bytes at {off} failed (model says some were left \
                         unwritten by failed work: {failed}): {e}; expected {}",
                        ctx(step, "read"),
                        if failed {
                            "Unwritten"
                        } else {
                            "the bytes: the failure rule in the core marked a range that \
                             successful work wrote last, or a shim call the error names failed"
                        }
                    ),
                    Ok(_) if failed => panic!(
                        "{}: read of {n} bytes at {off} returned bytes, but some were left \
                         unwritten by failed work: expected Unwritten (the failure rule, in the \
                         core)",
                        ctx(step, "read")
                    ),
                    Ok(got) => {
                        let bad = model
                            .iter()
                            .zip(&got)
                            .position(|(m, g)| matches!(m, Byte::Known(v) if v != g));
                        if let Some(k) = bad {
                            let Byte::Known(want) = model[k] else {
                                unreachable!("only a known byte differs")
                            };
                            panic!(
                                "{}: the read gave wrong bytes (first difference at byte {} of \
                                 the buffer, {k} of a read of {n} at {off}: got {:#04x}, \
                                 expected {want:#04x}); the shim call most likely at fault: {}, or \
                                 {}, or {}, or {}",
                                ctx(step, "read"),
                                off + k,
                                got[k],
                                suspect::STREAM_WAIT,
                                suspect::LAUNCH,
                                suspect::COPIES,
                                suspect::EARLY_FENCE
                            );
                        }
                    }
                }
            }
            // Free.
            85..=94 if !bufs.is_empty() => {
                let b = rng.below(bufs.len());
                log(format!("{step}: free #{}", bufs[b].handle.id()));
                bufs.swap_remove(b);
            }
            // Cleanup, flush or poll.
            95..=96 => must(
                {
                    log(format!("{step}: cleanup {s:?}"));
                    c.dev.command(s).and_then(|mut k| k.memory_cleanup())
                },
                ctx(step, "cleanup"),
            ),
            97..=98 => {
                log(format!("{step}: flush {s:?}"));
                must(c.flush(s), ctx(step, "flush"))
            }
            _ => {
                must(c.poll(s), ctx(step, "poll"));
            }
        }
    }
    bufs.clear();
    c.assert_no_leak(&format!("failure_rule seed {seed}"));
    true
}

/// The failure-rule group: `seeds` seeded runs of `ops` random operations over 4 streams
/// (allocate with data or empty, host write of a view, a succeeding kernel, a launch the device
/// refuses by fault injection, a read of a view, free, cleanup, flush, poll), each checked
/// against a model that tracks every byte as unknown, known or failed. Checks:
///
/// - a read fails with `Unwritten` if and only if a byte in its range was last claimed by failed
///   work; otherwise every known byte comes back exactly;
/// - a launch whose input carries a failure is `Skipped`; one the device refuses is a `Launch`
///   error; both mark their outputs, which a later write or successful launch clears;
/// - at the end, after dropping everything and cleaning up: no allocation, no byte in use, and
///   `failures().len() == (0, 0)`.
///
/// Without a probe the runs have no failing launches (the rest is checked all the same).
pub fn failure_rule<H: Harness>(h: &H, mode: Mode) {
    failure_rule_with(h, mode, crate::FAILURE_SEEDS, crate::FAILURE_OPS);
}

/// [`failure_rule`] with `seeds` runs of `ops` operations each.
pub fn failure_rule_with<H: Harness>(h: &H, mode: Mode, seeds: u64, ops: usize) {
    for seed in 0..seeds {
        if !run(h, mode, 0x5EED_0000 + seed, ops) {
            return;
        }
    }
}
