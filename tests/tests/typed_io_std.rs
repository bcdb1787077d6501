//! Typed host I/O on the std shim: typed uploads and reads meet a kernel that reads and writes
//! native-order floats, and lengths that do not match are refused before anything is enqueued.

use devcmd::{
    Device, DeviceConfig, KernelParam, Launch, LaunchDims, ReadRequest, StreamId, Validation,
};
use devcmd_std::StdShim;

#[test]
fn typed_data_round_trips_through_a_kernel_in_native_order() {
    let shim = StdShim::new();
    let double = shim.register_kernel("double", |ctx| {
        let ([x], [y]) = ctx.io::<f32, 1, 1>()?;
        for (y, x) in y.iter_mut().zip(x) {
            *y = 2.0 * x;
        }
        Ok(())
    });
    let mut device = Device::new(shim, DeviceConfig::default());
    let mut cmd = device.command(StreamId(0)).unwrap();
    // Four-float vectors: any plain-data type goes.
    let data: Vec<[f32; 4]> = (0..64).map(|i| [i as f32, -1.5, 0.25, 1e30]).collect();
    let x = cmd.empty(64 * 16).unwrap();
    cmd.write_typed(&x, &data).unwrap();
    let y = cmd.empty(64 * 16).unwrap();
    cmd.launch(Launch {
        kernel: &double,
        dims: LaunchDims::covering(256, 256),
        inputs: &[&x],
        outputs: &[&y],
        params: &[KernelParam::Buffer(0), KernelParam::Buffer(1)],
    })
    .unwrap();
    let mut back = vec![[0f32; 4]; 64];
    cmd.read_typed(&y, &mut back).unwrap();
    let want: Vec<[f32; 4]> = data.iter().map(|v| v.map(|e| 2.0 * e)).collect();
    assert_eq!(back, want);
    // The asynchronous read gives bytes; `to_vec_of` types them.
    let read = cmd.read_async(&[ReadRequest::whole(&x)]).unwrap();
    assert_eq!(
        read.wait().unwrap()[0].to_vec_of::<[f32; 4]>().unwrap(),
        data
    );
}

#[test]
fn typed_lengths_that_do_not_match_the_view_are_refused() {
    let mut device = Device::new(StdShim::new(), DeviceConfig::default());
    let mut cmd = device.command(StreamId(0)).unwrap();
    let x = cmd.create_typed(&[1u16, 2, 3]).unwrap();
    assert_eq!(x.len(), 6);
    let e = cmd.write_typed(&x, &[1u32, 2]).unwrap_err();
    assert!(
        matches!(
            e,
            devcmd::ServerError::Validation(Validation::LengthMismatch {
                expected: 6,
                found: 8
            })
        ),
        "{e:?}"
    );
    let e = cmd.read_typed(&x, &mut [0u16; 2]).unwrap_err();
    assert!(
        matches!(
            e,
            devcmd::ServerError::Validation(Validation::LengthMismatch { .. })
        ),
        "{e:?}"
    );
    let mut back = [0u16; 3];
    cmd.read_typed(&x, &mut back).unwrap();
    assert_eq!(back, [1, 2, 3]);
}
