//! The client's memory as this process maps it: one MAP_SHARED mapping per
//! file the client shares (or per part, for a file too large to map whole),
//! shared by every DMA map that lies in it.
//!
//! Why one mapping per file, not one per DMA map:
//!
//! * hugetlbfs. A hugetlbfs file can only be mapped at file offsets that are
//!   multiples of its page size (2 MiB, 1 GiB), but a client's DMA_MAP
//!   regions start where the guest's memory map puts them: QEMU sends its
//!   RAM as `offset 0 size 0xA0000`, then `offset 0xC0000 size 0x3FF40000`
//!   around the legacy VGA hole. Mapped one by one, the second map fails.
//!   Mapped once, whole, every region is a slice of it, whatever its offset.
//! * A virtual IOMMU. Behind one, the guest maps and unmaps each I/O buffer,
//!   and the client turns every change into a DMA_MAP or DMA_UNMAP of a few
//!   KiB of a file that is already mapped. Reusing the mapping makes each
//!   message a table update, not an mmap plus a munmap (whose TLB shootdown
//!   interrupts every core the process runs on).
//!
//! Lifetime: each DMA map holds its mapping; the cache ([`FileMaps`]) only
//! remembers it, so a mapping is munmapped with the last DMA map in it. It
//! must not outlive the client's maps: it keeps the client's memory
//! allocated (a guest DIMM the client unplugs and frees, say).
//!
//! The SIGBUS guard (`fault.rs`) registers each mapping, so a client that
//! shrinks a file breaks every DMA map of that mapping at once: the guard
//! replaces the whole mapping with zero pages.

use std::os::fd::BorrowedFd;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use rustix::fs::{FileType, OFlags};
use rustix::mm::{MapFlags, ProtFlags};

use crate::fault;
use crate::Errno;

/// A MAP_SHARED mapping of a client's file (or anonymous memory, for tests),
/// owned by the DMA maps that lie in it.
#[derive(Debug)]
pub(super) struct Mmap {
    /// Start of the mapping as returned by mmap (page aligned).
    pub ptr: *mut u8,
    pub len: usize,
    /// The file and the file offset of `ptr`; None for anonymous memory.
    source: Option<Source>,
    /// Mapped with PROT_WRITE.
    writable: bool,
    /// The SIGBUS registry slot of a file mapping; None for anonymous memory,
    /// which nobody can truncate.
    fault: Option<fault::Registration>,
    /// Whether the broken mapping was reported.
    pub warned: AtomicBool,
}

/// Which file a mapping shows, and from where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Source {
    dev: u64,
    ino: u64,
    offset: u64,
}

impl Mmap {
    /// `len` bytes of fresh zeroed anonymous shared memory.
    pub fn anonymous(len: usize) -> Result<Self, Errno> {
        // SAFETY: a fresh anonymous mapping at an address the kernel chooses;
        // the result is owned by the returned value.
        let ptr = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
            )
        }
        .map_err(|e| e.raw_os_error())?;
        Ok(Self {
            ptr: ptr.cast(),
            len,
            source: None,
            writable: true,
            fault: None,
            warned: AtomicBool::new(false),
        })
    }

    /// Whether a SIGBUS replaced the mapping with zero pages.
    #[inline]
    pub fn is_broken(&self) -> bool {
        self.fault
            .as_ref()
            .is_some_and(fault::Registration::is_broken)
    }

    /// Where in this mapping `size` bytes of `source`'s file from `offset`
    /// are, if it holds them all (and may be written, if `writable`).
    fn find(&self, file: (u64, u64), offset: u64, size: u64, writable: bool) -> Option<usize> {
        let src = self.source?;
        if (src.dev, src.ino) != file || (writable && !self.writable) {
            return None;
        }
        let delta = offset.checked_sub(src.offset)?;
        let end = delta.checked_add(size)?;
        (end <= self.len as u64).then_some(delta as usize)
    }
}

// SAFETY: the mapping is plain shared memory owned by this value; it is only
// unmapped in Drop, which needs exclusive ownership. Accesses through `ptr`
// hold a table snapshot that keeps a DMA map holding this value alive (see
// `dma.rs`).
unsafe impl Send for Mmap {}
// SAFETY: as above; `&Mmap` only hands out the pointer for copies made while
// a snapshot holding one of its DMA maps is held.
unsafe impl Sync for Mmap {}

