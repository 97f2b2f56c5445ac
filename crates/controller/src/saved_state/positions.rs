//! Queue positions of a saved state, and what a crash record kept since
//! put over them (`vnvme serve --supervise`, [`crate::crash_record`]):
//! the positions, the CQ entries posted after them, and the commands in
//! flight, completed here with Command Interrupted (or, admin commands
//! kept to run again, left to the restored controller: `super::rerun`).

use vnvme_spec::regs::Doorbell;
use vnvme_spec::{AdminOpcode, Command, Completion, Status};
use zerocopy::IntoBytes;

use crate::crash_record::{CqPosition, CrashRecorded, Open, SqPosition};
use crate::memory::{GuestAddress, GuestMemory};
use crate::queue::{SavedCq, SavedSource, SavedSq};

use super::SavedState;

/// Queue positions by queue id: the SQs', the CQs'.
pub type Positions = (Vec<(u16, SqPosition)>, Vec<(u16, CqPosition)>);

/// A CQ entry found in guest memory past a recorded tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Posted {
    pub sqid: u16,
    pub cid: u16,
    /// The SQ head it reports.
    pub sqhd: u32,
}

/// Whether command `o` of the admin SQ `s` is an Asynchronous Event
/// Request: outstanding in `aers` (the slot's), or its entry in guest
/// memory (just before the head it was taken at) is one with its CID,
/// then added to `aers`.
fn outstanding_aer(aers: &mut Vec<u16>, s: &SavedSq, o: &Open, mem: &dyn GuestMemory) -> bool {
    if aers.contains(&o.cid) {
        return true;
    }
    let slot = (o.head + s.size - 1) % s.size;
    let mut sqe = [0u8; 4];
    let at = s.base.wrapping_add(u64::from(slot) * 64);
    if mem.read(GuestAddress(at), &mut sqe).is_err() {
        return false;
    }
    let aer = sqe[0] == AdminOpcode::ASYNC_EVENT_REQUEST.0;
    if aer && u16::from_le_bytes([sqe[2], sqe[3]]) == o.cid {
        aers.push(o.cid);
        return true;
    }
    false
}

/// The command to run again for admin command `o` (`super::rerun`): its
/// bytes kept, its CID theirs, its opcode one that runs again.
fn rerun_of(rec: &dyn CrashRecorded, o: &Open) -> Option<Command> {
    let cmd: Command = zerocopy::transmute!(rec.admin_command(o.cid, o.head)?);
    let op = AdminOpcode(cmd.opcode());
    (cmd.cid() == o.cid && super::rerun::runs_again(op)).then_some(cmd)
}

/// Entries from `from` to `to` on a ring of `size`.
fn ring(from: u32, to: u32, size: u32) -> u32 {
    (to + size - from % size) % size
}

/// Reads CQ `c` in `mem` from its tail while the entries carry the lap's
/// phase (posted after its recorded tail: fewer than a lap, since a CQ
/// holds fewer than its size), moving the tail (and the phase, at the
/// end of the ring) past them. The entries, in the order posted.
pub(crate) fn read_posted(c: &mut SavedCq, mem: &dyn GuestMemory) -> Result<Vec<Posted>, String> {
    let mut found = Vec::new();
    if c.size < 2 || c.tail >= c.size {
        return Ok(found);
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
        found.push(Posted {
            sqid: (dw2 >> 16) as u16,
            cid: dw3 as u16,
            sqhd: dw2 & 0xffff,
        });
        c.tail += 1;
        if c.tail == c.size {
            c.tail = 0;
            c.phase = !c.phase;
        }
    }
    Ok(found)
}

/// The host's CQ head as it stands now: the value a trap stored (`trap`
/// mode) or the shadow doorbell (Doorbell Buffer Config), else the last
/// one the worker read. Only a valid one.
fn host_cq_head(c: &SavedCq, rec: &dyn CrashRecorded, mem: &dyn GuestMemory) -> u32 {
    let now = match c.source {
        SavedSource::Shadow { shadow, .. } => mem.load_u32(GuestAddress(shadow)).ok(),
        SavedSource::Register => rec.doorbell(Doorbell::CqHead(c.qid)),
    };
    now.filter(|&h| h < c.size).unwrap_or(c.head)
}

