//! Doorbells (NVMe Base 2.0 §3.1.4.22-23): where each queue's SQ tail and CQ
//! head come from, and the trap path that stores them and wakes the worker.
//!
//! Sources: `Register` (the value the last trap stored), `Shadow` (the shadow
//! doorbell buffer of Doorbell Buffer Config, in guest memory) and `Page`
//! (the mmap-poll doorbell page the client maps and writes directly).
//!
//! Every doorbell has a [`Slot`] shared between the control thread (MMIO
//! traps, [`Doorbells::trap`]) and the worker that owns the queue. A trap
//! validates the value against the queue size published in the slot, stores
//! it, and asks for the owning worker to be kicked. The worker never reads
//! the slot directly: it asks its queue's [`DoorbellSource`] for the current
//! value, so Doorbell Buffer Config (§5.8) adds a `Shadow` source that reads
//! the shadow buffer in guest memory (and publishes EventIdx) without
//! touching the queue or worker code.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use vnvme_spec::regs::Doorbell;

use crate::memory::{DmaError, GuestMemory};

/// BAR0's doorbell page (offset 0x1000..0x2000) as shared memory, for
/// [`DoorbellMode::MmapPoll`](crate::DoorbellMode::MmapPoll): the client maps
/// it and the guest writes doorbells there without trapping; the workers poll
/// it. `index` is the doorbell's index ([`Doorbell::index`], DSTRD 0), i.e.
/// the dword at byte `index * 4` of the page.
///
/// Implementations are atomic: `load` with acquire, `store` with release
/// ordering; an index beyond the page loads 0 and stores nothing.
pub trait DoorbellPage: Send + Sync {
    fn load(&self, index: u32) -> u32;
    fn store(&self, index: u32, value: u32);
}

/// Dwords in the doorbell page.
pub const DOORBELL_PAGE_DWORDS: u32 = 1024;

/// A [`DoorbellPage`] in the server's own heap: for tests, and for a
/// mmap-poll controller whose glue has no shared memory to give (the client
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
            .map_or(0, |d| d.load(Ordering::Acquire))
    }

    fn store(&self, index: u32, value: u32) {
        if let Some(d) = self.dwords.get(index as usize) {
            d.store(value, Ordering::Release);
        }
    }
}

/// One doorbell register's state.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    /// Last valid value written by a trap.
    value: AtomicU32,
    /// Entries in the queue while it exists; 0 when it does not.
    limit: AtomicU32,
    /// Index of the worker that owns the queue.
    worker: AtomicUsize,
    /// SQ: already in the owner's pending list. CQ: the owner is waiting for
    /// this CQ's head to move (CQ full), so a head write must kick it.
    flag: AtomicBool,
    /// Shadow doorbell (§5.8): the value the device itself last stored in
    /// this queue's shadow slot (seed, zero at creation, copy of a trap).
    shadow_dev: AtomicU32,
    /// The host writes this shadow slot itself (seen holding a value the
    /// device did not store): traps no longer copy into it.
    shadow_host: AtomicBool,
}

/// Why a doorbell write was ignored (Asynchronous Event information, §5.2,
/// Figure 151: 00h write to invalid doorbell register, 01h invalid doorbell
/// write value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Invalid {
    NoSuchQueue,
    BadValue,
}

/// What a trap asks the caller to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TrapOutcome {
    /// Kick the worker, which should look at queue `qid` (its SQ, or the SQs
    /// waiting on its CQ).
    Kick {
        worker: usize,
        doorbell: Doorbell,
    },
    /// Stored; the worker will see it when it next looks.
    Stored,
    Ignored(Invalid),
}

/// All doorbell slots, indexed by [`Doorbell::index`].
#[derive(Debug)]
pub(crate) struct Doorbells {
    slots: Vec<Slot>,
    /// Bumped when a queue opens or closes, so polling workers rebuild the
    /// list of queues they own.
    generation: AtomicU64,
    /// The mmap-poll doorbell page.
    page: Option<Arc<dyn DoorbellPage>>,
}

impl std::fmt::Debug for dyn DoorbellPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DoorbellPage")
    }
}

impl Doorbells {
    /// Slots for queue ids `0..queue_ids`.
    pub fn new(queue_ids: usize, page: Option<Arc<dyn DoorbellPage>>) -> Self {
        Self {
            slots: (0..queue_ids * 2).map(|_| Slot::default()).collect(),
            generation: AtomicU64::new(0),
            page,
        }
    }

