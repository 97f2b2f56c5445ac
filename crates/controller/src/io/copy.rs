//! Copy (NVM Command Set 1.0 §3.2.2): the blocks of up to MSRC + 1 source
//! ranges of a namespace, in order, to one consecutive destination range
//! of the same namespace, within the limits Identify Namespace reports
//! (MSSRL per range, MCL in all).
//!
//! Every source is read before the destination is written, so a
//! destination that overlaps a source receives the source as it was
//! before the command. On failure nothing has been written, or the one
//! write failed, so completion dword 0 (the lowest source range entry not
//! copied) is 0.

use std::sync::atomic::Ordering;

use vnvme_spec::cdw::Cdw12Copy;
use vnvme_spec::range::CopyRangeF0;
use vnvme_spec::status::invalid_field;
use vnvme_spec::{Command, Status};
use zerocopy::FromBytes;

use super::check_marks;
use crate::backend_error::BackendOp;
use crate::command::Ctx;
use crate::io_request::Extent;
use crate::namespace::{Namespace, MCL, MSRC_Z, MSSRL};
use crate::prp;

fn size_limit_exceeded() -> Status {
    Status::COMMAND_SIZE_LIMIT_EXCEEDED.with_dnr(true)
}

/// A Copy checked against its namespace: nothing read or written yet.
#[derive(Debug)]
struct CopyRequest {
    sources: Vec<Extent>,
    destination: Extent,
    fua: bool,
}

impl CopyRequest {
    /// Reads the source range entries from the host and checks them:
    /// Invalid Field for a format other than 0h (the only one in OCFS),
    /// Command Size Limit Exceeded beyond MSRC, MSSRL or MCL, LBA Out of
    /// Range for a source or the destination past the end.
    fn parse(ctx: &mut Ctx<'_>, cmd: &Command, ns: &Namespace) -> Result<Self, Status> {
        let cdw12 = Cdw12Copy::from(cmd.cdw12);
        if cdw12.desfmt() != 0 {
            return Err(invalid_field());
        }
        if cdw12.nr_z() > MSRC_Z {
            return Err(size_limit_exceeded());
        }
        let nr = usize::from(cdw12.nr_z()) + 1;
        let len = nr * size_of::<CopyRangeF0>();
        ctx.map_prps(cmd, len as u64)?;
        let mut buf = std::mem::take(&mut ctx.scratch.buf);
        buf.resize(len, 0);
        let r = prp::read_from_guest(&*ctx.session.mem, &ctx.scratch.segs, &mut buf);
        let entries: Vec<(u64, u64)> = <[CopyRangeF0]>::ref_from_bytes(&buf)
            .map(|list| {
                list.iter()
                    .map(|e| (e.slba.get(), u64::from(e.nlb_z.get()) + 1))
                    .collect()
            })
            .unwrap_or_default();
        ctx.scratch.buf = buf;
        r?;
        // Limits first, as a host sizes its commands by them; then ranges.
        if entries.iter().any(|&(_, nlb)| nlb > u64::from(MSSRL)) {
            return Err(size_limit_exceeded());
        }
        // At most 256 ranges of 65536 blocks: no overflow.
        let total: u64 = entries.iter().map(|&(_, nlb)| nlb).sum();
        if total > u64::from(MCL) {
            return Err(size_limit_exceeded());
        }
        let sources = entries
            .iter()
            .map(|&(slba, nlb)| Extent::new(ns, slba, nlb))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            sources,
            destination: Extent::new(ns, cmd.slba(), total)?,
            fua: cdw12.fua(),
        })
    }
}

/// Copy: Unrecovered Read Error if a source block is marked by Write
/// Uncorrectable (nothing written); the destination's blocks are no
/// longer marked once written.
pub(super) fn copy(ctx: &mut Ctx<'_>, cmd: &Command, ns: &Namespace) -> Result<(), Status> {
    let copy = CopyRequest::parse(ctx, cmd, ns)?;
    for s in &copy.sources {
        check_marks(ctx, ns, s.slba, s.nlb)?;
    }
    let d = copy.destination;
    if !ns.backend.moves_no_data() {
        let stats = &ctx.shared.stats;
        let mut buf = std::mem::take(&mut ctx.scratch.buf2);
        buf.clear();
        let r = copy
            .sources
            .iter()
            .try_for_each(|s| {
                let at = buf.len();
                buf.resize(at + s.len as usize, 0);
                ns.backend.read(s.offset, &mut buf[at..])
            })
            .map_err(|e| stats.backend_error(BackendOp::Read, ns.nsid, &e))
            .and_then(|()| {
                // FUA, or a disabled volatile write cache: durable now.
                let w = if copy.fua || !ctx.shared.features.wce.load(Ordering::Relaxed) {
                    ns.backend.write_fua(d.offset, &buf)
                } else {
                    ns.backend.write(d.offset, &buf)
                };
                w.map_err(|e| stats.backend_error(BackendOp::Write, ns.nsid, &e))
            });
        ctx.scratch.buf2 = buf;
        r?;
    }
    if ns.uncorrectable.clear(d.slba, d.nlb) {
        ctx.state_changed();
    }
    Ok(())
}
