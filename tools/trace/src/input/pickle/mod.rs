//! A pickle reader for untrusted input: no recursion, shared references stay shared, and memory in
//! proportion to the input.
//!
//! Owns turning a pickle (protocols 0 to 5) into a [`Pickle`]: an arena of [`Node`]s, containers
//! holding the ids of their items. The pickle machine is a loop over opcodes with an explicit
//! stack, so nesting costs no native stack; a memo reference (`GET`) pushes the id of the node it
//! names (as Python shares the object), so no structure is ever copied; and the bytes the arena,
//! the stack, the marks and the memo hold are counted against [`MEMORY_PER_INPUT_BYTE`] times the
//! bytes read so far (plus a small allowance), refusing a pickle that would need more. Objects
//! (classes, `REDUCE`, `BUILD`, extensions, persistent ids) are never imported or called: they
//! become [`Node::Object`]. Out-of-band buffers (protocol 5's `NEXT_BUFFER`) are refused.
//!
//! Does not own what a snapshot means (`snapshot.rs` reads the nodes).

mod opcodes;

use std::collections::HashMap;
use std::io::{BufRead, Read};

/// Most bytes of memory the reader holds per byte of pickle read (counted at the vectors'
/// lengths: while one grows by doubling the process briefly holds up to twice its share).
pub const MEMORY_PER_INPUT_BYTE: u64 = 10;
/// Ints below this are made once and shared (a snapshot's line numbers and small sizes repeat).
const SHARED_INTS: i128 = 1 << 16; // every u16
/// Memory any pickle may use, whatever its size (small inputs).
const ALLOWANCE: u64 = 1 << 20;

/// A node's index in the arena.
pub type Id = u32;

/// One value of the pickle.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// `None`.
    None,
    /// `True` or `False`.
    Bool(bool),
    /// An int that fits 128 bits.
    Int(i128),
    /// An int that does not: its sign and its length in bytes.
    Big {
        /// Below zero.
        negative: bool,
        /// Its two's complement length.
        bytes: u64,
    },
    /// A float.
    Float(f64),
    /// A str (invalid UTF-8 replaced).
    Str(Box<str>),
    /// bytes, a bytearray or a protocol-0 string.
    Bytes(Box<[u8]>),
    /// A list.
    List(Vec<Id>),
    /// A tuple.
    Tuple(Vec<Id>),
    /// A dict, as (key, value) pairs in order.
    Dict(Vec<(Id, Id)>),
    /// A set or frozenset.
    Set(Vec<Id>),
    /// Anything the pickle builds by calling code (never called here).
    Object,
}

/// A read pickle: its nodes and the id of the value `STOP` returned.
#[derive(Debug)]
pub struct Pickle {
    nodes: Vec<Node>,
    /// The pickled value.
    pub root: Id,
    /// Bytes of pickle read.
    pub read: u64,
    /// Bytes of memory the reader held at the end (as it counts them).
    pub held: u64,
}

impl Pickle {
    /// The node `id` names.
    pub fn node(&self, id: Id) -> &Node {
        &self.nodes[id as usize]
    }
}

/// Why a pickle could not be read: where and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The byte offset of the opcode at fault.
    pub offset: u64,
    /// What is wrong.
    pub message: String,
}

/// Reads one pickle from `input` (up to its `STOP`).
pub fn read(input: impl BufRead) -> Result<Pickle, Error> {
    read_with(input, ALLOWANCE)
}

