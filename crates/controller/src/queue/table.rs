//! The queue table: where queues rest while no worker serves them, what
//! admin commands know of every queue, each worker's mailbox, and who
//! works which queue.
//!
//! A queue's ring (positions, phase, EventIdx, fetched entries) belongs to
//! the worker that serves it ([`Rings`](super::rings::Rings)): the worker
//! takes it from its [`Slot`] when the queue is created or the worker
//! starts, runs every pass on it without a lock, and puts it back when it
//! stops (a reset, a pause, the end). Admin commands never touch a ring:
//! they read and update the [`Directory`], and what needs the ring itself
//! (deleting a queue, aborting a command still in it, switching its
//! doorbell source) they send to its worker as a
//! [`RingOp`](super::rings::RingOp), whose [`Answer`] the admin worker
//! posts.
//!
//! What is what, for a save and restore of the controller: the queues
//! (base, size, head, tail, phase, the CQ a SQ completes on, their
//! doorbell sources and EventIdx) are guest-visible state, saved from the
//! slots while the workers are stopped; the directory is derived from
//! them; the mailboxes (kicks and operations not yet taken), the answers
//! and each queue's commands in flight are transient, to be drained
//! before a save.

#[cfg(test)]
use std::sync::atomic::AtomicU64;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, MutexGuard};
use vnvme_spec::regs::Doorbell;
use vnvme_spec::Status;

use super::bell::Bell;
use super::mailbox::Mailbox;
use super::owed::OwedList;
use super::{Cq, CqView, Sq};
use crate::doorbell::Doorbells;

/// The worker of the admin queue: admin commands never run inside an I/O
/// worker's loop.
pub(crate) const ADMIN_WORKER: usize = 0;

/// A queue id's place in the table: the queue's ring while no worker holds
/// it. Test builds count the lock's acquisitions, so a test can say exactly
/// how many a command costs.
pub(crate) struct Slot<T> {
    ring: Mutex<Option<T>>,
    #[cfg(test)]
    locks: AtomicU64,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Self {
            ring: Mutex::new(None),
            #[cfg(test)]
            locks: AtomicU64::new(0),
        }
    }
}

impl<T> Slot<T> {
    pub fn lock(&self) -> MutexGuard<'_, Option<T>> {
        #[cfg(test)]
        self.locks.fetch_add(1, Ordering::Relaxed);
        self.ring.lock()
    }
}

/// What admin commands know of a SQ.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SqEntry {
    pub cqid: u16,
    /// A Delete waits for its worker.
    pub deleting: bool,
}

/// What admin commands (and the INTx level) know of a CQ.
#[derive(Debug, Clone)]
pub(crate) struct CqEntry {
    /// SQs that post here (a CQ in use cannot be deleted).
    pub sq_refs: u32,
    /// A Delete waits for its worker.
    pub deleting: bool,
    pub size: u32,
    pub ien: bool,
    pub iv: u16,
    /// Head and tail as its worker last saw them.
    pub view: Arc<CqView>,
}

/// Which queues exist, by queue id, as admin commands see them: each SQ's
/// CQ, the SQs each CQ serves, deletions under way. Only admin commands,
/// the control thread and a worker finishing a Delete take its lock.
#[derive(Debug, Default)]
pub(crate) struct Directory {
    pub sqs: Vec<Option<SqEntry>>,
    pub cqs: Vec<Option<CqEntry>>,
}

impl Directory {
    fn with_ids(qids: usize) -> Self {
        Self {
            sqs: vec![None; qids],
            cqs: vec![None; qids],
        }
    }

    pub fn sq(&self, qid: u16) -> Option<&SqEntry> {
        self.sqs.get(usize::from(qid))?.as_ref()
    }

    pub fn sq_mut(&mut self, qid: u16) -> Option<&mut SqEntry> {
        self.sqs.get_mut(usize::from(qid))?.as_mut()
    }

    pub fn cq(&self, qid: u16) -> Option<&CqEntry> {
        self.cqs.get(usize::from(qid))?.as_ref()
    }

    pub fn cq_mut(&mut self, qid: u16) -> Option<&mut CqEntry> {
        self.cqs.get_mut(usize::from(qid))?.as_mut()
    }

