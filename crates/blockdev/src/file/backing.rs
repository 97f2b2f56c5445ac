//! [`Backing`]: what a [`FileDevice`](super::FileDevice) and its queues
//! share (the open file, its size, the counters), and the rule choosing
//! between the O_DIRECT and page-cache descriptors.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::ALIGN;

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) direct_ops: AtomicU64,
    pub(super) buffered_ops: AtomicU64,
    pub(super) dsync_writes: AtomicU64,
    pub(super) flushes: AtomicU64,
    pub(super) holes_punched: AtomicU64,
    pub(super) zeroes_written: AtomicU64,
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
    pub(super) size: u64,
    pub(super) counters: Counters,
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
        match &self.direct {
            Some(d) if offset.is_multiple_of(ALIGN as u64) && len.is_multiple_of(ALIGN) => {
                Route::Direct(d.as_raw_fd())
            }
            _ => Route::Buffered(self.file.as_raw_fd()),
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

    /// The page-cache descriptor, also used for flush and fallocate.
    pub(super) fn buffered_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}
