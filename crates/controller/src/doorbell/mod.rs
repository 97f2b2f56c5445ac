//! Doorbells (NVMe Base 2.0 §3.1.4.22-23): every doorbell value a queue
//! sees and where it comes from. This module owns them all:
//!
//! * the registers, written by MMIO traps ([`Doorbells::trap`]): one [`Slot`]
//!   per doorbell, shared between the control thread and the worker that owns
//!   the queue;
//! * the shadow doorbell and EventIdx buffers of Doorbell Buffer Config
//!   (§5.8, [`shadow`]);
//! * BAR0's doorbell page, which the client may map and write directly
//!   where the mode offers it ([`page`]); traps store there too, so it is
//!   then the register.
//!
//! A trap validates the value against the queue size published in the slot,
//! stores it, and asks for the owning worker to be kicked. The worker never
//! reads the slot directly: it asks its queue's [`DoorbellSource`] for the
//! current value, so the queue and worker code do not care where the value
//! comes from.

mod page;
mod saved;
mod shadow;
mod source;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use vnvme_spec::regs::Doorbell;

use crate::stats::Stats;
pub use page::{DoorbellPage, HeapDoorbellPage, DOORBELL_PAGE_DWORDS};
pub(crate) use saved::SavedDoorbells;
use shadow::Dbbuf;
pub(crate) use shadow::{barrier, EventIdx};
pub(crate) use source::DoorbellSource;
/// One behind the value seen (the arithmetic lives in the spec crate, the
/// driver's need-event test next to it).
pub(crate) use vnvme_spec::event_idx::behind;

/// One doorbell register's state.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    /// Last valid value written by a trap.
    value: AtomicU32,
    /// Entries in the queue while it exists; 0 when it does not.
    limit: AtomicU32,
    /// Index of the worker that owns the queue.
    worker: AtomicUsize,
    /// SQ slots only: the SQ is already in the owner's pending list, so a
    /// trap need not kick again.
    queued: AtomicBool,
    /// CQ slots only: the owner waits for this CQ's head to move (the CQ is
    /// full), so a head write must kick it.
    head_awaited: AtomicBool,
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
    /// The doorbell page, in the modes that offer it (adaptive, mmap-poll):
    /// the registers' memory, read wherever a register value is.
    page: Option<Arc<dyn DoorbellPage>>,
    /// Doorbell Buffer Config (§5.8) buffers; `None` until configured and
    /// after a controller reset. A leaf lock: written at Doorbell Buffer
    /// Config and reset, read by the trap path. `dbbuf_on` mirrors
    /// `is_some()` for the trap path's lock-free check.
    dbbuf: RwLock<Option<Dbbuf>>,
    dbbuf_on: AtomicBool,
    /// Shadow reads, EventIdx writes and shadow errors are counted here.
    stats: Arc<Stats>,
}

