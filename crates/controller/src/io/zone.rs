//! The Zoned Namespace Command Set's I/O commands (ZNS 1.1 §3.4): Zone
//! Management Send, Zone Management Receive and Zone Append; and the zone
//! rules the NVM commands follow on a zoned namespace (§3.3): writes at
//! the write pointer, reads not from offline zones.
//!
//! The zones themselves are [`crate::zoned`]'s; this module parses the
//! commands and moves their data.

use std::sync::atomic::Ordering;

use vnvme_spec::zns::{
    zra, zrasf, zsa, Cdw13ZoneMgmtRecv, Cdw13ZoneMgmtSend, ReportZonesHeader, ZoneDescriptor,
};
use vnvme_spec::{Command, NvmOpcode, Status};
use zerocopy::IntoBytes;

use super::{gather, invalid_field, usable_namespace, write_done};
use crate::backend_error::BackendOp;
use crate::command::{Ctx, Outcome};
use crate::io_request::{Extent, ReadWrite};
use crate::namespace::Namespace;
use crate::zoned::{ZoneAction, Zones};

/// The Zoned Namespace Command Set's own opcodes: Invalid Command Opcode
/// on a namespace that is not zoned.
pub(crate) const OPCODES: &[NvmOpcode] = &[
    NvmOpcode::ZONE_MGMT_SEND,
    NvmOpcode::ZONE_MGMT_RECV,
    NvmOpcode::ZONE_APPEND,
];

/// Executes a Zoned Namespace Command Set command; `None` if `cmd` is
/// not one.
pub(super) fn execute(ctx: &mut Ctx<'_>, cmd: &Command) -> Option<Outcome> {
    let op = NvmOpcode(cmd.opcode());
    if !OPCODES.contains(&op) {
        return None;
    }
    let r = run(ctx, cmd, op);
    let owed = std::mem::take(&mut ctx.scratch.owed);
    Some(match r {
        // An append that cleared a mark asked for a checkpoint; its LBA
        // takes both dwords an owed completion does not keep.
        Ok(Some(lba)) => Outcome::Appended(lba),
        Ok(None) if owed => Outcome::Owed {
            dw0: 0,
            status: Status::SUCCESS,
        },
        Ok(None) => Outcome::ok(0),
        Err(status) if owed => Outcome::Owed { dw0: 0, status },
        Err(status) => Outcome::Done { dw0: 0, status },
    })
}

/// Runs zone command `op`: `Some(lba)` for a Zone Append, written there.
fn run(ctx: &mut Ctx<'_>, cmd: &Command, op: NvmOpcode) -> Result<Option<u64>, Status> {
    // As every I/O command: PSDT 01b or 10b for SGL data (10b: and a
    // metadata SGL, which Zone Append's gather takes), no fused commands.
    if cmd.fuse() != 0 || cmd.psdt() > 2 {
        return Err(invalid_field());
    }
    let ns = usable_namespace(ctx, cmd, op)?;
    let Some(zones) = ns.zones.clone() else {
        return Err(Status::INVALID_OPCODE.with_dnr(true));
    };
    match op {
        NvmOpcode::ZONE_MGMT_SEND => send(ctx, cmd, &ns, &zones).map(|()| None),
        NvmOpcode::ZONE_MGMT_RECV => receive(ctx, cmd, &zones).map(|()| None),
        _ => append(ctx, cmd, &ns, &zones).map(Some),
    }
}

