//! Scoped allocation-mode windows: a persistent (or dedicated) window that closes itself when
//! its scope ends, however it ends (normally, through `?`, or by a panic).
//!
//! Owns the window's guard ([`ModeWindow`]) and the closure form ([`Command::persistent`]). Does
//! not own what a mode does to reservations (`memory/`).

use super::Command;
use crate::memory::AllocationMode;
use crate::shim::Shim;
use core::ops::{Deref, DerefMut};

/// A command inside an allocation-mode window: it dereferences to the [`Command`], and closing
/// the window is its drop. Windows opened inside it and left open close with it.
#[derive(Debug)]
pub struct ModeWindow<'c, 'd, S: Shim> {
    cmd: &'c mut Command<'d, S>,
    depth: usize,
}

impl<'d, S: Shim> Deref for ModeWindow<'_, 'd, S> {
    type Target = Command<'d, S>;

    fn deref(&self) -> &Self::Target {
        self.cmd
    }
}

impl<S: Shim> DerefMut for ModeWindow<'_, '_, S> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.cmd
    }
}

impl<S: Shim> Drop for ModeWindow<'_, '_, S> {
    fn drop(&mut self) {
        self.cmd.current().memory.close_modes_to(self.depth);
    }
}

impl<'d, S: Shim> Command<'d, S> {
    /// Opens a window of `mode` on this stream that closes when the returned guard is dropped:
    /// reservations made through the guard (it dereferences to this command) are served in
    /// `mode`. Unlike [`Self::allocation_mode`], an early return or a panic cannot leave the
    /// stream in the window.
    pub fn mode_window(&mut self, mode: AllocationMode) -> ModeWindow<'_, 'd, S> {
        let depth = self.current().memory.open_mode(mode);
        ModeWindow { cmd: self, depth }
    }

    /// Runs `f` in a [persistent](AllocationMode::Persistent) window (weights and other
    /// long-lived buffers: pages of their exact size, never shared with per-batch churn) and
    /// closes it whatever `f` returns, and if it panics.
    ///
    /// ```
    /// use devcmd::{AllocationMode, Device, DeviceConfig, StreamId};
    /// use devcmd_std::StdShim;
    ///
    /// # fn main() -> Result<(), devcmd::ServerError> {
    /// let mut device = Device::new(StdShim::new(), DeviceConfig::default());
    /// let mut cmd = device.command(StreamId(0))?;
    /// let weights = cmd.persistent(|c| c.create_typed(&[0.5f32; 1024]))?;
    /// assert_eq!(cmd.current_allocation_mode(), AllocationMode::Auto);
    /// # drop(weights);
    /// # Ok(())
    /// # }
    /// ```
    pub fn persistent<R>(&mut self, f: impl FnOnce(&mut Command<'d, S>) -> R) -> R {
        let mut window = self.mode_window(AllocationMode::Persistent);
        f(&mut window)
    }

    /// The mode new reservations on this stream are served in now.
    pub fn current_allocation_mode(&mut self) -> AllocationMode {
        self.current().memory.mode()
    }
}
