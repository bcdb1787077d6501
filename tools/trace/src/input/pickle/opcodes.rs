//! The pickle machine's opcodes: what each one reads and does to the stack, and the text
//! arguments of protocol 0 (ints, floats, memo keys, `UNICODE`).

use super::{Error, Machine, Node};
use std::io::BufRead;

impl<R: BufRead> Machine<R> {
    fn decimal(&self, line: &[u8]) -> Result<u64, Error> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| self.error("a memo index that is not a whole number"))
    }

    /// A protocol-0 `INT` or `LONG` argument.
    fn text_int(&self, line: &[u8]) -> Result<Node, Error> {
        let s = std::str::from_utf8(line).map_err(|_| self.error("an int that is not text"))?;
        let s = s.trim().trim_end_matches('L');
        match s {
            "00" => return Ok(Node::Bool(false)),
            "01" => return Ok(Node::Bool(true)),
            _ => {}
        }
        let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(self.error(format!("{s:?} is not an int")));
        }
        Ok(match s.parse::<i128>() {
            Ok(v) => Node::Int(v),
            Err(_) => Node::Big {
                negative: s.starts_with('-'),
                bytes: digits.len() as u64 / 2,
            },
        })
    }

    fn float(&self, line: &[u8]) -> Result<Node, Error> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .map(Node::Float)
            .ok_or_else(|| self.error("a float that is not a number"))
    }

    /// `LONG1` / `LONG4`: `n` bytes of little-endian two's complement.
    fn long(&mut self, n: u64) -> Result<Node, Error> {
        let b = self.bytes(n)?;
        let negative = b.last().is_some_and(|&x| x & 0x80 != 0);
        if b.len() > 16 {
            let fill = if negative { 0xff } else { 0 };
            if b[16..].iter().any(|&x| x != fill) || (b[15] & 0x80 != 0) != negative {
                return Ok(Node::Big { negative, bytes: n });
            }
        }
        let mut wide = [if negative { 0xff } else { 0 }; 16];
        let len = b.len().min(16);
        wide[..len].copy_from_slice(&b[..len]);
        Ok(Node::Int(i128::from_le_bytes(wide)))
    }

    fn text(bytes: Vec<u8>) -> Node {
        Node::Str(String::from_utf8_lossy(&bytes).into())
    }

    /// Runs one opcode (all but `STOP`).
    pub(super) fn step(&mut self, op: u8) -> Result<(), Error> {
        match op {
            b'(' => {
                let at = u32::try_from(self.stack.len())
                    .map_err(|_| self.error("more than 2^32 values on the stack"))?;
                self.marks.push(at);
            }
            b'0' => {
                if !self.marks.is_empty() && self.mark() == self.stack.len() {
                    self.marks.pop();
                } else {
                    self.pop()?;
                }
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let top = self.top()?;
                self.stack.push(top);
            }
            b'N' => self.push(Node::None)?,
            0x88 => self.push(Node::Bool(true))?,
            0x89 => self.push(Node::Bool(false))?,
            b'I' | b'L' => {
                let line = self.line()?;
                let node = self.text_int(&line)?;
                self.push(node)?;
            }
            b'J' => {
                let v = i32::from_le_bytes(self.array()?);
                self.push(Node::Int(v.into()))?;
            }
            b'K' => {
                let v = self.array::<1>()?[0];
                self.push(Node::Int(v.into()))?;
            }
            b'M' => {
                let v = u16::from_le_bytes(self.array()?);
                self.push(Node::Int(v.into()))?;
            }
            0x8a => {
                let n = self.length(1)?;
                let node = self.long(n)?;
                self.push(node)?;
            }
            0x8b => {
                let n = i32::from_le_bytes(self.array()?);
                let n = u64::try_from(n).map_err(|_| self.error("a LONG4 of negative length"))?;
                let node = self.long(n)?;
                self.push(node)?;
            }
            b'F' => {
                let line = self.line()?;
                let node = self.float(&line)?;
                self.push(node)?;
            }
            b'G' => {
                let v = f64::from_be_bytes(self.array()?);
                self.push(Node::Float(v))?;
            }
            b'S' => {
                let line = self.line()?;
                let inner = line.get(1..line.len().saturating_sub(1)).unwrap_or(&[]);
                self.push(Node::Bytes(inner.into()))?;
            }
            b'V' => {
                let line = self.line()?;
                self.push(Node::Str(raw_unicode_escape(&line).into()))?;
            }
            b'T' => {
                let n = i32::from_le_bytes(self.array()?);
                let n = u64::try_from(n).map_err(|_| self.error("a string of negative length"))?;
                let b = self.bytes(n)?;
                self.push(Node::Bytes(b.into()))?;
            }
            b'U' | b'C' | b'B' | 0x8e | 0x96 => {
                let n = match op {
                    b'U' | b'C' => self.length(1)?,
                    b'B' => self.length(4)?,
                    _ => self.length(8)?,
                };
                let b = self.bytes(n)?;
                self.push(Node::Bytes(b.into()))?;
            }
            0x8c | b'X' | 0x8d => {
                let n = match op {
                    0x8c => self.length(1)?,
                    b'X' => self.length(4)?,
                    _ => self.length(8)?,
                };
                let b = self.bytes(n)?;
                self.push(Self::text(b))?;
            }
            b']' => self.push(Node::List(Vec::new()))?,
            b')' => self.push(Node::Tuple(Vec::new()))?,
            b'}' => self.push(Node::Dict(Vec::new()))?,
            0x8f => self.push(Node::Set(Vec::new()))?,
            b'l' => {
                let items = self.pop_mark()?;
                self.push(Node::List(items))?;
            }
            b't' => {
                let items = self.pop_mark()?;
                self.push(Node::Tuple(items))?;
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.pop()?);
                }
                items.reverse();
                self.push(Node::Tuple(items))?;
            }
            b'd' => {
                let items = self.pop_mark()?;
                let pairs = self.pairs(&items)?;
                self.push(Node::Dict(pairs))?;
            }
            0x91 => {
                let items = self.pop_mark()?;
                self.push(Node::Set(items))?;
            }
            b'a' => {
                let v = self.pop()?;
                self.extend(vec![v], "list")?;
            }
            b'e' => {
                let items = self.pop_mark()?;
                self.extend(items, "list")?;
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                self.extend(vec![k, v], "dict")?;
            }
            b'u' => {
                let items = self.pop_mark()?;
                self.extend(items, "dict")?;
            }
            0x90 => {
                let items = self.pop_mark()?;
                self.extend(items, "set")?;
            }
            b'p' => {
                let line = self.line()?;
                let key = self.decimal(&line)?;
                self.memo_put(key)?;
            }
            b'q' => {
                let key = self.length(1)?;
                self.memo_put(key)?;
            }
            b'r' => {
                let key = self.length(4)?;
                self.memo_put(key)?;
            }
            0x94 => self.memo_put((self.memo.len() + self.sparse_memo.len()) as u64)?,
            b'g' => {
                let line = self.line()?;
                let key = self.decimal(&line)?;
                self.memo_get(key)?;
            }
            b'h' => {
                let key = self.length(1)?;
                self.memo_get(key)?;
            }
            b'j' => {
                let key = self.length(4)?;
                self.memo_get(key)?;
            }
            0x80 => {
                let version = self.array::<1>()?[0];
                if version > 5 {
                    return Err(self.error(format!("pickle protocol {version} (5 is the newest)")));
                }
            }
            0x95 => {
                self.array::<8>()?; // FRAME: a length hint; the opcodes follow in line
            }
            // Objects: the arguments go, an opaque value comes (nothing is imported or called).
            b'c' => {
                self.line()?;
                self.line()?;
                self.push(Node::Object)?;
            }
            b'i' => {
                self.line()?;
                self.line()?;
                self.pop_mark()?;
                self.push(Node::Object)?;
            }
            b'o' => {
                self.pop_mark()?;
                self.push(Node::Object)?;
            }
            b'P' => {
                self.line()?;
                self.push(Node::Object)?;
            }
            0x82..=0x84 => {
                let width = [1, 2, 4][usize::from(op - 0x82)];
                self.bytes(width)?;
                self.push(Node::Object)?;
            }
            b'Q' | b'R' | 0x81 | 0x92 | 0x93 => {
                let args = match op {
                    b'Q' => 1,
                    0x92 => 3,
                    _ => 2,
                };
                for _ in 0..args {
                    self.pop()?;
                }
                self.push(Node::Object)?;
            }
            b'b' => {
                self.pop()?;
                self.top()?;
            }
            0x97 | 0x98 => {
                return Err(self.error(
                    "out-of-band buffers (pickle protocol 5's NEXT_BUFFER / READONLY_BUFFER) are \
                     not read",
                ));
            }
            other => return Err(self.error(format!("unknown opcode {other:#04x}"))),
        }
        Ok(())
    }
}

/// Protocol 0's `UNICODE` argument: latin-1 bytes with `\\uXXXX` and `\\UXXXXXXXX` escapes.
fn raw_unicode_escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let width = match bytes.get(i..i + 2) {
            Some(b"\\u") => 4,
            Some(b"\\U") => 8,
            _ => 0,
        };
        let escaped = bytes
            .get(i + 2..i + 2 + width)
            .filter(|_| width > 0)
            .and_then(|h| u32::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok())
            .and_then(char::from_u32);
        match escaped {
            Some(c) => {
                out.push(c);
                i += 2 + width;
            }
            None => {
                out.push(char::from(bytes[i]));
                i += 1;
            }
        }
    }
    out
}
