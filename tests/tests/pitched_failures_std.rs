//! A pitched copy writes rows, not the padding between them: a failed pitched upload marks only
//! its rows, and a read of the padding alone still returns what was last written there.

use devcmd::{
    CopyLayout, Device, DeviceConfig, HostBuffer, ReadRequest, ServerError, ShimOp, StreamId,
};
use devcmd_std::{Injection, StdShim};

#[test]
fn a_failed_pitched_upload_marks_its_rows_only() {
    let shim = StdShim::new();
    let probe = shim.clone();
    let mut device = Device::new(shim, DeviceConfig::default());
    let mut cmd = device.command(StreamId(0)).unwrap();
    // 4 rows of 32 bytes at a pitch of 48: 176 bytes spanned, 16 bytes of padding after rows 0-2.
    let h = cmd.create(&[9u8; 176]).unwrap();
    let layout = CopyLayout::of(&[4, 32], &[48, 1], 1).unwrap();
    assert!(!layout.is_linear());
    let next = probe.stats().calls(ShimOp::CopyHostToDevice) + 1;
    probe.inject(Injection::nth(ShimOp::CopyHostToDevice, next));
    let err = cmd
        .write_layout(&h, HostBuffer::from_vec(vec![1u8; 128]), layout)
        .unwrap_err();
    assert!(!matches!(err, ServerError::Unwritten { .. }), "{err}");
    probe.clear_injections();
    // A row is unwritten; the padding after row 0 is not.
    let row = h.view(48, 32).unwrap();
    let e = cmd.read_async(&[ReadRequest::whole(&row)]).unwrap_err();
    assert!(matches!(e, ServerError::Unwritten { .. }), "{e}");
    let padding = h.view(32, 16).unwrap();
    let got = cmd
        .read_async(&[ReadRequest::whole(&padding)])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(got[0].as_slice(), &[9u8; 16]);
    // Rewriting the rows clears their marks.
    cmd.write_layout(&h, HostBuffer::from_vec(vec![5u8; 128]), layout)
        .unwrap();
    let got = cmd
        .read_async(&[ReadRequest { handle: &h, layout }])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(got[0].as_slice(), &[5u8; 128]);
    drop((h, row, padding));
    assert_eq!(
        device.failures().len(),
        (0, 0),
        "the records went with the marks"
    );
}