/// Which of SQ heads `a` and `b` (both passed since the SQ last stood
/// still, neither past the tail `tail`) is the later, on a ring of `size`.
fn later(a: u32, b: u32, tail: u32, size: u32) -> u32 {
    if ring(a, b, size) <= ring(a, tail, size) {
        b
    } else if ring(b, a, size) < ring(a, b, size) {
        a
    } else {
        b
    }
}

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

    /// The completions owed in this state (`--supervise`,
    /// `crate::queue::owed`), by SQ: each command's CID and the SQ's head
    /// right after its fetch, as a keeper records it in flight again when
    /// it keeps this state.
    /// The CIDs of the outstanding Asynchronous Event Requests. A crash
    /// record keeps each in flight across a checkpoint (with the head it
    /// was taken at): a crash before the slot holding it is whole then
    /// restores it from the entry, one after from the slot (once).
    pub fn outstanding_aers(&self) -> Vec<u16> {
        self.body.reporting.aer_cids.clone()
    }

    pub fn owed(&self) -> Vec<(u16, Open)> {
        let owed = self.body.queues.owed.iter();
        owed.map(|w| {
            let open = Open {
                cid: w.cid,
                head: w.head,
                late: false,
            };
            (w.sqid, open)
        })
        .collect()
    }

    /// Puts what `rec` kept since this state was saved over its queues
    /// and zoned namespaces' zones (`SavedZones::put_words`), and brings
    /// them up to what the guest saw at the crash. The
    /// positions are stored after each worker round (and a SQ's at each
    /// command that goes in flight), so a crash inside a round leaves them
    /// behind: each CQ is read in guest memory `mem` from its recorded
    /// tail (by phase), and each SQ's head moves to the latest head
    /// those entries report. Then each command recorded in flight and not
    /// among those entries is completed with Command Interrupted (DNR
    /// clear: the host retries it; an admin command kept to run again is
    /// left to the restored controller instead, [`Self::reruns`]), in the
    /// order fetched, with the SQ's
    /// head and the CQ's phase; `run` raises the CQs' interrupts. The
    /// doorbell registers take the host's last trapped values. Returns the
    /// commands completed so, `(sqid, cid)`. A completion owed whose
    /// command is still recorded in flight stays owed (the restore posts
    /// it); one that is not was posted, and is dropped. `Err` says why the state
    /// cannot go on (a CQ without room for them, an unwritable CQ,
    /// positions that contradict each other). Not checked here: the
    /// restore checks every position against its queue.
    pub fn put_positions(
        &mut self,
        rec: &dyn CrashRecorded,
        mem: &dyn GuestMemory,
    ) -> Result<Vec<(u16, u16)>, String> {
        self.rerun.clear();
        for ns in &mut self.body.subsystem.namespaces {
            let nsid = ns.nsid;
            if let Some(zones) = &mut ns.zones {
                zones.put_words(|i| rec.zone(nsid, i));
            }
        }
        let q = &mut self.body.queues;
        let mut posted: Vec<Posted> = Vec::new();
        for c in &mut q.cqs {
            if let Some(p) = rec.cq(c.qid) {
                c.head = p.head;
                c.tail = p.tail;
                c.phase = p.phase;
            }
            posted.extend(read_posted(c, mem)?);
        }
        let mut interrupted = Vec::new();
        for s in &mut q.sqs {
            let r = rec.sq(s.qid).unwrap_or(SqPosition {
                head: s.head,
                tail: s.tail,
            });
            (s.head, s.tail) = (r.head, r.tail);
            if s.size == 0 {
                continue;
            }
            let trapped = rec
                .doorbell(Doorbell::SqTail(s.qid))
                .filter(|&t| t < s.size && matches!(s.source, SavedSource::Register));
            let tail = trapped.unwrap_or(s.tail);
            let mut open: Vec<Open> = rec.open(s.qid);
            open.retain(|o| o.head < s.size);
            for p in posted.iter().filter(|p| p.sqid == s.qid) {
                if p.sqhd >= s.size {
                    return Err(format!(
                        "CQ entries report SQ {}'s head at {}, beyond its {} entries",
                        s.qid, p.sqhd, s.size
                    ));
                }
                s.head = later(s.head, p.sqhd, tail, s.size);
                // The entry completes the command of its CID fetched before
                // it was posted (a CID the host used again after seeing the
                // entry is a new command, fetched at or after that head).
                if let Some(i) = open
                    .iter()
                    .position(|o| o.cid == p.cid && ring(o.head, p.sqhd, s.size) < s.size / 2)
                {
                    open.remove(i);
                }
            }
            // A completion owed (`queue::owed`) whose command is still
            // recorded in flight was not posted: the state holds its
            // effect, so the restore posts it (`QueueTable::post_owed`),
            // not as interrupted. One no longer in flight was posted.
            q.owed.retain(|w| {
                w.sqid != s.qid || open.iter().any(|o| o.cid == w.cid && o.head == w.head)
            });
            let owed = &q.owed;
            open.retain(|o| {
                !owed
                    .iter()
                    .any(|w| w.sqid == s.qid && w.cid == o.cid && w.head == o.head)
            });
            for o in open.iter().filter(|o| o.late) {
                s.head = later(s.head, o.head, tail, s.size);
            }
            if ring(r.head, s.head, s.size) > ring(r.head, s.tail, s.size) {
                // The head passed the last tail the words hold: the worker
                // read a newer one since.
                s.tail = s.head;
            }
            if s.qid == 0 {
                // An Asynchronous Event Request taken after the slot stays
                // outstanding: Linux re-arms one only after a successful
                // completion, so Command Interrupted would end the guest's
                // events. One the slot holds is outstanding already.
                let aers = &mut self.body.reporting.aer_cids;
                open.retain(|o| !outstanding_aer(aers, s, o, mem));
            }
            // The first fetched is the farthest behind the head.
            open.sort_by_key(|o| std::cmp::Reverse(ring(o.head, s.head, s.size)));
            if s.qid == 0 {
                // An admin command whose bytes are kept and whose whole
                // effect is in the saved state runs again, in the order
                // fetched (`super::rerun`): Linux never retries an admin
                // command that completes with Command Interrupted.
                let rerun = &mut self.rerun;
                open.retain(|o| match rerun_of(rec, o) {
                    Some(cmd) => {
                        rerun.push(cmd);
                        false
                    }
                    None => true,
                });
            }
            let Some(c) = q.cqs.iter_mut().find(|c| c.qid == s.cqid) else {
                if open.is_empty() {
                    continue;
                }
                return Err(format!(
                    "SQ {}'s CQ {} is not in the saved state",
                    s.qid, s.cqid
                ));
            };
            if c.size < 2 && !open.is_empty() {
                // Never saved so (a CQ has 2 entries at least); not divided by.
                return Err(format!("CQ {} has {} entries", c.qid, c.size));
            }
            let head = host_cq_head(c, rec, mem);
            for o in open {
                if (c.tail + 1) % c.size == head {
                    return Err(format!(
                        "CQ {} has no room to complete command {} of SQ {} as interrupted",
                        c.qid, o.cid, s.qid
                    ));
                }
                let cqe = Completion::new(
                    0,
                    s.head as u16,
                    s.qid,
                    o.cid,
                    c.phase,
                    Status::COMMAND_INTERRUPTED,
                );
                let at = c.base.wrapping_add(u64::from(c.tail) * 16);
                mem.write(GuestAddress(at), cqe.as_bytes())
                    .map_err(|e| format!("writing CQ {}'s entry {}: {e}", c.qid, c.tail))?;
                c.tail += 1;
                if c.tail == c.size {
                    c.tail = 0;
                    c.phase = !c.phase;
                }
                interrupted.push((s.qid, o.cid));
            }
        }
        // The doorbell registers the saved state holds are as old as it
        // is: a worker would take an old SQ tail for a new one. They
        // become the host's last trapped values, else the positions (a
        // doorbell page handed over keeps the host's newer values).
        let sqs: Vec<(u16, u32)> = q.sqs.iter().map(|s| (s.qid, s.tail)).collect();
        let cqs: Vec<(u16, u32)> = q.cqs.iter().map(|c| (c.qid, c.head)).collect();
        for r in &mut self.body.doorbells.registers {
            let qid = (r.index / 2) as u16;
            let (db, now) = if r.index % 2 == 0 {
                (Doorbell::SqTail(qid), sqs.iter().find(|(q, _)| *q == qid))
            } else {
                (Doorbell::CqHead(qid), cqs.iter().find(|(q, _)| *q == qid))
            };
            if let Some((_, v)) = now {
                r.value = rec.doorbell(db).unwrap_or(*v);
            }
        }
        Ok(interrupted)
    }
}
