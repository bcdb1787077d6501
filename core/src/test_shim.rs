//! The core's unit-test device: the public address-only device ([`AddressShim`]) under the name
//! the unit tests use. Owns nothing else; the device, its counters and its refusals on demand
//! are in `address_shim.rs`.

pub(crate) use crate::address_shim::AddressShim as TestShim;
