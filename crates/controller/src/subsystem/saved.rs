//! The NVM subsystem in the saved state (docs/state-format.md,
//! `subsystem`): the namespaces (allocated and attached, with their
//! formats, reservations, zones), the Changed Namespace List and the
//! firmware slots.
//!
//! Reattaching namespaces: a saved namespace takes the backend the
//! restore's configuration gives for its NSID, which must have the saved
//! size. One a host created (Namespace Management) and the configuration
//! does not name gets a new zeroed `ram` backend of its size: its data is
//! not part of this state (a later item passes the memory behind it). A
//! configured namespace the host deleted stays deleted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use vnvme_blockdev::{BlockDevice, NullDevice, RamDevice};

use super::ana::SavedAna;
use super::firmware::SavedFirmware;
use super::{ChangedNamespaces, Subsystem, CHANGED_LIST_ENTRIES};
use crate::config::MAX_NAMESPACES;
use crate::namespace::{Namespace, SavedNamespace};
use crate::saved_check::{at_most, inconsistent, same, InvalidState};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedSubsystem {
    /// Identify Controller NN (checked against the configuration's).
    pub nn: u32,
    /// TNVMCAP in bytes (checked).
    pub tnvmcap: u64,
    /// Allocated namespaces, by NSID.
    pub namespaces: Vec<SavedNamespace>,
    /// The Changed Namespace List: NSIDs, or overflowed.
    pub changed: BTreeSet<u32>,
    pub changed_overflow: bool,
    pub firmware: SavedFirmware,
    /// The ANA states of every controller of the subsystem (format 2;
    /// absent in format 1: every group optimized).
    #[serde(default)]
    pub ana: Option<SavedAna>,
}

impl Subsystem {
    pub fn save(&self, now: Instant) -> SavedSubsystem {
        let namespaces = (self.namespaces.ids_after(0, false, usize::MAX).into_iter())
            .filter_map(|nsid| self.namespaces.get(nsid))
            .map(|ns| ns.save(now, self.namespaces.cntlid()))
            .collect();
        let changed = self.changed.lock();
        SavedSubsystem {
            nn: self.nn,
            tnvmcap: self.tnvmcap,
            namespaces,
            changed: changed.ids.clone(),
            changed_overflow: changed.overflow,
            firmware: self.firmware.lock().save(),
            ana: Some(self.namespaces.table().ana.save()),
        }
    }

    /// The parts of `saved` that are this controller's own (the Changed
    /// Namespace List, the firmware slots) for a controller that joined a
    /// subsystem whose shared parts (namespaces, their attachment to every
    /// controller, reservations, ANA states) were restored already, from
    /// another controller's state saved at the same pause: `saved` must
    /// agree with them.
    pub fn restore_joined(&self, saved: &SavedSubsystem) -> Result<(), InvalidState> {
        same("NN (the largest namespace id)", saved.nn, self.nn)?;
        same("TNVMCAP", saved.tnvmcap, self.tnvmcap)?;
        at_most(
            "the Changed Namespace List's entries",
            saved.changed.len() as u64,
            CHANGED_LIST_ENTRIES as u64,
        )?;
        let cntlid = self.namespaces.cntlid();
        let table = self.namespaces.update(|map| map.clone());
        same(
            "the subsystem's namespaces",
            saved.namespaces.iter().map(|s| s.nsid).collect::<Vec<_>>(),
            table.keys().copied().collect::<Vec<_>>(),
        )?;
        for s in &saved.namespaces {
            let now_attached = table
                .get(&s.nsid)
                .is_some_and(|ns| ns.attached.contains(cntlid));
            same(
                format!("namespace {}'s attachment to controller {cntlid}", s.nsid),
                s.attached,
                now_attached,
            )?;
        }
        self.firmware.lock().restore(&saved.firmware)?;
        *self.changed.lock() = ChangedNamespaces {
            ids: saved.changed.clone(),
            overflow: saved.changed_overflow,
        };
        Ok(())
    }

    /// Replaces the configured namespaces with the saved ones (reattached
    /// as the module says), the Changed Namespace List and the firmware.
    pub fn restore(&self, saved: &SavedSubsystem, now: Instant) -> Result<(), InvalidState> {
        same("NN (the largest namespace id)", saved.nn, self.nn)?;
        same("TNVMCAP", saved.tnvmcap, self.tnvmcap)?;
        at_most(
            "the namespaces",
            saved.namespaces.len() as u64,
            u64::from(MAX_NAMESPACES),
        )?;
        at_most(
            "the Changed Namespace List's entries",
            saved.changed.len() as u64,
            CHANGED_LIST_ENTRIES as u64,
        )?;
        let configured = self.namespaces.update(|map| map.clone());
        let mut map = BTreeMap::new();
        for s in &saved.namespaces {
            at_most("a namespace id", u64::from(s.nsid), u64::from(self.nn))?;
            let old = configured.get(&s.nsid);
            let backend: Arc<dyn BlockDevice> =
                match old {
                    Some(ns) => Arc::clone(&ns.backend),
                    None if s.backend_null => Arc::new(NullDevice::new(s.backend_size)),
                    None => {
                        at_most(
                            format!("namespace {}'s size", s.nsid),
                            s.backend_size,
                            self.tnvmcap,
                        )?;
                        Arc::new(RamDevice::create(s.backend_size).map_err(|e| {
                            inconsistent(format!("namespace {}'s memory: {e}", s.nsid))
                        })?)
                    }
                };
            let ns =
                Namespace::restored(s, self.namespaces.cntlid(), backend, old.map(|o| &**o), now)?;
            if map.insert(s.nsid, Arc::new(ns)).is_some() {
                return Err(inconsistent(format!("namespace {} is saved twice", s.nsid)));
            }
        }
        // Checks every value before it changes one.
        self.firmware.lock().restore(&saved.firmware)?;
        if let Some(ana) = &saved.ana {
            self.namespaces.table().ana.restore(ana)?;
        }
        self.namespaces.update(|m| *m = map);
        *self.changed.lock() = ChangedNamespaces {
            ids: saved.changed.clone(),
            overflow: saved.changed_overflow,
        };
        Ok(())
    }
}
