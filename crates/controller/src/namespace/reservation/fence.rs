//! The fence of Preempt and Abort: the Reservation Acquire that removes a
//! host's registration completes only once no command admitted before it
//! is still running on the namespace, so no write of the preempted host
//! reaches the medium after the preempting host got its completion (the
//! reason clusters fence with it).
//!
//! Each command admitted while the namespace has registrants is counted
//! in the slot of the Preempt and Abort epoch it was admitted in (the
//! count of those actions so far, [`SLOTS`] slots used round), and leaves
//! it when its [`Admitted`] drops: after its completion, when it is given
//! up (its queue deleted, its worker stopped) or when it failed before
//! reaching the backend. A preempt waits ([`Fence`]) until the slots of
//! every epoch before its own are empty. Counts are never short, only
//! long: a slot shared by an old epoch and a new one (64 preempts with a
//! command still running) makes a fence wait for the new commands too,
//! never complete early. A command admitted while the namespace had no
//! registrant at all is not counted (that path stays one load): its host
//! was no registrant, so no preempt concerns it.
//!
//! The race between a command entering a slot and a preempt moving the
//! epoch is closed as Dekker's: the command counts itself, then reads the
//! epoch again (and moves to the new slot if it changed); the preempt
//! stores the new epoch, then reads the counts. Sequentially consistent on
//! both sides, one of them sees the other.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use super::Reservations;
use crate::faults::Gate;

/// Slots of the counts, one per epoch modulo this.
pub(crate) const SLOTS: u64 = 64;

/// Commands running on a namespace, by the epoch they were admitted in.
#[derive(Debug)]
pub(crate) struct Pending {
    slots: [AtomicU32; SLOTS as usize],
    /// No counted command of an epoch below this is left.
    floor: AtomicU64,
}

impl Default for Pending {
    fn default() -> Self {
        Self {
            slots: std::array::from_fn(|_| AtomicU32::new(0)),
            floor: AtomicU64::new(0),
        }
    }
}

impl Pending {
    fn slot(&self, epoch: u64) -> &AtomicU32 {
        // In bounds: the index is below SLOTS.
        &self.slots[(epoch % SLOTS) as usize]
    }

    /// A command of `epoch` starts.
    pub fn enter(&self, epoch: u64) {
        self.slot(epoch).fetch_add(1, SeqCst);
    }

    /// A command of `epoch` is done.
    pub fn leave(&self, epoch: u64) {
        self.slot(epoch).fetch_sub(1, SeqCst);
    }

    /// Whether no counted command of an epoch below `epoch` is left.
    pub fn drained_before(&self, epoch: u64) -> bool {
        let floor = self.floor.load(SeqCst);
        if floor >= epoch {
            return true;
        }
        let n = (epoch - floor).min(SLOTS);
        if ((epoch - n)..epoch).any(|e| self.slot(e).load(SeqCst) != 0) {
            return false;
        }
        self.floor.fetch_max(epoch, SeqCst);
        true
    }

    /// Commands counted, all epochs (tests).
    #[cfg(test)]
    pub fn total(&self) -> u64 {
        self.slots.iter().map(|s| u64::from(s.load(SeqCst))).sum()
    }
}

/// How a command was admitted ([`Reservations::check`]): the reservation
/// word it saw, and its place in the counts while it runs. Kept with the
/// command until it completes; dropping it is the command's end.
#[derive(Debug, Default)]
pub(crate) struct Admitted {
    pub(super) word: u64,
    /// Counted in the slot of its epoch (the namespace had registrants).
    counted: Option<Arc<Reservations>>,
}

impl Admitted {
    /// Not counted: admitted with no registrant on the namespace.
    pub(super) fn free(word: u64) -> Self {
        Self {
            word,
            counted: None,
        }
    }

    /// Counted in `epoch`'s slot of `r`, already entered.
    pub(super) fn counted(word: u64, r: &Arc<Reservations>) -> Self {
        Self {
            word,
            counted: Some(r.clone()),
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Some(r) = self.counted.take() {
            r.pending.leave(super::epoch(self.word));
        }
    }
}

/// A Preempt and Abort's completion waiting for the commands admitted
/// before it ([`Fence::ready`]); the worker holds the command meanwhile
/// and looks again at each pass.
#[derive(Debug, Clone)]
pub(crate) struct Fence {
    reservations: Arc<Reservations>,
    epoch: u64,
}

impl Fence {
    pub(super) fn new(reservations: Arc<Reservations>, epoch: u64) -> Self {
        Self {
            reservations,
            epoch,
        }
    }

    /// Whether every command admitted before the preempt is done.
    pub fn ready(&self) -> bool {
        self.reservations.pending.drained_before(self.epoch)
    }
}

impl Gate for Fence {
    fn open(&self) -> bool {
        self.ready()
    }
}
