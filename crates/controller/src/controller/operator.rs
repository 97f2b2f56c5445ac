//! What the operator does to a running controller (the control socket,
//! the configuration): namespaces added, removed, attached, detached and
//! resized as a host would see a physical change — the Namespace Attribute
//! Changed event and the Changed Namespace List — and faults injected
//! ([`crate::faults`]), and a fatal status raised.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vnvme_blockdev::BlockDevice;
use vnvme_spec::log::async_event;
use vnvme_spec::Status;

use super::Controller;
use crate::admin;
use crate::config::NamespaceIds;
use crate::faults::{Fault, FaultError, FaultKind, FaultSpec};
use crate::namespace::Namespace;
use crate::protection::Protection;
use crate::state::Shared;
use crate::subsystem::Namespaces;
use crate::zoned::{ZoneChange, ZoneOpError};

/// How long a resize waits for the commands that hold the namespace.
const RESIZE_QUIESCE: Duration = Duration::from_secs(10);

/// Namespace Management's SEL values, for the Persistent Event Log's
/// Change Namespace events the operator's changes record too.
const SEL_CREATE: u32 = 0;
const SEL_DELETE: u32 = 1;

/// Why an operator's namespace change was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamespaceOpError {
    #[error("namespace {0} does not exist")]
    NoSuchNamespace(u32),
    #[error(
        "NSID {nsid} is outside 1 to NN = {nn}: start the server with a larger --max-namespaces"
    )]
    NsidOutOfRange { nsid: u32, nn: u32 },
    #[error("NSID {0} is in use")]
    NsidInUse(u32),
    #[error("namespace {other} has the same {what}: hosts would not tell the two apart")]
    DuplicateId { other: u32, what: &'static str },
    #[error("no free NSID up to NN = {0}: remove a namespace or start the server with a larger --max-namespaces")]
    NoFreeNsid(u32),
    #[error("namespace {0} is already attached")]
    AlreadyAttached(u32),
    #[error("namespace {0} is not attached")]
    NotAttached(u32),
    #[error("LBA format {0} does not exist (0 to {max})", max = crate::LBA_FORMATS.len() - 1)]
    Format(u8),
    #[error("{bytes} bytes hold no block of LBA format {format}")]
    TooSmall { bytes: u64, format: u8 },
    #[error("namespace {0}'s backend cannot be resized (ram and null namespaces that are not zoned can)")]
    CannotResize(u32),
    #[error("namespace {0} stayed busy with commands for 10 s: try again")]
    Busy(u32),
}

impl Controller {
    /// Adds a namespace over `backend` in LBA format `format_index`, at
    /// `nsid` or the lowest free NSID up to NN; attached (the host hears of
    /// it) or only allocated, identified by `ids` (`None`: new identifiers
    /// no namespace had before). Returns its NSID. Operator namespaces are
    /// not taken from TNVMCAP: they are new capacity.
    pub fn namespace_add(
        &self,
        backend: Arc<dyn BlockDevice>,
        format_index: u8,
        nsid: Option<u32>,
        attached: bool,
        ids: Option<NamespaceIds>,
    ) -> Result<u32, NamespaceOpError> {
        let shared = &*self.shared;
        let nn = shared.subsystem.nn;
        if let Some(id) = nsid.filter(|&id| id == 0 || id > nn) {
            return Err(NamespaceOpError::NsidOutOfRange { nsid: id, nn });
        }
        if crate::config::LBA_FORMATS
            .get(usize::from(format_index))
            .is_none()
        {
            return Err(NamespaceOpError::Format(format_index));
        }
        let bytes = backend.size();
        let nsid = shared.subsystem.namespaces.update(|map| {
            let id = match nsid {
                Some(id) if map.contains_key(&id) => return Err(NamespaceOpError::NsidInUse(id)),
                Some(id) => id,
                None => (1..=nn)
                    .find(|id| !map.contains_key(id))
                    .ok_or(NamespaceOpError::NoFreeNsid(nn))?,
            };
            let mut ns = Namespace::with_format(
                id,
                ids.unwrap_or_else(|| NamespaceIds::fresh(&shared.config.serial, id)),
                backend,
                format_index,
                false,
                None,
            )
            .ok_or(NamespaceOpError::TooSmall {
                bytes,
                format: format_index,
            })?;
            if let Some((other, what)) = map
                .values()
                .find_map(|o| Some((o.nsid, o.ids.shared_with(&ns.ids)?)))
            {
                return Err(NamespaceOpError::DuplicateId { other, what });
            }
            // Attached to every controller of the subsystem: the operator's
            // namespace is shared, as the configured ones are.
            if attached {
                for c in shared.subsystem.namespaces.controllers() {
                    ns.attached.insert(c);
                }
            }
            admin::record_change(&shared.reporting, SEL_CREATE, &ns);
            map.insert(id, Arc::new(ns));
            Ok(id)
        })?;
        if attached {
            let all = shared.subsystem.namespaces.controllers();
            shared.subsystem.namespaces.notify_changed(nsid, all);
        }
        tracing::info!(nsid, bytes, attached, "namespace added by the operator");
        Ok(nsid)
    }

