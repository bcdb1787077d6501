//! The buffers of device work (a launch's, library work's) and the rule on naming them
//! together: a buffer the work writes shares no byte with another buffer of the same work
//! (kernels and libraries may run their blocks in any order, so such a pair would race).
//!
//! Owns [`Buffers`] (the three lists by position: inputs, updates, outputs), the alias rule by
//! handle identity and view ([`Buffers::aliased`]) and its quick test on resolved device ranges
//! ([`ranges_meet`]), which the engine runs first. Does not own resolving the handles, nor the
//! refusal's error (the engine's, `engine.rs`).

use crate::memory::Handle;
use crate::shim::DeviceSpan;

/// Whether two views share a byte of the same allocation (an empty view shares none). The
/// allocations are compared by identity first: one pointer compare for the usual pair of
/// different allocations, nothing else read.
fn overlap(a: &Handle, b: &Handle) -> bool {
    a.same_allocation(b)
        && !a.is_empty()
        && !b.is_empty()
        && a.offset() < b.offset() + b.len()
        && b.offset() < a.offset() + a.len()
}

/// The buffers of device work in their order (inputs, updates: read and written in place,
/// outputs), by position.
#[derive(Clone, Copy)]
pub(super) struct Buffers<'a> {
    pub inputs: &'a [&'a Handle],
    pub updates: &'a [&'a Handle],
    pub outputs: &'a [&'a Handle],
}

impl<'a> Buffers<'a> {
    pub(super) fn len(&self) -> usize {
        self.inputs.len() + self.updates.len() + self.outputs.len()
    }

    /// The three lists in order.
    pub(super) fn lists(&self) -> [&'a [&'a Handle]; 3] {
        [self.inputs, self.updates, self.outputs]
    }

    /// The first pair (written buffer, other buffer) whose views overlap, by position: kernels
    /// may run their blocks in any order, and a library may too, so a buffer the work writes
    /// (an update or an output) shares no byte with another buffer of the same work. Plain loops
    /// over the three lists: nothing gathered, one pointer compare per pair in the usual case.
    pub(super) fn aliased(&self) -> Option<(usize, usize)> {
        let lists = self.lists();
        let mut o = self.inputs.len();
        for written in [self.updates, self.outputs] {
            for &w in written {
                let mut i = 0;
                for list in lists {
                    for &other in list {
                        if i != o && overlap(w, other) {
                            return Some((o, i));
                        }
                        i += 1;
                    }
                }
                o += 1;
            }
        }
        None
    }
}

/// The first pair (output, other buffer) of a launch's views that overlap (see
/// [`Buffers::aliased`]).
#[cfg(test)]
fn aliased(inputs: &[&Handle], outputs: &[&Handle]) -> Option<(usize, usize)> {
    Buffers {
        inputs,
        updates: &[],
        outputs,
    }
    .aliased()
}

/// Whether two spans share a device byte (by last bytes, so a span that ends at the top of the
/// address space is compared whole; an empty span meets nothing).
#[inline]
fn meet(a: &DeviceSpan, b: &DeviceSpan) -> bool {
    a.len != 0
        && b.len != 0
        && a.addr.0 <= b.addr.0.saturating_add(b.len - 1)
        && b.addr.0 <= a.addr.0.saturating_add(a.len - 1)
}

/// Whether a written span (from position `first_written` on) shares a device byte with another
/// span: a necessary condition for an alias (views of one allocation that overlap meet in device
/// addresses), checked on the stack before the handles are asked. Each pair is compared once,
/// from its later span, which is written whenever either is (inputs come first).
/// Two spans (the usual launch: one input, one output) are one comparison.
#[inline]
pub(super) fn ranges_meet(spans: &[DeviceSpan], first_written: usize) -> bool {
    if let [a, b] = spans {
        return first_written < 2 && meet(a, b);
    }
    (first_written.max(1)..spans.len()).any(|o| spans[..o].iter().any(|i| meet(&spans[o], i)))
}

#[cfg(test)]
#[path = "buffers_tests.rs"]
mod tests;
