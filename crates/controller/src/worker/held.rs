//! Commands a fault holds back (see [`crate::faults`]): a latency fault
//! starts its command later, a never-complete fault keeps it until Abort
//! asks for it or a controller reset drops it (the worker's list goes with
//! the worker). Meanwhile the worker goes on with other commands.
//!
//! A held command keeps its CQ entry reserved, so its completion always
//! has room; a delayed one also counts in flight on its SQ (Delete I/O
//! Submission Queue waits for it, §5.6), a never-completing one does not
//! (the host deletes the queue when it gives up on it).
//!
//! Commands an IOPS or bandwidth limit holds back ([`crate::qos`]) wait
//! here too, as delayed ones: until their limits let them start, charged
//! again if the limits change meanwhile.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vnvme_spec::{Command, Status};

use super::reap::{post_reserved, settle_touched, Reserved};
use super::{EventIdxPolicy, Local};
use crate::command::{Ctx, Outcome};
use crate::faults::{Faults, Gate, Held, Hit};
use crate::io;
use crate::namespace::reservation::Fence;
use crate::qos::{self, Qos, Throttled};
use crate::queue::mailbox::Wait;
use crate::queue::{Cq, Sq};
use crate::state::{Session, Shared};
use crate::subsystem::Subsystem;

/// What a fault's `hit` makes of `cmd`: completed at once with a failed
/// status, or held back (a delay or never: [`Outcome::Deferred`], its
/// completion reserved); `None` to run it as usual (too many are held).
pub(super) fn hold(
    faults: &Faults,
    held: &mut Vec<Held>,
    sq: &mut Sq,
    cq: &mut Cq,
    cmd: &Command,
    hit: Hit,
) -> Option<Outcome> {
    let due = match hit {
        Hit::Fail(status) => return Some(Outcome::Done { dw0: 0, status }),
        Hit::Delay(d) => Some(Instant::now() + d),
        Hit::Hang => None,
    };
    if !faults.hold(sq.qid, cmd.cid()) {
        return None;
    }
    push(held, sq, cq, cmd, due, None, None);
    Some(Outcome::Deferred)
}

/// Holds `cmd` in `held`, its completion reserved on `cq`; one that is
/// due some time also counts in flight on `sq` (a Delete I/O Submission
/// Queue waits for it; one that hangs is aborted).
fn push(
    held: &mut Vec<Held>,
    sq: &mut Sq,
    cq: &mut Cq,
    cmd: &Command,
    due: Option<Instant>,
    throttled: Option<Throttled>,
    fence: Option<Arc<dyn Gate>>,
) {
    cq.reserved = cq.reserved.saturating_add(1);
    if due.is_some() {
        sq.in_flight = sq.in_flight.saturating_add(1);
    }
    held.push(Held {
        cmd: *cmd,
        sqid: sq.qid,
        sq_instance: sq.instance,
        cqid: cq.qid,
        cq_instance: cq.instance,
        due,
        throttled,
        fence,
    });
}

/// How often a worker looks again at a held Preempt and Abort's fence:
/// the commands it waits for may complete on another worker, which does
/// not wake this one.
const FENCE_POLL: Duration = Duration::from_millis(1);

/// Holds Reservation Acquire `cmd` (a Preempt and Abort that ran) until
/// `fence` is ready, then completes it with success ([`release`]). Not in
/// the faults' table: Abort does not find it (its change is made), and it
/// counts in flight on its SQ, as a Delete I/O Submission Queue waits for
/// it.
pub(super) fn fence(held: &mut Vec<Held>, sq: &mut Sq, cq: &mut Cq, cmd: &Command, fence: Fence) {
    let due = Some(Instant::now() + FENCE_POLL);
    push(held, sq, cq, cmd, due, None, Some(Arc::new(fence)));
}