/// The zone rules NVM command `op` follows on zoned `ns` before it runs
/// (§3.3): a write (Write, Write Zeroes, Write Uncorrectable) must start
/// at its zone's write pointer and stay within the zone's capacity, and
/// moves the write pointer now (a write that then fails leaves its blocks
/// undefined, as on a device); reads (Read, Compare, Verify) may cross
/// zones but not reach an offline one. Copy is not supported on a zoned
/// namespace; Dataset Management's deallocation, a hint, is not taken
/// (it would undo writes below a write pointer). `Ok(Admitted::Done)`:
/// the command is done; `Ok(Admitted::Write(slba, nlb))`: a write moved
/// the write pointer, and [`Zones::settled`] is told when it is done.
pub(super) fn admit(
    ctx: &Ctx<'_>,
    cmd: &Command,
    op: NvmOpcode,
    ns: &Namespace,
    zones: &Zones,
) -> Result<Admitted, Status> {
    match op {
        NvmOpcode::WRITE => {
            let rw = ReadWrite::parse(cmd, ns, ctx.shared.config.max_transfer())?;
            zones.write(rw.slba, rw.nlb)?;
            return Ok(Admitted::Write(rw.slba, rw.nlb));
        }
        NvmOpcode::WRITE_ZEROES | NvmOpcode::WRITE_UNCORRECTABLE => {
            let e = Extent::of(cmd, ns)?;
            zones.write(e.slba, e.nlb)?;
            return Ok(Admitted::Write(e.slba, e.nlb));
        }
        NvmOpcode::READ | NvmOpcode::COMPARE | NvmOpcode::VERIFY => {
            let e = Extent::of(cmd, ns)?;
            zones.check_read(e.slba, e.nlb)?;
        }
        NvmOpcode::DATASET_MANAGEMENT => return Ok(Admitted::Done),
        NvmOpcode::COPY => return Err(Status::INVALID_OPCODE.with_dnr(true)),
        _ => {}
    }
    Ok(Admitted::Run)
}

/// What [`admit`] let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admitted {
    /// Nothing more to do.
    Done,
    /// Run it; it moves no write pointer.
    Run,
    /// Run it: a write of `nlb` blocks at `slba`, which moved its zone's
    /// write pointer.
    Write(u64, u64),
}

/// Zone Management Send (§3.4.3): SLBA in CDW10-11, the action and
/// Select All in CDW13. A zone reset deallocates its blocks (the file
/// backend punches a hole), so they read as zeroes again.
fn send(ctx: &mut Ctx<'_>, cmd: &Command, ns: &Namespace, zones: &Zones) -> Result<(), Status> {
    let cdw13 = Cdw13ZoneMgmtSend::from(cmd.cdw13);
    if cdw13.zsa() == zsa::SET_ZONE_DESCRIPTOR_EXTENSION {
        return set_extension(ctx, cmd, cdw13, zones);
    }
    let action = ZoneAction::parse(cdw13.zsa())?;
    let stats = &ctx.shared.stats;
    let mut unmarked = false;
    let mut erase = |zslba: u64| {
        let e = Extent::new(ns, zslba, zones.zsze)?;
        ns.backend
            .discard(e.offset, e.len)
            .map_err(|err| stats.backend_error(BackendOp::Deallocate, ns.nsid, &err))?;
        unmarked |= ns.uncorrectable.clear(e.slba, e.nlb);
        Ok(())
    };
    let r = zones.send(action, cdw13.select_all(), cmd.slba(), &mut erase);
    if unmarked {
        ctx.state_changed();
    }
    r
}

/// Set Zone Descriptor Extension (§3.4.3.6): the data, ZDES × 64 bytes,
/// becomes the extension of the empty zone at SLBA, which is then closed.
/// Invalid Field without extensions (ZDES 0) and with Select All (the
/// action names one zone). Nothing changes if the transfer fails.
fn set_extension(
    ctx: &mut Ctx<'_>,
    cmd: &Command,
    cdw13: Cdw13ZoneMgmtSend,
    zones: &Zones,
) -> Result<(), Status> {
    let size = zones.extension_size();
    if size == 0 || cdw13.select_all() {
        return Err(invalid_field());
    }
    // A bad SLBA fails before anything is fetched; the zone's state is
    // checked (again) under the zone lock by set_extension.
    zones.zone_start(cmd.slba())?;
    let mut data = Vec::new();
    ctx.receive(cmd, size, &mut data)?;
    zones.set_extension(cmd.slba(), &data)?;
    // Saved state the zone's word does not hold.
    ctx.state_changed();
    Ok(())
}

