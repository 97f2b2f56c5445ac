//! Get Features and Set Features (§5.15, §5.27).

use std::sync::atomic::Ordering;

use vnvme_spec::cdw::{Cdw10GetFeatures, Cdw10SetFeatures};
use vnvme_spec::feature::{
    select, AsyncEventConfig, FeatureCapabilities, FeatureId, InterruptCoalescing,
    InterruptVectorConfig, NumberOfQueues, PowerManagement, VolatileWriteCache, WriteAtomicity,
};
use vnvme_spec::{Command, Status};

use super::invalid_field;
use crate::command::Ctx;
use crate::state::AdminState;

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
        | FeatureId::ASYNC_EVENT_CONFIG => true,
        _ => false,
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
    let admin = match sel {
        select::CURRENT => shared.admin.lock().clone(),
        select::DEFAULT | select::SAVED => AdminState::new(&shared.config),
        // Changeable, not saveable, not per namespace.
        select::SUPPORTED_CAPABILITIES => {
            return Ok(FeatureCapabilities::new().with_changeable(true).into())
        }
        _ => return Err(invalid_field()),
    };
    let current = sel == select::CURRENT;
    Ok(match fid {
        FeatureId::ARBITRATION => admin.arbitration,
        FeatureId::POWER_MANAGEMENT => admin.power_state,
        FeatureId::TEMPERATURE_THRESHOLD => admin.temperature_threshold,
        FeatureId::ERROR_RECOVERY => admin.error_recovery,
        FeatureId::WRITE_ATOMICITY => admin.write_atomicity,
        FeatureId::ASYNC_EVENT_CONFIG => admin.async_event_config,
        FeatureId::NUMBER_OF_QUEUES => NumberOfQueues::new()
            .with_nsqr_z(admin.nsqa_z)
            .with_ncqr_z(admin.ncqa_z)
            .into(),
        FeatureId::VOLATILE_WRITE_CACHE => VolatileWriteCache::new()
            .with_wce(!current || shared.wce.load(Ordering::Relaxed))
            .into(),
        FeatureId::INTERRUPT_COALESCING if current => shared.coalescing.load(Ordering::Relaxed),
        FeatureId::INTERRUPT_VECTOR_CONFIG => {
            let iv = InterruptVectorConfig::from(cmd.cdw11).iv();
            let cd = shared
                .coalescing_disabled
                .get(usize::from(iv))
                .ok_or_else(invalid_field)?;
            InterruptVectorConfig::new()
                .with_iv(iv)
                .with_cd(current && cd.load(Ordering::Relaxed))
                .into()
        }
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
    match fid {
        FeatureId::NUMBER_OF_QUEUES => {
            let req = NumberOfQueues::from(cmd.cdw11);
            if req.nsqr_z() == 0xFFFF || req.ncqr_z() == 0xFFFF {
                return Err(invalid_field());
            }
            let mut admin = shared.admin.lock();
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
            if !enable && shared.wce.swap(false, Ordering::AcqRel) {
                for ns in shared.subsystem.namespaces.active_list() {
                    ns.backend.flush().map_err(|e| {
                        let op = crate::backend_error::BackendOp::Flush;
                        shared.stats.backend_error(op, ns.nsid, &e)
                    })?;
                }
            }
            shared.wce.store(enable, Ordering::Release);
        }
        FeatureId::INTERRUPT_COALESCING => {
            // THR and TIME; the reserved bits are not kept.
            let ic = InterruptCoalescing::from(cmd.cdw11);
            let kept = InterruptCoalescing::new()
                .with_thr_z(ic.thr_z())
                .with_time(ic.time());
            shared.coalescing.store(kept.into(), Ordering::Relaxed);
        }
        FeatureId::INTERRUPT_VECTOR_CONFIG => {
            let ivc = InterruptVectorConfig::from(cmd.cdw11);
            let cd = shared
                .coalescing_disabled
                .get(usize::from(ivc.iv()))
                .ok_or_else(invalid_field)?;
            cd.store(ivc.cd(), Ordering::Relaxed);
        }
        FeatureId::POWER_MANAGEMENT => {
            // One power state (NPSS = 0); the workload hint is kept.
            let pm = PowerManagement::from(cmd.cdw11);
            if pm.ps() != 0 {
                return Err(invalid_field());
            }
            shared.admin.lock().power_state = PowerManagement::new().with_wh(pm.wh()).into();
        }
        FeatureId::ARBITRATION => shared.admin.lock().arbitration = value,
        FeatureId::TEMPERATURE_THRESHOLD => shared.admin.lock().temperature_threshold = value,
        FeatureId::ERROR_RECOVERY => shared.admin.lock().error_recovery = value,
        FeatureId::WRITE_ATOMICITY => {
            let dn = WriteAtomicity::from(cmd.cdw11).dn();
            shared.admin.lock().write_atomicity = WriteAtomicity::new().with_dn(dn).into();
        }
        FeatureId::ASYNC_EVENT_CONFIG => {
            // The events this controller reports: SMART warnings and
            // Namespace Attribute Notices.
            let aec = AsyncEventConfig::from(cmd.cdw11);
            shared.admin.lock().async_event_config = AsyncEventConfig::new()
                .with_smart(aec.smart())
                .with_nan(aec.nan())
                .into();
        }
        _ => return Err(invalid_field()),
    }
    Ok(0)
}
