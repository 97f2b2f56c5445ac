//! Namespace storage backends.
//!
//! A [`BlockDevice`] is a flat array of bytes addressed by byte offset; the
//! controller converts LBAs and checks ranges before calling it, but every
//! backend checks bounds again and never panics.
//!
//! * [`NullDevice`]: reads zeroes, drops writes (a benchmark baseline);
//! * [`RamDevice`]: memory, for the life of the server;
//! * [`FileDevice`]: a regular file or a block device on io_uring, with a
//!   real volatile write cache: [`BlockDevice::flush`] is `fdatasync`,
//!   [`BlockDevice::write_fua`] is durable before it returns;
//! * [`NbdDevice`]: an export of a Network Block Device server, over TCP or
//!   a UNIX socket, with flush, FUA and write-zeroes as NBD commands.
//!
//! # Synchronous and asynchronous
//!
//! [`BlockDevice`] is synchronous: each call completes before it returns,
//! which is exact for the `null` and `ram` backends (a 4 KiB copy is cheaper
//! than any completion machinery). A backend that can keep several requests
//! in flight (the `file` backend, on io_uring) also answers
//! [`BlockDevice::as_async`] with an [`AsyncBlockDevice`], which opens one
//! [`BlockQueue`] per controller queue worker:
//!
//! * [`BlockQueue::submit`] queues a read, write or flush with a token and
//!   returns at once, or gives the request back when the queue is at its
//!   limit (the caller then runs it synchronously);
//!   [`BlockQueue::commit`] starts what was queued (one system call for
//!   a worker's whole pass);
//! * [`BlockQueue::poll`] reaps finished `(token, result)` pairs without
//!   blocking; the queue's [`Waker`] is called, from another thread, when
//!   there may be some to reap, so a worker can sleep meanwhile.
//!
//! A request's [`Data`] is a buffer of its own ([`IoBuf`]) or guest
//! memory mapped in this process ([`MappedBuf`]), which the kernel reads
//! or writes in place: no copy through a buffer of ours. Either way the
//! request owns it until it completes, and a [`MappedBuf`] holds its memory
//! mapped meanwhile, so nothing the guest unmaps is pulled from under the
//! kernel.
//!
//! # Unsafe code
//!
//! Denied everywhere but the io_uring module (`uring`), where submitting an
//! operation that points at a buffer is `unsafe` (the buffer must outlive
//! the operation), and `mapped`, whose copies go to and from memory known
//! only by its address.
#![deny(unsafe_code)]

mod buf;
mod file;
#[cfg(any(test, feature = "testing"))]
pub mod held;
mod mapped;
mod nbd;
mod null;
mod ram;
mod shared_memory;
mod uring;

pub use buf::{IoBuf, ALIGN};
pub use file::{FileCounters, FileDevice, FileError};
pub use mapped::{Data, MappedBuf};
// The promise a pin of guest memory makes, shared with vfio-user's DMA
// space, which implements it.
pub use nbd::{
    Address as NbdAddress, NbdDevice, NbdError, NbdUri, OpenError as NbdOpenError,
    ProtocolError as NbdProtocolError, Timeouts as NbdTimeouts, UriError as NbdUriError,
};
pub use null::NullDevice;
pub use ram::RamDevice;
pub use shared_memory::SharedMemoryError;
#[cfg(any(test, feature = "testing"))]
pub use uring::SubmitFault;
pub use vnvme_memory::{MappedMemory, Region};

/// A backend failure. Guest-visible as an NVMe media or internal error.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("range {offset:#x}+{len:#x} is past the end of the device ({size:#x} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("backend I/O error")]
    Io(#[source] std::io::Error),
}

/// Checks that `offset..offset+len` lies within `size` bytes.
pub fn check_range(offset: u64, len: u64, size: u64) -> Result<(), BlockError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(BlockError::OutOfRange { offset, len, size }),
    }
}

/// How a read's bytes reach the caller's buffer
/// ([`BlockDevice::read_with`]): the caller can compute something on them
/// (the guard of protection information) in the very copy that reads the
/// media, which is then read once.
pub trait ReadFill {
    /// `dst` gets `src`: the next `src.len()` bytes of the read.
    fn copy(&mut self, src: &[u8], dst: &mut [u8]);
    /// The next `buf.len()` bytes of the read are in `buf` already.
    fn filled(&mut self, buf: &[u8]);
}

/// The fill of a plain read: copies, and sees nothing.
pub(crate) struct CopyOnly;

