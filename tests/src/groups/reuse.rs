//! Memory reuse across streams: never too early (ONNX Runtime #4829), never blocked for good
//! (PyTorch #71616), and no out-of-memory while a fitting block is only pending (PyTorch #189504).

use crate::harness::{Harness, Mode, TestKernel};
use crate::util::{Ctx, first_diff, must, pattern, plus};
use devcmd::{DeviceConfig, Handle, IoError, ServerError, StreamId};

const MIB: u64 = 1 << 20;

fn range<H: Harness>(c: &mut Ctx<H>, s: StreamId, h: &Handle) -> (u64, u64) {
    let r = must(
        c.dev
            .command(s)
            .and_then(|mut k| k.resource(h).map_err(Into::into)),
        "resource",
    );
    (r.addr.0, r.addr.0 + r.len)
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// The cross-stream reuse group (the ONNX Runtime #4829 race). Stream A owns a buffer `x`;
/// stream B reads it through a slow kernel (in lazy mode B runs nothing until its fence is
/// waited on); A drops `x` and immediately reserves the same size again, several times, with an
/// explicit cleanup of A in between, and overwrites what it got. Checks:
///
/// - no new reservation on A overlaps `x`'s device range while B's work has not passed a
///   fence;
/// - B's output is byte-exactly `x + 1` (an alias would show A's new bytes; an early free would
///   show poison in poison mode);
/// - once B's queue released its hold, A can reuse the memory (nothing stays in use).
///
/// Run for a small-pool size and an arena size, after a first check with nothing else running A:
/// B's kernel reads what A just uploaded, then B's output is read on B. Only B's wait on A's
/// event (`stream_wait_event`) orders the two, so a shim that ignores it fails there (in lazy
/// mode every time: A runs nothing until something waits on it), naming `stream_wait_event`;
/// in the rounds, the cleanup of A would drain A and hide it.
pub fn cross_stream_reuse<H: Harness>(h: &H, mode: Mode) {
    let Some(mut c) = Ctx::new(h, mode, DeviceConfig::default(), "cross_stream_reuse") else {
        return;
    };
    let (a, b) = (StreamId(1), StreamId(0));
    let p = pattern(4096, 99);
    let x = must(c.create(a, &p), "create x on A");
    let y = must(c.empty(b, 4096), "empty y on B");
    must(
        c.launch(b, TestKernel::AddByte, 1, &[&x], &[&y]),
        "kernel on B reading x",
    );
    let got = must(c.read(b, &y), "read y on B");
    let expected = plus(&p, 1);
    assert!(
        got == expected,
        "[{mode}] B's kernel read x before A's upload of it landed ({}): the shim call most likely \
         at fault is stream_wait_event (B must wait, on the device, for the event A recorded \
         after the upload; answering Ok without ordering anything breaks cross-stream order)",
        first_diff(&got, &expected)
    );
    drop((x, y));
    for (i, size) in [4096u64, 3 * MIB].into_iter().enumerate() {
        let p = pattern(size as usize, 17 + i as u8);
        let x = must(c.create(a, &p), "create x on A");
        let rx = range(&mut c, a, &x);
        let y = must(c.empty(b, size), "empty y on B");
        must(
            c.launch(b, TestKernel::SlowAdd, 1, &[&x], &[&y]),
            "slow kernel on B reading x",
        );
        drop(x);
        let mut kept = Vec::new();
        for round in 0..4 {
            if round == 2 {
                must(
                    c.dev.command(a).and_then(|mut k| k.memory_cleanup()),
                    "cleanup A",
                );
            }
            let z = must(c.empty(a, size), "reserve on A after dropping x");
            let rz = range(&mut c, a, &z);
            assert!(
                !overlaps(rx, rz),
                "[{mode}] {size} bytes: A's new reservation {rz:x?} aliases x {rx:x?} while \
                 B's slow kernel has not passed a fence (ONNX Runtime #4829)"
            );
            must(c.write(a, &z, &vec![0xA5; size as usize]), "overwrite on A");
            kept.push(z);
        }
        let got = must(c.read(b, &y), "read y on B");
        let expected = plus(&p, 1);
        assert!(
            got == expected,
            "[{mode}] {size} bytes: B's kernel saw other bytes than x's ({}); x was reused or \
             freed before B's work passed a fence",
            first_diff(&got, &expected)
        );
        drop((kept, y));
        must(c.flush(b), "flush B");
        must(c.flush(b), "flush B");
        let (allocs, _) = c.live_on(a);
        assert_eq!(
            allocs, 0,
            "[{mode}] {size} bytes: x stays allocated after B's queue released it"
        );
    }
    c.assert_no_leak("cross_stream_reuse");
}

/// The pending-free group. Under a device budget that holds two 6 MiB arena pages but not
/// three, each of 12 rounds: A fills `x` (5 MiB) with a kernel, B derives `y` from it, the
/// result is read on B, both handles are dropped; `x`'s release is then only pending in B's
/// drop queue (no flush ran). The next round's reservation on A does not fit beside it. Checks:
///
/// - PyTorch #189504: no out-of-memory is reported while a fitting block is pending: every
///   reservation succeeds (the core reclaims: drains the queues, then reuses the block);
/// - PyTorch #71616: the pending free does not block reuse: A never holds more than one page
///   (its bytes do not grow over the rounds), and the contents are byte-exact every round;
/// - a request that really does not fit (7 MiB beside two live 5 MiB buffers) is a clear
///   `OutOfMemory` naming the budget, not a panic and not a hang;
/// - after a long run of small cross-stream frees, nothing stays pending once B's regular work
///   flushed its queue (no explicit cleanup needed).
pub fn pending_frees<H: Harness>(h: &H, mode: Mode) {
    let config = DeviceConfig {
        memory_budget: Some(16 * MIB),
        ..DeviceConfig::default()
    };
    let Some(mut c) = Ctx::new(h, mode, config, "pending_frees") else {
        return;
    };
    let (a, b) = (StreamId(0), StreamId(1));
    let size = 5 * MIB;
    let mut a_bytes = None;
    for round in 0..12u8 {
        let x = c.empty(a, size).unwrap_or_else(|e| {
            panic!(
                "[{mode}] round {round}: reserving {size} bytes on A failed although a fitting \
                 block was only pending (PyTorch #189504): {e}\n{}",
                c.dev.memory_report()
            )
        });
        must(
            c.launch(a, TestKernel::Fill, round, &[], &[&x]),
            "fill x on A",
        );
        let y = c
            .empty(b, size)
            .unwrap_or_else(|e| panic!("[{mode}] round {round}: reserving y on B failed: {e}"));
        must(
            c.launch(b, TestKernel::AddByte, 1, &[&x], &[&y]),
            "derive y on B",
        );
        let got = must(c.read(b, &y), "read y");
        assert!(
            got.iter().all(|&v| v == round.wrapping_add(1)),
            "[{mode}] round {round}: y is wrong ({})",
            first_diff(&got, &vec![round.wrapping_add(1); size as usize])
        );
        drop((x, y));
        let held = c.reserved_on(a);
        // Pages: the first round's page serves every round. Granules (a device with virtual
        // memory): the second round's `x` lies beside the pending one, so the held bytes may
        // grow once; from then on they must not.
        let settle = if c.dev.facts().vm_granule == 0 { 0 } else { 1 };
        match a_bytes {
            _ if round <= settle => a_bytes = Some(held.max(a_bytes.unwrap_or(0))),
            Some(first) => assert!(
                held <= first,
                "[{mode}] round {round}: A holds {held} bytes of pages, more than the {first} \
                 of the first rounds: the pending free was not reused (PyTorch #71616)"
            ),
            None => unreachable!("set in the first rounds"),
        }
    }
    // A request that cannot fit: a clear error.
    let live: Vec<Handle> = (0..2)
        .map(|_| must(c.empty(a, size), "fill the budget"))
        .collect();
    // 10 MiB live + 7 MiB is past 16 MiB however the memory is packed.
    match c.empty(a, 7 * MIB) {
        Err(ServerError::Io(IoError::OutOfMemory { budget, .. })) => assert_eq!(
            budget,
            Some(16 * MIB),
            "[{mode}] the out-of-memory error must name the budget"
        ),
        Err(e) => panic!("[{mode}] a reservation past the budget: expected OutOfMemory, got {e}"),
        Ok(_) => panic!("[{mode}] a reservation past a 16 MiB budget succeeded"),
    }
    drop(live);

    // Many small cross-stream frees: B's regular flushing releases them.
    let rounds = 150;
    for i in 0..rounds {
        let x = must(c.create(a, &pattern(4096, i as u8)), "create");
        let y = must(c.empty(b, 4096), "empty");
        must(c.launch(b, TestKernel::AddByte, 2, &[&x], &[&y]), "launch");
        drop((x, y));
    }
    let (allocs, _) = c.live_on(a);
    assert!(
        allocs < rounds,
        "[{mode}] {allocs} of {rounds} buffers freed on A while B used them are still held: B's \
         queue never released them (PyTorch #71616)"
    );
    c.assert_no_leak("pending_frees");
}