impl Drop for Mmap {
    fn drop(&mut self) {
        // Out of the SIGBUS registry before the range can be reused.
        drop(self.fault.take());
        // SAFETY: `ptr`/`len` describe a mapping created by `mmap` in
        // `FileMaps::map` or `Mmap::anonymous` and not unmapped since; this is
        // the only owner, dropped with the last DMA map holding it, and every
        // access holds a DMA map through its snapshot, so no access is using
        // it.
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) } {
            tracing::warn!(error = %e, "munmap of a DMA mapping failed");
        }
    }
}

/// A DMA_MAP this process could not honour: the errno for the reply and
/// what went wrong, for the log.
#[derive(Debug)]
pub(super) struct Refusal {
    pub errno: Errno,
    pub why: String,
}

impl Refusal {
    fn new(errno: Errno, why: String) -> Self {
        Self { errno, why }
    }
}

/// One client's file mappings, to reuse for its next DMA maps (see the
/// module docs).
#[derive(Debug, Default)]
pub(super) struct FileMaps {
    /// Weak: the DMA maps own the mappings.
    maps: Mutex<Vec<Weak<Mmap>>>,
}

impl FileMaps {
    /// The mapping holding `size` bytes of `fd` from `offset`, and where in
    /// it they start: one this client's maps already hold, else a new one.
    /// A file up to `whole_up_to` bytes is mapped whole, a larger one only
    /// around the range (aligned to its page size).
    pub fn get(
        &self,
        fd: BorrowedFd<'_>,
        offset: u64,
        size: u64,
        writable: bool,
        whole_up_to: u64,
    ) -> Result<(Arc<Mmap>, usize), Refusal> {
        let stat = rustix::fs::fstat(fd)
            .map_err(|e| Refusal::new(e.raw_os_error(), format!("fstat of its fd failed: {e}")))?;
        let kind = FileType::from_raw_mode(stat.st_mode);
        if kind != FileType::RegularFile {
            return Err(Refusal::new(
                libc::EINVAL,
                format!("the fd is a {kind:?}, not a memfd or regular file"),
            ));
        }
        // An access past the end of the file would raise SIGBUS.
        let end = offset
            .checked_add(size)
            .ok_or_else(|| Refusal::new(libc::EINVAL, "offset + size overflows".into()))?;
        let file_size = u64::try_from(stat.st_size).unwrap_or(0);
        if file_size < end {
            return Err(Refusal::new(
                libc::EINVAL,
                format!(
                    "it ends at file offset {end:#x}, past the end of the {file_size:#x}-byte \
                     {} file it came with",
                    fs_name(fd)
                ),
            ));
        }
        let file = (stat.st_dev, stat.st_ino);
        let mut maps = self.maps.lock();
        maps.retain(|m| m.strong_count() > 0);
        for m in maps.iter().filter_map(Weak::upgrade) {
            if let Some(delta) = m.find(file, offset, size, writable) {
                return Ok((m, delta));
            }
        }
        let m = Arc::new(map(
            fd,
            file,
            file_size,
            offset,
            size,
            writable,
            whole_up_to,
        )?);
        maps.push(Arc::downgrade(&m));
        let delta = m
            .find(file, offset, size, writable)
            .ok_or_else(|| Refusal::new(libc::EINVAL, "the new mapping misses it".into()))?;
        Ok((m, delta))
    }
}

