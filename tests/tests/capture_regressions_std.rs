//! Capture defects found in review, one test each (std shim, lazy + poison).

mod common;

use common::{S0, S1, launch, lazy_device, read};
use devcmd::{Device, DeviceConfig, DriverError, IoError, ServerError, Shim};
use devcmd_std::{StdKernel, StdShim};
use devcmd_tests::forward::{Forward, Hooks};
use std::panic::{AssertUnwindSafe, catch_unwind};

fn fill_kernel(shim: &StdShim, v: u8) -> StdKernel {
    shim.register_kernel("fill", move |ctx| {
        ctx.buffers_mut()?[0].fill(v);
        Ok(())
    })
}

fn kept_by_graph(r: Result<(), ServerError>) -> bool {
    matches!(r, Err(ServerError::Io(IoError::KeptByGraph { .. })))
}

/// `bind` gave a graph's memory to another handle: the graph could never be replayed, and the
/// memory lost the guard the graph relies on. Refused now, and the graph replays.
#[test]
fn the_memory_of_a_live_graph_cannot_be_bound_away() {
    let (shim, mut d) = lazy_device();
    let fill = fill_kernel(&shim, 7);
    let x = d.command(S0).unwrap().create(&[1u8; 256]).unwrap();
    let rec = d.command(S0).unwrap().begin_capture("g").unwrap();
    launch(&mut d, S0, &fill, &[], &[&x]).unwrap();
    let g = d.command(S0).unwrap().end_capture(rec).unwrap();
    let target = d.command(S0).unwrap().lazy(256);
    let r = d.command(S0).unwrap().bind(x.clone(), &target);
    assert!(kept_by_graph(r.clone()), "{r:?}");
    assert!(r.unwrap_err().to_string().contains("drop the graph"));
    d.command(S0).unwrap().replay(&g).unwrap();
    assert_eq!(read(&mut d, S0, &x).unwrap(), vec![7u8; 256]);
    drop(g);
    // The graph gone (and a fence after its replay passed), the room may change hands again.
    let mut cmd = d.command(S0).unwrap();
    cmd.flush_drops().unwrap(); // a fence after the replay, for what the queue holds
    cmd.flush_drops().unwrap(); // passed: the graph's share is let go
    cmd.bind(x, &target).unwrap();
}

/// The same inside the recording: memory the recorded work uses is not bound away, so the graph
/// it seals keeps (and guards) it.
#[test]
fn the_memory_of_the_open_recording_cannot_be_bound_away() {
    let (shim, mut d) = lazy_device();
    let fill = fill_kernel(&shim, 7);
    let x = d.command(S0).unwrap().create(&[1u8; 256]).unwrap();
    let target = d.command(S0).unwrap().lazy(256);
    let rec = d.command(S0).unwrap().begin_capture("g").unwrap();
    launch(&mut d, S0, &fill, &[], &[&x]).unwrap();
    let r = d.command(S0).unwrap().bind(x.clone(), &target);
    assert!(kept_by_graph(r.clone()), "{r:?}");
    let g = d.command(S0).unwrap().end_capture(rec).unwrap();
    d.command(S0).unwrap().replay(&g).unwrap();
    assert_eq!(read(&mut d, S0, &x).unwrap(), vec![7u8; 256]);
}

/// A `read_to` future waited while a stream records made a host wait CUDA refuses in a capture
/// (`ReadFuture` already refused it): now refused the same way, the buffer given up to the drop
/// queue, and the recording kept.
#[test]
fn a_read_to_waited_while_recording_is_refused_and_the_recording_survives() {
    let (shim, mut d) = lazy_device();
    let fill = fill_kernel(&shim, 9);
    let x = d.command(S0).unwrap().create(&[1u8; 64]).unwrap();
    let y = d.command(S1).unwrap().create(&[2u8; 64]).unwrap();
    let buffer = devcmd::HostBuffer::zeroed(64);
    let pending = d
        .command(S1)
        .unwrap()
        .read_to(devcmd::ReadRequest::whole(&y), buffer)
        .unwrap();
    let rec = d.command(S0).unwrap().begin_capture("g").unwrap();
    launch(&mut d, S0, &fill, &[], &[&x]).unwrap();
    let r = pending.wait();
    assert!(
        matches!(
            r,
            Err(ServerError::Validation(
                devcmd::Validation::Recording { .. }
            ))
        ),
        "{r:?}"
    );
    let g = d.command(S0).unwrap().end_capture(rec).unwrap();
    d.command(S0).unwrap().replay(&g).unwrap();
    assert_eq!(read(&mut d, S0, &x).unwrap(), vec![9u8; 64]);
}

