//! Doorbell Buffer Config state (NVMe Base 2.0 §5.8): where the shadow
//! doorbell and EventIdx buffers are, the trap-path copy into the shadow, and
//! EventIdx publication.
//!
//! The buffers live in `Shared::dbbuf` (a leaf lock: written by the admin
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

use crate::doorbell::DoorbellSource;
use crate::memory::{DmaError, GuestMemory};
use crate::state::Shared;

/// Configured shadow doorbell and EventIdx buffers (page aligned).
pub(crate) struct Dbbuf {
    pub shadow: u64,
    pub event_idx: u64,
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

impl Shared {
    /// The source a queue's doorbell `db` uses now: the mmap-poll page, the
    /// shadow buffer once Doorbell Buffer Config succeeded, else the register.
    pub fn source_for(&self, db: Doorbell) -> DoorbellSource {
        if self.config.doorbells == crate::DoorbellMode::MmapPoll {
            return DoorbellSource::Page;
        }
        match self.dbbuf.read().as_ref() {
            Some(d) => d.source(db),
            None => DoorbellSource::Register,
        }
    }

    /// Trap path, after the value was validated and stored: copy it into the
    /// queue's shadow slot if the device maintains that slot (see
    /// [`Doorbells::copy_trap_to_shadow`](crate::doorbell::Doorbells::copy_trap_to_shadow)).
    /// Runs before the worker is kicked, so the worker's shadow read sees it.
    pub fn shadow_trap(&self, db: Doorbell, value: u32) {
        if !self.dbbuf_on.load(Ordering::Acquire) {
            return;
        }
        let guard = self.dbbuf.read();
        let Some(d) = guard.as_ref() else {
            return;
        };
        let addr = d.shadow.wrapping_add(offset(db));
        if let Err(e) = self.doorbells.copy_trap_to_shadow(db, value, addr, &*d.mem) {
            self.shadow_failed(d, e);
        }
    }

    /// Counts a failed shadow buffer access and warns once per configuration.
    pub fn shadow_failed(&self, d: &Dbbuf, e: DmaError) {
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
        shared: &Shared,
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
                if let Some(q) = shared.stats.queue(qid) {
                    q.eventidx_writes.fetch_add(1, Ordering::Relaxed);
                }
                true
            }
            Err(e) => {
                self.last = None;
                shared.shadow_error(e);
                false
            }
        }
    }

    /// Forgets the last value (new source).
    pub fn reset(&mut self) {
        self.last = None;
    }
}

/// The EventIdx that keeps a polling device's host from trapping: one
/// behind the value seen, mod 2^16. The host's move from `old` to `new`
/// traps when EventIdx lies in `[old, new)` (Linux) or `[old, new]` (SPDK),
/// counted mod 2^16; every value the host can move to lies ahead of `seen`
/// within the ring, so neither interval reaches `seen - 1` — except SPDK's
/// when the host fills the ring completely (`new == seen - 1`), which traps
/// once: the safe direction. Valid only while the device keeps it updated.
pub(crate) fn behind(seen: u16) -> u16 {
    seen.wrapping_sub(1)
}

/// The full barrier between publishing EventIdx and re-reading the shadow
/// value. Pairs with the host's barrier between its shadow store and its
/// EventIdx load (Linux `mb()`): either our re-read sees its new value, or
/// its EventIdx load sees ours and it rings the register.
pub(crate) fn barrier() {
    fence(Ordering::SeqCst);
}
