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
//!   [`BlockDevice::write_fua`] is durable before it returns.
//!
//! # Synchronous now, asynchronous later
//!
//! The trait is synchronous: each call completes before it returns, which is
//! exact for the `null` and `ram` backends (a 4 KiB copy is cheaper than any
//! completion machinery). The `file` backend implements it with one io_uring
//! submit-and-wait per request (a small pool of rings, one per concurrent
//! caller): one request in flight per queue worker. The next step keeps
//! these methods and adds, for io_uring, [`BlockDevice::as_async`] answering
//! an [`AsyncBlockDevice`]:
//!
//! * `submit(request, token)` queues the operation and returns at once,
//! * `poll(out)` reaps finished `(token, result)` pairs without blocking.
//!
//! The controller's queue worker would ask `as_async()` once per namespace;
//! for synchronous backends (`None`) it completes each command inline, for
//! async ones it keeps the command in flight keyed by token and posts its
//! completion when `poll` returns it. Only the worker's execute step changes.
//!
//! # Unsafe code
//!
//! Denied everywhere but the io_uring module (`uring`), where submitting an
//! operation that points at a buffer is `unsafe`: the buffer must outlive
//! the operation.
#![deny(unsafe_code)]

mod file;
mod null;
mod ram;
mod uring;

pub use file::{FileCounters, FileDevice, FileError};
pub use null::NullDevice;
pub use ram::RamDevice;

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

    /// Reads `buf.len()` bytes at byte `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError>;

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
}

/// One operation for [`AsyncBlockDevice::submit`]. Buffers are owned so they
/// outlive the submission.
#[derive(Debug)]
pub enum BlockRequest {
    Read {
        offset: u64,
        len: usize,
    },
    /// `fua`: durable before completion (see [`BlockDevice::write_fua`]).
    Write {
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    },
    Flush,
    WriteZeroes {
        offset: u64,
        len: u64,
    },
    Discard {
        offset: u64,
        len: u64,
    },
}

/// A finished asynchronous operation: the token given to `submit`, and the
/// data read (for reads) or the error.
#[derive(Debug)]
pub struct BlockCompletion {
    pub token: u64,
    pub result: Result<Vec<u8>, BlockError>,
}

/// The asynchronous side of a backend (reserved: no backend implements it
/// yet; see the crate documentation).
pub trait AsyncBlockDevice: Send + Sync {
    /// Queues `request`; its completion will carry `token`.
    fn submit(&self, request: BlockRequest, token: u64) -> Result<(), BlockError>;
    /// Appends finished operations to `out` without blocking; returns how many.
    fn poll(&self, out: &mut Vec<BlockCompletion>) -> usize;
}
