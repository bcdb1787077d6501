//! Host buffers handed to the device are released only once a fence after their last use has
//! completed, seen as bytes rather than timing: a buffer released early is overwritten (by the
//! suite for the caller's own bytes, by the shim's poison mode for pinned pages, by the next
//! reservation for a recycled pinned slice) while the copy that still needs it is pending, so the
//! copy moves the wrong bytes and a read shows them.
//!
//! In a lazy mode the pending copy runs only when a fence is driven, so an early release is seen
//! every time; in the other modes it is seen when the copy has not run yet.

use crate::harness::{Harness, Mode};
use crate::util::{Ctx, first_diff, must, pattern, small_pages, suspect};
use devcmd::{DeviceConfig, DropPolicy, ExternalBytes, HostBuffer, HostOrigin, ReadRequest};
use devcmd::{Handle, StreamId};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The byte the suite writes over the caller's bytes when the core releases them.
pub const RELEASED_BYTE: u8 = 0xE7;

/// Memory of a [`Witness`], owned by the check so it stays allocated after the core let go.
struct WitnessMem {
    ptr: NonNull<u8>,
    len: usize,
    released: AtomicBool,
}

// SAFETY: the memory is a plain heap allocation owned by this value; it is written only by
// `Witness::drop` (once) and read by copies and the check, and every access goes through the raw
// pointer, never through a reference held across threads.
unsafe impl Send for WitnessMem {}
// SAFETY: as above: shared access only reads or writes through the raw pointer.
unsafe impl Sync for WitnessMem {}

impl Drop for WitnessMem {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
        // SAFETY: made by `Box::into_raw` of a `[u8]` of `len` bytes in `Witness::new`, freed
        // only here; the last holder drops it after the device that used it was dropped.
        drop(unsafe { Box::from_raw(slice) });
    }
}

/// Bytes the caller owns, handed to the core as [`ExternalBytes`] that claim to be pinned (so the
/// core hands them to the copy as they are, with no staging). When the core releases them they
/// are overwritten with [`RELEASED_BYTE`] (the memory stays allocated, held by the check), so a
/// copy that still reads them afterwards uploads that byte instead of the data.
struct Witness(Arc<WitnessMem>);

impl Witness {
    /// A witness of `data`, and the check's hold on its memory.
    fn new(data: &[u8]) -> (Self, Arc<WitnessMem>) {
        let boxed: Box<[u8]> = data.into();
        let len = boxed.len();
        let ptr = NonNull::new(Box::into_raw(boxed).cast::<u8>()).expect("a box is never null");
        let mem = Arc::new(WitnessMem {
            ptr,
            len,
            released: AtomicBool::new(false),
        });
        (Self(Arc::clone(&mem)), mem)
    }
}

// SAFETY: `bytes` returns the same slice every call; it stays allocated until the last `Arc`
// drops (after the device) and unchanged until this value is dropped (only `drop` writes it).
unsafe impl ExternalBytes for Witness {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes, allocated while `self` lives, written only by `drop`.
        unsafe { std::slice::from_raw_parts(self.0.ptr.as_ptr(), self.0.len) }
    }

    fn origin(&self) -> HostOrigin {
        HostOrigin::Pinned
    }
}

impl Drop for Witness {
    fn drop(&mut self) {
        // SAFETY: the allocation is live (held by the `Arc`); the core released the buffer, so no
        // copy may read it any more, and no reference to the bytes is held.
        unsafe { std::ptr::write_bytes(self.0.ptr.as_ptr(), RELEASED_BYTE, self.0.len) };
        self.0.released.store(true, Ordering::SeqCst);
    }
}

/// What happens between an upload and the read that checks it.
#[derive(Debug, Clone, Copy)]
enum Then {
    Nothing,
    Flush,
    FlushTwice,
    Poll,
    Cleanup,
    AnotherUpload,
}

const THENS: [Then; 6] = [
    Then::Nothing,
    Then::Flush,
    Then::FlushTwice,
    Then::Poll,
    Then::Cleanup,
    Then::AnotherUpload,
];

