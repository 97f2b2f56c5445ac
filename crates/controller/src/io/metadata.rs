//! Separate metadata moved between the host and a Read, Write or Compare:
//! the contiguous buffer at MPTR (PSDT 00b and 01b), or the buffer a
//! metadata SGL describes (PSDT 10b: MPTR holds the address of its one
//! descriptor, [`crate::sgl::map_metadata`]).

use vnvme_spec::sgl::psdt;
use vnvme_spec::status::invalid_field;
use vnvme_spec::{Command, Status};

use crate::command::Ctx;
use crate::memory::{DmaError, GuestAddress};
use crate::prp;
use crate::sgl::{self, Direction};

/// A metadata buffer the host's memory cannot back: the guest's doing, so
/// traced, not logged (its count is in the completion statuses).
fn transfer_error(e: DmaError) -> Status {
    tracing::trace!("metadata buffer: {e}");
    Status::DATA_TRANSFER_ERROR.with_dnr(true)
}

/// Maps `cmd`'s metadata SGL for `len` bytes into the scratch list.
fn map(ctx: &mut Ctx<'_>, cmd: &Command, len: usize, dir: Direction) -> Result<(), Status> {
    let out = &mut ctx.scratch.meta_segs;
    sgl::map_metadata(
        &*ctx.session.mem,
        GuestAddress(cmd.mptr.get()),
        len as u64,
        dir,
        out,
    )
}

/// Checks `cmd`'s metadata SGL (PSDT 10b) for `len` bytes to the host
/// before a read starts on the backend: a command that cannot complete
/// puts no I/O in flight. Nothing to check for a contiguous buffer.
pub(super) fn check_read(ctx: &mut Ctx<'_>, cmd: &Command, len: u64) -> Result<(), Status> {
    if cmd.psdt() != psdt::SGL_MPTR_SGL || len == 0 {
        return Ok(());
    }
    // Past usize is the conversion's only failure; the status is the answer.
    let len = usize::try_from(len).map_err(|_| invalid_field())?;
    map(ctx, cmd, len, Direction::ToHost)
}

/// Copies the host's metadata of `cmd` into `meta` (all of it).
pub(super) fn read(ctx: &mut Ctx<'_>, cmd: &Command, meta: &mut [u8]) -> Result<(), Status> {
    if meta.is_empty() {
        return Ok(());
    }
    if cmd.psdt() != psdt::SGL_MPTR_SGL {
        return ctx
            .session
            .mem
            .read(GuestAddress(cmd.mptr.get()), meta)
            .map_err(transfer_error);
    }
    map(ctx, cmd, meta.len(), Direction::FromHost)?;
    prp::read_from_guest(&*ctx.session.mem, &ctx.scratch.meta_segs, meta)
}

/// Copies `meta` to the host's metadata buffer of `cmd` (none when PRACT
/// stripped it).
pub(super) fn write(ctx: &mut Ctx<'_>, cmd: &Command, meta: &[u8]) -> Result<(), Status> {
    if meta.is_empty() {
        return Ok(());
    }
    if cmd.psdt() != psdt::SGL_MPTR_SGL {
        return ctx
            .session
            .mem
            .write(GuestAddress(cmd.mptr.get()), meta)
            .map_err(transfer_error);
    }
    map(ctx, cmd, meta.len(), Direction::ToHost)?;
    prp::write_to_guest(&*ctx.session.mem, &ctx.scratch.meta_segs, meta)
}
