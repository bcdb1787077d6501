//! Staging: whether the host side of a copy goes through pinned memory first, and the ring of
//! pinned buffers a pipelined copy cycles through.
//!
//! Owns the thresholds ([`StagingPolicy`]), the decision ([`Staging::of`]), read by the engine's
//! host side (`command/host_side.rs`), which stages an upload at most once, and each stream's
//! staging ring (`StagingRing`): its buffers and the fence after the last device copy that used
//! each. Does not own the pinned pools the buffers come from (`pinned.rs`), the walk of a
//! pipelined copy and its waits (`command/pipeline.rs`), nor the copies.
//!
//! # The pipeline
//!
//! An upload of ordinary memory of at least [`StagingPolicy::pipeline_from`] bytes is cut into
//! pieces of at most [`StagingPolicy::chunk`] bytes. Each piece is copied by the host into the
//! next buffer of the stream's ring ([`crate::Shim::host_copy`], on the shim's
//! worker threads where it has them), then copied to the device from there, and a fence is
//! recorded after it. While the host copies piece *i*, the device copies piece *i − 1*. A buffer
//! is reused only once the fence after its last device copy passed, so the ring holds at most
//! `depth × chunk` pinned bytes per stream, whatever the size of the copy (beside it, for a
//! while, a buffer whose fence could not be recorded, held by the drop queue until its next
//! fence, or one whose fence could not be read, leaked). A read into ordinary
//! memory runs backwards: the device copies each piece into the next buffer, and the host
//! copies a piece out when its buffer comes round again, or once every piece is enqueued, so
//! the copies out overlap the device copies still in flight (a read of no more pieces than the
//! ring's buffers enqueues every device copy first). The ring keeps its buffers between copies (no pinned
//! allocation per piece, none per copy once warm) and gives them back at a memory cleanup.
//!
//! Reads spread: the ring grows to [`StagingPolicy::read_buffers`] before a read reuses a
//! buffer (while the stream's pinned pool has half its budget free), and a read piece lands
//! after the last one placed in its buffer when it fits there, so short reads in a row walk
//! the whole spread before the device writes a host line again (the host's cores have let go
//! of it by then; a line they still hold costs the DMA twice the time).

use crate::drop_queue::{DropItem, DropQueue};
use crate::fault::FenceMark;
use crate::host::{HostBuffer, HostOrigin};
use crate::shim::Shim;
use alloc::vec::Vec;

/// Thresholds of the staging decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct StagingPolicy {
    /// Unpinned data smaller than this is copied into pinned memory first (a read into a heap
    /// buffer, up to a [`Self::chunk`]: [`Self::stages_read`]).
    pub max_staged: u64,
    /// A copy larger than this flushes the drop queue right after, so its buffer goes soon.
    pub flush_after: u64,
    /// Uploads of unpinned data, and reads into heap memory, of at least this many bytes are
    /// pipelined through the stream's staging ring (see the module documentation), whatever
    /// their size: `max_staged` does not apply to them. `u64::MAX` turns the pipeline off; so
    /// does a build without the `pipeline` feature (on with `std`).
    pub pipeline_from: u64,
    /// Bytes per piece of a pipelined copy: the size of each buffer of the ring. Each piece
    /// costs a device copy and a fence; on the H200's host pieces of 1–2 MiB ran at a third to
    /// two thirds of the DMA rate where pieces of 4–8 MiB reached it (BENCHMARKS.md).
    pub chunk: u64,
    /// Buffers in a stream's staging ring (at most [`MAX_DEPTH`]; 0 turns the pipeline off).
    /// The pinned memory the pipeline holds per stream is `depth × chunk`.
    pub depth: u32,
    /// Bytes of the ring a stream's pipelined reads spread over before the device writes the
    /// same host lines again (rounded up to whole buffers, at most `depth` of them; 0 turns the
    /// spread off: a read reuses the buffer in turn at once and lands at its start, as uploads
    /// do). The device writes pinned lines that the host's cores still hold from the last copy
    /// out at half its rate on the H200's host (the lines are taken back from the cores' caches
    /// first); spread over more than those caches hold, the lines have left them by the time
    /// they are written again (BENCHMARKS.md, "Reads spread over the ring"). The ring of a
    /// stream that reads then holds up to this much pinned memory instead of one buffer, but
    /// grows for the spread only while the stream's pinned pool has half its budget
    /// ([`PinnedConfig::max_bytes`](crate::pinned::PinnedConfig::max_bytes)) free, so the caller's own
    /// pinned buffers keep the rest.
    pub read_spread: u64,
}

