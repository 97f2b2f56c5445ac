//! The vfio-user server with the NVMe device behind it, fed a message stream
//! over a socketpair: well-formed messages with hostile fields, raw headers
//! with any size and flags, bytes that break the framing, and fds of every
//! kind on any message: memfds and regular files (for DMA_MAP), eventfds
//! (for SET_IRQS, also one at its maximum count), pipe ends and sockets
//! (also ones whose peer never reads, so a write blocks). The harness keeps
//! a duplicate of each memfd or file it passes with DMA_MAP and may shrink it
//! later ([`Ext::Truncate`]), so the server's next access to those pages
//! would raise SIGBUS. SIGPIPE is ignored, as in the `vnvme` binary (Rust's
//! runtime does it there; libFuzzer's `main` does not).
//!
//! The harness also plays a guest: it can write SQEs and PRP lists into its
//! memfd "RAM" and drive the controller through REGION_WRITEs, so inputs
//! reach the I/O path and DMA_UNMAP can race in-flight commands. A reader
//! thread drains replies and answers the server's DMA_READ/DMA_WRITE (or
//! fails them). Every input must end with the server returning within
//! [`DEADLINE`] of the client closing (anything else is a hang: panic), and
//! with no fd left open that the input opened (a leak: panic).

use std::io::{IoSlice, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Once};
use std::time::{Duration, Instant};

use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use vnvme_blockdev::RamDevice;
use vnvme_controller::{ControllerConfig, DoorbellMode, NamespaceConfig};
use vnvme_device::{DeviceConfig, NvmeDevice};
use vnvme_vfio_user::wire::{cmd, flags, DmaAccess, Header, HEADER_SIZE};
use vnvme_vfio_user::Server;
use zerocopy::{FromBytes, IntoBytes};

mod input;
pub use input::*;

/// How long the server may take to finish after the client has gone.
const DEADLINE: Duration = Duration::from_secs(20);
/// Size of the guest RAM memfd.
const RAM: u64 = 1 << 20;
/// How long the fds the input opened may take to close after the server returned.
const FD_GRACE: Duration = Duration::from_secs(2);
/// Most memfd/file duplicates kept for [`Ext::Truncate`].
const MAX_KEPT: usize = 16;
const ASQ: u64 = 0x1000;
const ACQ: u64 = 0x2000;

struct Client {
    sock: UnixStream,
    ram: OwnedFd,
    next_id: u16,
    broken: bool,
    /// Fds for the next message ([`Ext::Fds`]).
    pending: Vec<Fd>,
    /// Duplicates of the memfds and files passed with DMA_MAP, with their
    /// size then, for [`Ext::Truncate`].
    kept: Vec<(OwnedFd, u64)>,
    /// The other ends of pipes and sockets passed, kept open (silent).
    peers: Vec<OwnedFd>,
    /// Admin SQ: entries (from `EnableNvme`) and the tail last rung.
    admin_entries: u32,
    admin_tail: u32,
}

/// A regular file of `len` bytes in the temp folder, already unlinked.
fn temp_file(len: u64) -> Option<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir();
    let mode = Mode::from_raw_mode(0o600);
    let fd = match rustix::fs::open(&dir, OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC, mode) {
        Ok(fd) => fd,
        Err(_) => {
            // No O_TMPFILE on this file system: a fresh name, unlinked at once.
            let n = N.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!("vnvme-fuzz-{}-{n}", std::process::id()));
            let flags = OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::CLOEXEC;
            let fd = rustix::fs::open(&path, flags, mode).ok()?;
            let _ = std::fs::remove_file(&path);
            fd
        }
    };
    rustix::fs::ftruncate(&fd, len).ok()?;
    Some(fd)
}

/// Writes into `fd` until its buffer is full, then makes it blocking again.
fn fill(fd: &OwnedFd) {
    use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
    let Ok(fl) = fcntl_getfl(fd) else { return };
    if fcntl_setfl(fd, fl | OFlags::NONBLOCK).is_err() {
        return;
    }
    let chunk = [0x5au8; 16384];
    // At most 16 MiB: far above any pipe or socket buffer.
    for _ in 0..1024 {
        if !matches!(rustix::io::write(fd, &chunk), Ok(n) if n > 0) {
            break;
        }
    }
    let _ = fcntl_setfl(fd, fl);
}

