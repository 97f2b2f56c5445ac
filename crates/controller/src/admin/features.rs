//! Get Features and Set Features (§5.15, §5.27): the features this
//! controller implements, their scope and capabilities, the Select field,
//! and the features whose value is a dword. Those with a data buffer are in
//! [`feature_data`](super::feature_data).

use std::sync::atomic::Ordering;

use vnvme_spec::cdw::{Cdw10GetFeatures, Cdw10SetFeatures};
use vnvme_spec::feature::{
    select, AsyncEventConfig, ErrorRecovery, FeatureCapabilities, FeatureId, InterruptCoalescing,
    InterruptVectorConfig, IoCommandSetProfile, NumberOfQueues, PowerManagement,
    SoftwareProgressMarker, VolatileWriteCache, WriteAtomicity,
};
use vnvme_spec::regs::css;
use vnvme_spec::{Command, Status};

use super::identify::IO_COMMAND_SET_COMBINATIONS;
use super::{feature_data, invalid_field};
use crate::command::Ctx;
use crate::features::{AdminState, Features};
use crate::keep_alive::round_kato;
use crate::lifecycle::Lifecycle;
use crate::namespace::NSID_ALL;
use crate::subsystem::Subsystem;

/// Features this controller implements.
fn supported(ctx: &Ctx<'_>, fid: FeatureId) -> bool {
    match fid {
        FeatureId::VOLATILE_WRITE_CACHE => ctx.shared.subsystem.vwc,
        FeatureId::ARBITRATION
        | FeatureId::POWER_MANAGEMENT
        | FeatureId::TEMPERATURE_THRESHOLD
        | FeatureId::ERROR_RECOVERY
        | FeatureId::NUMBER_OF_QUEUES
        | FeatureId::INTERRUPT_COALESCING
        | FeatureId::INTERRUPT_VECTOR_CONFIG
        | FeatureId::WRITE_ATOMICITY
        | FeatureId::ASYNC_EVENT_CONFIG
        | FeatureId::TIMESTAMP
        | FeatureId::KEEP_ALIVE_TIMER
        | FeatureId::HOST_BEHAVIOR_SUPPORT
        | FeatureId::IO_COMMAND_SET_PROFILE
        | FeatureId::SOFTWARE_PROGRESS_MARKER
        | FeatureId::HOST_IDENTIFIER
        | FeatureId::RESERVATION_NOTIFICATION_MASK
        | FeatureId::RESERVATION_PERSISTENCE => true,
        _ => false,
    }
}

/// Error Recovery (NVM Command Set Spec 1.0, its features), Reservation
/// Notification Mask and Reservation Persistence have namespace scope; the
/// others controller scope (§5.27.1 Figure 317).
fn namespace_scope(fid: FeatureId) -> bool {
    fid == FeatureId::ERROR_RECOVERY
        || fid == FeatureId::RESERVATION_NOTIFICATION_MASK
        || fid == FeatureId::RESERVATION_PERSISTENCE
}

/// Supported capabilities (Get Features SEL 011b): every feature here can
/// be changed, and none saved (Set Features refuses SV).
fn capabilities(fid: FeatureId) -> FeatureCapabilities {
    FeatureCapabilities::new()
        .with_changeable(true)
        .with_ns_specific(namespace_scope(fid))
}

/// What a feature command applies to, by the NSID rules of the Feature
/// Values section (NVMe Base 2.1 §4.4).
enum Target {
    Controller,
    Namespace(u32),
    /// Set Features to every attached namespace (NSID FFFFFFFFh).
    AllNamespaces,
}

/// Controller scope: NSID 0h or FFFFFFFFh; a valid NSID reads the
/// controller's value but cannot set it (Feature Not Namespace Specific).
/// Namespace scope: an active NSID, or FFFFFFFFh for Set Features.
fn target(subsystem: &Subsystem, fid: FeatureId, nsid: u32, set: bool) -> Result<Target, Status> {
    let valid = nsid != 0 && nsid <= subsystem.nn;
    let invalid_ns = || Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true);
    if !namespace_scope(fid) {
        return match nsid {
            0 | NSID_ALL => Ok(Target::Controller),
            _ if valid && set => Err(Status::FEATURE_NOT_NAMESPACE_SPECIFIC.with_dnr(true)),
            _ if valid => Ok(Target::Controller),
            _ => Err(invalid_ns()),
        };
    }
    match nsid {
        NSID_ALL if set => Ok(Target::AllNamespaces),
        _ if !valid => Err(invalid_ns()),
        _ if subsystem.namespaces.active(nsid).is_none() => Err(invalid_field()),
        _ => Ok(Target::Namespace(nsid)),
    }
}

