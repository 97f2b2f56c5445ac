//! [`Backing`]: what a [`FileDevice`](super::FileDevice) and its queues
//! share (the open file, its size, the counters), and the rule choosing
//! between the O_DIRECT and page-cache descriptors.
//!
//! O_DIRECT wants the file offset and length, and every piece of memory
//! (address and length), aligned: to the logical block for offsets and
//! lengths, to the device's DMA alignment for addresses. Linux reports both
//! (statx `STATX_DIOALIGN`, 6.1); without them 4 KiB ([`ALIGN`]) is assumed,
//! which every device in use accepts and the buffers of our own meet.
//! Guest memory that falls short (a PRP whose offset into its page is not
//! aligned) goes through the page cache, still straight to and from the
//! guest's memory: the kernel copies it there, as it does for any buffered
//! read, and no buffer of ours is involved.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::uring::SubmitFault;
use crate::{Data, ALIGN};

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) direct_ops: AtomicU64,
    pub(super) buffered_ops: AtomicU64,
    pub(super) mapped_ops: AtomicU64,
    pub(super) dsync_writes: AtomicU64,
    pub(super) flushes: AtomicU64,
    pub(super) holes_punched: AtomicU64,
    pub(super) zeroes_written: AtomicU64,
    pub(super) submit_calls: AtomicU64,
    pub(super) submit_failures: AtomicU64,
}

pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What the device and its queues share: the open file, its size and the
/// counters. The queues hold it too, so its descriptors (and the lock)
/// stay valid for as long as any of them has I/O to do.
#[derive(Debug)]
pub(super) struct Backing {
    /// Read-write, locked; also used for flush and fallocate.
    pub(super) file: File,
    /// The same file opened O_DIRECT, if the file system supports it.
    pub(super) direct: Option<File>,
    pub(super) dio: DioAlign,
    pub(super) size: u64,
    pub(super) counters: Counters,
    /// A fault for the next commit of any queue (tests).
    #[cfg(any(test, feature = "testing"))]
    pub(super) submit_fault: parking_lot::Mutex<Option<SubmitFault>>,
}

/// What O_DIRECT needs (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DioAlign {
    /// Of memory addresses.
    pub(super) mem: usize,
    /// Of file offsets and lengths, and of each piece of memory's length
    /// (the logical block).
    pub(super) block: usize,
}

impl DioAlign {
    /// 4 KiB for both, when the kernel does not say.
    pub(super) const ASSUMED: Self = Self {
        mem: ALIGN,
        block: ALIGN,
    };

    /// What the kernel says of `direct` (statx), else [`Self::ASSUMED`].
    pub(super) fn of(direct: &File) -> Self {
        use rustix::fs::{statx, AtFlags, StatxFlags};
        let Ok(st) = statx(direct, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN) else {
            return Self::ASSUMED;
        };
        let known = |a: u32| {
            let a = a as usize;
            (st.stx_mask & StatxFlags::DIOALIGN.bits() != 0 && a.is_power_of_two()).then_some(a)
        };
        Self {
            mem: known(st.stx_dio_mem_align).unwrap_or(ALIGN),
            block: known(st.stx_dio_offset_align).unwrap_or(ALIGN),
        }
    }
}

/// The descriptor a transfer goes through.
#[derive(Debug, Clone, Copy)]
pub(super) enum Route {
    Direct(RawFd),
    Buffered(RawFd),
}

impl Route {
    pub(super) fn fd(self) -> RawFd {
        match self {
            Route::Direct(fd) | Route::Buffered(fd) => fd,
        }
    }
}

impl Backing {
    /// O_DIRECT when offset and length are aligned and the file system
    /// allows it, else the page cache.
    pub(super) fn route(&self, offset: u64, len: usize) -> Route {
        // Whole 4 KiB blocks at least: the granule namespaces are made of.
        let align = self.dio.block.max(ALIGN);
        match &self.direct {
            Some(d) if offset.is_multiple_of(align as u64) && len.is_multiple_of(align) => {
                Route::Direct(d.as_raw_fd())
            }
            _ => Route::Buffered(self.file.as_raw_fd()),
        }
    }

    /// [`route`](Self::route) for a transfer of `data`: mapped memory
    /// goes O_DIRECT only if each of its regions is aligned too (see the
    /// module doc); our own buffers always are.
    pub(super) fn route_data(&self, offset: u64, data: &Data) -> Route {
        let route = self.route(offset, data.len());
        match (route, data) {
            (Route::Direct(_), Data::Mapped(mem)) => {
                let aligned = mem.regions().iter().all(|r| {
                    r.addr.is_multiple_of(self.dio.mem) && r.len.is_multiple_of(self.dio.block)
                });
                if aligned {
                    route
                } else {
                    Route::Buffered(self.file.as_raw_fd())
                }
            }
            _ => route,
        }
    }

    /// Counts a transfer that was started on `route`.
    pub(super) fn count(&self, route: Route) {
        match route {
            Route::Direct(_) => bump(&self.counters.direct_ops),
            Route::Buffered(_) => bump(&self.counters.buffered_ops),
        }
    }

    /// The descriptor for a transfer about to start, counted.
    pub(super) fn fd_for(&self, offset: u64, len: usize) -> RawFd {
        let route = self.route(offset, len);
        self.count(route);
        route.fd()
    }

    /// The fault a test asked the next commit to meet, taken.
    pub(super) fn take_submit_fault(&self) -> Option<SubmitFault> {
        #[cfg(any(test, feature = "testing"))]
        return self.submit_fault.lock().take();
        #[cfg(not(any(test, feature = "testing")))]
        None
    }

    /// The page-cache descriptor, also used for flush and fallocate.
    pub(super) fn buffered_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}
