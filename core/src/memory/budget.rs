//! The device-wide memory budget: bytes of device pages held by every stream of a device.
//!
//! Owns the count and the limit. Does not decide what to release when the budget is short; the
//! manager and the device do.

use alloc::sync::Arc;

#[derive(Debug)]
struct BudgetState {
    limit: Option<u64>,
    held: u64,
}

/// Bytes of device pages held on one device, shared by the memory managers of all its streams,
/// and the limit they may never exceed together. Cloning shares the same count.
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    state: Arc<spin::Mutex<BudgetState>>,
}

/// A page the budget refused: what was held and the limit at the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetRefusal {
    /// Bytes held when the page was asked for.
    pub held: u64,
    /// The limit.
    pub limit: u64,
}

impl MemoryBudget {
    /// A budget of at most `limit` bytes (`None`: only the device limits).
    pub fn new(limit: Option<u64>) -> Self {
        Self {
            state: Arc::new(spin::Mutex::new(BudgetState { limit, held: 0 })),
        }
    }

    /// Counts `bytes` more as held, unless that would pass the limit.
    pub(crate) fn take(&self, bytes: u64) -> Result<(), BudgetRefusal> {
        let mut s = self.state.lock();
        let after = s.held.saturating_add(bytes);
        match s.limit {
            Some(limit) if after > limit => Err(BudgetRefusal {
                held: s.held,
                limit,
            }),
            _ => {
                s.held = after;
                Ok(())
            }
        }
    }

    /// Counts `bytes` as no longer held.
    pub(crate) fn give_back(&self, bytes: u64) {
        let mut s = self.state.lock();
        debug_assert!(s.held >= bytes, "budget gave back more than it held");
        s.held = s.held.saturating_sub(bytes);
    }

    /// Bytes of device pages held now, on every stream.
    pub fn held(&self) -> u64 {
        self.state.lock().held
    }

    /// The limit, if any.
    pub fn limit(&self) -> Option<u64> {
        self.state.lock().limit
    }
}
