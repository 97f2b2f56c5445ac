//! Get Log Page (§5.16): the table of log pages this controller answers,
//! and the small logs: supported log pages, error information, SMART /
//! health, firmware slot, changed namespace list, ANA, commands supported and
//! effects (including the registered vendor specific opcodes), device
//! self-test, sanitize status, reservation notification. Telemetry,
//! endurance group and persistent event logs have modules of their own.

mod endurance;
mod persistent_event;
mod telemetry;

use std::sync::atomic::Ordering::Relaxed;

use vnvme_spec::log::{
    async_event, effects, set_u128, supported_log_pages, Cdw14GetLogPage, CommandEffectsLog,
    GetLogPage, LogPageId, SmartLog,
};
use vnvme_spec::{AdminOpcode, Command, NvmOpcode, Status};
use zerocopy::little_endian::U32;
use zerocopy::IntoBytes;

use super::invalid_field;
use crate::command::Ctx;
use crate::reporting::{Reporting, ELPE};
use crate::state::Shared;
use crate::stats::Stats;
use crate::subsystem::Subsystem;
use crate::vendor::CommandSet;

/// A Get Log Page command's fields, for a log's reader.
struct Request<'a> {
    shared: &'a Shared,
    nsid: u32,
    lsp: u8,
    lsi: u16,
    rae: bool,
    offset: u64,
    /// Command Set Identifier (CDW14): whose commands the Commands
    /// Supported and Effects log lists.
    csi: u8,
}