impl Client {
    /// A new fd of kind `f` (the other end of a pipe or socket goes to
    /// `peers`), with its size if it is a memfd or file.
    fn make_fd(&mut self, f: Fd) -> Option<(OwnedFd, Option<u64>)> {
        use rustix::event::{eventfd, EventfdFlags};
        use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
        use rustix::pipe::{pipe_with, PipeFlags};
        let pair = || {
            socketpair(
                AddressFamily::UNIX,
                SocketType::STREAM,
                SocketFlags::CLOEXEC,
                None,
            )
            .ok()
        };
        let fd = match f {
            Fd::Memfd { pages: 0 } => return Some((rustix::io::dup(&self.ram).ok()?, Some(RAM))),
            Fd::Memfd { pages } => {
                let fd = rustix::fs::memfd_create("fuzz", rustix::fs::MemfdFlags::CLOEXEC).ok()?;
                let len = u64::from(pages) * 4096;
                rustix::fs::ftruncate(&fd, len).ok()?;
                return Some((fd, Some(len)));
            }
            Fd::File { pages } => {
                let len = if pages == 0 {
                    RAM
                } else {
                    u64::from(pages) * 4096
                };
                return Some((temp_file(len)?, Some(len)));
            }
            Fd::Eventfd => eventfd(0, EventfdFlags::CLOEXEC).ok()?,
            Fd::EventfdFull => {
                let fd = eventfd(0, EventfdFlags::CLOEXEC).ok()?;
                rustix::io::write(&fd, &0xffff_ffff_ffff_fffeu64.to_ne_bytes()).ok()?;
                fd
            }
            Fd::Pipe => rustix::pipe::pipe().ok().map(|(r, _w)| r)?,
            Fd::PipeRead => {
                let (r, w) = pipe_with(PipeFlags::CLOEXEC).ok()?;
                self.peers.push(w);
                r
            }
            Fd::PipeWrite => {
                let (r, w) = pipe_with(PipeFlags::CLOEXEC).ok()?;
                fill(&w);
                self.peers.push(r);
                w
            }
            Fd::Socket => pair()?.0,
            Fd::SocketFull => {
                let (a, b) = pair()?;
                fill(&a);
                self.peers.push(b);
                a
            }
        };
        Some((fd, None))
    }

    fn send_raw(&mut self, bytes: &[u8], fds: &[Fd]) {
        if self.broken {
            return;
        }
        let mut all = std::mem::take(&mut self.pending);
        all.extend_from_slice(fds);
        let made: Vec<(OwnedFd, Option<u64>)> = all
            .iter()
            .take(20)
            .filter_map(|f| self.make_fd(*f))
            .collect();
        // DMA_MAP by its header (also from `Raw`): keep what may be mapped.
        let dma_map = bytes.len() >= 4 && u16::from_le_bytes([bytes[2], bytes[3]]) == cmd::DMA_MAP;
        if dma_map {
            for (fd, len) in &made {
                if let (Some(len), Ok(dup)) = (len, rustix::io::dup(fd)) {
                    if self.kept.len() == MAX_KEPT {
                        self.kept.remove(0);
                    }
                    self.kept.push((dup, *len));
                }
            }
        }
        let owned: Vec<OwnedFd> = made.into_iter().map(|(fd, _)| fd).collect();
        let borrowed: Vec<BorrowedFd<'_>> = owned.iter().map(|f| f.as_fd()).collect();
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(20))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !borrowed.is_empty() {
            control.push(SendAncillaryMessage::ScmRights(&borrowed));
        }
        match rustix::net::sendmsg(
            &self.sock,
            &[IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(n) if n < bytes.len() => {
                if self.sock.write_all(&bytes[n..]).is_err() {
                    self.broken = true;
                }
            }
            Ok(_) => {}
            Err(_) => self.broken = true,
        }
    }

    fn send(&mut self, command: u16, extra_flags: u32, payload: &[u8], fds: &[Fd]) {
        self.next_id = self.next_id.wrapping_add(1);
        let header = Header {
            msg_id: self.next_id,
            command,
            msg_size: (HEADER_SIZE + payload.len()) as u32,
            flags: flags::TYPE_COMMAND | extra_flags,
            error: 0,
        };
        let mut bytes = header.as_bytes().to_vec();
        bytes.extend_from_slice(payload);
        self.send_raw(&bytes, fds);
    }

    fn region_write(&mut self, index: u32, offset: u64, data: &[u8], posted: bool) {
        let mut p = Vec::with_capacity(16 + data.len());
        p.extend_from_slice(&offset.to_le_bytes());
        p.extend_from_slice(&index.to_le_bytes());
        p.extend_from_slice(&(data.len() as u32).to_le_bytes());
        p.extend_from_slice(data);
        let f = if posted { flags::NO_REPLY } else { 0 };
        self.send(cmd::REGION_WRITE, f, &p, &[]);
    }

