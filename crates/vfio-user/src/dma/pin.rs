//! Guest memory handed to the kernel: a [`DmaPin`] holds the maps under a
//! transfer mapped while the kernel reads or writes them in place (the
//! `file` backend's io_uring operations), so no copy goes through a buffer
//! of ours.
//!
//! A pin holds each map it touches as a snapshot does (`snapshot.rs`): an
//! unmap waits for the pin to be dropped, at most [`UNMAP_WAIT`], and past
//! that the memory stays mapped until the pin is dropped. The kernel
//! therefore never reads or writes memory that is no longer mapped, nor
//! memory mapped since in its place, whatever the client unmaps. A client
//! that shrinks the file behind a map mid-transfer makes the kernel's
//! access fail (EFAULT, in the kernel: no SIGBUS reaches us) or land in
//! pages the file no longer has; [`DmaPin::intact`] tells when our own
//! accesses found the map broken meanwhile.
//!
//! [`UNMAP_WAIT`]: super::snapshot::UNMAP_WAIT

use std::sync::Arc;

use vnvme_memory::{MappedMemory, Region};

use super::{Backing, DmaSpace, Mapping};

/// The memory of one transfer held mapped: see the module doc.
#[derive(Debug)]
pub struct DmaPin {
    /// Each map a region lies in, once.
    maps: Vec<Arc<Mapping>>,
    /// In transfer order; contiguous pieces merged.
    regions: Vec<Region>,
    writable: bool,
}

impl DmaSpace {
    /// Pins the memory of `ranges` (`(iova, len)`, in transfer order) for
    /// the kernel to read, and also to write if `write`. `None` if some of
    /// it cannot be handed to the kernel: not mapped, reached by messages
    /// (a map without an fd), broken, or without the permission. The
    /// caller then copies instead, and the copy reports the error.
    pub fn pin(&self, ranges: impl IntoIterator<Item = (u64, u64)>, write: bool) -> Option<DmaPin> {
        let mut pin = DmaPin {
            maps: Vec::new(),
            regions: Vec::new(),
            writable: write,
        };
        self.inner.maps.with(|table| {
            for (iova, len) in ranges {
                let end = iova.checked_add(len)?;
                let mut addr = iova;
                let mut idx = table.find(addr)?;
                while addr < end {
                    let m = table.maps.get(idx)?;
                    if m.iova > addr || !m.readable || (write && !m.writable) {
                        return None;
                    }
                    let Backing::Mmap { mm, delta } = &m.backing else {
                        return None;
                    };
                    if mm.is_broken() {
                        return None;
                    }
                    let n = end.min(m.end()) - addr;
                    // In bounds: `addr - m.iova + n <= m.size`, and the
                    // mapping holds `delta + size` bytes.
                    let host = mm.ptr as usize + delta + (addr - m.iova) as usize;
                    pin.add(m, host, n as usize);
                    addr += n;
                    idx += 1;
                }
            }
            Some(())
        })?;
        Some(pin)
    }
}

impl DmaPin {
    fn add(&mut self, m: &Arc<Mapping>, addr: usize, len: usize) {
        if !self.maps.last().is_some_and(|last| Arc::ptr_eq(last, m)) {
            self.maps.push(Arc::clone(m));
        }
        match self.regions.last_mut() {
            Some(last) if last.addr + last.len == addr => last.len += len,
            _ => self.regions.push(Region { addr, len }),
        }
    }

    /// Whether none of the maps broke (see the module doc).
    pub fn intact(&self) -> bool {
        self.maps.iter().all(|m| match &m.backing {
            Backing::Mmap { mm, .. } => !mm.is_broken(),
            Backing::Remote => false,
        })
    }
}

// SAFETY: every region lies inside the `Mmap` of a map in `self.maps`
// (`pin` checked it against the map's bounds), and holding the map's `Arc`
// keeps that `Mmap`, whose drop alone munmaps it, alive: the memory stays
// mapped as long as the pin, whatever the client unmaps. The SIGBUS guard
// may replace a mapping with anonymous memory at the same addresses,
// which the trait allows. Every mapping is PROT_READ, and PROT_WRITE when
// a writable map lies in it; `pin` checked that each map is readable, and
// writable when `writable`. The regions and the flag never change after `pin`, and nothing
// here forms a reference to the memory.
unsafe impl MappedMemory for DmaPin {
    fn regions(&self) -> &[Region] {
        &self.regions
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn intact(&self) -> bool {
        DmaPin::intact(self)
    }
}

#[cfg(test)]
mod tests;
