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
//! skipped and counted. Errors name the entry (`device_traces[D][I]`) and the key.

use super::{Builder, Origin, ReadOptions, Trace};
use crate::error::{InputError, Place};
use serde_pickle::{DeOptions, HashableValue, Value};
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

fn kind(v: &Value) -> &'static str {
    match v {
        Value::None => "None",
        Value::Bool(_) => "a bool",
        Value::I64(_) | Value::Int(_) => "an int",
        Value::F64(_) => "a float",
        Value::Bytes(_) => "bytes",
        Value::String(_) => "a str",
        Value::List(_) => "a list",
        Value::Tuple(_) => "a tuple",
        Value::Set(_) | Value::FrozenSet(_) => "a set",
        Value::Dict(_) => "a dict",
    }
}

fn text(v: &Value) -> Option<&str> {
    match v {
        Value::String(s) => Some(s),
        Value::Bytes(b) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

fn whole(v: &Value) -> Option<u64> {
    match v {
        Value::I64(i) => u64::try_from(*i).ok(),
        Value::Int(b) => u64::try_from(b).ok(),
        _ => None,
    }
}

fn get<'a>(dict: &'a BTreeMap<HashableValue, Value>, key: &str) -> Option<&'a Value> {
    dict.get(&HashableValue::String(key.to_owned()))
        .or_else(|| dict.get(&HashableValue::Bytes(key.as_bytes().to_vec())))
}

/// Reads a snapshot pickle from `input`.
pub fn read(path: &str, input: impl BufRead, options: ReadOptions) -> Result<Trace, InputError> {
    let de = DeOptions::new()
        .replace_unresolved_globals()
        .replace_recursive_structures();
    let value = serde_pickle::value_from_reader(input, de).map_err(|e| {
        file_error(
            path,
            format!("not a readable pickle ({e}); a snapshot is what torch.cuda.memory._dump_snapshot writes"),
        )
    })?;
    let Value::Dict(top) = &value else {
        return Err(file_error(
            path,
            format!(
                "not a PyTorch memory snapshot: the pickle holds {}, not a dict with \
                 `device_traces` (what torch.cuda.memory._dump_snapshot writes)",
                kind(&value)
            ),
        ));
    };
    let traces = match get(top, "device_traces") {
        Some(Value::List(l)) => l,
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
        .map(|t| match t {
            Value::List(l) => l.len(),
            _ => 0,
        })
        .collect();
    let device = pick_device(path, &sizes, options.device)?;
    let Value::List(entries) = &traces[device] else {
        return Err(file_error(
            path,
            format!(
                "device_traces[{device}] is {}, not a list of entries",
                kind(&traces[device])
            ),
        ));
    };
    convert(path, device, entries, options)
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
    entries: &[Value],
    options: ReadOptions,
) -> Result<Trace, InputError> {
    let mut b = Builder::new(path, Origin::Snapshot { device }, options.lenient);
    let action_of = |e: &Value| match e {
        Value::Dict(d) => get(d, "action").and_then(text).map(str::to_owned),
        _ => None,
    };
    let completed = entries
        .iter()
        .any(|e| action_of(e).as_deref() == Some("free_completed"));
    let free_action = if completed {
        "free_completed"
    } else {
        "free_requested"
    };
    let mut live: HashMap<u64, (u64, u64)> = HashMap::new(); // addr -> (id, entry)
    let mut next_id = 0u64;
    let mut ignored: BTreeMap<String, u64> = BTreeMap::new();
    for (i, entry) in entries.iter().enumerate() {
        let i = i as u64;
        let Value::Dict(d) = entry else {
            return Err(b.error(i, None, format!("{} is not a dict", kind(entry))));
        };
        let action = match get(d, "action") {
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
            match get(d, key) {
                Some(v) => whole(v).ok_or_else(|| {
                    b.error(
                        i,
                        Some(key),
                        format!("{} is not a whole number of bytes", kind(v)),
                    )
                }),
                None => Err(b.error(i, Some(key), "missing".into())),
            }
        };
        let addr = field("addr")?;
        let size = field("size")?;
        if let Some(s) = get(d, "stream") {
            let name = match s {
                Value::I64(n) => n.to_string(),
                Value::Int(n) => n.to_string(),
                other => text(other).unwrap_or("?").to_owned(),
            };
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
