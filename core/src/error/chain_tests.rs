//! Every error a command can return, walked down its `source()` chain as a host prints it: no
//! message repeats (none holds another, no two open with the same statement), and each ends in
//! an action (the clause after its last `; ` starts with a verb a reader can act on).

use super::*;
use crate::shim::LaunchDims;
use alloc::boxed::Box;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use alloc::{format, vec};

/// The verbs the last clause of a message may start with.
const ACTIONS: &[&str] = &[
    "bind", "borrow", "call", "check", "drop", "end", "fix", "free", "give", "hold", "keep",
    "make", "name", "pass", "raise", "read", "recreate", "replay", "report", "reserve", "retry",
    "rewrite", "run", "split", "upload", "use", "wait", "write",
];

const FAULTS: [Fault; 6] = [
    Fault::OutOfMemory,
    Fault::TooBig,
    Fault::Unsupported,
    Fault::DeviceLost,
    Fault::WorkFailed,
    Fault::Failed,
];

fn driver_errors() -> Vec<DriverError> {
    ShimOp::ALL
        .iter()
        .flat_map(|&op| FAULTS.iter().map(move |&f| DriverError::new(op, 42, f)))
        .collect()
}

fn validations() -> Vec<Validation> {
    let dims = LaunchDims::covering(0, 0);
    vec![
        Validation::StreamOutOfRange { stream: 9, max: 4 },
        Validation::StreamOutOfRange {
            stream: 70_000,
            max: 1 << 16,
        },
        Validation::StreamInUse { stream: 1 },
        Validation::LengthMismatch {
            expected: 8,
            found: 4,
        },
        Validation::HostBufferLength {
            op: "HostBuffer::copy_from",
            buffer: 12,
            given: 16,
        },
        Validation::NotWholeElements { len: 6, element: 4 },
        Validation::ViewLengths { dst: 100, src: 50 },
        Validation::LayoutPastView { span: 8, view: 4 },
        Validation::ReadOnlyDestination,
        Validation::Recording { op: "sync" },
        Validation::AliasedLaunch {
            kernel: "k",
            output: 1,
            other: 0,
        },
        Validation::LaunchParam {
            kernel: "k",
            param: 0,
            slot: 3,
            buffers: 2,
        },
        Validation::LibraryOperand {
            work: "gemm",
            operand: "A",
            needs: 64,
            found: 32,
        },
        Validation::LibraryOperand {
            work: "gemm",
            operand: "B",
            needs: u64::MAX,
            found: 32,
        },
        Validation::LibraryLeadingDimension {
            work: "gemm",
            operand: "A",
            name: "lda",
            value: 2,
            least: 4,
        },
        Validation::LibraryAlignment {
            work: "gemm",
            operand: "C",
            offset: 2,
            element: 4,
        },
        Validation::LibraryDimension {
            work: "gemm",
            dimension: "m",
            value: 1 << 40,
            max: i32::MAX as u64,
        },
        Validation::LibrarySplit {
            work: "gemm",
            k: 768,
            parts: 5,
        },
        Validation::LibraryUnsupported {
            work: "gemm",
            what: "a transposed A",
        },
        Validation::LaunchDims { kernel: "k", dims },
    ]
}

fn io_errors() -> Vec<IoError> {
    let mut all = vec![
        IoError::BufferTooBig {
            size: 32 << 20,
            max_page: 8 << 20,
            budget: Some(8 << 20),
        },
        IoError::BufferTooBig {
            size: 32 << 20,
            max_page: 8 << 20,
            budget: None,
        },
        IoError::OutOfMemory {
            size: 4 << 20,
            held: 6 << 20,
            budget: Some(8 << 20),
            source: None,
        },
        IoError::OutOfMemory {
            size: 4 << 20,
            held: 6 << 20,
            budget: None,
            source: Some(DriverError::new(ShimOp::DeviceAlloc, 2, Fault::OutOfMemory)),
        },
        IoError::PageUpdateForbidden { size: 64, room: 32 },
        IoError::UnsupportedStrides { rank: 2, dim: 1 },
        IoError::StorageHandleNotFound { handle: 3, page: 1 },
        IoError::ForeignHandle {
            issued_by: 1,
            used_on: 2,
            issuer_dropped: true,
        },
        IoError::ForeignHandle {
            issued_by: 1,
            used_on: 2,
            issuer_dropped: false,
        },
        IoError::WrongStream {
            handle: 3,
            owner: 1,
            used_on: 0,
        },
        IoError::InUse { handle: 3 },
        IoError::Exposed { handle: 3 },
        IoError::KeptByGraph { handle: 3 },
        IoError::RoomTooSmall {
            room: 64,
            needs: 128,
        },
        IoError::OutOfRange {
            offset: 8,
            len: 8,
            size: 12,
        },
        IoError::SelfBind { handle: 3 },
        IoError::HostAllocFailed { len: 1 << 40 },
    ];
    for reason in [
        NotFoundReason::NeverBound,
        NotFoundReason::HandedOver,
        NotFoundReason::Stale,
        NotFoundReason::OtherManager,
    ] {
        all.push(IoError::NotFound { handle: 3, reason });
    }
    all.extend(driver_errors().into_iter().map(IoError::Shim));
    all
}