#[track_caller]
fn expect_bytes(got: &[u8], want: &[u8], what: &str, released: &str) {
    if got == want {
        return;
    }
    let why = if !got.is_empty() && got.iter().all(|&b| b == RELEASED_BYTE) {
        " (it holds only the byte the suite writes over released buffers)"
    } else {
        ""
    };
    panic!(
        "{what}: the read gave wrong bytes ({}): the device read or wrote {released} after the \
         core released it, before the fence after its last use completed{why}; the shim call \
         most likely at fault: {} (the core releases a host buffer only once such a fence \
         reports complete), or copy_to_device / copy_to_host (the copy read or wrote the host \
         buffer after the work the fence covers had finished)",
        first_diff(got, want),
        suspect::EARLY_FENCE
    );
}

/// The caller's own bytes (no staging), under `config`: each must be read back exactly, and be
/// released once everything is cleaned up.
fn callers_bytes<H: Harness>(h: &H, mode: Mode, config: DeviceConfig, tag: &str) {
    let Some(mut c) = Ctx::new(h, mode, config, "host_release") else {
        return;
    };
    let s = StreamId(0);
    let mut holds = Vec::new();
    let mut kept = Vec::new();
    for (i, then) in THENS.into_iter().enumerate() {
        let what =
            format!("[{mode}] host_release ({tag}): the caller's upload buffer, then {then:?}");
        let data = pattern(4096, 40 + i as u8);
        let x = must(c.empty(s, 4096), format!("{what}: empty"));
        let (witness, hold) = Witness::new(&data);
        holds.push(hold);
        must(
            c.dev
                .command(s)
                .and_then(|mut k| k.write(&x, HostBuffer::external(Box::new(witness)))),
            format!("{what}: write"),
        );
        match then {
            Then::Nothing => {}
            Then::Flush => must(c.flush(s), format!("{what}: flush")),
            Then::FlushTwice => {
                must(c.flush(s), format!("{what}: flush"));
                must(c.flush(s), format!("{what}: flush"));
            }
            Then::Poll => {
                must(c.flush(s), format!("{what}: flush"));
                must(c.poll(s), format!("{what}: poll"));
            }
            Then::Cleanup => must(
                c.dev.command(s).and_then(|mut k| k.memory_cleanup()),
                format!("{what}: cleanup"),
            ),
            Then::AnotherUpload => {
                let other = pattern(4096, 90 + i as u8);
                let (w2, hold2) = Witness::new(&other);
                holds.push(hold2);
                let y = must(c.empty(s, 4096), format!("{what}: empty"));
                must(
                    c.dev
                        .command(s)
                        .and_then(|mut k| k.write(&y, HostBuffer::external(Box::new(w2)))),
                    format!("{what}: second write"),
                );
                kept.push(y);
            }
        }
        let got = must(c.read(s, &x), format!("{what}: read"));
        expect_bytes(&got, &data, &what, "the caller's buffer");
        kept.push(x);
    }
    drop(kept);
    must(
        c.cleanup_all(),
        format!("[{mode}] host_release ({tag}): cleanup"),
    );
    for (i, hold) in holds.iter().enumerate() {
        assert!(
            hold.released.load(Ordering::SeqCst),
            "[{mode}] host_release ({tag}): the caller's buffer #{i} was never released, though \
             every fence after its copy passed and the queues were drained: the core's drop queue \
             kept it (a leak in the core; a shim whose event_query never reports complete \
             would show this too)"
        );
    }
    c.assert_no_leak(&format!("host_release ({tag})"));
    drop(holds);
}

