//! PyTorch memory snapshots: the pickle `torch.cuda.memory._dump_snapshot` writes.
//!
//! Owns turning one device's trace into operations. The pickle is a dict whose `device_traces` is
//! a list (one per device) of lists of entries, each a dict with `action`, `addr`, `size`,
//! `stream` (and `frames`, `time_us`, ..., ignored). `alloc` becomes an allocation with a fresh id
//! (numbered from 0, in order of allocation, as `scripts/traces/capture.py` numbers them), keyed by its address until freed; the free is `free_completed` when the
//! device's trace has any (the block is back in PyTorch's pool: what the allocator saw), else
//! `free_requested`. Segment events (`segment_alloc`, `segment_free`, `segment_map`, ...) are
//! PyTorch's own pages and are ignored, as are `snapshot` and `oom` (counted in the notes). A
//! free of an address the trace never saw allocated (allocated before the recording began) is
//! skipped and counted. Errors name the entry (`device_traces[D][I]`) and the key, and what was
//! found (a negative or too large size says so). The pickle itself is read by `pickle.rs`, which
//! never recurses and bounds its memory by the file's size.

use super::pickle::{self, Id, Node, Pickle};
use super::{Builder, Origin, ReadOptions, Trace};
use crate::error::{InputError, Place};
use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;

fn file_error(path: &str, message: String) -> InputError {
    InputError {
        path: path.to_owned(),
        place: Place::File,
        field: None,
        message,
    }
}

fn kind(v: &Node) -> &'static str {
    match v {
        Node::None => "None",
        Node::Bool(_) => "a bool",
        Node::Int(_) | Node::Big { .. } => "an int",
        Node::Float(_) => "a float",
        Node::Bytes(_) => "bytes",
        Node::Str(_) => "a str",
        Node::List(_) => "a list",
        Node::Tuple(_) => "a tuple",
        Node::Set(_) => "a set",
        Node::Dict(_) => "a dict",
        Node::Object => "an object",
    }
}

fn text(v: &Node) -> Option<&str> {
    match v {
        Node::Str(s) => Some(s),
        Node::Bytes(b) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

/// A whole number of bytes (or an address), or what was found instead.
fn whole(v: &Node) -> Result<u64, String> {
    match v {
        Node::Int(i) if *i < 0 => Err(format!(
            "{i} is negative: a size or an address is 0 or more"
        )),
        Node::Int(i) => u64::try_from(*i)
            .map_err(|_| format!("{i} is too large: a size or an address is below 2^64")),
        Node::Big {
            negative: true,
            bytes,
        } => Err(format!(
            "an int of {bytes} bytes is negative: a size or an address is 0 or more"
        )),
        Node::Big { bytes, .. } => Err(format!(
            "an int of {bytes} bytes is too large: a size or an address is below 2^64"
        )),
        other => Err(format!("{} is not a whole number of bytes", kind(other))),
    }
}

/// The most keys a trace entry may have (PyTorch writes about eight).
const MAX_ENTRY_KEYS: usize = 64;
/// The longest stream name read (PyTorch writes an int).
const MAX_STREAM_NAME: usize = 256;

/// The value under the str (or bytes) key `key` of `dict`.
fn get<'a>(p: &'a Pickle, dict: &[(Id, Id)], key: &str) -> Option<&'a Node> {
    dict.iter()
        .find(|(k, _)| text(p.node(*k)) == Some(key))
        .map(|(_, v)| p.node(*v))
}

/// Reads a snapshot pickle from `input`.
pub fn read(path: &str, input: impl BufRead, options: ReadOptions) -> Result<Trace, InputError> {
    let p = pickle::read(input).map_err(|e| {
        file_error(
            path,
            format!(
                "not a readable pickle (at byte {}: {}); a snapshot is what \
                 torch.cuda.memory._dump_snapshot writes",
                e.offset, e.message
            ),
        )
    })?;
    let value = p.node(p.root);
    let Node::Dict(top) = value else {
        return Err(file_error(
            path,
            format!(
                "not a PyTorch memory snapshot: the pickle holds {}, not a dict with \
                 `device_traces` (what torch.cuda.memory._dump_snapshot writes)",
                kind(value)
            ),
        ));
    };
    let traces = match get(&p, top, "device_traces") {
        Some(Node::List(l)) => l,
        Some(other) => {
            return Err(file_error(
                path,
                format!(
                    "`device_traces` is {}, not a list (one list of entries per device)",
                    kind(other)
                ),
            ));
        }
        None => {
            return Err(file_error(
                path,
                "not a PyTorch memory snapshot: the dict has no `device_traces` (was the \
                 snapshot taken with torch.cuda.memory._record_memory_history() on?)"
                    .into(),
            ));
        }
    };
    let sizes: Vec<usize> = traces
        .iter()
        .map(|t| match p.node(*t) {
            Node::List(l) => l.len(),
            _ => 0,
        })
        .collect();
    let device = pick_device(path, &sizes, options.device)?;
    let Node::List(entries) = p.node(traces[device]) else {
        return Err(file_error(
            path,
            format!(
                "device_traces[{device}] is {}, not a list of entries",
                kind(p.node(traces[device]))
            ),
        ));
    };
    convert(path, device, &p, entries, options)
}

