//! Per-queue doorbells.
//!
//! Every SQ tail and CQ head update goes through [`DoorbellRegister::ring`],
//! so that shadow doorbells (Doorbell Buffer Config, NVMe 2.0 §5.8) can be
//! added in one place: store the value in the shadow buffer, full barrier,
//! read EventIdx, and write the register only if [`need_event`] says so.

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use vnvme_spec::regs::Doorbell;

use crate::access::{AccessError, DeviceAccess};

/// One doorbell register of one queue.
#[derive(Debug)]
pub struct DoorbellRegister {
    access: Arc<dyn DeviceAccess>,
    offset: u64,
    /// The value last made visible to the device.
    last: u16,
    /// Register writes made (each one is a trap on an emulated controller).
    writes: u64,
}

impl DoorbellRegister {
    pub fn new(access: Arc<dyn DeviceAccess>, doorbell: Doorbell, dstrd: u8) -> Self {
        Self {
            access,
            offset: doorbell.offset(dstrd),
            last: 0,
            writes: 0,
        }
    }

    /// Publishes `value` (new SQ tail or CQ head) to the device.
    pub fn ring(&mut self, value: u16) -> Result<(), AccessError> {
        // Queue entries (SQEs written, CQ slots released) must be visible in
        // shared memory before the device can act on the doorbell.
        fence(Ordering::SeqCst);
        self.access.write32(self.offset, u32::from(value))?;
        self.last = value;
        self.writes += 1;
        Ok(())
    }

    /// The value last published.
    pub fn last(&self) -> u16 {
        self.last
    }

    /// Register writes made so far.
    pub fn writes(&self) -> u64 {
        self.writes
    }

    /// BAR0 offset of the register.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

/// The need-event tests of shadow doorbells: given the old and new doorbell
/// values and the device's EventIdx, whether the host must write the real
/// register. Both are correct in the sense that neither loses a wake-up; they
/// differ by one on whether reaching EventIdx exactly needs a trap.
pub mod need_event {
    /// Linux `nvme_dbbuf_need_event`: `(u16)(new - ei - 1) < (u16)(new - old)`
    /// — notify when the update moves the value past EventIdx.
    pub fn linux(new: u16, old: u16, event_idx: u16) -> bool {
        new.wrapping_sub(event_idx).wrapping_sub(1) < new.wrapping_sub(old)
    }

    /// SPDK / libvfn: `(u16)(new - ei) <= (u16)(new - old)` — notify when the
    /// update moves the value onto or past EventIdx.
    pub fn spdk(new: u16, old: u16, event_idx: u16) -> bool {
        new.wrapping_sub(event_idx) <= new.wrapping_sub(old)
    }
}

#[cfg(test)]
mod tests {
    use super::need_event;

    #[test]
    fn need_event_linux_fires_when_crossing_event_idx() {
        // Device wants to hear once the tail moves past 5.
        assert!(need_event::linux(6, 5, 5));
        assert!(need_event::linux(8, 3, 5));
        assert!(
            !need_event::linux(5, 3, 5),
            "reaching EventIdx is not past it"
        );
        assert!(!need_event::linux(4, 3, 5));
        // Wrap-around.
        assert!(need_event::linux(2, 65534, 65535));
        assert!(!need_event::linux(65534, 65533, 2));
    }

    #[test]
    fn need_event_spdk_fires_when_reaching_or_crossing_event_idx() {
        assert!(need_event::spdk(5, 3, 5));
        assert!(need_event::spdk(6, 5, 5));
        assert!(!need_event::spdk(4, 3, 5));
        assert!(need_event::spdk(1, 65534, 0));
        assert!(!need_event::spdk(1, 65534, 2));
    }
}
