//! BAR0's doorbell page as shared memory (adaptive, mmap-poll): the client
//! may map it and write doorbells there without trapping; workers poll it.

use std::sync::atomic::{AtomicU32, Ordering};

/// BAR0's doorbell page (offset 0x1000..0x2000) as shared memory, in the
/// modes that [offer it](crate::DoorbellMode::offers_page): the client may
/// map it and write doorbells there without trapping; the workers poll it. `index` is the doorbell's index ([`Doorbell::index`](vnvme_spec::regs::Doorbell::index), DSTRD 0), i.e.
/// the dword at byte `index * 4` of the page.
///
/// Implementations are atomic: `load` with acquire, `store` with release
/// ordering, `replace` a compare-and-swap; an index beyond the page loads
/// 0, stores nothing and replaces nothing.
pub trait DoorbellPage: Send + Sync {
    fn load(&self, index: u32) -> u32;
    fn store(&self, index: u32, value: u32);
    /// Stores `new` if the dword holds `current`; false if it held
    /// something else (the host wrote meanwhile).
    fn replace(&self, index: u32, current: u32, new: u32) -> bool;
    /// The page is the very memory the host wrote its doorbells to before
    /// a save (a live upgrade hands the mapped memfd on): it holds the
    /// host's latest values, written after the save too, so a restore
    /// leaves them and the workers read them. False: a fresh page, which a
    /// restore fills with the saved values.
    fn kept(&self) -> bool {
        false
    }
    /// The dword itself, where the page is memory the server may hold a
    /// reference into; it holds the value little-endian (`load` is
    /// `u32::from_le` of it). A poll group's deep-idle table reads the
    /// dwords of many pages this way, each one load with no call and no
    /// pointer to follow first (`worker::idle_table`). `None`: go
    /// through `load`.
    fn dword(&self, index: u32) -> Option<&AtomicU32> {
        let _ = index;
        None
    }
}

/// Dwords in the doorbell page.
pub const DOORBELL_PAGE_DWORDS: u32 = 1024;

/// A [`DoorbellPage`] in the server's own heap: for tests, and for a
/// controller whose glue has no shared memory to give (the client
/// then reaches the page through register writes only).
#[derive(Debug)]
pub struct HeapDoorbellPage {
    dwords: Vec<AtomicU32>,
}

impl Default for HeapDoorbellPage {
    fn default() -> Self {
        Self {
            dwords: (0..DOORBELL_PAGE_DWORDS)
                .map(|_| AtomicU32::new(0))
                .collect(),
        }
    }
}

impl DoorbellPage for HeapDoorbellPage {
    fn load(&self, index: u32) -> u32 {
        self.dwords
            .get(index as usize)
            .map_or(0, |d| u32::from_le(d.load(Ordering::Acquire)))
    }

    fn store(&self, index: u32, value: u32) {
        if let Some(d) = self.dwords.get(index as usize) {
            d.store(value.to_le(), Ordering::Release);
        }
    }

    fn replace(&self, index: u32, current: u32, new: u32) -> bool {
        self.dwords.get(index as usize).is_some_and(|d| {
            d.compare_exchange(
                current.to_le(),
                new.to_le(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        })
    }

    fn dword(&self, index: u32) -> Option<&AtomicU32> {
        self.dwords.get(index as usize)
    }
}

impl std::fmt::Debug for dyn DoorbellPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DoorbellPage")
    }
}