fn pick_device(path: &str, sizes: &[usize], asked: Option<usize>) -> Result<usize, InputError> {
    let with: Vec<String> = sizes
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(d, n)| format!("device {d}: {n} entries"))
        .collect();
    match asked {
        Some(d) if d < sizes.len() => Ok(d),
        Some(d) => Err(file_error(
            path,
            format!(
                "--device {d}: the snapshot has traces of {} devices ({})",
                sizes.len(),
                if with.is_empty() {
                    "all empty".into()
                } else {
                    with.join(", ")
                }
            ),
        )),
        None => {
            let mut nonempty = sizes.iter().enumerate().filter(|(_, n)| **n > 0);
            match (nonempty.next(), nonempty.next()) {
                (Some((d, _)), None) => Ok(d),
                (None, _) => Err(file_error(
                    path,
                    "the snapshot's device traces are empty: call \
                     torch.cuda.memory._record_memory_history() before the work, then \
                     _dump_snapshot"
                        .into(),
                )),
                (Some(_), Some(_)) => Err(file_error(
                    path,
                    format!(
                        "the snapshot has traces of several devices ({}): pass --device N",
                        with.join(", ")
                    ),
                )),
            }
        }
    }
}

fn convert(
    path: &str,
    device: usize,
    p: &Pickle,
    entries: &[Id],
    options: ReadOptions,
) -> Result<Trace, InputError> {
    let mut b = Builder::new(path, Origin::Snapshot { device }, options.lenient);
    let action_of = |e: Id| match p.node(e) {
        Node::Dict(d) => get(p, d, "action").and_then(text),
        _ => None,
    };
    let completed = entries
        .iter()
        .any(|e| action_of(*e) == Some("free_completed"));
    let free_action = if completed {
        "free_completed"
    } else {
        "free_requested"
    };
    let mut live: HashMap<u64, (u64, u64)> = HashMap::new(); // addr -> (id, entry)
    let mut next_id = 0u64;
    let mut ignored: BTreeMap<String, u64> = BTreeMap::new();
    for (i, &entry) in entries.iter().enumerate() {
        let i = i as u64;
        let entry = p.node(entry);
        let Node::Dict(d) = entry else {
            return Err(b.error(i, None, format!("{} is not a dict", kind(entry))));
        };
        // Each field is looked up by a scan of the entry: a few keys, as PyTorch writes them.
        // A dict of thousands shared by every entry would make the read quadratic.
        if d.len() > MAX_ENTRY_KEYS {
            return Err(b.error(
                i,
                None,
                format!(
                    "an entry of {} keys; a snapshot's trace entries hold a few (action, addr, \
                     size, stream, frames...), at most {MAX_ENTRY_KEYS} are read",
                    d.len()
                ),
            ));
        }
        let action = match get(p, d, "action") {
            Some(v) => text(v)
                .ok_or_else(|| b.error(i, Some("action"), format!("{} is not a str", kind(v))))?,
            None => return Err(b.error(i, Some("action"), "missing".into())),
        };
        let is_alloc = action == "alloc";
        if !is_alloc && action != free_action {
            *ignored.entry(action.to_owned()).or_default() += 1;
            continue;
        }
        let field = |key: &'static str| -> Result<u64, InputError> {
            match get(p, d, key) {
                Some(v) => whole(v).map_err(|found| b.error(i, Some(key), found)),
                None => Err(b.error(i, Some(key), "missing".into())),
            }
        };
        let addr = field("addr")?;
        let size = field("size")?;
        if let Some(s) = get(p, d, "stream") {
            let name = match s {
                Node::Int(n) => n.to_string(),
                other => text(other).unwrap_or("?").to_owned(),
            };
            if name.len() > MAX_STREAM_NAME {
                return Err(b.error(
                    i,
                    Some("stream"),
                    format!(
                        "a name of {} bytes; a stream is an int or a short name (at most \
                         {MAX_STREAM_NAME} bytes)",
                        name.len()
                    ),
                ));
            }
            b.stream(&name);
        }
        if is_alloc {
            if let Some(&(old, at)) = live.get(&addr) {
                if !options.lenient {
                    return Err(b.error(
                        i,
                        Some("addr"),
                        format!(
                            "an alloc at {addr:#x}, which is live (allocated at \
                             device_traces[{device}][{at}], never freed); pass --lenient to \
                             treat the new allocation as freeing the old one"
                        ),
                    ));
                }
                b.implicit_frees += 1;
                b.free(old, None, i)?;
            }
            b.alloc(next_id, size, i)?;
            live.insert(addr, (next_id, i));
            next_id += 1;
        } else {
            match live.remove(&addr) {
                Some((id, _)) => b.free(id, Some(size), i)?,
                None => b.skip_free(),
            }
        }
    }
    b.notes.push(format!(
        "snapshot of device {device}: frees are its `{free_action}` events"
    ));
    if !ignored.is_empty() {
        let list: Vec<String> = ignored.iter().map(|(a, n)| format!("{n} {a}")).collect();
        b.notes
            .push(format!("entries not replayed: {}", list.join(", ")));
    }
    Ok(b.finish())
}