    /// Every allocated namespace (attached or not) with its backend, by
    /// NSID: what a live upgrade compares with the namespaces the new
    /// process configures.
    pub fn namespace_backends(&self) -> Vec<(u32, Arc<dyn BlockDevice>)> {
        self.shared.subsystem.namespaces.backends()
    }

    /// Removes namespace `nsid`; an attached one is detached first, which
    /// the host hears about. Commands already holding it finish on it.
    pub fn namespace_remove(&self, nsid: u32) -> Result<(), NamespaceOpError> {
        let shared = &*self.shared;
        let removed = shared.subsystem.namespaces.update(|map| map.remove(&nsid));
        let removed = removed.ok_or(NamespaceOpError::NoSuchNamespace(nsid))?;
        admin::forget(shared, &[removed], SEL_DELETE);
        tracing::info!(nsid, "namespace removed by the operator");
        Ok(())
    }

    /// Attaches (`true`) or detaches allocated namespace `nsid`.
    pub fn namespace_attach(&self, nsid: u32, attach: bool) -> Result<(), NamespaceOpError> {
        admin::set_attached(&self.shared.subsystem, nsid, attach).map_err(|status| {
            if status.same_code(Status::NAMESPACE_ALREADY_ATTACHED) {
                NamespaceOpError::AlreadyAttached(nsid)
            } else if status.same_code(Status::NAMESPACE_NOT_ATTACHED) {
                NamespaceOpError::NotAttached(nsid)
            } else {
                NamespaceOpError::NoSuchNamespace(nsid)
            }
        })
    }

