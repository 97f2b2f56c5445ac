//! The NVM subsystem's namespaces as the host can change them (NVMe Base 2.0
//! §8.3): the allocated namespaces and which are attached, the capacity they
//! are allocated from, the Changed Namespace List log (§5.16.1.5), the
//! timer that makes slow namespaces ready, and the firmware slots (shared
//! by the subsystem's controllers, §5.12).

pub(crate) mod ana;
pub(crate) mod cache;
pub(crate) mod firmware;
mod saved;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::{Condvar, Mutex, RwLock};
use vnvme_blockdev::BlockDevice;
use vnvme_spec::Status;

use crate::background::sanitize::Sanitize;
use crate::config::Readiness;
use crate::namespace::Namespace;
use crate::subsystem::cache::{Generation, NamespaceCache};
use crate::subsystem::firmware::Firmware;
pub(crate) use ana::Ana;
pub(crate) use saved::SavedSubsystem;

/// Entries in the Changed Namespace List log page (4 KiB of NSIDs).
pub(crate) const CHANGED_LIST_ENTRIES: usize = 1024;

/// The NVM subsystem as one controller sees it: the namespaces (shared
/// with the subsystem's other controllers) and what this controller's
/// host learns of them.
#[derive(Debug)]
pub(crate) struct Subsystem {
    /// Allocated namespaces (attached or not), shared by the subsystem's
    /// controllers.
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

impl Subsystem {
    /// Active (allocated and attached) namespace `nsid`, or Invalid
    /// Namespace or Format.
    pub fn namespace(&self, nsid: u32) -> Result<Arc<Namespace>, Status> {
        self.namespaces
            .active(nsid)
            .ok_or(Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true))
    }

    /// The subsystem offers Asymmetric Namespace Access reporting (CMIC
    /// bit 3): when it has several controllers, so that a host can fail
    /// over between them.
    pub fn ana_reporting(&self) -> bool {
        self.namespaces.multi_controller()
    }
}

/// A controller of the subsystem, as the others reach it: to tell its
/// host that a namespace or an ANA group changed.
pub(crate) trait Member: Send + Sync {
    /// Namespace `nsid`'s attributes or attachment changed for this
    /// controller (Changed Namespace List, Namespace Attribute notice).
    fn namespace_changed(&self, nsid: u32);
    /// A sanitize started on some controller of the subsystem (Base 2.0
    /// §8.21: each controller clears its Sanitize Operation Completed
    /// event and aborts its device self-test); `event`: the Persistent
    /// Event Log's Sanitize Start data.
    fn sanitize_started(&self, event: &[u8]);
    /// The subsystem's sanitize ended (completed or failed): each
    /// controller reports it (Sanitize Operation Completed event, and
    /// `event` in its Persistent Event Log).
    fn sanitize_ended(&self, event: &[u8]);
    /// Commands of opcodes `ops` it completed so far (the subsystem's
    /// user data writes are the sum over its controllers).
    fn io_commands(&self, ops: &[vnvme_spec::NvmOpcode]) -> u64;
    /// The ANA state of one of its groups changed (ANA Change notice).
    fn ana_changed(&self);
    /// Its counters (without the namespaces', which are the subsystem's).
    fn stats(&self) -> crate::stats::ControllerStats;
    /// Its Host Identifier now (feature 81h): controllers with the same
    /// one are one host to reservations.
    fn host_id(&self) -> [u8; 16];
    /// A Reservation Notification of `kind` for namespace `nsid` (log
    /// page 80h, and its event unless masked).
    fn reservation_notice(&self, nsid: u32, kind: u8);
}

/// What every controller of one NVM subsystem shares (NVMe Base 2.0
/// §3.2.1, §8.3): the allocated namespaces (one object each, so their
/// backend, format, reservations and zones are the same through every
/// controller), the controllers themselves and the ANA states.
#[derive(Default)]
pub(crate) struct Table {
    map: RwLock<BTreeMap<u32, Arc<Namespace>>>,
    /// Of `map`: the workers' [`NamespaceCache`]s are valid while it holds.
    generation: Generation,
    /// By CNTLID: dropped controllers are skipped.
    members: RwLock<BTreeMap<u16, Weak<dyn Member>>>,
    /// Controllers made and not yet dropped: the last one to go stops the
    /// sanitize's thread (which holds the table, not a controller).
    controllers: AtomicUsize,
    pub ana: Ana,
    /// The NVM subsystem's sanitize state (Base 2.0 §8.21: a sanitize is
    /// the subsystem's, whichever controller started it).
    pub sanitize: Sanitize,
    /// The last command fault id given out: ids are the subsystem's, so a
    /// fault armed on several controllers has one (`fault_clear` takes it
    /// from each).
    fault_ids: AtomicU64,
}