/// The deepest staging ring: a pipelined read keeps one entry per buffer on the stack.
pub const MAX_DEPTH: u32 = 8;

impl Default for StagingPolicy {
    fn default() -> Self {
        Self {
            max_staged: 100 << 20,
            flush_after: 10 << 20,
            pipeline_from: 128 << 10,
            chunk: 4 << 20,
            depth: 8,
            read_spread: 16 << 20,
        }
    }
}

impl StagingPolicy {
    /// Whether a copy of `size` bytes of unpinned memory is pipelined.
    pub fn pipelines(&self, size: u64) -> bool {
        size >= self.pipeline_from && self.depth > 0 && self.chunk > 0
    }

    /// Whether a read of `size` bytes into a caller's buffer of `origin`
    /// ([`Command::read_to`](crate::Command::read_to)) lands in pinned memory first, to be copied
    /// into the caller's buffer once its fence passed: heap memory no larger than a piece of the
    /// pipeline ([`Self::chunk`]) and smaller than [`Self::max_staged`], that the pipeline does
    /// not take (`pipelined`: whether it would; a build without the `pipeline` feature never
    /// does). At 4-64 KiB on the H200 such reads ran at 0.59-0.94 of raw DMA into pinned
    /// memory, against 0.44-0.66 through the driver's path into pageable memory (BENCHMARKS.md);
    /// a larger read is the pipeline's, or the driver's where the pipeline is off.
    pub fn stages_read(&self, size: u64, origin: HostOrigin, pipelined: bool) -> bool {
        origin == HostOrigin::Heap
            && size > 0
            && size <= self.chunk
            && size < self.max_staged
            && !pipelined
    }

    /// Buffers in a stream's ring: `depth`, at most [`MAX_DEPTH`].
    pub fn ring_depth(&self) -> usize {
        self.depth.min(MAX_DEPTH) as usize
    }

    /// Buffers a stream's reads spread over: [`Self::read_spread`] in whole buffers, at most
    /// [`Self::ring_depth`].
    pub fn read_buffers(&self) -> usize {
        match self.chunk {
            0 => 0,
            chunk => usize::try_from(self.read_spread.div_ceil(chunk))
                .unwrap_or(usize::MAX)
                .min(self.ring_depth()),
        }
    }
}

/// What to do with the host side of one upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Staging {
    /// Copy the data into pinned memory (or a heap buffer when none is left) before the device
    /// reads it.
    pub through_pinned: bool,
    /// Flush the drop queue right after the copy.
    pub flush_after: bool,
    /// Pipeline the copy through the stream's staging ring (it then takes neither of the
    /// paths above).
    pub pipelined: bool,
}

impl Staging {
    /// The decision for `size` bytes from `origin`.
    ///
    /// File-backed data is always staged (a mapped file may still fault while the device reads
    /// it) and always flushed after; other data is staged when smaller than
    /// [`StagingPolicy::max_staged`] and not already pinned or registered (page-locked in place),
    /// and flushed after when larger than [`StagingPolicy::flush_after`]. Data that is not
    /// page-locked and at least [`StagingPolicy::pipeline_from`] bytes long is pipelined.
    pub fn of(size: u64, origin: HostOrigin, policy: &StagingPolicy) -> Self {
        let file = origin == HostOrigin::FileMapped;
        let locked = matches!(origin, HostOrigin::Pinned | HostOrigin::Registered);
        Self {
            through_pinned: file || (size < policy.max_staged && !locked),
            flush_after: file || size > policy.flush_after,
            pipelined: !locked && policy.pipelines(size),
        }
    }
}

/// A buffer of a staging ring, and the fence after the last device copy that used it.
#[cfg_attr(not(feature = "pipeline"), allow(dead_code))]
pub(crate) struct Slot<S: Shim> {
    pub buffer: HostBuffer,
    pub fence: Option<(S::Event, FenceMark)>,
    /// Where the last read piece placed here ended, rounded up to 64 bytes
    /// ([`Slot::place_read`]).
    read_at: usize,
}

