//! Doorbell Buffer Config state (NVMe Base 2.0 §5.8): where the shadow
//! doorbell and EventIdx buffers are, the trap-path copy into the shadow, and
//! EventIdx publication.
//!
//! The buffers live in [`Doorbells`] (a leaf lock: written by the admin
//! worker at Doorbell Buffer Config and by the control thread at reset, read
//! by the trap path). Each queue also carries a copy of its two addresses in
//! its [`DoorbellSource`], so the workers' hot path takes no lock.
//!
//! A shadow buffer the host unmaps (or never mapped) makes reads and writes
//! fail. That is the host's own queue going quiet, not the controller's
//! queue memory being gone: the worker treats a failed shadow read as "no new
//! work", counts it (`shadow_errors`), warns once per configuration, and does
//! not set CSTS.CFS. Traps still kick the worker, which still reads the
//! shadow (the register is no stand-in: it can be older than what the shadow
//! already gave, and going backwards would replay old entries), so the
//! admin queue stalls too; a reset (CC.EN = 0, a register write) drops the
//! buffers and brings everything back.

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;

use vnvme_spec::regs::Doorbell;

use super::{DoorbellSource, Doorbells};
use crate::memory::{DmaError, GuestAddress, GuestMemory};

/// Configured shadow doorbell and EventIdx buffers (page aligned).
pub(super) struct Dbbuf {
    pub shadow: GuestAddress,
    pub event_idx: GuestAddress,
    pub mem: Arc<dyn GuestMemory>,
    /// A failure was already logged for this configuration.
    pub warned: AtomicBool,
}

impl std::fmt::Debug for Dbbuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dbbuf")
            .field("shadow", &format_args!("{:#x}", self.shadow))
            .field("event_idx", &format_args!("{:#x}", self.event_idx))
            .finish_non_exhaustive()
    }
}

/// Byte offset of a doorbell in the buffers: same layout as the registers
/// (CAP.DSTRD is 0 here, so a stride of 4 bytes).
fn offset(db: Doorbell) -> u64 {
    u64::from(db.index()) * 4
}

impl Dbbuf {
    pub fn source(&self, db: Doorbell) -> DoorbellSource {
        DoorbellSource::Shadow {
            shadow: self.shadow.wrapping_add(offset(db)),
            event_idx: self.event_idx.wrapping_add(offset(db)),
        }
    }
}

impl Doorbells {
    /// Whether Doorbell Buffer Config is in effect.
    pub fn dbbuf_on(&self) -> bool {
        self.dbbuf_on.load(Ordering::Acquire)
    }

    /// The source a queue's doorbell `db` uses now: the shadow buffer once
    /// Doorbell Buffer Config succeeded (a host writes its shadow before it
    /// rings, so the shadow is the newest value; a ring only wakes), else the
    /// register (the doorbell page, where one is offered).
    pub fn source_for(&self, db: Doorbell) -> DoorbellSource {
        match self.dbbuf.read().as_ref() {
            Some(d) => d.source(db),
            None => DoorbellSource::Register,
        }
    }

    /// The source of a queue being created. With shadow doorbells on, its
    /// shadow slot and EventIdx start at 0 like the register (hosts may
    /// leave stale values from an earlier queue: SPDK and QEMU zero them
    /// too). A failed write is counted; the queue is still created.
    pub fn fresh_source(&self, db: Doorbell, mem: &dyn GuestMemory) -> DoorbellSource {
        let source = self.source_for(db);
        if let DoorbellSource::Shadow { shadow, event_idx } = source {
            for addr in [shadow, event_idx] {
                if let Err(e) = mem.store_u32(addr, 0) {
                    self.shadow_error(e);
                }
            }
        }
        source
    }

    /// Doorbell Buffer Config with checked, page-aligned buffers covering
    /// queue ids `0..queue_ids`. Every open doorbell's shadow slot and
    /// EventIdx are seeded with its current value (so the host's next move
    /// past it traps): the previous shadow buffer's value (a host
    /// re-configuring while shadow doorbells are on rings the shadow, not the
    /// register), else the register's. Returns `false`, with shadow
    /// doorbells off, if a buffer could not be written. The caller then
    /// switches each queue to [`source_for`](Self::source_for).
    pub fn configure_dbbuf(
        &self,
        shadow: GuestAddress,
        event_idx: GuestAddress,
        mem: Arc<dyn GuestMemory>,
        queue_ids: u16,
    ) -> bool {
        // The write lock keeps trap-path copies out while seeding.
        let mut guard = self.dbbuf.write();
        let previous = guard.take();
        let new = Dbbuf {
            shadow,
            event_idx,
            mem,
            warned: AtomicBool::new(false),
        };
        let ok = self.seed(&new, previous.as_ref(), queue_ids);
        if ok {
            *guard = Some(new);
        }
        self.dbbuf_on.store(ok, Ordering::Release);
        ok
    }

