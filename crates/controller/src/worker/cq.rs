//! The completion side of a queue worker: posting CQ entries, the CQ head
//! and its EventIdx, settling interrupts (decided in [`crate::interrupts`]),
//! and the admin queue's
//! late completions (Asynchronous Event Requests, deferred SQ deletions).

use std::sync::atomic::Ordering;
use std::time::Instant;

use vnvme_spec::log::async_event;
use vnvme_spec::{Command, Completion, Status};
use zerocopy::little_endian::U32;

use crate::doorbell::{barrier, behind};
use crate::interrupts::Interrupts;
use crate::queue::rings::Rings;
use crate::queue::{Cq, Sq};
use crate::state::{Session, Shared};

/// When the worker should look again at the CQs whose interrupts wait.
pub(super) fn next_deadline(
    interrupts: &Interrupts,
    rings: &Rings,
    timers: &[u16],
) -> Option<Instant> {
    interrupts.next_deadline(timers, |cqid| rings.cq(cqid).and_then(Interrupts::deadline))
}

/// Settles the CQs whose coalescing timer is due. The whole [`Shared`]:
/// as [`settle_interrupt`].
pub(super) fn fire_timers(
    shared: &Shared,
    session: &Session,
    rings: &mut Rings,
    timers: &mut Vec<u16>,
) {
    timers.retain(|&cqid| match rings.cq_mut(cqid) {
        Some(cq) => !settle_interrupt(shared, session, cq),
        None => false,
    });
}

/// Raises the CQ's interrupt now or leaves it for later
/// ([`Interrupts::settle`](crate::interrupts::Interrupts::settle)).
/// Returns `true` when nothing is left pending. The whole [`Shared`]: it
/// may re-read the CQ head ([`refresh_cq_head`]).
pub(super) fn settle_interrupt(shared: &Shared, session: &Session, cq: &mut Cq) -> bool {
    shared
        .interrupts
        .settle(cq, &*session.irq, &shared.stats, |cq| {
            refresh_cq_head(shared, session, cq)
        })
}

/// Reads the CQ head; a bad value is ignored, counted and reported. The
/// whole [`Shared`]: the report is an asynchronous event.
pub(super) fn refresh_cq_head(shared: &Shared, session: &Session, cq: &mut Cq) {
    if cq.refresh_head(&shared.doorbells, &*session.mem).is_err() {
        if let Some(q) = shared.stats.queue(cq.qid) {
            q.invalid_doorbell_writes.fetch_add(1, Ordering::Relaxed);
        }
        shared.async_event(async_event::TYPE_ERROR, 0x01, 0x01);
    }
}

/// CQ EventIdx = head, fence, re-read the head: the host's next head update
/// traps (QEMU after posting; every mode when the CQ is full and we need the
/// head to move).
/// Unless `force`, an EventIdx already equal to the head is not rewritten
/// (a stalled queue polled again). The whole [`Shared`]: it re-reads the
/// head ([`refresh_cq_head`]).
pub(super) fn arm_cq(shared: &Shared, session: &Session, cq: &mut Cq, force: bool) {
    let head = cq.head as u16;
    if cq.event_idx.publish(
        &shared.doorbells,
        cq.qid,
        cq.source,
        head,
        force,
        &*session.mem,
    ) {
        barrier();
        refresh_cq_head(shared, session, cq);
    }
}

/// Adaptive: CQ EventIdx one behind the head seen (the host never traps on
/// a head update unless the worker arms it because the CQ is full).
///
/// Except while the guest uses the INTx pin: then EventIdx = head, so the
/// host's next head update traps. QEMU deasserts the line only at a BAR
/// access; without one after the host reaped, the line would stay asserted
/// and the guest's interrupt controller would redeliver it endlessly.
/// The whole [`Shared`]: INTx arms the CQ ([`arm_cq`]).
pub(super) fn publish_cq_behind(shared: &Shared, session: &Session, cq: &mut Cq) {
    if cq.ien && !session.irq.msix_enabled() {
        arm_cq(shared, session, cq, false);
        return;
    }
    let ei = behind(cq.head as u16);
    cq.event_idx.publish(
        &shared.doorbells,
        cq.qid,
        cq.source,
        ei,
        false,
        &*session.mem,
    );
}

