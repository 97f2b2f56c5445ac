//! What a supervised server keeps for its successor after a crash (issue
//! 35 item 3, docs/state-format.md "Crash area"): the controller tells a
//! [`CrashRecord`] the queue positions each worker reached after each
//! round, and that an admin command ran (the saved state may have
//! changed). The record (the binary's: a memfd shared with the supervisor)
//! is an `Option` the worker looks at once per round, so a server that is
//! not supervised pays one test per round, and one per command that goes
//! in flight (an asynchronous backend's, or one a fault or QoS holds: the
//! commands that complete in their pass pay nothing).
//!
//! The record is also told, as they happen, which commands go in flight
//! and when each is done (`fetched`, `completed`: its CQ entry posted, or
//! dropped with its queue), and every doorbell value a trap stored (in
//! `trap` mode no memory holds it until a worker takes it).
//!
//! With a record, an admin command's completion is owed until the record's
//! keeper kept a state holding its effect (`queue::owed`): it is
//! recorded in flight (`fetched`) until posted.
//!
//! A zoned namespace's zones are recorded as they change, a word per
//! zone (and one per write not yet completed), under the zones' lock
//! (`crate::zoned`'s `record.rs`): every write, Zone Append and zone
//! action moves them, I/O commands no checkpoint follows.
//!
//! A restore takes the newest whole saved state and puts the positions
//! and zones recorded since over it, completing the commands still in
//! flight with Command Interrupted (`SavedState::put_positions`), but
//! for the admin commands it runs again (their bytes are kept with
//! their record: `saved_state::rerun`).

use std::sync::Arc;

use vnvme_spec::regs::Doorbell;

use crate::queue::rings::Rings;
use crate::queue::Sq;
pub use crate::zoned::ZoneRecorder;

/// Where a SQ stands: the head past the commands fetched, and the last
/// valid tail seen (in `trap` mode no memory holds it but this).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqPosition {
    pub head: u32,
    pub tail: u32,
}

/// Where a CQ stands: the last valid head read, the tail the next entry
/// is posted at and the phase tag it is posted with, and how many entries
/// are promised to commands fetched and not completed (a restore cannot
/// complete them yet: it refuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqPosition {
    pub head: u32,
    pub tail: u32,
    pub phase: bool,
    pub reserved: u32,
}

/// Told by the controller what a crash would otherwise lose (the zones'
/// changes too: [`ZoneRecorder`]).
pub trait CrashRecord: ZoneRecorder {
    /// SQ `qid` stands at `pos` (a worker, after a round).
    fn sq(&self, qid: u16, pos: SqPosition);
    /// CQ `qid` stands at `pos` (a worker, after a round).
    fn cq(&self, qid: u16, pos: CqPosition);
    /// An admin command ran, or an I/O command that changes saved state
    /// (a reservation command): the state other than positions may have
    /// changed (called by the worker that ran it, before its round ends).
    fn admin_done(&self);
    /// Command `cid` of SQ `qid` went in flight, fetched when the SQ
    /// stood at `pos` (its head past the command).
    fn fetched(&self, qid: u16, cid: u16, pos: SqPosition);
    /// Command `cid` of SQ `qid` is done: its CQ entry is in guest memory
    /// (or it was dropped with its queue).
    fn completed(&self, qid: u16, cid: u16);
    /// Admin command `sqe` (CID `cid`), run with its completion owed, is
    /// about to be recorded in flight at admin SQ head `head`
    /// ([`fetched`](Self::fetched)): its bytes are kept beside, so a
    /// restore can run it again (`saved_state::rerun`). A record may keep
    /// a bounded number; one it no longer holds is interrupted.
    fn admin_command(&self, cid: u16, head: u32, sqe: &[u8; 64]);
    /// A trap stored `value` in doorbell `db` (before its reply is sent).
    fn doorbell(&self, db: Doorbell, value: u32);
}

/// What the crash area kept, read back after a crash: the positions and
/// the commands in flight ([`crate::SavedState::put_positions`]).
pub trait CrashRecorded {
    /// SQ `qid`'s position at the last round or fetch, if recorded.
    fn sq(&self, qid: u16) -> Option<SqPosition>;
    /// CQ `qid`'s position at the last round, if recorded.
    fn cq(&self, qid: u16) -> Option<CqPosition>;
    /// The commands of SQ `qid` recorded in flight.
    fn open(&self, qid: u16) -> Vec<Open>;
    /// The bytes kept of admin command `cid` recorded in flight at head
    /// `head` ([`CrashRecord::admin_command`]), if still kept.
    fn admin_command(&self, cid: u16, head: u32) -> Option<[u8; 64]>;
    /// The value a trap last stored in doorbell `db`, if any since the
    /// saved state.
    fn doorbell(&self, db: Doorbell) -> Option<u32>;
    /// Zone `zone` of namespace `nsid`'s word and write word, as last
    /// stored (0 for one never stored).
    fn zone(&self, nsid: u32, zone: u32) -> (u64, u64);
}

/// A command recorded in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Open {
    pub cid: u16,
    /// The SQ's head right after the command was fetched.
    pub head: u32,
    /// Recorded after the SQ's last position (the crash fell between the
    /// two stores): its head is newer than the SQ word's.
    pub late: bool,
}

/// After a worker's round: its rings' positions to the record, if any.
pub(crate) fn after_round(record: Option<&Arc<dyn CrashRecord>>, rings: &mut Rings) {
    let Some(rec) = record else {
        return;
    };
    for sq in rings.sqs_mut() {
        rec.sq(
            sq.qid,
            SqPosition {
                head: sq.head,
                tail: sq.tail,
            },
        );
    }
    for cq in rings.cqs_mut() {
        rec.cq(
            cq.qid,
            CqPosition {
                head: cq.head,
                tail: cq.tail,
                phase: cq.phase,
                reserved: cq.reserved,
            },
        );
    }
}

/// A command of `sq` goes in flight (on a backend, or held).
pub(crate) fn fetched(record: Option<&Arc<dyn CrashRecord>>, sq: &Sq, cid: u16) {
    if let Some(rec) = record {
        let pos = SqPosition {
            head: sq.head,
            tail: sq.tail,
        };
        rec.fetched(sq.qid, cid, pos);
    }
}

/// A command that was in flight is done (posted or dropped).
pub(crate) fn completed(record: Option<&Arc<dyn CrashRecord>>, qid: u16, cid: u16) {
    if let Some(rec) = record {
        rec.completed(qid, cid);
    }
}

/// After an admin command ran (or a reservation command changed one).
pub(crate) fn admin_done(record: Option<&Arc<dyn CrashRecord>>) {
    if let Some(rec) = record {
        rec.admin_done();
    }
}
