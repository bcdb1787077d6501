//! GPU tests of the CUDA shim: they run for real where a CUDA driver and device are present and
//! print a visible `skipped: no CUDA driver` line (straight to stderr, past the test harness's
//! capture) and pass where none is.
//!
//! The device is `DEVCMD_CUDA_DEVICE` (default 0). Built here with
//! `cargo test -p devcmd-cuda --no-run --release`, run on the GPU machine by starting the test
//! binary (`target/release/deps/gpu-*`).

mod common;

use common::{gpu, pattern};
use devcmd::{CopyLayout, DeviceAddr, Fault, HostMemory, Shim};
use devcmd_cuda::{CudaHostPage, CudaShim, CudaStream};
use std::io::Write;

fn wait(shim: &CudaShim, stream: &CudaStream) {
    let event = shim.record_event(stream).unwrap();
    shim.event_wait(&event).unwrap();
    assert!(shim.event_query(&event).unwrap());
}

/// A pinned page holding `bytes`.
fn pinned_with(shim: &CudaShim, bytes: &[u8]) -> CudaHostPage {
    let page = shim.host_alloc_pinned(bytes.len()).unwrap();
    // SAFETY: the page holds `bytes.len()` bytes and nothing else uses it yet.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            shim.host_page_ptr(&page).as_ptr(),
            bytes.len(),
        )
    };
    page
}

/// The bytes of a pinned page (after the copies writing it completed).
fn pinned_bytes(shim: &CudaShim, page: &CudaHostPage, len: usize) -> Vec<u8> {
    // SAFETY: the page holds at least `len` bytes; every copy writing it has completed.
    unsafe { std::slice::from_raw_parts(shim.host_page_ptr(page).as_ptr(), len) }.to_vec()
}

#[test]
fn facts_name_and_versions() {
    let Some(shim) = gpu("facts_name_and_versions") else {
        return;
    };
    let facts = shim.facts();
    let _ = writeln!(
        std::io::stderr(),
        "device {}: {} (driver CUDA {}, bindings {}), {facts:?}",
        shim.ordinal(),
        shim.name(),
        shim.driver_version(),
        shim.binding_version(),
    );
    assert!(facts.total_memory > 0);
    assert_eq!(facts.page_alignment, 256);
    assert_eq!(facts.max_page_size, facts.total_memory);
    assert!(shim.driver_version() >= shim.binding_version());
    assert!(!shim.name().is_empty());
}

#[test]
fn device_pages_are_aligned_and_sizes_past_the_device_are_too_big() {
    let Some(shim) = gpu("device_pages_are_aligned_and_sizes_past_the_device_are_too_big") else {
        return;
    };
    let pages: Vec<_> = [0u64, 1, 255, 4096, 1 << 20, 64 << 20]
        .into_iter()
        .map(|size| shim.device_alloc(size).unwrap())
        .collect();
    let mut addrs: Vec<u64> = pages.iter().map(|p| shim.device_page_addr(p).0).collect();
    assert!(addrs.iter().all(|a| a % 256 == 0 && *a != 0), "{addrs:x?}");
    addrs.sort_unstable();
    addrs.dedup();
    assert_eq!(
        addrs.len(),
        pages.len(),
        "every page, even empty, has its own address"
    );
    let too_big = shim
        .device_alloc(shim.facts().total_memory + 1)
        .unwrap_err();
    assert_eq!(too_big.fault, Fault::TooBig, "{too_big}");
    for page in pages {
        // SAFETY: no work used the pages.
        unsafe { shim.device_free(page) };
    }
}