/// A shim whose `graph_upload` panics (a shim bug, or a panic in a user's own shim).
#[derive(Debug, Default, Clone)]
struct UploadPanics;

impl Hooks<StdShim> for UploadPanics {
    fn graph_upload(
        &self,
        _inner: &StdShim,
        _graph: &<StdShim as Shim>::Graph,
        _stream: &<StdShim as Shim>::Stream,
    ) -> Result<(), DriverError> {
        panic!("the test shim's graph_upload panics");
    }
}

/// `Command::seal` raised the graph counts of the recorded memory before the graph that lowers
/// them existed: a panic in the shim's `graph_upload`, caught by the host, left them raised, and
/// `bind` answered `KeptByGraph` for memory no graph keeps. The counts rise last now.
#[test]
fn a_panic_while_sealing_a_graph_leaves_its_memory_free_to_move() {
    let shim = Forward {
        inner: StdShim::builder().lazy(true).poison(true).build(),
        hooks: UploadPanics,
    };
    let mut d = Device::new(shim.clone(), DeviceConfig::default());
    let fill = fill_kernel(&shim.inner, 7);
    let x = d.command(S0).unwrap().create(&[1u8; 256]).unwrap();
    let rec = d.command(S0).unwrap().begin_capture("g").unwrap();
    launch(&mut d, S0, &fill, &[], &[&x]).unwrap();
    let sealed = catch_unwind(AssertUnwindSafe(|| {
        d.command(S0).unwrap().end_capture(rec).map(drop)
    }));
    assert!(sealed.is_err(), "the shim's panic reaches the caller");
    assert!(!x.is_kept_by_graph(), "no graph exists, so none keeps x");
    let target = d.command(S0).unwrap().lazy(256);
    d.command(S0).unwrap().bind(x, &target).unwrap();
    // The recorded fill never ran: the bytes are the upload's.
    assert_eq!(read(&mut d, S0, &target).unwrap(), vec![1u8; 256]);
}

/// A shim whose `begin_capture` panics, or whose `end_capture` panics once the capture ended (a
/// shim bug, or a panic in a user's own shim); the other calls are the std shim's.
#[derive(Debug, Default, Clone)]
struct CapturePanics {
    at_begin: bool,
}

impl Hooks<StdShim> for CapturePanics {
    fn begin_capture(
        &self,
        inner: &StdShim,
        stream: &<StdShim as Shim>::Stream,
    ) -> Result<(), DriverError> {
        assert!(!self.at_begin, "the test shim's begin_capture panics");
        inner.begin_capture(stream)
    }

    /// Ends the capture, then panics (as a shim whose instantiation panics).
    fn end_capture(
        &self,
        inner: &StdShim,
        stream: &<StdShim as Shim>::Stream,
        doomed: bool,
    ) -> Result<<StdShim as Shim>::Graph, DriverError> {
        let _ = inner.end_capture(stream, doomed);
        panic!("the test shim's end_capture panics");
    }
}

/// The recording flag (which freezes the drop queues and keeps futures from waiting) was raised
/// before the shim's begin and lowered after the shim's end: a panic in either, caught by the
/// host, left it raised for good, and every later read refused to wait. It is lowered on the
/// way out now, whatever the shim does.
#[test]
fn a_panic_in_the_shims_begin_or_end_of_a_recording_leaves_no_recording_behind() {
    for at_begin in [true, false] {
        let shim = Forward {
            inner: StdShim::new(),
            hooks: CapturePanics { at_begin },
        };
        let mut d = Device::new(shim, DeviceConfig::default());
        let x = d.command(S0).unwrap().create(&[3u8; 64]).unwrap();
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            let rec = d.command(S0).unwrap().begin_capture("p").unwrap();
            d.command(S0).unwrap().end_capture(rec).map(drop)
        }));
        assert!(panicked.is_err(), "the shim's panic reaches the caller");
        assert_eq!(
            read(&mut d, S0, &x).unwrap(),
            vec![3u8; 64],
            "a read after the panic (at_begin: {at_begin}) waits as usual"
        );
    }
}
