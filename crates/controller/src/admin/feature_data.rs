//! Features whose value travels in the data buffer (§5.27.1): Timestamp
//! (0Eh), Host Behavior Support (16h) and Host Identifier (81h). Get
//! Features writes the value to the command's PRPs; Set Features reads it
//! from them.

use std::time::Instant;

use vnvme_spec::feature::{FeatureId, HostBehaviorSupport, HostIdentifier, Timestamp};
use vnvme_spec::{Command, Status};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use super::invalid_field;
use crate::command::Ctx;
use crate::features::AdminState;
use crate::lifecycle::timestamp::TimestampClock;

const TIMESTAMP_SIZE: usize = 8;

/// Sends `fid`'s value from `admin`: the `current` values, or the
/// defaults.
pub(super) fn get(
    ctx: &mut Ctx<'_>,
    cmd: &Command,
    fid: FeatureId,
    admin: &AdminState,
    current: bool,
) -> Result<(), Status> {
    match fid {
        FeatureId::TIMESTAMP => {
            let now = Instant::now();
            // The default: as a Controller Level Reset leaves it.
            let clock = match current {
                true => ctx.shared.lifecycle.timestamp(),
                false => TimestampClock::reset(now),
            };
            ctx.send(cmd, &u64::from(clock.read(now)).to_le_bytes())
        }
        FeatureId::HOST_BEHAVIOR_SUPPORT => ctx.send(cmd, admin.host_behavior.as_bytes()),
        FeatureId::HOST_IDENTIFIER => {
            // CDW11.EXHID chooses the 64- or 128-bit form here too: hosts
            // size their buffer by it (nvme-cli does).
            let len = HostIdentifier::from(cmd.cdw11).data_len();
            ctx.send(cmd, admin.host_id.get(..len).unwrap_or_default())
        }
        _ => Err(invalid_field()),
    }
}

/// Reads `fid`'s new value from the host and keeps it.
pub(super) fn set(ctx: &mut Ctx<'_>, cmd: &Command, fid: FeatureId) -> Result<(), Status> {
    let mut buf = std::mem::take(&mut ctx.scratch.buf);
    let r = set_from(ctx, cmd, fid, &mut buf);
    ctx.scratch.buf = buf;
    r
}

fn set_from(
    ctx: &mut Ctx<'_>,
    cmd: &Command,
    fid: FeatureId,
    buf: &mut Vec<u8>,
) -> Result<(), Status> {
    let shared = ctx.shared;
    match fid {
        FeatureId::TIMESTAMP => {
            ctx.receive(cmd, TIMESTAMP_SIZE, buf)?;
            // `receive` took exactly TIMESTAMP_SIZE bytes: no size mismatch is left.
            let raw = u64::read_from_bytes(buf).map_err(|_| invalid_field())?;
            // Bytes 7:6 are reserved in the value the host sets.
            let tstmp = Timestamp::from(raw).tstmp();
            shared
                .lifecycle
                .set_timestamp(TimestampClock::set(tstmp, Instant::now()));
        }
        FeatureId::HOST_BEHAVIOR_SUPPORT => {
            ctx.receive(cmd, size_of::<HostBehaviorSupport>(), buf)?;
            // `receive` took exactly its size: no size mismatch is left.
            let hbs = HostBehaviorSupport::read_from_bytes(buf).map_err(|_| invalid_field())?;
            // Each field is 0h or 1h, other values reserved; the reserved
            // bytes after them are not kept.
            if [hbs.acre, hbs.etdas, hbs.lbafee].iter().any(|&v| v > 1) {
                return Err(invalid_field());
            }
            let mut kept = HostBehaviorSupport::new_zeroed();
            kept.acre = hbs.acre;
            kept.etdas = hbs.etdas;
            kept.lbafee = hbs.lbafee;
            shared.features.admin.lock().host_behavior = kept;
        }
        FeatureId::HOST_IDENTIFIER => {
            // Once non-zero, the Host Identifier changes only after a
            // Controller Level Reset returns it to 0h (2.1 §5.2.26.1.32). Admin
            // commands run one at a time: nothing sets it meanwhile.
            if shared.features.admin.lock().host_id != [0; 16] {
                return Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr(true));
            }
            let len = HostIdentifier::from(cmd.cdw11).data_len();
            ctx.receive(cmd, len, buf)?;
            let mut id = [0u8; 16];
            for (to, from) in id.iter_mut().zip(buf.iter()) {
                *to = *from;
            }
            let mut admin = shared.features.admin.lock();
            admin.host_id = id;
            admin.host_id_extended = len == 16;
        }
        _ => return Err(invalid_field()),
    }
    Ok(())
}
