//! The reservation commands (NVMe Base 2.0 §7.3–§7.6): Reservation
//! Register (0Dh), Report (0Eh), Acquire (11h) and Release (15h). Each
//! parses its dwords and data, then applies one change of the namespace's
//! [`State`](crate::namespace::reservation::State) for the host that sent it.

use vnvme_spec::reservation::{
    cptpl, notification, racqa, rrega, rrela, Cdw10ResvAcquire, Cdw10ResvRegister,
    Cdw10ResvRelease, Cdw11ResvReport, RegisteredController, RegisteredControllerExt,
    ReservationStatus, ReservationType, ResvAcquireData, ResvRegisterData, ResvReleaseData,
    EXTENDED_HEADER_SIZE,
};
use vnvme_spec::{Command, NvmOpcode, Status};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use super::invalid_field;
use crate::command::Ctx;
use crate::namespace::reservation::{Fence, Host, Notice, State};
use crate::namespace::Namespace;

/// Runs `cmd` if `op` is a reservation command; `None` otherwise. A
/// Preempt and Abort gives the fence its completion waits for, if any.
pub(super) fn command(
    ctx: &mut Ctx<'_>,
    cmd: &Command,
    ns: &Namespace,
    op: NvmOpcode,
) -> Option<Result<Option<Fence>, Status>> {
    Some(match op {
        NvmOpcode::RESERVATION_REGISTER => register(ctx, cmd, ns).map(|()| None),
        NvmOpcode::RESERVATION_REPORT => report(ctx, cmd, ns).map(|()| None),
        NvmOpcode::RESERVATION_ACQUIRE => acquire(ctx, cmd, ns),
        NvmOpcode::RESERVATION_RELEASE => release(ctx, cmd, ns).map(|()| None),
        _ => return None,
    })
}

/// The host `cmd` comes from: this controller's Host Identifier now.
fn host(ctx: &Ctx<'_>) -> Host {
    let admin = ctx.shared.features.admin.lock();
    Host {
        id: admin.host_id,
        extended: admin.host_id_extended,
    }
}

