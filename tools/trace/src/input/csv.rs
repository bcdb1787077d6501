//! The CSV trace format: a header line, then one operation a line.
//!
//! ```text
//! seq,action,id,size,stream
//! 0,alloc,1,4096,0
//! 1,free,1,4096,0
//! ```
//!
//! Owns reading it. Columns are found by name in the header (any order; `action`, `id` and
//! `size` are needed, `seq` and `stream` are optional, others are ignored); `action` is `alloc`
//! or `free`; `id` a whole number (decimal or `0x` hex); `size` a byte count (on a free: the
//! allocation's size, 0 or empty); `seq` a whole number when given; `stream` any token. Blank
//! lines and lines starting with `#` are skipped. Every error names the line and the field.

use super::{Builder, Origin, ReadOptions, Trace};
use crate::error::InputError;
use std::io::BufRead;

/// The columns the format names, in the order a writer should use.
pub const HEADER: &str = "seq,action,id,size,stream";

#[derive(Debug, Default)]
struct Columns {
    count: usize,
    seq: Option<usize>,
    action: usize,
    id: usize,
    size: usize,
    stream: Option<usize>,
}

/// At most 80 characters of `line`, for a message (a long line is cut, marked with `...`).
fn shown(line: &str) -> String {
    match line.char_indices().nth(80) {
        Some((at, _)) => format!("{}...", &line[..at]),
        None => line.to_owned(),
    }
}

/// The most columns a header may name: the format has five, and a header of thousands of commas
/// would otherwise cost memory per comma.
const MAX_COLUMNS: usize = 64;

fn header(b: &Builder, line: &str, n: u64) -> Result<Columns, InputError> {
    let columns = line.split(',').count();
    if columns > MAX_COLUMNS {
        return Err(b.error(
            n,
            None,
            format!(
                "the header has {columns} columns, at most {MAX_COLUMNS} are read: a trace starts \
                 with the header `{HEADER}` (then one operation a line)"
            ),
        ));
    }
    let names: Vec<String> = line
        .split(',')
        .map(|c| c.trim().to_ascii_lowercase())
        .collect();
    let find = |name: &str| names.iter().position(|c| c == name);
    let need = |name: &'static str| {
        find(name).ok_or_else(|| {
            b.error(
                n,
                None,
                format!(
                    "the header {:?} has no {name:?} column: a trace starts with the header \
                     `{HEADER}` (then one operation a line)",
                    shown(line)
                ),
            )
        })
    };
    Ok(Columns {
        count: names.len(),
        seq: find("seq"),
        action: need("action")?,
        id: need("id")?,
        size: need("size")?,
        stream: find("stream"),
    })
}

fn parse_id(text: &str) -> Option<u64> {
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// Reads a CSV trace from `input`, calling `progress` every few thousand lines.
pub fn read(
    path: &str,
    mut input: impl BufRead,
    options: ReadOptions,
    mut progress: impl FnMut(),
) -> Result<Trace, InputError> {
    let mut b = Builder::new(path, Origin::Csv, options.lenient);
    let mut buf = Vec::new();
    let mut n = 0u64;
    let mut columns: Option<Columns> = None;
    loop {
        buf.clear();
        let read = input.read_until(b'\n', &mut buf).map_err(|e| {
            b.error(
                n + 1,
                None,
                format!("cannot read: {e} (a damaged or cut-off gzip file?)"),
            )
        })?;
        if read == 0 {
            break;
        }
        n += 1;
        if n.is_multiple_of(4096) {
            progress();
        }
        let Ok(text) = std::str::from_utf8(&buf) else {
            return Err(b.error(
                n,
                None,
                "not UTF-8 text: a trace is a CSV file (optionally gzipped) or a PyTorch memory \
                 snapshot pickle"
                    .into(),
            ));
        };
        let line = text.trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let Some(cols) = &columns else {
            columns = Some(header(&b, line, n)?);
            continue;
        };
        // Counted before they are gathered: a line of many commas costs nothing.
        let count = line.split(',').count();
        if count != cols.count {
            return Err(b.error(
                n,
                None,
                format!("{count} fields, the header has {} (`{HEADER}`)", cols.count),
            ));
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if let Some(seq) = cols.seq.map(|i| fields[i]).filter(|s| !s.is_empty())
            && seq.parse::<u64>().is_err()
        {
            return Err(b.error(n, Some("seq"), format!("{seq:?} is not a whole number")));
        }
        let id_text = fields[cols.id];
        let id = parse_id(id_text).ok_or_else(|| {
            b.error(
                n,
                Some("id"),
                format!("{id_text:?} is not an id (a whole number, decimal or 0x hex)"),
            )
        })?;
        let size_text = fields[cols.size];
        let size = if size_text.is_empty() {
            None
        } else {
            Some(size_text.parse::<u64>().map_err(|_| {
                b.error(
                    n,
                    Some("size"),
                    format!("{size_text:?} is not a byte count"),
                )
            })?)
        };
        if let Some(stream) = cols.stream.map(|i| fields[i]) {
            b.stream(stream);
        }
        match fields[cols.action] {
            "alloc" => {
                let size = size.ok_or_else(|| {
                    b.error(n, Some("size"), "an allocation needs a size (bytes)".into())
                })?;
                b.alloc(id, size, n)?;
            }
            "free" => b.free(id, size, n)?,
            other => {
                return Err(b.error(
                    n,
                    Some("action"),
                    format!("{other:?} is neither alloc nor free"),
                ));
            }
        }
    }
    if columns.is_none() {
        return Err(b.error(
            n.max(1),
            None,
            format!(
                "empty trace: expected the header `{HEADER}` and then one operation a line (or \
                 a PyTorch memory snapshot pickle)"
            ),
        ));
    }
    Ok(b.finish())
}
