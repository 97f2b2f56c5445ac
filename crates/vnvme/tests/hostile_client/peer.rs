//! A raw vfio-user peer: any header, payload and fds, replies read as they
//! come. How a hostile client is written.
#![allow(dead_code)]

use std::io::{IoSlice, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use vnvme_vfio_user::wire::*;
use zerocopy::IntoBytes;

pub(crate) struct Peer {
    pub(crate) s: UnixStream,
}

impl Peer {
    pub(crate) fn connect(path: &Path) -> Self {
        // A server just started may have bound its socket and not yet listen.
        let deadline = Instant::now() + Duration::from_secs(5);
        let s = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e)
                    if e.kind() == std::io::ErrorKind::ConnectionRefused
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("connect to the server: {e}"),
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        Self { s }
    }

    /// Connects and negotiates VERSION, retrying while the server is busy
    /// with a previous client.
    pub(crate) fn negotiated(path: &Path) -> (Self, serde_json::Value) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let mut p = Self::connect(path);
            p.send(
                0,
                cmd::VERSION,
                &version_payload(br#"{"capabilities":{"max_msg_fds":16}}"#),
                &[],
            );
            let (h, payload) = p.recv();
            if h.is_error() && h.error as i32 == libc::EBUSY && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            assert!(h.is_reply() && !h.is_error(), "VERSION refused: {h:?}");
            let json = &payload[4..payload.len() - 1];
            let caps = serde_json::from_slice(json).expect("VERSION reply JSON");
            return (p, caps);
        }
    }

    /// Sends one whole message (header sized to fit) with `fds`.
    pub(crate) fn send(&self, id: u16, command: u16, payload: &[u8], fds: &[BorrowedFd<'_>]) {
        let header = Header {
            msg_id: id,
            command,
            msg_size: (HEADER_SIZE + payload.len()) as u32,
            flags: flags::TYPE_COMMAND,
            error: 0,
        };
        let mut bytes = header.as_bytes().to_vec();
        bytes.extend_from_slice(payload);
        self.send_bytes(&bytes, fds);
    }

    /// Sends raw bytes, `fds` with the first one.
    pub(crate) fn send_bytes(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(64))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() {
            assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
        }
        let mut sent = 0;
        while sent < bytes.len() {
            let n = rustix::net::sendmsg(
                &self.s,
                &[IoSlice::new(&bytes[sent..])],
                &mut control,
                SendFlags::NOSIGNAL,
            )
            .expect("send to the server");
            control.clear();
            sent += n;
        }
    }

    pub(crate) fn recv(&mut self) -> (Header, Vec<u8>) {
        let mut h = [0u8; HEADER_SIZE];
        self.s.read_exact(&mut h).expect("a reply header");
        let header = read_prefix::<Header>(&h).unwrap();
        let mut payload = vec![0u8; header.msg_size as usize - HEADER_SIZE];
        self.s.read_exact(&mut payload).expect("a reply payload");
        (header, payload)
    }

    pub(crate) fn expect_errno(&mut self, id: u16, errno: i32) {
        let (h, _) = self.recv();
        assert_eq!(h.msg_id, id, "reply to message {id}");
        assert!(
            h.is_reply() && h.is_error(),
            "expected errno {errno}, got {h:?}"
        );
        assert_eq!(h.error as i32, errno, "errno for message {id}");
    }

    pub(crate) fn expect_ok(&mut self, id: u16) -> Vec<u8> {
        let (h, payload) = self.recv();
        assert_eq!(h.msg_id, id, "reply to message {id}");
        assert!(h.is_reply() && !h.is_error(), "expected success, got {h:?}");
        payload
    }

    /// Waits for the server to close the connection; how long that took.
    pub(crate) fn expect_eof_within(&mut self, limit: Duration) -> Duration {
        let started = Instant::now();
        self.s.set_read_timeout(Some(limit)).unwrap();
        let mut b = [0u8; 64];
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return started.elapsed(),
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return started.elapsed()
                }
                Err(e) => panic!("no EOF within {limit:?}: {e}"),
            }
        }
    }

    pub(crate) fn dma_map(
        &self,
        id: u16,
        iova: u64,
        size: u64,
        offset: u64,
        fd: Option<BorrowedFd<'_>>,
    ) {
        let m = DmaMap {
            argsz: size_of::<DmaMap>() as u32,
            flags: DMA_MAP_FLAG_READ | DMA_MAP_FLAG_WRITE,
            offset,
            address: iova,
            size,
        };
        let fds: Vec<_> = fd.into_iter().collect();
        self.send(id, cmd::DMA_MAP, m.as_bytes(), &fds);
    }

    pub(crate) fn dma_unmap(&self, id: u16, iova: u64, size: u64, fd: Option<BorrowedFd<'_>>) {
        let u = DmaUnmap {
            argsz: size_of::<DmaUnmap>() as u32,
            flags: 0,
            address: iova,
            size,
        };
        let fds: Vec<_> = fd.into_iter().collect();
        self.send(id, cmd::DMA_UNMAP, u.as_bytes(), &fds);
    }

    pub(crate) fn set_irqs(
        &self,
        id: u16,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: &[BorrowedFd<'_>],
    ) {
        let set = IrqSet {
            argsz: size_of::<IrqSet>() as u32,
            flags,
            index,
            start,
            count,
        };
        self.send(id, cmd::DEVICE_SET_IRQS, set.as_bytes(), fds);
    }

    pub(crate) fn region_access(
        &self,
        id: u16,
        command: u16,
        region: u32,
        offset: u64,
        count: u32,
        data: &[u8],
    ) {
        let mut p = RegionAccess {
            offset,
            region,
            count,
        }
        .as_bytes()
        .to_vec();
        p.extend_from_slice(data);
        self.send(id, command, &p, &[]);
    }
}

/// A VERSION payload: 0.0 and `json` NUL-terminated.
pub(crate) fn version_payload(json: &[u8]) -> Vec<u8> {
    let mut p = Version { major: 0, minor: 0 }.as_bytes().to_vec();
    p.extend_from_slice(json);
    p.push(0);
    p
}

/// Fds of every kind a client can pass.
pub(crate) mod fds {
    use super::*;

    pub(crate) fn eventfd(initial: u64) -> OwnedFd {
        let fd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
        if initial > 0 {
            rustix::io::write(&fd, &initial.to_ne_bytes()).unwrap();
        }
        fd
    }

    /// (read end, write end).
    pub(crate) fn pipe() -> (OwnedFd, OwnedFd) {
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap()
    }

    /// One end of a socketpair whose other end nobody reads, its buffer filled.
    pub(crate) fn full_socket() -> (OwnedFd, OwnedFd) {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let chunk = [0u8; 4096];
        while rustix::io::write(&a, &chunk).is_ok() {}
        a.set_nonblocking(false).unwrap();
        (a.into(), b.into())
    }

    pub(crate) fn memfd(size: u64) -> OwnedFd {
        let fd = rustix::fs::memfd_create("hostile", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, size).unwrap();
        fd
    }

    /// A regular file of `size` bytes in /dev/shm (unlinked at once).
    pub(crate) fn shm_file(size: u64) -> OwnedFd {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::path::PathBuf::from(format!("/dev/shm/vnvme-hostile-{}-{n}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let _ = std::fs::remove_file(&path);
        f.set_len(size).unwrap();
        f.into()
    }

    pub(crate) fn dev_null() -> OwnedFd {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/null")
            .unwrap()
            .into()
    }

    pub(crate) fn borrow(fd: &OwnedFd) -> BorrowedFd<'_> {
        fd.as_fd()
    }
}
