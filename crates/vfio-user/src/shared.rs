//! Memory shared with another process: a `MAP_SHARED`, read-write mapping
//! of a file the other side maps too, so it changes under our feet. It is
//! never handed out as a Rust reference, only reached through bulk copies
//! into and out of Rust buffers and through atomics; it is unmapped on drop.
//! The one type for it on both sides: the device's doorbell page (a memfd
//! the server maps and offers in a region's sparse-mmap areas:
//! GET_REGION_INFO passes the fd, offset in the fd == offset in the region;
//! the client's writes land without a message, e.g. NVMe doorbells polled by
//! the controller in mmap-poll mode), and the driver's DMA memory and mapped
//! register areas.
//!
//! A memfd made here is sealed against resizing once sized: the other side
//! gets the fd, so it could ftruncate it and make our accesses fault
//! (SIGBUS); sealed, its ftruncate fails with EPERM.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use rustix::fs::{fcntl_add_seals, ftruncate, memfd_create, MemfdFlags, SealFlags};
use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};

/// A file of `len` bytes mapped shared, read-write, for this value's
/// lifetime (see the module docs).
#[derive(Debug)]
pub struct SharedRegion {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by this value and never referenced as Rust
// memory: every access is an atomic or a copy to or from a Rust buffer
// (`read`, `write`, `fill`), none of which depends on the thread.
unsafe impl Send for SharedRegion {}
// SAFETY: as above: no access goes through a shared Rust reference.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// Creates a zeroed memfd named `name` of `len` bytes rounded up to whole
    /// pages, seals its size and maps it.
    pub fn new(name: &str, len: usize) -> io::Result<Self> {
        let (fd, len) = Self::memfd(name, len)?;
        // Nobody, the other side included, can resize it now, nor lift the seals.
        fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        Self::map_fd(fd, 0, len)
    }

    /// As [`SharedRegion::new`], but not sealed: either side may resize the
    /// file, and an access past its new end faults. Only for a side that
    /// means to shrink its own memory under the other, as a hostile
    /// vfio-user client does in tests of the server's SIGBUS guard.
    pub fn resizable(name: &str, len: usize) -> io::Result<Self> {
        let (fd, len) = Self::memfd(name, len)?;
        Self::map_fd(fd, 0, len)
    }

    /// A zeroed memfd named `name` of `len` bytes rounded up to pages.
    fn memfd(name: &str, len: usize) -> io::Result<(OwnedFd, usize)> {
        let page = rustix::param::page_size();
        let len = match len.checked_add(page - 1) {
            Some(l) if len > 0 => l & !(page - 1),
            _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
        };
        let fd = memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        ftruncate(&fd, len as u64)?;
        Ok((fd, len))
    }

    /// Maps `len` bytes of another process's `fd` from `offset` (a vfio-user
    /// sparse mmap area: offset in the fd == offset in the region).
    ///
    /// The offset and length come from the other side, so they are checked:
    /// page aligned, non-empty, and (for a regular file such as a memfd)
    /// inside the file, since touching a page past its end raises SIGBUS.
    /// An owner that shrinks the file later can still do that; an
    /// `F_SEAL_SHRINK` seal on its memfd rules it out.
    pub fn map(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<Self> {
        let invalid = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, why.to_string());
        let page = rustix::param::page_size() as u64;
        if len == 0 || !len.is_multiple_of(page) || !offset.is_multiple_of(page) {
            return Err(invalid("mmap area is empty or not page aligned"));
        }
        let end = offset
            .checked_add(len)
            .ok_or_else(|| invalid("mmap area overflows"))?;
        let stat = rustix::fs::fstat(fd)?;
        if rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::RegularFile
            && u64::try_from(stat.st_size).unwrap_or(0) < end
        {
            return Err(invalid("mmap area extends past the end of the file"));
        }
        // Past usize is the conversion's only failure: the message says it.
        let len = usize::try_from(len).map_err(|_| invalid("mmap area too large"))?;
        Self::map_fd(rustix::io::fcntl_dupfd_cloexec(fd, 0)?, offset, len)
    }

