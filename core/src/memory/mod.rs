//! Device memory: handles, pages, pools, the manager, guards and the report.
//!
//! Pages come from the shim; the core carves slices out of them. One [`MemoryManager`] serves one
//! stream; the [`MemoryBudget`] is shared by every stream of a device.

mod budget;
mod config;
mod free_index;
pub(crate) mod handle;
mod manager;
mod report;
pub(crate) mod sliced;
pub(crate) mod whole;

pub use budget::MemoryBudget;
pub use config::{MemoryConfig, PageRelease};
pub use handle::{AsBinding, Binding, BindingRef, Handle, Issuer};
pub(crate) use handle::{Location, POOL_DEDICATED, POOL_SMALL, ReturnQueue, Returned};
pub use manager::{
    AllocationInfo, AllocationMode, Cleanup, MemoryManager, PageGuard, PageInfo, PageRef,
    PageUpdate, Resolved, RetiredPage,
};
pub use report::{MemoryReport, PoolKind, PoolReport, ReadableBytes};