#[cfg_attr(not(feature = "pipeline"), allow(dead_code))]
impl<S: Shim> Slot<S> {
    /// The offset in the buffer (of `chunk` bytes) for a read piece of `len` bytes: where the
    /// last read piece placed here ended, rounded up to 64 bytes (a cache line), when the piece
    /// fits there; otherwise the start. Short reads in a row so walk the buffer, and with the
    /// ring's turn the whole spread, before the device writes a host line again; pieces too
    /// long to share a buffer reuse its start once per turn of the ring.
    pub fn place_read(&mut self, len: usize, chunk: usize) -> usize {
        let at = match self.read_at.checked_add(len) {
            Some(end) if end <= chunk => self.read_at,
            _ => 0,
        };
        self.read_at = (at + len).next_multiple_of(64);
        at
    }
}

/// The staging ring of a stream (see the module documentation): pinned buffers of
/// [`StagingPolicy::chunk`] bytes, used in turn.
pub(crate) struct StagingRing<S: Shim> {
    slots: Vec<Slot<S>>,
    /// The slot whose turn comes next, once the ring is full.
    next: usize,
}

impl<S: Shim> core::fmt::Debug for StagingRing<S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("StagingRing")
            .field("slots", &self.slots.len())
            .field("next", &self.next)
            .finish()
    }
}

// Without the `pipeline` feature only `new` and `retire_into` are called (the ring stays empty).
#[cfg_attr(not(feature = "pipeline"), allow(dead_code))]
impl<S: Shim> StagingRing<S> {
    pub const fn new() -> Self {
        Self {
            slots: Vec::new(),
            next: 0,
        }
    }

    /// Buffers held.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Adds `buffer` (pinned, `chunk` bytes) as a slot with no fence; returns its index.
    pub fn push(&mut self, buffer: HostBuffer) -> usize {
        self.slots.push(Slot {
            buffer,
            fence: None,
            read_at: 0,
        });
        self.slots.len() - 1
    }

    /// The slot whose turn it is (the one used longest ago), or `None` when the ring is empty.
    pub fn peek(&self) -> Option<usize> {
        (!self.slots.is_empty()).then(|| self.next % self.slots.len())
    }

    /// Passes the turn to the next slot.
    pub fn advance(&mut self) {
        if !self.slots.is_empty() {
            self.next = (self.next % self.slots.len() + 1) % self.slots.len();
        }
    }

    pub fn slot_mut(&mut self, i: usize) -> &mut Slot<S> {
        &mut self.slots[i]
    }

    /// Takes slot `i` out of the ring (its buffer is the caller's now).
    pub fn take(&mut self, i: usize) -> HostBuffer {
        let slot = self.slots.remove(i);
        self.next = 0;
        slot.buffer
    }