    fn seed(&self, new: &Dbbuf, previous: Option<&Dbbuf>, queue_ids: u16) -> bool {
        let mem = &*new.mem;
        for qid in 0..queue_ids {
            for db in [Doorbell::SqTail(qid), Doorbell::CqHead(qid)] {
                if !self.is_open(db) {
                    continue;
                }
                let value = previous
                    .and_then(|p| p.source(db).read(self, db, mem).ok())
                    .unwrap_or_else(|| self.register_value(db));
                let addr = offset(db);
                let (shadow, event_idx) = (
                    new.shadow.wrapping_add(addr),
                    new.event_idx.wrapping_add(addr),
                );
                if mem.store_u32(shadow, value).is_err() || mem.store_u32(event_idx, value).is_err()
                {
                    return false;
                }
                self.shadow_seeded(db, value);
            }
        }
        true
    }

    /// Doorbell Buffer Config seeded or zeroed this shadow slot with `value`:
    /// the device maintains it until the host is seen writing it.
    fn shadow_seeded(&self, db: Doorbell, value: u32) {
        if let Some(s) = self.slot(db) {
            s.shadow_dev.store(value, Ordering::Relaxed);
            s.shadow_host.store(false, Ordering::Relaxed);
        }
    }

    /// Trap path, after the value was validated and stored: copy an admin
    /// queue doorbell into its shadow slot if the device maintains that slot.
    /// Runs before the worker is kicked, so the worker's shadow read sees it.
    ///
    /// Linux and SPDK never write the admin queue's shadow slots (QEMU copies
    /// admin-queue traps too); our driver does. A host that writes the
    /// shadow stores it before the register (spec), so the shadow already
    /// holds this value or a newer one, and a copy could move it backwards
    /// if the (posted) trap arrives late. So copy only while the slot still
    /// holds what the device last stored there; the first time it holds
    /// anything else, the host owns it for good. (The host could still come
    /// back to the very value the device stored, a whole admin ring later,
    /// while one trap is in flight: admin commands are too slow for that.)
    ///
    /// I/O queues are never copied: every host writes their shadow slots,
    /// and a value check cannot tell "the host never wrote" from "the host
    /// wrote a whole ring's worth and came back to the same value" (a trap
    /// late by a ring: the copy then moved the tail back and the queue
    /// hung with commands the device never saw).
    pub fn shadow_trap(&self, db: Doorbell, value: u32) {
        if !self.dbbuf_on.load(Ordering::Acquire) {
            return;
        }
        let guard = self.dbbuf.read();
        let Some(d) = guard.as_ref() else {
            return;
        };
        let addr = d.shadow.wrapping_add(offset(db));
        if let Err(e) = self.copy_trap_to_shadow(db, value, addr, &*d.mem) {
            self.shadow_failed(d, e);
        }
    }

    fn copy_trap_to_shadow(
        &self,
        db: Doorbell,
        value: u32,
        addr: GuestAddress,
        mem: &dyn GuestMemory,
    ) -> Result<(), DmaError> {
        if !is_admin(db) {
            return Ok(());
        }
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

    /// The admin worker, where the doorbell page is offered and shadow
    /// doorbells are on: an admin doorbell the client rang through the page
    /// (no trap: QEMU maps the page into its guest, and Linux rings the
    /// admin queue's registers, never its shadow) is taken as a trap would
    /// be: stored as the register value and copied into the admin shadow
    /// slot while the device maintains it ([`shadow_trap`](Self::shadow_trap)).
    /// A value beyond the queue is left alone, as a trap would leave it.
    pub fn sync_admin_page(&self) {
        let Some(page) = &self.page else {
            return;
        };
        if !self.dbbuf_on() {
            return;
        }
        for db in [Doorbell::SqTail(0), Doorbell::CqHead(0)] {
            let Some(s) = self.slot(db) else {
                continue;
            };
            let value = page.load(db.index());
            if value == s.value.load(Ordering::Acquire) || value >= s.limit.load(Ordering::Acquire)
            {
                continue;
            }
            s.value.store(value, Ordering::SeqCst);
            self.shadow_trap(db, value);
        }
    }

    /// Counts a failed shadow buffer access and warns once per configuration.
    fn shadow_failed(&self, d: &Dbbuf, e: DmaError) {
        self.stats.shadow_errors.fetch_add(1, Ordering::Relaxed);
        if !d.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!("shadow doorbell buffer unreachable ({e}); its queues see no new work");
        }
    }

