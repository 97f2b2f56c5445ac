//! Per-queue doorbells: plain MMIO registers, or shadow doorbells with
//! EventIdx (NVMe 2.0 §5.8 Doorbell Buffer Config).
//!
//! Every SQ tail and CQ head update goes through [`DoorbellRegister::ring`].
//! With shadow buffers attached it follows Linux
//! `nvme_dbbuf_update_and_check_event`: release fence (queue entries before
//! the shadow value), store the shadow value, full fence (the shadow store
//! before the EventIdx load), load EventIdx, and write the real register only
//! if the [`NeedEvent`] test says the update crossed EventIdx.
//!
//! The ordering needs no test of its own: it holds by construction, since
//! `ring` is the only code that stores shadow values and loads EventIdx, and
//! each step is one fence or one atomic access in that order. The full fence
//! pairs with the device's "publish EventIdx; full fence; re-read the shadow
//! value": one of the two sides always sees the other's store, so a wake-up
//! cannot be lost.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use vnvme_spec::event_idx::{need_event_linux, need_event_spdk};
use vnvme_spec::regs::{offset, Doorbell};

use crate::access::{AccessError, DeviceAccess, DmaBuffer, PAGE_SIZE};

/// How the driver tells the device about new SQ tails and CQ heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoorbellKind {
    /// Every update is a register write (a trap on an emulated controller).
    Mmio,
    /// Shadow doorbell buffers with EventIdx: register writes only when the
    /// device asks for them.
    Shadow,
    /// The doorbell page of BAR0 is mapped into the driver (vfio-user sparse
    /// mmap): every update is a plain store that the device polls.
    Mapped,
}

impl DoorbellKind {
    pub fn name(self) -> &'static str {
        match self {
            DoorbellKind::Mmio => "mmio",
            DoorbellKind::Shadow => "shadow",
            DoorbellKind::Mapped => "mapped",
        }
    }
}

impl std::fmt::Display for DoorbellKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which need-event test decides whether a shadow update also writes the
/// register. Both lose no wake-up; they differ by one on whether reaching
/// EventIdx exactly needs a register write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NeedEvent {
    /// [`need_event_linux`]: write when the value moves past EventIdx.
    #[default]
    Linux,
    /// [`need_event_spdk`]: write when the value moves onto or past EventIdx.
    Spdk,
}

impl NeedEvent {
    /// Whether moving the doorbell from `old` to `new` must write the
    /// register, given the device's `event_idx`.
    pub fn check(self, new: u16, old: u16, event_idx: u16) -> bool {
        match self {
            NeedEvent::Linux => need_event_linux(event_idx, new, old),
            NeedEvent::Spdk => need_event_spdk(event_idx, new, old),
        }
    }
}

/// The two pages given to the device by Doorbell Buffer Config (§5.8): the
/// shadow doorbell buffer (PRP1) and the EventIdx buffer (PRP2), one memory
/// page each, laid out like the doorbell registers.
#[derive(Debug, Clone)]
pub struct ShadowBuffers {
    shadow: DmaBuffer,
    event_idx: DmaBuffer,
    dstrd: u8,
    need_event: NeedEvent,
}

impl ShadowBuffers {
    /// Wraps two zeroed, page-aligned pages of DMA memory.
    pub fn new(shadow: DmaBuffer, event_idx: DmaBuffer, dstrd: u8, need_event: NeedEvent) -> Self {
        Self {
            shadow,
            event_idx,
            dstrd,
            need_event,
        }
    }

    /// Device address of the shadow doorbell buffer (PRP1).
    pub fn shadow_iova(&self) -> u64 {
        self.shadow.iova()
    }

    /// Device address of the EventIdx buffer (PRP2).
    pub fn event_idx_iova(&self) -> u64 {
        self.event_idx.iova()
    }

    /// Whether the slots of queues `0..=max_qid` fit the pages:
    /// `(4 << DSTRD) * 2 * (max_qid + 1) <= page size`.
    pub fn fits(dstrd: u8, max_qid: u16) -> bool {
        Self::slot(Doorbell::CqHead(max_qid), dstrd).is_some()
    }

    /// Byte offset of `doorbell`'s slot in both pages, if it fits a page.
    fn slot(doorbell: Doorbell, dstrd: u8) -> Option<usize> {
        let at = doorbell
            .offset(dstrd.min(15))
            .checked_sub(offset::DOORBELLS)?;
        let at = usize::try_from(at).ok()?;
        (at.checked_add(4)? <= PAGE_SIZE).then_some(at)
    }
}