    pub fn queue_ids(&self) -> usize {
        self.slots.len() / 2
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn page(&self) -> Option<&dyn DoorbellPage> {
        self.page.as_deref()
    }

    /// Whether `db`'s queue exists and belongs to `worker`.
    pub fn owned_by(&self, db: Doorbell, worker: usize) -> bool {
        self.slot(db).is_some_and(|s| {
            s.limit.load(Ordering::Acquire) != 0 && s.worker.load(Ordering::Relaxed) == worker
        })
    }

    pub fn is_open(&self, db: Doorbell) -> bool {
        self.slot(db)
            .is_some_and(|s| s.limit.load(Ordering::Acquire) != 0)
    }

    pub fn slot(&self, db: Doorbell) -> Option<&Slot> {
        self.slots.get(db.index() as usize)
    }

    /// Makes a queue's doorbell live: value 0, `entries` entries, owned by
    /// `worker`. Called with the queue's lock held, before the queue is
    /// visible to the worker.
    pub fn open(&self, db: Doorbell, entries: u32, worker: usize) {
        if let Some(s) = self.slot(db) {
            s.value.store(0, Ordering::Relaxed);
            s.flag.store(false, Ordering::Relaxed);
            s.shadow_dev.store(0, Ordering::Relaxed);
            s.shadow_host.store(false, Ordering::Relaxed);
            s.worker.store(worker, Ordering::Relaxed);
            if let Some(p) = &self.page {
                p.store(db.index(), 0);
            }
            s.limit.store(entries, Ordering::Release);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Makes a queue's doorbell dead: later writes are invalid.
    pub fn close(&self, db: Doorbell) {
        if let Some(s) = self.slot(db) {
            s.limit.store(0, Ordering::Release);
            s.value.store(0, Ordering::Relaxed);
            s.flag.store(false, Ordering::Relaxed);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Every doorbell dead and back to 0 (controller reset), the mmap-poll
    /// page included.
    pub fn close_all(&self) {
        for s in &self.slots {
            s.limit.store(0, Ordering::Release);
            s.value.store(0, Ordering::Relaxed);
            s.flag.store(false, Ordering::Relaxed);
        }
        if let Some(p) = &self.page {
            for i in 0..DOORBELL_PAGE_DWORDS {
                p.store(i, 0);
            }
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Doorbell Buffer Config seeded or zeroed this shadow slot with `value`:
    /// the device maintains it until the host is seen writing it.
    pub fn shadow_seeded(&self, db: Doorbell, value: u32) {
        if let Some(s) = self.slot(db) {
            s.shadow_dev.store(value, Ordering::Relaxed);
            s.shadow_host.store(false, Ordering::Relaxed);
        }
    }

    /// The trap path with shadow doorbells on (§5.8; QEMU copies admin-queue
    /// traps): a host that never writes a shadow slot (Linux, admin queue)
    /// still has its trapped value seen, because the trap copies it there
    /// before kicking the worker, which only reads the shadow.
    ///
    /// A host that does write the shadow stores it before the register
    /// (spec), so the shadow already holds this value or a newer one; a copy
    /// could move it backwards if the (posted) trap arrives late. So copy only
    /// while the slot still holds what the device last stored there; the
    /// first time it holds anything else, the host owns it for good.
    pub fn copy_trap_to_shadow(
        &self,
        db: Doorbell,
        value: u32,
        addr: u64,
        mem: &dyn GuestMemory,
    ) -> Result<(), DmaError> {
        let Some(s) = self.slot(db) else {
            return Ok(());
        };
        if s.shadow_host.load(Ordering::Relaxed) {
            return Ok(());
        }
        let current = mem.load_u32(addr)?;
        if current != s.shadow_dev.load(Ordering::Relaxed) {
            // Not what the device stored: the host writes this slot.
            s.shadow_host.store(true, Ordering::Relaxed);
            return Ok(());
        }
        if current == value {
            return Ok(());
        }
        mem.store_u32(addr, value)?;
        s.shadow_dev.store(value, Ordering::Relaxed);
        Ok(())
    }

    /// The MMIO trap path: validates and stores `value`.
    pub fn trap(&self, db: Doorbell, value: u32) -> TrapOutcome {
        let Some(s) = self.slot(db) else {
            return TrapOutcome::Ignored(Invalid::NoSuchQueue);
        };
        let limit = s.limit.load(Ordering::Acquire);
        if limit == 0 {
            return TrapOutcome::Ignored(Invalid::NoSuchQueue);
        }
        if value >= limit {
            return TrapOutcome::Ignored(Invalid::BadValue);
        }
        // SeqCst pairs with the worker's flag-then-reread in `wait_for_head`:
        // either the worker sees this value or we see its flag.
        s.value.store(value, Ordering::SeqCst);
        let worker = s.worker.load(Ordering::Relaxed);
        match db {
            Doorbell::SqTail(_) => {
                if s.flag.swap(true, Ordering::AcqRel) {
                    TrapOutcome::Stored
                } else {
                    TrapOutcome::Kick {
                        worker,
                        doorbell: db,
                    }
                }
            }
            Doorbell::CqHead(_) => {
                if s.flag.swap(false, Ordering::SeqCst) {
                    TrapOutcome::Kick {
                        worker,
                        doorbell: db,
                    }
                } else {
                    TrapOutcome::Stored
                }
            }
        }
    }

    /// Requests a pass over SQ `qid` outside a trap (events for the admin
    /// queue, bounded-work continuation). Returns the worker to kick, or
    /// `None` if a kick is already pending or the queue does not exist.
    pub fn request(&self, db: Doorbell) -> Option<usize> {
        let s = self.slot(db)?;
        if s.limit.load(Ordering::Acquire) == 0 || s.flag.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(s.worker.load(Ordering::Relaxed))
    }

    /// Worker side: SQ `qid` leaves the pending list; a trap after this
    /// queues it again.
    ///
    /// An RMW, not a store: if a trap's swap saw the flag still set (and so
    /// did not kick), this swap reads from it and synchronises with it, so
    /// the tail the worker reads next includes that trap's value.
    pub fn take_pending(&self, db: Doorbell) {
        if let Some(s) = self.slot(db) {
            s.flag.swap(false, Ordering::AcqRel);
        }
    }

    /// Worker side: the CQ is full; ask the next head write to kick us.
    ///
    /// An RMW for the same reason as `take_pending`: either the next trap's
    /// swap reads our `true` and kicks, or ours reads its `false` and the
    /// head re-read that follows sees its value.
    pub fn wait_for_head(&self, db: Doorbell) {
        if let Some(s) = self.slot(db) {
            s.flag.swap(true, Ordering::SeqCst);
        }
    }

    /// The value last stored by a trap.
    pub fn register_value(&self, db: Doorbell) -> u32 {
        self.slot(db).map_or(0, |s| s.value.load(Ordering::Acquire))
    }
}

/// Where a queue's doorbell value comes from (§5.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum DoorbellSource {
    /// The MMIO register: the value the last trap stored.
    #[default]
    Register,
    /// Doorbell Buffer Config: guest addresses of this doorbell's dword in
    /// the shadow doorbell buffer and in the EventIdx buffer.
    Shadow { shadow: u64, event_idx: u64 },
    /// The mmap-poll doorbell page.
    Page,
}

impl DoorbellSource {
    /// The current doorbell value for `db`, unvalidated (callers check it
    /// against the queue). Only a shadow read can fail (the host unmapped or
    /// never mapped the buffer).
    pub fn read(
        &self,
        doorbells: &Doorbells,
        db: Doorbell,
        mem: &dyn GuestMemory,
    ) -> Result<u32, DmaError> {
        match *self {
            DoorbellSource::Register => Ok(doorbells.register_value(db)),
            DoorbellSource::Shadow { shadow, .. } => mem.load_u32(shadow),
            DoorbellSource::Page => Ok(doorbells
                .page()
                .map_or_else(|| doorbells.register_value(db), |p| p.load(db.index()))),
        }
    }

    /// The EventIdx dword's address, for a shadow source.
    pub fn event_idx(&self) -> Option<u64> {
        match *self {
            DoorbellSource::Shadow { event_idx, .. } => Some(event_idx),
            _ => None,
        }
    }

    pub fn is_shadow(&self) -> bool {
        matches!(self, DoorbellSource::Shadow { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trap_beyond_queue_size_is_ignored() {
        let d = Doorbells::new(4, None);
        d.open(Doorbell::SqTail(1), 16, 0);
        assert_eq!(
            d.trap(Doorbell::SqTail(1), 16),
            TrapOutcome::Ignored(Invalid::BadValue)
        );
        assert_eq!(
            d.trap(Doorbell::SqTail(2), 1),
            TrapOutcome::Ignored(Invalid::NoSuchQueue)
        );
        assert_eq!(
            d.trap(Doorbell::SqTail(9), 1),
            TrapOutcome::Ignored(Invalid::NoSuchQueue)
        );
    }

    #[test]
    fn sq_trap_kicks_once_until_taken() {
        let d = Doorbells::new(2, None);
        d.open(Doorbell::SqTail(1), 16, 3);
        let kick = TrapOutcome::Kick {
            worker: 3,
            doorbell: Doorbell::SqTail(1),
        };
        assert_eq!(d.trap(Doorbell::SqTail(1), 1), kick);
        assert_eq!(d.trap(Doorbell::SqTail(1), 2), TrapOutcome::Stored);
        d.take_pending(Doorbell::SqTail(1));
        assert_eq!(d.trap(Doorbell::SqTail(1), 3), kick);
        assert_eq!(d.register_value(Doorbell::SqTail(1)), 3);
    }

    #[test]
    fn cq_trap_kicks_only_a_waiting_worker() {
        let d = Doorbells::new(2, None);
        d.open(Doorbell::CqHead(1), 16, 0);
        assert_eq!(d.trap(Doorbell::CqHead(1), 1), TrapOutcome::Stored);
        d.wait_for_head(Doorbell::CqHead(1));
        assert!(matches!(
            d.trap(Doorbell::CqHead(1), 2),
            TrapOutcome::Kick { .. }
        ));
    }
}
