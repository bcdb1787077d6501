//! The name of a stream: a leaf every room may use.

/// Names a stream of a device: `StreamId(0)`, `StreamId(1)`, … up to the device's limit.
/// Streams are created on first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct StreamId(pub u32);
