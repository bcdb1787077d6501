//! The drop queue, seen through a device: fences minted and waited per flush, release at the
//! second flush, polls that never block.

use crate::harness::{Harness, Mode, SLOW_KERNEL_MS, TestKernel};
use crate::util::{Ctx, must, pattern};
use devcmd::{DeviceConfig, DropStats, StreamId};
use std::time::{Duration, Instant};

fn stats<H: Harness>(c: &Ctx<H>, s: StreamId) -> DropStats {
    c.dev
        .drop_stats()
        .into_iter()
        .find(|(id, _)| *id == s)
        .map(|(_, st)| st)
        .unwrap_or_default()
}

/// The drop-queue group. Checks, per stream of a real device:
///
/// - a flush of an empty queue records no fence and waits for nothing;
/// - the first flush with items waits for nothing and records one fence;
/// - the second waits for exactly one fence and releases the first batch (pending is replaced);
/// - after `n` flushes with items, `n - 1` fences were waited on; the shim's own counters agree
///   with the core's [`DropStats`] (when the harness has a probe);
/// - a flush with nothing staged releases the pending batch and mints no new fence; the next
///   one does nothing at all;
/// - an item (a binding another stream's work holds) is released at the second flush after its
///   push, not the first;
/// - `poll_drops` never blocks: it answers at once while a slow kernel holds the fence, and
///   releases the batch without a blocking wait once the fence passed.
pub fn drop_queue<H: Harness>(h: &H, mode: Mode) {
    let Some(mut c) = Ctx::new(h, mode, DeviceConfig::default(), "drop_queue") else {
        return;
    };
    let s = StreamId(0);
    let probed = c.probe.is_some();

    // An empty flush on a fresh stream mints nothing.
    let before = c.counters();
    must(c.flush(s), "flush");
    must(c.flush(s), "flush");
    let after = c.counters();
    assert_eq!(
        (after.event_records, after.event_waits),
        (before.event_records, before.event_waits),
        "[{mode}] flushing an empty drop queue recorded or waited on a fence"
    );
    assert_eq!(stats(&c, s), DropStats::default(), "[{mode}] empty flush");

    // Each write stages exactly one host buffer (the upload's source).
    let h0 = must(c.create(s, &[1; 64]), "create");
    let n: u64 = 8;
    for i in 1..=n {
        let before = c.counters();
        must(c.write(s, &h0, &[i as u8; 64]), "write");
        must(c.flush(s), "flush");
        let after = c.counters();
        let st = stats(&c, s);
        let waits = if i == 1 { 0 } else { 1 };
        if probed {
            assert_eq!(
                after.event_waits - before.event_waits,
                waits,
                "[{mode}] flush #{i} waited on the wrong number of fences (first: none, later: \
                 exactly one)"
            );
            assert_eq!(
                after.event_records - before.event_records,
                1,
                "[{mode}] flush #{i} with items must record exactly one fence"
            );
        }
        assert_eq!(
            st.fences_waited,
            i - 1,
            "[{mode}] after {i} flushes, {} fences waited (expected n - 1)",
            st.fences_waited
        );
        assert_eq!(st.flushes, i, "[{mode}] flushes that recorded a fence");
        // The create's staging buffer was flushed with the first write's.
        let released = if i == 1 { 0 } else { i };
        assert_eq!(
            st.items_released, released,
            "[{mode}] after flush #{i} the previous batch (and only it) is released"
        );
    }

    // Nothing staged: the pending batch goes, no new fence; then nothing at all.
    let before = c.counters();
    must(c.flush(s), "flush");
    let mid = c.counters();
    must(c.flush(s), "flush");
    let after = c.counters();
    let st = stats(&c, s);
    assert_eq!(
        st.items_released,
        n + 1,
        "[{mode}] the last batch is released"
    );
    assert_eq!(
        st.flushes, n,
        "[{mode}] a flush with nothing staged minted a fence"
    );
    if probed {
        assert_eq!(
            (
                mid.event_records - before.event_records,
                mid.event_waits - before.event_waits
            ),
            (0, 1),
            "[{mode}] a flush with only a pending batch waits once and records nothing"
        );
        assert_eq!(
            (after.event_records, after.event_waits),
            (mid.event_records, mid.event_waits),
            "[{mode}] a flush of an empty queue touched the device"
        );
    }

    // Release at the second flush: stream 1 owns `x`; a launch on stream 0 holds a binding.
    let (s0, s1) = (StreamId(0), StreamId(1));
    let x = must(c.create(s1, &pattern(256, 3)), "create");
    let y = must(c.empty(s0, 256), "empty");
    must(c.launch(s0, TestKernel::AddByte, 1, &[&x], &[&y]), "launch");
    drop(x);
    must(c.sync(s1), "sync");
    must(c.flush(s1), "flush");
    assert_eq!(
        c.live_on(s1).0,
        1,
        "[{mode}] stream 1 lost its allocation while stream 0's work still holds it"
    );
    must(c.flush(s0), "flush");
    assert_eq!(
        c.live_on(s1).0,
        1,
        "[{mode}] a binding was released at the first flush after its push (must be the second)"
    );
    must(c.flush(s0), "flush");
    assert_eq!(
        c.live_on(s1).0,
        0,
        "[{mode}] a binding was not released at the second flush after its push"
    );

    // Poll without blocking: a slow kernel sits before the fence.
    let s2 = StreamId(2);
    let a = must(c.create(s2, &pattern(128, 9)), "create");
    let b = must(c.empty(s2, 128), "empty");
    must(c.flush(s2), "flush");
    must(c.flush(s2), "flush");
    let launched = Instant::now();
    must(c.launch(s2, TestKernel::SlowAdd, 2, &[&a], &[&b]), "launch");
    must(c.write(s2, &a, &pattern(128, 10)), "write");
    must(c.flush(s2), "flush");
    let before = c.counters();
    let st0 = stats(&c, s2);
    let polled = Instant::now();
    let done = must(c.poll(s2), "poll");
    let took = polled.elapsed();
    // With a probe the shim's own counters prove no blocking wait (below); without one, time is
    // the only witness (a loaded machine can stretch it, so it is the fallback, not the rule).
    if !probed {
        assert!(
            took < Duration::from_millis(SLOW_KERNEL_MS / 2),
            "[{mode}] poll_drops blocked for {took:?}"
        );
    }
    if done {
        assert!(
            launched.elapsed() >= Duration::from_millis(SLOW_KERNEL_MS),
            "[{mode}] poll_drops reported a fence passed before the slow kernel could finish"
        );
    } else {
        assert_eq!(
            stats(&c, s2),
            st0,
            "[{mode}] a poll that found nothing released something"
        );
    }
    if probed {
        assert_eq!(
            c.counters().event_waits,
            before.event_waits,
            "[{mode}] poll_drops waited on a fence"
        );
    }
    must(c.sync(s2), "sync");
    let before = c.counters();
    let done = must(c.poll(s2), "poll");
    assert!(
        done,
        "[{mode}] poll_drops after the fence passed left work pending"
    );
    let st = stats(&c, s2);
    assert_eq!(
        st.items_released,
        st0.items_released + 1,
        "[{mode}] the polled batch (one upload source) was not released"
    );
    assert_eq!(
        st.fences_waited, st0.fences_waited,
        "[{mode}] poll counted a blocking wait"
    );
    if probed {
        assert_eq!(
            c.counters().event_waits,
            before.event_waits,
            "[{mode}] poll waited"
        );
    }
    let got = must(c.read(s2, &b), "read");
    let want = crate::util::plus(&pattern(128, 9), 2);
    assert!(
        got == want,
        "[{mode}] the slow kernel's output is wrong ({}): it read the upload enqueued after it \
         (the stream ran copy_to_device before the launch ahead of it), or the read returned \
         before the kernel finished (event_wait returned early)",
        crate::util::first_diff(&got, &want)
    );
    drop((h0, y, a, b));
    c.assert_no_leak("drop_queue");
}
