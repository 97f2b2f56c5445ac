//! NVM command set I/O commands (NVM Command Set Spec 1.0 §3): parsed into
//! typed requests, then executed against the namespace's backend. Copy
//! has its own module.
//!
//! Reads and writes on an asynchronous backend (the `file` backend) move
//! their data straight between the backend and the host's memory, which
//! the request holds mapped until it completes ([`GuestMemory::pin`]).
//! They go through a buffer of ours (bounce), copied from or to the host's
//! memory, where that cannot be: on synchronous backends (a copy anyway),
//! with separate metadata (split from the data in the backend's layout),
//! for memory the kernel cannot be handed (maps reached by messages, or
//! not mapped at all: the copy then reports the Data Transfer Error).
//! Memory the kernel would want aligned differently for O_DIRECT is the
//! backend's concern: it reads or writes it in place through the page
//! cache. The bytes bounced are counted ([`ControllerStats::bounced_bytes`]).
//!
//! [`GuestMemory::pin`]: crate::memory::GuestMemory::pin
//! [`ControllerStats::bounced_bytes`]: crate::stats::ControllerStats::bounced_bytes

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use vnvme_blockdev::{BlockCompletion, BlockError, BlockRequest, Data, MappedBuf, ReadFill};
use vnvme_spec::cdw::{Cdw10Dsm, Cdw11Dsm, Cdw12ReadWrite};
use vnvme_spec::range::DsmRange;
use vnvme_spec::status::invalid_field;
use vnvme_spec::{Command, NvmOpcode, Status};
use zerocopy::FromBytes;

use crate::backend_error::BackendOp;
use crate::command::{Ctx, Outcome};
use crate::config::Readiness;
use crate::inflight::{InFlight, Kind, Started};
use crate::io_request::{Extent, ReadWrite, WriteZeroes};
use crate::namespace::reservation::Admitted;
use crate::namespace::Namespace;
use crate::protection::GuardFill;
use crate::prp;

use crate::namespace::NSID_ALL;

mod copy;
mod metadata;
mod reservation;
mod zone;

pub(crate) use zone::OPCODES as ZONE_OPCODES;

/// Opcodes this controller implements (Commands Supported and Effects, ONCS).
pub(crate) const SUPPORTED: &[NvmOpcode] = &[
    NvmOpcode::FLUSH,
    NvmOpcode::WRITE,
    NvmOpcode::READ,
    NvmOpcode::WRITE_UNCORRECTABLE,
    NvmOpcode::COMPARE,
    NvmOpcode::WRITE_ZEROES,
    NvmOpcode::DATASET_MANAGEMENT,
    NvmOpcode::VERIFY,
    NvmOpcode::COPY,
    NvmOpcode::RESERVATION_REGISTER,
    NvmOpcode::RESERVATION_REPORT,
    NvmOpcode::RESERVATION_ACQUIRE,
    NvmOpcode::RESERVATION_RELEASE,
];

/// The read command group of Command Behavior in the Presence of a
/// Reservation (Base 2.0 §8.19.1; NVM Command Set 1.0 §2.1.4); the other
/// I/O commands but the reservation commands are the write group.
const READ_GROUP: &[NvmOpcode] = &[NvmOpcode::READ, NvmOpcode::COMPARE, NvmOpcode::VERIFY];

/// Opcodes that change logical block content (Commands Supported and
/// Effects LBCC): what a sanitized medium stays erased without.
pub(crate) const WRITES_USER_DATA: &[NvmOpcode] = &[
    NvmOpcode::WRITE,
    NvmOpcode::WRITE_UNCORRECTABLE,
    NvmOpcode::WRITE_ZEROES,
    NvmOpcode::DATASET_MANAGEMENT,
    NvmOpcode::COPY,
];