impl ReadFill for CopyOnly {
    fn copy(&mut self, src: &[u8], dst: &mut [u8]) {
        dst.copy_from_slice(src);
    }

    fn filled(&mut self, _: &[u8]) {}
}

/// Storage behind one namespace. Shared by all queue workers at once, so
/// implementations synchronise internally (`&self` everywhere).
pub trait BlockDevice: Send + Sync + std::fmt::Debug {
    /// Size in bytes.
    fn size(&self) -> u64;

    /// Whether the device has a volatile write cache (Identify Controller VWC):
    /// writes may be lost on power failure until [`flush`](Self::flush).
    fn volatile_cache(&self) -> bool {
        false
    }

    /// The device keeps no data (a null device, like SPDK's null bdev,
    /// Linux's null_blk and QEMU's null-co): a controller may then move no
    /// data at all for reads and writes, leaving the host's read buffers as
    /// they were, as those do.
    fn moves_no_data(&self) -> bool {
        false
    }

    /// Reads `buf.len()` bytes at byte `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError>;

    /// Reads like [`read`](Self::read), the bytes passing through `fill`
    /// in order. The default reads, then shows `fill` the whole buffer; a
    /// device that holds its data in memory copies it with `fill`.
    fn read_with(
        &self,
        offset: u64,
        buf: &mut [u8],
        fill: &mut dyn ReadFill,
    ) -> Result<(), BlockError> {
        self.read(offset, buf)?;
        fill.filled(buf);
        Ok(())
    }

    /// Writes `buf` at byte `offset`.
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError>;

    /// Writes `buf` at byte `offset`, durably: when this returns `Ok` the
    /// data survives a power failure (NVMe Write with FUA, or any write while
    /// the volatile write cache is disabled). The default writes, then
    /// flushes; backends that can make the one write durable do that instead.
    fn write_fua(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        self.write(offset, buf)?;
        self.flush()
    }

    /// Makes every completed write durable.
    fn flush(&self) -> Result<(), BlockError> {
        Ok(())
    }

    /// Sets `len` bytes at `offset` to zero.
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BlockError>;

    /// Deallocates `len` bytes at `offset` (NVMe Dataset Management
    /// deallocate, TRIM). Afterwards the range reads as zeroes
    /// (Identify Namespace DLFEAT = 001b); backends that cannot free space
    /// write zeroes instead.
    fn discard(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        self.write_zeroes(offset, len)
    }

    /// The asynchronous interface, for backends that have one (io_uring).
    fn as_async(&self) -> Option<&dyn AsyncBlockDevice> {
        None
    }

    /// Power loss: drops every write not yet made durable (by
    /// [`flush`](Self::flush) or [`write_fua`](Self::write_fua)), as a
    /// volatile write cache would lose it. Returns whether this backend
    /// models that (else nothing happens: its writes are durable at once,
    /// or it cannot tell which are not).
    fn power_loss(&self) -> bool {
        false
    }

    /// A new device of `size` bytes holding this one's data up to the
    /// smaller size, the rest zeroes (a namespace resized at run time), for
    /// backends that can make one; `None` for those that cannot. The caller
    /// makes sure nothing writes to this device meanwhile.
    fn resized(&self, size: u64) -> Option<std::sync::Arc<dyn BlockDevice>> {
        let _ = size;
        None
    }

    /// Whether its data outlives this process, so another process can
    /// serve it next (a live upgrade). `ram`'s does if its memfd
    /// ([`BlockDevice::memory_fd`]) is passed on.
    fn outlives_process(&self) -> bool {
        true
    }

    /// The memfd its data lives in (`ram`), which a process that serves it
    /// next must be given ([`RamDevice::adopt`]); `None` for backends whose
    /// data is elsewhere.
    fn memory_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// For a live upgrade: lets another process open this storage while
    /// this one still has it open (`hold` false), or takes it back (true,
    /// the upgrade failed). The `file` backend's lock; nothing for others.
    fn hand_over_lock(&self, hold: bool) -> Result<(), BlockError> {
        let _ = hold;
        Ok(())
    }
}

/// One operation for [`BlockQueue::submit`]. The data travels with the
/// request and comes back in its [`BlockCompletion`].
#[derive(Debug)]
pub enum BlockRequest {
    /// Reads `data.len()` bytes at `offset` into `data`.
    Read { offset: u64, data: Data },
    /// Writes `data` at `offset`; `fua`: durable before completion (see
    /// [`BlockDevice::write_fua`]).
    Write { offset: u64, data: Data, fua: bool },
    /// Makes every completed write durable ([`BlockDevice::flush`]).
    Flush,
}

