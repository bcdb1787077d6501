//! Reading a trace: the replayable form every input becomes, and telling the formats apart.
//!
//! Owns [`Trace`] and [`Op`] (an allocation or a free of a dense *slot*, so the replay indexes a
//! vector instead of hashing ids), the checks every format shares (`Builder`: a free of an id
//! that is not live, an id allocated twice while live, a size of 0), and [`read`], which opens a
//! file and picks the parser by its magic bytes (gzip `1f 8b`, pickle `80 02..05`, else CSV
//! text), not by its extension. The formats themselves are in `csv.rs` (`seq,action,id,size,
//! stream`) and `snapshot.rs` (PyTorch's memory snapshot pickle, read by `pickle.rs`: no recursion,
//! memory in proportion to the bytes read: for a gzipped file, the inflated bytes, which a small
//! file can make large).

mod csv;
pub mod pickle;
mod snapshot;

use crate::error::{Failure, InputError, Place};
use crate::progress::Progress;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Reserve `size` bytes into the slot.
    Alloc,
    /// Drop the slot's allocation.
    Free,
}

/// One operation of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    /// Alloc or free.
    pub action: Action,
    /// The dense slot the allocation lives in while live (reused once freed).
    pub slot: u32,
    /// Bytes asked for (the allocation's size, for a free too).
    pub size: u64,
    /// The trace's id of the allocation (a snapshot's allocations are numbered from 0).
    pub id: u64,
    /// Where it came from: the CSV line, or the snapshot entry's index.
    pub source: u64,
}

/// Where a trace's operations came from, to name them in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// CSV lines.
    Csv,
    /// Entries of one device's trace in a snapshot.
    Snapshot {
        /// The device.
        device: usize,
    },
}

/// A trace ready to replay.
#[derive(Debug, Clone)]
pub struct Trace {
    /// The path, as given.
    pub path: String,
    /// `csv`, `csv.gz`, `snapshot` or `snapshot.gz`.
    pub format: &'static str,
    /// Where the operations came from.
    pub origin: Origin,
    /// The operations, in order.
    pub ops: Vec<Op>,
    /// Slots used: the most allocations live at once.
    pub slots: usize,
    /// Allocations.
    pub allocs: u64,
    /// Frees.
    pub frees: u64,
    /// Most bytes live at once (as asked for).
    pub live_peak: u64,
    /// Distinct streams named by the trace (replayed as one).
    pub streams: usize,
    /// What the reader skipped or assumed, for the report.
    pub notes: Vec<String>,
}

impl Trace {
    /// Where operation `op` came from, for messages.
    pub fn place(&self, op: &Op) -> Place {
        match self.origin {
            Origin::Csv => Place::Line(op.source),
            Origin::Snapshot { device } => Place::Entry {
                device,
                index: op.source,
            },
        }
    }
}

/// How to read a trace.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadOptions {
    /// Skip frees of ids that are not live, and treat an id allocated again while live as freed
    /// first, instead of refusing the trace.
    pub lenient: bool,
    /// The device of a snapshot to replay (needed when several have entries).
    pub device: Option<usize>,
}

/// Reads the trace at `path`, whatever its format (told by its first bytes).
pub fn read(path: &str, options: ReadOptions, progress: &mut Progress) -> Result<Trace, Failure> {
    let file = File::open(path).map_err(|e| Failure::Input(format!("{path}: cannot open: {e}")))?;
    let total = file.metadata().map(|m| m.len()).unwrap_or(0);
    read_from(path, file, total, options, progress)
}

/// Reads a trace held in memory, `bytes`, named `name` in messages, as [`read`] reads a file (the
/// fuzz targets' entry).
pub fn read_bytes(name: &str, bytes: &[u8], options: ReadOptions) -> Result<Trace, Failure> {
    read_from(
        name,
        bytes,
        bytes.len() as u64,
        options,
        &mut Progress::off(),
    )
}

