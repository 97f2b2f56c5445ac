//! What a supervised server keeps for its successor after a crash (issue
//! 35 item 3, docs/state-format.md "Crash area"): the controller tells a
//! [`CrashRecord`] the queue positions each worker reached after each
//! round, and that an admin command ran (the saved state may have
//! changed). The record (the binary's: a memfd shared with the supervisor)
//! is an `Option` the worker looks at once per round, so a server that is
//! not supervised pays one test per round and nothing per command.
//!
//! A restore takes the newest whole saved state and puts the positions
//! recorded since over its queues (`SavedState::put_positions`).

use std::sync::Arc;

use crate::queue::rings::Rings;

/// Where a SQ stands: the head past the commands fetched, and the last
/// valid tail seen (in `trap` mode no memory holds it but this).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqPosition {
    pub head: u32,
    pub tail: u32,
}

/// Where a CQ stands: the last valid head read, the tail the next entry
/// is posted at and the phase tag it is posted with, and how many entries
/// are promised to commands fetched and not completed (a restore cannot
/// complete them yet: it refuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqPosition {
    pub head: u32,
    pub tail: u32,
    pub phase: bool,
    pub reserved: u32,
}

/// Told by the controller what a crash would otherwise lose.
pub trait CrashRecord: Send + Sync + std::fmt::Debug {
    /// SQ `qid` stands at `pos` (a worker, after a round).
    fn sq(&self, qid: u16, pos: SqPosition);
    /// CQ `qid` stands at `pos` (a worker, after a round).
    fn cq(&self, qid: u16, pos: CqPosition);
    /// An admin command ran: the state other than positions may have
    /// changed (called by the admin queue's worker, before the round that
    /// ran it ends).
    fn admin_done(&self);
}

/// After a worker's round: its rings' positions to the record, if any.
pub(crate) fn after_round(record: Option<&Arc<dyn CrashRecord>>, rings: &mut Rings) {
    let Some(rec) = record else {
        return;
    };
    for sq in rings.sqs_mut() {
        rec.sq(
            sq.qid,
            SqPosition {
                head: sq.head,
                tail: sq.tail,
            },
        );
    }
    for cq in rings.cqs_mut() {
        rec.cq(
            cq.qid,
            CqPosition {
                head: cq.head,
                tail: cq.tail,
                phase: cq.phase,
                reserved: cq.reserved,
            },
        );
    }
}

/// After an admin command ran.
pub(crate) fn admin_done(record: Option<&Arc<dyn CrashRecord>>) {
    if let Some(rec) = record {
        rec.admin_done();
    }
}
