//! Memory a device shares with its client: a memfd the server maps and
//! offers in a region's sparse-mmap areas (GET_REGION_INFO passes the fd;
//! offset in the fd == offset in the region). The client's writes land in
//! the server's mapping without a message — e.g. NVMe doorbells polled by
//! the controller (mmap-poll mode).
//!
//! The client gets the fd itself, so it could ftruncate it and make our
//! accesses fault (SIGBUS). The memfd is sealed against resizing once sized,
//! so it cannot: the client's ftruncate fails with EPERM.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::fs::{fcntl_add_seals, ftruncate, memfd_create, MemfdFlags, SealFlags};
use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};

/// A memfd of `len` bytes mapped shared, read-write, for the server's
/// lifetime. Accessed only with aligned atomic dwords, because the client
/// writes it concurrently.
#[derive(Debug)]
pub struct SharedRegion {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by this value and only accessed through
// atomics (`load_u32`/`store_u32`), which are safe from any thread.
unsafe impl Send for SharedRegion {}
// SAFETY: as above: every access is an atomic on an aligned, in-bounds dword.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// Creates a zeroed memfd named `name` of `len` bytes (rounded up to a
    /// whole page by the kernel for mapping), seals its size and maps it.
    pub fn new(name: &str, len: usize) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let fd = memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        ftruncate(&fd, len as u64)?;
        // Nobody, the client included, can resize it now, nor lift the seals.
        fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        // SAFETY: a fresh shared mapping of our own memfd at an address the
        // kernel chooses, so no existing memory is affected; it lives until
        // `Drop` unmaps it, and the fd is `len` bytes long for good (sealed).
        let ptr = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd.as_fd(),
                0,
            )
        }?;
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        Ok(Self { fd, ptr, len })
    }

    /// The memfd, for GET_REGION_INFO (offset 0 of the fd is offset 0 of
    /// the region).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn dword(&self, offset: usize) -> Option<&AtomicU32> {
        if !offset.is_multiple_of(4) || offset.checked_add(4)? > self.len {
            return None;
        }
        // SAFETY: `offset + 4 <= len`, so the dword is inside the mapping,
        // which lives as long as `self`; it is 4-byte aligned (the mapping
        // is page aligned and `offset` a multiple of 4); all accesses to it
        // here are atomic, and the client's concurrent writes are plain
        // aligned stores of the same size, so no torn values are observed.
        Some(unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(offset).cast()) })
    }

    /// The little-endian dword at `offset` (acquire); 0 if out of range or
    /// unaligned.
    pub fn load_u32(&self, offset: usize) -> u32 {
        self.dword(offset)
            .map_or(0, |d| u32::from_le(d.load(Ordering::Acquire)))
    }

    /// Stores the little-endian dword at `offset` (release); ignored if out
    /// of range or unaligned.
    pub fn store_u32(&self, offset: usize, value: u32) {
        if let Some(d) = self.dword(offset) {
            d.store(value.to_le(), Ordering::Release);
        }
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are the mapping made in `new`, unmapped once;
        // no reference into it outlives `self` (`dword` borrows `self`).
        if let Err(e) = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) } {
            tracing::error!("munmap of a shared region failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_mapping_of_the_fd_sees_the_same_dwords() {
        let r = SharedRegion::new("test", 0x2000).unwrap();
        // The client's view: map the fd again.
        let other = {
            let fd = rustix::io::dup(r.fd()).unwrap();
            let len = r.len();
            // SAFETY: a fresh shared mapping of the test's own memfd.
            let p = unsafe {
                mmap(
                    std::ptr::null_mut(),
                    len,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::SHARED,
                    fd.as_fd(),
                    0,
                )
            }
            .unwrap();
            (p, len)
        };
        // SAFETY: offset 0x1008 is inside the fresh 0x2000-byte mapping and
        // aligned; nothing else accesses it non-atomically.
        let client = unsafe { AtomicU32::from_ptr(other.0.cast::<u8>().add(0x1008).cast()) };
        client.store(7u32.to_le(), Ordering::Release);
        assert_eq!(r.load_u32(0x1008), 7);
        r.store_u32(0x100c, 9);
        // SAFETY: as above, for 0x100c.
        let head = unsafe { AtomicU32::from_ptr(other.0.cast::<u8>().add(0x100c).cast()) };
        assert_eq!(u32::from_le(head.load(Ordering::Acquire)), 9);
        assert_eq!(r.load_u32(0x2000), 0, "out of range");
        assert_eq!(r.load_u32(0x1001), 0, "unaligned");
        r.store_u32(0x1ffe, 1);
        // SAFETY: the test's own mapping, unmapped once.
        unsafe { munmap(other.0, other.1) }.unwrap();
    }

    #[test]
    fn the_client_cannot_resize_the_fd() {
        let r = SharedRegion::new("test", 0x2000).unwrap();
        let client = rustix::io::dup(r.fd()).unwrap();
        assert_eq!(ftruncate(&client, 0), Err(rustix::io::Errno::PERM));
        assert_eq!(ftruncate(&client, 0x1000), Err(rustix::io::Errno::PERM));
        assert_eq!(ftruncate(&client, 0x4000), Err(rustix::io::Errno::PERM));
        // Nor lift the seals.
        assert_eq!(
            fcntl_add_seals(&client, SealFlags::WRITE),
            Err(rustix::io::Errno::PERM)
        );
        r.store_u32(0x1ffc, 5);
        assert_eq!(r.load_u32(0x1ffc), 5);
    }
}