    /// Resizes namespace `nsid` to `bytes` (its blocks up to the new size
    /// keep their data); returns the new size in blocks. Meanwhile its I/O
    /// gets Namespace Not Ready (DNR = 0, so hosts retry), and the copy
    /// waits for the commands that hold it to finish; then the host hears
    /// of the change (Namespace Attribute Changed, NSZE in Identify).
    pub fn namespace_resize(&self, nsid: u32, bytes: u64) -> Result<u64, NamespaceOpError> {
        let shared = &*self.shared;
        let old = shared
            .subsystem
            .namespaces
            .get(nsid)
            .ok_or(NamespaceOpError::NoSuchNamespace(nsid))?;
        // A zoned namespace's zones are cut from its size: not resized.
        if old.zones.is_some() {
            return Err(NamespaceOpError::CannotResize(nsid));
        }
        let mut busy = (*old).clone();
        busy.sanitize = Some(Status::NAMESPACE_NOT_READY.with_dnr(false));
        let busy = Arc::new(busy);
        if !replace(&shared.subsystem.namespaces, nsid, &old, Arc::clone(&busy)) {
            return Err(NamespaceOpError::NoSuchNamespace(nsid));
        }
        let restore = |e| {
            replace(&shared.subsystem.namespaces, nsid, &busy, Arc::clone(&old));
            Err(e)
        };
        // Only this function holds `old` once the commands that took it
        // before the switch are done: nothing writes to its backend then.
        let deadline = Instant::now() + RESIZE_QUIESCE;
        while Arc::strong_count(&old) > 1 {
            if Instant::now() >= deadline {
                return restore(NamespaceOpError::Busy(nsid));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let Some(backend) = old.backend.resized(bytes) else {
            return restore(NamespaceOpError::CannotResize(nsid));
        };
        let protection = old.pi.map(|p| Protection {
            pi_type: p.pi_type,
            first: p.first,
        });
        let Some(mut ns) = Namespace::with_format(
            nsid,
            old.ids,
            backend,
            old.format_index,
            old.extended,
            protection,
        ) else {
            let format = old.format_index;
            return restore(NamespaceOpError::TooSmall { bytes, format });
        };
        ns.readiness = old.readiness;
        ns.attached = old.attached.clone();
        ns.sanitize = old.sanitize;
        ns.uncorrectable = Arc::clone(&old.uncorrectable);
        let nsze = ns.nsze;
        if !replace(&shared.subsystem.namespaces, nsid, &busy, Arc::new(ns)) {
            return Err(NamespaceOpError::NoSuchNamespace(nsid));
        }
        shared.shared_namespace_changed(&old);
        tracing::info!(nsid, bytes, nsze, "namespace resized by the operator");
        Ok(nsze)
    }

    /// Changes the zone starting at `zslba` of zoned namespace `nsid` as
    /// the controller would by itself ([`ZoneChange`]): read only or
    /// offline as the zones of a worn device fail (writes then get Zone Is
    /// Read Only or Zone Is Offline, reads too, offline), finished, or a
    /// finish or reset recommended. Its ZSLBA joins the namespace's Changed
    /// Zone List, and a host that enabled Zone Descriptor Changed Notices
    /// hears of it (ZNS 1.1 §5.2). `Ok(false)`: the zone already was so
    /// (nothing sent).
    pub fn zone_set_state(
        &self,
        nsid: u32,
        zslba: u64,
        to: ZoneChange,
    ) -> Result<bool, ZoneOpError> {
        let shared = &*self.shared;
        let ns = shared
            .subsystem
            .namespaces
            .get(nsid)
            .ok_or(ZoneOpError::NoSuchNamespace(nsid))?;
        let zones = ns.zones.as_ref().ok_or(ZoneOpError::NotZoned(nsid))?;
        let changed = zones.change(zslba, to)?;
        if changed && ns.attached.contains(shared.subsystem.namespaces.cntlid()) {
            shared.async_event(
                async_event::TYPE_NOTICE,
                vnvme_spec::zns::NOTICE_ZONE_DESCRIPTOR_CHANGED,
                vnvme_spec::zns::CHANGED_ZONE_LIST_LID,
            );
        }
        tracing::info!(nsid, zslba, ?to, changed, "zone failed by the operator");
        Ok(changed)
    }

    /// Sets CSTS.CFS, as an internal failure would: the host's recovery is
    /// a controller reset.
    pub fn controller_fatal(&self, why: &str) {
        self.shared.set_fatal(why);
    }

    /// Adds a fault. A command fault is armed and its id returned; a state
    /// fault takes effect now (`None`).
    pub fn fault_add(&self, spec: FaultSpec) -> Result<Option<u64>, FaultError> {
        spec.validate()?;
        let shared = &self.shared;
        let nsid = spec.nsid.unwrap_or(0);
        match spec.kind {
            FaultKind::Latency(_) | FaultKind::Status(_) | FaultKind::NeverComplete => {
                let id = shared.subsystem.namespaces.table().next_fault_id();
                return shared.faults.add(spec, id).map(Some);
            }
            FaultKind::MediaError => {
                let ns = shared
                    .subsystem
                    .namespaces
                    .get(nsid)
                    .ok_or(FaultError::NoNamespace(nsid))?;
                let (slba, nlb) = spec.lba.unwrap_or_default();
                ns.byte_range(slba, nlb)
                    // Its only error is LBA Out of Range, which OutOfRange says.
                    .map_err(|_| FaultError::OutOfRange(nsid))?;
                ns.uncorrectable
                    .mark(slba, nlb)
                    // Its only error is Internal Error when the ranges are full.
                    .map_err(|_| FaultError::Media("too many marked ranges".into()))?;
            }
            FaultKind::NotReady(d) => {
                if shared.subsystem.namespaces.get(nsid).is_none() {
                    return Err(FaultError::NoNamespace(nsid));
                }
                self.not_ready_for(nsid, d);
            }
            FaultKind::SmartWarning(bits) => raise_smart_warning(shared, bits),
            FaultKind::PowerLoss => self.power_loss()?,
            FaultKind::Ana(a) => self
                .ana_fault(a)
                .map_err(|e| FaultError::Ana(e.to_string()))?,
        }
        tracing::info!(fault = spec.kind.name(), nsid, "fault injected");
        Ok(None)
    }

    /// Arms command fault `spec` here with `id`, the id [`fault_add`]
    /// gave the same fault on another controller of this subsystem: one
    /// fault on several paths, one id for all of them.
    ///
    /// [`fault_add`]: Self::fault_add
    pub fn fault_arm(&self, spec: FaultSpec, id: u64) -> Result<(), FaultError> {
        if !spec.kind.is_command_fault() {
            return Err(FaultError::NotCommand(spec.kind.name()));
        }
        self.shared.faults.add(spec, id).map(drop)
    }

    /// The command faults armed now.
    pub fn fault_list(&self) -> Vec<Fault> {
        self.shared.faults.list()
    }

    /// The SMART critical warning bits faults raised.
    pub fn smart_warning(&self) -> u8 {
        self.shared.faults.smart_warning.load(Ordering::Relaxed)
    }

    /// NSIDs a not-ready fault holds now.
    pub fn not_ready_namespaces(&self) -> Vec<u32> {
        self.shared.faults.not_ready_list(Instant::now())
    }

    /// Removes command fault `id`, or (`None`) every fault: command faults,
    /// not-ready periods and SMART warnings. Returns how many command
    /// faults went.
    pub fn fault_clear(&self, id: Option<u64>) -> usize {
        self.shared.faults.clear(id)
    }

    /// Namespace `nsid` answers Namespace Not Ready for `d`, then the host
    /// hears it changed (as a slow namespace announces itself ready).
    fn not_ready_for(&self, nsid: u32, d: Duration) {
        let shared = &self.shared;
        let until = Instant::now() + d;
        shared.faults.set_not_ready(nsid, until);
        shared.namespace_changed(nsid);
        self.fault_end("vnvme-not-ready", d, move |shared| {
            if !shared.faults.not_ready(nsid, Instant::now)
                && shared.subsystem.namespaces.active(nsid).is_some()
            {
                shared.namespace_changed(nsid);
            }
        });
    }

    /// Runs `end` on a thread named `name` after `d`, if the controller is
    /// still there: the end of a fault that lasts (no thread: said, and
    /// the fault's state stays). `end` gets the whole [`Shared`], as the
    /// fault's start had the controller: an end restores the faults' or
    /// the namespaces' state and tells the host.
    pub(super) fn fault_end(
        &self,
        name: &str,
        d: Duration,
        end: impl FnOnce(&Shared) + Send + 'static,
    ) {
        let weak = Arc::downgrade(&self.shared);
        let spawned = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                std::thread::sleep(d);
                if let Some(shared) = weak.upgrade() {
                    end(&shared);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("no timer for the end of a fault ({name}: {e}): its state stays");
        }
    }
}

/// Replaces namespace `nsid` with `new` if it is still `old`.
fn replace(namespaces: &Namespaces, nsid: u32, old: &Arc<Namespace>, new: Arc<Namespace>) -> bool {
    namespaces.update(|map| match map.get_mut(&nsid) {
        Some(slot) if Arc::ptr_eq(slot, old) => {
            *slot = new;
            true
        }
        _ => false,
    })
}

/// Raises SMART critical warning `bits` (§5.16.1.3 byte 0: bit 0 spare
/// below threshold, bit 1 temperature, bit 2 reliability degraded, bit 3
/// read only, bit 4 volatile memory backup failed) and reports it as a
/// SMART / Health event (§5.2, Figure 146) if the host enabled the
/// warning in Asynchronous Event Configuration bits 7:0. The whole
/// [`Shared`]: the faults hold the bits, the features the host's
/// configuration, and the event is raised through it
/// ([`Shared::async_event`]).
fn raise_smart_warning(shared: &Shared, bits: u8) {
    shared
        .faults
        .smart_warning
        .fetch_or(bits, Ordering::Relaxed);
    let enabled = shared.features.admin.lock().async_event_config as u8;
    if enabled & bits == 0 {
        return;
    }
    let info = if bits & 0x2 != 0 {
        async_event::SMART_TEMPERATURE_THRESHOLD
    } else if bits & 0x1 != 0 {
        async_event::SMART_SPARE_BELOW_THRESHOLD
    } else {
        async_event::SMART_RELIABILITY
    };
    shared.async_event(async_event::TYPE_SMART, info, 0x02);
}

impl Controller {
    /// Power loss: every namespace whose backend models a volatile write
    /// cache drops the writes it holds (acknowledged, not flushed), the
    /// SMART log counts an unsafe shutdown, and the controller fails as
    /// power coming back would show it (CSTS.CFS; the host resets it).
    fn power_loss(&self) -> Result<(), FaultError> {
        let shared = &self.shared;
        if !shared.lifecycle.ready() {
            return Err(FaultError::NotEnabled);
        }
        let mut dropped = 0;
        for ns in shared.subsystem.namespaces.active_list() {
            if ns.backend.power_loss() {
                dropped += 1;
            }
        }
        if dropped == 0 {
            return Err(FaultError::NoVolatileCache);
        }
        shared
            .stats
            .unsafe_shutdowns
            .fetch_add(1, Ordering::Relaxed);
        shared.set_fatal("power loss injected");
        Ok(())
    }
}
