//! Commands in flight on asynchronous backends, seen from the worker:
//! reaping their completions, finishing them as every read, write and
//! flush is finished ([`io::finish`]), and posting them (see
//! [`crate::inflight`]).

use std::sync::Arc;
use std::time::Instant;

use vnvme_blockdev::{BlockCompletion, Data, Waker};
use vnvme_spec::{Command, Status};

use super::cq::{arm_cq, post, publish_cq_behind, refresh_cq_head, settle_interrupt};
use super::ops::finish_delete;
use super::{EventIdxPolicy, Local};
use crate::command::Ctx;
use crate::inflight::{InFlight, Request};
use crate::io;
use crate::queue::{Cq, Sq};
use crate::state::{Session, Shared};

/// The waker a worker gives its asynchronous backends. Weak: the
/// commands a paused worker leaves in [`Shared::inflight_parked`] hold it,
/// and a strong one would keep their controller for ever.
pub(super) fn waker(shared: &Arc<Shared>, index: usize) -> Waker {
    let shared = Arc::downgrade(shared);
    Arc::new(move || {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if let Some(w) = shared.queues.mailboxes.get(index) {
            w.wake_for_completions();
        }
    })
}

/// A paused worker `index` stops with `inflight`: kept for the next
/// worker of its index unless empty (see [`crate::inflight`]).
pub(super) fn park(shared: &Shared, index: usize, inflight: InFlight) {
    if !inflight.is_empty() {
        shared
            .inflight_parked
            .lock()
            .push((index, Box::new(inflight)));
    }
}

/// What the worker `index` a pause stopped left, for its successor.
pub(super) fn adopt(shared: &Shared, index: usize) -> Option<InFlight> {
    let mut parked = shared.inflight_parked.lock();
    let at = parked.iter().position(|(i, _)| *i == index)?;
    let (_, inflight) = parked.swap_remove(at);
    // Only `park` puts anything there, always an `InFlight`.
    inflight.downcast::<InFlight>().ok().map(|b| *b)
}

/// Posts the completions of commands that finished on asynchronous
/// backends, then settles each CQ's interrupt once. Returns how many.
/// The whole [`Shared`]: posting ([`super::cq::post`]) needs it.
pub(super) fn complete_in_flight(
    shared: &Shared,
    session: &Session,
    local: &mut Local,
    policy: EventIdxPolicy,
) -> u32 {
    if local.inflight.is_empty() {
        return 0;
    }
    let mut reaped = std::mem::take(&mut local.reaped);
    local.inflight.reap(&mut reaped);
    let done = reaped.len() as u32;
    for (request, completion) in reaped.drain(..) {
        if let Some(cqid) = complete_one(shared, session, local, &request, &completion, policy) {
            if !local.touched.contains(&cqid) {
                local.touched.push(cqid);
            }
        }
        // After its CQ entry (a crash before leaves it in flight, and the
        // restore finds the entry by its phase).
        crate::crash_record::completed(shared.crash.get(), request.sqid, request.cmd.cid());
        // The last command of a SQ being deleted: the Delete completes.
        finish_delete(
            &shared.queues,
            &shared.doorbells,
            &mut local.rings,
            request.sqid,
        );
        if let Some(Data::Buf(buf)) = completion.data {
            local.inflight.recycle(buf);
        }
    }
    local.reaped = reaped;
    // Finishing a command may have started another (the rest of a
    // fused or split one): to the kernel before the worker may sleep.
    local.inflight.commit();
    settle_touched(shared, session, local);
    done
}

/// Settles the interrupt of each CQ posted to out of order (reaped or
/// released completions) once, or leaves it to a coalescing timer. The
/// whole [`Shared`]: as [`super::cq::settle_interrupt`].
pub(super) fn settle_touched(shared: &Shared, session: &Session, local: &mut Local) {
    for cqid in local.touched.drain(..) {
        if let Some(cq) = local.rings.cq_mut(cqid) {
            if !settle_interrupt(shared, session, cq) && !local.timers.contains(&cqid) {
                local.timers.push(cqid);
            }
        }
    }
}

/// Finishes one command that was in flight and posts its completion into
/// the entry reserved for it. A completion whose SQ or CQ is gone (deleted,
/// or the controller reset) is dropped: the command was aborted. Returns
/// the CQ posted to. The whole [`Shared`]: posting ([`super::cq::post`])
/// needs it.
fn complete_one(
    shared: &Shared,
    session: &Session,
    local: &mut Local,
    request: &Request,
    completion: &BlockCompletion,
    policy: EventIdxPolicy,
) -> Option<u16> {
    let (sq, cq) = local.rings.both(request.sqid, request.cqid);
    let cq = cq.filter(|cq| cq.instance == request.cq_instance)?;
    // Full (with this entry reserved): an SQ may be stalled on this CQ,
    // with CQ EventIdx armed for the head update that releases it.
    let stalled = cq.is_full();
    cq.reserved = cq.reserved.saturating_sub(1);
    let sq = sq.filter(|sq| sq.instance == request.sq_instance)?;
    // Once none is left, a Delete waiting for them completes
    // (`finish_delete`, after this completion).
    sq.in_flight = sq.in_flight.saturating_sub(1);
    if shared.lifecycle.fatal() {
        return None;
    }
    let mut ctx = Ctx {
        shared,
        qid: request.sqid,
        session,
        scratch: &mut local.scratch,
        inflight: &mut local.inflight,
    };
    let status = io::finish(
        &mut ctx,
        &request.cmd,
        &request.ns,
        &request.kind,
        completion,
        &[],
        &request.admitted,
    );
    // A write that cleared a Write Uncorrectable mark asked for a
    // checkpoint; its completion, posted here into its reserved entry,
    // is not owed (docs/crash-recovery.md).
    ctx.scratch.owed = false;
    let done = Reserved {
        cmd: &request.cmd,
        dw0: 0,
        status,
        stalled,
        started: request.started,
    };
    post_reserved(shared, session, sq, cq, done, policy)
}

/// A completion posted into the CQ entry reserved for it, outside the SQ's
/// pass: `stalled` if the CQ was full (with this entry reserved) before.
pub(super) struct Reserved<'a> {
    pub cmd: &'a Command,
    /// Completion DW0, and DW1 above it (Zone Append's LBA).
    pub dw0: u64,
    pub status: Status,
    pub stalled: bool,
    /// When the command started, if its latency is sampled.
    pub started: Option<Instant>,
}

/// Posts `done` with the EventIdx care of a pass; the CQ posted to, or
/// `None` if its memory is unwritable. The whole [`Shared`]: posting
/// ([`super::cq::post`]) needs it.
pub(super) fn post_reserved(
    shared: &Shared,
    session: &Session,
    sq: &Sq,
    cq: &mut Cq,
    done: Reserved<'_>,
    policy: EventIdxPolicy,
) -> Option<u16> {
    refresh_cq_head(shared, session, cq);
    if policy == EventIdxPolicy::Behind && !done.stalled {
        // As in `process_sq`: EventIdx behind the head before posting (not
        // over one armed for a stalled SQ).
        publish_cq_behind(shared, session, cq);
    }
    let (head, qid) = (sq.head as u16, sq.qid);
    if !post(
        shared,
        session,
        head,
        qid,
        cq,
        done.cmd,
        done.dw0,
        done.status,
    ) {
        return None;
    }
    shared.stats.latency(qid, done.started);
    if policy == EventIdxPolicy::Publish {
        arm_cq(shared, session, cq, true);
    }
    Some(cq.qid)
}
