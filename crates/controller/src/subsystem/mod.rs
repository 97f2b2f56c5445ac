//! The NVM subsystem's namespaces as the host can change them (NVMe Base 2.0
//! §8.3): the allocated namespaces and which are attached, the capacity they
//! are allocated from, the Changed Namespace List log (§5.16.1.5), the
//! timer that makes slow namespaces ready, and the firmware slots (shared
//! by the subsystem's controllers, §5.12).

pub(crate) mod firmware;
mod saved;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::{Condvar, Mutex, RwLock};

use crate::config::Readiness;
use crate::namespace::Namespace;
use crate::subsystem::firmware::Firmware;
pub(crate) use saved::SavedSubsystem;

/// Entries in the Changed Namespace List log page (4 KiB of NSIDs).
pub(crate) const CHANGED_LIST_ENTRIES: usize = 1024;

/// The NVM subsystem: its namespaces and what the host learns of them.
#[derive(Debug)]
pub(crate) struct Subsystem {
    /// Allocated namespaces (attached or not).
    pub namespaces: Namespaces,
    /// Identify Controller NN: the largest NSID the subsystem supports.
    pub nn: u32,
    /// TNVMCAP: bytes namespaces are allocated from.
    pub tnvmcap: u64,
    /// Changed Namespace List log (04h).
    pub changed: Mutex<ChangedNamespaces>,
    /// Makes slow namespaces ready after enable.
    pub ready_timer: Arc<ReadyTimer>,
    /// Some namespace's backend has a volatile write cache.
    pub vwc: bool,
    /// Firmware slots and the image being downloaded (a leaf lock).
    pub firmware: Mutex<Firmware>,
}

/// Allocated namespaces by NSID. Bounded: at most `max(NN, configured)`
/// entries, so no guest can grow it without limit.
#[derive(Debug, Default)]
pub(crate) struct Namespaces {
    map: RwLock<BTreeMap<u32, Arc<Namespace>>>,
}

impl Namespaces {
    pub fn new(map: BTreeMap<u32, Arc<Namespace>>) -> Self {
        Self {
            map: RwLock::new(map),
        }
    }

    /// Allocated namespace `nsid`, attached or not.
    pub fn get(&self, nsid: u32) -> Option<Arc<Namespace>> {
        self.map.read().get(&nsid).cloned()
    }

    /// Active (allocated and attached) namespace `nsid`.
    pub fn active(&self, nsid: u32) -> Option<Arc<Namespace>> {
        self.get(nsid).filter(|ns| ns.attached)
    }

    /// Number of active namespaces.
    pub fn len(&self) -> usize {
        self.map.read().values().filter(|ns| ns.attached).count()
    }

    /// The active namespaces, in NSID order (a snapshot).
    pub fn active_list(&self) -> Vec<Arc<Namespace>> {
        let map = self.map.read();
        map.values().filter(|ns| ns.attached).cloned().collect()
    }

    /// Up to `limit` NSIDs greater than `after`, active only or every
    /// allocated one.
    pub fn ids_after(&self, after: u32, active_only: bool, limit: usize) -> Vec<u32> {
        let map = self.map.read();
        map.range(after.saturating_add(1)..)
            .filter(|(_, ns)| !active_only || ns.attached)
            .map(|(&id, _)| id)
            .take(limit)
            .collect()
    }

    /// Runs `f` on the table under its write lock (namespace management).
    pub fn update<R>(&self, f: impl FnOnce(&mut BTreeMap<u32, Arc<Namespace>>) -> R) -> R {
        f(&mut self.map.write())
    }

    /// Bytes allocated to namespaces now.
    pub fn allocated(&self) -> u64 {
        Self::allocated_bytes(&self.map.read())
    }

    /// Bytes namespaces keep data in (a null namespace keeps none): what
    /// a sanitize goes over.
    pub fn media_bytes(&self) -> u64 {
        self.map
            .read()
            .values()
            .filter(|ns| !ns.backend.moves_no_data())
            .fold(0u64, |sum, ns| sum.saturating_add(ns.backend.size()))
    }