#[test]
fn linear_round_trip_through_pinned_and_pageable_memory() {
    let Some(shim) = gpu("linear_round_trip_through_pinned_and_pageable_memory") else {
        return;
    };
    let stream = shim.create_stream().unwrap();
    for len in [1usize, 1000, 4 << 20] {
        let data = pattern(len, len as u8);
        let page = shim.device_alloc(len as u64).unwrap();
        let addr = shim.device_page_addr(&page);
        let layout = CopyLayout::linear(len as u64);
        // Pinned both ways.
        let src = pinned_with(&shim, &data);
        let dst = shim.host_alloc_pinned(len).unwrap();
        // SAFETY: the host pages and the device page outlive the wait below.
        unsafe {
            shim.copy_to_device(
                &stream,
                shim.host_page_ptr(&src).as_ptr(),
                HostMemory::Pinned,
                addr,
                layout,
            )
            .unwrap();
            shim.copy_to_host(
                &stream,
                addr,
                shim.host_page_ptr(&dst).as_ptr(),
                HostMemory::Pinned,
                layout,
            )
            .unwrap();
        }
        wait(&shim, &stream);
        assert_eq!(pinned_bytes(&shim, &dst, len), data, "pinned, {len} bytes");
        // Pageable both ways.
        let data2 = pattern(len, 77);
        let mut back = vec![0u8; len];
        // SAFETY: both vectors outlive the wait below.
        unsafe {
            shim.copy_to_device(&stream, data2.as_ptr(), HostMemory::Pageable, addr, layout)
                .unwrap();
            shim.copy_to_host(
                &stream,
                addr,
                back.as_mut_ptr(),
                HostMemory::Pageable,
                layout,
            )
            .unwrap();
        }
        wait(&shim, &stream);
        assert_eq!(back, data2, "pageable, {len} bytes");
        // SAFETY: every copy using the pages has completed.
        unsafe {
            shim.host_free_pinned(src);
            shim.host_free_pinned(dst);
            shim.device_free(page);
        }
    }
}

#[test]
fn pitched_round_trip_places_rows_and_leaves_the_padding() {
    let Some(shim) = gpu("pitched_round_trip_places_rows_and_leaves_the_padding") else {
        return;
    };
    let stream = shim.create_stream().unwrap();
    // 300 rows of 1000 bytes, 1024 bytes apart on the device.
    let (rows, width, pitch) = (300usize, 1000usize, 1024usize);
    let layout = CopyLayout::of(&[rows as u64, width as u64], &[pitch as u64, 1], 1).unwrap();
    assert!(!layout.is_linear());
    let span = layout.device_span() as usize;
    let page = shim.device_alloc(span as u64).unwrap();
    let addr = shim.device_page_addr(&page);
    let fill = vec![0xEEu8; span];
    let data = pattern(rows * width, 5);
    let src = pinned_with(&shim, &data);
    let packed = shim.host_alloc_pinned(rows * width).unwrap();
    let mut whole = vec![0u8; span];
    // SAFETY: every host buffer and the page outlive the wait below; spans lie in the page.
    unsafe {
        shim.copy_to_device(
            &stream,
            fill.as_ptr(),
            HostMemory::Pageable,
            addr,
            CopyLayout::linear(span as u64),
        )
        .unwrap();
        shim.copy_to_device(
            &stream,
            shim.host_page_ptr(&src).as_ptr(),
            HostMemory::Pinned,
            addr,
            layout,
        )
        .unwrap();
        shim.copy_to_host(
            &stream,
            addr,
            whole.as_mut_ptr(),
            HostMemory::Pageable,
            CopyLayout::linear(span as u64),
        )
        .unwrap();
        shim.copy_to_host(
            &stream,
            addr,
            shim.host_page_ptr(&packed).as_ptr(),
            HostMemory::Pinned,
            layout,
        )
        .unwrap();
    }
    wait(&shim, &stream);
    for r in 0..rows {
        let row = &whole[r * pitch..];
        assert_eq!(&row[..width], &data[r * width..(r + 1) * width], "row {r}");
        if r + 1 < rows {
            assert!(
                row[width..pitch].iter().all(|b| *b == 0xEE),
                "padding of row {r}"
            );
        }
    }
    assert_eq!(pinned_bytes(&shim, &packed, rows * width), data);
    // SAFETY: every copy using the pages has completed.
    unsafe {
        shim.host_free_pinned(src);
        shim.host_free_pinned(packed);
        shim.device_free(page);
    }
}