/// Uploads staged through the pinned pool: pinned pages freed by a cleanup (poisoned by the shim
/// in poison mode) and slices reused by the next upload must not reach a copy still pending.
fn staged_uploads<H: Harness>(h: &H, mode: Mode) {
    let Some(mut c) = Ctx::new(h, mode, small_pages(), "host_release") else {
        return;
    };
    let s = StreamId(0);
    // A slice of a carved pinned page, and (past the 1 MiB pinned page) a pinned page of its own.
    for size in [4096usize, (3 << 20) / 2] {
        let what = format!("[{mode}] host_release: a staged upload of {size} bytes");
        let p1 = pattern(size, 7);
        let x = must(c.create(s, &p1), format!("{what}: create"));
        // The cleanup drains the queue and gives empty pinned pages back to the shim.
        must(
            c.dev.command(s).and_then(|mut k| k.memory_cleanup()),
            format!("{what}: cleanup"),
        );
        let got = must(c.read(s, &x), format!("{what}: read"));
        expect_bytes(
            &got,
            &p1,
            &format!("{what}, then a cleanup"),
            "its pinned staging page",
        );

        let (p2, p3) = (pattern(size, 8), pattern(size, 9));
        let y = must(c.create(s, &p2), format!("{what}: create"));
        let z = must(c.create(s, &p3), format!("{what}: create"));
        let got = must(c.read(s, &y), format!("{what}: read"));
        expect_bytes(
            &got,
            &p2,
            &format!("{what}, then another staged upload of the same size"),
            "its pinned staging slice",
        );
        let got = must(c.read(s, &z), format!("{what}: read"));
        expect_bytes(&got, &p3, &what, "its pinned staging slice");
        drop((x, y, z));
    }
    c.assert_no_leak("host_release (staged uploads)");
}

/// A read dropped before it was waited on: its host buffers must not be reused before its copy
/// landed.
fn dropped_read<H: Harness>(h: &H, mode: Mode) {
    let Some(mut c) = Ctx::new(h, mode, small_pages(), "host_release") else {
        return;
    };
    let s = StreamId(0);
    let what = format!("[{mode}] host_release: a read dropped before it was waited on");
    let p1 = pattern(4096, 11);
    let x = must(c.create(s, &p1), format!("{what}: create"));
    must(c.flush(s), format!("{what}: flush"));
    must(c.flush(s), format!("{what}: flush"));
    let future = must(
        c.dev
            .command(s)
            .and_then(|mut k| k.read_async(&[ReadRequest::whole(&x)])),
        format!("{what}: read_async"),
    );
    drop(future);
    // The next staging buffer of the same size takes the read's buffer if it came back early.
    let p2 = pattern(4096, 12);
    let w: Handle = must(c.create(s, &p2), format!("{what}: create"));
    let got = must(c.read(s, &w), format!("{what}: read"));
    expect_bytes(
        &got,
        &p2,
        &format!("{what}, then a staged upload"),
        "the dropped read's host buffer",
    );
    let got = must(c.read(s, &x), format!("{what}: read"));
    expect_bytes(&got, &p1, &what, "a host buffer");
    drop((x, w));
    c.assert_no_leak("host_release (dropped read)");
}

/// The host-release group. Checks, by the bytes a read returns:
///
/// - the caller's own upload buffer (not staged), then nothing, one flush, two flushes, a poll,
///   a cleanup, or another upload, under the default drop policy and one that flushes after
///   every upload: every read returns exactly the uploaded bytes (the buffer is overwritten with
///   [`RELEASED_BYTE`] the moment the core releases it), and every buffer is released once the
///   queues are drained (none leaked);
/// - uploads staged through the pinned pool, of a carved slice and of a pinned page of its own:
///   read back exactly after a cleanup that frees the pinned pages (the shim poisons them in
///   poison mode), and after another staged upload of the same size (which would reuse a slice
///   released early);
/// - a read dropped before it was waited on: the next staged upload (which would reuse its host
///   buffer) reads back exactly.
pub fn host_release<H: Harness>(h: &H, mode: Mode) {
    callers_bytes(h, mode, small_pages(), "default drop policy");
    let eager = DeviceConfig {
        drops: DropPolicy {
            max_items: 1,
            max_bytes: 1 << 20,
            fill_released: None,
        },
        ..small_pages()
    };
    callers_bytes(h, mode, eager, "a flush after every upload");
    staged_uploads(h, mode);
    dropped_read(h, mode);
}