    pub fn add_cq(&mut self, cq: &Cq) {
        if let Some(e) = self.cqs.get_mut(usize::from(cq.qid)) {
            *e = Some(CqEntry {
                sq_refs: 0,
                deleting: false,
                size: cq.size,
                ien: cq.ien,
                iv: cq.iv,
                view: Arc::clone(&cq.view),
            });
        }
    }

    /// Adds SQ `sq`, a user of its CQ (which must be listed).
    pub fn add_sq(&mut self, sq: &Sq) {
        if let Some(e) = self.sqs.get_mut(usize::from(sq.qid)) {
            *e = Some(SqEntry {
                cqid: sq.cqid,
                deleting: false,
            });
        }
        if let Some(cq) = self.cq_mut(sq.cqid) {
            cq.sq_refs = cq.sq_refs.saturating_add(1);
        }
    }

    /// SQ `qid` is gone: its CQ has one user less.
    pub fn remove_sq(&mut self, qid: u16) {
        let Some(e) = self.sqs.get_mut(usize::from(qid)).and_then(Option::take) else {
            return;
        };
        if let Some(cq) = self.cq_mut(e.cqid) {
            cq.sq_refs = cq.sq_refs.saturating_sub(1);
        }
    }

    pub fn remove_cq(&mut self, qid: u16) {
        if let Some(e) = self.cqs.get_mut(usize::from(qid)) {
            *e = None;
        }
    }

    fn clear(&mut self) {
        self.sqs.iter_mut().for_each(|e| *e = None);
        self.cqs.iter_mut().for_each(|e| *e = None);
    }
}

/// A completion an admin command waits for: its worker did the part that
/// needs a ring, and the admin worker posts it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Answer {
    /// The admin command's CID.
    pub cid: u16,
    pub dw0: u32,
    pub status: Status,
}

/// The queues, by queue id, and the workers' mailboxes.
pub(crate) struct QueueTable {
    /// Indexed by queue id, `0..=max_io_queues`: rings no worker holds.
    pub sqs: Vec<Slot<Sq>>,
    pub cqs: Vec<Slot<Cq>>,
    pub directory: Mutex<Directory>,
    /// One per worker thread: the admin worker's at [`ADMIN_WORKER`], then
    /// the I/O workers'.
    pub mailboxes: Vec<Mailbox>,
    /// Admin commands a worker has done the ring's part of.
    answers: Mutex<Vec<Answer>>,
    /// Admin commands sent to a worker and not posted yet.
    awaited: AtomicU32,
    /// Completions waiting for a crash-area slot (`--supervise` only).
    pub owed: OwedList,
    /// Turns at every clear: a worker that stops after its controller's
    /// queues were cleared (blocked in storage past the reset's wait) drops
    /// its rings instead of putting stale ones back.
    epoch: Mutex<u64>,
    /// Set by [`Controller::pause_draining`](crate::Controller::pause_draining):
    /// until then a stopping worker completes its commands in flight
    /// before it stops (a reset's stop drops them instead).
    pub drain_until: Mutex<Option<Instant>>,
}

impl QueueTable {
    /// `qids` queue ids of each kind (the admin queue's included) and
    /// `io_workers` I/O workers besides the admin queue's.
    pub fn new(qids: usize, io_workers: usize) -> Self {
        Self::with_mailboxes(qids, (0..=io_workers).map(|_| Mailbox::default()).collect())
    }

    /// As [`new`](Self::new), each worker a member of a poll group: worker
    /// `i` of `bells.len()` (the admin worker first) in the group whose
    /// index and bell `bells[i]` gives.
    pub fn in_groups(qids: usize, bells: Vec<(usize, Arc<Bell>)>) -> Self {
        let mailboxes = bells
            .into_iter()
            .map(|(i, bell)| Mailbox::in_group(i, bell))
            .collect();
        Self::with_mailboxes(qids, mailboxes)
    }

    fn with_mailboxes(qids: usize, mailboxes: Vec<Mailbox>) -> Self {
        Self {
            sqs: (0..qids).map(|_| Slot::default()).collect(),
            cqs: (0..qids).map(|_| Slot::default()).collect(),
            directory: Mutex::new(Directory::with_ids(qids)),
            mailboxes,
            answers: Mutex::new(Vec::new()),
            awaited: AtomicU32::new(0),
            owed: OwedList::default(),
            epoch: Mutex::new(0),
            drain_until: Mutex::new(None),
        }
    }