#[test]
fn copies_on_the_device_linear_and_pitched() {
    let Some(shim) = gpu("copies_on_the_device_linear_and_pitched") else {
        return;
    };
    let stream = shim.create_stream().unwrap();
    let layout = CopyLayout::of(&[64, 200], &[256, 1], 1).unwrap();
    let span = layout.device_span();
    let (a, b, c) = (
        shim.device_alloc(span).unwrap(),
        shim.device_alloc(span).unwrap(),
        shim.device_alloc(span).unwrap(),
    );
    let (a_addr, b_addr, c_addr) = (
        shim.device_page_addr(&a),
        shim.device_page_addr(&b),
        shim.device_page_addr(&c),
    );
    let data = pattern(span as usize, 9);
    let zeros = vec![0u8; span as usize];
    let mut linear_back = vec![0u8; span as usize];
    let mut pitched_back = vec![0u8; span as usize];
    let all = CopyLayout::linear(span);
    // SAFETY: the host buffers and the pages outlive the wait below; spans lie in the pages.
    unsafe {
        shim.copy_to_device(&stream, data.as_ptr(), HostMemory::Pageable, a_addr, all)
            .unwrap();
        shim.copy_to_device(&stream, zeros.as_ptr(), HostMemory::Pageable, c_addr, all)
            .unwrap();
        shim.copy_on_device(&stream, a_addr, b_addr, all).unwrap();
        shim.copy_on_device(&stream, a_addr, c_addr, layout)
            .unwrap();
        shim.copy_to_host(
            &stream,
            b_addr,
            linear_back.as_mut_ptr(),
            HostMemory::Pageable,
            all,
        )
        .unwrap();
        shim.copy_to_host(
            &stream,
            c_addr,
            pitched_back.as_mut_ptr(),
            HostMemory::Pageable,
            all,
        )
        .unwrap();
    }
    wait(&shim, &stream);
    assert_eq!(linear_back, data);
    for (i, (got, want)) in pitched_back.iter().zip(&data).enumerate() {
        let in_row = i % 256 < 200;
        assert_eq!(*got, if in_row { *want } else { 0 }, "byte {i}");
    }
    // SAFETY: every copy using the pages has completed.
    unsafe {
        shim.device_free(a);
        shim.device_free(b);
        shim.device_free(c);
    }
}

#[test]
fn events_complete_and_queries_never_block_or_fail() {
    let Some(shim) = gpu("events_complete_and_queries_never_block_or_fail") else {
        return;
    };
    let stream = shim.create_stream().unwrap();
    // An event on an idle stream completes.
    let idle = shim.record_event(&stream).unwrap();
    shim.event_wait(&idle).unwrap();
    assert!(shim.event_query(&idle).unwrap());
    // An event after a large copy: a query answers (false or true), never an error.
    let len = 64 << 20;
    let src = pinned_with(&shim, &pattern(len, 3));
    let page = shim.device_alloc(len as u64).unwrap();
    // SAFETY: the page and the host page outlive the wait below.
    unsafe {
        shim.copy_to_device(
            &stream,
            shim.host_page_ptr(&src).as_ptr(),
            HostMemory::Pinned,
            shim.device_page_addr(&page),
            CopyLayout::linear(len as u64),
        )
        .unwrap();
    }
    let busy = shim.record_event(&stream).unwrap();
    let first = shim.event_query(&busy).unwrap();
    let mut polls = 0u64;
    while !shim.event_query(&busy).unwrap() {
        polls += 1;
        std::thread::yield_now();
    }
    shim.event_wait(&busy).unwrap();
    let _ = writeln!(
        std::io::stderr(),
        "64 MiB upload: first query {first}, {polls} polls before completion"
    );
    // Many events: the pool hands them out again after they drop.
    for _ in 0..3 {
        let events: Vec<_> = (0..500)
            .map(|_| shim.record_event(&stream).unwrap())
            .collect();
        shim.event_wait(events.last().unwrap()).unwrap();
        assert!(events.iter().all(|e| shim.event_query(e).unwrap()));
    }
    // SAFETY: every copy using the pages has completed.
    unsafe {
        shim.host_free_pinned(src);
        shim.device_free(page);
    }
}

#[test]
fn a_stream_waits_for_an_event_of_another_stream() {
    let Some(shim) = gpu("a_stream_waits_for_an_event_of_another_stream") else {
        return;
    };
    let (producer, consumer) = (shim.create_stream().unwrap(), shim.create_stream().unwrap());
    let len = 32 << 20;
    let layout = CopyLayout::linear(len as u64);
    let x = shim.device_alloc(len as u64).unwrap();
    let y = shim.device_alloc(len as u64).unwrap();
    let (xa, ya) = (shim.device_page_addr(&x), shim.device_page_addr(&y));
    let back = shim.host_alloc_pinned(len).unwrap();
    for round in 0..4u8 {
        let src = pinned_with(&shim, &pattern(len, round));
        // SAFETY: the host pages and device pages outlive the waits below.
        unsafe {
            shim.copy_to_device(
                &producer,
                shim.host_page_ptr(&src).as_ptr(),
                HostMemory::Pinned,
                xa,
                layout,
            )
            .unwrap();
            let produced = shim.record_event(&producer).unwrap();
            shim.stream_wait_event(&consumer, &produced).unwrap();
            // The event may drop (and go back to the pool) before the wait ran on the device.
            drop(produced);
            shim.copy_on_device(&consumer, xa, ya, layout).unwrap();
            shim.copy_to_host(
                &consumer,
                ya,
                shim.host_page_ptr(&back).as_ptr(),
                HostMemory::Pinned,
                layout,
            )
            .unwrap();
        }
        wait(&shim, &consumer);
        assert!(
            pinned_bytes(&shim, &back, len) == pattern(len, round),
            "round {round}: the consumer ran before the producer's copy completed"
        );
        wait(&shim, &producer);
        // SAFETY: every copy reading the page has completed.
        unsafe { shim.host_free_pinned(src) };
    }
    // SAFETY: every copy using the pages has completed.
    unsafe {
        shim.host_free_pinned(back);
        shim.device_free(x);
        shim.device_free(y);
    }
}

