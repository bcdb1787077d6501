//! The suite's [`Counted`] wrapper, used as a third-party shim author would: a bare harness for
//! the std shim (no probe, no use of the std shim's own counters or injection) runs the whole
//! suite through [`CountedHarness`], which counts the calls and injects every fault rule at the
//! shim boundary. Then the wrapper's own semantics, call by call.

use devcmd::{Fault, Shim, ShimOp};
use devcmd_std::{StdKernel, StdShim};
use devcmd_tests::{
    Counted, CountedHarness, FaultRule, Harness, INJECTED_LOSS_STATUS, INJECTED_STATUS, Mode,
    Probe, StdHarness, TestKernel,
};

/// What a shim author writes: a fresh shim per mode, the test kernels, their arguments. No probe.
#[derive(Debug, Clone, Copy)]
struct BareStd;

impl Harness for BareStd {
    type S = StdShim;

    fn shim(&self, mode: Mode) -> Option<StdShim> {
        StdHarness.shim(mode)
    }

    fn beside(&self, first: &StdShim, mode: Mode) -> Option<StdShim> {
        StdHarness.beside(first, mode)
    }

    fn kernel(&self, shim: &StdShim, kernel: TestKernel) -> StdKernel {
        StdHarness.kernel(shim, kernel)
    }
}

devcmd_tests::conformance_tests!(CountedHarness(BareStd));

fn counted() -> (Counted<StdShim>, devcmd_tests::CountedProbe) {
    let shim = CountedHarness(BareStd)
        .shim(Mode::NORMAL)
        .expect("every mode");
    let probe = shim.probe();
    (shim, probe)
}

#[test]
fn counted_counts_every_call_and_the_live_pages() {
    let (shim, probe) = counted();
    let s = shim.create_stream().unwrap();
    let page = shim.device_alloc(4096).unwrap();
    let host = shim.host_alloc_pinned(64).unwrap();
    let e = shim.record_event(&s).unwrap();
    shim.event_query(&e).unwrap();
    shim.event_wait(&e).unwrap();
    let c = probe.counters();
    assert_eq!((c.event_records, c.event_queries, c.event_waits), (1, 1, 1));
    assert_eq!(
        (c.device_pages_live, c.device_bytes_live, c.host_pages_live),
        (1, 4096, 1)
    );
    assert_eq!(probe.calls(ShimOp::StreamCreate), 1);
    // SAFETY: no work used either page.
    unsafe {
        shim.device_free(page);
        shim.host_free_pinned(host);
    }
    let c = probe.counters();
    assert_eq!(
        (c.device_pages_live, c.device_bytes_live, c.host_pages_live),
        (0, 0, 0)
    );
}

#[test]
fn refused_calls_are_classified_as_the_harness_contract_asks() {
    let (shim, probe) = counted();
    probe.inject(FaultRule::Once {
        op: ShimOp::DeviceAlloc,
        skip: 1,
    });
    let first = shim.device_alloc(64).expect("the skipped call succeeds");
    let refused = shim.device_alloc(64).unwrap_err();
    assert_eq!(
        (refused.op, refused.status, refused.fault),
        (ShimOp::DeviceAlloc, INJECTED_STATUS, Fault::OutOfMemory),
        "a refused allocation is a transient shortage"
    );
    let third = shim.device_alloc(64).expect("Once fires once");
    assert_eq!(
        probe.counters().device_pages_live,
        2,
        "the refusal made no page"
    );
    probe.inject(FaultRule::Always {
        op: ShimOp::HostAlloc,
    });
    for _ in 0..2 {
        assert_eq!(
            shim.host_alloc_pinned(8).unwrap_err().fault,
            Fault::OutOfMemory
        );
    }
    probe.clear();
    let host = shim.host_alloc_pinned(8).expect("cleared");
    let s = shim.create_stream().unwrap();
    probe.inject(FaultRule::Once {
        op: ShimOp::EventRecord,
        skip: 0,
    });
    assert_eq!(shim.record_event(&s).unwrap_err().fault, Fault::Failed);
    assert_eq!(probe.fired(), 4, "one Once, two Always, one Once");
    // SAFETY: no work used the pages.
    unsafe {
        shim.device_free(first);
        shim.device_free(third);
        shim.host_free_pinned(host);
    }
}

#[test]
fn an_injected_loss_is_sticky_and_finishes_queued_work_first() {
    let (shim, probe) = counted();
    let s = shim.create_stream().unwrap();
    let page = shim.device_alloc(64).unwrap();
    let slow = StdHarness.kernel(shim.inner(), TestKernel::SlowAdd);
    let args = devcmd_tests::TestArgs::new(TestKernel::SlowAdd, 1, &[32], &[32]);
    let span = devcmd::DeviceSpan {
        addr: shim.device_page_addr(&page),
        len: 32,
    };
    let out = devcmd::DeviceSpan {
        addr: span.addr.offset(32),
        len: 32,
    };
    // SAFETY: both spans lie in the live page; the kernel touches only them.
    unsafe { shim.launch(&s, &slow, args.dims(), &[span, out], &args.params()) }.unwrap();
    probe.inject(FaultRule::LoseDevice {
        op: ShimOp::EventRecord,
    });
    let lost = shim.record_event(&s).unwrap_err();
    assert_eq!(
        (lost.status, lost.fault),
        (INJECTED_LOSS_STATUS, Fault::DeviceLost)
    );
    assert_eq!(
        s.pending(),
        0,
        "the loss finished the inner stream's queued work before answering"
    );
    for r in [
        shim.create_stream().map(drop),
        shim.device_alloc(1).map(drop),
        shim.record_event(&s).map(drop),
    ] {
        assert_eq!(r.unwrap_err().fault, Fault::DeviceLost, "every later call");
    }
    // SAFETY: the loss finished every queued work; nothing uses the page.
    unsafe { shim.device_free(page) };
    assert_eq!(probe.counters().device_pages_live, 0);
}

#[test]
fn injected_work_failures_follow_the_rules_of_the_inner_shim() {
    let (shim, probe) = counted();
    let (a, b) = (shim.create_stream().unwrap(), shim.create_stream().unwrap());
    let page = shim.device_alloc(64).unwrap();
    let src = [7u8; 64];
    probe.inject(FaultRule::WorkFails {
        op: ShimOp::CopyHostToDevice,
        skip: 0,
    });
    // SAFETY: `src` outlives the waits below; the page holds 64 bytes.
    unsafe {
        shim.copy_to_device(
            &a,
            src.as_ptr(),
            devcmd::HostMemory::Pageable,
            shim.device_page_addr(&page),
            devcmd::CopyLayout::linear(64),
        )
    }
    .expect("a call whose work fails while it runs is accepted");
    let ea = shim.record_event(&a).unwrap();
    shim.stream_wait_event(&b, &ea).unwrap();
    let eb = shim.record_event(&b).unwrap();
    for e in [&eb, &ea] {
        assert_eq!(shim.event_wait(e).unwrap_err().fault, Fault::WorkFailed);
    }
    let later = shim.record_event(&a).unwrap();
    assert_eq!(
        shim.event_wait(&later).unwrap_err().fault,
        Fault::WorkFailed
    );
    // SAFETY: every fence after the copy completed.
    unsafe { shim.device_free(page) };
}

#[test]
#[should_panic(expected = "needs a call that enqueues work")]
fn a_work_failure_on_a_call_that_enqueues_nothing_is_refused_with_a_clear_message() {
    let (_shim, probe) = counted();
    probe.inject(FaultRule::WorkFails {
        op: ShimOp::EventRecord,
        skip: 0,
    });
}