/// Posts the completion of `cmd`, fetched from SQ `sqid`, to `cq`, with
/// `dw` as its command specific DW0 (bits 31:0) and DW1 (bits 63:32);
/// counts it and logs a failure. Returns `false` (and sets CSTS.CFS) if
/// the CQ is unwritable. The whole [`Shared`]: statistics, the error log
/// and CSTS.CFS are three owners.
#[allow(clippy::too_many_arguments)]
pub(super) fn post(
    shared: &Shared,
    session: &Session,
    sq_head: u16,
    sqid: u16,
    cq: &mut Cq,
    cmd: &Command,
    dw: u64,
    status: Status,
) -> bool {
    shared.stats.completion(sqid, status);
    if !status.is_success() {
        shared.log_error(sqid, cmd, status);
    }
    let mut cqe = Completion::new(dw as u32, sq_head, sqid, cmd.cid(), false, status);
    cqe.dw1 = U32::new((dw >> 32) as u32);
    if cq.post(&*session.mem, cqe).is_err() {
        shared.set_fatal("completion queue unwritable");
        return false;
    }
    true
}

/// Posts the completions of admin commands whose ring part a worker did
/// ([`crate::queue::rings::RingOp`]: Delete I/O Submission and Completion
/// Queue, Abort). Runs on the admin queue's worker, as long as its CQ has
/// room. The whole [`Shared`]: the answers are the queue table's, and
/// posting needs it ([`post`], [`refresh_cq_head`]).
pub(super) fn post_answers(shared: &Shared, session: &Session, sq: &Sq, cq: &mut Cq) {
    let table = &shared.queues;
    if table.awaited() == 0 {
        return;
    }
    loop {
        refresh_cq_head(shared, session, cq);
        if cq.is_full() {
            return;
        }
        let Some(a) = table.next_answer() else {
            return;
        };
        table.answered();
        let mut cmd = Command::default();
        cmd.set_cid(a.cid);
        let dw = u64::from(a.dw0);
        // Supervised: owed until a slot holds the deletion (`owe`).
        if let Some(rec) = super::owe::owing(shared) {
            super::owe::owe(shared, rec, sq, cq, &cmd, dw, a.status);
            continue;
        }
        if !post(shared, session, sq.head as u16, 0, cq, &cmd, dw, a.status) {
            return;
        }
    }
}

/// Completes outstanding Asynchronous Event Requests with queued events.
/// The whole [`Shared`]: the events are the reporting's, the counters
/// the statistics', an unwritable CQ sets CSTS.CFS, and the head is
/// re-read ([`refresh_cq_head`]).
pub(super) fn deliver_events(shared: &Shared, session: &Session, sq: &Sq, cq: &mut Cq) {
    loop {
        refresh_cq_head(shared, session, cq);
        if cq.is_full() {
            return;
        }
        let (cid, dw0) = {
            let mut e = shared.reporting.events.lock();
            if e.outstanding.is_empty() || e.queue.is_empty() {
                return;
            }
            let cid = e.outstanding.remove(0);
            let Some(dw0) = e.queue.pop_front() else {
                return;
            };
            (cid, dw0)
        };
        // Supervised: owed until a slot holds the event taken (`owe`).
        if let Some(rec) = super::owe::owing(shared) {
            let mut cmd = Command::default();
            cmd.set_cid(cid);
            let dw = u64::from(dw0);
            super::owe::owe(shared, rec, sq, cq, &cmd, dw, Status::SUCCESS);
            continue;
        }
        shared.stats.completion(0, Status::SUCCESS);
        let cqe = Completion::new(dw0, sq.head as u16, 0, cid, false, Status::SUCCESS);
        if cq.post(&*session.mem, cqe).is_err() {
            shared.set_fatal("completion queue unwritable");
            return;
        }
    }
}