impl Table {
    /// A command fault id not given out before in this subsystem.
    pub fn next_fault_id(&self) -> u64 {
        self.fault_ids.fetch_add(1, Ordering::Relaxed) + 1
    }
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("namespaces", &self.map.read().len())
            .field("controllers", &self.members.read().len())
            .finish_non_exhaustive()
    }
}

/// Allocated namespaces by NSID, as controller `cntlid` sees them: a
/// namespace is active for it while attached to it. Bounded: at most
/// `max(NN, configured)` entries, so no guest can grow it without limit.
/// A clone is the same view (a background thread's handle on the table).
#[derive(Debug, Clone)]
pub(crate) struct Namespaces {
    table: Arc<Table>,
    cntlid: u16,
}

impl Namespaces {
    /// A new subsystem's table holding `map`, seen by `cntlid`.
    pub fn new(map: BTreeMap<u32, Arc<Namespace>>, cntlid: u16) -> Self {
        let table = Table {
            map: RwLock::new(map),
            ..Table::default()
        };
        Self {
            table: Arc::new(table),
            cntlid,
        }
    }

    /// The same subsystem seen by another controller, `cntlid`, attached
    /// (with `copy_attachment`) to every namespace that `self`'s
    /// controller has attached (the configured namespaces are shared by
    /// every controller). `None` if the subsystem has a controller
    /// `cntlid` already. Without `copy_attachment` the namespaces stay
    /// attached as they are (a restored subsystem's table holds every controller's
    /// attachment already).
    pub fn join_as(&self, cntlid: u16, copy_attachment: bool) -> Option<Self> {
        if self.table.members.read().contains_key(&cntlid) || cntlid == self.cntlid {
            return None;
        }
        if copy_attachment {
            self.update(|map| {
                for ns in map.values_mut() {
                    if ns.attached.contains(self.cntlid) {
                        Arc::make_mut(ns).attached.insert(cntlid);
                    }
                }
            });
        }
        Some(Self {
            table: Arc::clone(&self.table),
            cntlid,
        })
    }

    /// Registers this view's controller, which the others notify.
    pub fn register(&self, member: Weak<dyn Member>) {
        self.table.members.write().insert(self.cntlid, member);
        self.table.controllers.fetch_add(1, Ordering::Relaxed);
    }

    /// This view's controller is being dropped: true if it was the
    /// subsystem's last one (then nothing is left to serve or report a
    /// sanitize, and its thread is stopped).
    pub fn leave(&self) -> bool {
        self.table.controllers.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// This view's controller.
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }

    /// The subsystem's shared parts (ANA states).
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// The subsystem has more than one controller (CMIC bit 1, NMIC bit 0).
    pub fn multi_controller(&self) -> bool {
        self.table.members.read().len() > 1
    }

    /// The CNTLIDs of the subsystem's controllers, ascending.
    pub fn controllers(&self) -> Vec<u16> {
        self.table.members.read().keys().copied().collect()
    }

    /// Tells controllers `cntlids` (this one included if listed) that
    /// namespace `nsid` changed for them.
    pub fn notify_changed(&self, nsid: u32, cntlids: impl IntoIterator<Item = u16>) {
        for member in self.members(cntlids) {
            member.namespace_changed(nsid);
        }
    }

    /// Tells controllers `cntlids` that one of their ANA groups changed.
    pub fn notify_ana(&self, cntlids: impl IntoIterator<Item = u16>) {
        for member in self.members(cntlids) {
            member.ana_changed();
        }
    }

    /// Controller `cntlid` of the subsystem, if it is live.
    pub fn member(&self, cntlid: u16) -> Option<Arc<dyn Member>> {
        self.members([cntlid]).pop()
    }

    /// Each live controller's CNTLID and Host Identifier, ascending by
    /// CNTLID: whom Reservation Report lists for a registered host.
    pub fn host_ids(&self) -> Vec<(u16, [u8; 16])> {
        let live = self.live().into_iter();
        live.map(|(c, m)| (c, m.host_id())).collect()
    }

