//! The several-devices groups on std devices without peer access: the std shim behind a
//! [`Forward`] whose `peer_access` answers `false`, so every copy between devices takes the
//! staged path (a read on the source device, waited for, then an upload on the destination), in
//! every mode, with the std shim's probe (faults, a lost device).

use devcmd::Shim;
use devcmd_std::{StdKernel, StdShim};
use devcmd_tests::forward::{Forward, Hooks};
use devcmd_tests::{Harness, Mode, Probe, StdHarness, TestKernel, groups};

/// Refuses peer access: the core stages every copy between devices.
#[derive(Debug, Clone, Copy)]
struct NoPeer;

impl Hooks<StdShim> for NoPeer {
    fn peer_access(&self, _inner: &StdShim, _src: &StdShim) -> bool {
        false
    }
}

/// The std harness, its shims without peer access.
struct Staged;

impl Harness for Staged {
    type S = Forward<StdShim, NoPeer>;

    fn shim(&self, mode: Mode) -> Option<Self::S> {
        let inner = StdHarness.shim(mode)?;
        Some(Forward {
            inner,
            hooks: NoPeer,
        })
    }

    fn beside(&self, first: &Self::S, mode: Mode) -> Option<Self::S> {
        let inner = StdHarness.beside(&first.inner, mode)?;
        Some(Forward {
            inner,
            hooks: NoPeer,
        })
    }

    fn kernel(&self, shim: &Self::S, kernel: TestKernel) -> StdKernel {
        StdHarness.kernel(&shim.inner, kernel)
    }

    fn probe(&self, shim: &Self::S) -> Option<Box<dyn Probe>> {
        StdHarness.probe(&shim.inner)
    }
}

macro_rules! staged {
    ($($mode:ident),*) => {
        $(
            #[allow(non_snake_case)]
            mod $mode {
                use super::*;

                #[test]
                fn several_devices() {
                    groups::several_devices(&Staged, Mode::$mode);
                }

                #[test]
                fn several_devices_lost() {
                    groups::several_devices_lost(&Staged, Mode::$mode);
                }

                #[test]
                fn several_devices_fault() {
                    groups::several_devices_fault(&Staged, Mode::$mode);
                }
            }
        )*
    };
}

staged!(NORMAL, LAZY, POISON, LAZY_POISON);

#[test]
fn the_wrapper_refuses_peer_access() {
    let (a, b) = (
        Staged.shim(Mode::NORMAL).unwrap(),
        Staged.shim(Mode::NORMAL).unwrap(),
    );
    assert!(!b.peer_access(&a));
    assert!(b.inner.peer_access(&a.inner));
}
