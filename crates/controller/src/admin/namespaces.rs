//! Namespace Management (§5.22), Namespace Attachment (§5.23) and Format
//! NVM (NVM Command Set §4.2). Namespaces created here are RAM backed and
//! allocated from TNVMCAP; this controller (CNTLID from the configuration)
//! is the only one in the subsystem.

use std::sync::Arc;
use std::time::Instant;

use vnvme_spec::cdw::{Cdw10FormatNvm, Cdw10NsAttachment, Cdw10NsManagement, Cdw11NsManagement};
use vnvme_spec::log::persistent_event::EventType;
use vnvme_spec::log::self_test::result::{ABORTED_FORMAT, ABORTED_NS_REMOVED};
use vnvme_spec::{Command, Status};

use super::invalid_field;
use crate::command::Ctx;
use crate::config::{LbaFormatSpec, NamespaceIds, LBA_FORMATS, MAX_NAMESPACES};
use crate::namespace::{Namespace, NSID_ALL};
use crate::protection::{PiType, Protection};
use crate::reporting::persistent_event_log::{change_namespace, format_completion, format_start};
use crate::reporting::Reporting;
use crate::state::Shared;
use crate::stats::Stats;
use crate::subsystem::{Namespaces, Subsystem};

fn invalid_ns() -> Status {
    Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true)
}

fn invalid_format() -> Status {
    Status::INVALID_FORMAT.with_dnr(true)
}

/// The host-specified fields of a create (Identify Namespace layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Create {
    nsze: u64,
    ncap: u64,
    format_index: u8,
    extended: bool,
}

impl Create {
    /// Bytes 7:0 NSZE, 15:8 NCAP, 26 FLBAS, 29 DPS, 30 NMIC.
    fn parse(data: &[u8]) -> Result<Self, Status> {
        let u64_at = |at: usize| -> u64 {
            let mut b = [0u8; 8];
            if let Some(s) = data.get(at..at + 8) {
                b.copy_from_slice(s);
            }
            u64::from_le_bytes(b)
        };
        let byte = |at: usize| data.get(at).copied().unwrap_or(0);
        let (nsze, ncap, flbas) = (u64_at(0), u64_at(8), byte(26));
        let format_index = (flbas & 0xF) | ((flbas >> 1) & 0x30);
        if usize::from(format_index) >= LBA_FORMATS.len() {
            return Err(invalid_format());
        }
        // No end-to-end protection. NMIC (byte 30) bit 0 may ask for a
        // shared namespace: every namespace here may be attached to
        // several controllers.
        if byte(29) & 0x7 != 0 {
            return Err(invalid_field());
        }
        // Thin provisioning is not supported: NCAP must equal NSZE.
        if nsze == 0 || ncap != nsze {
            return Err(invalid_field());
        }
        Ok(Self {
            nsze,
            ncap,
            format_index,
            extended: flbas & 0x10 != 0,
        })
    }
}