    /// Every live controller by CNTLID, ascending, out of the lock (what
    /// is then asked of each takes its own locks).
    pub fn live(&self) -> Vec<(u16, Arc<dyn Member>)> {
        let members = self.table.members.read();
        let live = members.iter().filter_map(|(c, m)| Some((*c, m.upgrade()?)));
        live.collect()
    }

    /// Gives each notice (host, type) about namespace `nsid` to every live
    /// controller of that host the namespace is attached to.
    pub fn notify_reservation(&self, nsid: u32, notices: &[([u8; 16], u8)]) {
        if notices.is_empty() {
            return;
        }
        let Some(ns) = self.get(nsid) else {
            return;
        };
        for (cntlid, member) in self.live() {
            if !ns.attached.contains(cntlid) {
                continue;
            }
            let host = member.host_id();
            for (_, kind) in notices.iter().filter(|(h, _)| *h == host) {
                member.reservation_notice(nsid, *kind);
            }
        }
    }

    /// The live members among `cntlids`, taken out of the lock before
    /// they are called (a member's notice takes its own locks).
    fn members(&self, cntlids: impl IntoIterator<Item = u16>) -> Vec<Arc<dyn Member>> {
        let members = self.table.members.read();
        cntlids
            .into_iter()
            .filter_map(|c| members.get(&c)?.upgrade())
            .collect()
    }

    /// Allocated namespace `nsid`, attached or not.
    pub fn get(&self, nsid: u32) -> Option<Arc<Namespace>> {
        self.table.map.read().get(&nsid).cloned()
    }

    /// Active (allocated and attached to this controller) namespace `nsid`.
    pub fn active(&self, nsid: u32) -> Option<Arc<Namespace>> {
        self.get(nsid)
            .filter(|ns| ns.attached.contains(self.cntlid))
    }

    /// [`Self::active`] through a worker's `cache`: no lock while the
    /// table has not changed since `nsid` was last looked up.
    pub fn active_cached(&self, cache: &mut NamespaceCache, nsid: u32) -> Option<Arc<Namespace>> {
        let generation = self.table.generation.now();
        if let Some(ns) = cache.get(&self.table, self.cntlid, generation, nsid) {
            return Some(ns);
        }
        let ns = self.active(nsid)?;
        cache.insert(nsid, &ns);
        Some(ns)
    }

    /// Number of active namespaces.
    pub fn len(&self) -> usize {
        let map = self.table.map.read();
        map.values()
            .filter(|ns| ns.attached.contains(self.cntlid))
            .count()
    }

    /// The active namespaces, in NSID order (a snapshot).
    pub fn active_list(&self) -> Vec<Arc<Namespace>> {
        let map = self.table.map.read();
        map.values()
            .filter(|ns| ns.attached.contains(self.cntlid))
            .cloned()
            .collect()
    }

    /// Every allocated namespace, attached or not, in NSID order (a
    /// snapshot).
    pub fn allocated_list(&self) -> Vec<Arc<Namespace>> {
        self.table.map.read().values().cloned().collect()
    }

    /// Up to `limit` NSIDs greater than `after`, active only or every
    /// allocated one.
    pub fn ids_after(&self, after: u32, active_only: bool, limit: usize) -> Vec<u32> {
        let map = self.table.map.read();
        map.range(after.saturating_add(1)..)
            .filter(|(_, ns)| !active_only || ns.attached.contains(self.cntlid))
            .map(|(&id, _)| id)
            .take(limit)
            .collect()
    }

    /// Every allocated namespace's backend, by NSID (a snapshot).
    pub fn backends(&self) -> Vec<(u32, Arc<dyn BlockDevice>)> {
        let map = self.table.map.read();
        map.iter()
            .map(|(&id, ns)| (id, Arc::clone(&ns.backend)))
            .collect()
    }

    /// Runs `f` on the table under its write lock (namespace management).
    pub fn update<R>(&self, f: impl FnOnce(&mut BTreeMap<u32, Arc<Namespace>>) -> R) -> R {
        let mut map = self.table.map.write();
        let r = f(&mut map);
        self.table.generation.bump();
        r
    }

    /// Bytes allocated to namespaces now.
    pub fn allocated(&self) -> u64 {
        Self::allocated_bytes(&self.table.map.read())
    }

    /// Bytes namespaces keep data in (a null namespace keeps none): what
    /// a sanitize goes over.
    pub fn media_bytes(&self) -> u64 {
        self.table
            .map
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
