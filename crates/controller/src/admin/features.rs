//! Get Features and Set Features (§5.15, §5.27).

use std::sync::atomic::Ordering;

use vnvme_spec::feature::{select, FeatureId, InterruptVectorConfig, NumberOfQueues};
use vnvme_spec::{Command, Status};

use super::invalid_field;
use crate::state::{AdminState, Ctx};

/// Features this controller implements.
fn supported(ctx: &Ctx<'_>, fid: FeatureId) -> bool {
    match fid {
        FeatureId::VOLATILE_WRITE_CACHE => ctx.shared.vwc,
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
    let fid = FeatureId(cmd.cdw10.get() as u8);
    let sel = ((cmd.cdw10.get() >> 8) & 0x7) as u8;
    if !supported(ctx, fid) {
        return Err(invalid_field());
    }
    let shared = ctx.shared;
    let admin = match sel {
        select::CURRENT => shared.admin.lock().clone(),
        select::DEFAULT | select::SAVED => AdminState::new(&shared.config),
        // Capabilities: changeable (bit 2), not saveable, not per namespace.
        select::SUPPORTED_CAPABILITIES => return Ok(1 << 2),
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
        FeatureId::NUMBER_OF_QUEUES => NumberOfQueues {
            nsqr_z: admin.nsqa_z,
            ncqr_z: admin.ncqa_z,
        }
        .to_dword(),
        FeatureId::VOLATILE_WRITE_CACHE => {
            u32::from(!current || shared.wce.load(Ordering::Relaxed))
        }
        FeatureId::INTERRUPT_COALESCING if current => shared.coalescing.load(Ordering::Relaxed),
        FeatureId::INTERRUPT_VECTOR_CONFIG => {
            let iv = cmd.cdw11.get() as u16;
            let cd = shared
                .coalescing_disabled
                .get(usize::from(iv))
                .ok_or_else(invalid_field)?;
            InterruptVectorConfig {
                iv,
                cd: current && cd.load(Ordering::Relaxed),
            }
            .to_dword()
        }
        _ => 0,
    })
}

/// Set Features: CDW10 FID (7:0), SV (31); value in CDW11.
pub(super) fn set(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<u32, Status> {
    let fid = FeatureId(cmd.cdw10.get() as u8);
    let save = cmd.cdw10.get() & (1 << 31) != 0;
    let value = cmd.cdw11.get();
    if !supported(ctx, fid) {
        return Err(invalid_field());
    }
    if save {
        return Err(Status::FEATURE_NOT_SAVEABLE.with_dnr(true));
    }
    let shared = ctx.shared;
    match fid {
        FeatureId::NUMBER_OF_QUEUES => {
            let req = NumberOfQueues::from_dword(value);
            if req.nsqr_z == 0xFFFF || req.ncqr_z == 0xFFFF {
                return Err(invalid_field());
            }
            let mut admin = shared.admin.lock();
            if admin.io_queues_created {
                return Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr(true));
            }
            let max_z = shared.config.max_io_queues.saturating_sub(1);
            admin.nsqa_z = req.nsqr_z.min(max_z);
            admin.ncqa_z = req.ncqr_z.min(max_z);
            return Ok(NumberOfQueues {
                nsqr_z: admin.nsqa_z,
                ncqr_z: admin.ncqa_z,
            }
            .to_dword());
        }
        FeatureId::VOLATILE_WRITE_CACHE => {
            let enable = value & 1 != 0;
            if !enable && shared.wce.swap(false, Ordering::AcqRel) {
                for ns in shared.namespaces.active_list() {
                    ns.backend
                        .flush()
                        .map_err(|_| Status::INTERNAL_ERROR.with_dnr(true))?;
                }
            }
            shared.wce.store(enable, Ordering::Release);
        }
        FeatureId::INTERRUPT_COALESCING => {
            shared.coalescing.store(value & 0xFFFF, Ordering::Relaxed);
        }
        FeatureId::INTERRUPT_VECTOR_CONFIG => {
            let ivc = InterruptVectorConfig::from_dword(value);
            let cd = shared
                .coalescing_disabled
                .get(usize::from(ivc.iv))
                .ok_or_else(invalid_field)?;
            cd.store(ivc.cd, Ordering::Relaxed);
        }
        FeatureId::POWER_MANAGEMENT => {
            // One power state (NPSS = 0).
            if value & 0x1F != 0 {
                return Err(invalid_field());
            }
            shared.admin.lock().power_state = value & 0xFF;
        }
        FeatureId::ARBITRATION => shared.admin.lock().arbitration = value,
        FeatureId::TEMPERATURE_THRESHOLD => shared.admin.lock().temperature_threshold = value,
        FeatureId::ERROR_RECOVERY => shared.admin.lock().error_recovery = value,
        FeatureId::WRITE_ATOMICITY => shared.admin.lock().write_atomicity = value & 1,
        FeatureId::ASYNC_EVENT_CONFIG => {
            // SMART warnings (7:0) and Namespace Attribute Notices (8).
            shared.admin.lock().async_event_config = value & 0x1FF;
        }
        _ => return Err(invalid_field()),
    }
    Ok(0)
}
