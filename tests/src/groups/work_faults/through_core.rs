//! The three rules seen through a device: what reads, syncs and drop-queue polls answer after
//! work failed while it ran, and where the core depends on the shim to know.

use super::{
    FAILED_BYTE, LEN, POLLS, RULE_INDEPENDENT, RULE_STICKY, RULE_TRAVELS, SOURCES, Source,
};
use crate::harness::{FaultRule, Harness, Mode, TestKernel};
use crate::util::{Ctx, first_diff, must, pattern};
use devcmd::{DeviceConfig, ServerError, ShimOp, StreamId};
use std::fmt;
use std::time::Duration;

/// Whether `r` is the error of a stream whose work failed (or of a lost device).
fn faulted<T>(r: &Result<T, ServerError>) -> bool {
    matches!(
        r,
        Err(ServerError::StreamFaulted { .. } | ServerError::DeviceLost { .. })
    )
}

/// Makes work on `stream` that writes `target` fail while it runs, through the core.
fn fail_through_core<H: Harness>(
    c: &mut Ctx<H>,
    stream: StreamId,
    source: Source,
    target: &devcmd::Handle,
    what: &str,
) {
    match source {
        Source::Kernel => must(
            c.launch(
                stream,
                TestKernel::WriteThenFail,
                FAILED_BYTE,
                &[],
                &[target],
            ),
            format!("{what}: launch of write_then_fail (it fails only while it runs)"),
        ),
        Source::InjectedUpload => {
            let probe = c.probe.as_ref().expect("checked by the caller");
            probe.inject(FaultRule::WorkFails {
                op: ShimOp::CopyHostToDevice,
                skip: 0,
            });
            let written = c.write(stream, target, &[FAILED_BYTE; LEN]);
            c.probe.as_ref().expect("checked").clear();
            must(
                written,
                format!("{what}: an upload that fails only while it runs"),
            );
        }
    }
}

#[track_caller]
fn expect_faulted<T: fmt::Debug>(r: Result<T, ServerError>, what: &str, rule: &str, step: &str) {
    let shown = match &r {
        _ if faulted(&r) => return,
        Ok(v) => {
            let v = format!("{v:?}");
            let short: String = v.chars().take(60).collect();
            let more = if short.len() < v.len() { "..." } else { "" };
            format!("succeeded (Ok({short}{more}))")
        }
        Err(e) => format!("failed with another error ({e})"),
    };
    panic!(
        "{what}: {rule}: {step} {shown} instead of failing with StreamFaulted (the shim forgot \
         the fault, or the core did)"
    );
}

/// The three rules seen through the core ([`devcmd::Device`] and [`devcmd::Command`]), with each
/// failure source. Checks:
///
/// - a drop-queue fence after the failed work, polled without blocking (`poll_drops`, the query
///   path), reports `StreamFaulted` ([`RULE_COMPLETED`](super::RULE_COMPLETED), [`RULE_STICKY`]);
/// - two reads recorded after the failed work both fail with `StreamFaulted`, and so does a read
///   issued after another caller heard of the fault ([`RULE_STICKY`]);
/// - on a fresh device: a read on a stream ordered after the failed work (a kernel there read the
///   failed output) fails with `StreamFaulted` rather than returning what the failed work left
///   ([`RULE_TRAVELS`]); then a read on the failing stream, of a buffer only it used, fails too:
///   only the other stream has heard, so the core learns it from the shim's fence
///   ([`RULE_STICKY`]); a stream never ordered after it keeps working
///   ([`RULE_INDEPENDENT`]);
/// - teardown gives every device and pinned page back (with a probe).
pub fn work_faults_through_core<H: Harness>(h: &H, mode: Mode) {
    for source in SOURCES {
        sticky_through_core(h, mode, source);
        travels_through_core(h, mode, source);
    }
}

/// A fresh device for `source`; `None` when the source needs a probe the harness lacks.
fn core_ctx<H: Harness>(h: &H, mode: Mode, source: Source) -> Option<Ctx<H>> {
    let c = Ctx::new(h, mode, DeviceConfig::default(), "work_faults")?;
    (source == Source::Kernel || c.probe.is_some()).then_some(c)
}

/// Drops the device and checks that every page went back.
fn teardown<H: Harness>(mut c: Ctx<H>, what: &str) {
    let probe = c.probe.take();
    drop(c);
    if let Some(p) = probe {
        let n = p.counters();
        assert_eq!(
            (n.device_pages_live, n.host_pages_live),
            (0, 0),
            "{what}: teardown after a fault of work that ran left device / pinned pages held"
        );
    }
}

