//! Queue positions of a saved state, and the positions a crash record
//! kept since put over them (`vnvme serve --supervise`,
//! [`crate::crash_record`]).

use crate::crash_record::{CqPosition, SqPosition};
use crate::memory::{GuestAddress, GuestMemory};

use super::SavedState;

/// Queue positions by queue id: the SQs', the CQs'.
pub type Positions = (Vec<(u16, SqPosition)>, Vec<(u16, CqPosition)>);

impl SavedState {
    /// The queues' positions in this state, by queue id.
    pub fn positions(&self) -> Positions {
        let q = &self.body.queues;
        let sqs = q
            .sqs
            .iter()
            .map(|s| {
                (
                    s.qid,
                    SqPosition {
                        head: s.head,
                        tail: s.tail,
                    },
                )
            })
            .collect();
        let cqs = q
            .cqs
            .iter()
            .map(|c| {
                (
                    c.qid,
                    CqPosition {
                        head: c.head,
                        tail: c.tail,
                        phase: c.phase,
                        // Saved only with none in flight.
                        reserved: 0,
                    },
                )
            })
            .collect();
        (sqs, cqs)
    }

    /// Puts the positions recorded since this state was saved (`sq` and
    /// `cq`, by queue id; `None`: none recorded) over its queues, and
    /// brings them up to what the guest saw at the crash: the words are
    /// stored after each worker round, so a crash inside a round leaves
    /// them one round old. Each CQ is read in guest memory `mem` from its
    /// recorded tail while the entries carry the phase of the lap (entries
    /// posted after the words: fewer than a lap, since a CQ holds fewer
    /// than its size), and the tail moved past them; each SQ's head moves
    /// to the furthest head those entries report. `Err` says why the state
    /// cannot go on: commands fetched and not completed (completing them
    /// as interrupted is not done yet), or positions that contradict each
    /// other. Not checked here: the restore checks every position against
    /// its queue.
    pub fn put_positions(
        &mut self,
        sq: impl Fn(u16) -> Option<SqPosition>,
        cq: impl Fn(u16) -> Option<CqPosition>,
        mem: &dyn GuestMemory,
    ) -> Result<(), String> {
        let q = &mut self.body.queues;
        // Per SQ: entries found past the recorded CQ tails, and the head
        // the last of them reports.
        let mut found: Vec<(u16, u32, u32)> = Vec::new();
        for c in &mut q.cqs {
            if let Some(p) = cq(c.qid) {
                c.head = p.head;
                c.tail = p.tail;
                c.phase = p.phase;
            }
            if c.size < 2 || c.tail >= c.size {
                continue;
            }
            for _ in 0..c.size - 1 {
                let at = c.base.wrapping_add(u64::from(c.tail) * 16);
                let mut cqe = [0u8; 16];
                mem.read(GuestAddress(at), &mut cqe)
                    .map_err(|e| format!("reading CQ {}'s entry {}: {e}", c.qid, c.tail))?;
                let dw2 = u32::from_le_bytes([cqe[8], cqe[9], cqe[10], cqe[11]]);
                let dw3 = u32::from_le_bytes([cqe[12], cqe[13], cqe[14], cqe[15]]);
                if (dw3 >> 16) & 1 != u32::from(c.phase) {
                    break;
                }
                let (sqid, sqhd) = ((dw2 >> 16) as u16, dw2 & 0xffff);
                match found.iter_mut().find(|(id, _, _)| *id == sqid) {
                    Some(f) => {
                        f.1 += 1;
                        f.2 = sqhd;
                    }
                    None => found.push((sqid, 1, sqhd)),
                }
                c.tail += 1;
                if c.tail == c.size {
                    c.tail = 0;
                    c.phase = !c.phase;
                }
            }
        }
        // Per CQ: commands fetched since the words, less the entries
        // posted since.
        let mut pending: Vec<(u16, i64)> = Vec::new();
        for s in &mut q.sqs {
            let rec = sq(s.qid).unwrap_or(SqPosition {
                head: s.head,
                tail: s.tail,
            });
            let (mut head, mut tail) = (rec.head, rec.tail);
            if let Some(&(_, n, sqhd)) = found.iter().find(|(id, _, _)| *id == s.qid) {
                if s.size == 0 || sqhd >= s.size {
                    return Err(format!(
                        "CQ entries report SQ {}'s head at {sqhd}, beyond its {} entries",
                        s.qid, s.size
                    ));
                }
                let ring = |from: u32, to: u32| (to + s.size - from) % s.size;
                let more = i64::from(ring(head, sqhd)) - i64::from(n);
                match pending.iter_mut().find(|(c, _)| *c == s.cqid) {
                    Some(p) => p.1 += more,
                    None => pending.push((s.cqid, more)),
                }
                if ring(head, tail) < ring(head, sqhd) {
                    tail = sqhd;
                }
                head = sqhd;
            }
            s.head = head;
            s.tail = tail;
        }
        for c in &q.cqs {
            let more = pending
                .iter()
                .find(|(id, _)| *id == c.qid)
                .map_or(0, |p| p.1);
            let open = i64::from(cq(c.qid).map_or(0, |p| p.reserved)) + more;
            if open > 0 {
                return Err(format!(
                    "{open} commands completing on CQ {} had not completed at the crash \
                     (completing them as interrupted is not done yet)",
                    c.qid
                ));
            }
            if open < 0 {
                return Err(format!(
                    "CQ {}'s recorded positions contradict its entries ({} more completions \
                     than commands fetched)",
                    c.qid, -open
                ));
            }
        }
        // The doorbell registers the saved state holds are as old as it
        // is: a worker would take an old SQ tail for a new one. They
        // become the positions the words give (a doorbell page handed
        // over keeps the host's newer values).
        let sqs: Vec<(u16, u32)> = q.sqs.iter().map(|s| (s.qid, s.tail)).collect();
        let cqs: Vec<(u16, u32)> = q.cqs.iter().map(|c| (c.qid, c.head)).collect();
        for r in &mut self.body.doorbells.registers {
            let qid = (r.index / 2) as u16;
            let now = if r.index % 2 == 0 {
                sqs.iter().find(|(q, _)| *q == qid)
            } else {
                cqs.iter().find(|(q, _)| *q == qid)
            };
            if let Some((_, v)) = now {
                r.value = *v;
            }
        }
        Ok(())
    }
}
