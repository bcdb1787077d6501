//! Futures that sleep: on the std shim a pending `ReadFuture` is woken by the stream's worker
//! when its fence passes (`Shim::event_notify`), so a task awaiting a 100 ms read under an
//! executor is polled twice and costs next to no CPU time; a shim that cannot notify (the
//! trait's default) still completes, by asking to be polled again.

#![cfg(unix)]

use devcmd::{Device, DeviceConfig, KernelParam, Launch, LaunchDims, ReadRequest, StreamId};
use devcmd_std::StdShim;
use devcmd_tests::Counted;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

const S0: StreamId = StreamId(0);
const KERNEL_MS: u64 = 100;

/// A waker that unparks the executor's thread.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the kernel knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Runs `future` on this thread, parking between polls (a one-task executor): returns its output,
/// the polls it took and this thread's CPU time meanwhile.
fn block_on<F: Future>(future: F) -> (F::Output, u32, Duration) {
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    let start = thread_cpu();
    let mut polls = 0;
    loop {
        polls += 1;
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return (out, polls, thread_cpu() - start);
        }
        thread::park();
    }
}

/// A read of a buffer a 100 ms kernel writes, awaited on this thread.
fn await_slow_read<
    S: devcmd::Shim<Kernel = devcmd_std::StdKernel, Event = devcmd_std::StdEvent>,
>(
    mut device: Device<S>,
    kernel: devcmd_std::StdKernel,
) -> (u32, Duration, Duration) {
    let mut cmd = device.command(S0).unwrap();
    let out = cmd.empty(64).unwrap();
    // From before the launch: the kernel may start sleeping before `launch` returns.
    let started = Instant::now();
    cmd.launch(Launch {
        kernel: &kernel,
        dims: LaunchDims::SINGLE,
        inputs: &[],
        outputs: &[&out],
        params: &[KernelParam::Buffer(0)],
    })
    .unwrap();
    let read = cmd.read_async(&[ReadRequest::whole(&out)]).unwrap();
    let (bytes, polls, cpu) = block_on(read);
    let took = started.elapsed();
    assert_eq!(bytes.unwrap()[0].as_slice(), &[7; 64][..]);
    (polls, cpu, took)
}

fn slow_fill(shim: &StdShim) -> devcmd_std::StdKernel {
    shim.register_kernel("slow_fill", |ctx| {
        thread::sleep(Duration::from_millis(KERNEL_MS));
        let ([], [out]) = ctx.io::<u8, 0, 1>()?;
        out.fill(7);
        Ok(())
    })
}

#[test]
fn a_task_awaiting_a_slow_read_sleeps_until_the_worker_wakes_it() {
    let shim = StdShim::new();
    let kernel = slow_fill(&shim);
    let (polls, cpu, took) = await_slow_read(Device::new(shim, DeviceConfig::default()), kernel);
    eprintln!("std shim, woken: {polls} polls, {cpu:?} CPU over {took:?}");
    assert!(took >= Duration::from_millis(KERNEL_MS), "{took:?}");
    // Woken once, when the fence passed: the first poll, and the one that finds it passed (2 in
    // every run so far; `park` may return spuriously, so the bound leaves room for a few). A
    // task that spins polls about a million times.
    assert!(polls <= 10, "{polls} polls: the task did not sleep");
    assert!(
        cpu < Duration::from_millis(20),
        "{cpu:?} of CPU time awaiting a {KERNEL_MS} ms read"
    );
}

#[test]
fn a_shim_that_cannot_notify_still_completes_by_polling() {
    // The std shim behind a wrapper that answers `event_notify` as the trait's default does.
    let shim = StdShim::new();
    let kernel = slow_fill(&shim);
    let counted = Counted::new(shim).without_notify();
    let (polls, cpu, took) = await_slow_read(Device::new(counted, DeviceConfig::default()), kernel);
    eprintln!("std shim, not notifying (as before): {polls} polls, {cpu:?} CPU over {took:?}");
    assert!(took >= Duration::from_millis(KERNEL_MS), "{took:?}");
    assert!(
        polls > 10,
        "{polls} polls: a shim without notification is polled again"
    );
}