    /// Bytes allocated to the namespaces of `map`.
    pub fn allocated_bytes(map: &BTreeMap<u32, Arc<Namespace>>) -> u64 {
        map.values()
            .fold(0u64, |sum, ns| sum.saturating_add(ns.backend.size()))
    }
}

/// The Changed Namespace List (log page 04h): NSIDs whose Identify
/// Namespace data or attachment changed since the host last read it, or
/// "more than 1024" (first entry FFFFFFFFh).
#[derive(Debug, Default)]
pub(crate) struct ChangedNamespaces {
    ids: BTreeSet<u32>,
    overflow: bool,
}

impl ChangedNamespaces {
    pub fn add(&mut self, nsid: u32) {
        if self.overflow || self.ids.contains(&nsid) {
            return;
        }
        if self.ids.len() >= CHANGED_LIST_ENTRIES {
            self.ids.clear();
            self.overflow = true;
            return;
        }
        self.ids.insert(nsid);
    }

    /// The 4 KiB log page.
    pub fn page(&self) -> Vec<u8> {
        let mut page = vec![0u8; CHANGED_LIST_ENTRIES * 4];
        if self.overflow {
            page[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        } else {
            for (slot, id) in page.chunks_exact_mut(4).zip(&self.ids) {
                slot.copy_from_slice(&id.to_le_bytes());
            }
        }
        page
    }

    /// The host read `page` without RAE: forget what it reported.
    pub fn acknowledge(&mut self, page: &[u8]) {
        for id in page.chunks_exact(4) {
            let id = u32::from_le_bytes([id[0], id[1], id[2], id[3]]);
            match id {
                0 => break,
                u32::MAX => {
                    *self = Self::default();
                    break;
                }
                id => {
                    self.ids.remove(&id);
                }
            }
        }
    }
}

/// Wakes at each [`Readiness::After`] deadline after enable and announces
/// the namespace that became ready. One thread per enable, only when some
/// namespace is slow; stopped by controller reset.
#[derive(Debug, Default)]
pub(crate) struct ReadyTimer {
    stop: Mutex<bool>,
    cv: Condvar,
}

impl ReadyTimer {
    /// Starts the timer thread for the namespaces among `namespaces` not
    /// ready at `enabled_at`, if there are any: it calls `ready` with each
    /// one's NSID at its deadline.
    pub fn start(
        timer: &Arc<ReadyTimer>,
        namespaces: &[Arc<Namespace>],
        enabled_at: Instant,
        ready: impl Fn(u32) + Send + 'static,
    ) -> Option<JoinHandle<()>> {
        let mut deadlines: Vec<(Instant, u32)> = namespaces
            .iter()
            .filter_map(|ns| match ns.readiness {
                Readiness::After(d) if !d.is_zero() => {
                    enabled_at.checked_add(d).map(|t| (t, ns.nsid))
                }
                _ => None,
            })
            .collect();
        if deadlines.is_empty() {
            return None;
        }
        deadlines.sort_unstable();
        *timer.stop.lock() = false;
        let t = Arc::clone(timer);
        let spawned = std::thread::Builder::new()
            .name("vnvme-ready".into())
            .spawn(move || t.run(&deadlines, ready));
        match spawned {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!("no namespace-ready timer ({e}): no ready events will be raised");
                None
            }
        }
    }

    fn run(&self, deadlines: &[(Instant, u32)], ready: impl Fn(u32)) {
        for &(deadline, nsid) in deadlines {
            let mut stop = self.stop.lock();
            while !*stop && Instant::now() < deadline {
                self.cv.wait_until(&mut stop, deadline);
            }
            if *stop {
                return;
            }
            drop(stop);
            ready(nsid);
        }
    }

    pub fn stop(&self) {
        *self.stop.lock() = true;
        self.cv.notify_all();
    }
}
