//! Random operations on three std devices (lazy streams, poisoned frees: the strictest mode),
//! two streams each, against a plain byte model: uploads of ranges, copies of ranges between
//! devices ([`devcmd::Command::copy_from`]) and within none, kernels adding to a buffer into
//! another, drops and reads. Every read must equal the model; at the end every device must
//! hold nothing.
//!
//! Case counts: `DEVCMD_PROPTEST_CASES` (default 64).

use devcmd::{
    CopyLayout, Device, DeviceConfig, Handle, HostBuffer, KernelParam, Launch, LaunchDims,
    ReadRequest, StreamId,
};
use devcmd_std::{KernelCtx, KernelFault, StdKernel, StdShim};
use proptest::prelude::*;

const DEVICES: usize = 3;
const SLOTS: usize = 3;

fn cases(default: u32) -> u32 {
    std::env::var("DEVCMD_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Debug, Clone)]
enum Op {
    /// A new buffer of `len` bytes filled with `seed`'s pattern in slot `slot` of `device`.
    Create {
        device: usize,
        slot: usize,
        stream: u32,
        len: usize,
        seed: u8,
    },
    /// Bytes `seed`.. into a range of the buffer (fractions of its length).
    Write {
        device: usize,
        slot: usize,
        stream: u32,
        at: (u16, u16),
        seed: u8,
    },
    /// A range of one device's buffer copied to another device's buffer.
    Copy {
        to: (usize, usize, u32),
        from: (usize, usize, u32),
        at: (u16, u16, u16),
    },
    /// `dst = src + 1` on one device (same length: the shorter of the two).
    Add {
        device: usize,
        src: usize,
        dst: usize,
        stream: u32,
    },
    /// A buffer dropped.
    Drop { device: usize, slot: usize },
    /// A buffer read and compared.
    Read {
        device: usize,
        slot: usize,
        stream: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let d = 0..DEVICES;
    let s = 0..SLOTS;
    let st = 0..2u32;
    prop_oneof![
        (
            d.clone(),
            s.clone(),
            st.clone(),
            1..70_000usize,
            any::<u8>()
        )
            .prop_map(|(device, slot, stream, len, seed)| Op::Create {
                device,
                slot,
                stream,
                len,
                seed
            }),
        (
            d.clone(),
            s.clone(),
            st.clone(),
            any::<(u16, u16)>(),
            any::<u8>()
        )
            .prop_map(|(device, slot, stream, at, seed)| Op::Write {
                device,
                slot,
                stream,
                at,
                seed
            }),
        (
            (d.clone(), s.clone(), st.clone()),
            (d.clone(), s.clone(), st.clone()),
            any::<(u16, u16, u16)>()
        )
            .prop_map(|(to, from, at)| Op::Copy { to, from, at }),
        (d.clone(), s.clone(), s.clone(), st.clone()).prop_map(|(device, src, dst, stream)| {
            Op::Add {
                device,
                src,
                dst,
                stream,
            }
        }),
        (d.clone(), s.clone()).prop_map(|(device, slot)| Op::Drop { device, slot }),
        (d, s, st).prop_map(|(device, slot, stream)| Op::Read {
            device,
            slot,
            stream
        }),
    ]
}

/// `out[i] = in[i] + 1` over the first `n` bytes (`n` is the kernel's only scalar).
fn add_one(ctx: &mut KernelCtx<'_>) -> Result<(), KernelFault> {
    let n = ctx.scalar_u32(2)? as usize;
    let mut bufs = ctx.buffers_mut()?;
    let [input, out] = bufs.as_mut_slice() else {
        return Err(KernelFault::Failed);
    };
    for (o, i) in out[..n].iter_mut().zip(&input[..n]) {
        *o = i.wrapping_add(1);
    }
    Ok(())
}

/// `len` bytes of a range `(a, b)` given as fractions of `len` (start, length).
fn range(len: usize, a: u16, b: u16) -> (usize, usize) {
    let start = len * a as usize / 65_536;
    let n = (len - start) * b as usize / 65_536;
    (start, n)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A buffer on a device and the bytes the model says it holds.
type Modelled = Option<(Handle, Vec<u8>)>;

struct World {
    devices: Vec<Device<StdShim>>,
    kernels: Vec<StdKernel>,
    /// Per device, per slot.
    bufs: Vec<Vec<Modelled>>,
}

fn read(dev: &mut Device<StdShim>, stream: u32, h: &Handle) -> Vec<u8> {
    let f = dev
        .command(StreamId(stream))
        .and_then(|mut c| c.read_async(&[ReadRequest::whole(h)]))
        .expect("read");
    f.wait().expect("read wait").pop().unwrap().into_vec()
}

fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let shims: Vec<StdShim> = (0..DEVICES)
        .map(|_| StdShim::builder().lazy(true).poison(true).build())
        .collect();
    let kernels = shims
        .iter()
        .map(|s| s.register_kernel("add_one", add_one))
        .collect();
    let mut w = World {
        devices: shims
            .into_iter()
            .map(|s| Device::new(s, DeviceConfig::default()))
            .collect(),
        kernels,
        bufs: (0..DEVICES)
            .map(|_| (0..SLOTS).map(|_| None).collect())
            .collect(),
    };
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Create {
                device,
                slot,
                stream,
                len,
                seed,
            } => {
                let bytes = pattern(len, seed);
                let h = w.devices[device]
                    .command(StreamId(stream))
                    .and_then(|mut c| c.create(&bytes))
                    .expect("create");
                w.bufs[device][slot] = Some((h, bytes));
            }
            Op::Write {
                device,
                slot,
                stream,
                at,
                seed,
            } => {
                let Some((h, model)) = w.bufs[device][slot].as_mut() else {
                    continue;
                };
                let (start, n) = range(model.len(), at.0, at.1);
                let bytes = pattern(n, seed);
                let view = h.view(start as u64, n as u64).expect("view");
                w.devices[device]
                    .command(StreamId(stream))
                    .and_then(|mut c| {
                        c.write_layout(&view, HostBuffer::from_vec(bytes.clone()), {
                            CopyLayout::linear(n as u64)
                        })
                    })
                    .expect("write");
                model[start..start + n].copy_from_slice(&bytes);
            }
            Op::Copy { to, from, at } => {
                if to.0 == from.0 {
                    continue;
                }
                let (Some((dh, dm)), Some((sh, sm))) =
                    (&w.bufs[to.0][to.1], &w.bufs[from.0][from.1])
                else {
                    continue;
                };
                let (s0, n0) = range(sm.len(), at.0, at.1);
                let n = n0.min(dm.len());
                let d0 = (dm.len() - n) * at.2 as usize / 65_536;
                let sv = sh.view(s0 as u64, n as u64).expect("source view");
                let dv = dh.view(d0 as u64, n as u64).expect("destination view");
                let copied_bytes = sm[s0..s0 + n].to_vec();
                let (lo, hi) = w.devices.split_at_mut(to.0.max(from.0));
                let (dst_dev, src_dev) = if to.0 < from.0 {
                    (&mut lo[to.0], &mut hi[0])
                } else {
                    (&mut hi[0], &mut lo[from.0])
                };
                let mut source = src_dev.command(StreamId(from.2)).expect("command");
                dst_dev
                    .command(StreamId(to.2))
                    .and_then(|mut c| c.copy_from(&dv, &mut source, &sv))
                    .expect("copy");
                let dm = &mut w.bufs[to.0][to.1].as_mut().expect("checked").1;
                dm[d0..d0 + n].copy_from_slice(&copied_bytes);
            }
            Op::Add {
                device,
                src,
                dst,
                stream,
            } => {
                if src == dst {
                    continue;
                }
                let (Some((sh, sm)), Some((dh, dm))) = (&w.bufs[device][src], &w.bufs[device][dst])
                else {
                    continue;
                };
                let n = sm.len().min(dm.len());
                let (si, di) = (sh.view(0, n as u64).unwrap(), dh.view(0, n as u64).unwrap());
                let scalar = (n as u32).to_ne_bytes();
                let added: Vec<u8> = sm[..n].iter().map(|b| b.wrapping_add(1)).collect();
                w.devices[device]
                    .command(StreamId(stream))
                    .and_then(|mut c| {
                        c.launch(Launch {
                            kernel: &w.kernels[device],
                            dims: LaunchDims::linear(1, 1),
                            inputs: &[&si],
                            outputs: &[&di],
                            params: &[
                                KernelParam::Buffer(0),
                                KernelParam::Buffer(1),
                                KernelParam::Scalar(&scalar),
                            ],
                        })
                    })
                    .expect("launch");
                w.bufs[device][dst].as_mut().unwrap().1[..n].copy_from_slice(&added);
            }
            Op::Drop { device, slot } => w.bufs[device][slot] = None,
            Op::Read {
                device,
                slot,
                stream,
            } => {
                let Some((h, model)) = &w.bufs[device][slot] else {
                    continue;
                };
                let got = read(&mut w.devices[device], stream, h);
                prop_assert!(
                    got == *model,
                    "op {i}: device {device} slot {slot} differs from the model"
                );
            }
        }
    }
    // Every buffer read back at the end; then nothing stays in use on any device.
    for device in 0..DEVICES {
        for slot in 0..SLOTS {
            if let Some((h, model)) = w.bufs[device][slot].take() {
                let got = read(&mut w.devices[device], 0, &h);
                prop_assert!(got == model, "end: device {device} slot {slot}");
            }
        }
    }
    for (i, d) in w.devices.iter_mut().enumerate() {
        for s in [0, 1] {
            d.command(StreamId(s))
                .and_then(|mut c| c.memory_cleanup())
                .expect("cleanup");
        }
        let report = d.memory_report();
        let live: u64 = report
            .streams
            .iter()
            .map(|(_, r)| r.device().allocations)
            .sum();
        prop_assert_eq!(
            live,
            0,
            "device {} holds allocations at the end:\n{}",
            i,
            report
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(64),
        max_shrink_iters: 2000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn copies_across_devices_match_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(&ops)?;
    }
}