    fn guest_write(&self, offset: u64, bytes: &[u8]) {
        let _ = rustix::io::pwrite(&self.ram, bytes, offset % RAM);
    }

    /// An admin command into the next SQ slot, and the tail doorbell rung.
    fn admin(&mut self, sqe: &[u8; 64]) {
        let n = self.admin_entries.max(2);
        let slot = self.admin_tail % n;
        self.guest_write(ASQ + u64::from(slot) * 64, sqe);
        self.admin_tail = (slot + 1) % n;
        self.region_write(0, 0x1000, &self.admin_tail.to_le_bytes(), true);
    }
}

/// The fds open in this process (None if /proc cannot tell).
fn open_fds() -> Option<Vec<(i32, String)>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd").ok()? {
        let e = e.ok()?;
        let Some(n) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let link = std::fs::read_link(e.path())
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        v.push((n, link));
    }
    Some(v)
}

/// Ignore SIGPIPE once, as Rust's runtime does for the `vnvme` binary:
/// libFuzzer's `main` leaves it at its default (terminate).
fn ignore_sigpipe() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: SIG_IGN for SIGPIPE, before this input's threads start.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    });
}

fn le32s(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn dma_map_payload(argsz: u32, flags: u32, offset: u64, iova: u64, size: u64) -> Vec<u8> {
    let mut p = le32s(&[argsz, flags]);
    p.extend_from_slice(&offset.to_le_bytes());
    p.extend_from_slice(&iova.to_le_bytes());
    p.extend_from_slice(&size.to_le_bytes());
    p
}

fn unmap_payload(argsz: u32, flags: u32, iova: u64, size: u64) -> Vec<u8> {
    let mut p = le32s(&[argsz, flags]);
    p.extend_from_slice(&iova.to_le_bytes());
    p.extend_from_slice(&size.to_le_bytes());
    p
}

/// Reads everything the server sends; answers its DMA requests.
fn reader(mut sock: UnixStream, answer: bool) {
    let mut hdr = [0u8; HEADER_SIZE];
    loop {
        if sock.read_exact(&mut hdr).is_err() {
            return;
        }
        let Ok(h) = Header::read_from_bytes(&hdr) else {
            return;
        };
        let len = (h.msg_size as usize)
            .saturating_sub(HEADER_SIZE)
            .min(4 << 20);
        let mut payload = vec![0u8; len];
        if sock.read_exact(&mut payload).is_err() {
            return;
        }
        if h.is_reply() || !matches!(h.command, cmd::DMA_READ | cmd::DMA_WRITE) {
            continue;
        }
        let Some(acc) = DmaAccess::read_from_prefix(&payload).ok().map(|(a, _)| a) else {
            continue;
        };
        let mut reply = Header {
            msg_id: h.msg_id,
            command: h.command,
            msg_size: HEADER_SIZE as u32,
            flags: flags::TYPE_REPLY,
            error: 0,
        };
        let mut body = Vec::new();
        if answer && acc.count <= 1 << 20 {
            body.extend_from_slice(acc.as_bytes());
            if h.command == cmd::DMA_READ {
                body.resize(body.len() + acc.count as usize, 0);
            }
        } else {
            reply.flags |= flags::ERROR;
            reply.error = 14; // EFAULT
        }
        reply.msg_size = (HEADER_SIZE + body.len()) as u32;
        let mut out = reply.as_bytes().to_vec();
        out.extend_from_slice(&body);
        if sock.write_all(&out).is_err() {
            return;
        }
    }
}

fn mode(sel: u8) -> DoorbellMode {
    match sel % 4 {
        0 => DoorbellMode::Trap,
        1 => DoorbellMode::Shadow,
        2 => DoorbellMode::Adaptive,
        _ => DoorbellMode::MmapPoll,
    }
}

pub fn run(input: Input) {
    ignore_sigpipe();
    // The read_dir fd itself is closed again before this returns.
    let fds_before = open_fds();
    session(input);
    // Every fd the input opened must be closed once the server has returned
    // (a worker may still be letting go of one: a short grace period).
    let Some(before) = fds_before else { return };
    let t0 = Instant::now();
    loop {
        let Some(now) = open_fds() else { return };
        let leaked: Vec<_> = now.iter().filter(|f| !before.contains(f)).collect();
        if now.len() <= before.len() || leaked.is_empty() {
            return;
        }
        if t0.elapsed() > FD_GRACE {
            panic!("fds left open after the server returned: {leaked:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn session(input: Input) {
    let controller = ControllerConfig {
        max_io_queues: 4,
        doorbells: mode(input.mode),
        idle_poll: Duration::from_micros(50),
        ..ControllerConfig::default()
    };
    let ns = NamespaceConfig::new(1, 4096, Arc::new(RamDevice::new(1 << 20)));
    let device = NvmeDevice::new(DeviceConfig::new(controller, vec![ns])).expect("device");
    let (client_end, server_end) = UnixStream::pair().expect("socketpair");
    let (done_tx, done_rx) = mpsc::channel();
    let server = std::thread::spawn(move || {
        let mut server = Server::new(device);
        let _ = server.serve_stream(server_end);
        let _ = done_tx.send(());
    });
    let ram = if input.mode & 4 != 0 {
        temp_file(RAM).expect("guest RAM file in the temp folder")
    } else {
        let ram = rustix::fs::memfd_create("ram", rustix::fs::MemfdFlags::CLOEXEC).expect("memfd");
        rustix::fs::ftruncate(&ram, RAM).expect("ftruncate");
        ram
    };
    let _ = client_end.set_write_timeout(Some(Duration::from_secs(2)));
    let read_end = client_end.try_clone().expect("clone");
    let answer = input.answer_dma;
    let rd = std::thread::spawn(move || reader(read_end, answer));
    let mut c = Client {
        sock: client_end,
        ram,
        next_id: 0,
        broken: false,
        pending: Vec::new(),
        kept: Vec::new(),
        peers: Vec::new(),
        admin_entries: 64,
        admin_tail: 0,
    };
    for m in input.msgs.into_iter().take(128) {
        step(&mut c, m);
        if c.broken {
            break;
        }
    }
    // The client goes: the server must notice and return.
    let _ = c.sock.shutdown(std::net::Shutdown::Both);
    if done_rx.recv_timeout(DEADLINE).is_err() {
        panic!("the server did not return within {DEADLINE:?} of the client closing");
    }
    let _ = server.join();
    let _ = rd.join();
}

fn step(c: &mut Client, s: Step) {
    let m = match s {
        Step::Msg(m) => m,
        Step::Ext(e) => return ext(c, e),
    };
    match m {
        Msg::Version {
            major,
            minor,
            json,
            nul,
        } => {
            let mut p = le32s(&[]);
            p.extend_from_slice(&major.to_le_bytes());
            p.extend_from_slice(&minor.to_le_bytes());
            p.extend_from_slice(&json[..json.len().min(4096)]);
            if nul {
                p.push(0);
            }
            c.send(cmd::VERSION, 0, &p, &[]);
        }
        Msg::Hello => {
            let mut p = vec![0, 0, 0, 0];
            p.extend_from_slice(
                br#"{"capabilities":{"max_msg_fds":8,"max_data_xfer_size":1048576,"pgsizes":4096}}"#,
            );
            p.push(0);
            c.send(cmd::VERSION, 0, &p, &[]);
        }
        Msg::DmaMap {
            iova,
            size,
            offset,
            flags,
            argsz_delta,
            fd,
        } => {
            let argsz = (32i64 + i64::from(argsz_delta)).max(0) as u32;
            let p = dma_map_payload(argsz, flags, offset, iova, size);
            let fds: Vec<Fd> = fd.into_iter().collect();
            c.send(cmd::DMA_MAP, 0, &p, &fds);
        }
        Msg::MapRam {
            iova_page,
            size_pages,
            writable,
        } => {
            let size = if size_pages == 0 {
                RAM
            } else {
                u64::from(size_pages) * 4096
            };
            let f = 1 | if writable { 2 } else { 0 };
            let p = dma_map_payload(32, f, 0, u64::from(iova_page) * 4096, size);
            c.send(cmd::DMA_MAP, 0, &p, &[Fd::Memfd { pages: 0 }]);
        }
        Msg::DmaUnmap {
            iova,
            size,
            flags,
            argsz,
        } => {
            c.send(
                cmd::DMA_UNMAP,
                0,
                &unmap_payload(argsz, flags, iova, size),
                &[],
            );
        }
        Msg::UnmapRam {
            iova_page,
            size_pages,
        } => {
            let size = if size_pages == 0 {
                RAM
            } else {
                u64::from(size_pages) * 4096
            };
            c.send(
                cmd::DMA_UNMAP,
                0,
                &unmap_payload(24, 0, u64::from(iova_page) * 4096, size),
                &[],
            );
        }
        Msg::GetInfo { argsz } => {
            let mut p = le32s(&[argsz, 0, 0, 0]);
            p.truncate((argsz as usize).min(16));
            c.send(cmd::DEVICE_GET_INFO, 0, &p, &[]);
        }
        Msg::GetRegionInfo {
            argsz,
            index,
            short,
        } => {
            let mut p = le32s(&[argsz, 0, index, 0, 0, 0, 0, 0]);
            p.truncate(32usize.saturating_sub(usize::from(short % 33)));
            c.send(cmd::DEVICE_GET_REGION_INFO, 0, &p, &[]);
        }
        Msg::GetIrqInfo { argsz, index } => {
            c.send(
                cmd::DEVICE_GET_IRQ_INFO,
                0,
                &le32s(&[argsz, 0, index, 0]),
                &[],
            );
        }
        Msg::SetIrqs {
            argsz_delta,
            flags,
            index,
            start,
            count,
            fds,
            data,
        } => {
            let argsz = (20i64 + i64::from(argsz_delta)).max(0) as u32;
            let mut p = le32s(&[argsz, flags, index, start, count]);
            p.extend_from_slice(&data[..data.len().min(64)]);
            c.send(cmd::DEVICE_SET_IRQS, 0, &p, &fds);
        }
        Msg::RegionRead {
            index,
            offset,
            count,
        } => {
            let mut p = offset.to_le_bytes().to_vec();
            p.extend_from_slice(&le32s(&[index, count]));
            c.send(cmd::REGION_READ, 0, &p, &[]);
        }
        Msg::RegionWrite {
            index,
            offset,
            data,
            posted,
        } => {
            c.region_write(index, offset, &data[..data.len().min(8192)], posted);
        }
        Msg::Bar0 {
            offset,
            value,
            posted,
        } => {
            c.region_write(0, u64::from(offset % 0x4000), &value.to_le_bytes(), posted);
        }
        Msg::EnableNvme { qsize_z } => {
            let q = u32::from(qsize_z.max(1));
            c.admin_entries = q + 1;
            c.admin_tail = 0;
            let _ = rustix::io::pwrite(&c.ram, &[0u8; 4096], ACQ);
            c.region_write(0, 0x14, &0u32.to_le_bytes(), true);
            c.region_write(0, 0x24, &(q | (q << 16)).to_le_bytes(), true);
            c.region_write(0, 0x28, &ASQ.to_le_bytes(), true);
            c.region_write(0, 0x30, &ACQ.to_le_bytes(), true);
            c.region_write(0, 0x14, &0x0046_0001u32.to_le_bytes(), false);
        }
        Msg::Guest { offset, bytes } => {
            c.guest_write(u64::from(offset), &bytes[..bytes.len().min(8192)])
        }
        Msg::AdminCmd { slot, sqe } => {
            let slot = u64::from(slot % 64);
            c.guest_write(ASQ + slot * 64, &sqe);
            c.admin_tail = (slot as u32 + 1) % 64;
            c.region_write(0, 0x1000, &c.admin_tail.to_le_bytes(), true);
        }
        Msg::Reset => c.send(cmd::DEVICE_RESET, 0, &[], &[]),
        Msg::Raw {
            command,
            flags,
            msg_id,
            size_delta,
            payload,
            fds,
        } => {
            let payload = &payload[..payload.len().min(8192)];
            let size = (HEADER_SIZE + payload.len()) as i64 + i64::from(size_delta);
            let h = Header {
                msg_id,
                command,
                msg_size: size.clamp(0, i64::from(u32::MAX)) as u32,
                flags,
                error: 0,
            };
            let mut bytes = h.as_bytes().to_vec();
            bytes.extend_from_slice(payload);
            c.send_raw(&bytes, &fds);
        }
        Msg::Bytes(b) => c.send_raw(&b[..b.len().min(8192)], &[]),
        Msg::Pause { micros } => {
            std::thread::sleep(Duration::from_micros(u64::from(micros % 2000)))
        }
    }
}

fn ext(c: &mut Client, e: Ext) {
    match e {
        Ext::Truncate { which, half, kick } => {
            if !c.kept.is_empty() {
                let (fd, len) = &c.kept[usize::from(which) % c.kept.len()];
                let _ = rustix::fs::ftruncate(fd, if half { len / 2 } else { 0 });
            }
            if kick {
                // Identify Controller (CNS 1) into the last page of the RAM.
                let mut sqe = [0u8; 64];
                sqe[0] = 0x06;
                sqe[2..4].copy_from_slice(&c.next_id.to_le_bytes());
                sqe[24..32].copy_from_slice(&(RAM - 4096).to_le_bytes());
                sqe[40] = 1;
                c.admin(&sqe);
            }
        }
        Ext::Fds(fds) => {
            c.pending = fds;
            c.pending.truncate(20);
        }
    }
}
