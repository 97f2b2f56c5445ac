//! Abort (§5.1): a command the controller has not started yet (still in
//! its submission queue, e.g. behind a full completion queue) is completed
//! with Command Abort Requested instead of running. So is one a fault holds
//! back ([`crate::faults`]). One already fetched otherwise is not aborted:
//! it completes at once or, in flight on a backend, soon.

use vnvme_spec::cdw::Cdw10Abort;
use vnvme_spec::{Command, Status};

use crate::command::{Ctx, Outcome};
use crate::doorbell::Doorbells;
use crate::faults::Faults;
use crate::queue::rings::RingOp;
use crate::queue::table::QueueTable;
use crate::queue::Sq;
use crate::state::{Session, ACL};

/// Dword 0 bit 0: the command was not aborted.
pub(crate) const NOT_ABORTED: u32 = 1;

/// Entries read from the ring at a time while looking for the CID.
const WINDOW: u32 = 64;

/// The SQ's ring belongs to its worker: the Abort goes there
/// ([`abort_queued`]) and completes when it answers.
pub(super) fn abort(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<Outcome, Status> {
    let cdw10 = Cdw10Abort::from(cmd.cdw10.get());
    let shared = ctx.shared;
    let not_aborted = Outcome::Done {
        dw0: NOT_ABORTED,
        status: Status::SUCCESS,
    };
    // The admin queue's own entries: this worker is running them, and the
    // spec lets a controller decline any abort.
    if cdw10.sqid() == 0 {
        return Ok(not_aborted);
    }
    let table = &shared.queues;
    let worker = {
        let dir = table.directory.lock();
        match dir.sq(cdw10.sqid()).filter(|e| !e.deleting) {
            Some(e) => table.worker_for(e.cqid),
            None => return Ok(not_aborted),
        }
    };
    table.await_answer();
    if let Some(m) = table.mailboxes.get(worker) {
        m.send(RingOp::Abort {
            sqid: cdw10.sqid(),
            cid: cdw10.cid(),
            admin_cid: cmd.cid(),
        });
    }
    Ok(Outcome::Deferred)
}

/// On the SQ's worker: aborts `cid` if a fault holds it back (the worker
/// completes it) or it still sits in `sq`. Returns Abort's dword 0.
pub(crate) fn abort_queued(
    faults: &Faults,
    queues: &QueueTable,
    doorbells: &Doorbells,
    session: &Session,
    sq: &mut Sq,
    cid: u16,
) -> Result<u32, Status> {
    // Fetched, but held back by a fault: its worker completes it.
    if faults.abort(sq.qid, cid) {
        let worker = queues.worker_for(sq.cqid);
        if let Some(w) = queues.mailboxes.get(worker) {
            w.wake_for_completions();
        }
        return Ok(0);
    }
    let mem = &*session.mem;
    sq.refresh_tail(doorbells, mem);
    if !queued(sq, mem, cid) {
        return Ok(NOT_ABORTED);
    }
    if !sq.request_abort(cid, usize::from(ACL) + 1) {
        return Err(Status::ABORT_LIMIT_EXCEEDED.with_dnr(true));
    }
    Ok(0)
}

/// Whether a command with `cid` sits in the ring between head and tail.
fn queued(sq: &Sq, mem: &dyn crate::memory::GuestMemory, cid: u16) -> bool {
    let mut at = sq.head;
    let mut left = if sq.tail >= sq.head {
        sq.tail - sq.head
    } else {
        sq.size - sq.head + sq.tail
    };
    let mut entries = [Command::default(); WINDOW as usize];
    while left > 0 {
        let n = left.min(WINDOW).min(sq.size - at);
        let Some(window) = entries.get_mut(..n as usize) else {
            return false;
        };
        let addr = sq.base.wrapping_add(u64::from(at) * Command::SIZE as u64);
        if mem
            .read(addr, zerocopy::IntoBytes::as_mut_bytes(window))
            .is_err()
        {
            return false;
        }
        if window.iter().any(|c| c.cid() == cid) {
            return true;
        }
        left -= n;
        at = (at + n) % sq.size;
    }
    false
}