/// One log page this controller answers.
struct LogPage {
    lid: LogPageId,
    /// The page from byte 0, or a refusal. An empty page completes the
    /// command without transferring data (an action that returns none).
    read: fn(&Request<'_>) -> Result<Vec<u8>, Status>,
    /// Runs once the host has the data (`page`), to forget what it has now
    /// seen.
    seen: Option<fn(&Request<'_>, &[u8])>,
    /// The asynchronous event type reading without RAE unmasks (§5.2).
    event: Option<u8>,
}

/// Every log page: Get Log Page answers only these, and Supported Log
/// Pages lists exactly these, so a log cannot be one without the other.
const LOGS: &[LogPage] = &[
    LogPage {
        lid: LogPageId::SUPPORTED_LOG_PAGES,
        read: |_| Ok(supported_log_pages()),
        seen: None,
        event: None,
    },
    LogPage {
        lid: LogPageId::ERROR_INFORMATION,
        read: |r| Ok(error_log(&r.shared.reporting)),
        seen: None,
        event: Some(async_event::TYPE_ERROR),
    },
    LogPage {
        lid: LogPageId::SMART_HEALTH,
        read: smart_log,
        seen: None,
        event: Some(async_event::TYPE_SMART),
    },
    LogPage {
        lid: LogPageId::FIRMWARE_SLOT,
        read: |r| Ok(firmware_slot_log(&r.shared.subsystem)),
        seen: None,
        // Firmware Activation Starting is a notice read through this log.
        event: Some(async_event::TYPE_NOTICE),
    },
    LogPage {
        lid: LogPageId::CHANGED_NAMESPACES,
        read: |r| Ok(r.shared.subsystem.changed.lock().page()),
        seen: Some(|r, page| {
            // Clear what the host has now seen: a change that arrived after
            // the page was taken stays for the next read.
            if !r.rae {
                r.shared.subsystem.changed.lock().acknowledge(page);
            }
        }),
        event: Some(async_event::TYPE_NOTICE),
    },
    LogPage {
        lid: LogPageId::COMMANDS_SUPPORTED_AND_EFFECTS,
        read: |r| Ok(effects_log(&r.shared.config, r.csi)),
        seen: None,
        event: None,
    },
    LogPage {
        lid: LogPageId::TELEMETRY_HOST_INITIATED,
        read: telemetry::host_initiated,
        seen: None,
        event: None,
    },
    LogPage {
        lid: LogPageId::TELEMETRY_CONTROLLER_INITIATED,
        read: telemetry::controller_initiated,
        seen: Some(telemetry::release_controller_initiated),
        event: None,
    },
    LogPage {
        lid: LogPageId::ENDURANCE_GROUP_INFORMATION,
        read: endurance::information,
        seen: None,
        event: None,
    },
    LogPage {
        lid: LogPageId::ANA,
        read: |r| Ok(ana_log(r)),
        seen: None,
        // ANA Change is a notice read through this log.
        event: Some(async_event::TYPE_NOTICE),
    },
    LogPage {
        lid: LogPageId::PERSISTENT_EVENT,
        read: persistent_event::read,
        seen: None,
        event: None,
    },
    LogPage {
        lid: LogPageId::DEVICE_SELF_TEST,
        read: |r| Ok(r.shared.self_test.log().as_bytes().to_vec()),
        seen: None,
        event: None,
    },
    LogPage {
        lid: LogPageId(vnvme_spec::zns::CHANGED_ZONE_LIST_LID),
        read: |r| Ok(super::zns::changed_zone_list(&r.shared.subsystem, r.nsid)),
        seen: Some(|r, page| {
            if !r.rae {
                super::zns::changed_zone_list_seen(&r.shared.subsystem, r.nsid, page);
            }
        }),
        // Zone Descriptor Changed is a notice read through this log.
        event: Some(async_event::TYPE_NOTICE),
    },
    LogPage {
        lid: LogPageId::SANITIZE_STATUS,
        read: |r| Ok(super::sanitize::log(r.shared)),
        seen: None,
        // Sanitize Operation Completed is an I/O command set specific event.
        event: Some(async_event::TYPE_IO_COMMAND_SET),
    },
    LogPage {
        lid: LogPageId::RESERVATION_NOTIFICATION,
        read: |r| Ok(r.shared.reporting.reservation_notices.lock().page()),
        // Read is gone (RAE keeps the event masked, not the page): the
        // host learns of the rest from Number of Available Log Pages.
        seen: Some(|r, page| {
            r.shared.reporting.reservation_notices.lock().seen(page);
        }),
        // Reservation Log Page Available is an I/O command specific event.
        event: Some(async_event::TYPE_IO_COMMAND_SET),
    },
];

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
    // No log takes index offsets (Supported Log Pages IOS is clear).
    if Cdw14GetLogPage::from(cmd.cdw14).ot() {
        return Err(invalid_field());
    }
    let log = LOGS
        .iter()
        .find(|l| l.lid == req.lid)
        .ok_or_else(invalid_field)?;
    let shared = ctx.shared;
    let r = Request {
        shared,
        nsid: cmd.nsid.get(),
        lsp: req.lsp,
        lsi: req.lsi,
        rae: req.rae,
        offset: req.offset,
        csi: Cdw14GetLogPage::from(cmd.cdw14).csi(),
    };
    let page = (log.read)(&r)?;
    if !page.is_empty() {
        let start = usize::try_from(req.offset)
            .ok()
            .filter(|&o| o < page.len())
            .ok_or_else(invalid_field)?;
        // Data past the end of the log reads as zeroes.
        let mut out = page.get(start..).unwrap_or_default().to_vec();
        out.resize(len as usize, 0);
        ctx.send(cmd, &out)?;
    }
    if let Some(seen) = log.seen {
        seen(&r, &page);
    }
    if let Some(kind) = log.event {
        if !req.rae {
            shared.reporting.events.lock().masked &= !(1u8 << kind);
        }
    }
    Ok(())
}

/// Supported Log Pages (00h): LSUPP for every entry of [`LOGS`].
fn supported_log_pages() -> Vec<u8> {
    let mut page = vec![0u8; supported_log_pages::ENTRIES * 4];
    for log in LOGS {
        let at = usize::from(log.lid.0) * 4;
        page[at..at + 4].copy_from_slice(&supported_log_pages::LSUPP.to_le_bytes());
    }
    page
}

/// Asymmetric Namespace Access log (0Ch): a group per namespace attached to
/// this controller (ANAGRPID = NSID), its state on this controller; LSP
/// bit 0 (RGO): the groups without their NSIDs.
fn ana_log(r: &Request<'_>) -> Vec<u8> {
    let namespaces = &r.shared.subsystem.namespaces;
    let groups: Vec<(u32, Vec<u32>)> = namespaces
        .ids_after(0, true, usize::MAX)
        .into_iter()
        .map(|nsid| (nsid, vec![nsid]))
        .collect();
    let ana = &namespaces.table().ana;
    ana.log_page(namespaces.cntlid(), &groups, r.lsp & 1 != 0)
}

fn error_log(reporting: &Reporting) -> Vec<u8> {
    let log = reporting.error_log.lock();
    let mut page = Vec::with_capacity((usize::from(ELPE) + 1) * 64);
    for e in &log.entries {
        page.extend_from_slice(e.as_bytes());
    }
    page.resize((usize::from(ELPE) + 1) * 64, 0);
    page
}

/// The counters the SMART / Health and Endurance Group Information logs
/// both report (one endurance group holds every namespace).
struct Health {
    /// Data Units: thousands of 512-byte units, rounded up.
    data_units_read: u128,
    data_units_written: u128,
    host_read_commands: u128,
    host_write_commands: u128,
    media_errors: u128,
    error_log_entries: u128,
}

impl Health {
    fn of(s: &Stats, reporting: &Reporting) -> Self {
        let count = |c: &std::sync::atomic::AtomicU64| u128::from(c.load(Relaxed));
        let data_units = |units_512: u64| u128::from(units_512.div_ceil(1000));
        Self {
            data_units_read: data_units(s.data_units_read_512()),
            data_units_written: data_units(s.data_units_written_512()),
            host_read_commands: u128::from(s.host_read_commands()),
            host_write_commands: u128::from(s.host_write_commands()),
            media_errors: count(&s.media_errors),
            error_log_entries: u128::from(reporting.error_log.lock().count),
        }
    }
}

fn smart_log(req: &Request<'_>) -> Result<Vec<u8>, Status> {
    if req.nsid != 0 && req.nsid != 0xFFFF_FFFF {
        return Err(invalid_field());
    }
    let shared = req.shared;
    let s = &shared.stats;
    let mut log = SmartLog::new_boxed();
    // Critical warnings a fault raised, with the values that explain them:
    // a temperature over the threshold (343 K by default), spare under it.
    let warning = shared.faults.smart_warning.load(Relaxed);
    log.critical_warning = warning;
    log.composite_temperature = if warning & 0x2 != 0 { 358 } else { 313u16 }.into();
    log.available_spare = if warning & 0x1 != 0 { 5 } else { 100 };
    log.available_spare_threshold = 10;
    let h = Health::of(&shared.stats, &shared.reporting);
    set_u128(&mut log.data_units_read, h.data_units_read);
    set_u128(&mut log.data_units_written, h.data_units_written);
    set_u128(&mut log.host_read_commands, h.host_read_commands);
    set_u128(&mut log.host_write_commands, h.host_write_commands);
    set_u128(
        &mut log.power_cycles,
        u128::from(s.power_cycles.load(Relaxed)),
    );
    set_u128(
        &mut log.power_on_hours,
        u128::from(shared.lifecycle.power_on_hours()),
    );
    set_u128(
        &mut log.unsafe_shutdowns,
        u128::from(s.unsafe_shutdowns.load(Relaxed)),
    );
    set_u128(&mut log.media_errors, h.media_errors);
    set_u128(&mut log.error_log_entries, h.error_log_entries);
    Ok(log.as_bytes().to_vec())
}

fn firmware_slot_log(subsystem: &Subsystem) -> Vec<u8> {
    subsystem.firmware.lock().slot_log().as_bytes().to_vec()
}

/// Commands Supported and Effects (05h) of command set `csi`: the I/O
/// commands of the Zoned Namespace Command Set (CSI 02h) are the NVM
/// ones but Copy, and its own (Linux makes a zoned namespace read only
/// unless Zone Append is listed); any other CSI gets the NVM ones.
fn effects_log(config: &crate::ControllerConfig, csi: u8) -> Vec<u8> {
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
    let zoned = csi == vnvme_spec::identify::csi::ZNS;
    let zone_ops = crate::io::ZONE_OPCODES.iter().filter(|_| zoned);
    let io_ops = crate::io::SUPPORTED.iter().chain(zone_ops);
    for op in io_ops.filter(|&&op| !(zoned && op == NvmOpcode::COPY)) {
        let lbcc = crate::io::WRITES_USER_DATA.contains(op)
            || *op == NvmOpcode::ZONE_APPEND
            || *op == NvmOpcode::ZONE_MGMT_SEND;
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