/// Executes an I/O command; every failure is an NVMe status. Reads,
/// writes and flushes start through [`InFlight::start`] and end in
/// [`finish`], at once or when the backend completes them.
pub(crate) fn execute(ctx: &mut Ctx<'_>, cmd: &Command) -> Outcome {
    if NvmOpcode(cmd.opcode()).is_vendor_specific() {
        let set = crate::vendor::CommandSet::Io;
        return Outcome::from_result(crate::command::execute_vendor(ctx, set, cmd));
    }
    if let Some(outcome) = zone::execute(ctx, cmd) {
        return outcome;
    }
    let r = run(ctx, cmd);
    let owed = std::mem::take(&mut ctx.scratch.owed);
    match r {
        Ok(Some(token)) => Outcome::Submitted(token),
        // A Preempt and Abort waiting for the commands before it.
        Ok(None) if ctx.scratch.fence.is_some() => Outcome::Fenced,
        Ok(None) if owed => Outcome::Owed {
            dw0: 0,
            status: Status::SUCCESS,
        },
        Ok(None) => Outcome::ok(0),
        Err(status) if owed => Outcome::Owed { dw0: 0, status },
        Err(status) => Outcome::Done { dw0: 0, status },
    }
}

/// Runs `cmd`: `Some(token)` if it is in flight, `None` if done.
fn run(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<Option<u64>, Status> {
    let op = NvmOpcode(cmd.opcode());
    if !SUPPORTED.contains(&op) {
        return Err(Status::INVALID_OPCODE.with_dnr(true));
    }
    // PSDT 01b: SGL data, metadata contiguous at MPTR; 10b: SGL data and
    // metadata (SGLS bit 19); 11b is reserved.
    if cmd.fuse() != 0 || cmd.psdt() > 2 {
        return Err(invalid_field());
    }
    let nsid = cmd.nsid.get();
    if op == NvmOpcode::FLUSH && nsid == NSID_ALL {
        return flush_all(ctx).map(|()| None);
    }
    let ns = usable_namespace(ctx, cmd, op)?;
    if let Some(zones) = &ns.zones {
        match zone::admit(ctx, cmd, op, &ns, zones)? {
            zone::Admitted::Done => return Ok(None),
            zone::Admitted::Run => {}
            zone::Admitted::Write(slba, nlb) => {
                let r = run_admitted(ctx, cmd, op, &ns);
                // Done in its pass (or failed): settled before its
                // completion is posted; in flight: when `finish` runs.
                if !matches!(r, Ok(Some(_))) {
                    zones.settled(slba, nlb);
                }
                return r;
            }
        }
    }
    run_admitted(ctx, cmd, op, &ns)
}

/// Runs `cmd` on `ns`, admitted by its zones if it has any.
fn run_admitted(
    ctx: &mut Ctx<'_>,
    cmd: &Command,
    op: NvmOpcode,
    ns: &Arc<Namespace>,
) -> Result<Option<u64>, Status> {
    let ns = ns.clone();
    if let Some(r) = reservation::command(ctx, cmd, &ns, op) {
        ctx.scratch.fence = r?;
        if op != NvmOpcode::RESERVATION_REPORT {
            // A registrant or a reservation changed: saved state, which a
            // supervised server keeps at its next checkpoint as after an
            // admin command (a crash would otherwise forget it), its
            // completion owed until then (a fenced one's when its fence
            // is done: `worker::held`).
            ctx.state_changed();
            ctx.scratch.owed &= ctx.scratch.fence.is_none();
        }
        return Ok(None);
    }
    let writes = !READ_GROUP.contains(&op);
    let admitted = ns.reservations.check(|| host_id(ctx), writes)?;
    match op {
        NvmOpcode::READ => read(ctx, cmd, &ns, admitted),
        NvmOpcode::WRITE => write(ctx, cmd, &ns, admitted),
        NvmOpcode::FLUSH => flush(ctx, cmd, &ns, admitted),
        // The others run here: `admitted` drops (the command is done) as
        // they return.
        NvmOpcode::COMPARE => compare(ctx, cmd, &ns).map(|()| None),
        NvmOpcode::WRITE_ZEROES => write_zeroes(ctx, cmd, &ns).map(|()| None),
        NvmOpcode::DATASET_MANAGEMENT => dataset_management(ctx, cmd, &ns).map(|()| None),
        NvmOpcode::VERIFY => verify(ctx, cmd, &ns).map(|()| None),
        NvmOpcode::WRITE_UNCORRECTABLE => {
            let e = Extent::of(cmd, &ns)?;
            ns.uncorrectable.mark(e.slba, e.nlb)?;
            ctx.state_changed();
            Ok(None)
        }
        NvmOpcode::COPY => copy::copy(ctx, cmd, &ns).map(|()| None),
        _ => Err(Status::INVALID_OPCODE.with_dnr(true)),
    }
}

/// Flush with NSID FFFFFFFFh: every attached namespace, each as a Flush
/// to it. Flush is in the write command group of Command Behavior in the
/// Presence of a Reservation (Base 2.1 §8.1.24.1), so if the host may not
/// write one of them the command is a Reservation Conflict, before any is
/// flushed (a success would say that namespace was flushed for it). Each
/// counts as running on its namespace meanwhile (a Preempt and Abort's
/// fence).
fn flush_all(ctx: &mut Ctx<'_>) -> Result<(), Status> {
    let namespaces = ctx.shared.subsystem.namespaces.active_list();
    let admitted = (namespaces.iter())
        .map(|ns| ns.reservations.check(|| host_id(ctx), true))
        .collect::<Result<Vec<Admitted>, Status>>()?;
    for ns in &namespaces {
        ns.backend.flush().map_err(|e| {
            ctx.shared
                .stats
                .backend_error(BackendOp::Flush, ns.nsid, &e)
        })?;
    }
    drop(admitted);
    Ok(())
}

/// This controller's Host Identifier: the host its commands come from.
fn host_id(ctx: &Ctx<'_>) -> [u8; 16] {
    ctx.shared.features.admin.lock().host_id
}

/// The namespace `cmd` names, if command `op` may run on it now.
fn usable_namespace(
    ctx: &mut Ctx<'_>,
    cmd: &Command,
    op: NvmOpcode,
) -> Result<Arc<Namespace>, Status> {
    let nsid = cmd.nsid.get();
    let namespaces = &ctx.shared.subsystem.namespaces;
    let ns = namespaces
        .active_cached(&mut ctx.scratch.namespaces, nsid)
        .ok_or(Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true))?;
    // Its ANA group (= NSID) through this controller: a relaxed load while
    // every path is usable.
    namespaces.table().ana.check_io(namespaces.cntlid(), nsid)?;
    if ctx.shared.faults.not_ready(nsid, Instant::now) {
        return Err(Status::NAMESPACE_NOT_READY.with_dnr(false));
    }
    if ns.readiness != Readiness::Immediate
        || ns.formatting_until.is_some()
        || ns.sanitize.is_some()
    {
        let now = Instant::now();
        let enabled_at = ctx.shared.lifecycle.enabled_at();
        ns.check_usable(op, now, enabled_at, ctx.shared.config.ready_timeout)?;
    }
    Ok(ns)
}

