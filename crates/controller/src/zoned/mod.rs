//! Zoned namespaces (NVMe Zoned Namespace Command Set 1.1, "ZNS"): a
//! namespace cut into zones of `zsze` logical blocks, each written only
//! sequentially at its write pointer, with states a host opens, closes,
//! finishes and resets (§2.1).
//!
//! [`ZonedConfig`] is what a user asks for, in bytes; [`Zones`] is one
//! namespace's zones in logical blocks of its format, with their states
//! and write pointers behind one lock. One lock for all zones, because the
//! open and active resources (MOR, MAR) are counted across the namespace:
//! a write's check of its zone, its implicit open (which may close another
//! zone) and its move of the write pointer happen as one step, so two
//! queues writing at the same write pointer cannot both succeed (the
//! second gets Zone Invalid Write).
//!
//! The zone states live in memory: a server that restarts reports every
//! zone empty. The controller changes a zone's state by itself only when
//! the operator says so ([`Zones::change`]: read only or offline, as zones
//! of a worn device go; finished; a finish or reset recommended), which
//! lists the zone in the namespace's Changed Zone List; zones can also
//! start read only
//! ([`ZonedConfig::read_only_zones`]).

mod changed;
mod record;
mod saved;
mod table;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use parking_lot::Mutex;
use vnvme_spec::status::invalid_field;
use vnvme_spec::zns::{ZoneDescriptor, ZDES_UNIT};
use vnvme_spec::Status;

use changed::ChangedZones;
use record::ZoneRecord;
pub use record::{ZoneRecorder, MAX_RECORDED_ZCAP};
pub(crate) use saved::SavedZones;
use table::Table;
pub(crate) use table::ZoneAction;

/// Zones per namespace at most: the table holds 16 bytes per zone.
pub const MAX_ZONES: u64 = 1 << 20;

/// Largest zone descriptor extension: ZDES is a byte of 64-byte units.
pub const MAX_ZONE_EXTENSION: u32 = 255 * ZDES_UNIT as u32;

/// Memory all of a namespace's zone descriptor extensions may take: a
/// guest can set one on every zone.
pub const MAX_EXTENSION_BYTES: u64 = 64 << 20;

/// A zoned namespace as configured, in bytes of logical block data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZonedConfig {
    /// Zone size: a power of two, at least 4096 (Linux refuses zone sizes
    /// that are not a power of two in logical blocks).
    pub zone_size: u64,
    /// Zone capacity: the writable part of each zone, a multiple of 4096
    /// in `4096..=zone_size`.
    pub zone_capacity: u64,
    /// Maximum Open Resources: zones implicitly or explicitly open at once
    /// (`None`: no limit).
    pub max_open: Option<u32>,
    /// Maximum Active Resources: zones open or closed at once (`None`: no
    /// limit). At least `max_open`.
    pub max_active: Option<u32>,
    /// The last this many zones start read only (as zones of a worn device
    /// would be): Zone Is Read Only to writes, and the Offline action takes
    /// them offline.
    pub read_only_zones: u32,
    /// Zone descriptor extension size in bytes: a multiple of 64 up to
    /// 16320 bytes (ZDES = this / 64, a byte); 0 for none.
    pub extension_size: u32,
}

impl ZonedConfig {
    /// Zones of `zone_size` bytes, as writable, no open or active limit.
    pub fn new(zone_size: u64) -> Self {
        Self {
            zone_size,
            zone_capacity: zone_size,
            max_open: None,
            max_active: None,
            read_only_zones: 0,
            extension_size: 0,
        }
    }

    /// Checks what does not depend on the namespace's size.
    pub fn validate(&self) -> Result<(), ZonedError> {
        if self.zone_size < 4096 || !self.zone_size.is_power_of_two() {
            return Err(ZonedError::ZoneSize(self.zone_size));
        }
        let cap = self.zone_capacity;
        if cap < 4096 || cap > self.zone_size || !cap.is_multiple_of(4096) {
            return Err(ZonedError::ZoneCapacity {
                capacity: cap,
                size: self.zone_size,
            });
        }
        let ext = self.extension_size;
        if ext > MAX_ZONE_EXTENSION || !ext.is_multiple_of(ZDES_UNIT as u32) {
            return Err(ZonedError::ExtensionSize(ext));
        }
        match (self.max_open, self.max_active) {
            (Some(0), _) | (_, Some(0)) => Err(ZonedError::ZeroLimit),
            (Some(open), Some(active)) if open > active => {
                Err(ZonedError::OpenAboveActive { open, active })
            }
            _ => Ok(()),
        }
    }
}

