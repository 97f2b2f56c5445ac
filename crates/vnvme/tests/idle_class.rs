//! An I/O worker with a core to itself keeps the usual scheduling class; one
//! that has to fight for a core moves to the idle class, but a host whose
//! cores all stay busy with other threads does not starve it: the worker
//! goes back to the usual class for a cool-down, and the I/O goes on.
//!
//! A test binary of its own: the latency it prints is measured under the
//! load it makes itself, not beside the driver tests that run in parallel
//! in that binary (among them it measured 400 ms once).

// The driver tests' rig and the pattern it re-exports: this binary uses a
// part of them.
#[allow(dead_code)]
#[path = "common/pattern.rs"]
mod pattern;
#[allow(dead_code, unused_imports)]
#[path = "driver/rig.rs"]
mod rig;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vnvme_controller::DoorbellMode;
use vnvme_driver::{InitOptions, IoQueue};
use vnvme_spec::NvmOpcode;

use crate::rig::{device, eventually, start, Rig};

const SCHED_OTHER: u32 = 0;
const SCHED_IDLE: u32 = 5;

/// The scheduling policy of this process's thread named `name` (the 41st
/// field of its `stat`).
fn policy_of(name: &str) -> Option<u32> {
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = task.ok()?.path();
        if std::fs::read_to_string(dir.join("comm")).ok()?.trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
        // The name in parentheses may hold spaces; the state (field 3)
        // follows the last ')'.
        let rest = stat.get(stat.rfind(')')? + 2..)?;
        return rest.split_whitespace().nth(41 - 3)?.parse().ok();
    }
    None
}

fn read_one(rig: &Rig, q: &mut IoQueue) {
    let buf = rig.access.dma_alloc(4096).unwrap();
    q.enqueue_rw(NvmOpcode::READ, 1, 0, 1, &buf).unwrap();
    q.ring().unwrap();
    let mut done = Vec::new();
    while done.is_empty() {
        q.wait(&mut done, 1, Duration::from_secs(30)).unwrap();
    }
}

#[test]
fn a_worker_among_threads_that_never_sleep_still_does_io() {
    let rig = start(
        device(DoorbellMode::Adaptive),
        &["16M:ram"],
        InitOptions::default(),
    );
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    read_one(&rig, &mut q);
    assert_eq!(policy_of("vnvme-io1"), Some(SCHED_OTHER));

    // Two spinning threads a core, in the usual class, for 3 s.
    let stop = Arc::new(AtomicBool::new(false));
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let spinners: Vec<_> = (0..2 * cores)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let start = Instant::now();
    let (mut reads, mut slowest, mut idle) = (0, Duration::ZERO, false);
    while start.elapsed() < Duration::from_secs(3) {
        let t = Instant::now();
        read_one(&rig, &mut q);
        slowest = slowest.max(t.elapsed());
        reads += 1;
        idle |= policy_of("vnvme-io1") == Some(SCHED_IDLE);
    }
    stop.store(true, Ordering::Relaxed);
    for s in spinners {
        s.join().unwrap();
    }
    // Starved in the idle class, a worker would get a sliver of a core
    // (SCHED_IDLE's weight is 3 against 1024): reads took up to a second
    // before the watchdog, 60-110 ms with it, 12 ms in the usual class.
    // How long depends on the host's load, so it is printed, not bounded
    // (a bound of 400 ms failed on a machine busy with other builds); the
    // watchdog's rule itself is tested exactly in the controller
    // (`a_runnable_idle_class_worker_without_rounds_is_moved_back_by_the_watchdog`).
    // What is asserted: every read completed (read_one fails after 30 s).
    eprintln!("{reads} reads in 3 s, the slowest {slowest:?} (seen in the idle class: {idle})");
    // With the cores free again, the worker ends in the usual class.
    eventually("the worker back in the usual class", || {
        read_one(&rig, &mut q);
        policy_of("vnvme-io1") == Some(SCHED_OTHER)
    });
}
