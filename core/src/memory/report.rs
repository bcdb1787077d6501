//! The memory report: what each pool holds, for humans (`Display`, and `defmt::Format` with the
//! `defmt` feature: the same figures, integer arithmetic only) and for checks.
//!
//! Owns the figures' shapes ([`PoolReport`], [`Usage`], [`MemoryReport`]) and how they print.
//! Keeps device memory and pinned host memory apart: they are different resources, so their
//! totals are never added together. Does not gather the figures (the manager and the pinned pool
//! do) nor the device-wide report of every stream (`DeviceReport`, in `device.rs`).

use core::fmt;
use core::ops::{Add, AddAssign};

/// Which pool a report line describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolKind {
    /// Small requests: fixed pages, or a granule pool.
    Small,
    /// Requests larger than the small pool's: pages of any size, or a granule pool.
    Arena,
    /// Exact-size reuse (weights).
    Persistent,
    /// One page per reservation.
    Dedicated,
    /// Pinned host memory of a stream.
    PinnedHost,
}

/// One pool's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// Bytes of device memory the pool holds now (the column `held` of a printed report): its
    /// pages, or for a granule pool the granules mapped into its range. Pages and granules the pool let go that wait for a fence are not
    /// counted here but in the drop queue's figures
    /// ([`DeviceReport::awaiting`](crate::DeviceReport::awaiting)).
    pub reserved: u64,
}

impl PoolReport {
    /// The pool's usage figures.
    pub fn usage(&self) -> Usage {
        Usage {
            allocations: self.allocations,
            in_use: self.in_use,
            padding: self.padding,
            reserved: self.reserved,
        }
    }

    /// Whether the pool holds pinned host memory (not device memory).
    pub fn is_host(&self) -> bool {
        self.kind == PoolKind::PinnedHost
    }
}

/// What a pool, or a group of pools of one kind of memory, holds: the figures a report adds up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Live allocations.
    pub allocations: u64,
    /// Bytes asked for by the live allocations.
    pub in_use: u64,
    /// Alignment padding of the live allocations.
    pub padding: u64,
    /// Bytes of device (or pinned host) memory held: pages, or mapped granules (the column
    /// `held` of a printed report).
    pub reserved: u64,
}

impl Add for Usage {
    type Output = Usage;

    fn add(self, other: Usage) -> Usage {
        Usage {
            allocations: self.allocations + other.allocations,
            in_use: self.in_use + other.in_use,
            padding: self.padding + other.padding,
            reserved: self.reserved + other.reserved,
        }
    }
}

impl AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        *self = *self + other;
    }
}

impl core::iter::Sum for Usage {
    fn sum<I: Iterator<Item = Usage>>(iter: I) -> Usage {
        iter.fold(Usage::default(), Add::add)
    }
}

/// The report of one stream's memory: one line per pool that holds or held pages.
///
/// A memory manager's report holds device pools only; the device's report of a stream adds the
/// line of the stream's pinned host pool. The totals keep the two apart: [`Self::device`] and
/// [`Self::pinned_host`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// The pools, small first, then the arena (current class first), persistent, dedicated;
    /// then the pinned host pool, where the report has one.
    pub pools: alloc::vec::Vec<PoolReport>,
    /// Bytes of device address space the stream's granule pools reserved (0 without virtual
    /// memory): memory is mapped into it on demand, so it costs no memory and no budget; only
    /// the granules mapped count (in the pools' `reserved`).
    pub address_space: u64,
}

impl MemoryReport {
    /// What the device pools hold, together (pinned host memory left out).
    pub fn device(&self) -> Usage {
        self.pools
            .iter()
            .filter(|p| !p.is_host())
            .map(PoolReport::usage)
            .sum()
    }

    /// What the pinned host pools hold, together (device memory left out).
    pub fn pinned_host(&self) -> Usage {
        self.pools
            .iter()
            .filter(|p| p.is_host())
            .map(PoolReport::usage)
            .sum()
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

impl PoolKind {
    /// The pool's name in a report.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Small => "small",
            Self::Arena => "arena",
            Self::Persistent => "persistent",
            Self::Dedicated => "dedicated",
            Self::PinnedHost => "pinned host",
        }
    }
}

impl fmt::Display for PoolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for MemoryReport {
    /// One line per pool, device pools first with their total, then the pinned host pools with
    /// theirs: host bytes are never added to device bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<18} {:>10} {:>6} {:>6} {:>8} {:>12} {:>10} {:>12}",
            "pool", "page", "pages", "peak", "allocs", "in use", "padding", "held"
        )?;
        for host in [false, true] {
            let mut lines = self.pools.iter().filter(|p| p.is_host() == host).peekable();
            if host && lines.peek().is_none() {
                break;
            }
            for p in lines {
                writeln!(f)?;
                write!(
                    f,
                    "{:<18} {:>10} {:>6} {:>6} ",
                    alloc::format!("{}", p.kind),
                    alloc::format!("{}", ReadableBytes(p.page_size)),
                    p.pages,
                    p.pages_peak,
                )?;
                write_usage(f, &p.usage())?;
            }
            let (label, total) = if host {
                ("pinned host total", self.pinned_host())
            } else {
                ("device total", self.device())
            };
            writeln!(f)?;
            write!(f, "{:<18} {:>10} {:>6} {:>6} ", label, "", "", "")?;
            write_usage(f, &total)?;
        }
        Ok(())
    }
}

