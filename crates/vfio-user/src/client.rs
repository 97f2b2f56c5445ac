//! The client side, as a VMM (or our user-space driver) uses a vfio-user device.
//!
//! Send + Sync: any number of threads may call in at once. Each message goes
//! out whole under the connection's send lock, and a thread waiting for its
//! reply also answers the DMA_READ/DMA_WRITE requests the server sends
//! meanwhile. Once a map without an fd exists, a background thread answers
//! those requests while no caller is waiting.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use zerocopy::IntoBytes;

use crate::conn::{
    error_header, reply_header, Conn, Message, Wanted, MAX_DATA_XFER_SIZE, MAX_MSG_FDS,
    MESSAGE_TIMEOUT,
};
use crate::version::parse_version_caps;
use crate::wire::*;
use crate::{DeviceInfo, Error, IrqInfo, RegionInfo, SparseArea};

/// Largest region info reply we are willing to fetch.
const MAX_REGION_INFO_SIZE: u32 = 64 * 1024;

/// A map without an fd, served from our own memory.
#[derive(Debug)]
struct LocalMap {
    iova: u64,
    backing: Arc<Mutex<Vec<u8>>>,
}

#[derive(Debug)]
struct Inner {
    conn: Arc<Conn>,
    local_maps: Mutex<Vec<LocalMap>>,
    /// The server's `max_msg_fds` and `max_data_xfer_size`.
    server_max_fds: usize,
    server_max_xfer: usize,
}

/// A vfio-user client connection.
#[derive(Debug)]
pub struct Client {
    inner: Arc<Inner>,
    responder: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.inner.conn.shutdown();
        if let Some(h) = self.responder.lock().take() {
            let _ = h.join();
        }
    }
}

impl Client {
    pub fn connect(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::from_stream(UnixStream::connect(path)?)
    }

    /// Takes a connected stream and negotiates VERSION.
    pub fn from_stream(stream: UnixStream) -> Result<Self, Error> {
        let conn = Arc::new(Conn::new(stream, MESSAGE_TIMEOUT)?);
        let caps = serde_json::json!({
            "capabilities": {
                "max_msg_fds": MAX_MSG_FDS,
                "max_data_xfer_size": MAX_DATA_XFER_SIZE,
                "pgsizes": 4096,
            }
        });
        let mut payload = Version { major: 0, minor: 0 }.as_bytes().to_vec();
        payload.extend_from_slice(caps.to_string().as_bytes());
        payload.push(0);
        let pre = Inner {
            conn,
            local_maps: Mutex::new(Vec::new()),
            server_max_fds: 1,
            server_max_xfer: 4096,
        };
        let reply = match pre.call(cmd::VERSION, 0, &[&payload], &[]) {
            Err(Error::Remote { errno, .. }) if errno == libc::EBUSY => return Err(Error::Busy),
            r => r?,
        };
        let v = read_prefix::<Version>(&reply.payload)
            .ok_or_else(|| Error::Protocol("short VERSION reply".into()))?;
        if v.major != 0 {
            return Err(Error::Protocol(format!(
                "server speaks version {}.{}",
                v.major, v.minor
            )));
        }
        let server = parse_version_caps(&reply.payload[size_of::<Version>()..])
            // The errno is always EINVAL; the parser traces what was wrong.
            .map_err(|_| Error::Protocol("malformed VERSION capabilities".into()))?;
        let inner = Inner {
            server_max_fds: server.max_msg_fds.clamp(1, MAX_MSG_FDS),
            server_max_xfer: server.max_data_xfer_size.max(4),
            ..pre
        };
        Ok(Self {
            inner: Arc::new(inner),
            responder: Mutex::new(None),
        })
    }

    /// Replies the server sent that answered no message waiting for one
    /// (dropped): a server answering a message twice shows here.
    pub fn unexpected_replies(&self) -> u64 {
        self.inner.conn.unexpected_replies()
    }

    pub fn device_info(&self) -> Result<DeviceInfo, Error> {
        let req = DeviceInfoWire {
            argsz: size_of::<DeviceInfoWire>() as u32,
            ..Default::default()
        };
        let reply = self
            .inner
            .call(cmd::DEVICE_GET_INFO, 0, &[req.as_bytes()], &[])?;
        let w = read_prefix::<DeviceInfoWire>(&reply.payload)
            .ok_or_else(|| Error::Protocol("short DEVICE_GET_INFO reply".into()))?;
        Ok(DeviceInfo {
            flags: w.flags,
            num_regions: w.num_regions,
            num_irqs: w.num_irqs,
        })
    }

