//! A zoned namespace's zones in the saved state (docs/state-format.md,
//! `namespaces[].zones`): the configuration they were cut with, each
//! zone's state, write pointer and attributes, the implicitly opened
//! zones in the order the controller closes them, the descriptor
//! extensions and the Changed Zone List. Open and active counts follow
//! from the states.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};
use vnvme_spec::zns::CHANGED_ZONE_LIST_ENTRIES;

use super::changed::ChangedZones;
use super::table::{State, Zone};
use super::{ZonedConfig, Zones};
use crate::saved_check::{at_most, hex, inconsistent, same, InvalidState};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedZones {
    /// Zone size and capacity in bytes of data.
    pub zone_size: u64,
    pub zone_capacity: u64,
    pub max_open: Option<u32>,
    pub max_active: Option<u32>,
    pub read_only_zones: u32,
    pub extension_size: u32,
    /// Per zone: [Zone State (ZNS Figure 37's ZS value), blocks written
    /// from its start, Zone Attributes].
    pub zones: Vec<(u8, u64, u8)>,
    /// Implicitly opened zones (indexes), oldest first.
    pub implicit: Vec<usize>,
    /// Zone descriptor extensions, `extension_size` bytes per zone.
    #[serde(with = "hex")]
    pub extensions: Vec<u8>,
    /// The Changed Zone List: ZSLBAs, or overflowed.
    pub changed: BTreeSet<u64>,
    pub changed_overflow: bool,
}

const STATES: [State; 7] = [
    State::Empty,
    State::ImplicitlyOpened,
    State::ExplicitlyOpened,
    State::Closed,
    State::Full,
    State::ReadOnly,
    State::Offline,
];

impl Zones {
    pub fn save(&self) -> SavedZones {
        let table = self.table.lock();
        let changed = self.changed.lock();
        let c = self.config;
        SavedZones {
            zone_size: c.zone_size,
            zone_capacity: c.zone_capacity,
            max_open: c.max_open,
            max_active: c.max_active,
            read_only_zones: c.read_only_zones,
            extension_size: c.extension_size,
            zones: (table.zones.iter())
                .map(|z| (z.state.zs(), z.written, z.za))
                .collect(),
            implicit: table.implicit.iter().copied().collect(),
            extensions: table.ext.clone(),
            changed: changed.zslbas.clone(),
            changed_overflow: changed.overflow,
        }
    }

    /// The saved zones of a namespace of `nsze` blocks: cut again from
    /// the saved configuration (which checks it), then each zone's state
    /// checked against the limits before it is taken.
    pub fn restored(saved: &SavedZones, nsze: u64, lba_shift: u8) -> Result<Self, InvalidState> {
        let config = ZonedConfig {
            zone_size: saved.zone_size,
            zone_capacity: saved.zone_capacity,
            max_open: saved.max_open,
            max_active: saved.max_active,
            read_only_zones: saved.read_only_zones,
            extension_size: saved.extension_size,
        };
        let zones = Self::new(config, nsze, lba_shift)
            .map_err(|e| inconsistent(format!("the zones: {e}")))?;
        same("the number of zones", saved.zones.len() as u64, zones.count)?;
        let mut list = Vec::with_capacity(saved.zones.len());
        let (mut open, mut active) = (0u32, 0u32);
        for (i, &(zs, written, za)) in saved.zones.iter().enumerate() {
            let state = STATES
                .into_iter()
                .find(|s| s.zs() == zs)
                .ok_or_else(|| inconsistent(format!("zone {i}'s state {zs:#x} is unknown")))?;
            at_most(format!("zone {i}'s blocks written"), written, zones.zcap)?;
            open += u32::from(state.is_open());
            active += u32::from(state.is_active());
            list.push(Zone { state, written, za });
        }
        if let Some(mor) = config.max_open {
            at_most("the open zones", u64::from(open), u64::from(mor))?;
        }
        if let Some(mar) = config.max_active {
            at_most("the active zones", u64::from(active), u64::from(mar))?;
        }
        let mut seen = BTreeSet::new();
        for &i in &saved.implicit {
            let implicit = list
                .get(i)
                .is_some_and(|z| z.state == State::ImplicitlyOpened);
            if !implicit || !seen.insert(i) {
                return Err(inconsistent(format!(
                    "zone {i} is listed as implicitly opened, and is not (or twice)"
                )));
            }
        }
        same(
            "the zone descriptor extensions' length",
            saved.extensions.len() as u64,
            zones.count * u64::from(config.extension_size),
        )?;
        at_most(
            "the Changed Zone List's entries",
            saved.changed.len() as u64,
            CHANGED_ZONE_LIST_ENTRIES as u64,
        )?;
        {
            let mut table = zones.table.lock();
            table.zones = list;
            table.open = open;
            table.active = active;
            table.implicit = saved.implicit.iter().copied().collect::<VecDeque<_>>();
            table.ext = saved.extensions.clone();
            zones.offline.store(table.offline(), Ordering::Relaxed);
        }
        *zones.changed.lock() = ChangedZones {
            zslbas: saved.changed.clone(),
            overflow: saved.changed_overflow,
        };
        Ok(zones)
    }
}
