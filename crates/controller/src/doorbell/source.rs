//! Where a queue's doorbell value comes from: the register (a trap stored
//! it, or the client wrote the doorbell page) or the shadow doorbell buffer
//! (§5.8).

use std::sync::atomic::Ordering;

use vnvme_spec::regs::Doorbell;

use super::Doorbells;
use crate::memory::{DmaError, GuestAddress, GuestMemory};

/// Where a queue's doorbell value comes from (§5.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum DoorbellSource {
    /// The register ([`Doorbells::register_value`]): the doorbell page
    /// where it is offered, else the value the last trap stored.
    #[default]
    Register,
    /// Doorbell Buffer Config: guest addresses of this doorbell's dword in
    /// the shadow doorbell buffer and in the EventIdx buffer.
    Shadow {
        shadow: GuestAddress,
        event_idx: GuestAddress,
    },
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
        }
    }

    /// [`read`](Self::read) for queue `qid`'s doorbell `db`, counting
    /// shadow reads and failures. A failed read is "no new value": no
    /// stand-in, because the register may be older than what the shadow
    /// already gave (a late trap, or none at all while polling), and going
    /// backwards would replay old entries. The queue sees no new work until
    /// the host configures new buffers or resets the controller.
    pub fn current(
        &self,
        doorbells: &Doorbells,
        db: Doorbell,
        qid: u16,
        mem: &dyn GuestMemory,
    ) -> Option<u32> {
        let r = self.read(doorbells, db, mem);
        if self.is_shadow() {
            if let Some(q) = doorbells.stats.queue(qid) {
                q.shadow_reads.fetch_add(1, Ordering::Relaxed);
            }
        }
        r.map_err(|e| doorbells.shadow_error(e)).ok()
    }

    /// The EventIdx dword's address, for a shadow source.
    pub fn event_idx(&self) -> Option<GuestAddress> {
        match *self {
            DoorbellSource::Shadow { event_idx, .. } => Some(event_idx),
            _ => None,
        }
    }

    pub fn is_shadow(&self) -> bool {
        matches!(self, DoorbellSource::Shadow { .. })
    }
}