/// Holds I/O command `cmd` until its limits let it start ([`crate::qos`]);
/// `None`: it starts now. Without limits, one relaxed load. The whole
/// [`Shared`]: as [`throttle_limited`], reached only with limits set.
#[inline]
pub(super) fn throttle(
    shared: &Shared,
    held: &mut Vec<Held>,
    sq: &mut Sq,
    cq: &mut Cq,
    cmd: &Command,
) -> Option<Outcome> {
    if !shared.qos.armed() {
        return None;
    }
    throttle_limited(shared, held, sq, cq, cmd)
}

/// Charges `cmd` to the limits and holds it until it may start. The
/// whole [`Shared`]: the QoS limits, the namespaces' block sizes, the
/// statistics and the faults' table (where Abort finds it) are four
/// owners.
fn throttle_limited(
    shared: &Shared,
    held: &mut Vec<Held>,
    sq: &mut Sq,
    cq: &mut Cq,
    cmd: &Command,
) -> Option<Outcome> {
    // Read before charging: a change meanwhile makes this charge stale.
    let generation = qos::generation();
    let now = Instant::now();
    let due = shared
        .qos
        .admit(cmd, |nsid| block_bytes(&shared.subsystem, nsid), now)?;
    shared.stats.qos_throttled.fetch_add(1, Relaxed);
    // Known to Abort while there is room in the table; held either way
    // (at most the SQ's entries are: the host waits for their completions).
    shared.faults.hold(sq.qid, cmd.cid());
    let throttled = Throttled {
        generation,
        since: now,
    };
    push(held, sq, cq, cmd, Some(due), Some(throttled), None);
    Some(Outcome::Deferred)
}

/// Bytes per logical block of namespace `nsid` through the data pointer.
fn block_bytes(subsystem: &Subsystem, nsid: u32) -> Option<u64> {
    subsystem
        .namespace(nsid)
        .ok()
        .map(|ns| ns.data_bytes_per_block())
}

/// A throttled command charged under limits changed since: charged again
/// under the new ones (it may start at once).
fn recharge(qos: &Qos, subsystem: &Subsystem, h: &mut Held, now: Instant) {
    let Some(t) = h.throttled.as_mut() else {
        return;
    };
    let generation = qos::generation();
    if t.generation == generation {
        return;
    }
    t.generation = generation;
    h.due = Some(
        qos.admit(&h.cmd, |nsid| block_bytes(subsystem, nsid), now)
            .unwrap_or(now),
    );
}

/// The wait, shortened to the next held command's start.
pub(super) fn clamp(wait: Wait, held: &[Held]) -> Wait {
    let Some(next) = held.iter().filter_map(|h| h.due).min() else {
        return wait;
    };
    let now = Instant::now();
    match wait {
        Wait::No => Wait::No,
        Wait::For(d) => Wait::For(d.min(next.saturating_duration_since(now))),
        Wait::Until(Some(at)) => Wait::Until(Some(at.min(next))),
        Wait::Until(None) => Wait::Until(Some(next)),
    }
}

/// Runs the held commands whose time has come and completes those Abort
/// asked for (Command Abort Requested). Returns how many it let go. The
/// whole [`Shared`]: the faults, the QoS limits and the statistics are
/// three owners, and each command runs with it ([`release_one`]).
pub(super) fn release(
    shared: &Shared,
    session: &Session,
    local: &mut Local,
    policy: EventIdxPolicy,
) -> u32 {
    if local.held.is_empty() {
        return 0;
    }
    let now = Instant::now();
    let mut held = std::mem::take(&mut local.held);
    let mut done = 0;
    held.retain_mut(|h| {
        let fenced = h.fence.as_ref().map(|f| f.open());
        let aborted = fenced.is_none() && shared.faults.abort_requested(h.sqid, h.cmd.cid());
        if !aborted {
            recharge(&shared.qos, &shared.subsystem, h, now);
        }
        match fenced {
            Some(false) => {
                h.due = Some(now + FENCE_POLL);
                return true;
            }
            Some(true) => {}
            None if !aborted && h.due.is_none_or(|due| due > now) => return true,
            None => {}
        }
        if let Some(t) = h.throttled {
            let waited = now.saturating_duration_since(t.since).as_nanos();
            let waited = u64::try_from(waited).unwrap_or(u64::MAX);
            shared.stats.qos_throttled_ns.fetch_add(waited, Relaxed);
        }
        let aborted = fenced.is_none() && shared.faults.release(h.sqid, h.cmd.cid()) || aborted;
        done += 1;
        if let Some(cqid) = release_one(shared, session, local, h, aborted, policy) {
            if !local.touched.contains(&cqid) {
                local.touched.push(cqid);
            }
        }
        let (queues, doorbells) = (&shared.queues, &shared.doorbells);
        super::ops::finish_delete(queues, doorbells, &mut local.rings, h.sqid);
        false
    });
    // Before those held again meanwhile (a delayed Preempt and Abort that
    // ran and waits for its fence).
    let again = std::mem::replace(&mut local.held, held);
    local.held.extend(again);
    settle_touched(shared, session, local);
    done
}

