//! The behaviour groups. Each is a public function generic over a [`Harness`](crate::Harness)
//! that panics with a message naming the mode, the scenario, what was seen against what was
//! expected (for bytes: where they first differ) and the shim call most likely at fault (or that
//! the rule is the core's and no shim call is involved).

mod bad_input;
mod capture;
mod drop_queue;
mod failure_rule;
mod faults;
mod host_release;
mod layout;
mod library;
mod pipelined;
mod reuse;
mod round_trip;
mod several_devices;
mod virtual_memory;
pub mod work_faults;

pub use bad_input::bad_input;
pub use capture::{capture, capture_replay_fault};
pub use drop_queue::drop_queue;
pub use failure_rule::{failure_rule, failure_rule_with};
pub use faults::fault_injection;
pub use host_release::{RELEASED_BYTE, host_release};
pub use layout::layouts;
pub use library::library_work;
pub use pipelined::{pipelined, pipelined_work_fault};
pub use reuse::{cross_stream_reuse, pending_frees};
pub use round_trip::round_trips;
pub use several_devices::{several_devices, several_devices_fault, several_devices_lost};
pub use virtual_memory::virtual_memory;
pub use work_faults::work_faults;