/// One queue's slot in the shadow buffers.
#[derive(Debug)]
struct ShadowSlot {
    shadow: DmaBuffer,
    event_idx: DmaBuffer,
    at: usize,
    need_event: NeedEvent,
}

/// One doorbell of one queue: the register and, with Doorbell Buffer Config
/// in force, its shadow slot.
#[derive(Debug)]
pub struct DoorbellRegister {
    access: Arc<dyn DeviceAccess>,
    doorbell: Doorbell,
    offset: u64,
    /// The value last made visible to the device.
    last: u16,
    /// Whether the register is in a mapped area (writes are plain stores).
    mapped: bool,
    /// Register writes that went to the device as messages (each one is a
    /// trap on an emulated controller).
    writes: u64,
    /// Register writes that were stores to the mapped doorbell page.
    mapped_writes: u64,
    /// Values stored in the shadow slot.
    shadow_updates: u64,
    shadow: Option<ShadowSlot>,
}

impl DoorbellRegister {
    /// The doorbell of `doorbell`; whether it is mapped is decided now, so
    /// the device's registers must be mapped (if at all) before.
    pub fn new(access: Arc<dyn DeviceAccess>, doorbell: Doorbell, dstrd: u8) -> Self {
        let offset = doorbell.offset(dstrd);
        Self {
            mapped: access.is_mapped(offset),
            access,
            doorbell,
            offset,
            last: 0,
            writes: 0,
            mapped_writes: 0,
            shadow_updates: 0,
            shadow: None,
        }
    }

    /// From now on, updates go to the shadow slot first. The slot is seeded
    /// with the value last published, so the device's view does not go back
    /// (this matters for a queue that existed before Doorbell Buffer Config,
    /// i.e. the admin queue).
    pub fn attach_shadow(&mut self, bufs: &ShadowBuffers) -> Result<(), AccessError> {
        let at =
            ShadowBuffers::slot(self.doorbell, bufs.dstrd).ok_or(AccessError::OutOfBounds {
                offset: usize::try_from(self.offset).unwrap_or(usize::MAX),
                len: 4,
                size: PAGE_SIZE,
            })?;
        bufs.shadow.store_u32(at, u32::from(self.last))?;
        self.shadow = Some(ShadowSlot {
            shadow: bufs.shadow.clone(),
            event_idx: bufs.event_idx.clone(),
            at,
            need_event: bufs.need_event,
        });
        Ok(())
    }

    /// Publishes `value` (new SQ tail or CQ head) to the device.
    pub fn ring(&mut self, value: u16) -> Result<(), AccessError> {
        // Queue entries (SQEs written, CQ slots released) must be visible in
        // shared memory before the device can see the new value, whether in
        // the shadow slot, in a mapped register or behind a trap.
        fence(Ordering::Release);
        let need_write = match &self.shadow {
            None => true,
            Some(slot) => {
                slot.shadow.store_u32(slot.at, u32::from(value))?;
                self.shadow_updates += 1;
                // Store-load ordering: the device publishes EventIdx, fences
                // and re-reads the shadow value; we store the shadow value,
                // fence and read EventIdx. Without this fence both could read
                // stale values and the update would never be noticed.
                fence(Ordering::SeqCst);
                // Device-written: any value is acceptable, only the low 16
                // bits take part in the test.
                let event_idx = slot.event_idx.load_u32(slot.at)? as u16;
                slot.need_event.check(value, self.last, event_idx)
            }
        };
        // The shadow slot holds `value` now; the device's view has moved even
        // if the register write below fails.
        self.last = value;
        if need_write {
            self.access.write32(self.offset, u32::from(value))?;
            if self.mapped {
                self.mapped_writes += 1;
            } else {
                self.writes += 1;
            }
        }
        Ok(())
    }

    /// The value last published.
    pub fn last(&self) -> u16 {
        self.last
    }

    /// Register writes made so far that were messages (traps).
    pub fn writes(&self) -> u64 {
        self.writes
    }

    /// Register writes made so far that were stores to a mapped page.
    pub fn mapped_writes(&self) -> u64 {
        self.mapped_writes
    }

    /// Shadow slot updates made so far (0 without shadow buffers).
    pub fn shadow_updates(&self) -> u64 {
        self.shadow_updates
    }

