//! Completions owed (`vnvme serve --supervise`, issue 35 item 3): a
//! command that changed the saved state (every admin command but Identify
//! and Get Features, an answer or an event the admin queue completes with,
//! a reservation command that changed a registrant or a reservation) is
//! not completed until a
//! crash-area slot holding its effect was written, so a crash never
//! forgets a command the guest saw complete.
//!
//! How, with a crash record ([`crate::crash_record`]):
//!
//! 1. The worker runs the command as ever, then *owes* its completion
//!    instead of posting it: the CQ entry's values go on this list, one
//!    entry of its CQ is reserved for it (so the room it needs stays), the
//!    command is recorded in flight ([`CrashRecord::fetched`]) and the
//!    record is told the state changed ([`CrashRecord::admin_done`]).
//! 2. The keeper's checkpoint pauses the workers, saves the state (the
//!    list with it, `queues.owed` in docs/state-format.md), records the
//!    owed commands in flight again in the new generation, writes the
//!    slot, then releases them ([`Controller::release_owed`]).
//! 3. The CQ's worker posts each released completion at the end of its
//!    next pass over the SQ, then records it done
//!    ([`CrashRecord::completed`]).
//!
//! What a crash finds ([`SavedState::put_positions`]): before the slot,
//! the previous slot (without the command's effect) and the command in
//! flight, completed with Command Interrupted as any other; after the
//! slot and before the post, the slot's owed completion and the command
//! still in flight: the new controller posts it once ([`QueueTable::post_owed`]);
//! after the post, the entry found in the CQ or the record cleared: it
//! is not posted again.
//!
//! A checkpoint that fails (commands still in flight after its 100 ms of
//! draining, a slot too large) releases them all the same: the guest is
//! not kept waiting for a slot that may not come, and a crash before the
//! next slot forgets those commands as before (the keeper logs it).
//! Without a crash record nothing is owed: completions are posted at once.
//!
//! [`CrashRecord::fetched`]: crate::crash_record::CrashRecord::fetched
//! [`CrashRecord::admin_done`]: crate::crash_record::CrashRecord::admin_done
//! [`CrashRecord::completed`]: crate::crash_record::CrashRecord::completed
//! [`Controller::release_owed`]: crate::Controller::release_owed
//! [`SavedState::put_positions`]: crate::SavedState::put_positions
//! [`QueueTable::post_owed`]: super::table::QueueTable::post_owed

use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use vnvme_spec::{Command, Status};

/// A completion owed: the CQ entry to post once a slot holds its effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owed {
    pub sqid: u16,
    pub cqid: u16,
    pub cid: u16,
    /// The SQ's head right after the command was fetched.
    pub head: u32,
    /// Dwords 0 and 1.
    pub dw: u64,
    pub status: Status,
    /// A slot holds it (or a checkpoint failed): its worker may post it.
    pub released: bool,
}

/// An owed completion in a saved state (`queues.owed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SavedOwed {
    pub sqid: u16,
    pub cid: u16,
    pub head: u32,
    pub dw: u64,
    /// The status field (DW3 bits 31:17), as `Status::raw`.
    pub status: u16,
}

/// The completions owed, in the order they were owed.
#[derive(Debug, Default)]
pub(crate) struct OwedList {
    list: Mutex<Vec<Owed>>,
    /// Released and not yet posted: a worker's pass looks at the list only
    /// when this is not 0.
    released: AtomicU32,
    /// Admin commands a restore runs again (`saved_state::rerun`), in the
    /// order fetched: the admin worker takes them before its SQ's next
    /// entries, once a crash record is attached (so their completions are
    /// owed to a slot again, and kept to run again after another crash).
    rerun: Mutex<Vec<Command>>,
    /// The admin SQ's head and tail at the restore that left them: where
    /// they are recorded in flight when the record is attached.
    rerun_at: Mutex<(u32, u32)>,
}

impl OwedList {
    /// `o`'s completion waits for a slot.
    pub fn owe(&self, o: Owed) {
        self.list.lock().push(Owed {
            released: false,
            ..o
        });
    }

    /// Every completion owed may be posted now: the SQs whose worker
    /// should look (once each).
    pub fn release_all(&self) -> Vec<u16> {
        let mut list = self.list.lock();
        let mut sqs = Vec::new();
        for o in list.iter_mut().filter(|o| !o.released) {
            o.released = true;
            self.released.fetch_add(1, Ordering::AcqRel);
            if !sqs.contains(&o.sqid) {
                sqs.push(o.sqid);
            }
        }
        sqs
    }

    /// Completions released and not yet posted.
    pub fn released(&self) -> usize {
        self.released.load(Ordering::Acquire) as usize
    }

    /// Takes the released completions of SQ `sqid` on CQ `cqid`, in the
    /// order owed, for its worker to post.
    pub fn take_released(&self, sqid: u16, cqid: u16) -> Vec<Owed> {
        if self.released.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut list = self.list.lock();
        let mut taken = Vec::new();
        list.retain(|o| {
            let mine = o.released && o.sqid == sqid && o.cqid == cqid;
            if mine {
                taken.push(*o);
            }
            !mine
        });
        self.released
            .fetch_sub(taken.len() as u32, Ordering::AcqRel);
        taken
    }

    /// SQ `sqid` was deleted: its completions owed go with it (as a
    /// command's completion goes with a queue a reset deletes). How many
    /// entries of its CQ they held.
    pub fn drop_sq(&self, sqid: u16) -> u32 {
        let mut list = self.list.lock();
        let before = list.len();
        let mut released = 0;
        list.retain(|o| {
            let gone = o.sqid == sqid;
            if gone && o.released {
                released += 1;
            }
            !gone
        });
        self.released.fetch_sub(released, Ordering::AcqRel);
        (before - list.len()) as u32
    }

    /// Entries of CQ `cqid` reserved for completions owed.
    pub fn on_cq(&self, cqid: u16) -> u32 {
        self.list.lock().iter().filter(|o| o.cqid == cqid).count() as u32
    }

    /// The list for a saved state.
    pub fn save(&self) -> Vec<SavedOwed> {
        self.list
            .lock()
            .iter()
            .map(|o| SavedOwed {
                sqid: o.sqid,
                cid: o.cid,
                head: o.head,
                dw: o.dw,
                status: o.status.raw(),
            })
            .collect()
    }

    /// `cmds` run again before the admin SQ's next entries, the SQ at
    /// `(head, tail)`.
    pub fn rerun(&self, cmds: &[Command], at: (u32, u32)) {
        self.rerun.lock().extend_from_slice(cmds);
        *self.rerun_at.lock() = at;
    }

    /// The commands waiting to be run again, and the admin SQ's head and
    /// tail they wait at.
    pub fn waiting(&self) -> (Vec<Command>, (u32, u32)) {
        (self.rerun.lock().clone(), *self.rerun_at.lock())
    }

    /// Whether commands wait to be run again.
    pub fn reruns(&self) -> bool {
        !self.rerun.lock().is_empty()
    }

    /// The next command to run again, the first first.
    pub fn next_rerun(&self) -> Option<Command> {
        let mut list = self.rerun.lock();
        (!list.is_empty()).then(|| list.remove(0))
    }

    /// A reset: the queues go, and their completions with them (and the
    /// commands to run again: their SQ is gone).
    pub fn clear(&self) {
        self.list.lock().clear();
        self.rerun.lock().clear();
        self.released.store(0, Ordering::Release);
    }
}
