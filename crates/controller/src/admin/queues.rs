//! Create and Delete I/O Submission/Completion Queue (§5.4, §5.5, §5.6, §5.7).

use vnvme_spec::cdw::{Cdw10CreateIoQueue, Cdw10DeleteIoQueue, Cdw11CreateIoCq, Cdw11CreateIoSq};
use vnvme_spec::regs::Doorbell;
use vnvme_spec::{Command, Completion, Status};

use super::invalid_field;
use crate::command::{Ctx, Outcome};
use crate::memory::GuestAddress;
use crate::queue::rings::RingOp;
use crate::queue::{Cq, Sq};

fn invalid_qid() -> Status {
    Status::INVALID_QID.with_dnr(true)
}

/// Fields common to both create commands: QID (CDW10 15:0), QSIZE (CDW10
/// 31:16, 0's based), PC (CDW11 bit 0), and the base address in PRP1.
struct CreateQueue {
    qid: u16,
    entries: u32,
    base: GuestAddress,
}

fn parse_create(
    ctx: &Ctx<'_>,
    cmd: &Command,
    limit_z: u16,
    entry_size_ok: bool,
) -> Result<CreateQueue, Status> {
    let cdw10 = Cdw10CreateIoQueue::from(cmd.cdw10);
    let (qid, qsize_z) = (cdw10.qid(), cdw10.qsize_z());
    if qid == 0 || u32::from(qid) > u32::from(limit_z) + 1 {
        return Err(invalid_qid());
    }
    if qsize_z == 0 || qsize_z > ctx.shared.config.mqes_z {
        return Err(Status::INVALID_QUEUE_SIZE.with_dnr(true));
    }
    if !entry_size_ok {
        return Err(invalid_field());
    }
    let base = GuestAddress(cmd.prp1.get());
    if base.page_offset(ctx.session.page_size) != 0 {
        return Err(Status::INVALID_PRP_OFFSET.with_dnr(true));
    }
    // CAP.CQR = 1: physically contiguous queues only. PC is bit 0 of
    // CDW11 in both create commands.
    if !Cdw11CreateIoCq::from(cmd.cdw11).pc() {
        return Err(invalid_field());
    }
    Ok(CreateQueue {
        qid,
        entries: u32::from(qsize_z) + 1,
        base,
    })
}

