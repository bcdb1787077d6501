//! Several `StdShim`s in one process: each is its own address space (an address of one is
//! refused by every call of the other), and `copy_peer` copies between two of them on the
//! destination stream's worker.

use crate::*;
use devcmd::{CopyLayout, DeviceSpan, HostMemory, KernelParam, LaunchDims, Shim};

fn sync(shim: &StdShim, stream: &StdStream) {
    shim.event_wait(&shim.record_event(stream).unwrap())
        .unwrap();
}

fn upload(shim: &StdShim, stream: &StdStream, page: &StdDevicePage, data: &[u8]) {
    let layout = CopyLayout::linear(data.len() as u64);
    // SAFETY: `data` outlives the wait below; the page holds `data.len()` bytes.
    unsafe {
        shim.copy_to_device(
            stream,
            data.as_ptr(),
            HostMemory::Pageable,
            shim.device_page_addr(page),
            layout,
        )
    }
    .unwrap();
    sync(shim, stream);
}

fn download(shim: &StdShim, stream: &StdStream, page: &StdDevicePage) -> Vec<u8> {
    let mut out = vec![0u8; page.size() as usize];
    let layout = CopyLayout::linear(page.size());
    // SAFETY: `out` outlives the wait below; the page holds `out.len()` bytes.
    unsafe {
        shim.copy_to_host(
            stream,
            shim.device_page_addr(page),
            out.as_mut_ptr(),
            HostMemory::Pageable,
            layout,
        )
    }
    .unwrap();
    sync(shim, stream);
    out
}

#[test]
fn an_address_of_one_shim_is_refused_by_every_call_of_another() {
    let (a, b) = (StdShim::new(), StdShim::new());
    let (sa, sb) = (a.create_stream().unwrap(), b.create_stream().unwrap());
    let pa = a.device_alloc(64).unwrap();
    let pb = b.device_alloc(64).unwrap();
    upload(&a, &sa, &pa, &[7; 64]);
    let (addr_a, addr_b) = (a.device_page_addr(&pa), b.device_page_addr(&pb));
    let layout = CopyLayout::linear(64);
    let mut host = [0u8; 64];
    // SAFETY: every call below is refused before anything is enqueued (the address is not the
    // shim's); `host` outlives them.
    unsafe {
        let read = b.copy_to_host(&sb, addr_a, host.as_mut_ptr(), HostMemory::Pageable, layout);
        assert_eq!(read.unwrap_err().status, status::BAD_ADDRESS);
        let write = b.copy_to_device(&sb, host.as_ptr(), HostMemory::Pageable, addr_a, layout);
        assert_eq!(write.unwrap_err().status, status::BAD_ADDRESS);
        let d2d = b.copy_on_device(&sb, addr_a, addr_b, layout);
        assert_eq!(d2d.unwrap_err().status, status::BAD_ADDRESS);
        let k = b.register_kernel("noop", |_| Ok(()));
        let spans = [DeviceSpan {
            addr: addr_a,
            len: 64,
        }];
        let launch = b.launch(
            &sb,
            &k,
            LaunchDims::linear(1, 1),
            &spans,
            &[KernelParam::Buffer(0)],
        );
        assert_eq!(launch.unwrap_err().status, status::BAD_ADDRESS);
        // A peer copy whose sides are swapped (the source named on the wrong shim).
        let swapped = b.copy_peer(&sb, addr_a, &a, addr_b, 64);
        assert_eq!(swapped.unwrap_err().status, status::BAD_ADDRESS);
    }
    assert_eq!(download(&a, &sa, &pa), [7; 64], "A's page untouched");
    // SAFETY: every stream was synchronised; nothing uses the pages.
    unsafe {
        a.device_free(pa);
        b.device_free(pb);
    }
}

#[test]
fn a_peer_copy_runs_on_the_destination_stream_between_two_address_spaces() {
    let (a, b) = (StdShim::new(), StdShim::builder().lazy(true).build());
    assert!(b.peer_access(&a) && a.peer_access(&b));
    let (sa, sb) = (a.create_stream().unwrap(), b.create_stream().unwrap());
    let pa = a.device_alloc(1000).unwrap();
    let pb = b.device_alloc(1000).unwrap();
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
    upload(&a, &sa, &pa, &data);
    // SAFETY: both ranges lie in live pages, synchronised below before they are freed.
    unsafe {
        b.copy_peer(
            &sb,
            devcmd::DeviceAddr(b.device_page_addr(&pb).0 + 10),
            &a,
            devcmd::DeviceAddr(a.device_page_addr(&pa).0 + 3),
            977,
        )
    }
    .unwrap();
    let got = download(&b, &sb, &pb);
    assert_eq!(&got[10..987], &data[3..980]);
    assert!(got[..10].iter().chain(&got[987..]).all(|&x| x == 0));
    // SAFETY: every stream was synchronised; nothing uses the pages.
    unsafe {
        a.device_free(pa);
        b.device_free(pb);
    }
}
