//! Interrupt fds: only eventfds are taken (anything else is EINVAL), and
//! they are made non-blocking, so no fd a client passes can block a worker
//! or the control thread. An eventfd at its maximum is signalled already.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use vnvme_spec::{NvmOpcode, Status};
use vnvme_vfio_user::irq;
use vnvme_vfio_user::wire::*;

use crate::guest::*;
use crate::peer::{fds, Peer};

const TRIGGER_EVENTFD: u32 = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;

/// SET_IRQS for MSI-X vector 0 and for INTx with `fd`: both EINVAL; then
/// the server still serves.
fn refused_as_interrupt_fd(fd: BorrowedFd<'_>) {
    let srv = Served::start();
    let (mut p, _) = Peer::negotiated(&srv.path);
    p.set_irqs(1, irq::MSIX, TRIGGER_EVENTFD, 0, 1, &[fd]);
    p.expect_errno(1, libc::EINVAL);
    p.set_irqs(2, irq::INTX, TRIGGER_EVENTFD, 0, 1, &[fd]);
    p.expect_errno(2, libc::EINVAL);
    // A real eventfd beside it is still fine.
    let e = fds::eventfd(0);
    p.set_irqs(3, irq::MSIX, TRIGGER_EVENTFD, 0, 1, &[e.as_fd()]);
    p.expect_ok(3);
    drop(p);
    srv.assert_serves_a_new_client();
}

#[test]
fn the_write_end_of_a_pipe_nobody_reads_is_refused_as_interrupt_fd() {
    let (_r, w) = fds::pipe();
    refused_as_interrupt_fd(w.as_fd());
}

#[test]
fn the_read_end_of_a_pipe_is_refused_as_interrupt_fd() {
    let (r, _w) = fds::pipe();
    refused_as_interrupt_fd(r.as_fd());
}

#[test]
fn a_socket_with_a_full_buffer_is_refused_as_interrupt_fd() {
    let (full, _peer) = fds::full_socket();
    refused_as_interrupt_fd(full.as_fd());
}

#[test]
fn a_memfd_is_refused_as_interrupt_fd() {
    refused_as_interrupt_fd(fds::memfd(4096).as_fd());
}

#[test]
fn a_regular_file_and_dev_null_are_refused_as_interrupt_fds() {
    refused_as_interrupt_fd(fds::shm_file(4096).as_fd());
    refused_as_interrupt_fd(fds::dev_null().as_fd());
}

fn read_eventfd(fd: &OwnedFd) -> Option<u64> {
    let mut b = [0u8; 8];
    match rustix::io::read(fd, &mut b) {
        Ok(8) => Some(u64::from_ne_bytes(b)),
        _ => None,
    }
}

/// An eventfd preloaded to 2^64 - 2 (where one more write would block):
/// completions still come, nothing waits, and once the client drains it
/// interrupts arrive again.
#[test]
fn an_eventfd_preloaded_to_its_maximum_does_not_block_the_worker() {
    let srv = Served::start();
    let mut g = ready(&srv);
    let full = fds::eventfd(0xffff_ffff_ffff_fffe);
    g.client
        .set_irqs_eventfds(irq::MSIX, 1, &[full.as_fd()])
        .expect("an eventfd is accepted");
    for i in 0..8u64 {
        let c = g.submit(1, rw(NvmOpcode::READ, i, 1, DATA, 0));
        assert_eq!(c.status(), Status::SUCCESS);
    }
    // Still saturated, never wrapped: the server's writes were EAGAIN.
    assert_eq!(read_eventfd(&full), Some(0xffff_ffff_ffff_fffe));
    // Drained: the next completion signals it.
    let c = g.submit(1, rw(NvmOpcode::READ, 0, 1, DATA, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while read_eventfd(&full).is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "no interrupt after the drain"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    g.finish(&srv);
}
