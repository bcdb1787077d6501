//! Virtual memory management: device address ranges reserved with no memory behind them
//! (`cuMemAddressReserve`), backed part by part with physical allocations of pinned device
//! memory (`cuMemCreate`) mapped into them (`cuMemMap`) and opened to this device for reading and
//! writing (`cuMemSetAccess`); undone with `cuMemUnmap` + `cuMemRelease` and
//! `cuMemAddressFree`.
//!
//! Owns: the device's granule, asked once at set-up ([`granule`]: 0 where the driver lacks the
//! calls, the device lacks `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`, or the
//! granularity query fails, as on older Jetson releases), the allocation properties (pinned
//! memory on this device, no shareable handle), and the four calls, with what a failed map
//! undoes. Does not own: binding the context (every function here expects it current; the shim
//! binds it), the classification of failures (`faults.rs`).
//!
//! The driver functions are looked up in the library at set-up ([`SYMBOLS`], part of
//! `OPTIONAL_SYMBOLS`): where one is missing the granule is 0, the shim answers
//! [`unsupported`](devcmd::shim::unsupported) and never calls any of them (cudarc would panic).

use crate::driver;
use crate::faults::{check, classify, status};
use cudarc::driver::sys;
use devcmd::{DeviceAddr, DriverError, ShimOp};
use std::ptr;

/// The driver functions of virtual memory management (CUDA 10.2 and later), each looked up
/// before the first call; all of them must be there for a granule other than 0.
pub(crate) const SYMBOLS: [&str; 8] = [
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
];

/// The location of memory on device `device`.
fn on_device(device: sys::CUdevice) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device,
    }
}

