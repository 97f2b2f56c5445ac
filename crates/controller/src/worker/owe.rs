//! The worker's side of completions owed (`--supervise`,
//! [`crate::queue::owed`]): owing a completion instead of posting it, and
//! posting it once the keeper released it.

use std::sync::Arc;

use vnvme_spec::{AdminOpcode, Command, Completion, Status};
use zerocopy::little_endian::U32;

use crate::crash_record::CrashRecord;
use crate::queue::owed::Owed;
use crate::queue::{Cq, Sq};
use crate::state::{Session, Shared};

/// The crash record completions are owed to, if the admin queue's (and
/// the state-changing commands') completions wait for a slot: only under
/// `--supervise`.
pub(super) fn owing(shared: &Shared) -> Option<&Arc<dyn CrashRecord>> {
    shared.crash.get()
}

/// Whether admin command `cmd` may change the saved state: all but
/// Identify and Get Features, which read it only. Those post at once and
/// ask for no checkpoint (a crash after them forgets nothing; Get Log
/// Page is not among them: reading a log may clear events or take a
/// capture).
pub(super) fn changes_state(cmd: &Command) -> bool {
    !matches!(
        AdminOpcode(cmd.opcode()),
        AdminOpcode::IDENTIFY | AdminOpcode::GET_FEATURES
    )
}

/// Owes the completion of `cmd` of `sq` (run: its effect is made) on
/// `cq`, with `dw` as DW0 and DW1: counted and logged as a posted one
/// would be (the error log is saved with it), an entry of `cq` kept for
/// it, the command recorded in flight, and `rec` told the state changed
/// (its keeper then writes the slot that releases it).
#[allow(clippy::too_many_arguments)]
pub(super) fn owe(
    shared: &Shared,
    rec: &Arc<dyn CrashRecord>,
    sq: &Sq,
    cq: &mut Cq,
    cmd: &Command,
    dw: u64,
    status: Status,
) {
    shared.stats.completion(sq.qid, status);
    if !status.is_success() {
        shared.log_error(sq.qid, cmd, status);
    }
    cq.reserved = cq.reserved.saturating_add(1);
    shared.queues.owed.owe(Owed {
        sqid: sq.qid,
        cqid: cq.qid,
        cid: cmd.cid(),
        head: sq.head,
        dw,
        status,
        released: false,
    });
    if sq.qid == 0 {
        // Before its record in flight: a restore that finds the record
        // finds the bytes to run it again with.
        let sqe: &[u8; 64] = zerocopy::transmute_ref!(cmd);
        rec.admin_command(cmd.cid(), sq.head, sqe);
    }
    crate::crash_record::fetched(Some(rec), sq, cmd.cid());
    crate::crash_record::admin_done(Some(rec));
}

/// Posts the released completions owed on `sq` (to `cq`, which kept
/// their entries), each with the SQ's head now, and records each done.
/// Returns `false` (and sets CSTS.CFS) if the CQ is unwritable. One
/// atomic load when none is released.
pub(super) fn post_owed(shared: &Shared, session: &Session, sq: &Sq, cq: &mut Cq) -> bool {
    for o in shared.queues.owed.take_released(sq.qid, cq.qid) {
        cq.reserved = cq.reserved.saturating_sub(1);
        let mut cqe = Completion::new(o.dw as u32, sq.head as u16, sq.qid, o.cid, false, o.status);
        cqe.dw1 = U32::new((o.dw >> 32) as u32);
        if cq.post(&*session.mem, cqe).is_err() {
            shared.set_fatal("completion queue unwritable");
            return false;
        }
        // After its CQ entry: a crash before finds the entry in the CQ.
        crate::crash_record::completed(shared.crash.get(), sq.qid, o.cid);
    }
    true
}