/// Finishes a read, write or flush whose backend request completed, at
/// once or reaped from an asynchronous backend: copies what was read to
/// the host (unless it went there in place), counts, and gives the status.
/// `guards`: a read's guards, if computed as the backend read it.
/// A command whose host a Preempt and Abort removed since `admitted` is
/// aborted; a write's data may be on the medium all the same (the backend
/// had it), as with any write aborted in flight, but before the Preempt
/// and Abort completes, which waits for it (see
/// [`crate::namespace::reservation::fence`]).
pub(crate) fn finish(
    ctx: &mut Ctx<'_>,
    cmd: &Command,
    ns: &Namespace,
    kind: &Kind,
    done: &BlockCompletion,
    guards: &[u64],
    admitted: &Admitted,
) -> Status {
    if let (Kind::Write(rw), Some(zones)) = (kind, &ns.zones) {
        // Before its completion: a crash now no longer undoes the write.
        zones.settled(rw.slba, rw.nlb);
    }
    if ns.reservations.aborted(admitted, || host_id(ctx)) {
        if let (Kind::Write(rw), Ok(())) = (kind, &done.result) {
            // Its blocks were written: counted, no longer uncorrectable.
            write_done(ctx, ns, rw);
        }
        // Retrying cannot help: the host is no registrant now.
        return Status::ABORTED_PREEMPT_AND_ABORT.with_dnr(true);
    }
    let r = match (kind, &done.result, &done.data) {
        (_, result, Some(Data::Mapped(mem))) if lost(mem, result) => Err(host_memory_lost()),
        (Kind::Read(rw), Ok(()), Some(Data::Buf(buf))) => read_done(ctx, cmd, ns, rw, buf, guards),
        (Kind::Read(rw), Ok(()), Some(Data::Mapped(_))) => {
            read_counted(ctx, ns, rw);
            Ok(())
        }
        // A backend that gave no buffer back: nothing was read.
        (Kind::Read(_), Ok(()), None) => Err(read_error(ctx)),
        (Kind::Write(rw), Ok(()), _) => {
            write_done(ctx, ns, rw);
            Ok(())
        }
        (Kind::Flush, Ok(()), _) => Ok(()),
        (kind, Err(e), _) => {
            let op = match kind {
                Kind::Read(_) => BackendOp::Read,
                Kind::Write(_) => BackendOp::Write,
                Kind::Flush => BackendOp::Flush,
            };
            Err(ctx.shared.stats.backend_error(op, ns.nsid, e))
        }
    };
    r.err().unwrap_or(Status::SUCCESS)
}