/// [`read`] with `allowance` bytes of memory besides the share of the bytes read.
pub fn read_with(input: impl BufRead, allowance: u64) -> Result<Pickle, Error> {
    let mut m = Machine {
        allowance,
        input: Counted {
            inner: input,
            read: 0,
        },
        nodes: Vec::new(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Vec::new(),
        sparse_memo: HashMap::new(),
        shared: HashMap::new(),
        constants: [None; 3],
        heap: 0,
        at: 0,
    };
    loop {
        m.at = m.input.read;
        let Some(op) = m.byte()? else {
            return Err(m.error("the pickle ends without its STOP opcode (a cut-off file?)"));
        };
        if op == b'.' {
            let root = m.pop()?;
            let held = m.used();
            return Ok(Pickle {
                nodes: m.nodes,
                root,
                read: m.input.read,
                held,
            });
        }
        m.step(op)?;
        m.check_memory()?;
    }
}

/// The reader, counting the bytes it consumed.
struct Counted<R> {
    inner: R,
    read: u64,
}

/// The pickle machine's state.
struct Machine<R> {
    input: Counted<R>,
    nodes: Vec<Node>,
    stack: Vec<Id>,
    /// Stack lengths at each open MARK.
    marks: Vec<u32>,
    /// The memo while its keys are 0, 1, 2, ... in order (as pickle writes them).
    memo: Vec<Id>,
    /// Memo keys written out of order.
    sparse_memo: HashMap<u64, Id>,
    /// The node of each small int made so far.
    shared: HashMap<u16, Id>,
    /// The nodes of None, False and True, once made.
    constants: [Option<Id>; 3],
    /// Bytes held by nodes beyond their own size (text, bytes, items).
    heap: u64,
    /// Offset of the opcode being run.
    at: u64,
    /// Memory any pickle may use, whatever its size.
    allowance: u64,
}

impl<R: BufRead> Machine<R> {
    fn error(&self, message: impl Into<String>) -> Error {
        Error {
            offset: self.at,
            message: message.into(),
        }
    }

    fn io(&self, e: std::io::Error) -> Error {
        self.error(format!("cannot read: {e}"))
    }

    fn byte(&mut self) -> Result<Option<u8>, Error> {
        let mut b = [0u8; 1];
        match self.input.inner.read(&mut b) {
            Ok(0) => Ok(None),
            Ok(_) => {
                self.input.read += 1;
                Ok(Some(b[0]))
            }
            Err(e) => Err(self.io(e)),
        }
    }

    /// Exactly `n` argument bytes (read as they come: a huge claimed length in a short file
    /// allocates only what is there).
    fn bytes(&mut self, n: u64) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        let got = (&mut self.input.inner)
            .take(n)
            .read_to_end(&mut out)
            .map_err(|e| self.io(e))?;
        self.input.read += got as u64;
        if (got as u64) < n {
            return Err(self.error(format!(
                "the pickle ends inside an opcode's argument ({n} bytes said, {got} there)"
            )));
        }
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Error> {
        let v = self.bytes(N as u64)?;
        Ok(v.try_into().expect("`bytes` returns exactly N bytes"))
    }

    /// A protocol-0 argument: the bytes up to a newline (not kept).
    fn line(&mut self) -> Result<Vec<u8>, Error> {
        let limit = self.room().max(256);
        let mut out = Vec::new();
        let got = (&mut self.input.inner)
            .take(limit)
            .read_until(b'\n', &mut out)
            .map_err(|e| self.io(e))?;
        self.input.read += got as u64;
        if out.pop() != Some(b'\n') {
            return Err(self.error("a text argument without its newline"));
        }
        Ok(out)
    }

    fn length(&mut self, width: usize) -> Result<u64, Error> {
        Ok(match width {
            1 => u64::from(self.array::<1>()?[0]),
            4 => u64::from(u32::from_le_bytes(self.array()?)),
            _ => u64::from_le_bytes(self.array()?),
        })
    }

    /// Bytes of memory the reader holds now (vectors counted at their length).
    fn used(&self) -> u64 {
        let node = std::mem::size_of::<Node>() as u64;
        self.nodes.len() as u64 * node
            + self.heap
            + 4 * self.stack.len() as u64
            + 4 * self.marks.len() as u64
            + 4 * self.memo.len() as u64
            + 32 * self.sparse_memo.len() as u64
            + 16 * self.shared.len() as u64
    }

    /// Bytes the reader may still take, at the bytes read so far.
    fn room(&self) -> u64 {
        (MEMORY_PER_INPUT_BYTE * self.input.read + self.allowance).saturating_sub(self.used())
    }

    fn check_memory(&self) -> Result<(), Error> {
        if self.room() == 0 {
            return Err(self.error(format!(
                "the pickle needs more than {MEMORY_PER_INPUT_BYTE} bytes of memory per byte \
                 read ({} bytes held after {} read): not a snapshot torch writes",
                self.used(),
                self.input.read
            )));
        }
        Ok(())
    }

    /// Pushes `node`, the shared one for None, a bool or a small int.
    fn push(&mut self, node: Node) -> Result<(), Error> {
        let constant = match node {
            Node::None => Some(0),
            Node::Bool(b) => Some(1 + usize::from(b)),
            _ => None,
        };
        if let Some(c) = constant {
            if let Some(id) = self.constants[c] {
                self.stack.push(id);
                return Ok(());
            }
            self.constants[c] = Some(self.next_id()?);
        }
        if let Node::Int(v @ 0..SHARED_INTS) = node {
            let v = v as u16;
            if let Some(&id) = self.shared.get(&v) {
                self.stack.push(id);
                return Ok(());
            }
            let id = self.next_id()?;
            self.shared.insert(v, id);
        }
        self.push_new(node)
    }

    fn next_id(&self) -> Result<Id, Error> {
        Id::try_from(self.nodes.len())
            .map_err(|_| self.error("more than 2^32 values in one pickle"))
    }

    /// Pushes `node` as a new node.
    fn push_new(&mut self, node: Node) -> Result<(), Error> {
        self.heap += match &node {
            Node::Str(s) => s.len() as u64,
            Node::Bytes(b) => b.len() as u64,
            Node::List(v) | Node::Tuple(v) | Node::Set(v) => 4 * v.len() as u64,
            Node::Dict(v) => 8 * v.len() as u64,
            _ => 0,
        };
        let id = self.next_id()?;
        self.nodes.push(node);
        self.stack.push(id);
        Ok(())
    }

    fn pop(&mut self) -> Result<Id, Error> {
        if self.stack.len() <= self.mark() {
            return Err(self.error("an opcode takes a value from an empty stack"));
        }
        Ok(self.stack.pop().expect("checked above"))
    }

    fn top(&self) -> Result<Id, Error> {
        match self.stack.last() {
            Some(&id) if self.stack.len() > self.mark() => Ok(id),
            _ => Err(self.error("an opcode needs a value on an empty stack")),
        }
    }

    /// Where the values above the last MARK begin (0 without one).
    fn mark(&self) -> usize {
        self.marks.last().map_or(0, |&m| m as usize)
    }

    /// The values above the last MARK, which goes.
    fn pop_mark(&mut self) -> Result<Vec<Id>, Error> {
        let Some(at) = self.marks.pop() else {
            return Err(self.error("an opcode needs a MARK and there is none"));
        };
        Ok(self.stack.split_off(at as usize))
    }

    fn pairs(&self, items: &[Id]) -> Result<Vec<(Id, Id)>, Error> {
        if !items.len().is_multiple_of(2) {
            return Err(self.error("a dict of an odd number of keys and values"));
        }
        Ok(items.chunks(2).map(|kv| (kv[0], kv[1])).collect())
    }

    /// Adds `items` (keys and values, for a dict) to the `what` on top of the stack.
    fn extend(&mut self, items: Vec<Id>, what: &str) -> Result<(), Error> {
        let target = self.top()? as usize;
        let pairs = if what == "dict" {
            self.pairs(&items)?
        } else {
            Vec::new()
        };
        let fits = matches!(
            (&self.nodes[target], what),
            (Node::List(_), "list")
                | (Node::Set(_), "set")
                | (Node::Dict(_), "dict")
                | (Node::Object, _)
        );
        if !fits {
            return Err(self.error(format!("adds to a {what} what is not one")));
        }
        self.heap += 4 * items.len() as u64;
        match &mut self.nodes[target] {
            Node::List(l) | Node::Set(l) => l.extend(items),
            Node::Dict(d) => d.extend(pairs),
            _ => {} // an object's own append or setitem: not modelled
        }
        Ok(())
    }

    fn memo_put(&mut self, key: u64) -> Result<(), Error> {
        let id = self.top()?;
        if key == self.memo.len() as u64 {
            self.memo.push(id);
        } else if let Some(slot) = usize::try_from(key).ok().and_then(|k| self.memo.get_mut(k)) {
            *slot = id;
        } else {
            self.sparse_memo.insert(key, id);
        }
        Ok(())
    }

    fn memo_get(&mut self, key: u64) -> Result<(), Error> {
        let dense = usize::try_from(key).ok().and_then(|k| self.memo.get(k));
        let Some(&id) = dense.or_else(|| self.sparse_memo.get(&key)) else {
            return Err(self.error(format!("memo entry {key} read before it was written")));
        };
        self.stack.push(id);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