/// A zoned namespace configuration that cannot be served.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ZonedError {
    #[error("zone size {0} must be a power of two of at least 4096 bytes (Linux refuses others)")]
    ZoneSize(u64),
    #[error("zone capacity {capacity} must be a multiple of 4096 bytes from 4096 to the zone size {size}")]
    ZoneCapacity { capacity: u64, size: u64 },
    #[error("max-open and max-active must be at least 1 (leave them out for no limit)")]
    ZeroLimit,
    #[error("max-open {open} is more than max-active {active}: an open zone is also active")]
    OpenAboveActive { open: u32, active: u32 },
    #[error("the namespace holds {blocks} logical blocks, less than one zone of {zsze}")]
    NoZone { blocks: u64, zsze: u64 },
    #[error("{zones} zones are more than {MAX_ZONES}: use a larger zone size")]
    TooManyZones { zones: u64 },
    #[error("{limit} ({value}) is more than the namespace's {zones} zones")]
    LimitAboveZones {
        limit: &'static str,
        value: u32,
        zones: u64,
    },
    #[error("zone descriptor extension size {0} must be a multiple of 64 bytes up to {MAX_ZONE_EXTENSION}")]
    ExtensionSize(u32),
    #[error("{zones} zones with {size}-byte descriptor extensions take more than {MAX_EXTENSION_BYTES} bytes: use a larger zone size or a smaller extension")]
    ExtensionsTooLarge { zones: u64, size: u32 },
    #[error(
        "the backend could not be emptied (a zoned namespace starts with every zone empty): {0}"
    )]
    Discard(String),
}

/// What the controller does to a zone by itself, as a worn or busy
/// device would, when the operator says so
/// ([`Controller::zone_set_state`](crate::Controller::zone_set_state)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneChange {
    /// ZSRO: readable, never written again (from any state but offline).
    ReadOnly,
    /// ZSO: neither read nor written (from any state).
    Offline,
    /// ZSF with Zone Finished by Controller (ZFC): an open or closed zone
    /// finished by the controller.
    Finished,
    /// The Finish Zone Recommended attribute (FZR) on an open or closed
    /// zone, state unchanged.
    FinishRecommended,
    /// The Reset Zone Recommended attribute (RZR) on an open, closed or
    /// full zone, state unchanged.
    ResetRecommended,
}

impl ZoneChange {
    /// As the control socket names it.
    pub fn name(self) -> &'static str {
        match self {
            ZoneChange::ReadOnly => "read-only",
            ZoneChange::Offline => "offline",
            ZoneChange::Finished => "full",
            ZoneChange::FinishRecommended => "finish-recommended",
            ZoneChange::ResetRecommended => "reset-recommended",
        }
    }
}

/// Why an operator's zone change was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ZoneOpError {
    #[error("namespace {0} does not exist")]
    NoSuchNamespace(u32),
    #[error("namespace {0} is not zoned")]
    NotZoned(u32),
    #[error("LBA {0} is past the last zone")]
    OutOfRange(u64),
    #[error("LBA {lba} is not a zone start (zones are {zsze} blocks)")]
    NotZoneStart { lba: u64, zsze: u64 },
    #[error("the zone is offline: an offline zone never changes state again")]
    AlreadyOffline,
    #[error("{change} applies to {applies} zones; this one is {state}")]
    Inapplicable {
        change: &'static str,
        applies: &'static str,
        state: &'static str,
    },
}

/// One namespace's zones.
#[derive(Debug)]
pub(crate) struct Zones {
    pub config: ZonedConfig,
    /// Zone size and capacity in logical blocks (ZSZE, ZCAP).
    pub zsze: u64,
    pub zcap: u64,
    /// Number of zones; the namespace has `count * zsze` blocks.
    pub count: u64,
    table: Mutex<Table>,
    /// Zones offline: reads check their zones only while there are any.
    offline: AtomicU32,
    /// The Changed Zone List (log page BFh).
    changed: Mutex<ChangedZones>,
    /// Under `--supervise`, where each change is recorded (`record.rs`).
    record: OnceLock<ZoneRecord>,
}

