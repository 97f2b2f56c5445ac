//! The queues' saved form (docs/state-format.md, `queues`): every SQ and
//! CQ with its base, size, head, tail, phase, doorbell source and what the
//! host asked of it (the CQ's interrupt vector, Aborts pending on a SQ).
//!
//! Saved only at a quiescent point: no command in flight on a backend, no
//! Delete waiting for one. Entries fetched ahead of the head and not yet
//! run are not saved: they lie after the head, so a restored worker
//! fetches them again from the same guest memory (the host may not
//! rewrite them before a completion moves the head past them). Each
//! queue's EventIdx cache starts empty: the next publication writes it.

use serde::{Deserialize, Serialize};
use vnvme_spec::regs::Doorbell;

use super::owed::SavedOwed;
use super::table::QueueTable;
use super::{Cq, Sq};
use crate::doorbell::{DoorbellSource, Doorbells};
use crate::faults::Held;
use crate::memory::GuestAddress;
use crate::saved_check::{at_most, inconsistent, same, InvalidState};

/// Where a queue's doorbell value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SavedSource {
    /// The register (or the doorbell page).
    Register,
    /// Doorbell Buffer Config: this queue's dwords in the two buffers.
    Shadow { shadow: u64, event_idx: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedSq {
    pub qid: u16,
    /// Guest address of entry 0.
    pub base: u64,
    /// Entries (not 0's based).
    pub size: u32,
    pub head: u32,
    /// The last valid tail the worker saw.
    pub tail: u32,
    pub cqid: u16,
    pub source: SavedSource,
    /// CIDs an Abort marked to complete as aborted when fetched.
    pub aborts: Vec<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedCq {
    pub qid: u16,
    pub base: u64,
    pub size: u32,
    /// The last valid head the worker read.
    pub head: u32,
    pub tail: u32,
    /// The phase tag the next entry is posted with.
    pub phase: bool,
    /// Interrupts Enabled and the Interrupt Vector.
    pub ien: bool,
    pub iv: u16,
    pub source: SavedSource,
    /// A rejected head value, reported once.
    pub bad_head: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedQueues {
    /// In queue id order; the admin queue's first when it exists.
    pub sqs: Vec<SavedSq>,
    pub cqs: Vec<SavedCq>,
    /// Completions owed (`--supervise`, [`super::owed`]): their commands'
    /// effect is in this state, their CQ entries not yet posted. Absent
    /// in a format 1 or 2 state, and when none is owed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owed: Vec<SavedOwed>,
}

impl From<DoorbellSource> for SavedSource {
    fn from(s: DoorbellSource) -> Self {
        match s {
            DoorbellSource::Register => Self::Register,
            DoorbellSource::Shadow { shadow, event_idx } => Self::Shadow {
                shadow: shadow.raw(),
                event_idx: event_idx.raw(),
            },
        }
    }
}

impl From<SavedSource> for DoorbellSource {
    fn from(s: SavedSource) -> Self {
        match s {
            SavedSource::Register => Self::Register,
            SavedSource::Shadow { shadow, event_idx } => Self::Shadow {
                shadow: GuestAddress(shadow),
                event_idx: GuestAddress(event_idx),
            },
        }
    }
}

/// What keeps the queues from being saved now, `handed` of `sq`'s
/// commands in flight aside.
fn busy(sq: &Sq, handed: usize) -> Option<String> {
    let left = (sq.in_flight as usize).saturating_sub(handed);
    if left > 0 {
        return Some(format!("SQ {} has {left} commands in flight", sq.qid));
    }
    sq.deleting
        .map(|_| format!("SQ {} is being deleted", sq.qid))
}

impl QueueTable {
    /// The queues, or why they cannot be saved now (a command in flight),
    /// the commands `handed` aside (held back, parked by a pause, which an
    /// upgrade hands to the new process): what they count in flight on
    /// their SQ and reserve on their CQ. The saved queues then hold none
    /// (the new process counts them again).
    pub fn save(&self, handed: &[Held]) -> Result<SavedQueues, String> {
        if self.awaited() > 0 {
            return Err(format!(
                "{} admin commands wait for a queue's worker",
                self.awaited()
            ));
        }
        let mut saved = SavedQueues {
            sqs: Vec::new(),
            cqs: Vec::new(),
            owed: self.owed.save(),
        };
        for slot in &self.sqs {
            let g = slot.lock();
            let Some(sq) = g.as_ref() else { continue };
            let mine = handed
                .iter()
                .filter(|h| h.sqid == sq.qid && h.sq_instance == sq.instance && h.due.is_some())
                .count();
            if let Some(why) = busy(sq, mine) {
                return Err(why);
            }
            saved.sqs.push(SavedSq {
                qid: sq.qid,
                base: sq.base.raw(),
                size: sq.size,
                head: sq.head,
                tail: sq.tail,
                cqid: sq.cqid,
                source: sq.source.into(),
                aborts: sq.aborts.clone(),
            });
        }
        for slot in &self.cqs {
            let g = slot.lock();
            let Some(cq) = g.as_ref() else { continue };
            let mine = handed
                .iter()
                .filter(|h| h.cqid == cq.qid && h.cq_instance == cq.instance)
                .count();
            // The entries owed completions hold are saved with them.
            let owed = self.owed.on_cq(cq.qid) as usize;
            let left = (cq.reserved as usize).saturating_sub(mine + owed);
            if left > 0 {
                return Err(format!(
                    "CQ {} has {left} entries promised to commands in flight",
                    cq.qid
                ));
            }
            saved.cqs.push(SavedCq {
                qid: cq.qid,
                base: cq.base.raw(),
                size: cq.size,
                head: cq.head,
                tail: cq.tail,
                phase: cq.phase,
                ien: cq.ien,
                iv: cq.iv,
                source: cq.source.into(),
                bad_head: cq.bad_head,
            });
        }
        Ok(saved)
    }

    /// The instance of the SQ resting in slot `qid`, if any.
    pub fn sq_instance(&self, qid: u16) -> Option<u64> {
        let slot = self.sqs.get(usize::from(qid))?;
        let g = slot.lock();
        g.as_ref().map(|sq| sq.instance)
    }

    /// The instance of the CQ resting in slot `qid`, if any.
    pub fn cq_instance(&self, qid: u16) -> Option<u64> {
        let slot = self.cqs.get(usize::from(qid))?;
        let g = slot.lock();
        g.as_ref().map(|cq| cq.instance)
    }

    /// Reserves an entry on CQ `cqid` for a command of SQ `sqid` held
    /// back (an upgrade handed it over), counted in flight on the SQ if
    /// `counted` (one that is due some time); the two queues' instances.
    /// `Err` says why not: a queue missing, the SQ posting elsewhere, no
    /// room left on the CQ.
    pub fn reserve_for(&self, sqid: u16, cqid: u16, counted: bool) -> Result<(u64, u64), String> {
        let sq_slot = self.sqs.get(usize::from(sqid)).ok_or("no such SQ")?;
        let cq_slot = self.cqs.get(usize::from(cqid)).ok_or("no such CQ")?;
        let mut sq_g = sq_slot.lock();
        let sq = sq_g.as_mut().ok_or("its SQ is not in the saved state")?;
        if sq.cqid != cqid {
            return Err(format!("SQ {sqid} posts to CQ {}, not {cqid}", sq.cqid));
        }
        let mut cq_g = cq_slot.lock();
        let cq = cq_g.as_mut().ok_or("its CQ is not in the saved state")?;
        if cq.is_full() {
            return Err(format!("CQ {cqid} has no room left for its completion"));
        }
        cq.reserved += 1;
        if counted {
            sq.in_flight = sq.in_flight.saturating_add(1);
        }
        Ok((sq.instance, cq.instance))
    }

    /// Puts the saved queues in this (empty) table and opens their
    /// doorbells, each owned by the worker of its CQ. Every value is
    /// checked first: queue ids within the table, sizes within `max_size`
    /// (CAP.MQES + 1), positions within the queue, vectors within
    /// `vectors`, each SQ's CQ present, at most `abort_limit` Aborts.
    pub fn restore(
        &self,
        saved: &SavedQueues,
        doorbells: &Doorbells,
        limits: Limits,
    ) -> Result<(), InvalidState> {
        let qids = self.sqs.len();
        let max_qid = qids.saturating_sub(1) as u64;
        let mut cqs: Vec<Option<Cq>> = (0..qids).map(|_| None).collect();
        for c in &saved.cqs {
            let what = |field: &str| format!("CQ {}'s {field}", c.qid);
            at_most("a CQ's queue id", u64::from(c.qid), max_qid)?;
            check_ring(&what(""), c.size, c.head, c.tail, limits.max_size(c.qid))?;
            at_most(
                what("interrupt vector"),
                u64::from(c.iv),
                u64::from(limits.vectors) - 1,
            )?;
            if let Some(bad) = c.bad_head {
                at_most(what("rejected head"), u64::from(bad), u64::from(u16::MAX))?;
            }
            let mut cq = Cq::new(c.qid, GuestAddress(c.base), c.size, c.ien, c.iv);
            cq.head = c.head;
            cq.tail = c.tail;
            cq.phase = c.phase;
            cq.bad_head = c.bad_head;
            cq.view.publish(cq.head, cq.tail);
            cq.set_source(c.source.into());
            let slot = cqs.get_mut(usize::from(c.qid));
            match slot {
                Some(s @ None) => *s = Some(cq),
                _ => return Err(inconsistent(format!("CQ {} is saved twice", c.qid))),
            }
        }
        let mut sqs: Vec<Option<Sq>> = (0..qids).map(|_| None).collect();
        for s in &saved.sqs {
            let what = |field: &str| format!("SQ {}'s {field}", s.qid);
            at_most("a SQ's queue id", u64::from(s.qid), max_qid)?;
            check_ring(&what(""), s.size, s.head, s.tail, limits.max_size(s.qid))?;
            at_most(
                what("pending Aborts"),
                s.aborts.len() as u64,
                limits.aborts as u64,
            )?;
            if (s.qid == 0) != (s.cqid == 0) {
                return Err(inconsistent(format!(
                    "SQ {} completes on CQ {}: only the admin queues pair with queue 0",
                    s.qid, s.cqid
                )));
            }
            if cqs
                .get(usize::from(s.cqid))
                .and_then(Option::as_ref)
                .is_none()
            {
                return Err(inconsistent(format!(
                    "SQ {} completes on CQ {}, which is not saved",
                    s.qid, s.cqid
                )));
            }
            let mut sq = Sq::new(s.qid, GuestAddress(s.base), s.size, s.cqid);
            sq.head = s.head;
            sq.tail = s.tail;
            sq.aborts = s.aborts.clone();
            sq.set_source(s.source.into());
            let slot = sqs.get_mut(usize::from(s.qid));
            match slot {
                Some(slot @ None) => *slot = Some(sq),
                _ => return Err(inconsistent(format!("SQ {} is saved twice", s.qid))),
            }
        }
        same(
            "whether the admin SQ and CQ exist together",
            sqs.first().is_some_and(Option::is_some),
            cqs.first().is_some_and(Option::is_some),
        )?;
        for (qid, (sq, cq)) in sqs.into_iter().zip(cqs).enumerate() {
            let qid = qid as u16;
            if let Some(cq) = cq {
                let worker = self.worker_for(qid);
                doorbells.reopen(Doorbell::CqHead(qid), cq.size, worker);
                if let Some(slot) = self.cqs.get(usize::from(qid)) {
                    *slot.lock() = Some(cq);
                }
            }
            if let Some(sq) = sq {
                let worker = self.worker_for(sq.cqid);
                doorbells.reopen(Doorbell::SqTail(qid), sq.size, worker);
                if let Some(slot) = self.sqs.get(usize::from(qid)) {
                    *slot.lock() = Some(sq);
                }
            }
        }
        self.list_resting();
        Ok(())
    }

    /// Posts the completions a restored state owes (`saved`, see
    /// [`super::owed`]) on the resting CQs, before any worker runs: the
    /// state holds their commands' effect, so the host may see them
    /// complete. Each with its SQ's head now. A SQ or CQ missing, or a CQ
    /// without room, refuses the restore.
    pub fn post_owed(
        &self,
        saved: &[SavedOwed],
        mem: &dyn crate::memory::GuestMemory,
    ) -> Result<(), InvalidState> {
        for o in saved {
            let missing = || {
                inconsistent(format!(
                    "a completion is owed on SQ {}, which is not saved",
                    o.sqid
                ))
            };
            let sq_slot = self.sqs.get(usize::from(o.sqid)).ok_or_else(missing)?;
            let (cqid, head) = {
                let g = sq_slot.lock();
                let sq = g.as_ref().ok_or_else(missing)?;
                (sq.cqid, sq.head)
            };
            let cq_slot = self.cqs.get(usize::from(cqid)).ok_or_else(missing)?;
            let mut g = cq_slot.lock();
            let cq = g.as_mut().ok_or_else(missing)?;
            if cq.is_full() {
                return Err(inconsistent(format!(
                    "CQ {cqid} has no room for the completion owed to command {} of SQ {}",
                    o.cid, o.sqid
                )));
            }
            let status = vnvme_spec::Status::from_raw(o.status);
            let mut cqe =
                vnvme_spec::Completion::new(o.dw as u32, head as u16, o.sqid, o.cid, false, status);
            cqe.dw1 = zerocopy::little_endian::U32::new((o.dw >> 32) as u32);
            cq.post(mem, cqe).map_err(|e| {
                inconsistent(format!(
                    "posting the completion owed to command {} of SQ {} on CQ {cqid}: {e}",
                    o.cid, o.sqid
                ))
            })?;
        }
        Ok(())
    }
}

/// What the configuration allows of the restored queues.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// CAP.MQES + 1.
    pub max_size: u32,
    /// MSI-X vectors.
    pub vectors: u16,
    /// Aborts pending per SQ (ACL + 1).
    pub aborts: usize,
}

impl Limits {
    /// The largest size of queue `qid`: the admin queues' is AQA's (12
    /// bits, 0's based), the others' CAP.MQES + 1.
    fn max_size(&self, qid: u16) -> u32 {
        if qid == 0 {
            4096
        } else {
            self.max_size
        }
    }
}

fn check_ring(what: &str, size: u32, head: u32, tail: u32, max: u32) -> Result<(), InvalidState> {
    if size < 2 {
        return Err(inconsistent(format!("{what}size {size} is below 2")));
    }
    at_most(format!("{what}size"), u64::from(size), u64::from(max))?;
    at_most(format!("{what}head"), u64::from(head), u64::from(size - 1))?;
    at_most(format!("{what}tail"), u64::from(tail), u64::from(size - 1))?;
    Ok(())
}
