//! Device memory: handles, pages, pools, the manager, guards and the report.
//!
//! Pages come from the shim; the core carves slices out of them. One [`MemoryManager`] serves one
//! stream; the [`MemoryBudget`] is shared by every stream of a device. Owns device memory only:
//! the pinned host pool of a stream lives in `pinned.rs` (it borrows the sliced and whole-page
//! pools from here, with host pages of its own and its own slice token), and the report keeps
//! the two kinds of memory apart ([`MemoryReport::device`], [`MemoryReport::pinned_host`]).

mod binding;
mod budget;
mod config;
mod free_index;
pub(crate) mod handle;
#[cfg(test)]
mod handle_model;
#[cfg(all(test, loom))]
mod loom_tests;
mod manager;
pub(crate) mod pool;
mod report;
mod retire;
mod return_queue;
pub(crate) mod sliced;
mod types;
mod vm;
pub(crate) mod whole;

pub use binding::{AsBinding, Binding, BindingRef};
pub use budget::MemoryBudget;
pub use config::{IdleGranules, MemoryConfig, PageRelease};
pub use handle::Handle;
pub(crate) use handle::ReturnQueue;
#[cfg(test)]
pub(crate) use handle::Returned;
pub use manager::MemoryManager;
pub(crate) use manager::stream_named;
#[cfg(test)]
pub(crate) use pool::{Location, Placed};
pub use report::{MemoryReport, PoolKind, PoolReport, ReadableBytes, Usage};
pub use retire::{Released, RetiringGranule};
pub use types::{
    AllocationInfo, AllocationMode, Cleanup, Issuer, PageGuard, PageInfo, PageRef, PageUpdate,
    RawPage, Resolved, RetiredPage,
};