/// Zone Management Receive (§3.4.2): Report Zones, or Extended Report
/// Zones (each descriptor followed by its ZDES × 64-byte extension;
/// Invalid Field without extensions), of the zones from the one holding
/// SLBA on, filtered by state, into NUMD + 1 dwords.
fn receive(ctx: &mut Ctx<'_>, cmd: &Command, zones: &Zones) -> Result<(), Status> {
    let cdw13 = Cdw13ZoneMgmtRecv::from(cmd.cdw13);
    let ext = match cdw13.zra() {
        zra::REPORT_ZONES => 0,
        zra::EXTENDED_REPORT_ZONES if zones.extension_size() > 0 => zones.extension_size(),
        _ => return Err(invalid_field()),
    };
    if cdw13.zrasf() > zrasf::OFFLINE {
        return Err(invalid_field());
    }
    let len = (u64::from(cmd.cdw12.get()) + 1) * 4;
    if len > ctx.shared.config.max_transfer() {
        return Err(invalid_field());
    }
    let header = size_of::<ReportZonesHeader>();
    let entry = size_of::<ZoneDescriptor>() + ext;
    let max = (len as usize).saturating_sub(header) / entry;
    let mut page = vec![0; header];
    let nr_zones = zones.report_with(
        cmd.slba(),
        cdw13.zrasf(),
        cdw13.partial(),
        max,
        |d, extension| {
            page.extend_from_slice(d.as_bytes());
            if ext > 0 {
                page.extend_from_slice(extension);
            }
        },
    )?;
    page[..header].copy_from_slice(ReportZonesHeader::new(nr_zones).as_bytes());
    // A buffer shorter than the header gets what fits of it.
    page.resize(len as usize, 0);
    ctx.send(cmd, &page)
}

/// Zone Append (§3.4.1): NLB blocks written at the write pointer of the
/// zone starting at SLBA; the LBA they went to is the completion's DW0
/// and DW1. The data is fetched before the write pointer moves, so a
/// transfer that fails leaves the zone as it was. It runs synchronously
/// (Linux issues appends for file systems only; fio writes).
fn append(ctx: &mut Ctx<'_>, cmd: &Command, ns: &Namespace, zones: &Zones) -> Result<u64, Status> {
    let rw = ReadWrite::parse(cmd, ns, ctx.shared.config.max_transfer())?;
    let mut buf = std::mem::take(&mut ctx.scratch.buf);
    buf.resize(rw.len as usize, 0);
    let r = gather(ctx, cmd, ns, &rw, &mut buf).and_then(|()| {
        let lba = zones.append(rw.slba, rw.nlb)?;
        let at = Extent::new(ns, lba, rw.nlb)?;
        if !ns.backend.moves_no_data() {
            write_at(ctx, ns, at.offset, &buf, rw.fua)?;
        }
        write_done(ctx, ns, &ReadWrite { slba: lba, ..rw });
        Ok(lba)
    });
    ctx.scratch.buf = buf;
    r
}

/// Writes `data` at `offset`, durable before the completion with FUA or
/// the volatile write cache off.
fn write_at(
    ctx: &Ctx<'_>,
    ns: &Namespace,
    offset: u64,
    data: &[u8],
    fua: bool,
) -> Result<(), Status> {
    let durable = fua || !ctx.shared.features.wce.load(Ordering::Relaxed);
    let r = if durable {
        ns.backend.write_fua(offset, data)
    } else {
        ns.backend.write(offset, data)
    };
    r.map_err(|e| {
        ctx.shared
            .stats
            .backend_error(BackendOp::Write, ns.nsid, &e)
    })
}
