//! What a DMA_MAP and a DMA_UNMAP of 4 KiB of memory that is already
//! mapped cost the server: the stream a guest behind a vIOMMU sends, one
//! map and one unmap per I/O buffer (QEMU turns every IOMMU change into a
//! synchronous message). Goal: 2 µs or less each.
//!
//! * `dma_space/*`: the server's own work ([`DmaSpace::map_fd`] and
//!   [`DmaSpace::unmap`]: find the file's mapping, publish a new map table,
//!   wait for the threads that hold the old one), alone and with a worker
//!   thread reading guest memory meanwhile, as a busy queue does.
//! * `round_trip/*`: both messages over a socketpair from the client, as
//!   the client waits for them (framing, fd passing and the reply included).
//!
//! `cargo bench -p vnvme-vfio-user --bench dma_map`. A program, not a test:
//! it prints figures and asserts nothing.

use std::hint::black_box;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use rustix::fs::{ftruncate, memfd_create, MemfdFlags};
use vnvme_vfio_user::{DmaSpace, GuestAddress, GuestMemory};

#[path = "../tests/common/mod.rs"]
mod common;

/// The guest's RAM, mapped whole at IOVA 0 as QEMU maps it without an IOMMU.
const RAM: u64 = 64 << 20;
/// Where the vIOMMU's maps go: IOVAs of their own, pages of the RAM.
const IOVA: u64 = 0x1_0000_0000;
const PAGE: u64 = 4096;

fn ram() -> OwnedFd {
    let fd = memfd_create("vnvme-bench-ram", MemfdFlags::CLOEXEC).expect("memfd");
    ftruncate(&fd, RAM).expect("ftruncate");
    fd
}

/// A page of the RAM for the `i`th map: spread over it, as buffers are.
fn page(i: u64) -> u64 {
    (i * 97 % (RAM / PAGE)) * PAGE
}

/// Times `n` map (or unmap, if `time_unmap`) calls, the other one untimed.
fn map_unmap(dma: &DmaSpace, fd: &OwnedFd, n: u64, time_unmap: bool) -> Duration {
    let mut spent = Duration::ZERO;
    for i in 0..n {
        let t = Instant::now();
        dma.map_fd(IOVA, PAGE, fd.as_fd(), page(i), true, true)
            .expect("map");
        let mapped = Instant::now();
        dma.unmap(IOVA, PAGE).expect("unmap");
        spent += if time_unmap {
            mapped.elapsed()
        } else {
            mapped - t
        };
    }
    spent
}

fn dma_space(c: &mut Criterion) {
    let fd = ram();
    let dma = DmaSpace::new_local();
    dma.map_fd(0, RAM, fd.as_fd(), 0, true, true).expect("RAM");
    let mut g = c.benchmark_group("dma_space");
    g.bench_function("map 4 KiB", |b| {
        b.iter_custom(|n| map_unmap(&dma, &fd, n, false))
    });
    g.bench_function("unmap 4 KiB", |b| {
        b.iter_custom(|n| map_unmap(&dma, &fd, n, true))
    });
    // A worker reading a shadow doorbell in a loop holds a snapshot of the
    // maps between its reads: each unmap waits until it takes the new one.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (dma, stop) = (dma.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                black_box(dma.load_u32(GuestAddress(0x1000)).ok());
            }
        })
    };
    g.bench_function("map 4 KiB, a worker reading", |b| {
        b.iter_custom(|n| map_unmap(&dma, &fd, n, false))
    });
    g.bench_function("unmap 4 KiB, a worker reading", |b| {
        b.iter_custom(|n| map_unmap(&dma, &fd, n, true))
    });
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("reader");
    g.finish();
}

fn round_trip(c: &mut Criterion) {
    let fd = ram();
    let (client, _shared, _server) = common::pair();
    client
        .dma_map(0, RAM, fd.as_fd(), 0, true)
        .expect("RAM map");
    let mut i = 0;
    c.bench_function("round_trip/DMA_MAP + DMA_UNMAP 4 KiB", |b| {
        b.iter(|| {
            i += 1;
            client
                .dma_map(IOVA, PAGE, fd.as_fd(), page(i), true)
                .expect("map");
            client.dma_unmap(IOVA, PAGE).expect("unmap");
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = dma_space, round_trip
}
criterion_main!(benches);