/// Whether the host's memory that a transfer went to or came from failed
/// it: the client shrank the file behind it meanwhile (the data cannot be
/// trusted), or the kernel could not reach it (EFAULT). The host's doing,
/// not the medium's.
fn lost(mem: &MappedBuf, result: &Result<(), BlockError>) -> bool {
    !mem.intact()
        || matches!(result, Err(BlockError::Io(e)) if e.raw_os_error() == Some(rustix::io::Errno::FAULT.raw_os_error()))
}

/// As a copy that finds the memory gone: traced, not logged (the guest's
/// doing; its count is in the completion statuses).
fn host_memory_lost() -> Status {
    tracing::trace!("host memory of a transfer in place was lost under it");
    Status::DATA_TRANSFER_ERROR.with_dnr(true)
}

/// A read failed on the medium (or a block marked by Write Uncorrectable):
/// Unrecovered Read Error, counted.
fn read_error(ctx: &Ctx<'_>) -> Status {
    ctx.shared
        .stats
        .media_errors
        .fetch_add(1, Ordering::Relaxed);
    Status::UNRECOVERED_READ_ERROR.with_dnr(true)
}

/// Copies the host's data (and separate metadata) of `rw` into `out`
/// (`rw.len` bytes), in the backend layout.
fn gather(
    ctx: &mut Ctx<'_>,
    cmd: &Command,
    ns: &Namespace,
    rw: &ReadWrite,
    out: &mut [u8],
) -> Result<(), Status> {
    ctx.map_prps(cmd, rw.data_len)?;
    if rw.data_len == rw.len {
        return prp::read_from_guest(&*ctx.session.mem, &ctx.scratch.segs, out);
    }
    let mut data = std::mem::take(&mut ctx.scratch.split);
    let mut meta = std::mem::take(&mut ctx.scratch.meta);
    data.resize(rw.data_len as usize, 0);
    meta.resize(rw.meta_len as usize, 0);
    let r = prp::read_from_guest(&*ctx.session.mem, &ctx.scratch.segs, &mut data)
        .and_then(|()| metadata::read(ctx, cmd, &mut meta));
    if r.is_ok() {
        let (lba, ms) = (1usize << ns.lba_shift, usize::from(ns.ms));
        for (i, (block, d)) in out
            .chunks_exact_mut(lba + ms)
            .zip(data.chunks_exact(lba))
            .enumerate()
        {
            let (bd, bm) = block.split_at_mut(lba);
            bd.copy_from_slice(d);
            // No metadata from the host (PRACT): the controller makes the PI.
            match meta.get(i * ms..(i + 1) * ms) {
                Some(m) => bm.copy_from_slice(m),
                None => bm.fill(0),
            }
        }
    }
    ctx.scratch.split = data;
    ctx.scratch.meta = meta;
    r
}

