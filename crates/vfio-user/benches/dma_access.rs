//! Nanoseconds per guest-memory access through [`DmaSpace`], on one thread
//! and on two at once (the controller's workers and its trap path share one
//! space): a 4-byte `load_u32` (a shadow doorbell read, where translation
//! dominates) and a 4 KiB `read` (a data copy, where the copy does).
//!
//! `cargo bench -p vnvme-vfio-user --bench dma_access`. A program, not a
//! test: it prints figures and asserts nothing.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use vnvme_vfio_user::{DmaSpace, GuestAddress, GuestMemory};

const IOVA: u64 = 0x1000_0000;
const SIZE: u64 = 1 << 20;
/// Runs per figure; the fastest is reported (the others lost the core).
const RUNS: usize = 7;

type Access = fn(&DmaSpace, u64, &mut [u8]);

fn main() {
    let dma = DmaSpace::new_local();
    dma.map_anonymous(IOVA, SIZE).expect("an anonymous map");
    let accesses: [(&str, Access, u64); 2] = [
        (
            "load_u32",
            |d, i, _| {
                black_box(d.load_u32(GuestAddress(IOVA + (i % 4096) * 4)).ok());
            },
            2_000_000,
        ),
        (
            "read 4 KiB",
            |d, i, buf| {
                black_box(d.read(GuestAddress(IOVA + (i % 256) * 4096), buf).ok());
            },
            200_000,
        ),
    ];
    for threads in [1, 2] {
        for (name, access, iters) in accesses {
            let best = (0..RUNS)
                .map(|_| run(&dma, threads, iters, access))
                .min()
                .unwrap_or_default();
            let ns = best.as_nanos() as f64 / iters as f64;
            println!("{name:>10}, {threads} thread(s): {ns:8.1} ns/op");
        }
    }
}

/// `iters` accesses on each of `threads` threads started together; the
/// slowest thread's time.
fn run(dma: &DmaSpace, threads: usize, iters: u64, access: Access) -> Duration {
    let start = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut buf = vec![0u8; 4096];
                    start.wait();
                    let t = Instant::now();
                    for i in 0..iters {
                        access(dma, i, &mut buf);
                    }
                    t.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().ok())
            .max()
            .unwrap_or_default()
    })
}