    /// Maps `len` bytes of `fd` from page-aligned `offset`.
    fn map_fd(fd: OwnedFd, offset: u64, len: usize) -> io::Result<Self> {
        // SAFETY: a fresh shared mapping (null hint, no MAP_FIXED) at an
        // address the kernel chooses, so no existing memory is affected; it
        // lives until `Drop` unmaps it. Callers checked the range is inside
        // the file, or sized and sealed the file themselves.
        let ptr = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd.as_fd(),
                offset,
            )
        }?;
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        Ok(Self { fd, ptr, len })
    }

    /// The file, to hand to the other side (GET_REGION_INFO, DMA_MAP).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The start of `len` bytes at `offset`, if inside the mapping and
    /// `align`-byte aligned (a power of two).
    fn span(&self, offset: usize, len: usize, align: usize) -> Option<*mut u8> {
        if offset & (align - 1) != 0 || offset.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: `offset + len <= self.len`, so the pointer stays inside
        // the mapping (or one past its end for `len == 0`).
        Some(unsafe { self.ptr.as_ptr().add(offset) })
    }

    /// The 4-byte aligned dword at `offset`, if inside the mapping.
    pub fn atomic_u32(&self, offset: usize) -> Option<&AtomicU32> {
        let p = self.span(offset, 4, 4)?;
        // SAFETY: `p` is inside the mapping, which lives as long as `self`,
        // and 4-byte aligned (the mapping is page aligned). Memory shared
        // with another process is only accessed atomically at an address
        // used for atomics (the other side's plain aligned stores of the
        // same size are not torn).
        Some(unsafe { AtomicU32::from_ptr(p.cast()) })
    }

    /// The 8-byte aligned quadword at `offset`, if inside the mapping.
    pub fn atomic_u64(&self, offset: usize) -> Option<&AtomicU64> {
        let p = self.span(offset, 8, 8)?;
        // SAFETY: as in `atomic_u32`, with 8-byte alignment checked.
        Some(unsafe { AtomicU64::from_ptr(p.cast()) })
    }

    /// The little-endian dword at `offset` (acquire); 0 if out of range or
    /// unaligned.
    pub fn load_u32(&self, offset: usize) -> u32 {
        self.atomic_u32(offset)
            .map_or(0, |d| u32::from_le(d.load(Ordering::Acquire)))
    }

    /// Stores the little-endian dword at `offset` (release); ignored if out
    /// of range or unaligned.
    pub fn store_u32(&self, offset: usize, value: u32) {
        if let Some(d) = self.atomic_u32(offset) {
            d.store(value.to_le(), Ordering::Release);
        }
    }

    /// Stores `new` in the little-endian dword at `offset` if it holds
    /// `current` (acquire-release); false if it held something else, or if
    /// `offset` is out of range or unaligned.
    pub fn compare_exchange_u32(&self, offset: usize, current: u32, new: u32) -> bool {
        self.atomic_u32(offset).is_some_and(|d| {
            d.compare_exchange(
                current.to_le(),
                new.to_le(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        })
    }

    /// Copies `out.len()` bytes from `offset` into `out`; false, copying
    /// nothing, if they are not all inside the mapping.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        let Some(src) = self.span(offset, out.len(), 1) else {
            return false;
        };
        // SAFETY: `src..src + out.len()` is inside the mapping and cannot
        // overlap `out`, which is Rust-owned memory. The mapping is never
        // referenced as `&[u8]`, so the other side writing it meanwhile
        // breaks no reference invariant: such a racing write (a buggy or
        // hostile peer; a correct one publishes data before the value we
        // acquire) leaves arbitrary bytes in `out`, and every byte value is a
        // valid `u8`, as with DMA racing a CPU copy on hardware. A bulk copy
        // is several times faster than per-byte volatile loads.
        unsafe { std::ptr::copy_nonoverlapping(src.cast_const(), out.as_mut_ptr(), out.len()) };
        true
    }

    /// Copies `data` to `offset`; false, copying nothing, if it does not fit.
    pub fn write(&self, offset: usize, data: &[u8]) -> bool {
        let Some(dst) = self.span(offset, data.len(), 1) else {
            return false;
        };
        // SAFETY: `dst..dst + data.len()` is inside the mapping and cannot
        // overlap `data` (a Rust slice, never a view of shared memory). The
        // other side reads it only after a signal (a doorbell) that a release
        // orders after this copy; reading early it sees some mix of old and
        // new bytes, which harms nobody but itself.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        true
    }

    /// Fills `len` bytes from `offset` with `value`; false, filling
    /// nothing, if they are not all inside the mapping.
    pub fn fill(&self, offset: usize, len: usize, value: u8) -> bool {
        let Some(dst) = self.span(offset, len, 1) else {
            return false;
        };
        // SAFETY: `dst..dst + len` is inside the mapping; as in `write`.
        unsafe { std::ptr::write_bytes(dst, value, len) };
        true
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are the mapping made in `map_fd`, unmapped
        // once; no reference into it outlives `self` (atomics borrow `self`).
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
        // The client's view: the fd mapped again.
        let client = SharedRegion::map(r.fd(), 0, 0x2000).unwrap();
        client.store_u32(0x1008, 7);
        assert_eq!(r.load_u32(0x1008), 7);
        r.store_u32(0x100c, 9);
        assert_eq!(client.load_u32(0x100c), 9);
        assert_eq!(r.load_u32(0x2000), 0, "out of range");
        assert_eq!(r.load_u32(0x1001), 0, "unaligned");
        r.store_u32(0x1ffe, 1);
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

    #[test]
    fn a_mapping_of_another_fd_is_checked_and_shares_bytes_and_atomics() {
        let owner = SharedRegion::new("test", 0x1800).unwrap();
        assert_eq!(owner.len(), 0x2000, "rounded up to pages");
        let bad = |offset, len| {
            SharedRegion::map(owner.fd(), offset, len)
                .unwrap_err()
                .kind()
        };
        assert_eq!(bad(0, 0), io::ErrorKind::InvalidInput);
        assert_eq!(bad(0x800, 0x1000), io::ErrorKind::InvalidInput);
        assert_eq!(
            bad(0x1000, 0x2000),
            io::ErrorKind::InvalidInput,
            "past the end"
        );
        let view = SharedRegion::map(owner.fd(), 0x1000, 0x1000).unwrap();
        assert!(owner.write(0x1010, b"hello"));
        let mut got = [0; 5];
        assert!(view.read(0x10, &mut got));
        assert_eq!(&got, b"hello");
        assert!(view.fill(0x10, 2, b'j'));
        assert!(owner.read(0x1010, &mut got));
        assert_eq!(&got, b"jjllo");
        view.atomic_u64(0x20).unwrap().store(7, Ordering::Release);
        assert_eq!(owner.atomic_u64(0x1020).unwrap().load(Ordering::Acquire), 7);
        assert!(view.atomic_u64(0x24).is_none(), "unaligned");
        assert!(!view.read(0xffe, &mut got), "past the end");
        assert!(!view.write(0x1000, b"x"));
        assert!(SharedRegion::new("test", 0).is_err());
    }
}
