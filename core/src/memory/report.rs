//! The memory report: what each pool holds, for humans (`Display`) and for checks.

use core::fmt;

/// Which pool a report line describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum PoolKind {
    /// Fixed pages for small slices.
    Small,
    /// An adaptive-arena page-size class; `outdated` ones serve nothing new.
    Arena {
        /// Whether the class is outdated.
        outdated: bool,
    },
    /// Exact-size reuse (weights).
    Persistent,
    /// One page per reservation.
    Dedicated,
    /// Pinned host memory of a stream.
    PinnedHost,
}

/// One pool's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PoolReport {
    /// Which pool.
    pub kind: PoolKind,
    /// Bytes per page: the size the pool carves (for pools of one allocation per page, the largest
    /// page; the pinned pool's large requests have pages of their own, counted in `pages`).
    pub page_size: u64,
    /// Pages held now.
    pub pages: u32,
    /// Most pages held at once.
    pub pages_peak: u32,
    /// Live allocations.
    pub allocations: u64,
    /// Bytes asked for by the live allocations.
    pub in_use: u64,
    /// Alignment padding of the live allocations.
    pub padding: u64,
    /// Bytes of pages held.
    pub reserved: u64,
}

/// The report of one memory manager: one line per pool that holds or held pages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// The pools, small first, then the arena (current class first), persistent, dedicated.
    pub pools: alloc::vec::Vec<PoolReport>,
}

impl MemoryReport {
    /// Bytes asked for by live allocations, over every pool.
    pub fn in_use(&self) -> u64 {
        self.pools.iter().map(|p| p.in_use).sum()
    }

    /// Alignment padding, over every pool.
    pub fn padding(&self) -> u64 {
        self.pools.iter().map(|p| p.padding).sum()
    }

    /// Bytes of pages held, over every pool.
    pub fn reserved(&self) -> u64 {
        self.pools.iter().map(|p| p.reserved).sum()
    }

    /// Live allocations, over every pool.
    pub fn allocations(&self) -> u64 {
        self.pools.iter().map(|p| p.allocations).sum()
    }
}

/// A byte count printed with a binary unit (`8 MiB`, `1.50 KiB`, `12 B`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadableBytes(pub u64);

impl fmt::Display for ReadableBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        let (scale, unit) = match n {
            _ if n >= 1 << 30 => (1u64 << 30, "GiB"),
            _ if n >= 1 << 20 => (1 << 20, "MiB"),
            _ if n >= 1 << 10 => (1 << 10, "KiB"),
            _ => return write!(f, "{n} B"),
        };
        if n.is_multiple_of(scale) {
            write!(f, "{} {unit}", n / scale)
        } else {
            write!(f, "{:.2} {unit}", n as f64 / scale as f64)
        }
    }
}

impl fmt::Display for PoolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Small => "small",
            Self::Arena { outdated: false } => "arena",
            Self::Arena { outdated: true } => "arena (outdated)",
            Self::Persistent => "persistent",
            Self::Dedicated => "dedicated",
            Self::PinnedHost => "pinned host",
        })
    }
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<18} {:>10} {:>6} {:>6} {:>8} {:>12} {:>10} {:>12}",
            "pool", "page", "pages", "peak", "allocs", "in use", "padding", "reserved"
        )?;
        for p in &self.pools {
            writeln!(
                f,
                "{:<18} {:>10} {:>6} {:>6} {:>8} {:>12} {:>10} {:>12}",
                alloc::format!("{}", p.kind),
                alloc::format!("{}", ReadableBytes(p.page_size)),
                p.pages,
                p.pages_peak,
                p.allocations,
                alloc::format!("{}", ReadableBytes(p.in_use)),
                alloc::format!("{}", ReadableBytes(p.padding)),
                alloc::format!("{}", ReadableBytes(p.reserved)),
            )?;
        }
        write!(
            f,
            "{:<18} {:>10} {:>6} {:>6} {:>8} {:>12} {:>10} {:>12}",
            "total",
            "",
            "",
            "",
            self.allocations(),
            alloc::format!("{}", ReadableBytes(self.in_use())),
            alloc::format!("{}", ReadableBytes(self.padding())),
            alloc::format!("{}", ReadableBytes(self.reserved()))
        )
    }
}