pub(super) fn sticky_through_core<H: Harness>(h: &H, mode: Mode, source: Source) {
    let Some(mut c) = core_ctx(h, mode, source) else {
        return;
    };
    let what = format!("[{mode}] through the core, failing with {source}");
    let s = StreamId(0);
    let x = must(c.create(s, &pattern(LEN, 1)), format!("{what}: create"));
    let y = must(c.create(s, &pattern(LEN, 2)), format!("{what}: create"));
    // Release the creates' staging: the next fence the queue records covers the failed work.
    must(c.flush(s), format!("{what}: flush"));
    must(c.flush(s), format!("{what}: flush"));
    fail_through_core(&mut c, s, source, &y, &what);
    let requests = |h| [devcmd::ReadRequest::whole(h)];
    let first = must(
        c.dev
            .command(s)
            .and_then(|mut k| k.read_async(&requests(&y))),
        format!("{what}: read_async"),
    );
    let second = must(
        c.dev
            .command(s)
            .and_then(|mut k| k.read_async(&requests(&x))),
        format!("{what}: read_async"),
    );
    // An upload, then a flush: the drop queue's fence covers the failed work; poll it.
    must(
        c.write(s, &x, &pattern(LEN, 3)),
        format!("{what}: write after the failed work"),
    );
    must(c.flush(s), format!("{what}: flush"));
    let mut polled = None;
    for _ in 0..POLLS {
        match c.poll(s) {
            Ok(false) => std::thread::sleep(Duration::from_millis(1)),
            other => {
                polled = Some(other);
                break;
            }
        }
    }
    let polled = polled.unwrap_or_else(|| c.flush(s).map(|()| true));
    expect_faulted(
        polled,
        &what,
        RULE_STICKY,
        "poll_drops over a fence after the failed work",
    );
    expect_faulted(
        second.wait(),
        &what,
        RULE_STICKY,
        "a read recorded after the failed work, waited on after poll_drops heard of the fault",
    );
    expect_faulted(
        first.wait(),
        &what,
        RULE_STICKY,
        "an earlier read recorded after the failed work, waited on last",
    );
    expect_faulted(
        c.read(s, &x),
        &what,
        RULE_STICKY,
        "a read issued after another caller heard of the fault",
    );
    drop((x, y));
    teardown(c, &what);
}

pub(super) fn travels_through_core<H: Harness>(h: &H, mode: Mode, source: Source) {
    let Some(mut c) = core_ctx(h, mode, source) else {
        return;
    };
    let what = format!("[{mode}] through the core, failing with {source}");
    let (s0, s1, s2) = (StreamId(0), StreamId(1), StreamId(2));
    let x = must(c.create(s0, &pattern(LEN, 3)), format!("{what}: create"));
    let y = must(c.create(s0, &pattern(LEN, 4)), format!("{what}: create"));
    let z = must(c.empty(s1, LEN as u64), format!("{what}: empty"));
    fail_through_core(&mut c, s0, source, &y, &what);
    // Stream 1 reads what the failed work wrote: the core orders it after stream 0's work with
    // stream_wait_event (nobody has heard of the fault yet).
    must(
        c.launch(s1, TestKernel::AddByte, 1, &[&y], &[&z]),
        format!("{what}: a kernel on stream 1 reading the failed output"),
    );
    let dependent = c.read(s1, &z);
    let lost = matches!(dependent, Err(ServerError::DeviceLost { .. }));
    expect_faulted(
        dependent,
        &what,
        RULE_TRAVELS,
        "a read on a stream ordered after the failed work",
    );
    // Only stream 1 has heard: what the core knows of stream 0 comes from the shim's fences.
    expect_faulted(
        c.read(s0, &x),
        &what,
        RULE_STICKY,
        "a read on the failing stream (of a buffer only it used) after a stream ordered after \
         it heard of the fault",
    );
    expect_faulted(
        c.read(s0, &y),
        &what,
        RULE_STICKY,
        "a read of the failed output on the failing stream",
    );
    if !lost {
        let data = pattern(LEN, 5);
        let w = c.create(s2, &data);
        let back = w.and_then(|w| c.read(s2, &w).map(|b| (w, b)));
        match back {
            Ok((w, b)) => {
                assert!(
                    b == data,
                    "{what}: a round trip on an independent stream: {}",
                    first_diff(&b, &data)
                );
                drop(w);
            }
            Err(e) => panic!(
                "{what}: {RULE_INDEPENDENT}: a stream never ordered after the failed work \
                 failed: {e}"
            ),
        }
    }
    drop((x, y, z));
    teardown(c, &what);
}