impl BlockRequest {
    /// Runs the request synchronously on `device` (what an asynchronous
    /// backend does for it, the slow way): its completion under `token`.
    /// Mapped memory is copied through a buffer, as [`BlockDevice`] moves
    /// slices.
    pub fn run_on(self, device: &dyn BlockDevice, token: u64) -> BlockCompletion {
        self.run_with(device, token, None)
    }

    /// [`run_on`](Self::run_on), a read's bytes passing through `fill`
    /// ([`BlockDevice::read_with`]).
    pub fn run_with(
        self,
        device: &dyn BlockDevice,
        token: u64,
        fill: Option<&mut dyn ReadFill>,
    ) -> BlockCompletion {
        let mut copy_only = CopyOnly;
        let fill = fill.unwrap_or(&mut copy_only);
        let (data, result) = match self {
            BlockRequest::Read { offset, data } => {
                let (data, r) = match data {
                    Data::Buf(mut buf) => {
                        let r = device.read_with(offset, &mut buf, fill);
                        (Data::Buf(buf), r)
                    }
                    Data::Mapped(mut mem) => {
                        let mut buf = IoBuf::zeroed(mem.len());
                        let r = device
                            .read_with(offset, &mut buf, fill)
                            .and_then(|()| mem.copy_from(&buf).map_err(BlockError::Io));
                        (Data::Mapped(mem), r)
                    }
                };
                (Some(data), r)
            }
            BlockRequest::Write { offset, data, fua } => {
                let mut bounce = IoBuf::new();
                let bytes = match &data {
                    Data::Buf(buf) => Ok(&buf[..]),
                    Data::Mapped(mem) => {
                        bounce.set_len(mem.len());
                        mem.copy_to(&mut bounce).map(|()| &bounce[..])
                    }
                };
                let r = match bytes {
                    Ok(b) if fua => device.write_fua(offset, b),
                    Ok(b) => device.write(offset, b),
                    Err(e) => Err(BlockError::Io(e)),
                };
                (Some(data), r)
            }
            BlockRequest::Flush => (None, device.flush()),
        };
        BlockCompletion {
            token,
            data,
            result,
        }
    }
}

/// A finished request: the token given to `submit`, the request's data
/// (what was read, for reads) and the result.
#[derive(Debug)]
pub struct BlockCompletion {
    pub token: u64,
    pub data: Option<Data>,
    pub result: Result<(), BlockError>,
}

/// Called from another thread when a [`BlockQueue`] may have completions to
/// reap. It may be called spuriously, and must not block.
pub type Waker = std::sync::Arc<dyn Fn() + Send + Sync>;

/// The asynchronous side of a backend.
pub trait AsyncBlockDevice: Send + Sync {
    /// Opens a submission queue for one thread (a controller queue worker).
    fn queue(&self, waker: Waker) -> Result<Box<dyn BlockQueue>, BlockError>;
}

/// Requests in flight on one backend, for one thread.
///
/// Dropping the queue waits for the requests still in flight (the kernel
/// owns their buffers until then) and discards their results.
pub trait BlockQueue: Send {
    /// Queues `request`; its completion will carry `token`. The backend may
    /// hold it until [`commit`](Self::commit) (or the next
    /// [`poll`](Self::poll)), to start what a caller queued in one go with
    /// one system call. Gives the
    /// request back, unstarted, when the queue has no room for it (too many
    /// requests or bytes in flight, a request too large to send in one
    /// operation, a failed ring): the caller runs it synchronously instead.
    #[allow(clippy::result_large_err)]
    fn submit(&mut self, request: BlockRequest, token: u64) -> Result<(), BlockRequest>;

    /// Starts every request queued since the last commit (the `file`
    /// backend: one `io_uring_enter` for them all). A request that then
    /// fails to start completes with the error, through `poll`.
    fn commit(&mut self) {}

    /// Commits, then appends at most `max` finished requests to `out`
    /// without blocking; returns how many.
    fn poll(&mut self, out: &mut Vec<BlockCompletion>, max: usize) -> usize;

    /// Requests submitted and not yet returned by `poll`.
    fn in_flight(&self) -> usize;

    /// Whether the waker is called for new completions (on when the queue
    /// is opened). A consumer that polls while it is busy turns it off
    /// then, saving a thread wake-up per completion, and back on before it
    /// sleeps, after which it must poll once more: completions that
    /// arrived while it was off do not call the waker.
    fn set_waking(&mut self, _on: bool) {}
}
