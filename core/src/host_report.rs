//! The memory report of a host with several devices: each device's report, and totals across
//! them.
//!
//! Owns the host-wide totals and how they print. Does not gather any figure (each device does,
//! in `Device::memory_report`), nor hold any state: several devices share nothing but the
//! process, and each keeps its own budget, pools and drop queues.

use crate::device::{Device, DeviceReport};
use crate::memory::ReadableBytes;
use crate::shim::Shim;
use alloc::vec::Vec;

/// The memory reports of several devices, by device id ([`Device::id`]), with totals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostReport {
    /// Per device: its id and its report.
    pub devices: Vec<(u32, DeviceReport)>,
}

impl HostReport {
    /// The reports of `devices` ([`Device::memory_report`] of each, which first takes back
    /// what dropped handles freed).
    pub fn of<'a, S: Shim + 'a>(devices: impl IntoIterator<Item = &'a mut Device<S>>) -> Self {
        let devices = devices
            .into_iter()
            .map(|d| (d.id(), d.memory_report()))
            .collect();
        Self { devices }
    }

    /// Bytes of device memory held on every device together (each device's budget count).
    pub fn held(&self) -> u64 {
        self.devices.iter().map(|(_, r)| r.held).sum()
    }

    /// Bytes of pinned host pages every device's pinned pools hold together (host memory: it
    /// counts against the host's RAM, never against a device's budget).
    pub fn pinned_host(&self) -> u64 {
        self.devices.iter().map(|(_, r)| r.pinned_host).sum()
    }

    /// The devices' budgets added up (at most `u64::MAX`), if every device has one.
    pub fn budget(&self) -> Option<u64> {
        self.devices
            .iter()
            .try_fold(0u64, |t, (_, r)| r.budget.map(|b| t.saturating_add(b)))
    }
}

impl core::fmt::Display for HostReport {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for (id, report) in &self.devices {
            writeln!(f, "device {id}:")?;
            writeln!(f, "{report}")?;
        }
        write!(
            f,
            "{} device(s): device memory held {}",
            self.devices.len(),
            ReadableBytes(self.held())
        )?;
        if let Some(b) = self.budget() {
            write!(f, " of {} budgeted", ReadableBytes(b))?;
        }
        write!(
            f,
            ", pinned host pages {}",
            ReadableBytes(self.pinned_host())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budgeted(budget: Option<u64>) -> DeviceReport {
        DeviceReport {
            streams: Vec::new(),
            awaiting: Vec::new(),
            held: 0,
            budget,
            pinned_host: 0,
        }
    }

    #[test]
    fn budgets_add_up_without_overflow_and_only_when_every_device_has_one() {
        let report = |b: &[Option<u64>]| HostReport {
            devices: b
                .iter()
                .enumerate()
                .map(|(i, &b)| (i as u32, budgeted(b)))
                .collect(),
        };
        assert_eq!(report(&[Some(3), Some(4)]).budget(), Some(7));
        assert_eq!(
            report(&[Some(u64::MAX), Some(u64::MAX)]).budget(),
            Some(u64::MAX)
        );
        assert_eq!(report(&[Some(3), None]).budget(), None);
        assert_eq!(report(&[]).budget(), Some(0));
    }
}