/// Copies `media` (backend layout) to the host's data buffer (and the
/// separate metadata buffer at MPTR).
fn scatter(
    ctx: &mut Ctx<'_>,
    cmd: &Command,
    ns: &Namespace,
    rw: &ReadWrite,
    media: &[u8],
) -> Result<(), Status> {
    ctx.map_prps(cmd, rw.data_len)?;
    if rw.data_len == rw.len {
        return prp::write_to_guest(&*ctx.session.mem, &ctx.scratch.segs, media);
    }
    if rw.nlb == 1 {
        // One block: its data and metadata lie apart already.
        let (data, meta) = media.split_at((1usize << ns.lba_shift).min(media.len()));
        let meta = meta.get(..rw.meta_len as usize).unwrap_or_default();
        return prp::write_to_guest(&*ctx.session.mem, &ctx.scratch.segs, data)
            .and_then(|()| metadata::write(ctx, cmd, meta));
    }
    let mut data = std::mem::take(&mut ctx.scratch.split);
    let mut meta = std::mem::take(&mut ctx.scratch.meta);
    data.clear();
    meta.clear();
    let (lba, ms) = (1usize << ns.lba_shift, usize::from(ns.ms));
    for block in media.chunks_exact(lba + ms) {
        let (d, m) = block.split_at(lba);
        data.extend_from_slice(d);
        meta.extend_from_slice(m);
    }
    // PRACT stripped the PI, the metadata's only content.
    meta.truncate(rw.meta_len as usize);
    let r = prp::write_to_guest(&*ctx.session.mem, &ctx.scratch.segs, &data)
        .and_then(|()| metadata::write(ctx, cmd, &meta));
    ctx.scratch.split = data;
    ctx.scratch.meta = meta;
    r
}

/// Unrecovered Read Error if any of `nlb` blocks at `slba` is marked by
/// Write Uncorrectable.
fn check_marks(ctx: &Ctx<'_>, ns: &Namespace, slba: u64, nlb: u64) -> Result<(), Status> {
    ns.uncorrectable
        .check(slba, nlb)
        // Its only error is Unrecovered Read Error, which read_error returns, counted.
        .map_err(|_| read_error(ctx))
}

fn read(
    ctx: &mut Ctx<'_>,
    cmd: &Command,
    ns: &Arc<Namespace>,
    admitted: Admitted,
) -> Result<Option<u64>, Status> {
    let rw = ReadWrite::parse(cmd, ns, ctx.shared.config.max_transfer())?;
    check_marks(ctx, ns, rw.slba, rw.nlb)?;
    metadata::check_read(ctx, cmd, rw.meta_len)?;
    if ns.backend.moves_no_data() {
        // The PRPs are still walked (a malformed list fails as it would),
        // but no data moves: the null device's figures are the
        // controller's own cost, as with SPDK's null bdev.
        ctx.map_prps(cmd, rw.data_len)?;
        read_counted(ctx, ns, &rw);
        return Ok(None);
    }
    if InFlight::is_async(ns) {
        // Check the PRPs now: no backend I/O in flight for a command that
        // cannot complete. (A bounced read maps them again when it does.)
        ctx.map_prps(cmd, rw.data_len)?;
        if let Some(mem) = pin(ctx, &rw, true) {
            let request = BlockRequest::Read {
                offset: rw.offset,
                data: Data::Mapped(mem),
            };
            return start(ctx, cmd, ns, Kind::Read(rw), request, None, admitted);
        }
    }
    let request = BlockRequest::Read {
        offset: rw.offset,
        data: Data::Buf(ctx.inflight.buffer(rw.len as usize)),
    };
    let fill = guard_fill(ctx, ns, &rw);
    start(ctx, cmd, ns, Kind::Read(rw), request, fill, admitted)
}

/// For a read whose guards are checked: the fill that computes them as a
/// synchronous backend copies the blocks out.
fn guard_fill(ctx: &mut Ctx<'_>, ns: &Namespace, rw: &ReadWrite) -> Option<GuardFill> {
    match (ns.pi, rw.pi) {
        (Some(format), Some(pc)) if pc.prinfo.prchk_guard() => Some(GuardFill::new(
            format,
            std::mem::take(&mut ctx.scratch.guards),
        )),
        _ => None,
    }
}

