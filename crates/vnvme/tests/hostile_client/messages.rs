//! Messages with hostile sizes, JSON, ranges and fds: each gets its errno
//! (or a clean close where the stream cannot continue), and a good client
//! then attaches and runs Identify and I/O.

use std::os::fd::AsFd;
use std::time::Duration;

use vnvme_vfio_user::wire::*;
use vnvme_vfio_user::MAX_MSG_FDS;
use zerocopy::IntoBytes;

use crate::guest::*;
use crate::peer::{fds, version_payload, Peer};

#[test]
fn a_message_length_of_4_gib_is_e2big_and_the_connection_closes() {
    let srv = Served::start();
    let (mut p, _) = Peer::negotiated(&srv.path);
    let h = Header {
        msg_id: 7,
        command: cmd::REGION_WRITE,
        msg_size: u32::MAX,
        flags: flags::TYPE_COMMAND,
        error: 0,
    };
    p.send_bytes(h.as_bytes(), &[]);
    p.expect_errno(7, libc::E2BIG);
    p.expect_eof_within(Duration::from_secs(5));
    drop(p);
    srv.assert_serves_a_new_client();
}

#[test]
fn version_with_a_megabyte_of_json_is_answered_and_the_server_lives() {
    let srv = Served::start();
    let mut p = Peer::connect(&srv.path);
    // Valid JSON with an unknown megabyte-long field: accepted (unknown
    // fields are ignored), without trouble.
    let mut json = br#"{"capabilities":{"max_msg_fds":16},"padding":""#.to_vec();
    json.extend(std::iter::repeat_n(b'x', 1 << 20));
    json.extend_from_slice(br#""}"#);
    p.send(0, cmd::VERSION, &version_payload(&json), &[]);
    p.expect_ok(0);
    drop(p);
    srv.assert_serves_a_new_client();
}

#[test]
fn version_with_deeply_nested_json_is_einval() {
    let srv = Served::start();
    let mut p = Peer::connect(&srv.path);
    let mut json = vec![b'['; 100_000];
    json.extend(vec![b']'; 100_000]);
    p.send(0, cmd::VERSION, &version_payload(&json), &[]);
    p.expect_errno(0, libc::EINVAL);
    drop(p);
    srv.assert_serves_a_new_client();
}

#[test]
fn version_with_wrongly_typed_capabilities_is_einval() {
    let srv = Served::start();
    let mut p = Peer::connect(&srv.path);
    for (id, json) in [
        br#"{"capabilities":{"max_msg_fds":"16"}}"#.as_slice(),
        br#"{"capabilities":{"max_data_xfer_size":-1}}"#,
        br#"{"capabilities":[]}"#,
        br#"{"capabilities":{"migration":7}}"#,
        b"\xff\xfe",
    ]
    .into_iter()
    .enumerate()
    {
        p.send(id as u16, cmd::VERSION, &version_payload(json), &[]);
        p.expect_errno(id as u16, libc::EINVAL);
    }
    drop(p);
    srv.assert_serves_a_new_client();
}

#[test]
fn more_fds_than_max_msg_fds_is_einval() {
    let srv = Served::start();
    let (mut p, caps) = Peer::negotiated(&srv.path);
    assert_eq!(caps["capabilities"]["max_msg_fds"], MAX_MSG_FDS);
    let many: Vec<_> = (0..MAX_MSG_FDS + 8).map(|_| fds::eventfd(0)).collect();
    let borrowed: Vec<_> = many.iter().map(|f| f.as_fd()).collect();
    p.set_irqs(
        1,
        vnvme_vfio_user::irq::MSIX,
        VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
        0,
        borrowed.len() as u32,
        &borrowed,
    );
    p.expect_errno(1, libc::EINVAL);
    drop(p);
    srv.assert_serves_a_new_client();
}

#[test]
fn dma_map_overlapping_an_existing_map_is_eexist() {
    let srv = Served::start();
    let (mut p, _) = Peer::negotiated(&srv.path);
    let mem = fds::memfd(0x10000);
    p.dma_map(1, 0x100000, 0x4000, 0, Some(mem.as_fd()));
    p.expect_ok(1);
    for (id, iova, size) in [
        (2, 0x100000, 0x4000),
        (3, 0xff000, 0x2000),
        (4, 0x103000, 0x1000),
        (5, 0xf0000, 0x20000),
    ] {
        p.dma_map(id, iova, size, 0, Some(mem.as_fd()));
        p.expect_errno(id, libc::EEXIST);
    }
    drop(p);
    srv.assert_serves_a_new_client();
}

/// DMA_UNMAP as the kernel's VFIO answers it (QEMU, written for the kernel,
/// relies on it behind a vIOMMU): the maps inside the range go, a range
/// that would cut a map is EINVAL and removes nothing, an empty range is no
/// error.
#[test]
fn dma_unmap_removes_the_maps_in_its_range_and_refuses_to_split_one() {
    let srv = Served::start();
    let (mut p, _) = Peer::negotiated(&srv.path);
    let mem = fds::memfd(0x10000);
    p.dma_map(1, 0x100000, 0x2000, 0, Some(mem.as_fd()));
    p.expect_ok(1);
    p.dma_map(2, 0x102000, 0x2000, 0x2000, Some(mem.as_fd()));
    p.expect_ok(2);
    // Half of one map, and across the end of the second: refused.
    p.dma_unmap(3, 0x101000, 0x2000, None);
    p.expect_errno(3, libc::EINVAL);
    p.dma_unmap(4, 0x103000, 0x2000, None);
    p.expect_errno(4, libc::EINVAL);
    // Nothing there: no error.
    p.dma_unmap(5, 0x900000, 0x1000, None);
    p.expect_ok(5);
    // Both maps at once: both go, so the range maps again.
    p.dma_unmap(6, 0x100000, 0x4000, None);
    p.expect_ok(6);
    p.dma_map(7, 0x100000, 0x4000, 0, Some(mem.as_fd()));
    p.expect_ok(7);
    drop(p);
    srv.assert_serves_a_new_client();
}

#[test]
fn dma_unmap_carrying_an_fd_is_accepted_as_spdk_sends_it() {
    let srv = Served::start();
    let (mut p, _) = Peer::negotiated(&srv.path);
    let mem = fds::memfd(0x10000);
    p.dma_map(1, 0x100000, 0x10000, 0, Some(mem.as_fd()));
    p.expect_ok(1);
    p.dma_unmap(2, 0x100000, 0x10000, Some(mem.as_fd()));
    p.expect_ok(2);
    // The map is gone: mapping the range again works.
    p.dma_map(3, 0x100000, 0x10000, 0, Some(mem.as_fd()));
    p.expect_ok(3);
    drop(p);
    srv.assert_serves_a_new_client();
}

#[test]
fn fds_on_messages_that_take_none_are_einval() {
    let srv = Served::start();
    let (mut p, _) = Peer::negotiated(&srv.path);
    let e = fds::eventfd(0);
    p.send(1, cmd::DEVICE_GET_INFO, &16u32.to_le_bytes(), &[e.as_fd()]);
    p.expect_errno(1, libc::EINVAL);
    let mut ra = RegionAccess {
        offset: 0,
        region: 0,
        count: 4,
    }
    .as_bytes()
    .to_vec();
    ra.extend_from_slice(&[0; 4]);
    p.send(2, cmd::REGION_WRITE, &ra, &[e.as_fd()]);
    p.expect_errno(2, libc::EINVAL);
    drop(p);
    srv.assert_serves_a_new_client();
}

#[test]
fn region_read_and_write_out_of_bounds_are_einval_or_e2big() {
    let srv = Served::start();
    let (mut p, _) = Peer::negotiated(&srv.path);
    // BAR0 is 16 KiB; config space 4 KiB.
    p.region_access(1, cmd::REGION_READ, 0, 0x4000, 4, &[]);
    p.expect_errno(1, libc::EINVAL);
    p.region_access(2, cmd::REGION_READ, 0, u64::MAX - 1, 4, &[]);
    p.expect_errno(2, libc::EINVAL);
    p.region_access(3, cmd::REGION_READ, 7, 0xffe, 4, &[]);
    p.expect_errno(3, libc::EINVAL);
    p.region_access(4, cmd::REGION_READ, 0, 0, u32::MAX, &[]);
    p.expect_errno(4, libc::E2BIG);
    p.region_access(5, cmd::REGION_WRITE, 0, 0x3ffe, 4, &[0; 4]);
    p.expect_errno(5, libc::EINVAL);
    // A count that does not match the data sent.
    p.region_access(6, cmd::REGION_WRITE, 0, 0x14, 8, &[0; 4]);
    p.expect_errno(6, libc::EINVAL);
    p.region_access(7, cmd::REGION_READ, 99, 0, 4, &[]);
    p.expect_errno(7, libc::EINVAL);
    drop(p);
    srv.assert_serves_a_new_client();
}

#[test]
fn set_irqs_with_start_plus_count_overflowing_is_einval() {
    let srv = Served::start();
    let (mut p, _) = Peer::negotiated(&srv.path);
    let action = VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER;
    p.set_irqs(1, vnvme_vfio_user::irq::MSIX, action, u32::MAX, 2, &[]);
    p.expect_errno(1, libc::EINVAL);
    p.set_irqs(2, vnvme_vfio_user::irq::MSIX, action, 1, u32::MAX, &[]);
    p.expect_errno(2, libc::EINVAL);
    p.set_irqs(
        3,
        vnvme_vfio_user::irq::MSIX,
        VFIO_IRQ_SET_DATA_BOOL | VFIO_IRQ_SET_ACTION_TRIGGER,
        0,
        4000,
        &[],
    );
    p.expect_errno(3, libc::EINVAL);
    p.set_irqs(4, 77, action, 0, 1, &[]);
    p.expect_errno(4, libc::EINVAL);
    drop(p);
    srv.assert_serves_a_new_client();
}

/// The client maps guest RAM without an fd (as QEMU does for ROM), so the
/// controller reaches it with DMA_READ; the client hangs up instead of
/// answering. The worker's wait ends with the connection, the server
/// serves the next client.
#[test]
fn a_client_that_disconnects_in_the_middle_of_a_dma_read_exchange() {
    let srv = Served::start();
    let (mut p, _) = Peer::negotiated(&srv.path);
    // Admin queues in memory without an fd.
    p.dma_map(1, RAM_IOVA, 0x10000, 0, None);
    p.expect_ok(1);
    let regs: [(u64, u64); 3] = [
        (0x24, u64::from(ADMIN_ENTRIES - 1) * 0x1_0001),
        (0x28, ASQ),
        (0x30, ACQ),
    ];
    for (i, (off, v)) in regs.iter().enumerate() {
        let bytes = v.to_le_bytes();
        let len = if *off == 0x24 { 4 } else { 8 };
        p.region_access(
            10 + i as u16,
            cmd::REGION_WRITE,
            0,
            *off,
            len,
            &bytes[..len as usize],
        );
        p.expect_ok(10 + i as u16);
    }
    p.region_access(
        20,
        cmd::REGION_WRITE,
        0,
        0x14,
        4,
        &0x0046_0001u32.to_le_bytes(),
    );
    p.expect_ok(20);
    // Ring the admin SQ doorbell: the worker fetches the SQE with DMA_READ.
    p.region_access(21, cmd::REGION_WRITE, 0, 0x1000, 4, &1u32.to_le_bytes());
    // Read until the server's DMA_READ request arrives, then vanish.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no DMA_READ from the server"
        );
        let (h, _) = p.recv();
        if !h.is_reply() && h.command == cmd::DMA_READ {
            break;
        }
    }
    drop(p);
    srv.assert_serves_a_new_client();
}
