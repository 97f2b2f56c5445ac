//! Get Log Page (§5.16): error information, SMART / health, firmware slot,
//! changed namespace list, commands supported and effects (including the
//! registered vendor specific opcodes), device self-test, sanitize status.

use std::sync::atomic::Ordering::Relaxed;

use vnvme_spec::log::{
    async_event, effects, set_u128, CommandEffectsLog, GetLogPage, LogPageId, SmartLog,
};
use vnvme_spec::{AdminOpcode, Command, Status};
use zerocopy::little_endian::U32;
use zerocopy::IntoBytes;

use super::invalid_field;
use crate::command::Ctx;
use crate::state::{Shared, ELPE};
use crate::vendor::CommandSet;

pub(super) fn get_log_page(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<(), Status> {
    let req = GetLogPage::parse(
        cmd.cdw10.get(),
        cmd.cdw11.get(),
        cmd.cdw12.get(),
        cmd.cdw13.get(),
    );
    let len = req.len();
    if len > ctx.shared.config.max_transfer() || !req.offset.is_multiple_of(4) {
        return Err(invalid_field());
    }
    let shared = ctx.shared;
    let nsid = cmd.nsid.get();
    let (page, event_type) = match req.lid {
        LogPageId::ERROR_INFORMATION => (error_log(shared), Some(async_event::TYPE_ERROR)),
        LogPageId::SMART_HEALTH => {
            if nsid != 0 && nsid != 0xFFFF_FFFF {
                return Err(invalid_field());
            }
            (smart_log(shared), Some(async_event::TYPE_SMART))
        }
        LogPageId::FIRMWARE_SLOT => (firmware_slot_log(shared), None),
        LogPageId::CHANGED_NAMESPACES => (
            shared.subsystem.changed.lock().page(),
            Some(async_event::TYPE_NOTICE),
        ),
        LogPageId::COMMANDS_SUPPORTED_AND_EFFECTS => (effects_log(&ctx.shared.config), None),
        LogPageId::DEVICE_SELF_TEST => (shared.self_test.log().as_bytes().to_vec(), None),
        LogPageId::SANITIZE_STATUS => (
            super::sanitize::log(shared),
            Some(async_event::TYPE_IO_COMMAND_SET),
        ),
        _ => return Err(invalid_field()),
    };
    let start = usize::try_from(req.offset)
        .ok()
        .filter(|&o| o < page.len())
        .ok_or_else(invalid_field)?;
    // Data past the end of the log reads as zeroes.
    let mut out = page.get(start..).unwrap_or_default().to_vec();
    out.resize(len as usize, 0);
    ctx.send(cmd, &out)?;
    if req.lid == LogPageId::CHANGED_NAMESPACES && !req.rae {
        // Clear what the host has now seen: a change that arrived after the
        // page was taken stays for the next read.
        shared.subsystem.changed.lock().acknowledge(&page);
    }
    if let Some(kind) = event_type {
        if !req.rae {
            shared.events.lock().masked &= !(1u8 << kind);
        }
    }
    Ok(())
}

fn error_log(shared: &Shared) -> Vec<u8> {
    let log = shared.error_log.lock();
    let mut page = Vec::with_capacity((usize::from(ELPE) + 1) * 64);
    for e in &log.entries {
        page.extend_from_slice(e.as_bytes());
    }
    page.resize((usize::from(ELPE) + 1) * 64, 0);
    page
}

fn smart_log(shared: &Shared) -> Vec<u8> {
    let s = &shared.stats;
    let mut log = SmartLog::new_boxed();
    log.composite_temperature = 313u16.into();
    log.available_spare = 100;
    log.available_spare_threshold = 10;
    // Data units are thousands of 512-byte units, rounded up.
    let units = |n: u64| u128::from(n.div_ceil(1000));
    set_u128(
        &mut log.data_units_read,
        units(s.data_units_read_512.load(Relaxed)),
    );
    set_u128(
        &mut log.data_units_written,
        units(s.data_units_written_512.load(Relaxed)),
    );
    set_u128(
        &mut log.host_read_commands,
        u128::from(s.host_read_commands.load(Relaxed)),
    );
    set_u128(
        &mut log.host_write_commands,
        u128::from(s.host_write_commands.load(Relaxed)),
    );
    set_u128(
        &mut log.power_cycles,
        u128::from(s.power_cycles.load(Relaxed)),
    );
    set_u128(&mut log.power_on_hours, u128::from(shared.power_on_hours()));
    set_u128(
        &mut log.unsafe_shutdowns,
        u128::from(s.unsafe_shutdowns.load(Relaxed)),
    );
    set_u128(
        &mut log.media_errors,
        u128::from(s.media_errors.load(Relaxed)),
    );
    set_u128(
        &mut log.error_log_entries,
        u128::from(shared.error_log.lock().count),
    );
    log.as_bytes().to_vec()
}

fn firmware_slot_log(shared: &Shared) -> Vec<u8> {
    let mut page = vec![0u8; 512];
    // AFI: slot 1 active.
    page[0] = 1;
    let mut fr = [b' '; 8];
    vnvme_spec::identify::fill_ascii(&mut fr, &shared.config.firmware);
    page[8..16].copy_from_slice(&fr);
    page
}

fn effects_log(config: &crate::ControllerConfig) -> Vec<u8> {
    let mut log = CommandEffectsLog::new_boxed();
    for op in super::SUPPORTED
        .iter()
        .filter(|&&op| super::supported(op, config))
    {
        // What a host must rescan after the command (Linux does after
        // passthrough commands with NCC or NIC).
        let extra = match *op {
            AdminOpcode::NAMESPACE_MANAGEMENT | AdminOpcode::NAMESPACE_ATTACHMENT => {
                effects::NIC | effects::NCC
            }
            AdminOpcode::FORMAT_NVM => effects::LBCC | effects::NCC,
            AdminOpcode::SANITIZE => effects::LBCC,
            _ => 0,
        };
        if let Some(e) = log.acs.get_mut(usize::from(op.0)) {
            *e = U32::new(effects::CSUPP | extra);
        }
    }
    for op in crate::io::SUPPORTED {
        let lbcc = crate::io::WRITES_USER_DATA.contains(op);
        if let Some(e) = log.iocs.get_mut(usize::from(op.0)) {
            *e = U32::new(effects::CSUPP | if lbcc { effects::LBCC } else { 0 });
        }
    }
    for (op, bits) in config.vendor.effects(CommandSet::Admin) {
        if let Some(e) = log.acs.get_mut(usize::from(op)) {
            *e = U32::new(bits);
        }
    }
    for (op, bits) in config.vendor.effects(CommandSet::Io) {
        if let Some(e) = log.iocs.get_mut(usize::from(op)) {
            *e = U32::new(bits);
        }
    }
    log.as_bytes().to_vec()
}
