//! Client <-> server over a socketpair with the RAM-backed test device.

mod common;

use std::io::{IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::*;
use parking_lot::Mutex;
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use vnvme_vfio_user::wire::*;
use vnvme_vfio_user::*;
use zerocopy::IntoBytes;

#[test]
fn version_negotiation_then_device_and_irq_info() {
    let (client, shared, server) = pair();
    let info = client.device_info().unwrap();
    assert_eq!(info.flags, VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET);
    assert_eq!(info.num_regions, region::COUNT);
    assert_eq!(info.num_irqs, irq::COUNT);
    assert_eq!(client.irq_info(irq::MSIX).unwrap().count, MSIX_VECTORS);
    assert!(matches!(
        client.irq_info(99),
        Err(Error::Remote {
            errno: libc::EINVAL,
            ..
        })
    ));
    assert_eq!(shared.attaches.load(Ordering::SeqCst), 1);
    drop(client);
    server.join().unwrap().unwrap();
    assert_eq!(shared.detaches.load(Ordering::SeqCst), 1);
}

#[test]
fn region_info_reports_sparse_mmap_area_and_fd() {
    let (client, _shared, _server) = pair();
    let (info, fd) = client.region_info(region::BAR0).unwrap();
    assert_eq!(info.size, BAR0_SIZE);
    assert_ne!(info.flags & VFIO_REGION_INFO_FLAG_MMAP, 0);
    assert_ne!(info.flags & VFIO_REGION_INFO_FLAG_CAPS, 0);
    assert_eq!(
        info.sparse_areas,
        vec![SparseArea {
            offset: 0x1000,
            size: 0x1000
        }]
    );
    let fd = fd.expect("BAR0 fd");
    assert_eq!(rustix::fs::fstat(&fd).unwrap().st_size as u64, BAR0_SIZE);
    let (cfg, fd) = client.region_info(region::CONFIG).unwrap();
    assert_eq!(cfg.size, CONFIG_SIZE);
    assert_eq!(cfg.flags & VFIO_REGION_INFO_FLAG_MMAP, 0);
    assert!(fd.is_none());
}

#[test]
fn region_write_replied_and_posted_then_read_back() {
    let (client, _shared, _server) = pair();
    client
        .region_write(region::BAR0, 0x14, &0x0046_0001u32.to_le_bytes())
        .unwrap();
    client
        .region_write_posted(region::BAR0, 0x1000, &7u32.to_le_bytes())
        .unwrap();
    let mut b = [0u8; 4];
    client.region_read(region::BAR0, 0x14, &mut b).unwrap();
    assert_eq!(u32::from_le_bytes(b), 0x0046_0001);
    // Commands are processed in order, so the posted write is visible.
    client.region_read(region::BAR0, 0x1000, &mut b).unwrap();
    assert_eq!(u32::from_le_bytes(b), 7);
    let err = client
        .region_write(region::CONFIG, CONFIG_SIZE - 2, &[0; 4])
        .unwrap_err();
    assert_eq!(err.errno(), Some(libc::EINVAL));
}

#[test]
fn concurrent_posted_writes_arrive_whole() {
    let (client, _shared, _server) = pair();
    let client = Arc::new(client);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let c = client.clone();
            std::thread::spawn(move || {
                for i in 0..256u64 {
                    let off = 0x1000 + t * 0x100 + (i % 64) * 4;
                    c.region_write_posted(region::BAR0, off, &((t << 16 | i) as u32).to_le_bytes())
                        .unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    for t in 0..4u64 {
        let mut b = [0u8; 4];
        // Last write to slot 63 of thread t was i = 255.
        client
            .region_read(region::BAR0, 0x1000 + t * 0x100 + 63 * 4, &mut b)
            .unwrap();
        assert_eq!(u32::from_le_bytes(b), (t << 16 | 255) as u32);
    }
}

#[test]
fn dma_map_with_memfd_is_shared_both_ways() {
    let (client, shared, _server) = pair();
    let memfd = rustix::fs::memfd_create("guest", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&memfd, 0x20000).unwrap();
    // Map the second 64 KiB of the file at IOVA 0x10_0000.
    client
        .dma_map(0x10_0000, 0x10000, memfd.as_fd(), 0x10000, true)
        .unwrap();
    let dma = dma(&shared);
    assert_eq!(dma.map_count(), 1);

    dma.write(GuestAddress(0x10_0010), b"from device").unwrap();
    let mut b = [0u8; 11];
    rustix::io::pread(&memfd, &mut b, 0x10010).unwrap();
    assert_eq!(&b, b"from device");

    rustix::io::pwrite(&memfd, &0xfeed_f00du32.to_le_bytes(), 0x10040).unwrap();
    assert_eq!(dma.load_u32(GuestAddress(0x10_0040)).unwrap(), 0xfeed_f00d);
    dma.store_u32(GuestAddress(0x10_0044), 0x1234_5678).unwrap();
    let mut w = [0u8; 4];
    rustix::io::pread(&memfd, &mut w, 0x10044).unwrap();
    assert_eq!(u32::from_le_bytes(w), 0x1234_5678);

    assert!(matches!(
        dma.read(GuestAddress(0x10_fff0), &mut [0u8; 32]),
        Err(DmaError::Unmapped { .. })
    ));
}

#[test]
fn read_only_map_refuses_device_writes() {
    let (client, shared, _server) = pair();
    let memfd = rustix::fs::memfd_create("guest", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&memfd, 0x1000).unwrap();
    client
        .dma_map(0x2000, 0x1000, memfd.as_fd(), 0, false)
        .unwrap();
    let dma = dma(&shared);
    assert!(matches!(
        dma.write(GuestAddress(0x2000), &[1]),
        Err(DmaError::Permission { .. })
    ));
    dma.read(GuestAddress(0x2000), &mut [0u8; 8]).unwrap();
}

#[test]
fn dma_map_beyond_file_end_is_refused() {
    let (client, _shared, _server) = pair();
    let memfd = rustix::fs::memfd_create("guest", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&memfd, 0x1000).unwrap();
    let err = client
        .dma_map(0x0, 0x2000, memfd.as_fd(), 0, true)
        .unwrap_err();
    assert_eq!(err.errno(), Some(libc::EINVAL));
}

#[test]
fn map_without_fd_is_served_by_dma_read_and_write() {
    let (client, shared, _server) = pair();
    let backing = Arc::new(Mutex::new(vec![0u8; 0x2000]));
    backing.lock()[0x100..0x104].copy_from_slice(&[1, 2, 3, 4]);
    client
        .dma_map_without_fd(0x40_0000, backing.clone())
        .unwrap();
    let dma = dma(&shared);

    // The client is idle here: its responder thread answers.
    let mut b = [0u8; 4];
    dma.read(GuestAddress(0x40_0100), &mut b).unwrap();
    assert_eq!(b, [1, 2, 3, 4]);
    dma.write(GuestAddress(0x40_0200), b"remote").unwrap();
    assert_eq!(&backing.lock()[0x200..0x206], b"remote");
    dma.store_u32(GuestAddress(0x40_0300), 0xabcd).unwrap();
    assert_eq!(dma.load_u32(GuestAddress(0x40_0300)).unwrap(), 0xabcd);
    dma.zero(GuestAddress(0x40_0100), 4).unwrap();
    assert_eq!(&backing.lock()[0x100..0x104], &[0; 4]);

    // Device DMA from several threads while the client issues commands.
    let workers: Vec<_> = (0..3u64)
        .map(|t| {
            let dma = dma.clone();
            std::thread::spawn(move || {
                for i in 0..50u64 {
                    let addr = 0x40_1000 + t * 0x100 + (i % 16) * 8;
                    dma.write(GuestAddress(addr), &i.to_le_bytes()).unwrap();
                    let mut r = [0u8; 8];
                    dma.read(GuestAddress(addr), &mut r).unwrap();
                    assert_eq!(u64::from_le_bytes(r), i);
                }
            })
        })
        .collect();
    for _ in 0..50 {
        client.device_info().unwrap();
    }
    workers.into_iter().for_each(|w| w.join().unwrap());
}

#[test]
fn unmap_then_access_is_unmapped() {
    let (client, shared, _server) = pair();
    let memfd = rustix::fs::memfd_create("guest", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&memfd, 0x4000).unwrap();
    client
        .dma_map(0x8000, 0x4000, memfd.as_fd(), 0, true)
        .unwrap();
    let dma = dma(&shared);
    dma.write(GuestAddress(0x8000), &[9; 16]).unwrap();
    client.dma_unmap(0x8000, 0x4000).unwrap();
    assert_eq!(shared.unmapping.lock().as_slice(), &[(0x8000, 0x4000)]);
    assert_eq!(
        dma.read(GuestAddress(0x8000), &mut [0u8; 16]),
        Err(DmaError::Unmapped {
            addr: GuestAddress(0x8000),
            len: 16
        })
    );
    assert!(matches!(
        dma.load_u32(GuestAddress(0x8000)),
        Err(DmaError::Unmapped { .. })
    ));
    // Unmapping what is not mapped removes nothing and is no error (as the
    // kernel's VFIO answers it, which QEMU expects: behind a vIOMMU it
    // unmaps whole windows); one that would split a map is EINVAL.
    client.dma_unmap(0x8000, 0x4000).unwrap();
    client
        .dma_map(0x8000, 0x4000, memfd.as_fd(), 0, true)
        .unwrap();
    assert_eq!(
        client.dma_unmap(0x8000, 0x1000).unwrap_err().errno(),
        Some(libc::EINVAL)
    );
    client.dma_unmap(0, 0x10_0000).unwrap();
    client
        .dma_map(0x8000, 0x4000, memfd.as_fd(), 0, true)
        .unwrap();
    let mut b = [0u8; 16];
    dma.read(GuestAddress(0x8000), &mut b).unwrap();
    assert_eq!(b, [9; 16]);
}

#[test]
fn set_irqs_eventfds_reach_the_device_and_disable_clears_them() {
    let (client, shared, _server) = pair();
    let efds: Vec<_> = (0..2)
        .map(|_| rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap())
        .collect();
    let borrowed: Vec<_> = efds.iter().map(|f| f.as_fd()).collect();
    client.set_irqs_eventfds(irq::MSIX, 1, &borrowed).unwrap();
    {
        let slots = shared.msix_fds.lock();
        assert!(slots[0].is_none());
        // The device signals vector 2; the client's eventfd sees it.
        rustix::io::write(slots[2].as_ref().unwrap(), &1u64.to_ne_bytes()).unwrap();
    }
    let mut v = [0u8; 8];
    rustix::io::read(&efds[1], &mut v).unwrap();
    assert_eq!(u64::from_ne_bytes(v), 1);
    // A vector past the index's count is refused.
    let err = client
        .set_irqs_eventfds(irq::MSIX, MSIX_VECTORS, &borrowed[..1])
        .unwrap_err();
    assert_eq!(err.errno(), Some(libc::EINVAL));
    client.disable_irqs(irq::MSIX).unwrap();
    assert!(shared.msix_fds.lock().iter().all(Option::is_none));
}

#[test]
fn device_reset_reaches_the_device() {
    let (client, shared, _server) = pair();
    client.reset().unwrap();
    client.reset().unwrap();
    assert_eq!(shared.resets.load(Ordering::SeqCst), 2);
}

#[test]
fn device_dma_from_the_control_thread_to_a_map_without_fd_does_not_deadlock() {
    let (client, _shared, _server) = pair();
    let backing = Arc::new(Mutex::new(vec![0u8; 0x1000]));
    client
        .dma_map_without_fd(CONFIG_DMA_TARGET, backing.clone())
        .unwrap();
    client
        .region_write(region::CONFIG, CONFIG_DMA_TRIGGER, b"ctl!")
        .unwrap();
    assert_eq!(&backing.lock()[..4], b"ctl!");
}

#[test]
fn server_returns_when_the_client_goes_and_dma_is_torn_down() {
    let (client, shared, server) = pair();
    let memfd = rustix::fs::memfd_create("guest", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&memfd, 0x1000).unwrap();
    client.dma_map(0, 0x1000, memfd.as_fd(), 0, true).unwrap();
    let dma = dma(&shared);
    drop(client);
    server.join().unwrap().unwrap();
    assert_eq!(shared.detaches.load(Ordering::SeqCst), 1);
    assert_eq!(dma.map_count(), 0);
    assert!(matches!(
        dma.read(GuestAddress(0), &mut [0u8; 4]),
        Err(DmaError::Unmapped { .. })
    ));
}

#[test]
fn dma_unmap_with_fd_carries_the_fd_of_the_map() {
    // A bare peer, since the server closes the fds a DMA_UNMAP carries
    // unseen: it answers VERSION and one DMA_UNMAP, and keeps that one's fds.
    let (a, b) = UnixStream::pair().unwrap();
    let peer = std::thread::spawn(move || {
        let (version, _) = recv_with_fds(&b);
        reply(&b, &version, Version { major: 0, minor: 0 }.as_bytes());
        let (unmap, fds) = recv_with_fds(&b);
        assert_eq!(unmap.command, cmd::DMA_UNMAP);
        reply(&b, &unmap, &[]);
        fds
    });
    let client = Client::from_stream(a).unwrap();
    let memfd = rustix::fs::memfd_create("guest", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    client
        .dma_unmap_with_fd(0x8000, 0x4000, memfd.as_fd())
        .unwrap();
    let fds = peer.join().unwrap();
    assert_eq!(fds.len(), 1);
    let (sent, got) = (
        rustix::fs::fstat(&memfd).unwrap(),
        rustix::fs::fstat(&fds[0]).unwrap(),
    );
    assert_eq!((got.st_dev, got.st_ino), (sent.st_dev, sent.st_ino));
}

/// One whole message from `s` (header and payload read together, as the
/// client sends small ones) and the fds that came with it.
fn recv_with_fds(s: &UnixStream) -> (Header, Vec<OwnedFd>) {
    let mut buf = [0u8; 4096];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_MSG_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        s,
        &mut [IoSliceMut::new(&mut buf)],
        &mut control,
        RecvFlags::empty(),
    )
    .unwrap();
    let header = read_prefix::<Header>(&buf[..got.bytes]).unwrap();
    assert_eq!(header.msg_size as usize, got.bytes, "one whole message");
    let fds = control
        .drain()
        .flat_map(|m| match m {
            RecvAncillaryMessage::ScmRights(fds) => fds.collect(),
            _ => Vec::new(),
        })
        .collect();
    (header, fds)
}

fn reply(s: &UnixStream, req: &Header, payload: &[u8]) {
    let header = Header {
        msg_size: (HEADER_SIZE + payload.len()) as u32,
        flags: flags::TYPE_REPLY,
        ..*req
    };
    let mut bytes = header.as_bytes().to_vec();
    bytes.extend_from_slice(payload);
    (&*s).write_all(&bytes).unwrap();
}