    /// The region's info and, if it is mmappable, the fd to map it from.
    pub fn region_info(&self, index: u32) -> Result<(RegionInfo, Option<OwnedFd>), Error> {
        let mut argsz = size_of::<RegionInfoWire>() as u32;
        loop {
            let req = RegionInfoWire {
                argsz,
                index,
                ..Default::default()
            };
            let mut reply =
                self.inner
                    .call(cmd::DEVICE_GET_REGION_INFO, 0, &[req.as_bytes()], &[])?;
            let w = read_prefix::<RegionInfoWire>(&reply.payload)
                .ok_or_else(|| Error::Protocol("short DEVICE_GET_REGION_INFO reply".into()))?;
            if w.argsz > argsz && (reply.payload.len() as u64) < u64::from(w.argsz) {
                if w.argsz > MAX_REGION_INFO_SIZE {
                    return Err(Error::Protocol(format!("region info of {} bytes", w.argsz)));
                }
                argsz = w.argsz;
                continue;
            }
            let sparse_areas = if w.flags & VFIO_REGION_INFO_FLAG_CAPS != 0 {
                parse_sparse_areas(&reply.payload, w.cap_offset)
            } else {
                Vec::new()
            };
            let info = RegionInfo {
                flags: w.flags,
                size: w.size,
                sparse_areas,
            };
            return Ok((info, reply.fds.pop()));
        }
    }

    pub fn region_read(&self, index: u32, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
        let mut off = offset;
        for chunk in buf.chunks_mut(self.inner.server_max_xfer) {
            let count = chunk.len() as u32;
            let req = RegionAccess {
                offset: off,
                region: index,
                count,
            };
            let reply = self
                .inner
                .call(cmd::REGION_READ, 0, &[req.as_bytes()], &[])?;
            let data = reply
                .payload
                .get(size_of::<RegionAccess>()..size_of::<RegionAccess>() + chunk.len())
                .ok_or_else(|| Error::Protocol("short REGION_READ reply".into()))?;
            chunk.copy_from_slice(data);
            off = off.wrapping_add(u64::from(count));
        }
        Ok(())
    }

    /// REGION_WRITE, waiting for the reply.
    pub fn region_write(&self, index: u32, offset: u64, data: &[u8]) -> Result<(), Error> {
        self.write_chunks(index, offset, data, false)
    }

    /// REGION_WRITE with NO_REPLY, as QEMU posts BAR writes. Errors on the
    /// server side are not reported.
    pub fn region_write_posted(&self, index: u32, offset: u64, data: &[u8]) -> Result<(), Error> {
        self.write_chunks(index, offset, data, true)
    }

    fn write_chunks(
        &self,
        index: u32,
        offset: u64,
        data: &[u8],
        posted: bool,
    ) -> Result<(), Error> {
        let mut off = offset;
        for chunk in data.chunks(self.inner.server_max_xfer) {
            let req = RegionAccess {
                offset: off,
                region: index,
                count: chunk.len() as u32,
            };
            if posted {
                self.inner
                    .post(cmd::REGION_WRITE, &[req.as_bytes(), chunk])?;
            } else {
                self.inner
                    .call(cmd::REGION_WRITE, 0, &[req.as_bytes(), chunk], &[])?;
            }
            off = off.wrapping_add(chunk.len() as u64);
        }
        Ok(())
    }

    /// DMA_MAP of `size` bytes of `fd` from `file_offset`, readable, and
    /// writable if asked.
    pub fn dma_map(
        &self,
        iova: u64,
        size: u64,
        fd: BorrowedFd<'_>,
        file_offset: u64,
        writable: bool,
    ) -> Result<(), Error> {
        let flags = DMA_MAP_FLAG_READ | if writable { DMA_MAP_FLAG_WRITE } else { 0 };
        let req = DmaMap {
            argsz: size_of::<DmaMap>() as u32,
            flags,
            offset: file_offset,
            address: iova,
            size,
        };
        self.inner
            .call(cmd::DMA_MAP, 0, &[req.as_bytes()], &[fd])
            .map(|_| ())
    }

    /// DMA_MAP without an fd: the server reaches `backing` (at `iova`) with
    /// DMA_READ/DMA_WRITE, which this client answers.
    pub fn dma_map_without_fd(&self, iova: u64, backing: Arc<Mutex<Vec<u8>>>) -> Result<(), Error> {
        let size = backing.lock().len() as u64;
        self.ensure_responder()?;
        // Registered first: the server may access it before its reply arrives.
        self.inner
            .local_maps
            .lock()
            .push(LocalMap { iova, backing });
        let flags = DMA_MAP_FLAG_READ | DMA_MAP_FLAG_WRITE;
        let req = DmaMap {
            argsz: size_of::<DmaMap>() as u32,
            flags,
            offset: 0,
            address: iova,
            size,
        };
        let r = self.inner.call(cmd::DMA_MAP, 0, &[req.as_bytes()], &[]);
        if r.is_err() {
            self.inner.local_maps.lock().retain(|m| m.iova != iova);
        }
        r.map(|_| ())
    }