/// Lets held command `h` go: its reservation returned, then run (its
/// delay is over) or completed as aborted. A command whose SQ or CQ is
/// gone is dropped. Returns the CQ posted to. The whole [`Shared`]: the
/// command runs with it ([`Ctx`]) and posting needs it
/// ([`super::cq::post`]).
fn release_one(
    shared: &Shared,
    session: &Session,
    local: &mut Local,
    h: &Held,
    aborted: bool,
    policy: EventIdxPolicy,
) -> Option<u16> {
    // Done unless it goes in flight again below: posted or dropped.
    let done = || crate::crash_record::completed(shared.crash.get(), h.sqid, h.cmd.cid());
    let (sq, cq) = local.rings.both(h.sqid, h.cqid);
    let Some(cq) = cq.filter(|cq| cq.instance == h.cq_instance) else {
        done();
        return None;
    };
    let stalled = cq.is_full();
    cq.reserved = cq.reserved.saturating_sub(1);
    let Some(sq) = sq.filter(|sq| sq.instance == h.sq_instance) else {
        done();
        return None;
    };
    if h.due.is_some() {
        // A Delete waiting for it completes once none is left
        // (`finish_delete`, after this).
        sq.in_flight = sq.in_flight.saturating_sub(1);
    }
    if shared.lifecycle.fatal() || sq.deleting.is_some() {
        done();
        return None;
    }
    let outcome = if aborted {
        Outcome::Done {
            dw0: 0,
            status: Status::ABORTED_BY_REQUEST,
        }
    } else if h.fence.is_some() {
        // A Preempt and Abort whose fence is ready: its change was made
        // (owed under a crash record, as any reservation change).
        match shared.crash.get() {
            Some(_) => Outcome::Owed {
                dw0: 0,
                status: Status::SUCCESS,
            },
            None => Outcome::ok(0),
        }
    } else {
        let mut ctx = Ctx {
            shared,
            qid: h.sqid,
            session,
            scratch: &mut local.scratch,
            inflight: &mut local.inflight,
        };
        io::execute(&mut ctx, &h.cmd)
    };
    let (dw0, status) = match outcome {
        Outcome::Owed { dw0, status } => match shared.crash.get() {
            // Its entry back for the completion owed, recorded in flight
            // again until posted (`owe`).
            Some(rec) => {
                super::owe::owe(shared, rec, sq, cq, &h.cmd, u64::from(dw0), status);
                return None;
            }
            None => (u64::from(dw0), status),
        },
        Outcome::Done { dw0, status } => (u64::from(dw0), status),
        Outcome::Appended(lba) => (lba, Status::SUCCESS),
        Outcome::Submitted(token) => {
            local.inflight.bind(token, sq, cq, None);
            return None;
        }
        Outcome::Deferred => return None,
        Outcome::Fenced => match local.scratch.fence.take() {
            Some(f) => {
                fence(&mut local.held, sq, cq, &h.cmd, f);
                return None;
            }
            None => (0, Status::SUCCESS),
        },
    };
    let reserved = Reserved {
        cmd: &h.cmd,
        dw0,
        status,
        stalled,
        // Held back by a fault: not a latency sample.
        started: None,
    };
    let posted = post_reserved(shared, session, sq, cq, reserved, policy);
    done();
    posted
}