/// Get Features: CDW10 FID (7:0), SEL (10:8). Returns completion dword 0.
pub(super) fn get(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<u32, Status> {
    let cdw10 = Cdw10GetFeatures::from(cmd.cdw10);
    let (fid, sel) = (cdw10.fid(), cdw10.sel());
    if !supported(ctx, fid) {
        return Err(invalid_field());
    }
    let shared = ctx.shared;
    let target = target(&shared.subsystem, fid, cmd.nsid.get(), false)?;
    let current = match sel {
        select::CURRENT => true,
        // Nothing is saveable: a saved value reads as the default (§5.15).
        select::DEFAULT | select::SAVED => false,
        select::SUPPORTED_CAPABILITIES => return Ok(capabilities(fid).into()),
        _ => return Err(invalid_field()),
    };
    let admin = if current {
        shared.features.admin.lock().clone()
    } else {
        AdminState::new(&shared.config)
    };
    Ok(match fid {
        FeatureId::TIMESTAMP | FeatureId::HOST_BEHAVIOR_SUPPORT | FeatureId::HOST_IDENTIFIER => {
            feature_data::get(ctx, cmd, fid, &admin, current)?;
            0
        }
        FeatureId::ARBITRATION => admin.arbitration,
        FeatureId::POWER_MANAGEMENT => admin.power_state,
        FeatureId::TEMPERATURE_THRESHOLD => admin.temperature_threshold,
        FeatureId::ERROR_RECOVERY => match target {
            Target::Namespace(nsid) => admin.error_recovery.get(&nsid).copied().unwrap_or(0),
            _ => return Err(invalid_field()),
        },
        FeatureId::RESERVATION_PERSISTENCE if current => match target {
            Target::Namespace(nsid) => shared
                .namespace(nsid)
                .map(|ns| u32::from(ns.reservations.snapshot().ptpl))?,
            _ => return Err(invalid_field()),
        },
        FeatureId::RESERVATION_NOTIFICATION_MASK if current => match target {
            Target::Namespace(nsid) => shared.reporting.reservation_notices.lock().mask(nsid),
            _ => return Err(invalid_field()),
        },
        FeatureId::WRITE_ATOMICITY => admin.write_atomicity,
        FeatureId::ASYNC_EVENT_CONFIG => admin.async_event_config,
        FeatureId::NUMBER_OF_QUEUES => NumberOfQueues::new()
            .with_nsqr_z(admin.nsqa_z)
            .with_ncqr_z(admin.ncqa_z)
            .into(),
        FeatureId::VOLATILE_WRITE_CACHE => VolatileWriteCache::new()
            .with_wce(!current || shared.features.wce.load(Ordering::Relaxed))
            .into(),
        FeatureId::INTERRUPT_COALESCING if current => shared.interrupts.coalescing(),
        FeatureId::INTERRUPT_VECTOR_CONFIG => {
            let iv = InterruptVectorConfig::from(cmd.cdw11).iv();
            let cd = shared
                .interrupts
                .coalescing_disabled(iv)
                .ok_or_else(invalid_field)?;
            InterruptVectorConfig::new()
                .with_iv(iv)
                .with_cd(current && cd)
                .into()
        }
        FeatureId::KEEP_ALIVE_TIMER if current => shared.features.keep_alive.kato(),
        FeatureId::SOFTWARE_PROGRESS_MARKER if current => SoftwareProgressMarker::new()
            .with_pbslc(shared.features.software_progress.load(Ordering::Relaxed))
            .into(),
        // The index of the one combination there is (see
        // `io_command_set_profile`), current and default alike.
        FeatureId::IO_COMMAND_SET_PROFILE => IoCommandSetProfile::new().with_iocsci(0).into(),
        _ => 0,
    })
}

/// Set Features: CDW10 FID (7:0), SV (31); value in CDW11.
pub(super) fn set(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<u32, Status> {
    let cdw10 = Cdw10SetFeatures::from(cmd.cdw10);
    let fid = cdw10.fid();
    let value = cmd.cdw11.get();
    if !supported(ctx, fid) {
        return Err(invalid_field());
    }
    if cdw10.sv() {
        return Err(Status::FEATURE_NOT_SAVEABLE.with_dnr(true));
    }
    let shared = ctx.shared;
    let target = target(&shared.subsystem, fid, cmd.nsid.get(), true)?;
    match fid {
        FeatureId::TIMESTAMP | FeatureId::HOST_BEHAVIOR_SUPPORT | FeatureId::HOST_IDENTIFIER => {
            feature_data::set(ctx, cmd, fid)?;
        }
        FeatureId::NUMBER_OF_QUEUES => {
            let req = NumberOfQueues::from(cmd.cdw11);
            if req.nsqr_z() == 0xFFFF || req.ncqr_z() == 0xFFFF {
                return Err(invalid_field());
            }
            let mut admin = shared.features.admin.lock();
            if admin.io_queues_created {
                return Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr(true));
            }
            let max_z = shared.config.max_io_queues.saturating_sub(1);
            admin.nsqa_z = req.nsqr_z().min(max_z);
            admin.ncqa_z = req.ncqr_z().min(max_z);
            return Ok(NumberOfQueues::new()
                .with_nsqr_z(admin.nsqa_z)
                .with_ncqr_z(admin.ncqa_z)
                .into());
        }
        FeatureId::VOLATILE_WRITE_CACHE => {
            let enable = VolatileWriteCache::from(cmd.cdw11).wce();
            if !enable && shared.features.wce.swap(false, Ordering::AcqRel) {
                for ns in shared.subsystem.namespaces.active_list() {
                    ns.backend.flush().map_err(|e| {
                        let op = crate::backend_error::BackendOp::Flush;
                        shared.stats.backend_error(op, ns.nsid, &e)
                    })?;
                }
            }
            shared.features.wce.store(enable, Ordering::Release);
        }
        FeatureId::INTERRUPT_COALESCING => shared
            .interrupts
            .set_coalescing(InterruptCoalescing::from(cmd.cdw11)),
        FeatureId::INTERRUPT_VECTOR_CONFIG => {
            let ivc = InterruptVectorConfig::from(cmd.cdw11);
            shared
                .interrupts
                .set_coalescing_disabled(ivc.iv(), ivc.cd())
                .ok_or_else(invalid_field)?;
        }
        FeatureId::POWER_MANAGEMENT => {
            // One power state (NPSS = 0); the workload hint is kept.
            let pm = PowerManagement::from(cmd.cdw11);
            if pm.ps() != 0 {
                return Err(invalid_field());
            }
            shared.features.admin.lock().power_state =
                PowerManagement::new().with_wh(pm.wh()).into();
        }
        FeatureId::ARBITRATION => shared.features.admin.lock().arbitration = value,
        FeatureId::TEMPERATURE_THRESHOLD => {
            shared.features.admin.lock().temperature_threshold = value
        }
        FeatureId::ERROR_RECOVERY => {
            error_recovery(&shared.subsystem, &shared.features, target, cmd)?
        }
        FeatureId::RESERVATION_PERSISTENCE => {
            reservation_persistence(&shared.subsystem, target, cmd)?
        }
        FeatureId::RESERVATION_NOTIFICATION_MASK => {
            // Bits 1-3 (REGPRE, RESREL, RESPRE) are kept; the rest is
            // reserved. FFFFFFFFh: every attached namespace.
            let nsids = match target {
                Target::Namespace(nsid) => vec![nsid],
                _ => shared.subsystem.namespaces.ids_after(0, true, usize::MAX),
            };
            let mut notices = shared.reporting.reservation_notices.lock();
            for nsid in nsids {
                notices.set_mask(nsid, value);
            }
        }
        FeatureId::WRITE_ATOMICITY => {
            let dn = WriteAtomicity::from(cmd.cdw11).dn();
            shared.features.admin.lock().write_atomicity = WriteAtomicity::new().with_dn(dn).into();
        }
        FeatureId::ASYNC_EVENT_CONFIG => {
            // The events this controller reports: SMART warnings, Namespace
            // Attribute, Firmware Activation and Zone Descriptor Changed
            // Notices, and ANA Change Notices where ANA is reported.
            let aec = AsyncEventConfig::from(cmd.cdw11);
            let anacn = aec.anacn() && shared.ana_reporting();
            shared.features.admin.lock().async_event_config = AsyncEventConfig::new()
                .with_smart(aec.smart())
                .with_nan(aec.nan())
                .with_fan(aec.fan())
                .with_anacn(anacn)
                .with_zdcn(aec.zdcn())
                .into();
        }
        FeatureId::KEEP_ALIVE_TIMER => {
            // KATO rounds up to the KAS granularity; a value that cannot
            // is beyond the largest timeout the controller supports.
            let kato =
                round_kato(value).ok_or(Status::KEEP_ALIVE_TIMEOUT_INVALID.with_dnr(true))?;
            shared.features.keep_alive.set_kato(kato);
        }
        FeatureId::IO_COMMAND_SET_PROFILE => io_command_set_profile(&shared.lifecycle, cmd)?,
        FeatureId::SOFTWARE_PROGRESS_MARKER => {
            let pbslc = SoftwareProgressMarker::from(cmd.cdw11).pbslc();
            shared
                .features
                .software_progress
                .store(pbslc, Ordering::Relaxed);
        }
        _ => return Err(invalid_field()),
    }
    Ok(0)
}

/// Error Recovery: TLER is kept per namespace. DULBE needs the namespace
/// to report deallocated blocks as errors (NSFEAT.DAE), which ours do not.
fn error_recovery(
    subsystem: &Subsystem,
    features: &Features,
    target: Target,
    cmd: &Command,
) -> Result<(), Status> {
    let er = ErrorRecovery::from(cmd.cdw11);
    if er.dulbe() {
        return Err(invalid_field());
    }
    let kept: u32 = ErrorRecovery::new().with_tler(er.tler()).into();
    let nsids = match target {
        Target::Namespace(nsid) => vec![nsid],
        Target::AllNamespaces => subsystem
            .namespaces
            .active_list()
            .iter()
            .map(|ns| ns.nsid)
            .collect(),
        Target::Controller => return Err(invalid_field()),
    };
    let mut admin = features.admin.lock();
    for nsid in nsids {
        admin.error_recovery.insert(nsid, kept);
    }
    Ok(())
}

/// Reservation Persistence (§5.27.1.27): CDW11 bit 0, PTPL, for one
/// namespace or every attached one; Invalid Field for a namespace whose
/// keys cannot persist (RESCAP.PTPLS clear).
fn reservation_persistence(
    subsystem: &Subsystem,
    target: Target,
    cmd: &Command,
) -> Result<(), Status> {
    let ptpl = cmd.cdw11.get() & 1 != 0;
    let namespaces = match target {
        Target::Namespace(nsid) => vec![subsystem.namespace(nsid)?],
        Target::AllNamespaces => subsystem.namespaces.active_list(),
        Target::Controller => return Err(invalid_field()),
    };
    for ns in namespaces {
        ns.reservations.update(|s| {
            s.ptpl = ptpl;
            Ok(())
        })?;
    }
    Ok(())
}

/// I/O Command Set Profile (§5.27.1.21): with CC.CSS other than 110b the
/// command has no effect and completes successfully. Otherwise the index
/// must name a combination of Identify CNS 1Ch; the only one is index 0
/// (the NVM Command Set), so the value never changes from 0.
fn io_command_set_profile(lifecycle: &Lifecycle, cmd: &Command) -> Result<(), Status> {
    let cc = lifecycle.cc();
    let index = usize::from(IoCommandSetProfile::from(cmd.cdw11).iocsci());
    let exists = IO_COMMAND_SET_COMBINATIONS
        .get(index)
        .is_some_and(|&v| v != 0);
    if cc.css() == css::ALL_IOCS && !exists {
        return Err(Status::IOCS_COMBINATION_REJECTED.with_dnr(true));
    }
    Ok(())
}