impl Doorbells {
    /// Slots for queue ids `0..queue_ids`.
    pub fn new(queue_ids: usize, page: Option<Arc<dyn DoorbellPage>>, stats: Arc<Stats>) -> Self {
        Self {
            slots: (0..queue_ids * 2).map(|_| Slot::default()).collect(),
            generation: AtomicU64::new(0),
            page,
            dbbuf: RwLock::new(None),
            dbbuf_on: AtomicBool::new(false),
            stats,
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

    fn slot(&self, db: Doorbell) -> Option<&Slot> {
        self.slots.get(db.index() as usize)
    }

    /// Makes a queue's doorbell live: value 0 (the doorbell page's dword
    /// too), `entries` entries, owned by `worker`. Called with the queue's
    /// lock held, before the queue is visible to the worker.
    pub fn open(&self, db: Doorbell, entries: u32, worker: usize) {
        if let Some(p) = &self.page {
            p.store(db.index(), 0);
        }
        self.reopen(db, entries, worker);
    }

    /// [`open`](Self::open) for a restored queue: the doorbell page's
    /// dword is left alone, since a page handed over from the previous
    /// process ([`DoorbellPage::kept`]) holds what the host wrote, during
    /// the handover too; [`restore`](Self::restore) fills a fresh page.
    pub fn reopen(&self, db: Doorbell, entries: u32, worker: usize) {
        if let Some(s) = self.slot(db) {
            s.value.store(0, Ordering::Relaxed);
            s.queued.store(false, Ordering::Relaxed);
            s.head_awaited.store(false, Ordering::Relaxed);
            s.shadow_dev.store(0, Ordering::Relaxed);
            s.shadow_host.store(false, Ordering::Relaxed);
            s.worker.store(worker, Ordering::Relaxed);
            s.limit.store(entries, Ordering::Release);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Makes a queue's doorbell dead: later writes are invalid.
    pub fn close(&self, db: Doorbell) {
        if let Some(s) = self.slot(db) {
            s.limit.store(0, Ordering::Release);
            s.value.store(0, Ordering::Relaxed);
            s.queued.store(false, Ordering::Relaxed);
            s.head_awaited.store(false, Ordering::Relaxed);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Every doorbell dead and back to 0 (controller reset), the mmap-poll
    /// page included.
    pub fn close_all(&self) {
        for s in &self.slots {
            s.limit.store(0, Ordering::Release);
            s.value.store(0, Ordering::Relaxed);
            s.queued.store(false, Ordering::Relaxed);
            s.head_awaited.store(false, Ordering::Relaxed);
        }
        if let Some(p) = &self.page {
            for i in 0..DOORBELL_PAGE_DWORDS {
                p.store(i, 0);
            }
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether a trap of `value` on `db` would be stored: the queue exists
    /// and the value is inside it.
    pub fn accepts(&self, db: Doorbell, value: u32) -> bool {
        self.slot(db)
            .is_some_and(|s| value < s.limit.load(Ordering::Acquire))
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
        // SeqCst pairs with the worker's `head_awaited`-then-reread in `wait_for_head`:
        // either the worker sees this value or we see its `head_awaited`.
        s.value.store(value, Ordering::SeqCst);
        let worker = s.worker.load(Ordering::Relaxed);
        match db {
            Doorbell::SqTail(_) => {
                if s.queued.swap(true, Ordering::AcqRel) {
                    TrapOutcome::Stored
                } else {
                    TrapOutcome::Kick {
                        worker,
                        doorbell: db,
                    }
                }
            }
            Doorbell::CqHead(_) => {
                if s.head_awaited.swap(false, Ordering::SeqCst) {
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
        if s.limit.load(Ordering::Acquire) == 0 || s.queued.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(s.worker.load(Ordering::Relaxed))
    }

    /// Worker side: SQ `qid` leaves the pending list; a trap after this
    /// queues it again.
    ///
    /// An RMW, not a store: if a trap's swap saw `queued` still set (and so
    /// did not kick), this swap reads from it and synchronises with it, so
    /// the tail the worker reads next includes that trap's value.
    pub fn take_pending(&self, db: Doorbell) {
        if let Some(s) = self.slot(db) {
            s.queued.swap(false, Ordering::AcqRel);
        }
    }

    /// Worker side: the CQ is full; ask the next head write to kick us.
    ///
    /// An RMW for the same reason as `take_pending`: either the next trap's
    /// swap reads our `true` and kicks, or ours reads its `false` and the
    /// head re-read that follows sees its value.
    pub fn wait_for_head(&self, db: Doorbell) {
        if let Some(s) = self.slot(db) {
            s.head_awaited.swap(true, Ordering::SeqCst);
        }
    }

    /// Where the page is offered: stores `new` as doorbell `db`'s page
    /// dword if it still holds `current`. False if it held something else
    /// (the host wrote meanwhile) or there is no page.
    pub fn replace_register(&self, db: Doorbell, current: u32, new: u32) -> bool {
        self.page
            .as_ref()
            .is_some_and(|p| p.replace(db.index(), current, new))
    }

    /// The doorbell register's value: the page's dword where the page is
    /// offered (a client that mapped it writes there, and traps store there
    /// too), else the value last stored by a trap.
    pub fn register_value(&self, db: Doorbell) -> u32 {
        match &self.page {
            Some(p) => p.load(db.index()),
            None => self.slot(db).map_or(0, |s| s.value.load(Ordering::Acquire)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trap_beyond_queue_size_is_ignored() {
        let d = Doorbells::new(4, None, Arc::new(Stats::new(4)));
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
        let d = Doorbells::new(2, None, Arc::new(Stats::new(2)));
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
        let d = Doorbells::new(2, None, Arc::new(Stats::new(2)));
        d.open(Doorbell::CqHead(1), 16, 0);
        assert_eq!(d.trap(Doorbell::CqHead(1), 1), TrapOutcome::Stored);
        d.wait_for_head(Doorbell::CqHead(1));
        assert!(matches!(
            d.trap(Doorbell::CqHead(1), 2),
            TrapOutcome::Kick { .. }
        ));
    }
}