/// The properties of every physical allocation: pinned memory on `device`, no shareable handle,
/// no compression. Built field by field: the struct has enum fields with no zero value.
fn properties(device: sys::CUdevice) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: on_device(device),
        win32HandleMetaData: ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// The granule of `device`'s virtual memory: `cuMemGetAllocationGranularity` with
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM` for [`properties`]; 0 where the driver lacks one of
/// [`SYMBOLS`], `vmm_supported` is false, the query fails, or its answer is not a power of two.
///
/// Only after `driver::load` succeeded, with the device's context current.
pub(crate) fn granule(device: sys::CUdevice, vmm_supported: bool) -> u64 {
    if !vmm_supported || !SYMBOLS.iter().all(|s| driver::has_symbol(s)) {
        return 0;
    }
    let prop = properties(device);
    let mut g = 0usize;
    // SAFETY: the symbol exists (checked above); `g` is valid for one write and `prop` lives
    // across the call.
    let r = unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS || !g.is_power_of_two() {
        return 0;
    }
    g as u64
}

/// `size` as a `usize` that is a non-zero multiple of `granule`, or a bad-argument error of `op`
/// (refused before any driver call).
fn granules(op: ShimOp, size: u64, granule: u64) -> Result<usize, DriverError> {
    if size == 0 || granule == 0 || !size.is_multiple_of(granule) {
        return Err(classify(op, status::BAD_ARGUMENT));
    }
    usize::try_from(size).map_err(|_| classify(op, status::TOO_BIG))
}

/// `cuMemAddressReserve` of `size` bytes aligned to `granule`, anywhere.
pub(crate) fn reserve(size: u64, granule: u64) -> Result<DeviceAddr, DriverError> {
    const OP: ShimOp = ShimOp::VmReserve;
    let bytes = granules(OP, size, granule)?;
    let align = usize::try_from(granule).map_err(|_| classify(OP, status::BAD_ARGUMENT))?;
    let mut addr = 0;
    // SAFETY: the pointer is valid for one write; no fixed address is asked for (0) and no
    // flags are passed; the context is current (the caller binds it).
    check(OP, unsafe {
        sys::cuMemAddressReserve(&mut addr, bytes, align, 0, 0)
    })?;
    Ok(DeviceAddr(addr))
}

/// `cuMemAddressFree` of a reservation; an error cannot be reported (a lost device's ranges go
/// with its context).
///
/// # Safety
///
/// The range is one [`reserve`] returned, with nothing mapped in it.
pub(crate) unsafe fn release(addr: DeviceAddr, size: u64) {
    let Ok(bytes) = usize::try_from(size) else {
        return;
    };
    // SAFETY: the caller's promise.
    let _ = unsafe { sys::cuMemAddressFree(addr.0, bytes) };
}

/// `dev`, then every other of the `count` GPUs that `cuDeviceCanAccessPeer` says may access
/// `dev`'s memory (an answer the driver cannot give counts as no).
pub(crate) fn readers(dev: sys::CUdevice, count: i32) -> Vec<sys::CUdevice> {
    let mut readers = vec![dev];
    for ordinal in 0..count {
        let mut other = 0;
        // SAFETY: `ordinal` is below the driver's count; the pointer is valid for one write.
        if unsafe { sys::cuDeviceGet(&mut other, ordinal) } != sys::CUresult::CUDA_SUCCESS
            || other == dev
        {
            continue;
        }
        let mut can = 0;
        // SAFETY: both are device handles the driver gave; `can` is valid for one write.
        let asked = unsafe { sys::cuDeviceCanAccessPeer(&mut can, other, dev) };
        if asked == sys::CUresult::CUDA_SUCCESS && can != 0 {
            readers.push(other);
        }
    }
    readers
}

/// `cuMemCreate` of `size` bytes of pinned memory on `readers[0]`, `cuMemMap` of it at `addr`,
/// `cuMemSetAccess` for reading and writing from every device of `readers` (the owner, then the
/// GPUs that may copy from it); returns the allocation's handle. On a
/// failure, what succeeded is undone (unmapped, released), so nothing stays mapped. A size past
/// `total` (the device's memory) is too big without a driver call.
pub(crate) fn map(
    addr: DeviceAddr,
    size: u64,
    granule: u64,
    readers: &[sys::CUdevice],
    total: u64,
) -> Result<u64, DriverError> {
    let Some(&device) = readers.first() else {
        return Err(classify(ShimOp::VmMap, status::BAD_ARGUMENT));
    };
    const OP: ShimOp = ShimOp::VmMap;
    let bytes = granules(OP, size, granule)?;
    if !addr.0.is_multiple_of(granule) {
        return Err(classify(OP, status::BAD_ARGUMENT));
    }
    if size > total {
        return Err(classify(OP, status::TOO_BIG));
    }
    let prop = properties(device);
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: the handle is valid for one write and `prop` lives across the call; the size is
    // a non-zero multiple of the granule for these properties; the context is current.
    check(OP, unsafe {
        sys::cuMemCreate(&mut handle, bytes, &prop, 0)
    })?;
    // SAFETY: `handle` is the allocation just made, of `bytes` bytes, mapped whole (offset 0);
    // the caller names a granule-aligned range of a reservation with nothing mapped in it.
    let mapped = check(OP, unsafe { sys::cuMemMap(addr.0, bytes, 0, handle, 0) });
    if let Err(e) = mapped {
        // SAFETY: the allocation is ours and mapped nowhere.
        let _ = unsafe { sys::cuMemRelease(handle) };
        return Err(e);
    }
    let access: Vec<sys::CUmemAccessDesc> = readers
        .iter()
        .map(|&d| sys::CUmemAccessDesc {
            location: on_device(d),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        })
        .collect();
    // SAFETY: the range was just mapped; the descriptors live across the call.
    let mut opened = check(OP, unsafe {
        sys::cuMemSetAccess(addr.0, bytes, access.as_ptr(), access.len())
    });
    if opened.is_err() && access.len() > 1 {
        // A peer in trouble must not stop the device's own mappings: the owner alone (a copy
        // from this mapping on that peer then fails as its work, never reads unmapped memory).
        // SAFETY: as above, with the owner's descriptor alone.
        opened = check(OP, unsafe {
            sys::cuMemSetAccess(addr.0, bytes, access.as_ptr(), 1)
        });
    }
    if let Err(e) = opened {
        // SAFETY: the range was mapped just above and nothing can use it (no access was
        // granted); the allocation is ours.
        unsafe {
            let _ = sys::cuMemUnmap(addr.0, bytes);
            let _ = sys::cuMemRelease(handle);
        }
        return Err(e);
    }
    Ok(handle)
}

/// `cuMemUnmap` of the range, then `cuMemRelease` of its allocation (`handle`); errors cannot be
/// reported (a lost device's memory goes with its context).
///
/// # Safety
///
/// The range and handle are one [`map`] call's, and no pending work uses the range.
pub(crate) unsafe fn unmap(addr: DeviceAddr, size: u64, handle: u64) {
    let Ok(bytes) = usize::try_from(size) else {
        return;
    };
    // SAFETY: the caller's promise; the allocation is released only after its last mapping is
    // gone (CUDA would defer it anyway).
    unsafe {
        let _ = sys::cuMemUnmap(addr.0, bytes);
        let _ = sys::cuMemRelease(handle);
    }
}
