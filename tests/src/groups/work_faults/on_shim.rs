//! The three rules checked by calling the shim directly: what each fence answers, and (for the
//! first rule) what host memory a fence's copy wrote after the fault was reported.

use super::bench::{Bench, Class, Polled};
use super::{LEN, RULE_COMPLETED, RULE_STICKY, RULE_TRAVELS, RULE_WAIT, SOURCES, Source};
use crate::harness::{Harness, Mode, TestKernel};
use crate::util::first_diff;
use devcmd::Shim;

/// What a wait covers has landed: a slow kernel, then a copy of its output into host memory,
/// then a fence; once `event_wait` on the fence returns, the host bytes are the kernel's result
/// and a query of the fence answers complete. A wait that returns early fails here naming
/// `event_wait` ([`RULE_WAIT`]), where it would otherwise show only as wrong bytes in the groups
/// that read through the core.
pub fn a_wait_covers_what_came_before<H: Harness>(h: &H, mode: Mode) {
    let Some(mut b) = Bench::clean(h, mode, "event_wait covers what came before it") else {
        return;
    };
    let s = b.stream();
    let (q, r) = (b.page(), b.page());
    let out = b.host(0);
    b.launch(&s, TestKernel::Fill, 0x40, &[], &[q]);
    b.launch(&s, TestKernel::SlowAdd, 1, &[q], &[r]);
    b.download(&s, r, out);
    let fence = b.record(&s);
    if let Err(e) = b.shim.event_wait(&fence) {
        panic!(
            "{}: event_wait on a fence after good work failed: {e}",
            b.what
        );
    }
    let seen = b.read_host(out);
    let want = vec![0x41; LEN];
    assert!(
        seen == want,
        "{}: {RULE_WAIT}: when event_wait returned, the copy into host memory it covers had not \
         landed ({}): the shim call at fault is event_wait (it returns before its fence \
         completed), or copy_to_host",
        b.what,
        first_diff(&seen, &want)
    );
    match b.shim.event_query(&fence) {
        Ok(true) => {}
        other => panic!(
            "{}: {RULE_WAIT}: event_wait on the fence returned, then a query of it answered \
             {other:?} instead of complete: event_wait returned early, or event_query forgets",
            b.what
        ),
    }
    b.settle(&[&s]);
}

/// Rule 1: a fault of work that ran is reported only by a fence that has completed. Checked
/// directly on the shim, with each failure source: a slow kernel and a copy into host memory
/// follow the failed work, then a fence; the fence is queried until it answers. Checks:
///
/// - the fence reports the fault (a clean answer breaks [`RULE_STICKY`]), as
///   `WorkFailed` or `DeviceLost` ([`RULE_KIND`](super::RULE_KIND));
/// - when a query reported it, the copy the fence covers had landed: the host bytes do not change
///   any more after the report ([`RULE_COMPLETED`]);
/// - a wait on the same fence reports it too, and a later query of the completed fence.
pub fn fault_reported_by_completed_fence<H: Harness>(h: &H, mode: Mode) {
    for source in SOURCES {
        completed_fence_with(h, mode, source);
    }
}

pub(super) fn completed_fence_with<H: Harness>(h: &H, mode: Mode, source: Source) {
    let Some(mut b) = Bench::new(h, mode, "reported by a completed fence", source) else {
        return;
    };
    let s = b.stream();
    let (p, q, r) = (b.page(), b.page(), b.page());
    let out = b.host(0);
    b.launch(&s, TestKernel::Fill, 0x11, &[], &[q]);
    b.fail(&s, source, p);
    // Work after the failure and before the fence: slow, so a fence that reported early would
    // be caught while it still runs; its result lands in host memory the check watches.
    b.launch(&s, TestKernel::SlowAdd, 1, &[q], &[r]);
    b.download(&s, r, out);
    let fence = b.record(&s);
    let class = match b.poll(&fence) {
        Polled::Query(Err(e)) => {
            let class = b.class(e, "a query of the fence after the failed work");
            let seen = b.read_host(out);
            let waited = b.shim.event_wait(&fence);
            let after = b.read_host(out);
            assert!(
                seen == after,
                "{}: {RULE_COMPLETED}: a query reported the fault while work before the fence \
                 still ran: a copy the fence covers changed host memory after the report ({})",
                b.what,
                first_diff(&seen, &after)
            );
            b.expect_fault(
                waited,
                RULE_STICKY,
                "a wait on the fence a query had reported the fault for",
            );
            class
        }
        polled => b.expect_polled_fault(
            &fence,
            polled,
            RULE_STICKY,
            "the first fence recorded after the failed work",
        ),
    };
    if class == Class::Lost {
        b.lost_stays_lost(&s);
    } else {
        b.expect_query_fault(
            &fence,
            RULE_STICKY,
            "a query of the completed fence after the failed work",
        );
    }
    b.settle(&[&s]);
}