/// Reads the command's data structure `T` from the host.
fn data<T: FromBytes>(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<T, Status> {
    let mut buf = std::mem::take(&mut ctx.scratch.buf);
    let r = ctx
        .receive(cmd, size_of::<T>(), &mut buf)
        // `receive` took exactly size_of::<T>() bytes: no size mismatch is left.
        .and_then(|()| T::read_from_bytes(&buf).map_err(|_| invalid_field()));
    ctx.scratch.buf = buf;
    r
}

/// Reservation Register: RREGA, IEKEY, CPTPL; CRKEY and NRKEY in the data.
fn register(ctx: &mut Ctx<'_>, cmd: &Command, ns: &Namespace) -> Result<(), Status> {
    let cdw10 = Cdw10ResvRegister::from(cmd.cdw10);
    let ptpl = match cdw10.cptpl() {
        cptpl::NO_CHANGE => None,
        cptpl::CLEAR => Some(false),
        cptpl::SET => Some(true),
        _ => return Err(invalid_field()),
    };
    if cdw10.rrega() > rrega::REPLACE {
        return Err(invalid_field());
    }
    let d: ResvRegisterData = data(ctx, cmd)?;
    let (crkey, nrkey) = (d.crkey.get(), d.nrkey.get());
    let host = host(ctx);
    let iekey = cdw10.iekey();
    let notices = ns.reservations.update(|s| {
        let notices = match cdw10.rrega() {
            rrega::REGISTER => s.register(host, nrkey).map(|()| Vec::new())?,
            rrega::UNREGISTER => s.unregister(&host.id, crkey, iekey)?,
            _ => s
                .replace(&host.id, crkey, nrkey, iekey)
                .map(|()| Vec::new())?,
        };
        if let Some(ptpl) = ptpl {
            s.ptpl = ptpl;
        }
        Ok(notices)
    })?;
    notify(ctx, ns, &notices);
    Ok(())
}

/// Tells the hosts concerned what a reservation command did to them
/// (Reservation Notification log page), once the change is made.
fn notify(ctx: &Ctx<'_>, ns: &Namespace, notices: &[Notice]) {
    let namespaces = &ctx.shared.subsystem.namespaces;
    namespaces.notify_reservation(ns.nsid, notices);
}

/// Reservation Acquire: RACQA, IEKEY, RTYPE; CRKEY and PRKEY in the data.
/// Preempt and Abort preempts as Preempt does, and the preempted hosts'
/// commands in flight on the namespace, through any controller, complete
/// as aborted ([`Reservations::aborted`]). Its own completion waits for
/// every command admitted on the namespace before it ([`Fence`]): once it
/// completes, no write of a preempted host can still reach the medium.
///
/// [`Reservations::aborted`]: crate::namespace::reservation::Reservations::aborted
fn acquire(ctx: &mut Ctx<'_>, cmd: &Command, ns: &Namespace) -> Result<Option<Fence>, Status> {
    let cdw10 = Cdw10ResvAcquire::from(cmd.cdw10);
    let rtype = ReservationType(cdw10.rtype());
    if !rtype.is_valid() || cdw10.racqa() > racqa::PREEMPT_AND_ABORT {
        return Err(invalid_field());
    }
    let d: ResvAcquireData = data(ctx, cmd)?;
    let (crkey, prkey) = (d.crkey.get(), d.prkey.get());
    let host = host(ctx).id;
    let iekey = cdw10.iekey();
    let abort = cdw10.racqa() == racqa::PREEMPT_AND_ABORT;
    // A preempt that changes the type held tells the registrants left but
    // the issuer: Reservation Released (Base 2.1 §8.1.24.7).
    let (preempted, released) = ns.reservations.update(|s| match cdw10.racqa() {
        racqa::ACQUIRE => s
            .acquire(&host, crkey, iekey, rtype)
            .map(|()| (Vec::new(), Vec::new())),
        _ => {
            let before = s.held.map(|h| h.rtype);
            let removed = s.preempt(&host, crkey, prkey, iekey, rtype, abort)?;
            let changed = before.is_some_and(|t| t != rtype);
            let released = if changed {
                s.others(&host, notification::RESERVATION_RELEASED)
            } else {
                Vec::new()
            };
            Ok((removed, released))
        }
    })?;
    let fence = if abort && !preempted.is_empty() {
        ns.reservations.fence()
    } else {
        None
    };
    let notices: Vec<Notice> = (preempted.into_iter())
        .map(|h| (h, notification::REGISTRATION_PREEMPTED))
        .chain(released)
        .collect();
    notify(ctx, ns, &notices);
    Ok(fence)
}

/// Reservation Release: RRELA, IEKEY, RTYPE; CRKEY in the data.
fn release(ctx: &mut Ctx<'_>, cmd: &Command, ns: &Namespace) -> Result<(), Status> {
    let cdw10 = Cdw10ResvRelease::from(cmd.cdw10);
    if cdw10.rrela() > rrela::CLEAR {
        return Err(invalid_field());
    }
    let d: ResvReleaseData = data(ctx, cmd)?;
    let crkey = d.crkey.get();
    let host = host(ctx).id;
    let iekey = cdw10.iekey();
    let rtype = ReservationType(cdw10.rtype());
    let notices = ns.reservations.update(|s| match cdw10.rrela() {
        rrela::RELEASE => s.release(&host, crkey, iekey, rtype),
        _ => s.clear(&host, crkey, iekey),
    })?;
    notify(ctx, ns, &notices);
    Ok(())
}

/// Reservation Report: NUMD (CDW10, 0's based dwords), EDS (CDW11 bit 0).
/// The Reservation Status data structure, cut to NUMD.
fn report(ctx: &mut Ctx<'_>, cmd: &Command, ns: &Namespace) -> Result<(), Status> {
    // NUMD dwords go to the host, the structure cut or zero-padded to them:
    // a host that describes its buffer with an SGL (Linux does for a buffer
    // in one huge page) expects exactly that length.
    let len = (u64::from(cmd.cdw10.get()) + 1) * 4;
    if len > ctx.shared.config.max_transfer() {
        return Err(invalid_field());
    }
    let eds = Cdw11ResvReport::from(cmd.cdw11).eds();
    let state = ns.reservations.snapshot();
    if !eds && state.registrants.iter().any(|r| r.host.extended) {
        return Err(Status::HOST_ID_INCONSISTENT_FORMAT.with_dnr(true));
    }
    let controllers = ctx.shared.subsystem.namespaces.host_ids();
    let mut page = report_page(&state, eds, &controllers);
    // At most MDTS: fits.
    page.resize(len as usize, 0);
    ctx.send(cmd, &page)
}

/// The whole Reservation Status data structure of `state`: a Registered
/// Controller entry for each live controller (`controllers`, CNTLID and
/// Host Identifier) of each registered host, or one with CNTLID FFFFh for
/// a registered host that has no controller now (§7.4, Figure 408).
fn report_page(state: &State, eds: bool, controllers: &[(u16, [u8; 16])]) -> Vec<u8> {
    let mut entries = Vec::new();
    for r in &state.registrants {
        let before = entries.len();
        for (cntlid, _) in controllers.iter().filter(|(_, id)| *id == r.host.id) {
            entries.push((*cntlid, r));
        }
        if entries.len() == before {
            entries.push((0xFFFF, r));
        }
    }
    let mut header = ReservationStatus::new_zeroed();
    header.gen = U32::new(state.generation);
    header.rtype = state.held.map_or(0, |h| h.rtype.0);
    // At most MAX_REGISTRANTS times the subsystem's controllers, which
    // the command line bounds far below 65535.
    header.regctl = U16::new(u16::try_from(entries.len()).unwrap_or(u16::MAX));
    header.ptpls = u8::from(state.ptpl);
    let mut page = header.as_bytes().to_vec();
    if eds {
        page.resize(EXTENDED_HEADER_SIZE, 0);
    }
    for (cntlid, r) in entries {
        let cntlid = U16::new(cntlid);
        let rcsts = u8::from(state.holds(&r.host.id));
        let rkey = U64::new(r.key);
        if eds {
            let mut e = RegisteredControllerExt::new_zeroed();
            (e.cntlid, e.rcsts, e.rkey, e.hostid) = (cntlid, rcsts, rkey, r.host.id);
            page.extend_from_slice(e.as_bytes());
        } else {
            let mut e = RegisteredController::new_zeroed();
            (e.cntlid, e.rcsts, e.rkey) = (cntlid, rcsts, rkey);
            e.hostid.copy_from_slice(&r.host.id[..8]);
            page.extend_from_slice(e.as_bytes());
        }
    }
    page
}