/// The host's memory of `rw`, at the PRPs just mapped, held for the
/// backend to move the data in place; `write`: the backend writes it (a
/// read). `None` if it must bounce (see the module doc).
fn pin(ctx: &Ctx<'_>, rw: &ReadWrite, write: bool) -> Option<MappedBuf> {
    // SGL bit buckets have no memory to hand the kernel: the copy skips them.
    let bucket = |s: &crate::memory::Segment| s.addr == crate::memory::Segment::BIT_BUCKET;
    // Split metadata, and protection information (checked, generated or
    // stripped), need the data in a buffer of ours.
    if rw.data_len != rw.len || rw.pi.is_some() || ctx.scratch.segs.iter().any(bucket) {
        return None;
    }
    ctx.session
        .mem
        .pin(&ctx.scratch.segs, write)
        .map(MappedBuf::new)
}

/// Starts `request`: `Some(token)` if it is in flight, or finishes it.
/// `fill`: a read's guards computed on the way, if it runs at once.
fn start(
    ctx: &mut Ctx<'_>,
    cmd: &Command,
    ns: &Arc<Namespace>,
    kind: Kind,
    request: BlockRequest,
    mut fill: Option<GuardFill>,
    mut admitted: Admitted,
) -> Result<Option<u64>, Status> {
    // Taken by the request if it goes in flight; else it drops here, once
    // the command is done.
    let started = ctx.inflight.start(
        ns,
        cmd,
        (kind, &mut admitted),
        request,
        fill.as_mut().map(|f| f as &mut dyn ReadFill),
    );
    let guards = fill.map(GuardFill::into_guards);
    let r = match started {
        Started::InFlight(token) => Ok(Some(token)),
        Started::Done(done) => {
            if let (Kind::Read(rw) | Kind::Write(rw), Some(Data::Mapped(_))) = (&kind, &done.data) {
                // Run synchronously, through a buffer of the backend's.
                bounced(ctx, rw);
            }
            let status = finish(
                ctx,
                cmd,
                ns,
                &kind,
                &done,
                guards.as_deref().unwrap_or_default(),
                &admitted,
            );
            if let Some(Data::Buf(buf)) = done.data {
                ctx.inflight.recycle(buf);
            }
            if status.is_success() {
                Ok(None)
            } else {
                Err(status)
            }
        }
    };
    if let Some(guards) = guards {
        ctx.scratch.guards = guards;
    }
    r
}

/// A read's data is in `media`: to the host, and counted.
fn read_done(
    ctx: &mut Ctx<'_>,
    cmd: &Command,
    ns: &Namespace,
    rw: &ReadWrite,
    media: &[u8],
    guards: &[u64],
) -> Result<(), Status> {
    bounced(ctx, rw);
    let r = match (ns.pi, rw.pi) {
        (Some(f), Some(pc)) => match f.on_read(&pc, media, guards) {
            // Unwritten tuples the host gets (not stripped) are shown as
            // FFh, in a copy: `media` is the backend's buffer.
            Ok(true) if rw.data_len + rw.meta_len == rw.len => {
                let mut shown = std::mem::take(&mut ctx.scratch.buf2);
                shown.clear();
                shown.extend_from_slice(media);
                f.show_unwritten(&mut shown);
                let r = scatter(ctx, cmd, ns, rw, &shown);
                ctx.scratch.buf2 = shown;
                r
            }
            Ok(_) => scatter(ctx, cmd, ns, rw, media),
            Err(status) => Err(status),
        },
        _ => scatter(ctx, cmd, ns, rw, media),
    };
    read_counted(ctx, ns, rw);
    r
}

/// `rw`'s data went through a buffer between the host and the backend.
fn bounced(ctx: &Ctx<'_>, rw: &ReadWrite) {
    ctx.shared
        .stats
        .bounced_bytes
        .fetch_add(rw.len, Ordering::Relaxed);
}

fn read_counted(ctx: &Ctx<'_>, ns: &Namespace, rw: &ReadWrite) {
    ns.counters.read(rw.len);
    ctx.shared.stats.read(ctx.qid, rw.block_bytes >> 9);
}

