//! Firmware Image Download (§5.13) and Firmware Commit (§5.12): the
//! commands' fields and data; the slots they change are
//! [`crate::subsystem::firmware`].

use std::time::Instant;
use vnvme_spec::cdw::Cdw10FirmwareCommit;

use vnvme_spec::log::persistent_event::EventType;
use vnvme_spec::log::{async_event, LogPageId};
use vnvme_spec::{Command, Status};

use super::invalid_field;
use crate::command::Ctx;
use crate::reporting::persistent_event_log::firmware_commit;
use crate::subsystem::firmware::{Committed, Revision};

/// Firmware Image Download: CDW10 NUMD (dwords, 0's based), CDW11 OFST
/// (dwords). The piece is checked before its data moves.
pub(super) fn image_download(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<u32, Status> {
    let len = (u64::from(cmd.cdw10.get()) + 1) * 4;
    let offset = u64::from(cmd.cdw11.get()) * 4;
    if len > ctx.shared.config.max_transfer() {
        return Err(invalid_field());
    }
    let firmware = &ctx.shared.subsystem.firmware;
    firmware.lock().check_piece(offset, len)?;
    let mut data = Vec::new();
    ctx.receive(cmd, len as usize, &mut data)?;
    firmware.lock().download(offset, data)?;
    Ok(0)
}

/// Firmware Commit: CDW10 FS, CA (BPID only for the boot partition actions,
/// which this controller refuses).
pub(super) fn commit(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<u32, Status> {
    let cdw10 = Cdw10FirmwareCommit::from(cmd.cdw10);
    let (old, committed) = {
        let mut firmware = ctx.shared.subsystem.firmware.lock();
        (firmware.running(), firmware.commit(cdw10.fs(), cdw10.ca()))
    };
    let result = answer(ctx, committed.map(|(c, _)| c));
    let new = committed.map_or_else(|_| Revision::default(), |(_, r)| r);
    ctx.shared.reporting.persistent_events.record(
        EventType::FIRMWARE_COMMIT,
        Instant::now(),
        firmware_commit(old, new, cdw10.ca(), cdw10.fs(), result.err()),
    );
    result
}

/// The command's completion for what the commit did.
fn answer(ctx: &Ctx<'_>, committed: Result<Committed, Status>) -> Result<u32, Status> {
    match committed? {
        Committed::Placed => Ok(0),
        // §5.12.1: the commit succeeded; the status tells the host which
        // reset activates the image. Not an error, so no DNR.
        Committed::AtNextReset => Err(Status::FIRMWARE_ACTIVATION_REQUIRES_RESET),
        Committed::Activated => {
            // The switch is atomic here (no command runs half on either
            // image), so processing never pauses and CSTS.PP stays 0; the
            // notice still tells the host to reread the slot log and FR.
            ctx.shared.async_event(
                async_event::TYPE_NOTICE,
                async_event::NOTICE_FIRMWARE_ACTIVATION_STARTING,
                LogPageId::FIRMWARE_SLOT.0,
            );
            Ok(0)
        }
    }
}