    /// The worker that owns the queue pair whose CQ is `cqid`: SQs live with
    /// their CQ, so a CQ is only ever posted to by one thread. The admin
    /// queue has a worker of its own; I/O queues are spread over the others.
    pub fn worker_for(&self, cqid: u16) -> usize {
        let io_workers = self.mailboxes.len().saturating_sub(1).max(1);
        if cqid == 0 {
            ADMIN_WORKER
        } else {
            1 + usize::from(cqid - 1) % io_workers
        }
    }

    /// Queues SQ `qid` for a pass by its worker (outside a doorbell trap):
    /// `doorbells` names the worker, unless a kick is already pending or
    /// the queue does not exist.
    pub fn kick_sq(&self, doorbells: &Doorbells, qid: u16) {
        if let Some(w) = doorbells.request(Doorbell::SqTail(qid)) {
            if let Some(worker) = self.mailboxes.get(w) {
                worker.push(Doorbell::SqTail(qid));
            }
        }
    }

    /// An admin command was sent to a worker: the admin worker looks for
    /// its answer.
    pub fn await_answer(&self) {
        self.awaited.fetch_add(1, Ordering::AcqRel);
    }

    /// Admin commands sent to a worker and not posted yet.
    pub fn awaited(&self) -> u32 {
        self.awaited.load(Ordering::Acquire)
    }

    /// A worker's answer to an admin command (the caller kicks the admin
    /// queue).
    pub fn answer(&self, answer: Answer) {
        self.answers.lock().push(answer);
    }

    /// Takes the first answer, if any ([`answered`](Self::answered) once
    /// it is posted).
    pub fn next_answer(&self) -> Option<Answer> {
        let mut a = self.answers.lock();
        (!a.is_empty()).then(|| a.remove(0))
    }

    /// An answer taken with [`next_answer`](Self::next_answer) was posted.
    pub fn answered(&self) {
        let _ = self
            .awaited
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// The epoch rings taken now belong to.
    pub fn epoch(&self) -> u64 {
        *self.epoch.lock()
    }

    /// A stopping worker's rings go back to their slots, unless the queues
    /// were cleared since it took them (`epoch`).
    pub fn put_back_rings(&self, epoch: u64, sqs: Vec<Sq>, cqs: Vec<Cq>) {
        let current = self.epoch.lock();
        if *current != epoch {
            return;
        }
        for sq in sqs {
            if let Some(slot) = self.sqs.get(usize::from(sq.qid)) {
                *slot.lock() = Some(sq);
            }
        }
        for cq in cqs {
            if let Some(slot) = self.cqs.get(usize::from(cq.qid)) {
                *slot.lock() = Some(cq);
            }
        }
    }

    /// Deletes every queue (the workers stopped): slots, directory,
    /// operations not taken, answers, completions owed.
    pub fn clear(&self) {
        let mut epoch = self.epoch.lock();
        *epoch = epoch.wrapping_add(1);
        for s in &self.sqs {
            *s.lock() = None;
        }
        for c in &self.cqs {
            *c.lock() = None;
        }
        self.directory.lock().clear();
        for m in &self.mailboxes {
            m.drop_ops();
        }
        self.answers.lock().clear();
        self.awaited.store(0, Ordering::Release);
        self.owed.clear();
    }

    /// Lists the queues resting in the slots in the directory (after a
    /// restore or an enable put them there).
    pub fn list_resting(&self) {
        let mut dir = self.directory.lock();
        dir.clear();
        for slot in &self.cqs {
            if let Some(cq) = slot.lock().as_ref() {
                dir.add_cq(cq);
            }
        }
        for slot in &self.sqs {
            if let Some(sq) = slot.lock().as_ref() {
                dir.add_sq(sq);
            }
        }
    }
}

#[cfg(test)]
impl QueueTable {
    /// Times any queue's slot was locked so far.
    pub fn slot_locks(&self) -> u64 {
        let sqs = self.sqs.iter().map(|s| s.locks.load(Ordering::Relaxed));
        let cqs = self.cqs.iter().map(|s| s.locks.load(Ordering::Relaxed));
        sqs.chain(cqs).sum()
    }
}
