//! The vfio-user server with the NVMe device behind it, fed a message stream
//! over a socketpair: well-formed messages with hostile fields, raw headers
//! with any size and flags, bytes that break the framing, and fds (memfds
//! for DMA_MAP, eventfds for SET_IRQS, or the wrong kind where unexpected).
//!
//! The harness also plays a guest: it can write SQEs and PRP lists into its
//! memfd "RAM" and drive the controller through REGION_WRITEs, so inputs
//! reach the I/O path and DMA_UNMAP can race in-flight commands. A reader
//! thread drains replies and answers the server's DMA_READ/DMA_WRITE (or
//! fails them). Every input must end with the server returning within
//! [`DEADLINE`] of the client closing: anything else is a hang (panic).

use std::io::{IoSlice, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::Duration;

use arbitrary::Arbitrary;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use vnvme::device::{DeviceOptions, NvmeDevice};
use vnvme::namespace::NamespaceSpec;
use vnvme_controller::DoorbellMode;
use vnvme_vfio_user::wire::{cmd, flags, DmaAccess, Header, HEADER_SIZE};
use vnvme_vfio_user::Server;
use zerocopy::{FromBytes, IntoBytes};

/// How long the server may take to finish after the client has gone.
const DEADLINE: Duration = Duration::from_secs(20);
/// Size of the guest RAM memfd.
const RAM: u64 = 1 << 20;
const ASQ: u64 = 0x1000;
const ACQ: u64 = 0x2000;

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Fd {
    /// A memfd of `pages` 4 KiB pages (the guest RAM when `pages == 0`).
    Memfd {
        pages: u8,
    },
    Eventfd,
    /// A pipe end: not mappable, not an eventfd.
    Pipe,
}

#[derive(Arbitrary, Debug)]
pub enum Msg {
    Version {
        major: u16,
        minor: u16,
        json: Vec<u8>,
        nul: bool,
    },
    /// VERSION with sane capabilities (most inputs start with it).
    Hello,
    DmaMap {
        iova: u64,
        size: u64,
        offset: u64,
        flags: u32,
        argsz_delta: i8,
        fd: Option<Fd>,
    },
    /// The guest RAM memfd mapped at `iova_page * 4 KiB` (`size` pages, 0 = all).
    MapRam {
        iova_page: u16,
        size_pages: u8,
        writable: bool,
    },
    DmaUnmap {
        iova: u64,
        size: u64,
        flags: u32,
        argsz: u32,
    },
    /// Unmap what `MapRam` mapped.
    UnmapRam {
        iova_page: u16,
        size_pages: u8,
    },
    GetInfo {
        argsz: u32,
    },
    GetRegionInfo {
        argsz: u32,
        index: u32,
        short: u8,
    },
    GetIrqInfo {
        argsz: u32,
        index: u32,
    },
    SetIrqs {
        argsz_delta: i8,
        flags: u32,
        index: u32,
        start: u32,
        count: u32,
        fds: Vec<Fd>,
        data: Vec<u8>,
    },
    RegionRead {
        index: u32,
        offset: u64,
        count: u32,
    },
    RegionWrite {
        index: u32,
        offset: u64,
        data: Vec<u8>,
        posted: bool,
    },
    /// A 4-byte BAR0 register or doorbell write (0..0x4000).
    Bar0 {
        offset: u16,
        value: u32,
        posted: bool,
    },
    /// Admin queue at ASQ/ACQ, CC.EN = 1.
    EnableNvme {
        qsize_z: u8,
    },
    /// Bytes into guest RAM (SQEs, PRP lists, data).
    Guest {
        offset: u32,
        bytes: Vec<u8>,
    },
    /// An SQE into admin SQ slot `slot` and the tail doorbell set past it.
    AdminCmd {
        slot: u8,
        sqe: [u8; 64],
    },
    Reset,
    /// Any header and payload, any fds.
    Raw {
        command: u16,
        flags: u32,
        msg_id: u16,
        size_delta: i32,
        payload: Vec<u8>,
        fds: Vec<Fd>,
    },
    /// Bytes straight into the stream (framing abuse).
    Bytes(Vec<u8>),
    Pause {
        micros: u16,
    },
}

#[derive(Arbitrary, Debug)]
pub struct Input {
    pub mode: u8,
    /// Answer the server's DMA_READ/DMA_WRITE (else fail them with EFAULT).
    pub answer_dma: bool,
    pub msgs: Vec<Msg>,
}

struct Client {
    sock: UnixStream,
    ram: OwnedFd,
    next_id: u16,
    broken: bool,
}

impl Client {
    fn make_fd(&self, f: Fd) -> Option<OwnedFd> {
        match f {
            Fd::Memfd { pages: 0 } => rustix::io::dup(&self.ram).ok(),
            Fd::Memfd { pages } => {
                let fd = rustix::fs::memfd_create("fuzz", rustix::fs::MemfdFlags::CLOEXEC).ok()?;
                rustix::fs::ftruncate(&fd, u64::from(pages) * 4096).ok()?;
                Some(fd)
            }
            Fd::Eventfd => rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).ok(),
            Fd::Pipe => rustix::pipe::pipe().ok().map(|(r, _w)| r),
        }
    }

    fn send_raw(&mut self, bytes: &[u8], fds: &[Fd]) {
        if self.broken {
            return;
        }
        let owned: Vec<OwnedFd> = fds
            .iter()
            .take(20)
            .filter_map(|f| self.make_fd(*f))
            .collect();
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
    let opts = DeviceOptions {
        max_io_queues: 4,
        doorbells: mode(input.mode),
        idle_poll_us: Some(50),
        ..DeviceOptions::default()
    };
    let ns: NamespaceSpec = "1M:ram".parse().expect("namespace spec");
    let device = NvmeDevice::new(&opts, &[ns]).expect("device");
    let (client_end, server_end) = UnixStream::pair().expect("socketpair");
    let (done_tx, done_rx) = mpsc::channel();
    let server = std::thread::spawn(move || {
        let mut server = Server::new(device);
        let _ = server.serve_stream(server_end);
        let _ = done_tx.send(());
    });
    let ram = rustix::fs::memfd_create("ram", rustix::fs::MemfdFlags::CLOEXEC).expect("memfd");
    rustix::fs::ftruncate(&ram, RAM).expect("ftruncate");
    let _ = client_end.set_write_timeout(Some(Duration::from_secs(2)));
    let read_end = client_end.try_clone().expect("clone");
    let answer = input.answer_dma;
    let rd = std::thread::spawn(move || reader(read_end, answer));
    let mut c = Client {
        sock: client_end,
        ram,
        next_id: 0,
        broken: false,
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

fn step(c: &mut Client, m: Msg) {
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
            c.region_write(0, 0x1000, &((slot as u32 + 1) % 64).to_le_bytes(), true);
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
