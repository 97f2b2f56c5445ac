//! io_uring plumbing for the `file` backend: a [`Lane`] is one ring and one
//! aligned bounce buffer; each operation is submitted and waited for.
//!
//! The kernel reads or writes the bounce buffer while an operation is in
//! flight, so the buffer is owned by the lane, never by a caller, and is not
//! moved or freed before the completion is reaped. When a ring fails in a
//! way that leaves it unknown whether an operation is still in flight, the
//! lane is *poisoned* and must be leaked with [`std::mem::forget`]: its ring
//! and buffer then stay alive for as long as the kernel might use them.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, types, IoUring};

/// Alignment of O_DIRECT buffers, offsets and lengths: 4 KiB covers every
/// logical block size in use (512 and 4096) and the page size.
pub(crate) const ALIGN: usize = 4096;

/// Entries per ring: one operation is in flight at a time.
const RING_ENTRIES: u32 = 4;

/// A heap buffer whose usable part starts at an [`ALIGN`] boundary, made
/// without unsafe code: over-allocate, then start at the first aligned byte.
pub(crate) struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    capacity: usize,
}

impl AlignedBuf {
    fn new() -> Self {
        Self {
            storage: Vec::new(),
            start: 0,
            capacity: 0,
        }
    }

    /// Makes room for `len` bytes (rounded up to [`ALIGN`]). Only called
    /// between operations: reallocating moves the buffer.
    fn reserve(&mut self, len: usize) {
        if len <= self.capacity {
            return;
        }
        let capacity = len.div_ceil(ALIGN) * ALIGN;
        self.storage = vec![0u8; capacity + ALIGN];
        self.start = self.storage.as_ptr().align_offset(ALIGN).min(ALIGN);
        self.capacity = capacity;
    }

    pub(crate) fn bytes(&self, len: usize) -> &[u8] {
        self.storage
            .get(self.start..self.start + len.min(self.capacity))
            .unwrap_or_default()
    }

    pub(crate) fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        self.storage
            .get_mut(self.start..self.start + len.min(self.capacity))
            .unwrap_or_default()
    }
}

/// One io_uring operation on the lane's bounce buffer. `at..at+len` is the
/// part of the buffer read into or written from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    Read {
        fd: RawFd,
        offset: u64,
        at: usize,
        len: u32,
    },
    Write {
        fd: RawFd,
        offset: u64,
        at: usize,
        len: u32,
        /// RWF_DSYNC: durable when it completes.
        dsync: bool,
    },
    /// fdatasync (IORING_OP_FSYNC with IORING_FSYNC_DATASYNC).
    Datasync { fd: RawFd },
    Fallocate {
        fd: RawFd,
        offset: u64,
        len: u64,
        mode: i32,
    },
}

/// Why an operation failed.
#[derive(Debug)]
pub(crate) enum LaneError {
    /// The operation ran and failed (its negated errno).
    Op(io::Error),
    /// The ring itself failed: the lane must be leaked, not dropped.
    Poisoned(io::Error),
}

/// A ring and its bounce buffer, used by one caller at a time.
pub(crate) struct Lane {
    ring: IoUring,
    buf: AlignedBuf,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("buffer_capacity", &self.buf.capacity)
            .finish_non_exhaustive()
    }
}

impl Lane {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Self {
            ring: IoUring::new(RING_ENTRIES)?,
            buf: AlignedBuf::new(),
        })
    }

    /// The bounce buffer, with room for at least `len` bytes.
    pub(crate) fn buffer(&mut self, len: usize) -> &mut AlignedBuf {
        self.buf.reserve(len);
        &mut self.buf
    }

    /// Runs `op` and waits for it; returns the operation's non-negative
    /// result (bytes transferred for reads and writes).
    pub(crate) fn run(&mut self, op: Op) -> Result<u32, LaneError> {
        let entry = match op {
            Op::Read {
                fd,
                offset,
                at,
                len,
            } => {
                let buf = self.span(at, len).map_err(LaneError::Op)?;
                opcode::Read::new(types::Fd(fd), buf, len)
                    .offset(offset)
                    .build()
            }
            Op::Write {
                fd,
                offset,
                at,
                len,
                dsync,
            } => {
                let buf = self.span(at, len).map_err(LaneError::Op)?;
                let flags = if dsync { libc::RWF_DSYNC } else { 0 };
                opcode::Write::new(types::Fd(fd), buf.cast_const(), len)
                    .offset(offset)
                    .rw_flags(flags)
                    .build()
            }
            Op::Datasync { fd } => opcode::Fsync::new(types::Fd(fd))
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            Op::Fallocate {
                fd,
                offset,
                len,
                mode,
            } => opcode::Fallocate::new(types::Fd(fd), len)
                .offset(offset)
                .mode(mode)
                .build(),
        };
        // SAFETY: the entry points, if at all, at `self.buf` (`span` checked
        // the range lies inside it). The buffer is not touched, moved or
        // freed until the completion is reaped below: this function returns
        // before that only with `Poisoned`, after which the caller leaks the
        // whole lane (ring and buffer) instead of dropping it. The ring is
        // empty between calls, so the push cannot overwrite a pending entry.
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            return Err(LaneError::Poisoned(io::Error::other(
                "io_uring submission queue unexpectedly full",
            )));
        }
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                    ) =>
                {
                    continue
                }
                Err(e) => return Err(LaneError::Poisoned(e)),
            }
            if let Some(cqe) = self.ring.completion().next() {
                let res = cqe.result();
                return u32::try_from(res)
                    .map_err(|_| LaneError::Op(io::Error::from_raw_os_error(-res)));
            }
        }
    }

    /// A pointer to `at..at+len` of the bounce buffer, checked to lie in it.
    fn span(&mut self, at: usize, len: u32) -> io::Result<*mut u8> {
        let end = at
            .checked_add(len as usize)
            .filter(|&end| end <= self.buf.capacity)
            .ok_or_else(|| io::Error::other("operation past the bounce buffer"))?;
        let whole = self.buf.bytes_mut(end);
        Ok(whole[at..].as_mut_ptr())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffer_starts_on_a_4k_boundary() {
        let mut b = AlignedBuf::new();
        for len in [1, 4096, 5000, 128 * 1024] {
            b.reserve(len);
            assert_eq!(b.bytes(len).as_ptr() as usize % ALIGN, 0, "{len}");
            assert_eq!(b.bytes(len).len(), len);
        }
    }
}