    pub fn dma_unmap(&self, iova: u64, size: u64) -> Result<(), Error> {
        self.unmap(iova, size, &[])
    }

    /// DMA_UNMAP carrying the fd the range was mapped from, as SPDK's NVMe
    /// host sends it. The protocol gives the fd no meaning; a server must
    /// accept it (libvfio-user closes it).
    pub fn dma_unmap_with_fd(&self, iova: u64, size: u64, fd: BorrowedFd<'_>) -> Result<(), Error> {
        self.unmap(iova, size, &[fd])
    }

    fn unmap(&self, iova: u64, size: u64, fds: &[BorrowedFd<'_>]) -> Result<(), Error> {
        let req = DmaUnmap {
            argsz: size_of::<DmaUnmap>() as u32,
            flags: 0,
            address: iova,
            size,
        };
        self.inner.call(cmd::DMA_UNMAP, 0, &[req.as_bytes()], fds)?;
        self.inner.local_maps.lock().retain(|m| m.iova != iova);
        Ok(())
    }

    pub fn irq_info(&self, index: u32) -> Result<IrqInfo, Error> {
        let req = IrqInfoWire {
            argsz: size_of::<IrqInfoWire>() as u32,
            index,
            ..Default::default()
        };
        let reply = self
            .inner
            .call(cmd::DEVICE_GET_IRQ_INFO, 0, &[req.as_bytes()], &[])?;
        let w = read_prefix::<IrqInfoWire>(&reply.payload)
            .ok_or_else(|| Error::Protocol("short DEVICE_GET_IRQ_INFO reply".into()))?;
        Ok(IrqInfo {
            flags: w.flags,
            count: w.count,
        })
    }

    /// Assigns one eventfd per vector from `start` (ACTION_TRIGGER |
    /// DATA_EVENTFD), in as many messages as the server's fd limit needs.
    pub fn set_irqs_eventfds(
        &self,
        index: u32,
        start: u32,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), Error> {
        let mut vector = start;
        for chunk in fds.chunks(self.inner.server_max_fds) {
            let req = IrqSet {
                argsz: size_of::<IrqSet>() as u32,
                flags: VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER,
                index,
                start: vector,
                count: chunk.len() as u32,
            };
            self.inner
                .call(cmd::DEVICE_SET_IRQS, 0, &[req.as_bytes()], chunk)?;
            vector = vector.saturating_add(chunk.len() as u32);
        }
        Ok(())
    }

    /// Disables every interrupt of `index` (DATA_NONE, count 0).
    pub fn disable_irqs(&self, index: u32) -> Result<(), Error> {
        let req = IrqSet {
            argsz: size_of::<IrqSet>() as u32,
            flags: VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER,
            index,
            start: 0,
            count: 0,
        };
        self.inner
            .call(cmd::DEVICE_SET_IRQS, 0, &[req.as_bytes()], &[])
            .map(|_| ())
    }

    pub fn reset(&self) -> Result<(), Error> {
        self.inner.call(cmd::DEVICE_RESET, 0, &[], &[]).map(|_| ())
    }

    /// Starts the thread that answers DMA requests while no caller waits.
    fn ensure_responder(&self) -> Result<(), Error> {
        let mut slot = self.responder.lock();
        if slot.is_some() {
            return Ok(());
        }
        let inner = self.inner.clone();
        let handle = std::thread::Builder::new()
            .name("vfio-user-client-dma".into())
            .spawn(move || {
                while let Ok(Some(req)) = inner.conn.wait(&Wanted::Request, None) {
                    inner.answer(req);
                }
            })?;
        *slot = Some(handle);
        Ok(())
    }
}

impl Inner {
    /// Sends a command and waits for its reply, answering server requests
    /// that arrive meanwhile. An error reply is `Error::Remote`.
    fn call(
        &self,
        command: u16,
        extra_flags: u32,
        parts: &[&[u8]],
        fds: &[BorrowedFd<'_>],
    ) -> Result<Message, Error> {
        let msg_id = self.conn.next_msg_id();
        let header = Header {
            msg_id,
            command,
            msg_size: 0,
            flags: flags::TYPE_COMMAND | extra_flags,
            error: 0,
        };
        self.conn.expect_reply(msg_id);
        if let Err(e) = self.conn.send(&header, parts, fds) {
            self.conn.forget_reply(msg_id);
            return Err(e);
        }
        loop {
            match self.conn.wait(&Wanted::ReplyOrRequest(msg_id), None) {
                Ok(Some(msg)) if msg.header.is_reply() && msg.header.msg_id == msg_id => {
                    if msg.header.is_error() {
                        return Err(Error::Remote {
                            command,
                            errno: msg.header.error as i32,
                        });
                    }
                    if msg.header.command != command {
                        return Err(Error::Protocol(format!(
                            "reply to command {command} names command {}",
                            msg.header.command
                        )));
                    }
                    return Ok(msg);
                }
                Ok(Some(req)) => self.answer(req),
                Ok(None) => return Err(Error::Timeout),
                Err(e) => {
                    self.conn.forget_reply(msg_id);
                    return Err(e);
                }
            }
        }
    }

    /// Sends a command with NO_REPLY.
    fn post(&self, command: u16, parts: &[&[u8]]) -> Result<(), Error> {
        let header = Header {
            msg_id: self.conn.next_msg_id(),
            command,
            msg_size: 0,
            flags: flags::TYPE_COMMAND | flags::NO_REPLY,
            error: 0,
        };
        self.conn.send(&header, parts, &[])
    }

    /// Answers a request from the server (DMA_READ/DMA_WRITE).
    fn answer(&self, req: Message) {
        let hdr = req.header;
        let result = match hdr.command {
            _ if !req.fds.is_empty() || req.fds_truncated => Err(libc::EINVAL),
            cmd::DMA_READ => self.dma_read(&req.payload),
            cmd::DMA_WRITE => self.dma_write(&req.payload),
            _ => Err(libc::ENOSYS),
        };
        if hdr.no_reply() {
            return;
        }
        let sent = match result {
            Ok(payload) => self.conn.send(&reply_header(&hdr), &[&payload], &[]),
            Err(errno) => self.conn.send(&error_header(&hdr, errno), &[], &[]),
        };
        if let Err(e) = sent {
            tracing::debug!(error = %e, "answering a server request failed");
        }
    }

    /// Runs `f` on the bytes of a local map covering `[addr, addr + count)`.
    fn with_local<R>(
        &self,
        addr: u64,
        count: u64,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, i32> {
        let backing = {
            let maps = self.local_maps.lock();
            let m = maps
                .iter()
                .find(|m| addr >= m.iova && addr - m.iova < m.backing.lock().len() as u64)
                .ok_or(libc::EFAULT)?;
            (m.iova, m.backing.clone())
        };
        let mut mem = backing.1.lock();
        // An offset or count no usize holds is outside any mapping: the
        // errno is the whole answer.
        let start = usize::try_from(addr - backing.0).map_err(|_| libc::EFAULT)?;
        // The same for the count.
        let count = usize::try_from(count).map_err(|_| libc::EFAULT)?;
        let end = start.checked_add(count).ok_or(libc::EFAULT)?;
        let bytes = mem.get_mut(start..end).ok_or(libc::EFAULT)?;
        Ok(f(bytes))
    }

    fn dma_read(&self, payload: &[u8]) -> Result<Vec<u8>, i32> {
        let a = read_prefix::<DmaAccess>(payload).ok_or(libc::EINVAL)?;
        if a.count > MAX_DATA_XFER_SIZE as u64 {
            return Err(libc::E2BIG);
        }
        let mut out = a.as_bytes().to_vec();
        self.with_local(a.address, a.count, |bytes| out.extend_from_slice(bytes))?;
        Ok(out)
    }

    fn dma_write(&self, payload: &[u8]) -> Result<Vec<u8>, i32> {
        let a = read_prefix::<DmaAccess>(payload).ok_or(libc::EINVAL)?;
        let data = &payload[size_of::<DmaAccess>()..];
        if data.len() as u64 != a.count {
            return Err(libc::EINVAL);
        }
        self.with_local(a.address, a.count, |bytes| bytes.copy_from_slice(data))?;
        Ok(a.as_bytes().to_vec())
    }
}

/// Walks a region info capability chain for the sparse mmap areas.
fn parse_sparse_areas(payload: &[u8], first: u32) -> Vec<SparseArea> {
    let mut areas = Vec::new();
    let mut off = first as usize;
    // A hostile chain may loop: follow forward links only, a bounded number.
    for _ in 0..16 {
        let Some(cap) = payload.get(off..).and_then(read_prefix::<CapHeader>) else {
            break;
        };
        if cap.id == VFIO_REGION_INFO_CAP_SPARSE_MMAP && cap.version == 1 {
            let body = off + size_of::<CapHeader>();
            if let Some(sm) = payload.get(body..).and_then(read_prefix::<SparseMmapWire>) {
                let mut p = body + size_of::<SparseMmapWire>();
                for _ in 0..sm.nr_areas.min(1024) {
                    let Some(a) = payload.get(p..).and_then(read_prefix::<SparseAreaWire>) else {
                        break;
                    };
                    areas.push(SparseArea {
                        offset: a.offset,
                        size: a.size,
                    });
                    p += size_of::<SparseAreaWire>();
                }
            }
        }
        let next = cap.next as usize;
        if next == 0 || next <= off {
            break;
        }
        off = next;
    }
    areas
}