impl Zones {
    /// The zones of a namespace of `nsze` blocks of `1 << lba_shift` data
    /// bytes: every zone empty but the read-only ones.
    pub fn new(config: ZonedConfig, nsze: u64, lba_shift: u8) -> Result<Self, ZonedError> {
        config.validate()?;
        let zsze = config.zone_size >> lba_shift;
        let zcap = config.zone_capacity >> lba_shift;
        let count = nsze / zsze;
        if count == 0 {
            return Err(ZonedError::NoZone { blocks: nsze, zsze });
        }
        if count > MAX_ZONES {
            return Err(ZonedError::TooManyZones { zones: count });
        }
        let limits = [
            ("max-open", config.max_open.unwrap_or(0)),
            ("max-active", config.max_active.unwrap_or(0)),
            ("ro-zones", config.read_only_zones),
        ];
        for (limit, value) in limits {
            if u64::from(value) > count {
                return Err(ZonedError::LimitAboveZones {
                    limit,
                    value,
                    zones: count,
                });
            }
        }
        let ext = config.extension_size;
        if count * u64::from(ext) > MAX_EXTENSION_BYTES {
            return Err(ZonedError::ExtensionsTooLarge {
                zones: count,
                size: ext,
            });
        }
        let table = Table::new(count, config.read_only_zones, zcap, ext as usize);
        Ok(Self {
            config,
            zsze,
            zcap,
            count,
            table: Mutex::new(table),
            offline: AtomicU32::new(0),
            changed: Mutex::new(ChangedZones::default()),
            record: OnceLock::new(),
        })
    }

    /// Zone descriptor extension size in bytes (0: none).
    pub fn extension_size(&self) -> usize {
        self.config.extension_size as usize
    }

    /// The zone starting at `zslba`: LBA Out of Range past the last zone,
    /// Invalid Field if `zslba` is not a zone start.
    pub fn zone_start(&self, zslba: u64) -> Result<usize, Status> {
        let i = self.index(zslba).ok_or(lba_out_of_range())?;
        if !zslba.is_multiple_of(self.zsze) {
            return Err(invalid_field());
        }
        Ok(i)
    }

    /// Set Zone Descriptor Extension on the zone starting at `zslba`
    /// (§3.4.3.6): `data` is its extension, as the host sent it.
    pub fn set_extension(&self, zslba: u64, data: &[u8]) -> Result<(), Status> {
        let i = self.zone_start(zslba)?;
        let mut table = self.table.lock();
        let r = table.set_extension(i, data, self.limits());
        self.keep(&mut table, None);
        r
    }

    /// The controller changes the zone starting at `zslba` by itself
    /// (the operator said so): it is listed in the Changed Zone List.
    /// `Ok(false)`: it already was so (not listed again).
    pub fn change(&self, zslba: u64, to: ZoneChange) -> Result<bool, ZoneOpError> {
        let i = self.index(zslba).ok_or(ZoneOpError::OutOfRange(zslba))?;
        if !zslba.is_multiple_of(self.zsze) {
            return Err(ZoneOpError::NotZoneStart {
                lba: zslba,
                zsze: self.zsze,
            });
        }
        let mut table = self.table.lock();
        let changed = table.change(i, to, self.zcap);
        self.keep(&mut table, None);
        let changed = changed?;
        self.offline.store(table.offline(), Ordering::Relaxed);
        if changed {
            // Listed before the table lock is let go: a host that sees
            // the new state in a report finds the zone in the log too.
            self.changed.lock().add(zslba);
        }
        Ok(changed)
    }

    /// The Changed Zone List log page (4 KiB).
    pub fn changed_zone_list(&self) -> Vec<u8> {
        self.changed.lock().page()
    }

    /// The host read `page` of the Changed Zone List without RAE.
    pub fn changed_zone_list_seen(&self, page: &[u8]) {
        self.changed.lock().acknowledge(page);
    }

    /// The namespace size in blocks: whole zones only.
    pub fn nsze(&self) -> u64 {
        self.count * self.zsze
    }

    /// The zone holding `lba`; `None` past the last zone.
    fn index(&self, lba: u64) -> Option<usize> {
        let i = lba / self.zsze;
        (i < self.count).then_some(i as usize)
    }

    /// A Write (or Write Zeroes, Write Uncorrectable) of `nlb` blocks at
    /// `slba` (in range of the namespace): checked against its zone and
    /// written there, moving the write pointer (§2.1.1, §3.4.x).
    pub fn write(&self, slba: u64, nlb: u64) -> Result<(), Status> {
        let i = self.index(slba).ok_or(lba_out_of_range())?;
        let offset = slba % self.zsze;
        let mut table = self.table.lock();
        let r = table.write(i, Some(offset), nlb, self.limits());
        let end = offset.saturating_add(nlb);
        self.keep(&mut table, r.is_ok().then_some((i, offset, end)));
        r.map(|_| ())
    }