/// Reads a trace from `source` (`total` bytes, for progress), named `path` in messages.
fn read_from(
    path: &str,
    source: impl Read,
    total: u64,
    options: ReadOptions,
    progress: &mut Progress,
) -> Result<Trace, Failure> {
    let counted = Arc::new(AtomicU64::new(0));
    let reader = Counting {
        inner: source,
        read: Arc::clone(&counted),
    };
    let mut raw = BufReader::with_capacity(1 << 16, reader);
    let io = |e: std::io::Error| Failure::Input(format!("{path}: cannot read: {e}"));
    let gzip = raw.fill_buf().map_err(io)?.starts_with(&[0x1f, 0x8b]);
    let io = |e: std::io::Error| {
        let hint = if gzip {
            " (a damaged or cut-off gzip file?)"
        } else {
            ""
        };
        Failure::Input(format!("{path}: cannot read: {e}{hint}"))
    };
    let mut inner: Box<dyn BufRead + '_> = if gzip {
        Box::new(BufReader::with_capacity(
            1 << 16,
            flate2::read::MultiGzDecoder::new(raw),
        ))
    } else {
        Box::new(raw)
    };
    let head = inner.fill_buf().map_err(io)?;
    let pickle = head.len() >= 2 && head[0] == 0x80 && (2..=5).contains(&head[1]);
    let track = Tracker {
        read: counted,
        total,
    };
    let trace = if pickle {
        progress.phase(format!("reading {path} (snapshot)"));
        progress.update(0, 1);
        let t = snapshot::read(path, inner, options)?;
        progress.update(1, 1);
        t
    } else {
        progress.phase(format!("reading {path}"));
        csv::read(path, inner, options, || {
            progress.update(track.read.load(Ordering::Relaxed), track.total);
        })?
    };
    if trace.ops.is_empty() {
        return Err(Failure::Input(format!(
            "{path}: the trace holds no allocation (nothing to replay)"
        )));
    }
    let format = match (pickle, gzip) {
        (false, false) => "csv",
        (false, true) => "csv.gz",
        (true, false) => "snapshot",
        (true, true) => "snapshot.gz",
    };
    Ok(Trace { format, ..trace })
}

/// How far into the file the reader is (compressed bytes, for a gzipped trace).
struct Tracker {
    read: Arc<AtomicU64>,
    total: u64,
}

/// Counts the bytes read from the file, for progress.
struct Counting<R> {
    inner: R,
    read: Arc<AtomicU64>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

#[derive(Debug)]
struct Live {
    slot: u32,
    size: u64,
    source: u64,
}

/// Builds a [`Trace`] from allocations and frees by id, with the checks every format shares.
#[derive(Debug)]
pub(crate) struct Builder {
    path: String,
    origin: Origin,
    lenient: bool,
    ops: Vec<Op>,
    live: HashMap<u64, Live>,
    free_slots: Vec<u32>,
    slots: u32,
    live_bytes: u64,
    live_peak: u64,
    allocs: u64,
    frees: u64,
    streams: HashSet<String>,
    skipped_frees: u64,
    implicit_frees: u64,
    pub(crate) notes: Vec<String>,
}

impl Builder {
    pub(crate) fn new(path: &str, origin: Origin, lenient: bool) -> Self {
        Self {
            path: path.to_owned(),
            origin,
            lenient,
            ops: Vec::new(),
            live: HashMap::new(),
            free_slots: Vec::new(),
            slots: 0,
            live_bytes: 0,
            live_peak: 0,
            allocs: 0,
            frees: 0,
            streams: HashSet::new(),
            skipped_frees: 0,
            implicit_frees: 0,
            notes: Vec::new(),
        }
    }

    /// The place `source` (a line or an entry index) names.
    fn place(&self, source: u64) -> Place {
        match self.origin {
            Origin::Csv => Place::Line(source),
            Origin::Snapshot { device } => Place::Entry {
                device,
                index: source,
            },
        }
    }

    /// An error at `source` in `field`.
    pub(crate) fn error(
        &self,
        source: u64,
        field: Option<&'static str>,
        message: String,
    ) -> InputError {
        InputError {
            path: self.path.clone(),
            place: self.place(source),
            field,
            message,
        }
    }

    pub(crate) fn stream(&mut self, stream: &str) {
        if !self.streams.contains(stream) {
            self.streams.insert(stream.to_owned());
        }
    }

