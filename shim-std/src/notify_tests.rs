//! `event_notify`'s wakers: one entry per event value, whatever its task's executor does with
//! wakers (a new one every poll made the list grow by one entry per poll).

use crate::StdShim;
use devcmd::{LaunchDims, Shim};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Wake, Waker};

/// A waker's target that counts its wakes.
#[derive(Debug, Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn wakes(c: &Count) -> usize {
    c.0.load(Ordering::SeqCst)
}

#[test]
fn a_task_given_a_new_waker_every_poll_keeps_one_entry_and_its_latest_waker_is_woken() {
    let shim = StdShim::new();
    let s = shim.create_stream().unwrap();
    let (release, rx) = mpsc::channel::<()>();
    let rx = Mutex::new(rx);
    let block = shim.register_kernel("block", move |_| {
        let _ = crate::lock(&rx).recv();
        Ok(())
    });
    // SAFETY: no buffers: the kernel touches no memory.
    unsafe { shim.launch(&s, &block, LaunchDims::SINGLE, &[], &[]) }.unwrap();
    let event = shim.record_event(&s).unwrap();
    let shared = Arc::clone(&s.shared);

    // An executor that makes a new waker (a new allocation) for each of 100 polls.
    let polls: Vec<Arc<Count>> = (0..100).map(|_| Arc::default()).collect();
    for c in &polls {
        assert!(shim.event_notify(&event, &Waker::from(Arc::clone(c))));
    }
    assert_eq!(
        shared.waiting(),
        1,
        "100 polls of one task on one event with a new waker each time left more than one \
         entry: the list grows with every poll (notify must key on the event value, not on \
         Waker::will_wake alone)"
    );
    // Another value of the same point (a clone) is another task's: it waits apart.
    let other = event.clone();
    let apart = Arc::new(Count::default());
    assert!(shim.event_notify(&other, &Waker::from(Arc::clone(&apart))));
    assert_eq!(shared.waiting(), 2, "a clone of the event must wait apart");

    release.send(()).unwrap();
    // Dropping the stream finishes its queue and joins its worker: every wake has happened.
    drop(s);
    let (last, earlier) = polls.split_last().unwrap();
    assert_eq!(wakes(last), 1, "the latest waker of the task was not woken");
    assert!(
        earlier.iter().all(|c| wakes(c) == 0),
        "a replaced waker was woken: only the latest of a task is kept"
    );
    assert_eq!(wakes(&apart), 1, "the clone's task was not woken");
    assert_eq!(
        shared.waiting(),
        0,
        "entries outlived the point they waited for"
    );
}