    /// A Zone Append of `nlb` blocks to the zone starting at `zslba`:
    /// the LBA it was written at (§3.4.1).
    pub fn append(&self, zslba: u64, nlb: u64) -> Result<u64, Status> {
        let i = self.zone_start(zslba)?;
        let mut table = self.table.lock();
        let offset = table.write(i, None, nlb, self.limits());
        self.keep(&mut table, None);
        Ok(zslba + offset?)
    }

    /// A read of `nlb` blocks at `slba`: Zone Is Offline if it reaches an
    /// offline zone. Reads may cross zone boundaries (OZCS.RAZB).
    pub fn check_read(&self, slba: u64, nlb: u64) -> Result<(), Status> {
        if self.offline.load(Ordering::Relaxed) == 0 || nlb == 0 {
            return Ok(());
        }
        let (Some(first), Some(last)) = (self.index(slba), self.index(slba + nlb - 1)) else {
            return Err(lba_out_of_range());
        };
        self.table.lock().check_online(first..last + 1)
    }

    /// Zone Management Send action `action` on the zone starting at
    /// `slba`, or on every zone in a state it applies to (`select_all`).
    /// `erase` runs for each zone reset that held data, before anything
    /// can be written there again.
    pub fn send(
        &self,
        action: ZoneAction,
        select_all: bool,
        slba: u64,
        erase: &mut dyn FnMut(u64) -> Result<(), Status>,
    ) -> Result<(), Status> {
        let zones = if select_all {
            0..self.count as usize
        } else {
            let i = self.zone_start(slba)?;
            i..i + 1
        };
        let mut table = self.table.lock();
        let mut reset = Vec::new();
        let r = table.act(action, zones, select_all, self.limits(), &mut reset);
        self.keep(&mut table, None);
        self.offline.store(table.offline(), Ordering::Relaxed);
        // Erased under the lock: a write after the reset cannot land
        // before the erase and be lost to it.
        for i in reset {
            erase(i as u64 * self.zsze)?;
        }
        r
    }

    /// Every zone that can be reset is empty (a sanitize erased them).
    pub fn empty_all(&self) {
        let mut nothing_to_erase = |_| Ok(());
        // Select All skips the zones a reset does not apply to: no error.
        let _ = self.send(ZoneAction::Reset, true, 0, &mut nothing_to_erase);
    }

    /// Report Zones: the descriptors of the zones from the one holding
    /// `slba` on whose state matches `filter` (a ZRASF value), at most
    /// `max`, and how many match in all (or, `partial`, how many were
    /// given).
    #[cfg(test)]
    pub fn report(
        &self,
        slba: u64,
        filter: u8,
        partial: bool,
        max: usize,
    ) -> Result<(u64, Vec<ZoneDescriptor>), Status> {
        let mut out = Vec::new();
        let n = self.report_with(slba, filter, partial, max, |d, _| out.push(d))?;
        Ok((n, out))
    }

    /// Report Zones and Extended Report Zones: `each` is given the
    /// descriptor and the descriptor extension (zeroes without ZDEV) of
    /// the zones from the one holding `slba` on whose state matches
    /// `filter` (a ZRASF value), at most `max` of them. Returns how many
    /// match in all (or, `partial`, how many were given).
    pub fn report_with(
        &self,
        slba: u64,
        filter: u8,
        partial: bool,
        max: usize,
        mut each: impl FnMut(ZoneDescriptor, &[u8]),
    ) -> Result<u64, Status> {
        let first = self.index(slba).ok_or(lba_out_of_range())?;
        let table = self.table.lock();
        let mut given = 0usize;
        let mut matching = 0u64;
        for (i, zone) in table.zones().iter().enumerate().skip(first) {
            if !zone.matches(filter) {
                continue;
            }
            matching += 1;
            if given < max {
                let zslba = i as u64 * self.zsze;
                each(zone.descriptor(zslba, self.zcap), table.extension(i));
                given += 1;
            } else if partial {
                break;
            }
        }
        Ok(if partial { given as u64 } else { matching })
    }

    /// Zones open and active now, for tests.
    #[cfg(test)]
    pub fn resources(&self) -> (u32, u32) {
        self.table.lock().resources()
    }

    fn limits(&self) -> table::Limits {
        table::Limits {
            zcap: self.zcap,
            mor: self.config.max_open,
            mar: self.config.max_active,
        }
    }
}

fn lba_out_of_range() -> Status {
    Status::LBA_OUT_OF_RANGE.with_dnr(true)
}

#[cfg(test)]
mod tests;