/// Namespace Management: SEL (CDW10 3:0) 0 create, 1 delete; CSI (CDW11
/// 31:24) must be the NVM command set. Create returns the new NSID in
/// completion dword 0.
pub(super) fn namespace_management(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<u32, Status> {
    match Cdw10NsManagement::from(cmd.cdw10).sel() {
        0 => create(ctx, cmd),
        1 => delete(ctx.shared, cmd).map(|()| 0),
        _ => Err(invalid_field()),
    }
}

fn create(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<u32, Status> {
    if cmd.nsid.get() != 0 || Cdw11NsManagement::from(cmd.cdw11).csi() != 0 {
        return Err(invalid_field());
    }
    let mut data = std::mem::take(&mut ctx.scratch.buf);
    let r = ctx.receive(cmd, 4096, &mut data);
    let req = r.and_then(|()| Create::parse(&data));
    ctx.scratch.buf = data;
    let req = req?;
    let format = LBA_FORMATS
        .get(usize::from(req.format_index))
        .ok_or_else(invalid_format)?;
    let stride = u64::from(format.data_size) + u64::from(format.metadata_size);
    let shared = ctx.shared;
    shared.subsystem.namespaces.update(|map| {
        let free = shared
            .subsystem
            .tnvmcap
            .saturating_sub(Namespaces::allocated_bytes(map));
        let bytes = req
            .ncap
            .checked_mul(stride)
            .filter(|&b| b <= free)
            .ok_or(Status::NAMESPACE_INSUFFICIENT_CAPACITY.with_dnr(true))?;
        // The lowest free NSID up to NN (found within len + 1 steps); the
        // table never outgrows an Identify list.
        let nsid = (1..=shared.subsystem.nn)
            .find(|id| !map.contains_key(id))
            .filter(|_| map.len() < MAX_NAMESPACES as usize)
            .ok_or(Status::NAMESPACE_ID_UNAVAILABLE.with_dnr(true))?;
        let backend = match vnvme_blockdev::RamDevice::create(bytes) {
            Ok(dev) => Arc::new(dev),
            Err(e) => {
                tracing::error!(nsid, bytes, "creating a namespace: {e}");
                return Err(Status::NAMESPACE_INSUFFICIENT_CAPACITY.with_dnr(true));
            }
        };
        let ns = Namespace::with_format(
            nsid,
            NamespaceIds::fresh(&shared.config.serial, nsid),
            backend,
            req.format_index,
            req.extended,
            None,
        )
        .ok_or(Status::NAMESPACE_INSUFFICIENT_CAPACITY.with_dnr(true))?;
        // Allocated, not attached (§8.3.2): the host attaches it next.
        record_change(&shared.reporting, cmd.cdw10.get(), &ns);
        map.insert(nsid, Arc::new(ns));
        tracing::debug!(nsid, bytes, "namespace created");
        Ok(nsid)
    })
}

/// A Change Namespace event for a Namespace Management with `cdw10` on `ns`.
pub(crate) fn record_change(reporting: &Reporting, cdw10: u32, ns: &Namespace) {
    let data = change_namespace(cdw10, ns.nsid, ns.nsze, ns.identify().flbas);
    reporting
        .persistent_events
        .record(EventType::CHANGE_NAMESPACE, Instant::now(), data);
}

/// Deletes `nsid` (FFFFFFFFh: every namespace). Deleting an attached
/// namespace detaches it first, which the host hears about. The whole
/// [`Shared`]: [`forget`] reaches several owners.
fn delete(shared: &Shared, cmd: &Command) -> Result<(), Status> {
    let nsid = cmd.nsid.get();
    if nsid == 0 || (nsid > shared.subsystem.nn && nsid != NSID_ALL) {
        return Err(invalid_ns());
    }
    let removed: Vec<Arc<Namespace>> = shared.subsystem.namespaces.update(|map| {
        if nsid == NSID_ALL {
            std::mem::take(map).into_values().collect()
        } else {
            map.remove(&nsid).into_iter().collect()
        }
    });
    if removed.is_empty() && nsid != NSID_ALL {
        return Err(invalid_ns());
    }
    forget(shared, &removed, cmd.cdw10.get());
    Ok(())
}

/// What goes with deleted namespaces `removed` (Namespace Management
/// with `cdw10`, or the operator): self-tests on them, their settings, and
/// the host hears of those that were attached. The whole [`Shared`]:
/// self-tests, the event log, features and the host's notice are each
/// another owner's.
pub(crate) fn forget(shared: &Shared, removed: &[Arc<Namespace>], cdw10: u32) {
    let poh = shared.lifecycle.power_on_hours();
    for ns in removed {
        shared.self_test.abort_for(ns.nsid, ABORTED_NS_REMOVED, poh);
    }
    for ns in removed {
        record_change(&shared.reporting, cdw10, ns);
        shared.shared_namespace_changed(ns);
    }
    // A namespace created later under the same NSID starts from defaults.
    let mut admin = shared.features.admin.lock();
    for ns in removed {
        admin.error_recovery.remove(&ns.nsid);
    }
}

/// Namespace Attachment: SEL (CDW10 3:0) 0 attach, 1 detach; a Controller
/// List in the data buffer naming controllers of the subsystem (§5.23).
pub(super) fn namespace_attachment(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<u32, Status> {
    let attach = match Cdw10NsAttachment::from(cmd.cdw10).sel() {
        0 => true,
        1 => false,
        _ => return Err(invalid_field()),
    };
    let nsid = cmd.nsid.get();
    let shared = ctx.shared;
    if nsid == 0 || nsid == NSID_ALL || nsid > shared.subsystem.nn {
        return Err(invalid_ns());
    }
    let mut data = std::mem::take(&mut ctx.scratch.buf);
    let r = ctx.receive(cmd, 4096, &mut data);
    let list = r.map(|()| controller_list(&data, &shared.subsystem.namespaces.controllers()));
    ctx.scratch.buf = data;
    let list = list?.ok_or(Status::CONTROLLER_LIST_INVALID.with_dnr(true))?;
    set_attached_to(&shared.subsystem, nsid, attach, &list).map(|()| 0)
}

/// Attaches or detaches allocated namespace `nsid` to or from this
/// controller (the operator), and tells the host.
pub(crate) fn set_attached(subsystem: &Subsystem, nsid: u32, attach: bool) -> Result<(), Status> {
    let me = subsystem.namespaces.cntlid();
    set_attached_to(subsystem, nsid, attach, &[me])
}

/// Attaches or detaches allocated namespace `nsid` to or from controllers
/// `cntlids`, all or none (§5.23: already attached to one of them, or not
/// attached, fails the command), and tells each of them.
fn set_attached_to(
    subsystem: &Subsystem,
    nsid: u32,
    attach: bool,
    cntlids: &[u16],
) -> Result<(), Status> {
    subsystem.namespaces.update(|map| {
        let ns = map.get_mut(&nsid).ok_or_else(invalid_ns)?;
        for &c in cntlids {
            match (attach, ns.attached.contains(c)) {
                (true, true) => return Err(Status::NAMESPACE_ALREADY_ATTACHED.with_dnr(true)),
                (false, false) => return Err(Status::NAMESPACE_NOT_ATTACHED.with_dnr(true)),
                _ => {}
            }
        }
        let ns = Arc::make_mut(ns);
        for &c in cntlids {
            if attach {
                ns.attached.insert(c);
            } else {
                ns.attached.remove(c);
            }
        }
        Ok(())
    })?;
    subsystem
        .namespaces
        .notify_changed(nsid, cntlids.iter().copied());
    Ok(())
}

/// A Controller List (§4.7.2, Figure 136): count (16 bits) then that many
/// CNTLIDs, ascending. Valid when it names at least one controller, each
/// once and each one of the subsystem's (`controllers`).
fn controller_list(data: &[u8], controllers: &[u16]) -> Option<Vec<u16>> {
    let id_at = |i: usize| {
        data.get(i * 2..i * 2 + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let count = usize::from(id_at(0)?);
    if count == 0 {
        return None;
    }
    let mut list = Vec::with_capacity(count);
    for i in 1..=count {
        let id = id_at(i)?;
        // Ascending, hence no CNTLID twice.
        if list.last().is_some_and(|&last| last >= id) || !controllers.contains(&id) {
            return None;
        }
        list.push(id);
    }
    Some(list)
}

/// Format NVM: LBAF (CDW10 3:0, upper bits 13:12), MSET (bit 4: extended
/// LBAs), PI (7:5: none or Type 1 to 3, in a format whose metadata holds
/// the tuple, else Invalid Format), PIL (bit 8: PI in the first bytes of
/// metadata), SES (11:9: 0 none, 1 user data erase; the data is erased
/// either way). Takes `format_duration` in the background:
/// I/O meanwhile gets Format In Progress. The Persistent Event Log records
/// its start and its completion, when the duration is over.
pub(super) fn format_nvm(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<u32, Status> {
    let cdw10 = Cdw10FormatNvm::from(cmd.cdw10);
    let (index, extended) = (cdw10.lbaf(), cdw10.mset());
    let protection = match cdw10.pi() {
        0 => None,
        pit => Some(Protection {
            pi_type: PiType::from_pit(pit).ok_or_else(invalid_format)?,
            first: cdw10.pil(),
        }),
    };
    let fits = |f: &LbaFormatSpec| protection.is_none() || f.metadata_size >= f.guard.pi_size();
    if !LBA_FORMATS.get(usize::from(index)).is_some_and(fits) {
        return Err(invalid_format());
    }
    let format = (index, extended, protection);
    if cdw10.ses() > 1 {
        return Err(invalid_field());
    }
    let nsid = cmd.nsid.get();
    let shared = ctx.shared;
    let targets: Vec<u32> = if nsid == NSID_ALL {
        shared.subsystem.namespaces.ids_after(0, true, usize::MAX)
    } else {
        shared.namespace(nsid)?;
        vec![nsid]
    };
    let poh = shared.lifecycle.power_on_hours();
    for &id in &targets {
        shared.self_test.abort_for(id, ABORTED_FORMAT, poh);
    }
    let events = &shared.reporting.persistent_events;
    let start = Instant::now();
    // FNA 0 (Identify Controller): each namespace is formatted on its own.
    events.record(
        EventType::FORMAT_NVM_START,
        start,
        format_start(nsid, 0, cmd.cdw10.get()),
    );
    let until = start
        .checked_add(shared.config.format_duration)
        .filter(|_| !shared.config.format_duration.is_zero());
    let result = format_namespaces(&shared.subsystem, &shared.stats, &targets, format, until);
    if let Some(rec) = shared.crash.get() {
        // A format cuts new zones: recorded from now on, each one stored.
        for &id in &targets {
            let ns = shared.subsystem.namespaces.active(id);
            if let Some(zones) = ns.as_ref().and_then(|ns| ns.zones.as_ref()) {
                zones.record_to(
                    rec.clone() as Arc<dyn crate::crash_record::ZoneRecorder>,
                    id,
                );
            }
        }
    }
    let done = match (&result, until) {
        (Ok(()), Some(until)) => until,
        _ => Instant::now(),
    };
    events.record(
        EventType::FORMAT_NVM_COMPLETION,
        done,
        format_completion(nsid, result),
    );
    result.map(|()| 0)
}

/// Erases `targets` and gives them `format` (index, extended LBAs,
/// protection), busy `until` then.
fn format_namespaces(
    subsystem: &Subsystem,
    stats: &Stats,
    targets: &[u32],
    (index, extended, protection): (u8, bool, Option<Protection>),
    until: Option<Instant>,
) -> Result<(), Status> {
    for &id in targets {
        let Some(old) = subsystem.namespaces.active(id) else {
            continue;
        };
        let mut ns = Namespace::with_format(
            id,
            old.ids,
            old.backend.clone(),
            index,
            extended,
            protection,
        )
        .ok_or_else(invalid_format)?;
        // A zoned namespace stays zoned, the same zones in bytes, all empty.
        if let Some(zones) = &old.zones {
            ns = ns.zoned(zones.config).map_err(|e| {
                // The host sees Invalid Format; the log keeps why.
                tracing::debug!(nsid = id, error = %e, "format refused: the zones do not fit it");
                invalid_format()
            })?;
        }
        // Erase before the new format is visible: no read may see old data
        // under it.
        ns.backend.write_zeroes(0, ns.backend.size()).map_err(|e| {
            let op = crate::backend_error::BackendOp::Format;
            stats.backend_error(op, id, &e)
        })?;
        ns.readiness = old.readiness;
        ns.attached = old.attached.clone();
        ns.reservations = old.reservations.clone();
        ns.counters = old.counters.clone();
        ns.formatting_until = until;
        let ns = Arc::new(ns);
        let replaced = subsystem.namespaces.update(|map| {
            // Deleted or detached meanwhile: leave it.
            match map.get_mut(&id).filter(|s| Arc::ptr_eq(s, &old)) {
                Some(slot) => {
                    *slot = Arc::clone(&ns);
                    true
                }
                None => false,
            }
        });
        // A shared namespace's format is the subsystem's (§5.14): the other
        // controllers it is attached to see its new format too, and hear
        // of it; this one's host asked for it.
        if replaced {
            let me = subsystem.namespaces.cntlid();
            let others = ns.attached.iter().filter(|&c| c != me);
            subsystem.namespaces.notify_changed(id, others);
        }
    }
    Ok(())
}
