//! NVM command set I/O commands (NVM Command Set Spec 1.0 §3): parsed into
//! typed requests, then executed against the namespace's backend.

use std::sync::atomic::Ordering;

use vnvme_spec::{Command, NvmOpcode, Status};

use crate::namespace::Namespace;
use crate::prp;
use crate::state::{Ctx, Outcome};

/// Broadcast NSID: Flush applies to every namespace.
const NSID_ALL: u32 = 0xFFFF_FFFF;

fn invalid_field() -> Status {
    Status::INVALID_FIELD.with_dnr(true)
}

/// Opcodes this controller implements (Commands Supported and Effects, ONCS).
pub(crate) const SUPPORTED: &[NvmOpcode] = &[
    NvmOpcode::FLUSH,
    NvmOpcode::WRITE,
    NvmOpcode::READ,
    NvmOpcode::COMPARE,
    NvmOpcode::WRITE_ZEROES,
    NvmOpcode::DATASET_MANAGEMENT,
];

/// Read, Write and Compare (§3.2.4, §3.2.6, §3.2.1): SLBA in CDW10-11,
/// NLB (0's based) in CDW12 15:0, FUA in CDW12 bit 30.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadWrite {
    pub offset: u64,
    pub len: u64,
    pub fua: bool,
}

impl ReadWrite {
    pub fn parse(cmd: &Command, ns: &Namespace, max_transfer: u64) -> Result<Self, Status> {
        let slba = u64::from(cmd.cdw10.get()) | (u64::from(cmd.cdw11.get()) << 32);
        let nlb = u64::from(cmd.cdw12.get() & 0xFFFF) + 1;
        if nlb << ns.lba_shift > max_transfer {
            return Err(invalid_field());
        }
        let (offset, len) = ns.byte_range(slba, nlb)?;
        Ok(Self {
            offset,
            len,
            fua: cmd.cdw12.get() & (1 << 30) != 0,
        })
    }
}

/// Write Zeroes (§3.2.7): SLBA, NLB, DEAC (CDW12 bit 25).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WriteZeroes {
    pub offset: u64,
    pub len: u64,
    pub deallocate: bool,
}

impl WriteZeroes {
    pub fn parse(cmd: &Command, ns: &Namespace) -> Result<Self, Status> {
        let slba = u64::from(cmd.cdw10.get()) | (u64::from(cmd.cdw11.get()) << 32);
        let nlb = u64::from(cmd.cdw12.get() & 0xFFFF) + 1;
        let (offset, len) = ns.byte_range(slba, nlb)?;
        Ok(Self {
            offset,
            len,
            deallocate: cmd.cdw12.get() & (1 << 25) != 0,
        })
    }
}

/// Executes an I/O command; every failure is an NVMe status.
pub(crate) fn execute(ctx: &mut Ctx<'_>, cmd: &Command) -> Outcome {
    if NvmOpcode(cmd.opcode()).is_vendor_specific() {
        let set = crate::vendor::CommandSet::Io;
        return Outcome::from_result(crate::vendor::execute(ctx, set, cmd));
    }
    Outcome::from_result(run(ctx, cmd).map(|()| 0))
}