    /// Whether updates go through a shadow slot.
    pub fn has_shadow(&self) -> bool {
        self.shadow.is_some()
    }

    /// BAR0 offset of the register.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recorder::Recorder;

    #[test]
    fn need_event_on_a_ring_wrap_covers_old_to_65535() {
        // A 4-entry ring going 3 -> 0.
        for t in [NeedEvent::Linux, NeedEvent::Spdk] {
            assert!(t.check(0, 3, 3), "{t:?}: EventIdx 3 was crossed");
            assert!(t.check(0, 3, 0xFFFF), "{t:?}: 0xFFFF is in the window");
            assert!(!t.check(0, 3, 2), "{t:?}: one behind is never crossed");
        }
        assert!(!NeedEvent::Linux.check(0, 3, 0));
        assert!(NeedEvent::Spdk.check(0, 3, 0));
    }

    #[test]
    fn shadow_slots_follow_the_register_layout_and_must_fit_a_page() {
        assert_eq!(ShadowBuffers::slot(Doorbell::SqTail(0), 0), Some(0));
        assert_eq!(ShadowBuffers::slot(Doorbell::CqHead(0), 0), Some(4));
        assert_eq!(ShadowBuffers::slot(Doorbell::SqTail(3), 0), Some(24));
        assert_eq!(ShadowBuffers::slot(Doorbell::CqHead(3), 2), Some(7 * 16));
        assert!(ShadowBuffers::fits(0, 511));
        assert!(!ShadowBuffers::fits(0, 512));
        assert!(ShadowBuffers::fits(3, 63));
        assert!(!ShadowBuffers::fits(3, 64));
        assert!(!ShadowBuffers::fits(15, 0), "a 128 KiB stride never fits");
    }

    fn shadowed(need_event: NeedEvent) -> (Arc<Recorder>, ShadowBuffers, DoorbellRegister) {
        let rec = Arc::new(Recorder::new());
        let access: Arc<dyn DeviceAccess> = rec.clone();
        let bufs = ShadowBuffers::new(
            access.dma_alloc(PAGE_SIZE).unwrap(),
            access.dma_alloc(PAGE_SIZE).unwrap(),
            0,
            need_event,
        );
        let mut db = DoorbellRegister::new(access, Doorbell::SqTail(1), 0);
        db.attach_shadow(&bufs).unwrap();
        (rec, bufs, db)
    }

    #[test]
    fn shadow_ring_stores_the_value_and_writes_the_register_only_on_need() {
        let (rec, bufs, mut db) = shadowed(NeedEvent::Linux);
        // EventIdx 0 (zeroed page): the first update crosses it.
        db.ring(1).unwrap();
        db.ring(2).unwrap();
        assert_eq!(
            bufs.shadow.load_u32(8).unwrap(),
            2,
            "SQ1 tail slot is 2 * 1 * 4"
        );
        assert_eq!(*rec.writes.lock(), [(0x1008, 1)]);
        // The device arms EventIdx at the tail it has seen.
        bufs.event_idx.store_u32(8, 2).unwrap();
        db.ring(3).unwrap();
        db.ring(4).unwrap();
        assert_eq!(*rec.writes.lock(), [(0x1008, 1), (0x1008, 3)]);
        assert_eq!((db.writes(), db.shadow_updates()), (2, 4));
    }

    #[test]
    fn shadow_ring_ignores_the_high_bits_of_a_hostile_event_idx() {
        let (rec, bufs, mut db) = shadowed(NeedEvent::Spdk);
        bufs.event_idx.store_u32(8, 0xFFFF_0001).unwrap();
        db.ring(1).unwrap();
        assert_eq!(*rec.writes.lock(), [(0x1008, 1)]);
    }

    #[test]
    fn attaching_a_shadow_seeds_the_slot_with_the_last_value() {
        let (_rec, bufs, _db) = shadowed(NeedEvent::Linux);
        let access: Arc<dyn DeviceAccess> = _rec.clone();
        let mut cq0 = DoorbellRegister::new(access, Doorbell::CqHead(0), 0);
        cq0.ring(7).unwrap();
        cq0.attach_shadow(&bufs).unwrap();
        assert_eq!(bufs.shadow.load_u32(4).unwrap(), 7);
        assert!(cq0.has_shadow());
    }
}