// ---- defmt: the same figures, one line per pool (defmt pads no columns), no float ----

#[cfg(feature = "defmt")]
impl defmt::Format for PoolKind {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(f, "{=str}", self.name())
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for ReadableBytes {
    /// As `Display` (`8 MiB`, `1.50 KiB`, `12 B`), the fraction in integer hundredths, so the
    /// image carries no float formatting.
    fn format(&self, f: defmt::Formatter<'_>) {
        let n = self.0;
        let (scale, unit) = match n {
            _ if n >= 1 << 30 => (1u64 << 30, "GiB"),
            _ if n >= 1 << 20 => (1 << 20, "MiB"),
            _ if n >= 1 << 10 => (1 << 10, "KiB"),
            _ => return defmt::write!(f, "{=u64} B", n),
        };
        let (mut whole, rest) = (n / scale, n % scale);
        if rest == 0 {
            return defmt::write!(f, "{=u64} {=str}", whole, unit);
        }
        // Rounded to the nearest hundredth; `rest * 100` fits: `rest < 2^30`.
        let mut hundredths = (rest * 100 + scale / 2) / scale;
        if hundredths == 100 {
            whole += 1;
            hundredths = 0;
        }
        defmt::write!(f, "{=u64}.{=u64:02} {=str}", whole, hundredths, unit)
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for Usage {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(
            f,
            "{=u64} allocs, {} in use, {} padding, {} held",
            self.allocations,
            ReadableBytes(self.in_use),
            ReadableBytes(self.padding),
            ReadableBytes(self.reserved)
        )
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for PoolReport {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(
            f,
            "{}: page {}, {=u32} pages (peak {=u32}), {}",
            self.kind,
            ReadableBytes(self.page_size),
            self.pages,
            self.pages_peak,
            self.usage()
        )
    }
}

#[cfg(feature = "defmt")]
impl defmt::Format for MemoryReport {
    /// One line per pool, device pools first with their total, then the pinned host pools with
    /// theirs, as `Display` does.
    fn format(&self, f: defmt::Formatter<'_>) {
        let mut first = true;
        for host in [false, true] {
            let mut lines = self.pools.iter().filter(|p| p.is_host() == host).peekable();
            if host && lines.peek().is_none() {
                break;
            }
            for p in lines {
                if !first {
                    defmt::write!(f, "\n");
                }
                first = false;
                defmt::write!(f, "{}", p);
            }
            let (label, total) = if host {
                ("pinned host total", self.pinned_host())
            } else {
                ("device total", self.device())
            };
            if !first {
                defmt::write!(f, "\n");
            }
            first = false;
            defmt::write!(f, "{=str}: {}", label, total);
        }
    }
}

fn write_usage(f: &mut fmt::Formatter<'_>, u: &Usage) -> fmt::Result {
    write!(
        f,
        "{:>8} {:>12} {:>10} {:>12}",
        u.allocations,
        alloc::format!("{}", ReadableBytes(u.in_use)),
        alloc::format!("{}", ReadableBytes(u.padding)),
        alloc::format!("{}", ReadableBytes(u.reserved)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    const MIB: u64 = 1 << 20;

    fn line(kind: PoolKind, allocations: u64, in_use: u64, reserved: u64) -> PoolReport {
        PoolReport {
            kind,
            page_size: reserved,
            pages: 1,
            pages_peak: 1,
            allocations,
            in_use,
            padding: 0,
            reserved,
        }
    }

    #[test]
    fn device_and_pinned_host_memory_are_totalled_apart() {
        let report = MemoryReport {
            pools: alloc::vec![
                line(PoolKind::Small, 2, 1000, 8 * MIB),
                line(PoolKind::Arena, 1, 3 * MIB, 4 * MIB),
                line(PoolKind::PinnedHost, 1, 4096, 32 * MIB),
            ],
            address_space: 0,
        };
        assert_eq!(
            report.device(),
            Usage {
                allocations: 3,
                in_use: 3 * MIB + 1000,
                padding: 0,
                reserved: 12 * MIB
            }
        );
        assert_eq!(report.pinned_host().reserved, 32 * MIB);
        let text = report.to_string();
        let total = |label: &str| {
            text.lines()
                .find(|l| l.starts_with(label))
                .unwrap_or_else(|| panic!("no {label} line in\n{text}"))
                .to_string()
        };
        assert!(total("device total").ends_with("12 MiB"), "{text}");
        assert!(total("pinned host total").ends_with("32 MiB"), "{text}");
        assert!(
            !text.contains("44 MiB"),
            "host bytes added to device bytes:\n{text}"
        );
    }

    #[test]
    fn a_report_without_pinned_memory_has_no_host_total() {
        let report = MemoryReport {
            pools: alloc::vec![line(PoolKind::Small, 1, 64, MIB)],
            address_space: 0,
        };
        let text = report.to_string();
        assert!(text.contains("device total"), "{text}");
        assert!(!text.contains("pinned host"), "{text}");
        assert_eq!(report.pinned_host(), Usage::default());
    }
}