fn write(
    ctx: &mut Ctx<'_>,
    cmd: &Command,
    ns: &Arc<Namespace>,
    admitted: Admitted,
) -> Result<Option<u64>, Status> {
    let rw = ReadWrite::parse(cmd, ns, ctx.shared.config.max_transfer())?;
    // Only a write naming a directive takes the streams lock.
    if rw.dtype != 0 {
        let mut streams = ctx.shared.features.streams.lock();
        streams.write(ns.nsid, rw.dtype, rw.dspec)?;
    }
    if ns.backend.moves_no_data() {
        ctx.map_prps(cmd, rw.data_len)?;
        write_done(ctx, ns, &rw);
        return Ok(None);
    }
    // FUA, or a disabled volatile write cache: durable before the
    // completion is posted.
    let fua = rw.fua || !ctx.shared.features.wce.load(Ordering::Relaxed);
    if InFlight::is_async(ns) && rw.data_len == rw.len && rw.pi.is_none() {
        ctx.map_prps(cmd, rw.data_len)?;
        if let Some(mem) = pin(ctx, &rw, false) {
            let request = BlockRequest::Write {
                offset: rw.offset,
                data: Data::Mapped(mem),
                fua,
            };
            return start(ctx, cmd, ns, Kind::Write(rw), request, None, admitted);
        }
    }
    let mut buf = ctx.inflight.buffer(rw.len as usize);
    let r = gather(ctx, cmd, ns, &rw, &mut buf).and_then(|()| match (ns.pi, rw.pi) {
        (Some(f), Some(pc)) => f.on_write(&pc, &mut buf),
        _ => Ok(()),
    });
    if let Err(status) = r {
        ctx.inflight.recycle(buf);
        return Err(status);
    }
    bounced(ctx, &rw);
    let request = BlockRequest::Write {
        offset: rw.offset,
        data: Data::Buf(buf),
        fua,
    };
    start(ctx, cmd, ns, Kind::Write(rw), request, None, admitted)
}

/// A write is done: its blocks are no longer uncorrectable, and counted.
fn write_done(ctx: &mut Ctx<'_>, ns: &Namespace, rw: &ReadWrite) {
    if ns.uncorrectable.clear(rw.slba, rw.nlb) {
        ctx.state_changed();
    }
    ns.counters.written(rw.len);
    let stats = &ctx.shared.stats;
    stats.written(ctx.qid, rw.block_bytes >> 9);
    if rw.dtype != 0 {
        stats.stream_write(rw.dspec);
    }
}

fn flush(
    ctx: &mut Ctx<'_>,
    cmd: &Command,
    ns: &Arc<Namespace>,
    admitted: Admitted,
) -> Result<Option<u64>, Status> {
    let request = BlockRequest::Flush;
    start(ctx, cmd, ns, Kind::Flush, request, None, admitted)
}

/// Compare: data and metadata, extended or separate.
fn compare(ctx: &mut Ctx<'_>, cmd: &Command, ns: &Namespace) -> Result<(), Status> {
    let rw = ReadWrite::parse(cmd, ns, ctx.shared.config.max_transfer())?;
    check_marks(ctx, ns, rw.slba, rw.nlb)?;
    let mut host = std::mem::take(&mut ctx.scratch.buf);
    let mut media = std::mem::take(&mut ctx.scratch.buf2);
    host.resize(rw.len as usize, 0);
    media.resize(rw.len as usize, 0);
    let r = gather(ctx, cmd, ns, &rw, &mut host).and_then(|()| {
        ns.backend
            .read(rw.offset, &mut media)
            .map_err(|e| ctx.shared.stats.backend_error(BackendOp::Read, ns.nsid, &e))?;
        if host == media {
            Ok(())
        } else {
            Err(Status::COMPARE_FAILURE.with_dnr(true))
        }
    });
    ctx.scratch.buf = host;
    ctx.scratch.buf2 = media;
    r
}

