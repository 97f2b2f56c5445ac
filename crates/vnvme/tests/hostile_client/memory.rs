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
use std::time::{Duration, Instant};

use rustix::fs::{ftruncate, memfd_create, MemfdFlags};
use vnvme::device::DeviceOptions;
use vnvme_controller::DoorbellMode;
use vnvme_spec::{NvmOpcode, Status};
use vnvme_vfio_user::hugepages::HugePages;

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

/// The 4 KiB at `buf`, read through the device (written to LBA 9, read
/// back into the RAM): hugetlbfs files cannot be read with read(2).
fn lands(g: &mut Guest, buf: u64) -> Vec<u8> {
    let c = g.submit(1, rw(NvmOpcode::WRITE, 9, 1, buf, 0));
    assert_eq!(c.status(), Status::SUCCESS, "write from the file");
    let c = g.submit(1, rw(NvmOpcode::READ, 9, 1, DATA + 0x2000, 0));
    assert_eq!(c.status(), Status::SUCCESS, "read into RAM");
    g.read_mem(DATA + 0x2000, 4096)
}

/// `file` (`len` bytes, at least `offset + EXTRA_SIZE`) is mapped from `offset`
/// beside the guest RAM; I/O lands in it, then the client shrinks it under
/// the map: every command on it fails with a Data Transfer Error until the
/// client maps it again, and the queue serves throughout.
fn truncated_file_under_a_map(file: File, offset: u64, len: u64) {
    let srv = Served::start();
    let mut g = ready(&srv);
    g.client
        .dma_map(EXTRA_IOVA, EXTRA_SIZE, file.as_fd(), offset, true)
        .unwrap();
    let buf = EXTRA_IOVA + 0x1000;
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 13) as u8).collect();
    g.write_mem(DATA, &pattern);
    let c = g.submit(1, rw(NvmOpcode::WRITE, 7, 1, DATA, 0));
    assert_eq!(c.status(), Status::SUCCESS, "write from RAM");
    let c = g.submit(1, rw(NvmOpcode::READ, 7, 1, buf, 0));
    assert_eq!(c.status(), Status::SUCCESS, "read into the file");
    assert_eq!(lands(&mut g, buf), pattern, "the read landed in the file");

    file.set_len(0).unwrap();
    let c = g.submit(1, rw(NvmOpcode::READ, 7, 1, buf, 0));
    assert_eq!(c.status(), dte(), "read into the truncated file");
    let c = g.submit(1, rw(NvmOpcode::WRITE, 8, 1, buf, 0));
    assert_eq!(c.status(), dte(), "write from the truncated file");
    // Growing the file back does not mend the map: broken until unmapped.
    file.set_len(len).unwrap();
    let c = g.submit(1, rw(NvmOpcode::READ, 7, 1, buf, 0));
    assert_eq!(c.status(), dte(), "read into the grown-back file");
    // The queue still serves, and so does the file once mapped again.
    g.assert_serving();
    g.client.dma_unmap(EXTRA_IOVA, EXTRA_SIZE).unwrap();
    g.client
        .dma_map(EXTRA_IOVA, EXTRA_SIZE, file.as_fd(), offset, true)
        .unwrap();
    let c = g.submit(1, rw(NvmOpcode::READ, 7, 1, buf, 0));
    assert_eq!(
        c.status(),
        Status::SUCCESS,
        "read into the file mapped again"
    );
    assert_eq!(
        lands(&mut g, buf),
        pattern,
        "the read landed in the file mapped again"
    );
    g.finish(&srv);
}

#[test]
fn truncated_regular_file_dma_map_fails_io_with_data_transfer_error_until_remapped() {
    // A regular file as QEMU's `memory-backend-file,share=on` passes it.
    truncated_file_under_a_map(File::from(fds::shm_file(EXTRA_SIZE)), 0, EXTRA_SIZE);
}

/// The same on hugetlbfs, mapped from an offset inside a huge page as QEMU
/// maps the RAM above the VGA hole.
#[test]
fn truncated_hugetlbfs_dma_map_fails_io_with_data_transfer_error_until_remapped() {
    let _pages = match HugePages::reserve(2, 2048) {
        Ok(p) => p,
        Err(why) if !rustix::process::geteuid().is_root() => {
            return eprintln!("not run: {why}");
        }
        Err(why) => panic!("cannot reserve huge pages: {why}"),
    };
    let fd = memfd_create(
        "vnvme-huge",
        MemfdFlags::CLOEXEC | MemfdFlags::HUGETLB | MemfdFlags::HUGE_2MB,
    )
    .unwrap();
    ftruncate(&fd, 4 << 20).unwrap();
    truncated_file_under_a_map(File::from(fd), 0xC_0000, 4 << 20);
}