    /// An allocation of `size` bytes named `id`.
    pub(crate) fn alloc(&mut self, id: u64, size: u64, source: u64) -> Result<(), InputError> {
        if size == 0 {
            return Err(self.error(
                source,
                Some("size"),
                "an allocation of 0 bytes: the replay needs at least 1 byte (drop the line, or \
                 record the size the allocator was asked for)"
                    .into(),
            ));
        }
        if let Some(old) = self.live.get(&id) {
            if !self.lenient {
                let msg = format!(
                    "id {id} is allocated again while live (allocated at {}, never freed); free \
                     it first, or pass --lenient to treat the new allocation as freeing the old one",
                    self.place(old.source)
                );
                return Err(self.error(source, Some("id"), msg));
            }
            self.implicit_frees += 1;
            self.free(id, None, source)?;
        }
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                let s = self.slots;
                self.slots = self.slots.checked_add(1).ok_or_else(|| {
                    self.error(source, None, "more than 2^32 allocations live".into())
                })?;
                s
            }
        };
        self.live_bytes = self.live_bytes.checked_add(size).ok_or_else(|| {
            self.error(
                source,
                Some("size"),
                format!(
                    "{size} more bytes make the live bytes pass 2^64 ({} live already): no \
                     device holds that much; check the trace's sizes",
                    self.live_bytes
                ),
            )
        })?;
        self.live.insert(id, Live { slot, size, source });
        self.live_peak = self.live_peak.max(self.live_bytes);
        self.allocs += 1;
        self.ops.push(Op {
            action: Action::Alloc,
            slot,
            size,
            id,
            source,
        });
        Ok(())
    }

    /// A free of `id`, which says it had `size` bytes (`None` or 0: not said).
    pub(crate) fn free(
        &mut self,
        id: u64,
        size: Option<u64>,
        source: u64,
    ) -> Result<(), InputError> {
        let Some(live) = self.live.get(&id) else {
            if self.lenient {
                self.skipped_frees += 1;
                return Ok(());
            }
            return Err(self.error(
                source,
                Some("id"),
                format!(
                    "a free of id {id}, which is not live (never allocated, or freed already); \
                     fix the trace, or pass --lenient to skip such frees (a trace cut out of a \
                     longer one frees what it never saw allocated)"
                ),
            ));
        };
        if let Some(said) = size.filter(|&s| s != 0 && s != live.size) {
            return Err(self.error(
                source,
                Some("size"),
                format!(
                    "the free of id {id} says {said} bytes, its allocation at {} asked for {} \
                     (give the allocation's size, 0, or nothing)",
                    self.place(live.source),
                    live.size
                ),
            ));
        }
        let live = self.live.remove(&id).expect("looked up above");
        self.free_slots.push(live.slot);
        self.live_bytes -= live.size;
        self.frees += 1;
        self.ops.push(Op {
            action: Action::Free,
            slot: live.slot,
            size: live.size,
            id,
            source,
        });
        Ok(())
    }

    /// Skips a free of something the trace never saw allocated (counted in the notes).
    pub(crate) fn skip_free(&mut self) {
        self.skipped_frees += 1;
    }

    pub(crate) fn finish(mut self) -> Trace {
        if self.skipped_frees > 0 {
            self.notes.push(format!(
                "{} frees of allocations the trace never saw allocated were skipped",
                self.skipped_frees
            ));
        }
        if self.implicit_frees > 0 {
            self.notes.push(format!(
                "{} ids were allocated again while live: the old allocation was freed first",
                self.implicit_frees
            ));
        }
        if !self.live.is_empty() {
            self.notes.push(format!(
                "{} allocations are still live at the end of the trace",
                self.live.len()
            ));
        }
        if self.streams.len() > 1 {
            self.notes.push(format!(
                "the trace names {} streams; they are replayed as one (a manager serves one \
                 stream)",
                self.streams.len()
            ));
        }
        Trace {
            path: self.path,
            format: "",
            origin: self.origin,
            ops: self.ops,
            slots: self.slots as usize,
            allocs: self.allocs,
            frees: self.frees,
            live_peak: self.live_peak,
            streams: self.streams.len(),
            notes: self.notes,
        }
    }
}