/// Rule 2: sticky. Checked directly on the shim, with each failure source: two fences recorded
/// after the failed work, a third recorded later after good work. Checks, in this order:
///
/// - a wait on the first fence reports the fault;
/// - the second fence still reports it to a query (another caller heard first), then to a wait;
/// - the first fence, asked again, reports it again;
/// - the third fence reports it to a wait and to a query.
///
/// Each clean answer breaks [`RULE_STICKY`].
pub fn fault_is_sticky<H: Harness>(h: &H, mode: Mode) {
    for source in SOURCES {
        sticky_with(h, mode, source);
    }
}

pub(super) fn sticky_with<H: Harness>(h: &H, mode: Mode, source: Source) {
    let Some(mut b) = Bench::new(h, mode, "sticky", source) else {
        return;
    };
    let s = b.stream();
    let (p, q) = (b.page(), b.page());
    b.fail(&s, source, p);
    let (e1, e2) = (b.record(&s), b.record(&s));
    let class = b.expect_wait_fault(
        &e1,
        RULE_STICKY,
        "a wait on the first fence after the failed work",
    );
    if class == Class::Lost {
        b.lost_stays_lost(&s);
        b.settle(&[&s]);
        return;
    }
    b.expect_polled_fault(
        &e2,
        b.poll(&e2),
        RULE_STICKY,
        "a second fence after the failed work (queried once a wait on the first had reported \
         the fault)",
    );
    b.expect_wait_fault(
        &e2,
        RULE_STICKY,
        "a wait on the second fence after the failed work",
    );
    b.expect_wait_fault(&e1, RULE_STICKY, "the first fence, waited on again");
    b.launch(&s, TestKernel::Fill, 0x22, &[], &[q]);
    let e3 = b.record(&s);
    b.expect_wait_fault(&e3, RULE_STICKY, "a fence recorded later, after good work");
    b.expect_query_fault(&e3, RULE_STICKY, "a query of that later fence");
    b.settle(&[&s]);
}

/// Rule 3: the fault travels with `stream_wait_event`. Checked directly on the shim, with each
/// failure source and both orders of hearing: stream A runs the failed work and records a fence;
/// stream B waits on it, runs good work and records its own fence; stream C waits on a later
/// fence of B. Checks:
///
/// - B's fence reports the fault, whether it is asked before or after A's ([`RULE_TRAVELS`]);
/// - A's fence reports it either way ([`RULE_STICKY`]);
/// - a later fence of B reports it (the fault it inherited is sticky too), and so does C's fence,
///   ordered after the failed work through B ([`RULE_TRAVELS`]).
pub fn fault_travels_with_waits<H: Harness>(h: &H, mode: Mode) {
    for source in SOURCES {
        for dependent_first in [true, false] {
            travels_with(h, mode, source, dependent_first);
        }
    }
}

pub(super) fn travels_with<H: Harness>(h: &H, mode: Mode, source: Source, dependent_first: bool) {
    let check = if dependent_first {
        "travels with stream_wait_event (the waiting stream asked first)"
    } else {
        "travels with stream_wait_event (the failing stream asked first)"
    };
    let Some(mut b) = Bench::new(h, mode, check, source) else {
        return;
    };
    let (a, bs, c) = (b.stream(), b.stream(), b.stream());
    let (p, q, r) = (b.page(), b.page(), b.page());
    b.fail(&a, source, p);
    let ea = b.record(&a);
    b.wait_on(&bs, &ea)
        .unwrap_or_else(|e| panic!("{}: stream_wait_event: {e}", b.what));
    b.launch(&bs, TestKernel::Fill, 0x33, &[], &[q]);
    let eb = b.record(&bs);
    let on_b = "a fence of a stream ordered (by stream_wait_event) after the failed work";
    let on_a = "the fence of the failing stream";
    let class = if dependent_first {
        let class = b.expect_wait_fault(&eb, RULE_TRAVELS, on_b);
        if class == Class::Work {
            b.expect_wait_fault(&ea, RULE_STICKY, on_a);
        }
        class
    } else {
        let class = b.expect_wait_fault(&ea, RULE_STICKY, on_a);
        if class == Class::Work {
            b.expect_wait_fault(&eb, RULE_TRAVELS, on_b);
        }
        class
    };
    if class == Class::Lost {
        b.lost_stays_lost(&bs);
        b.settle(&[&a, &bs, &c]);
        return;
    }
    let later = b.record(&bs);
    b.expect_polled_fault(
        &later,
        b.poll(&later),
        RULE_TRAVELS,
        "a later fence of the stream ordered after the failed work",
    );
    b.wait_on(&c, &later)
        .unwrap_or_else(|e| panic!("{}: stream_wait_event: {e}", b.what));
    b.launch(&c, TestKernel::Fill, 0x44, &[], &[r]);
    let ec = b.record(&c);
    b.expect_wait_fault(
        &ec,
        RULE_TRAVELS,
        "a fence of a stream ordered after the failed work through another waiting stream",
    );
    b.settle(&[&a, &bs, &c]);
}