    /// Counts a failed shadow access from a worker (which holds no
    /// reference to the configuration).
    pub fn shadow_error(&self, e: DmaError) {
        match self.dbbuf.read().as_ref() {
            Some(d) => self.shadow_failed(d, e),
            None => {
                self.stats.shadow_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Drops the buffers (controller reset): the next enable starts with
    /// register doorbells until the host configures them again.
    pub fn clear_dbbuf(&self) {
        self.dbbuf_on.store(false, Ordering::Release);
        *self.dbbuf.write() = None;
    }
}

fn is_admin(db: Doorbell) -> bool {
    matches!(db, Doorbell::SqTail(0) | Doorbell::CqHead(0))
}

/// What a queue's last EventIdx write was, to skip rewriting the same value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct EventIdx {
    last: Option<u16>,
}

impl EventIdx {
    /// Writes `value` to the EventIdx dword of `source` (nothing for other
    /// sources). Skips the write if the device already wrote this value,
    /// unless `force` (arming before sleep rewrites it: the host might have
    /// scribbled there). Returns whether it wrote.
    pub fn publish(
        &mut self,
        doorbells: &Doorbells,
        qid: u16,
        source: DoorbellSource,
        value: u16,
        force: bool,
        mem: &dyn GuestMemory,
    ) -> bool {
        let Some(addr) = source.event_idx() else {
            return false;
        };
        if !force && self.last == Some(value) {
            return false;
        }
        match mem.store_u32(addr, u32::from(value)) {
            Ok(()) => {
                self.last = Some(value);
                if let Some(q) = doorbells.stats.queue(qid) {
                    q.eventidx_writes.fetch_add(1, Ordering::Relaxed);
                }
                true
            }
            Err(e) => {
                self.last = None;
                doorbells.shadow_error(e);
                false
            }
        }
    }

    /// Forgets the last value (new source).
    pub fn reset(&mut self) {
        self.last = None;
    }
}

/// The full barrier between publishing EventIdx and re-reading the shadow
/// value. Pairs with the host's barrier between its shadow store and its
/// EventIdx load (Linux `mb()`): either our re-read sees its new value, or
/// its EventIdx load sees ours and it rings the register.
pub(crate) fn barrier() {
    fence(Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vnvme_spec::regs::Doorbell;

    use super::super::Doorbells;
    use super::offset;
    use crate::memory::{GuestAddress, GuestMemory};
    use crate::stats::Stats;
    use crate::testing::VecMemory;

    const SHADOW: GuestAddress = GuestAddress(0x1000);
    const EVENT_IDX: GuestAddress = GuestAddress(0x2000);

    /// Doorbells with shadow buffers on and queue pairs 0 and 1 open.
    fn configured() -> (Doorbells, Arc<VecMemory>) {
        let doorbells = Doorbells::new(2, None, Arc::new(Stats::new(2)));
        for qid in [0, 1] {
            doorbells.open(Doorbell::SqTail(qid), 4, 0);
            doorbells.open(Doorbell::CqHead(qid), 4, 0);
        }
        let mem = Arc::new(VecMemory::new(0x3000));
        assert!(doorbells.configure_dbbuf(SHADOW, EVENT_IDX, mem.clone(), 2));
        (doorbells, mem)
    }

    fn shadow(mem: &VecMemory, db: Doorbell) -> u32 {
        mem.load_u32(SHADOW.wrapping_add(offset(db))).unwrap()
    }

    #[test]
    fn admin_traps_are_copied_while_the_host_leaves_the_shadow_alone() {
        let (doorbells, mem) = configured();
        for tail in [1, 2, 3, 0, 1] {
            doorbells.shadow_trap(Doorbell::SqTail(0), tail);
            assert_eq!(shadow(&mem, Doorbell::SqTail(0)), tail);
        }
    }

    #[test]
    fn an_admin_shadow_the_host_wrote_is_never_copied_over() {
        let (doorbells, mem) = configured();
        mem.store_u32(SHADOW.wrapping_add(offset(Doorbell::SqTail(0))), 2)
            .unwrap();
        // The trap of 1, late: the host already wrote 2.
        doorbells.shadow_trap(Doorbell::SqTail(0), 1);
        assert_eq!(shadow(&mem, Doorbell::SqTail(0)), 2);
        mem.store_u32(SHADOW.wrapping_add(offset(Doorbell::SqTail(0))), 0)
            .unwrap();
        doorbells.shadow_trap(Doorbell::SqTail(0), 3);
        assert_eq!(shadow(&mem, Doorbell::SqTail(0)), 0);
    }

    /// The host wrote 1, 2, 3 and came back to 0 (what the device stored at
    /// creation) before the trap of 1 arrived: copying it would move the
    /// tail back by a whole ring.
    #[test]
    fn a_late_io_queue_trap_never_moves_the_shadow_back() {
        let (doorbells, mem) = configured();
        doorbells.shadow_trap(Doorbell::SqTail(1), 1);
        assert_eq!(shadow(&mem, Doorbell::SqTail(1)), 0);
        doorbells.shadow_trap(Doorbell::CqHead(1), 1);
        assert_eq!(shadow(&mem, Doorbell::CqHead(1)), 0);
    }
}