    /// Hands every buffer to `drops`, which frees each after its next fence (which covers every
    /// copy the ring enqueued), and empties the ring: the pinned memory goes back at a cleanup.
    pub fn retire_into(&mut self, drops: &mut DropQueue<S>) {
        for slot in self.slots.drain(..) {
            drops.push(DropItem::Host(slot.buffer));
        }
        self.next = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn short_read_pieces_walk_a_buffer_on_cache_lines_and_wrap() {
        let mut slot = Slot::<crate::test_shim::TestShim> {
            buffer: HostBuffer::zeroed(4099),
            fence: None,
            read_at: 0,
        };
        // 1000 bytes: 0, then on the next line after each, until one no longer fits.
        let offsets: Vec<usize> = (0..6).map(|_| slot.place_read(1000, 4099)).collect();
        assert_eq!(offsets, [0, 1024, 2048, 3072, 0, 1024]);
        // A whole buffer lands at its start, and the next piece after it wraps too.
        assert_eq!(slot.place_read(4099, 4099), 0);
        assert_eq!(slot.place_read(1, 4099), 0);
        assert_eq!(slot.place_read(1, 4099), 64);
        // A piece that ends exactly at the buffer's end stays; one byte more wraps.
        let mut slot = Slot::<crate::test_shim::TestShim> {
            buffer: HostBuffer::zeroed(4096),
            fence: None,
            read_at: 0,
        };
        assert_eq!(slot.place_read(1024, 4096), 0);
        assert_eq!(slot.place_read(3072, 4096), 1024);
        assert_eq!(slot.place_read(1000, 4096), 0);
        assert_eq!(slot.place_read(3073, 4096), 0);
    }

    proptest::proptest! {
        /// Against a plain model: each piece lands where the last one ended (rounded up to 64
        /// bytes) if it fits there, else at 0, and always inside the buffer.
        #[test]
        fn read_pieces_land_inside_the_buffer_where_the_last_one_ended(
            chunk in 1usize..10_000,
            lens in proptest::collection::vec(1usize..10_000, 1..40),
        ) {
            let mut slot = Slot::<crate::test_shim::TestShim> {
                buffer: HostBuffer::zeroed(0),
                fence: None,
                read_at: 0,
            };
            let mut end = 0usize;
            for len in lens.into_iter().map(|l| 1 + (l - 1) % chunk) {
                let at = slot.place_read(len, chunk);
                let expected = if end.next_multiple_of(64) + len <= chunk {
                    end.next_multiple_of(64)
                } else {
                    0
                };
                proptest::prop_assert_eq!(at, expected);
                proptest::prop_assert!(at + len <= chunk, "{} bytes at {} in {}", len, at, chunk);
                end = at + len;
            }
        }
    }

    #[test]
    fn reads_spread_over_whole_buffers_within_the_depth() {
        let policy = |read_spread, chunk, depth| StagingPolicy {
            read_spread,
            chunk,
            depth,
            ..StagingPolicy::default()
        };
        assert_eq!(StagingPolicy::default().read_buffers(), 4);
        assert_eq!(policy(16 * MIB + 1, 4 * MIB, 8).read_buffers(), 5);
        assert_eq!(policy(64 * MIB, 4 * MIB, 8).read_buffers(), 8);
        assert_eq!(
            policy(64 * MIB, 4 * MIB, 99).read_buffers(),
            MAX_DEPTH as usize
        );
        assert_eq!(policy(0, 4 * MIB, 8).read_buffers(), 0);
        assert_eq!(policy(16 * MIB, 0, 8).read_buffers(), 0);
        assert_eq!(policy(u64::MAX, 1, 3).read_buffers(), 3);
        assert_eq!(policy(u64::MAX, 1, 99).read_buffers(), MAX_DEPTH as usize);
    }

    #[test]
    fn file_backed_data_is_always_staged_and_flushed() {
        let p = StagingPolicy::default();
        for size in [1, 100 * MIB, 400 * MIB] {
            assert_eq!(
                Staging::of(size, HostOrigin::FileMapped, &p),
                Staging {
                    through_pinned: true,
                    flush_after: true,
                    pipelined: size >= p.pipeline_from,
                }
            );
        }
    }

    #[test]
    fn pinned_and_registered_data_is_never_restaged() {
        let p = StagingPolicy::default();
        for size in [1, 50 * MIB, 400 * MIB] {
            assert!(!Staging::of(size, HostOrigin::Pinned, &p).through_pinned);
            assert!(!Staging::of(size, HostOrigin::Registered, &p).through_pinned);
        }
    }

    #[test]
    fn heap_data_is_staged_below_the_threshold_only() {
        let p = StagingPolicy::default();
        assert!(Staging::of(100 * MIB - 1, HostOrigin::Heap, &p).through_pinned);
        assert!(!Staging::of(100 * MIB, HostOrigin::Heap, &p).through_pinned);
    }

    #[test]
    fn unlocked_data_from_the_threshold_on_is_pipelined_whatever_its_size() {
        let p = StagingPolicy::default();
        for origin in [HostOrigin::Heap, HostOrigin::FileMapped] {
            assert!(!Staging::of(p.pipeline_from - 1, origin, &p).pipelined);
            assert!(Staging::of(p.pipeline_from, origin, &p).pipelined);
            assert!(Staging::of(4 << 30, origin, &p).pipelined);
        }
        for origin in [HostOrigin::Pinned, HostOrigin::Registered] {
            assert!(!Staging::of(4 << 30, origin, &p).pipelined);
        }
        let off = StagingPolicy {
            depth: 0,
            ..StagingPolicy::default()
        };
        assert!(!Staging::of(4 << 30, HostOrigin::Heap, &off).pipelined);
    }

    #[test]
    fn a_large_source_is_flushed_without_waiting_for_the_batch() {
        let p = StagingPolicy::default();
        assert!(!Staging::of(10 * MIB, HostOrigin::Heap, &p).flush_after);
        assert!(Staging::of(10 * MIB + 1, HostOrigin::Heap, &p).flush_after);
        assert!(Staging::of(1, HostOrigin::FileMapped, &p).flush_after);
    }
}
