//! Protocol abuse over a raw socket: every case gets an error reply (or a
//! clean close), and `serve_listener` then serves a new client.

mod common;

use std::io::{Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use vnvme_vfio_user::wire::*;
use zerocopy::IntoBytes;

fn send(s: &UnixStream, id: u16, command: u16, payload: &[u8], fds: &[BorrowedFd<'_>]) {
    let header = Header {
        msg_id: id,
        command,
        msg_size: (HEADER_SIZE + payload.len()) as u32,
        flags: flags::TYPE_COMMAND,
        error: 0,
    };
    let mut bytes = header.as_bytes().to_vec();
    bytes.extend_from_slice(payload);
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(32))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    }
    let n = rustix::net::sendmsg(
        s,
        &[std::io::IoSlice::new(&bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .unwrap();
    assert_eq!(n, bytes.len());
}

fn recv(s: &mut UnixStream) -> (Header, Vec<u8>) {
    let mut h = [0u8; HEADER_SIZE];
    s.read_exact(&mut h).unwrap();
    let header = read_prefix::<Header>(&h).unwrap();
    let mut payload = vec![0u8; header.msg_size as usize - HEADER_SIZE];
    s.read_exact(&mut payload).unwrap();
    (header, payload)
}

fn expect_errno(s: &mut UnixStream, id: u16, errno: i32) {
    let (h, payload) = recv(s);
    assert_eq!(h.msg_id, id);
    assert!(
        h.is_reply() && h.is_error(),
        "expected an error reply, got {h:?}"
    );
    assert_eq!(h.error as i32, errno, "errno for message {id}");
    assert!(payload.is_empty());
}

fn expect_ok(s: &mut UnixStream, id: u16) -> Vec<u8> {
    let (h, payload) = recv(s);
    assert_eq!(h.msg_id, id);
    assert!(h.is_reply() && !h.is_error(), "expected success, got {h:?}");
    payload
}

fn expect_eof(s: &mut UnixStream) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(
        s.read(&mut b).unwrap(),
        0,
        "server should close the connection"
    );
}

fn negotiate(s: &mut UnixStream) {
    let mut p = Version { major: 0, minor: 0 }.as_bytes().to_vec();
    p.extend_from_slice(b"{\"capabilities\":{\"max_msg_fds\":16}}\0");
    send(s, 1000, cmd::VERSION, &p, &[]);
    let reply = expect_ok(s, 1000);
    assert!(reply.len() > 4 && reply.ends_with(&[0]));
}

fn get_info(s: &mut UnixStream, id: u16) {
    send(s, id, cmd::DEVICE_GET_INFO, 16u32.as_bytes(), &[]);
    let p = expect_ok(s, id);
    assert_eq!(read_prefix::<DeviceInfoWire>(&p).unwrap().num_irqs, 5);
}

#[test]
fn short_header_closes_cleanly() {
    let server = ListeningServer::start("short-header");
    let mut s = server.raw();
    s.write_all(&[1, 0, 1, 0, 0x20, 0, 0]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    expect_eof(&mut s);
    server.assert_serves_new_client();
}

#[test]
fn size_smaller_than_header_closes() {
    let server = ListeningServer::start("tiny-size");
    let mut s = server.raw();
    negotiate(&mut s);
    let h = Header {
        msg_id: 1,
        command: cmd::DEVICE_GET_INFO,
        msg_size: 8,
        flags: 0,
        error: 0,
    };
    s.write_all(h.as_bytes()).unwrap();
    expect_eof(&mut s);
    server.assert_serves_new_client();
}

#[test]
fn declared_size_beyond_limit_is_e2big_then_close() {
    let server = ListeningServer::start("oversize");
    let mut s = server.raw();
    negotiate(&mut s);
    let h = Header {
        msg_id: 7,
        command: cmd::REGION_WRITE,
        msg_size: 64 << 20,
        flags: 0,
        error: 0,
    };
    s.write_all(h.as_bytes()).unwrap();
    expect_errno(&mut s, 7, libc::E2BIG);
    expect_eof(&mut s);
    // The socket is shut down first, then the device detached.
    let detached = (0..500).any(|_| {
        std::thread::sleep(Duration::from_millis(10));
        server
            .shared
            .detaches
            .load(std::sync::atomic::Ordering::SeqCst)
            == 1
    });
    assert!(detached);
    server.assert_serves_new_client();
}

#[test]
fn commands_before_version_and_bad_version_are_einval() {
    let server = ListeningServer::start("version");
    let mut s = server.raw();
    send(&s, 1, cmd::DEVICE_GET_INFO, 16u32.as_bytes(), &[]);
    expect_errno(&mut s, 1, libc::EINVAL);
    // JSON without its NUL, malformed JSON, wrong types.
    for (id, json) in [
        (2u16, &b"{}"[..]),
        (3, b"{\"capabilities\":\0"),
        (4, b"{\"capabilities\":{\"pgsizes\":\"4k\"}}\0"),
    ] {
        let mut p = Version::default().as_bytes().to_vec();
        p.extend_from_slice(json);
        send(&s, id, cmd::VERSION, &p, &[]);
        expect_errno(&mut s, id, libc::EINVAL);
    }
    send(&s, 5, cmd::VERSION, &[0, 0], &[]);
    expect_errno(&mut s, 5, libc::EINVAL);
    negotiate(&mut s);
    // A second VERSION is refused.
    send(&s, 6, cmd::VERSION, Version::default().as_bytes(), &[]);
    expect_errno(&mut s, 6, libc::EINVAL);
    get_info(&mut s, 8);
    drop(s);
    server.assert_serves_new_client();
}

#[test]
fn wrong_argsz_is_einval() {
    let server = ListeningServer::start("argsz");
    let mut s = server.raw();
    negotiate(&mut s);
    send(&s, 1, cmd::DEVICE_GET_INFO, 4u32.as_bytes(), &[]);
    expect_errno(&mut s, 1, libc::EINVAL);
    let map = DmaMap {
        argsz: 8,
        flags: 3,
        offset: 0,
        address: 0x1000,
        size: 0x1000,
    };
    send(&s, 2, cmd::DMA_MAP, map.as_bytes(), &[]);
    expect_errno(&mut s, 2, libc::EINVAL);
    let ri = RegionInfoWire {
        argsz: 16,
        index: 0,
        ..Default::default()
    };
    send(&s, 3, cmd::DEVICE_GET_REGION_INFO, ri.as_bytes(), &[]);
    expect_errno(&mut s, 3, libc::EINVAL);
    let set = IrqSet {
        argsz: 4,
        flags: VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
        index: 2,
        start: 0,
        count: 0,
    };
    send(&s, 4, cmd::DEVICE_SET_IRQS, set.as_bytes(), &[]);
    expect_errno(&mut s, 4, libc::EINVAL);
    // Truncated payloads too.
    send(&s, 5, cmd::DMA_UNMAP, &[24, 0, 0], &[]);
    expect_errno(&mut s, 5, libc::EINVAL);
    get_info(&mut s, 6);
    drop(s);
    server.assert_serves_new_client();
}

#[test]
fn region_info_with_small_argsz_reports_needed_size() {
    let server = ListeningServer::start("region-argsz");
    let mut s = server.raw();
    negotiate(&mut s);
    let ri = RegionInfoWire {
        argsz: 32,
        index: 0,
        ..Default::default()
    };
    send(&s, 1, cmd::DEVICE_GET_REGION_INFO, ri.as_bytes(), &[]);
    let p = expect_ok(&mut s, 1);
    let w = read_prefix::<RegionInfoWire>(&p).unwrap();
    assert_eq!(p.len(), 32);
    assert_eq!(w.argsz, 32 + 16 + 16);
    assert_eq!(w.cap_offset, 0);
    // No CAPS flag for capabilities left out: QEMU refuses CAPS with a
    // cap_offset outside the reply.
    assert_eq!(w.flags & VFIO_REGION_INFO_FLAG_CAPS, 0);
    assert_ne!(w.flags & VFIO_REGION_INFO_FLAG_MMAP, 0);
}

#[test]
fn unknown_command_is_enosys_and_stream_stays_in_sync() {
    let server = ListeningServer::start("unknown");
    let mut s = server.raw();
    negotiate(&mut s);
    send(&s, 1, 99, &[0xa5; 100], &[]);
    expect_errno(&mut s, 1, libc::ENOSYS);
    send(&s, 2, cmd::DEVICE_GET_REGION_IO_FDS, &[0; 16], &[]);
    expect_errno(&mut s, 2, libc::ENOTSUP);
    // A reply nobody waits for is dropped; an unknown message type is refused.
    let stray = Header {
        msg_id: 3,
        command: cmd::DMA_READ,
        msg_size: 16,
        flags: flags::TYPE_REPLY,
        error: 0,
    };
    s.write_all(stray.as_bytes()).unwrap();
    let odd = Header {
        msg_id: 4,
        command: cmd::DEVICE_GET_INFO,
        msg_size: 20,
        flags: 5,
        error: 0,
    };
    s.write_all(odd.as_bytes()).unwrap();
    s.write_all(&16u32.to_le_bytes()).unwrap();
    expect_errno(&mut s, 4, libc::EINVAL);
    get_info(&mut s, 5);
    drop(s);
    server.assert_serves_new_client();
}

#[test]
fn fd_count_that_does_not_match_the_command_is_einval() {
    let server = ListeningServer::start("fds");
    let mut s = server.raw();
    negotiate(&mut s);
    let memfd = rustix::fs::memfd_create("g", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&memfd, 0x1000).unwrap();
    let fd = memfd.as_fd();
    send(&s, 1, cmd::DEVICE_GET_INFO, 16u32.as_bytes(), &[fd]);
    expect_errno(&mut s, 1, libc::EINVAL);
    let map = DmaMap {
        argsz: 32,
        flags: 3,
        offset: 0,
        address: 0x1000,
        size: 0x1000,
    };
    send(&s, 2, cmd::DMA_MAP, map.as_bytes(), &[fd, fd]);
    expect_errno(&mut s, 2, libc::EINVAL);
    let set = IrqSet {
        argsz: 20,
        flags: VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
        index: 2,
        start: 0,
        count: 2,
    };
    let efd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    send(&s, 3, cmd::DEVICE_SET_IRQS, set.as_bytes(), &[efd.as_fd()]);
    expect_errno(&mut s, 3, libc::EINVAL);
    // More fds than the limit: the extra ones are closed, the message refused.
    let many = vec![fd; 20];
    send(&s, 4, cmd::DMA_MAP, map.as_bytes(), &many);
    expect_errno(&mut s, 4, libc::EINVAL);
    // The same map with exactly one fd works.
    send(&s, 5, cmd::DMA_MAP, map.as_bytes(), &[fd]);
    expect_ok(&mut s, 5);
    drop(s);
    server.assert_serves_new_client();
}

#[test]
fn overlapping_dma_map_is_eexist_and_pipelined_maps_work() {
    let server = ListeningServer::start("overlap");
    let mut s = server.raw();
    negotiate(&mut s);
    let memfd = rustix::fs::memfd_create("g", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&memfd, 0x10000).unwrap();
    // Pipelined: all sent before any reply is read, as QEMU does.
    for i in 0..4u64 {
        let map = DmaMap {
            argsz: 32,
            flags: 3,
            offset: i * 0x1000,
            address: 0x10000 + i * 0x1000,
            size: 0x1000,
        };
        send(&s, i as u16, cmd::DMA_MAP, map.as_bytes(), &[memfd.as_fd()]);
    }
    let overlap = DmaMap {
        argsz: 32,
        flags: 3,
        offset: 0,
        address: 0x10800,
        size: 0x1000,
    };
    send(&s, 10, cmd::DMA_MAP, overlap.as_bytes(), &[memfd.as_fd()]);
    let no_fd_overlap = DmaMap {
        argsz: 32,
        flags: 3,
        offset: 0,
        address: 0x13fff,
        size: 2,
    };
    send(&s, 11, cmd::DMA_MAP, no_fd_overlap.as_bytes(), &[]);
    for i in 0..4u16 {
        expect_ok(&mut s, i);
    }
    expect_errno(&mut s, 10, libc::EEXIST);
    expect_errno(&mut s, 11, libc::EEXIST);
    // Bad flags and zero size.
    let bad = DmaMap {
        argsz: 32,
        flags: 0x80,
        offset: 0,
        address: 0x90000,
        size: 0x1000,
    };
    send(&s, 12, cmd::DMA_MAP, bad.as_bytes(), &[]);
    expect_errno(&mut s, 12, libc::EINVAL);
    let zero = DmaMap {
        argsz: 32,
        flags: 3,
        offset: 0,
        address: 0x90000,
        size: 0,
    };
    send(&s, 13, cmd::DMA_MAP, zero.as_bytes(), &[]);
    expect_errno(&mut s, 13, libc::EINVAL);
    assert_eq!(dma(&server.shared).map_count(), 4);
    // Unmap all (VFIO_DMA_UNMAP_FLAG_ALL).
    let all = DmaUnmap {
        argsz: 24,
        flags: DMA_UNMAP_FLAG_ALL,
        address: 0,
        size: 0,
    };
    send(&s, 14, cmd::DMA_UNMAP, all.as_bytes(), &[]);
    let p = expect_ok(&mut s, 14);
    assert_eq!(p.len(), 24);
    assert_eq!(dma(&server.shared).map_count(), 0);
    drop(s);
    server.assert_serves_new_client();
}

#[test]
fn region_access_past_the_end_is_einval() {
    let server = ListeningServer::start("region-end");
    let mut s = server.raw();
    negotiate(&mut s);
    let w = RegionAccess {
        offset: BAR0_SIZE - 2,
        region: 0,
        count: 4,
    };
    let mut p = w.as_bytes().to_vec();
    p.extend_from_slice(&[0; 4]);
    send(&s, 1, cmd::REGION_WRITE, &p, &[]);
    expect_errno(&mut s, 1, libc::EINVAL);
    let w = RegionAccess {
        offset: u64::MAX - 1,
        region: 0,
        count: 4,
    };
    let mut p = w.as_bytes().to_vec();
    p.extend_from_slice(&[0; 4]);
    send(&s, 2, cmd::REGION_WRITE, &p, &[]);
    expect_errno(&mut s, 2, libc::EINVAL);
    // count disagrees with the data sent
    let w = RegionAccess {
        offset: 0,
        region: 0,
        count: 8,
    };
    let mut p = w.as_bytes().to_vec();
    p.extend_from_slice(&[0; 4]);
    send(&s, 3, cmd::REGION_WRITE, &p, &[]);
    expect_errno(&mut s, 3, libc::EINVAL);
    let r = RegionAccess {
        offset: 0,
        region: 0,
        count: 2 << 20,
    };
    send(&s, 4, cmd::REGION_READ, r.as_bytes(), &[]);
    expect_errno(&mut s, 4, libc::E2BIG);
    let r = RegionAccess {
        offset: 0,
        region: 42,
        count: 4,
    };
    send(&s, 5, cmd::REGION_READ, r.as_bytes(), &[]);
    expect_errno(&mut s, 5, libc::EINVAL);
    get_info(&mut s, 6);
    drop(s);
    server.assert_serves_new_client();
}

#[test]
fn stop_flag_ends_serve_listener_with_a_client_connected() {
    let server = ListeningServer::start("stop");
    let mut s = server.raw();
    negotiate(&mut s);
    drop(server); // sets stop and joins; must not hang on the idle client
    expect_eof(&mut s);
}