/// Create I/O Completion Queue (§5.4): IEN (CDW11 bit 1), IV (CDW11 31:16).
/// The ring rests in its slot until its worker takes it (`AdoptCq`).
pub(super) fn create_cq(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<(), Status> {
    let shared = ctx.shared;
    let ncqa_z = shared.features.admin.lock().ncqa_z;
    let cc = shared.lifecycle.cc();
    let entry_ok = 1usize << cc.iocqes() == Completion::SIZE;
    let qid = Cdw10CreateIoQueue::from(cmd.cdw10).qid();
    let table = &shared.queues;
    let slot = table.cqs.get(usize::from(qid)).ok_or_else(invalid_qid)?;
    if qid == 0 {
        return Err(invalid_qid());
    }
    let mut dir = table.directory.lock();
    if dir.cq(qid).is_some() {
        return Err(invalid_qid());
    }
    let q = parse_create(ctx, cmd, ncqa_z, entry_ok)?;
    let cdw11 = Cdw11CreateIoCq::from(cmd.cdw11);
    let (ien, iv) = (cdw11.ien(), cdw11.iv());
    if iv >= shared.config.msix_vectors {
        return Err(Status::INVALID_INTERRUPT_VECTOR.with_dnr(true));
    }
    let mut cq = Cq::new(q.qid, q.base, q.entries, ien, iv);
    cq.set_source(
        ctx.shared
            .doorbells
            .fresh_source(Doorbell::CqHead(q.qid), &*ctx.session.mem),
    );
    dir.add_cq(&cq);
    drop(dir);
    *slot.lock() = Some(cq);
    let worker = table.worker_for(q.qid);
    shared
        .doorbells
        .open(Doorbell::CqHead(q.qid), q.entries, worker);
    if let Some(m) = table.mailboxes.get(worker) {
        m.send(RingOp::AdoptCq(q.qid));
    }
    shared.features.admin.lock().io_queues_created = true;
    Ok(())
}

/// Create I/O Submission Queue (§5.5): CQID (CDW11 31:16). The ring rests
/// in its slot until its CQ's worker takes it (`AdoptSq`).
pub(super) fn create_sq(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<(), Status> {
    let shared = ctx.shared;
    let cqid = Cdw11CreateIoSq::from(cmd.cdw11).cqid();
    // CQ 0 is the admin CQ, never an I/O SQ's.
    if cqid == 0 {
        return Err(Status::INVALID_CQ.with_dnr(true));
    }
    let nsqa_z = shared.features.admin.lock().nsqa_z;
    let cc = shared.lifecycle.cc();
    let entry_ok = 1usize << cc.iosqes() == Command::SIZE;
    let qid = Cdw10CreateIoQueue::from(cmd.cdw10).qid();
    if qid == 0 {
        return Err(invalid_qid());
    }
    let table = &shared.queues;
    let slot = table.sqs.get(usize::from(qid)).ok_or_else(invalid_qid)?;
    let mut dir = table.directory.lock();
    if dir.sq(qid).is_some() {
        return Err(invalid_qid());
    }
    // A CQ being deleted takes no new SQ.
    if dir.cq(cqid).is_none_or(|cq| cq.deleting) {
        return Err(Status::INVALID_CQ.with_dnr(true));
    }
    let q = parse_create(ctx, cmd, nsqa_z, entry_ok)?;
    let mut sq = Sq::new(q.qid, q.base, q.entries, cqid);
    sq.set_source(
        ctx.shared
            .doorbells
            .fresh_source(Doorbell::SqTail(q.qid), &*ctx.session.mem),
    );
    dir.add_sq(&sq);
    drop(dir);
    *slot.lock() = Some(sq);
    let worker = table.worker_for(cqid);
    shared
        .doorbells
        .open(Doorbell::SqTail(q.qid), q.entries, worker);
    if let Some(m) = table.mailboxes.get(worker) {
        m.send(RingOp::AdoptSq(q.qid));
    }
    shared.features.admin.lock().io_queues_created = true;
    Ok(())
}

/// Delete I/O Submission Queue (§5.7). Its worker stops fetching from it
/// and, once its commands in flight on an asynchronous backend are done,
/// drops it; the admin worker then completes this command.
pub(super) fn delete_sq(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<Outcome, Status> {
    let shared = ctx.shared;
    let qid = Cdw10DeleteIoQueue::from(cmd.cdw10).qid();
    if qid == 0 {
        return Err(invalid_qid());
    }
    let table = &shared.queues;
    let mut dir = table.directory.lock();
    let entry = dir
        .sq_mut(qid)
        .filter(|e| !e.deleting)
        .ok_or_else(invalid_qid)?;
    entry.deleting = true;
    let worker = table.worker_for(entry.cqid);
    drop(dir);
    send(
        ctx,
        worker,
        RingOp::DeleteSq {
            qid,
            cid: cmd.cid(),
        },
    );
    Ok(Outcome::Deferred)
}

/// Sends `op` to `worker`; the admin worker posts its answer.
fn send(ctx: &Ctx<'_>, worker: usize, op: RingOp) {
    let table = &ctx.shared.queues;
    table.await_answer();
    if let Some(m) = table.mailboxes.get(worker) {
        m.send(op);
    }
}

/// Delete I/O Completion Queue (§5.6): refused while an SQ still uses it.
/// Its worker drops it; the admin worker then completes this command.
pub(super) fn delete_cq(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<Outcome, Status> {
    let shared = ctx.shared;
    let qid = Cdw10DeleteIoQueue::from(cmd.cdw10).qid();
    if qid == 0 {
        return Err(invalid_qid());
    }
    let table = &shared.queues;
    let mut dir = table.directory.lock();
    let entry = dir
        .cq_mut(qid)
        .filter(|e| !e.deleting)
        .ok_or_else(invalid_qid)?;
    if entry.sq_refs > 0 {
        return Err(Status::INVALID_QUEUE_DELETION.with_dnr(true));
    }
    entry.deleting = true;
    drop(dir);
    send(
        ctx,
        table.worker_for(qid),
        RingOp::DeleteCq {
            qid,
            cid: cmd.cid(),
        },
    );
    Ok(Outcome::Deferred)
}
