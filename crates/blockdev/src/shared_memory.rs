//! The memory a `ram` namespace's data lives in: a memfd mapped shared,
//! so the fd can be passed to another process (a live upgrade's new
//! process, a supervisor that outlives a crash) which maps the same pages.
//! The memfd is sparse: a page takes memory when first written, and
//! [`SharedMemory::punch`] gives a range back to the kernel.
//!
//! The memfd is sealed against shrinking (`F_SEAL_SHRINK`), so no process
//! can cut the file under a mapping of it (an access past a file's end is a
//! SIGBUS); one handed to us must carry that seal and be at least as long
//! as the namespace, or it is refused ([`SharedMemoryError`]).
//!
//! The mapping is shared with other processes, but only one serves the
//! namespace at a time (an upgrade's old process has stopped its workers
//! before the new one maps it; a crashed one is dead), so within this
//! process the caller's locks are all that order accesses: the unsafe
//! accessors below ask the caller to hold them.
#![allow(unsafe_code)]

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{FallocateFlags, MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// A memfd mapped read-write and shared, for its whole length.
#[derive(Debug)]
pub(crate) struct SharedMemory {
    fd: OwnedFd,
    /// The mapping's start (dangling when `len` is 0: nothing is mapped).
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping stays valid as long as the value (unmapped in Drop
// only); the accessors' callers order accesses from several threads.
unsafe impl Send for SharedMemory {}
// SAFETY: as for Send: `&self` accessors that read or write the memory are
// unsafe and require the caller's lock over the bytes they touch.
unsafe impl Sync for SharedMemory {}

/// A memfd that cannot serve as a namespace's memory.
#[derive(Debug, thiserror::Error)]
pub enum SharedMemoryError {
    #[error("making the memory (memfd_create, ftruncate, mmap)")]
    Io(#[source] std::io::Error),
    #[error(
        "the fd handed for the namespace's memory is not a memfd sealed against shrinking \
         (seals: {0}): its file could be cut under the mapping"
    )]
    NotSealed(String),
    #[error(
        "the memfd handed for the namespace's memory is {actual} bytes, the namespace {needed}: \
         not this namespace's memory"
    )]
    TooSmall { actual: u64, needed: u64 },
}

impl SharedMemory {
    /// A new memfd of `len` bytes (all holes: reads zeroes, costs nothing
    /// until written), sealed against shrinking, mapped.
    pub(crate) fn create(len: u64) -> Result<Self, SharedMemoryError> {
        let fd =
            rustix::fs::memfd_create("vnvme-ram", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
                .map_err(|e| SharedMemoryError::Io(e.into()))?;
        rustix::fs::ftruncate(&fd, len).map_err(|e| SharedMemoryError::Io(e.into()))?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK)
            .map_err(|e| SharedMemoryError::Io(e.into()))?;
        Self::map(fd, len)
    }

    /// Maps `fd`, handed by another process, for a namespace of `len`
    /// bytes: refused unless it is a memfd sealed against shrinking and at
    /// least `len` bytes long (only the first `len` are mapped).
    pub(crate) fn adopt(fd: OwnedFd, len: u64) -> Result<Self, SharedMemoryError> {
        // Only a memfd (or a tmpfs/hugetlbfs file made with sealing) has
        // seals; any other fd answers EINVAL.
        let seals = rustix::fs::fcntl_get_seals(&fd)
            .map_err(|e| SharedMemoryError::NotSealed(format!("none ({e})")))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(SharedMemoryError::NotSealed(format!("{seals:?}")));
        }
        let actual = rustix::fs::fstat(&fd)
            .map_err(|e| SharedMemoryError::Io(e.into()))?
            .st_size;
        let actual = u64::try_from(actual).unwrap_or(0);
        if actual < len {
            return Err(SharedMemoryError::TooSmall {
                actual,
                needed: len,
            });
        }
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: u64) -> Result<Self, SharedMemoryError> {
        let len =
            usize::try_from(len).map_err(|e| SharedMemoryError::Io(std::io::Error::other(e)))?;
        if len == 0 {
            return Ok(Self {
                fd,
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                len,
            });
        }
        // SAFETY: a new mapping at an address the kernel picks overlaps
        // nothing of ours; the file is at least `len` bytes and sealed
        // against shrinking, so every byte of the mapping stays backed.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(|e| SharedMemoryError::Io(e.into()))?;
        Ok(Self {
            fd,
            ptr: ptr.cast(),
            len,
        })
    }

    /// The memfd, to pass to another process.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Bytes `at..at + len`, or `None` past the end.
    ///
    /// # Safety
    /// Nothing writes these bytes while the slice lives (the caller holds
    /// the lock that orders the writers).
    pub(crate) unsafe fn bytes(&self, at: usize, len: usize) -> Option<&[u8]> {
        let end = at.checked_add(len).filter(|&e| e <= self.len)?;
        // SAFETY: `at..end` lies in the mapping, which lives as long as
        // `self`; no writer meanwhile (the caller's promise).
        Some(unsafe { std::slice::from_raw_parts(self.ptr.add(at), end - at) })
    }

    /// Bytes `at..at + len` to write, or `None` past the end.
    ///
    /// # Safety
    /// Nothing else reads or writes these bytes while the slice lives (the
    /// caller holds the lock over them exclusively).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes_mut(&self, at: usize, len: usize) -> Option<&mut [u8]> {
        let end = at.checked_add(len).filter(|&e| e <= self.len)?;
        // SAFETY: as in `bytes`, and the caller's access is exclusive.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), end - at) })
    }

    /// Gives bytes `at..at + len` back to the kernel: they read as zeroes
    /// and cost no memory (a discard of whole chunks; a syscall, off the
    /// read and write path).
    pub(crate) fn punch(&self, at: u64, len: u64) -> std::io::Result<()> {
        rustix::fs::fallocate(
            &self.fd,
            FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
            at,
            len,
        )?;
        Ok(())
    }

    /// The ranges of the first `len` bytes that hold data (not holes),
    /// start and end: what a process that adopts the memfd learns of what
    /// was written. If the kernel cannot say, all of it.
    pub(crate) fn data_extents(&self, len: u64) -> Vec<(u64, u64)> {
        use rustix::fs::SeekFrom;
        let mut extents = Vec::new();
        let mut at = 0;
        while at < len {
            let start = match rustix::fs::seek(&self.fd, SeekFrom::Data(at)) {
                Ok(s) => s,
                // No data from `at` to the end.
                Err(rustix::io::Errno::NXIO) => break,
                Err(_) => return vec![(0, len)],
            };
            if start >= len {
                break;
            }
            let end = match rustix::fs::seek(&self.fd, SeekFrom::Hole(start)) {
                Ok(e) => e.min(len),
                Err(_) => return vec![(0, len)],
            };
            extents.push((start, end));
            at = end.max(start + 1);
        }
        extents
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the mapping made in `map`, unmapped once; no slice
            // from the accessors outlives `self`.
            let _ = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) };
        }
    }
}