/// Verify (§3.2.5): reads the blocks and checks them, transferring
/// nothing. The backends keep no checksums of their own, so a block
/// checks good when it reads; one marked by Write Uncorrectable does not.
fn verify(ctx: &mut Ctx<'_>, cmd: &Command, ns: &Namespace) -> Result<(), Status> {
    /// Read at a time: NLB allows 65536 blocks (256 MiB at 4 KiB).
    const CHUNK: u64 = 1 << 20;
    let v = Extent::of(cmd, ns)?;
    check_marks(ctx, ns, v.slba, v.nlb)?;
    let stats = &ctx.shared.stats;
    if Cdw12ReadWrite::from(cmd.cdw12).fua() {
        // Check what is on non-volatile media, not what is cached.
        ns.backend
            .flush()
            .map_err(|e| stats.backend_error(BackendOp::Flush, ns.nsid, &e))?;
    }
    if ns.backend.moves_no_data() {
        return Ok(());
    }
    let mut buf = std::mem::take(&mut ctx.scratch.buf);
    buf.resize(v.len.min(CHUNK) as usize, 0);
    let mut r = Ok(());
    let mut offset = v.offset;
    let end = v.offset + v.len;
    while offset < end && r.is_ok() {
        let n = (end - offset).min(CHUNK) as usize;
        r = ns
            .backend
            .read(offset, &mut buf[..n])
            .map_err(|e| stats.backend_error(BackendOp::Read, ns.nsid, &e));
        offset += n as u64;
    }
    ctx.scratch.buf = buf;
    r
}

/// Write Zeroes (§3.2.8), or deallocation with DEAC: either way the
/// blocks read as zeroes afterwards, not as uncorrectable.
fn write_zeroes(ctx: &mut Ctx<'_>, cmd: &Command, ns: &Namespace) -> Result<(), Status> {
    let wz = WriteZeroes::parse(cmd, ns)?;
    let b = wz.extent;
    let (op, r) = if wz.deallocate {
        (BackendOp::Deallocate, ns.backend.discard(b.offset, b.len))
    } else {
        (
            BackendOp::WriteZeroes,
            ns.backend.write_zeroes(b.offset, b.len),
        )
    };
    // FUA, or a disabled volatile write cache: durable now.
    let r = r.and_then(|()| {
        if wz.fua || !ctx.shared.features.wce.load(Ordering::Relaxed) {
            ns.backend.flush()
        } else {
            Ok(())
        }
    });
    r.map_err(|e| ctx.shared.stats.backend_error(op, ns.nsid, &e))?;
    if ns.uncorrectable.clear(b.slba, b.nlb) {
        ctx.state_changed();
    }
    Ok(())
}

/// Dataset Management (§3.2.3): NR + 1 ranges of 16 bytes. Only the
/// Deallocate attribute does anything; the integral dataset attributes
/// are hints.
fn dataset_management(ctx: &mut Ctx<'_>, cmd: &Command, ns: &Namespace) -> Result<(), Status> {
    let nr = usize::from(Cdw10Dsm::from(cmd.cdw10).nr_z()) + 1;
    let deallocate = Cdw11Dsm::from(cmd.cdw11).ad();
    let len = nr * size_of::<DsmRange>();
    ctx.map_prps(cmd, len as u64)?;
    let mut buf = std::mem::take(&mut ctx.scratch.buf);
    buf.resize(len, 0);
    let r = prp::read_from_guest(&*ctx.session.mem, &ctx.scratch.segs, &mut buf);
    let ranges: Vec<DsmRange> = <[DsmRange]>::ref_from_bytes(&buf)
        .map(<[DsmRange]>::to_vec)
        .unwrap_or_default();
    ctx.scratch.buf = buf;
    r?;
    if !deallocate {
        return Ok(());
    }
    // Parse every range before deallocating any.
    let mut extents = Vec::with_capacity(ranges.len());
    for range in ranges.iter().filter(|r| r.nlb.get() != 0) {
        extents.push(Extent::new(
            ns,
            range.slba.get(),
            u64::from(range.nlb.get()),
        )?);
    }
    for e in extents {
        ns.backend.discard(e.offset, e.len).map_err(|err| {
            ctx.shared
                .stats
                .backend_error(BackendOp::Deallocate, ns.nsid, &err)
        })?;
        if ns.uncorrectable.clear(e.slba, e.nlb) {
            ctx.state_changed();
        }
    }
    Ok(())
}
