//! The rings a worker owns: the SQs and CQs it serves, held by the worker
//! itself for as long as it serves them, so its passes take no lock.
//!
//! A worker takes its rings from the [`QueueTable`]'s slots when it starts
//! (enable, resume), and one at a time when a queue is created
//! ([`RingOp::AdoptSq`], [`RingOp::AdoptCq`]); it puts them all back when
//! it stops. What an admin command needs done to a ring is sent to the
//! owner as a [`RingOp`] in its mailbox, in order with its kicks.

use vnvme_spec::regs::Doorbell;

pub(crate) use super::mailbox::RingOp;
use super::table::QueueTable;
use super::{Cq, Sq};

/// The SQs and CQs one worker serves, by queue id.
#[derive(Debug, Default)]
pub(crate) struct Rings {
    sqs: Vec<Option<Sq>>,
    cqs: Vec<Option<Cq>>,
    /// The table's epoch when they were taken.
    epoch: u64,
}

fn put<T>(v: &mut Vec<Option<T>>, qid: u16, ring: T) {
    let i = usize::from(qid);
    if v.len() <= i {
        v.resize_with(i + 1, || None);
    }
    if let Some(slot) = v.get_mut(i) {
        *slot = Some(ring);
    }
}

impl Rings {
    /// Takes from `table` every resting ring worker `index` serves: each CQ
    /// whose queue id maps to it, each SQ whose CQ does.
    pub fn take(table: &QueueTable, index: usize) -> Self {
        let mut rings = Self {
            epoch: table.epoch(),
            ..Self::default()
        };
        for (qid, slot) in table.cqs.iter().enumerate() {
            let mut g = slot.lock();
            if g.as_ref()
                .is_some_and(|cq| table.worker_for(cq.qid) == index)
            {
                if let Some(cq) = g.take() {
                    put(&mut rings.cqs, qid as u16, cq);
                }
            }
        }
        for (qid, slot) in table.sqs.iter().enumerate() {
            let mut g = slot.lock();
            if g.as_ref()
                .is_some_and(|sq| table.worker_for(sq.cqid) == index)
            {
                if let Some(sq) = g.take() {
                    put(&mut rings.sqs, qid as u16, sq);
                }
            }
        }
        rings
    }

    /// Takes one created ring from its slot (`AdoptSq`/`AdoptCq`).
    pub fn adopt(&mut self, table: &QueueTable, db: Doorbell) {
        match db {
            Doorbell::SqTail(qid) => {
                if let Some(sq) = table
                    .sqs
                    .get(usize::from(qid))
                    .and_then(|s| s.lock().take())
                {
                    put(&mut self.sqs, qid, sq);
                }
            }
            Doorbell::CqHead(qid) => {
                if let Some(cq) = table
                    .cqs
                    .get(usize::from(qid))
                    .and_then(|s| s.lock().take())
                {
                    put(&mut self.cqs, qid, cq);
                }
            }
        }
    }

    /// Puts every ring back in `table` (the worker stops).
    pub fn put_back(&mut self, table: &QueueTable) {
        let sqs = self.sqs.drain(..).flatten().collect();
        let cqs = self.cqs.drain(..).flatten().collect();
        table.put_back_rings(self.epoch, sqs, cqs);
    }

    pub fn sq(&self, qid: u16) -> Option<&Sq> {
        self.sqs.get(usize::from(qid))?.as_ref()
    }

    pub fn sq_mut(&mut self, qid: u16) -> Option<&mut Sq> {
        self.sqs.get_mut(usize::from(qid))?.as_mut()
    }

    pub fn cq(&self, qid: u16) -> Option<&Cq> {
        self.cqs.get(usize::from(qid))?.as_ref()
    }

    pub fn cq_mut(&mut self, qid: u16) -> Option<&mut Cq> {
        self.cqs.get_mut(usize::from(qid))?.as_mut()
    }

    /// SQ `sqid` and the CQ it completes on.
    pub fn pair(&mut self, sqid: u16) -> Option<(&mut Sq, &mut Cq)> {
        let sq = self.sqs.get_mut(usize::from(sqid))?.as_mut()?;
        let cq = self.cqs.get_mut(usize::from(sq.cqid))?.as_mut()?;
        Some((sq, cq))
    }

    /// SQ `sqid` and CQ `cqid`, each if present.
    pub fn both(&mut self, sqid: u16, cqid: u16) -> (Option<&mut Sq>, Option<&mut Cq>) {
        let sq = self.sqs.get_mut(usize::from(sqid)).and_then(Option::as_mut);
        let cq = self.cqs.get_mut(usize::from(cqid)).and_then(Option::as_mut);
        (sq, cq)
    }

    /// Takes SQ `qid` out (deleted).
    pub fn remove_sq(&mut self, qid: u16) -> Option<Sq> {
        self.sqs.get_mut(usize::from(qid))?.take()
    }

    pub fn remove_cq(&mut self, qid: u16) -> Option<Cq> {
        self.cqs.get_mut(usize::from(qid))?.take()
    }

    pub fn sqs_mut(&mut self) -> impl Iterator<Item = &mut Sq> {
        self.sqs.iter_mut().flatten()
    }

    pub fn cqs_mut(&mut self) -> impl Iterator<Item = &mut Cq> {
        self.cqs.iter_mut().flatten()
    }
}
