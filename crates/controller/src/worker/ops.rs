//! The owner's side of the ring operations admin commands send
//! ([`RingOp`]): taking a created queue's ring, deleting a queue, aborting
//! a command still in its SQ, switching doorbell sources. Whatever needs a
//! completion is answered to the admin worker, which posts it
//! ([`super::cq::post_answers`]).

use vnvme_spec::regs::Doorbell;
use vnvme_spec::Status;

use super::Local;
use crate::admin::abort::{abort_queued, NOT_ABORTED};
use crate::doorbell::Doorbells;
use crate::queue::rings::{RingOp, Rings};
use crate::queue::table::{Answer, QueueTable};
use crate::state::{Session, Shared};

/// Applies the operations the round took, in the order sent. The whole
/// [`Shared`]: the queue table, the doorbells and (for Abort) the faults
/// are three owners.
pub(super) fn apply(shared: &Shared, session: &Session, local: &mut Local) {
    if local.ops.is_empty() {
        return;
    }
    let (queues, doorbells) = (&shared.queues, &shared.doorbells);
    let ops = std::mem::take(&mut local.ops);
    let rings = &mut local.rings;
    for &op in &ops {
        match op {
            RingOp::AdoptSq(qid) => rings.adopt(queues, Doorbell::SqTail(qid)),
            RingOp::AdoptCq(qid) => rings.adopt(queues, Doorbell::CqHead(qid)),
            RingOp::DeleteSq { qid, cid } => delete_sq(queues, doorbells, rings, qid, cid),
            RingOp::DeleteCq { qid, cid } => delete_cq(queues, doorbells, rings, qid, cid),
            RingOp::Abort {
                sqid,
                cid,
                admin_cid,
            } => {
                let result = match rings.sq_mut(sqid).filter(|sq| sq.deleting.is_none()) {
                    Some(sq) => abort_queued(&shared.faults, queues, doorbells, session, sq, cid),
                    None => Ok(NOT_ABORTED),
                };
                match result {
                    Ok(dw0) => answer(queues, doorbells, admin_cid, dw0, Status::SUCCESS),
                    Err(status) => answer(queues, doorbells, admin_cid, 0, status),
                }
            }
            RingOp::Sources => sources(doorbells, rings),
        }
    }
    local.ops = ops;
    local.ops.clear();
}

/// Hands the admin worker the completion of admin command `cid` and
/// kicks the admin queue to post it.
fn answer(queues: &QueueTable, doorbells: &Doorbells, cid: u16, dw0: u32, status: Status) {
    queues.answer(Answer { cid, dw0, status });
    queues.kick_sq(doorbells, 0);
}

/// Delete I/O Submission Queue (§5.7): nothing more is fetched; the queue
/// goes once its commands in flight are done ([`finish_delete`]).
fn delete_sq(queues: &QueueTable, doorbells: &Doorbells, rings: &mut Rings, qid: u16, cid: u16) {
    let Some(sq) = rings.sq_mut(qid).filter(|sq| sq.deleting.is_none()) else {
        // The directory listed it, its owner does not hold it: never the
        // case while ops and rings move together; refuse rather than hang.
        if let Some(e) = queues.directory.lock().sq_mut(qid) {
            e.deleting = false;
        }
        answer(
            queues,
            doorbells,
            cid,
            0,
            Status::INVALID_QID.with_dnr(true),
        );
        return;
    };
    sq.deleting = Some(cid);
    finish_delete(queues, doorbells, rings, qid);
}

/// SQ `qid`, being deleted, goes if nothing of it is in flight any more:
/// its doorbell closed, its CQ released, the Delete answered.
pub(super) fn finish_delete(
    queues: &QueueTable,
    doorbells: &Doorbells,
    rings: &mut Rings,
    qid: u16,
) {
    let done = rings
        .sq_mut(qid)
        .is_some_and(|sq| sq.deleting.is_some() && sq.in_flight == 0);
    if !done {
        return;
    }
    let Some(sq) = rings.remove_sq(qid) else {
        return;
    };
    // A completion still owed on it (`queue::owed`) goes with it.
    let owed = queues.owed.drop_sq(qid);
    if let Some(cq) = rings.cq_mut(sq.cqid) {
        cq.reserved = cq.reserved.saturating_sub(owed);
    }
    let Some(cid) = sq.deleting else {
        return;
    };
    doorbells.close(Doorbell::SqTail(qid));
    queues.directory.lock().remove_sq(qid);
    answer(queues, doorbells, cid, 0, Status::SUCCESS);
}

/// Delete I/O Completion Queue (§5.6); the admin command checked that no
/// SQ uses it.
fn delete_cq(queues: &QueueTable, doorbells: &Doorbells, rings: &mut Rings, qid: u16, cid: u16) {
    rings.remove_cq(qid);
    doorbells.close(Doorbell::CqHead(qid));
    queues.directory.lock().remove_cq(qid);
    answer(queues, doorbells, cid, 0, Status::SUCCESS);
}

/// Doorbell Buffer Config switched (or reverted) the doorbells' sources.
fn sources(doorbells: &Doorbells, rings: &mut Rings) {
    for sq in rings.sqs_mut() {
        sq.set_source(doorbells.source_for(Doorbell::SqTail(sq.qid)));
    }
    for cq in rings.cqs_mut() {
        cq.set_source(doorbells.source_for(Doorbell::CqHead(cq.qid)));
    }
}