fn capture_errors() -> Vec<CaptureError> {
    let mut all = vec![
        CaptureError::AnotherRecords {
            stream: 1,
            recording: 0,
        },
        CaptureError::NotRecording { stream: 1 },
        CaptureError::RecordedElsewhere {
            stream: 1,
            recording: 0,
            handle: 3,
        },
        CaptureError::ForeignGraph {
            recorded_on: 1,
            used_on: 2,
        },
    ];
    for reason in [
        ServerError::Io(IoError::PageUpdateForbidden { size: 64, room: 0 }),
        ServerError::Launch(LaunchError::Refused {
            kernel: "k",
            cause: DriverError::new(ShimOp::Launch, 1, Fault::Failed),
        }),
    ] {
        all.push(CaptureError::Discarded {
            stream: 0,
            reason: Box::new(reason),
        });
    }
    for cause in driver_errors() {
        all.push(CaptureError::Refused { stream: 0, cause });
    }
    all
}

/// Every `ServerError` a command can return: each variant, with each inner error.
fn server_errors() -> Vec<ServerError> {
    let work_failed = DriverError::new(ShimOp::Launch, 20, Fault::WorkFailed);
    let faulted = ServerError::StreamFaulted {
        stream: 0,
        cause: work_failed,
        kernel: Some("scale_add"),
    };
    let mut all: Vec<ServerError> = vec![
        ServerError::Skipped {
            kernel: "k",
            failure: 7,
        },
        ServerError::Unwritten {
            failure: 7,
            handle: 3,
            chain: vec!["a", "b"],
            skipped_total: 2,
            root: Box::new(faulted.clone()),
        },
        faulted,
        ServerError::StreamFaulted {
            stream: 1,
            cause: DriverError::new(ShimOp::CopyHostToDevice, 300, Fault::WorkFailed),
            kernel: None,
        },
        ServerError::Launch(LaunchError::Library {
            work: "gemm",
            error: LibraryError::new(7, "CUBLAS_STATUS_INVALID_VALUE"),
        }),
    ];
    all.extend(validations().into_iter().map(ServerError::Validation));
    for e in io_errors() {
        all.push(ServerError::Launch(LaunchError::Buffer {
            kernel: "k",
            index: 1,
            cause: e.clone(),
        }));
        all.push(ServerError::Io(e));
    }
    all.extend(capture_errors().into_iter().map(ServerError::Capture));
    for e in driver_errors() {
        all.push(ServerError::Launch(LaunchError::Refused {
            kernel: "k",
            cause: e,
        }));
        // What `From<DriverError>` makes: `DeviceLost` or `Device`.
        all.push(e.into());
    }
    all
}

/// The messages of `e`'s chain, top first.
fn chain(e: &dyn core::error::Error) -> Vec<String> {
    let mut out = vec![e.to_string()];
    let mut next = e.source();
    while let Some(s) = next {
        out.push(s.to_string());
        next = s.source();
    }
    out
}

/// The statement a message opens with: up to its first `;` or `:`.
fn opening(m: &str) -> &str {
    m.split([';', ':']).next().unwrap_or(m)
}

fn check(e: &ServerError) -> Result<(), String> {
    let msgs = chain(e);
    for (i, a) in msgs.iter().enumerate() {
        let Some((_, last)) = a.rsplit_once("; ") else {
            return Err(format!("message {i} has no action after a `; `: {msgs:#?}"));
        };
        let verb = last.split([' ', ',']).next().unwrap_or("");
        if !ACTIONS.contains(&verb) {
            return Err(format!(
                "message {i} ends in `{last}`, not an action: {msgs:#?}"
            ));
        }
        for (j, b) in msgs.iter().enumerate() {
            if i != j && (a.contains(b.as_str()) || opening(a) == opening(b)) {
                return Err(format!("messages {i} and {j} repeat: {msgs:#?}"));
            }
        }
    }
    Ok(())
}

#[test]
#[cfg_attr(
    miri,
    ignore = "formats 300 chains and runs no unsafe code: three minutes under miri"
)]
fn every_chain_prints_each_message_once_and_ends_in_an_action() {
    let all = server_errors();
    assert!(all.len() > 300, "{} errors built", all.len());
    let failures: Vec<String> = all.iter().filter_map(|e| check(e).err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} chains fail:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

#[test]
fn a_budget_too_small_for_the_page_names_the_budget() {
    let text = IoError::BufferTooBig {
        size: 32 << 20,
        max_page: 8 << 20,
        budget: Some(8 << 20),
    }
    .to_string();
    assert!(text.contains("DeviceConfig::memory_budget"), "{text}");
}

#[test]
fn a_kernel_that_failed_while_it_ran_is_not_a_failed_launch() {
    let e = ServerError::StreamFaulted {
        stream: 0,
        cause: DriverError::new(ShimOp::Launch, 20, Fault::WorkFailed),
        kernel: Some("k"),
    };
    let msgs = chain(&e);
    assert_eq!(msgs.len(), 2, "{msgs:#?}");
    assert!(
        msgs.iter().all(|m| !m.contains("launch failed")),
        "{msgs:#?}"
    );
    let advice = |m: &str| m.rsplit_once("; ").map(|(_, a)| a.to_string());
    assert!(
        advice(&msgs[0])
            .unwrap()
            .starts_with(&advice(&msgs[1]).unwrap()),
        "the top and the cause advise differently: {msgs:#?}"
    );
}

#[test]
fn a_handle_of_a_dropped_device_is_not_told_to_copy_through_it() {
    let id = crate::live::register();
    let alive = IoError::foreign_handle(id, 0).to_string();
    crate::live::retire(id);
    let gone = IoError::foreign_handle(id, 0).to_string();
    assert!(alive.contains("read the data back"), "{alive}");
    assert!(
        gone.contains("was dropped") && !gone.contains("read the data back"),
        "{gone}"
    );
}
