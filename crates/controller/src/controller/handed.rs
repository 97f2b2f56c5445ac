//! The commands held back at an upgrade's pause, handed to the new
//! process ([`crate::saved_state::HandedCommand`]): listed from what the
//! stopped workers parked, and held again in the restored controller
//! before its workers start, which take them as they take parked ones.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::faults::{Faults, Gate, Held};
use crate::qos::{self, Throttled};
use crate::queue::table::QueueTable;
use crate::saved_check::inconsistent;
use crate::saved_state::{HandedCommand, Hold, StateError};

/// The parked commands of `faults` whose queues are still those they
/// came from (a command whose queue went is dropped at its release, and
/// counts nowhere), as the workers left them and as handed over.
pub(super) fn list(
    faults: &Faults,
    queues: &QueueTable,
    now: Instant,
) -> Result<(Vec<Held>, Vec<HandedCommand>), StateError> {
    let mut kept = Vec::new();
    let mut handed = Vec::new();
    for h in faults.parked() {
        let sq_here = queues.sq_instance(h.sqid) == Some(h.sq_instance);
        let cq_here = queues.cq_instance(h.cqid) == Some(h.cq_instance);
        if !(sq_here && cq_here) {
            continue;
        }
        let due_in = |due: Option<Instant>| {
            due.map(|d| {
                u64::try_from(d.saturating_duration_since(now).as_micros()).unwrap_or(u64::MAX)
            })
        };
        let (hold, due_in_us) = match (&h.fence, &h.throttled, h.due) {
            (Some(f), _, _) => {
                if !f.open() {
                    // The drain completed every command on a backend, so
                    // those a fence waits for are done; never seen.
                    return Err(StateError::Busy(format!(
                        "a Preempt and Abort (SQ {} CID {}) waits for commands it aborted",
                        h.sqid,
                        h.cmd.cid()
                    )));
                }
                (Hold::Fence, None)
            }
            (None, Some(_), due) => (Hold::Qos, due_in(due)),
            (None, None, None) => (Hold::Never, None),
            (None, None, due) => (Hold::Delay, due_in(due)),
        };
        handed.push(HandedCommand {
            sqid: h.sqid,
            cqid: h.cqid,
            cid: h.cmd.cid(),
            sqe: HandedCommand::dwords(&h.cmd),
            hold,
            due_in_us,
            aborted: faults.abort_requested(h.sqid, h.cmd.cid()),
        });
        kept.push(h);
    }
    Ok((kept, handed))
}

/// A fence whose commands were done before the save.
#[derive(Debug)]
struct Opened;

impl Gate for Opened {
    fn open(&self) -> bool {
        true
    }
}

/// Holds `handed` again in a restored controller whose queues are in
/// `queues` and whose workers have not started (they adopt what is
/// parked): each reserves its CQ entry and counts in flight on its SQ as
/// in the old process, known to Abort. Each is checked first against the
/// queues (present, the SQ's CQ, room for the entry) and its CID; a
/// controller that does not run takes none.
pub(super) fn hold_again(
    faults: &Faults,
    queues: &QueueTable,
    handed: &[HandedCommand],
    running: bool,
    now: Instant,
) -> Result<(), StateError> {
    if handed.is_empty() {
        return Ok(());
    }
    if !running {
        return Err(inconsistent(format!(
            "{} commands are handed to a controller that is not running",
            handed.len()
        ))
        .into());
    }
    let mut parked = Vec::with_capacity(handed.len());
    for c in handed {
        let what = || format!("handed command {} of SQ {}", c.cid, c.sqid);
        let cmd = c.command();
        if c.sqid == 0 {
            // Only I/O commands are held back (faults and limits match
            // I/O commands): one on the admin queue would run as I/O.
            return Err(inconsistent(format!("{}: the admin queue's", what())).into());
        }
        if cmd.cid() != c.cid {
            return Err(inconsistent(format!("{}: its SQE has CID {}", what(), cmd.cid())).into());
        }
        let due = match c.hold {
            Hold::Never => None,
            Hold::Fence => Some(now),
            Hold::Qos | Hold::Delay => {
                let us = c
                    .due_in_us
                    .unwrap_or(0)
                    .min(crate::faults::MAX_LATENCY.as_micros() as u64);
                Some(now + Duration::from_micros(us))
            }
        };
        let (sq_instance, cq_instance) = queues
            .reserve_for(c.sqid, c.cqid, due.is_some())
            .map_err(|why| inconsistent(format!("{}: {why}", what())))?;
        let throttled = (c.hold == Hold::Qos).then(|| Throttled {
            // Due when the old process's limits made it: this process
            // sets its limits after the restore, which charges the
            // commands still held again under them (a change of limits).
            generation: qos::generation(),
            since: now,
        });
        let fence: Option<Arc<dyn Gate>> = (c.hold == Hold::Fence).then(|| Arc::new(Opened) as _);
        if fence.is_none() {
            // Known to Abort again (a fence is not: its change is made).
            faults.hold(c.sqid, c.cid);
            if c.aborted {
                faults.abort(c.sqid, c.cid);
            }
        }
        parked.push(Held {
            cmd,
            sqid: c.sqid,
            sq_instance,
            cqid: c.cqid,
            cq_instance,
            due,
            throttled,
            fence,
        });
    }
    faults.park(parked);
    Ok(())
}
