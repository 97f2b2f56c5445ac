//! A client that shrinks the shared memory behind its DMA maps (ftruncate of
//! the memfd or file it passed with DMA_MAP): the server's next access to it
//! faults (SIGBUS), which must fail what used that memory and nothing else.
//!
//! The client side of these tests maps the same guest RAM, in the same
//! process: once the RAM is truncated the test must not touch its own
//! mapping (that fault would be the test's, and fatal) until it grows the
//! file back.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use rustix::fs::ftruncate;
use vnvme::device::DeviceOptions;
use vnvme_controller::DoorbellMode;
use vnvme_spec::{NvmOpcode, Status};

use crate::guest::*;
use crate::peer::fds;

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The guest RAM memfd shrinks to nothing under queued I/O, then the
/// doorbell rings. The server faults on the SQ (or, with shadow doorbells,
/// on the shadow buffer), fails that, lives, and serves the next client.
fn truncated_guest_ram(mode: DoorbellMode) {
    let srv = Served::with_options(
        DeviceOptions {
            doorbells: mode,
            ..Default::default()
        },
        "16M:ram",
    );
    let mut g = ready(&srv);
    if matches!(mode, DoorbellMode::Shadow | DoorbellMode::Adaptive) {
        // The shadow doorbells live in the RAM too: the server reads them
        // from the truncated file before any SQ entry.
        assert_eq!(g.configure_dbbuf(), Status::SUCCESS, "doorbell buffers");
    }
    g.assert_serving();
    let before = srv.ctrl.stats();
    g.stage(1, rw(NvmOpcode::WRITE, 0, 1, DATA, 0));
    let tail = g.stage(1, rw(NvmOpcode::READ, 0, 1, DATA + 0x1000, 0));

    if g.shadow.is_some() {
        g.write_mem(SHADOW + 8, &u32::from(tail).to_le_bytes());
    }
    ftruncate(g.ram.fd(), 0).unwrap();
    g.w32(0x1000 + 8, u32::from(tail));

    wait_until("the server to fail on the truncated RAM", || {
        let now = srv.ctrl.stats();
        now.fatal_errors > before.fatal_errors || now.shadow_errors > before.shadow_errors
    });
    // The server lives: it still answers registers on this connection.
    let _ = g.csts();
    // The client grows the file back. What the server wrote after the fault
    // went to its private zero pages, so the CQ shows nothing new; if it
    // did, it must not be a success.
    ftruncate(g.ram.fd(), RAM_SIZE as u64).unwrap();
    while let Some(c) = g.reap_within(1, Duration::from_millis(100)) {
        assert_ne!(c.status(), Status::SUCCESS, "a command on truncated RAM");
    }
    drop(g);
    srv.assert_serves_a_new_client();
}

#[test]
fn truncated_guest_ram_memfd_in_trap_mode_fails_commands_and_the_server_lives() {
    truncated_guest_ram(DoorbellMode::Trap);
}

#[test]
fn truncated_guest_ram_memfd_in_shadow_mode_fails_commands_and_the_server_lives() {
    truncated_guest_ram(DoorbellMode::Shadow);
}

#[test]
fn truncated_guest_ram_memfd_in_adaptive_mode_fails_commands_and_the_server_lives() {
    truncated_guest_ram(DoorbellMode::Adaptive);
}

#[test]
fn truncated_guest_ram_memfd_in_mmap_poll_mode_fails_commands_and_the_server_lives() {
    truncated_guest_ram(DoorbellMode::MmapPoll);
}

const EXTRA_IOVA: u64 = 0x2_0000_0000;
const EXTRA_SIZE: u64 = 1 << 20;

#[test]
fn truncated_regular_file_dma_map_fails_io_with_data_transfer_error_until_remapped() {
    let srv = Served::start();
    let mut g = ready(&srv);
    // A regular file as QEMU's `memory-backend-file,share=on` passes it.
    let file = File::from(fds::shm_file(EXTRA_SIZE));
    g.client
        .dma_map(EXTRA_IOVA, EXTRA_SIZE, file.as_fd(), 0, true)
        .unwrap();
    let buf = EXTRA_IOVA + 0x1000;
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 13) as u8).collect();
    g.write_mem(DATA, &pattern);
    let c = g.submit(1, rw(NvmOpcode::WRITE, 7, 1, DATA, 0));
    assert_eq!(c.status(), Status::SUCCESS, "write from RAM");
    let c = g.submit(1, rw(NvmOpcode::READ, 7, 1, buf, 0));
    assert_eq!(c.status(), Status::SUCCESS, "read into the file");
    let mut got = vec![0u8; 4096];
    file.read_exact_at(&mut got, 0x1000).unwrap();
    assert_eq!(got, pattern, "the read landed in the file");

    file.set_len(0).unwrap();
    let c = g.submit(1, rw(NvmOpcode::READ, 7, 1, buf, 0));
    assert_eq!(c.status(), dte(), "read into the truncated file");
    let c = g.submit(1, rw(NvmOpcode::WRITE, 8, 1, buf, 0));
    assert_eq!(c.status(), dte(), "write from the truncated file");
    // Growing the file back does not mend the map: broken until unmapped.
    file.set_len(EXTRA_SIZE).unwrap();
    let c = g.submit(1, rw(NvmOpcode::READ, 7, 1, buf, 0));
    assert_eq!(c.status(), dte(), "read into the grown-back file");
    // The queue still serves, and so does the file once mapped again.
    g.assert_serving();
    g.client.dma_unmap(EXTRA_IOVA, EXTRA_SIZE).unwrap();
    g.client
        .dma_map(EXTRA_IOVA, EXTRA_SIZE, file.as_fd(), 0, true)
        .unwrap();
    let c = g.submit(1, rw(NvmOpcode::READ, 7, 1, buf, 0));
    assert_eq!(
        c.status(),
        Status::SUCCESS,
        "read into the file mapped again"
    );
    file.read_exact_at(&mut got, 0x1000).unwrap();
    assert_eq!(got, pattern, "the read landed in the file mapped again");
    g.finish(&srv);
}
