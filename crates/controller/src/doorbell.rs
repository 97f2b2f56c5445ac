//! Doorbells (NVMe Base 2.0 §3.1.4.22-23): where each queue's SQ tail and CQ
//! head come from, and the trap path that stores them and wakes the worker.
//!
//! Every doorbell has a [`Slot`] shared between the control thread (MMIO
//! traps, [`Doorbells::trap`]) and the worker that owns the queue. A trap
//! validates the value against the queue size published in the slot, stores
//! it, and asks for the owning worker to be kicked. The worker never reads
//! the slot directly: it asks its queue's [`DoorbellSource`] for the current
//! value, so Doorbell Buffer Config (§5.8) adds a `Shadow` source that reads
//! the shadow buffer in guest memory (and publishes EventIdx) without
//! touching the queue or worker code.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use vnvme_spec::regs::Doorbell;

use crate::memory::GuestMemory;

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
}

impl Doorbells {
    /// Slots for queue ids `0..queue_ids`.
    pub fn new(queue_ids: usize) -> Self {
        Self {
            slots: (0..queue_ids * 2).map(|_| Slot::default()).collect(),
        }
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
            s.worker.store(worker, Ordering::Relaxed);
            s.limit.store(entries, Ordering::Release);
        }
    }

    /// Makes a queue's doorbell dead: later writes are invalid.
    pub fn close(&self, db: Doorbell) {
        if let Some(s) = self.slot(db) {
            s.limit.store(0, Ordering::Release);
            s.value.store(0, Ordering::Relaxed);
            s.flag.store(false, Ordering::Relaxed);
        }
    }

    pub fn close_all(&self) {
        for s in &self.slots {
            s.limit.store(0, Ordering::Release);
            s.value.store(0, Ordering::Relaxed);
            s.flag.store(false, Ordering::Relaxed);
        }
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
    // Next: `Shadow { shadow: u64, event_idx: u64 }` — the value is read from
    // the shadow doorbell buffer with `GuestMemory::load_u32` (acquire), and
    // the worker publishes EventIdx with `store_u32` (release) + fence +
    // re-read, per DESIGN.md.
}

impl DoorbellSource {
    /// The current doorbell value for `db`, unvalidated (callers check it
    /// against the queue).
    pub fn read(&self, doorbells: &Doorbells, db: Doorbell, _mem: &dyn GuestMemory) -> u32 {
        match self {
            DoorbellSource::Register => doorbells.register_value(db),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trap_beyond_queue_size_is_ignored() {
        let d = Doorbells::new(4);
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
        let d = Doorbells::new(2);
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
        let d = Doorbells::new(2);
        d.open(Doorbell::CqHead(1), 16, 0);
        assert_eq!(d.trap(Doorbell::CqHead(1), 1), TrapOutcome::Stored);
        d.wait_for_head(Doorbell::CqHead(1));
        assert!(matches!(
            d.trap(Doorbell::CqHead(1), 2),
            TrapOutcome::Kick { .. }
        ));
    }
}