#[test]
fn mapped_pinned_pages_are_device_memory() {
    let Some(shim) = gpu("mapped_pinned_pages_are_device_memory") else {
        return;
    };
    if !shim.facts().can_map_host {
        let _ = writeln!(
            std::io::stderr(),
            "skipped: the device cannot map host memory"
        );
        return;
    }
    let len = 1 << 20;
    let data = pattern(len, 11);
    let host = pinned_with(&shim, &data);
    let mapped: DeviceAddr = shim.host_page_device_addr(&host).expect("a mapped page");
    let page = shim.device_alloc(len as u64).unwrap();
    let stream = shim.create_stream().unwrap();
    let layout = CopyLayout::linear(len as u64);
    let mut back = vec![0u8; len];
    // SAFETY: the pages outlive the wait below; the mapped page is device memory of `len` bytes.
    unsafe {
        shim.copy_on_device(&stream, mapped, shim.device_page_addr(&page), layout)
            .unwrap();
        shim.copy_to_host(
            &stream,
            shim.device_page_addr(&page),
            back.as_mut_ptr(),
            HostMemory::Pageable,
            layout,
        )
        .unwrap();
    }
    wait(&shim, &stream);
    assert_eq!(back, data, "the device read the pinned page in place");
    // And the device writes it in place.
    let other = pattern(len, 12);
    // SAFETY: as above.
    unsafe {
        shim.copy_to_device(
            &stream,
            other.as_ptr(),
            HostMemory::Pageable,
            shim.device_page_addr(&page),
            layout,
        )
        .unwrap();
        shim.copy_on_device(&stream, shim.device_page_addr(&page), mapped, layout)
            .unwrap();
    }
    wait(&shim, &stream);
    assert_eq!(pinned_bytes(&shim, &host, len), other);
    // SAFETY: every copy using the pages has completed.
    unsafe {
        shim.host_free_pinned(host);
        shim.device_free(page);
    }
}

#[test]
fn handles_cross_threads_and_every_thread_gets_the_context() {
    let Some(shim) = gpu("handles_cross_threads_and_every_thread_gets_the_context") else {
        return;
    };
    let stream = shim.create_stream().unwrap();
    let event = shim.record_event(&stream).unwrap();
    // Dropped on other threads, which never called the shim before.
    std::thread::spawn(move || drop(event)).join().unwrap();
    std::thread::spawn(move || drop(stream)).join().unwrap();
    // Fresh threads at once, each with its own stream and round trip.
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let shim = &shim;
            s.spawn(move || {
                let stream = shim.create_stream().unwrap();
                let len = 1 << 20;
                let data = pattern(len, t);
                let mut back = vec![0u8; len];
                let page = shim.device_alloc(len as u64).unwrap();
                let addr = shim.device_page_addr(&page);
                // SAFETY: the buffers and the page outlive the wait below.
                unsafe {
                    shim.copy_to_device(
                        &stream,
                        data.as_ptr(),
                        HostMemory::Pageable,
                        addr,
                        CopyLayout::linear(len as u64),
                    )
                    .unwrap();
                    shim.copy_to_host(
                        &stream,
                        addr,
                        back.as_mut_ptr(),
                        HostMemory::Pageable,
                        CopyLayout::linear(len as u64),
                    )
                    .unwrap();
                }
                wait(shim, &stream);
                assert_eq!(back, data, "thread {t}");
                // SAFETY: every copy using the page has completed.
                unsafe { shim.device_free(page) };
            });
        }
    });
}
