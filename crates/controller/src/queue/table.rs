//! The queue table: every SQ and CQ slot, each worker's mailbox, and who
//! works which queue.
//!
//! What is what, for a save and restore of the controller: the queues
//! (base, size, head, tail, phase, the CQ a SQ completes on, their
//! doorbell sources and EventIdx) are guest-visible state; the mailboxes
//! (kicks not yet taken), the count of SQs whose Delete waits and each
//! queue's commands in flight are transient, to be drained before a save.

use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use parking_lot::Mutex;

use super::mailbox::{Bell, Mailbox};
use super::{Cq, Sq};

/// The worker of the admin queue: admin commands never run inside an I/O
/// worker's loop.
pub(crate) const ADMIN_WORKER: usize = 0;

/// The queues, by queue id, and the workers' mailboxes.
pub(crate) struct QueueTable {
    /// Indexed by queue id, `0..=max_io_queues`.
    pub sqs: Vec<Mutex<Option<Sq>>>,
    pub cqs: Vec<Mutex<Option<Cq>>>,
    /// One per worker thread: the admin worker's at [`ADMIN_WORKER`], then
    /// the I/O workers'.
    pub mailboxes: Vec<Mailbox>,
    /// SQs whose Delete waits for their commands in flight
    /// ([`Sq::deleting`]).
    pub deleting_sqs: AtomicU32,
}

impl QueueTable {
    /// `qids` queue ids of each kind (the admin queue's included) and
    /// `io_workers` I/O workers besides the admin queue's.
    pub fn new(qids: usize, io_workers: usize) -> Self {
        Self {
            sqs: (0..qids).map(|_| Mutex::new(None)).collect(),
            cqs: (0..qids).map(|_| Mutex::new(None)).collect(),
            mailboxes: (0..=io_workers).map(|_| Mailbox::default()).collect(),
            deleting_sqs: AtomicU32::new(0),
        }
    }

    /// As [`new`](Self::new), each worker a member of a poll group: worker
    /// `i` of `bells.len()` (the admin worker first) in the group whose
    /// index and bell `bells[i]` gives.
    pub fn in_groups(qids: usize, bells: Vec<(usize, Arc<Bell>)>) -> Self {
        Self {
            sqs: (0..qids).map(|_| Mutex::new(None)).collect(),
            cqs: (0..qids).map(|_| Mutex::new(None)).collect(),
            mailboxes: bells
                .into_iter()
                .map(|(i, bell)| Mailbox::in_group(i, bell))
                .collect(),
            deleting_sqs: AtomicU32::new(0),
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
}