/// Maps the part of `file` (whose fd is `fd`) that holds `size` bytes from
/// `offset`: all of it if it is at most `whole_up_to` bytes long.
fn map(
    fd: BorrowedFd<'_>,
    file: (u64, u64),
    file_size: u64,
    offset: u64,
    size: u64,
    writable: bool,
    whole_up_to: u64,
) -> Result<Mmap, Refusal> {
    let page = rustix::param::page_size() as u64;
    // The kernel maps (and splits) a hugetlbfs file only at huge pages.
    let granule = hugetlb_page_size(fd).unwrap_or(page);
    let (start, end) = if file_size <= whole_up_to {
        (0, file_size)
    } else {
        (offset - offset % granule, offset + size)
    };
    let len = end
        .checked_next_multiple_of(granule)
        .map(|e| e - start)
        .and_then(|l| usize::try_from(l).ok())
        .ok_or_else(|| Refusal::new(libc::ENOMEM, "it lies beyond the address space".into()))?;
    // Writable whenever the fd allows, so later writable maps of the file
    // can share the mapping; each DMA map's own flags are checked on access.
    let fd_writable =
        rustix::fs::fcntl_getfl(fd).is_ok_and(|f| f & OFlags::ACCMODE == OFlags::RDWR);
    let mut prot = ProtFlags::READ;
    if writable || fd_writable {
        prot |= ProtFlags::WRITE;
    }
    // A hugetlbfs file may be sparse: SPDK's `-g` memory (one file per
    // DPDK memory segment list, pages where DPDK allocated them, holes where
    // it freed them) or a QEMU guest's RAM with `reserve=off`. Without
    // MAP_NORESERVE the kernel reserves a huge page for every hole of the
    // range at mmap: a file larger than the free pool is refused (ENOMEM),
    // and a smaller one takes pages the client needs for its own
    // allocations. The client's pages are there already; an access to a
    // hole with no page left raises SIGBUS, which the guard turns into a
    // Data Transfer Error.
    let mut flags = MapFlags::SHARED;
    if granule > page {
        flags |= MapFlags::NORESERVE;
    }
    // SAFETY: a fresh mapping at an address the kernel chooses, so no
    // existing memory is affected; the result is owned by `Mmap`.
    let ptr = unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, prot, flags, fd, start) }
        .map_err(|e| {
            Refusal::new(
                e.raw_os_error(),
                format!(
                    "mmap of {len:#x} bytes at offset {start:#x} of its {} file ({:#x} bytes, \
                 mapped in {granule:#x}-byte pages, {}) failed: {e}",
                    fs_name(fd),
                    file_size,
                    if prot.contains(ProtFlags::WRITE) {
                        "read-write"
                    } else {
                        "read-only"
                    },
                ),
            )
        })?;
    let mut mmap = Mmap {
        ptr: ptr.cast(),
        len,
        source: Some(Source {
            dev: file.0,
            ino: file.1,
            offset: start,
        }),
        writable: prot.contains(ProtFlags::WRITE),
        fault: None,
        warned: AtomicBool::new(false),
    };
    // Unmapped by its Drop if registering fails.
    mmap.fault = Some(fault::register(mmap.ptr, len).map_err(|e| {
        Refusal::new(
            e,
            format!(
                "{} shared-memory mappings are registered in this process, the most its \
                 SIGBUS guard tracks",
                fault::CAPACITY
            ),
        )
    })?);
    Ok(mmap)
}

const HUGETLBFS_MAGIC: u32 = 0x9584_58f6;

/// The huge page size of a file on hugetlbfs (SPDK's memory, a VM's
/// hugepage RAM), else None.
fn hugetlb_page_size(fd: BorrowedFd<'_>) -> Option<u64> {
    let fs = rustix::fs::fstatfs(fd).ok()?;
    if fs.f_type as u32 != HUGETLBFS_MAGIC {
        return None;
    }
    u64::try_from(fs.f_bsize)
        .ok()
        .filter(|b| b.is_power_of_two())
}

/// The kind of filesystem `fd` lives on, for messages.
fn fs_name(fd: BorrowedFd<'_>) -> String {
    let Ok(fs) = rustix::fs::fstatfs(fd) else {
        return "unknown filesystem's".into();
    };
    let name = match fs.f_type as u32 {
        HUGETLBFS_MAGIC => return format!("hugetlbfs ({} KiB pages)", fs.f_bsize / 1024),
        0x0102_1994 => "tmpfs (or memfd)",
        0xef53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683e => "btrfs",
        0x6573_5546 => "fuse",
        0x6969 => "nfs",
        0x794c_7630 => "overlayfs",
        other => return format!("filesystem type {other:#x}"),
    };
    name.into()
}

#[cfg(test)]
mod tests;