fn run(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<(), Status> {
    let op = NvmOpcode(cmd.opcode());
    if !SUPPORTED.contains(&op) {
        return Err(Status::INVALID_OPCODE.with_dnr(true));
    }
    if cmd.fuse() != 0 || cmd.psdt() != 0 {
        return Err(invalid_field());
    }
    let nsid = cmd.nsid.get();
    if op == NvmOpcode::FLUSH && nsid == NSID_ALL {
        for ns in ctx.shared.namespaces.values() {
            ns.backend.flush().map_err(|_| internal())?;
        }
        return Ok(());
    }
    let ns = ctx.shared.namespace(nsid)?.clone();
    match op {
        NvmOpcode::READ => read(ctx, cmd, &ns),
        NvmOpcode::WRITE => write(ctx, cmd, &ns),
        NvmOpcode::COMPARE => compare(ctx, cmd, &ns),
        NvmOpcode::FLUSH => ns.backend.flush().map_err(|_| internal()),
        NvmOpcode::WRITE_ZEROES => {
            let wz = WriteZeroes::parse(cmd, &ns)?;
            let r = if wz.deallocate {
                ns.backend.discard(wz.offset, wz.len)
            } else {
                ns.backend.write_zeroes(wz.offset, wz.len)
            };
            r.map_err(|_| write_fault(ctx))
        }
        NvmOpcode::DATASET_MANAGEMENT => dataset_management(ctx, cmd, &ns),
        _ => Err(Status::INVALID_OPCODE.with_dnr(true)),
    }
}

fn internal() -> Status {
    Status::INTERNAL_ERROR.with_dnr(true)
}

fn write_fault(ctx: &Ctx<'_>) -> Status {
    ctx.shared
        .stats
        .media_errors
        .fetch_add(1, Ordering::Relaxed);
    Status::WRITE_FAULT.with_dnr(true)
}

fn read_error(ctx: &Ctx<'_>) -> Status {
    ctx.shared
        .stats
        .media_errors
        .fetch_add(1, Ordering::Relaxed);
    Status::UNRECOVERED_READ_ERROR.with_dnr(true)
}

/// Maps the command's PRPs for `len` bytes into the scratch segment list.
fn map_prps(ctx: &mut Ctx<'_>, cmd: &Command, len: u64) -> Result<(), Status> {
    prp::map(
        &*ctx.session.mem,
        cmd.prp1.get(),
        cmd.prp2.get(),
        len,
        ctx.session.page_size,
        &mut ctx.scratch.segs,
    )
}

fn read(ctx: &mut Ctx<'_>, cmd: &Command, ns: &Namespace) -> Result<(), Status> {
    let rw = ReadWrite::parse(cmd, ns, ctx.shared.config.max_transfer())?;
    map_prps(ctx, cmd, rw.len)?;
    let mut buf = std::mem::take(&mut ctx.scratch.buf);
    buf.resize(rw.len as usize, 0);
    let r = match ns.backend.read(rw.offset, &mut buf) {
        Ok(()) => prp::write_to_guest(&*ctx.session.mem, &ctx.scratch.segs, &buf),
        Err(_) => Err(read_error(ctx)),
    };
    ctx.scratch.buf = buf;
    let stats = &ctx.shared.stats;
    stats.host_read_commands.fetch_add(1, Ordering::Relaxed);
    stats
        .data_units_read_512
        .fetch_add(rw.len >> 9, Ordering::Relaxed);
    r
}

fn write(ctx: &mut Ctx<'_>, cmd: &Command, ns: &Namespace) -> Result<(), Status> {
    let rw = ReadWrite::parse(cmd, ns, ctx.shared.config.max_transfer())?;
    map_prps(ctx, cmd, rw.len)?;
    let mut buf = std::mem::take(&mut ctx.scratch.buf);
    buf.resize(rw.len as usize, 0);
    let mut r = prp::read_from_guest(&*ctx.session.mem, &ctx.scratch.segs, &mut buf);
    if r.is_ok() {
        r = ns
            .backend
            .write(rw.offset, &buf)
            .map_err(|_| write_fault(ctx));
    }
    ctx.scratch.buf = buf;
    r?;
    // FUA, or a disabled volatile write cache, makes the write durable now.
    let write_through = rw.fua || !ctx.shared.wce.load(Ordering::Relaxed);
    if write_through && ns.backend.volatile_cache() {
        ns.backend.flush().map_err(|_| write_fault(ctx))?;
    }
    let stats = &ctx.shared.stats;
    stats.host_write_commands.fetch_add(1, Ordering::Relaxed);
    stats
        .data_units_written_512
        .fetch_add(rw.len >> 9, Ordering::Relaxed);
    Ok(())
}

fn compare(ctx: &mut Ctx<'_>, cmd: &Command, ns: &Namespace) -> Result<(), Status> {
    let rw = ReadWrite::parse(cmd, ns, ctx.shared.config.max_transfer())?;
    map_prps(ctx, cmd, rw.len)?;
    let mut host = std::mem::take(&mut ctx.scratch.buf);
    let mut media = std::mem::take(&mut ctx.scratch.buf2);
    host.resize(rw.len as usize, 0);
    media.resize(rw.len as usize, 0);
    let r = prp::read_from_guest(&*ctx.session.mem, &ctx.scratch.segs, &mut host).and_then(|()| {
        ns.backend
            .read(rw.offset, &mut media)
            .map_err(|_| read_error(ctx))?;
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

/// One Dataset Management range (§3.2.3, Figure 38): 16 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DsmRange {
    nlb: u32,
    slba: u64,
}

fn dataset_management(ctx: &mut Ctx<'_>, cmd: &Command, ns: &Namespace) -> Result<(), Status> {
    let nr = (cmd.cdw10.get() & 0xFF) as usize + 1;
    let deallocate = cmd.cdw11.get() & (1 << 2) != 0;
    let len = (nr * 16) as u64;
    map_prps(ctx, cmd, len)?;
    let mut buf = std::mem::take(&mut ctx.scratch.buf);
    buf.resize(nr * 16, 0);
    let r = prp::read_from_guest(&*ctx.session.mem, &ctx.scratch.segs, &mut buf);
    let ranges: Vec<DsmRange> = buf
        .chunks_exact(16)
        .map(|c| {
            let mut nlb = [0u8; 4];
            let mut slba = [0u8; 8];
            nlb.copy_from_slice(c.get(4..8).unwrap_or(&[0; 4]));
            slba.copy_from_slice(c.get(8..16).unwrap_or(&[0; 8]));
            DsmRange {
                nlb: u32::from_le_bytes(nlb),
                slba: u64::from_le_bytes(slba),
            }
        })
        .collect();
    ctx.scratch.buf = buf;
    r?;
    if !deallocate {
        // Integral read/write hints only: advisory, nothing to do.
        return Ok(());
    }
    // Parse every range before deallocating any.
    let mut extents = Vec::with_capacity(ranges.len());
    for range in &ranges {
        if range.nlb == 0 {
            continue;
        }
        extents.push(ns.byte_range(range.slba, u64::from(range.nlb))?);
    }
    for (offset, len) in extents {
        ns.backend
            .discard(offset, len)
            .map_err(|_| write_fault(ctx))?;
    }
    Ok(())
}
