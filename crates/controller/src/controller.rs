//! The controller: BAR0 register and doorbell accesses from the control
//! thread, enable/reset/shutdown, and the worker threads' lifecycle.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use vnvme_spec::log::async_event;
use vnvme_spec::regs::{offset, shutdown, Bar0Layout, Doorbell};

use crate::background::self_test::SelfTest;
use crate::config::{
    ConfigError, ControllerConfig, NamespaceConfig, NamespaceIds, Readiness, MAX_NAMESPACES,
};
use crate::doorbell::{DoorbellPage, Doorbells, HeapDoorbellPage, Invalid, TrapOutcome};
use crate::faults::Faults;
use crate::features::Features;
use crate::interrupts::Interrupts;
use crate::lifecycle::Lifecycle;
use crate::memory::{GuestMemory, InterruptSink};
use crate::namespace::Namespace;
use crate::queue::table::QueueTable;
use crate::regs::{Action, Regs};
use crate::reporting::persistent_event_log::PersistentEventLog;
use crate::reporting::Reporting;
use crate::state::{Session, Shared};
use crate::stats::{ControllerStats, Stats};
use crate::subsystem::firmware::Firmware;
use crate::subsystem::{ChangedNamespaces, Member, Namespaces, Subsystem};
use crate::worker::group::{Detached, PollGroups};

mod ana_ops;
mod enable;
mod handed;
mod operator;
mod qos_ops;
mod saved;
pub use ana_ops::AnaError;
pub use operator::NamespaceOpError;

/// CRTO.CRWMT is 16 bits of 500 ms units.
const MAX_READY_TIMEOUT: Duration = Duration::from_millis(500 * 0xFFFF);
/// How long a reset waits for its workers to leave their poll groups: a
/// member leaves at its group's next pass, unless it is blocked in storage.
const MEMBERS_LEAVE: Duration = Duration::from_secs(30);
/// How much longer than its slowest namespace a host is told to wait.
const READY_MARGIN: Duration = Duration::from_secs(2);

struct Attachment {
    mem: Arc<dyn GuestMemory>,
    irq: Arc<dyn InterruptSink>,
}

/// State only the control thread touches.
struct Control {
    regs: Regs,
    attachment: Option<Attachment>,
    threads: Vec<JoinHandle<()>>,
    /// In poll groups: the workers that joined at the last enable, to wait
    /// for their leaving at reset.
    members: Option<Arc<Detached>>,
    /// CC.SHN completed since the last enable (for SMART unsafe shutdowns).
    clean_shutdown: bool,
    /// What the workers of this enable were given (until a reset), so
    /// that [`Controller::resume`] can start them again.
    session: Option<Arc<Session>>,
    /// [`Controller::pause`] stopped the workers of this enable.
    paused: bool,
}

impl Control {
    /// Workers run: threads of its own, or members of poll groups.
    fn has_workers(&self) -> bool {
        !self.threads.is_empty() || self.members.is_some()
    }
}

/// An NVMe controller. `Send + Sync`; every method takes `&self`.
///
/// Threading: [`mmio_read`](Self::mmio_read) and
/// [`mmio_write`](Self::mmio_write) run on the caller's (vfio-user control)
/// thread. Register accesses take an internal lock; doorbell writes do not —
/// they store the value in an atomic slot and kick the worker that owns the
/// queue. Commands run on an admin worker thread and `config.workers` I/O
/// worker threads that exist
/// while the controller is enabled (CSTS.RDY = 1).
pub struct Controller {
    shared: Arc<Shared>,
    control: Mutex<Control>,
    /// Where the workers run when they have no threads of their own.
    groups: Option<PollGroups>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

impl Controller {
    pub fn new(
        config: ControllerConfig,
        namespaces: Vec<NamespaceConfig>,
    ) -> Result<Self, ConfigError> {
        Self::with_doorbell_page(config, namespaces, None)
    }

    /// As [`new`](Self::new), with the shared doorbell page the controller
    /// polls in a mode that [offers it](crate::DoorbellMode::offers_page) (the
    /// memory behind BAR0's sparse-mmap area, [`Bar0Layout::DOORBELLS`]).
    /// Without one, such a mode uses a page in the heap that only register
    /// writes reach. Ignored in other modes.
    pub fn with_doorbell_page(
        config: ControllerConfig,
        namespaces: Vec<NamespaceConfig>,
        page: Option<Arc<dyn DoorbellPage>>,
    ) -> Result<Self, ConfigError> {
        Self::with_poll_groups(config, namespaces, page, None)
    }

    /// As [`with_doorbell_page`](Self::with_doorbell_page); with `groups`,
    /// the controller starts no threads of its own: its admin worker and
    /// one I/O worker per group (`config.workers` is ignored) are members
    /// of those poll groups, with the other controllers made with them
    /// (see [`PollGroups`]).
    pub fn with_poll_groups(
        mut config: ControllerConfig,
        namespaces: Vec<NamespaceConfig>,
        page: Option<Arc<dyn DoorbellPage>>,
        groups: Option<PollGroups>,
    ) -> Result<Self, ConfigError> {
        Self::check(&mut config, &groups)?;
        let mut map = BTreeMap::<u32, Arc<Namespace>>::new();
        for nc in &namespaces {
            let ns = Namespace::new(
                nc,
                NamespaceIds::for_controller(&config.serial, nc.nsid),
                config.cntlid,
            )?;
            // Hosts trust an identifier only while no other namespace has it.
            if let Some((other, id)) = map
                .values()
                .find_map(|o| Some((o.nsid, o.ids.shared_with(&ns.ids)?)))
            {
                return Err(ConfigError::DuplicateId {
                    nsid: ns.nsid,
                    other,
                    id,
                });
            }
            if map.insert(ns.nsid, Arc::new(ns)).is_some() {
                return Err(ConfigError::DuplicateNsid(nc.nsid));
            }
        }
        // CRWMT must cover the slowest namespace, with room: a host starts
        // its clock before its enable write reaches us (through QEMU, a
        // guest under TCG) and must not give up just before RDY.
        let slowest = map
            .values()
            .filter_map(|ns| match ns.readiness {
                Readiness::After(d) => Some(d),
                _ => None,
            })
            .max()
            .map_or(Duration::ZERO, |d| d + READY_MARGIN);
        config.ready_timeout = config.ready_timeout.max(slowest).min(MAX_READY_TIMEOUT);
        let nn = map
            .keys()
            .next_back()
            .copied()
            .unwrap_or(0)
            .max(config.max_namespaces);
        let tnvmcap = config.nvm_capacity.max(Namespaces::allocated_bytes(&map));
        let vwc = map.values().any(|ns| ns.backend.volatile_cache());
        let subsystem = Subsystem {
            namespaces: Namespaces::new(map, config.cntlid),
            nn,
            tnvmcap,
            changed: Mutex::new(ChangedNamespaces::default()),
            ready_timer: Arc::default(),
            vwc,
            firmware: Mutex::new(Firmware::new(&config.firmware)),
        };
        Ok(Self::assemble(config, subsystem, page, groups))
    }

    /// Another controller of `first`'s NVM subsystem (NVMe Base 2.0 §3.2.1):
    /// its own CNTLID (`config.cntlid`), queues, features, events and
    /// resets, and `first`'s namespaces — the same objects, so data,
    /// format, reservations and zones are one — attached to it as they are
    /// to `first`. `config` should give the subsystem's serial and NQN;
    /// its namespace settings (NN, TNVMCAP) are `first`'s.
    pub fn joining(
        first: &Controller,
        config: ControllerConfig,
        page: Option<Arc<dyn DoorbellPage>>,
        groups: Option<PollGroups>,
    ) -> Result<Self, ConfigError> {
        Self::joining_as(first, config, page, groups, true)
    }

    /// As [`joining`](Self::joining), but attached to the namespaces the
    /// subsystem's table says (none copied from `first`): a controller of
    /// a subsystem restored from a saved state (docs/state-format.md),
    /// whose attachment to every controller the state carried.
    pub fn joining_as_saved(
        first: &Controller,
        config: ControllerConfig,
        page: Option<Arc<dyn DoorbellPage>>,
        groups: Option<PollGroups>,
    ) -> Result<Self, ConfigError> {
        Self::joining_as(first, config, page, groups, false)
    }

    fn joining_as(
        first: &Controller,
        mut config: ControllerConfig,
        page: Option<Arc<dyn DoorbellPage>>,
        groups: Option<PollGroups>,
        copy_attachment: bool,
    ) -> Result<Self, ConfigError> {
        Self::check(&mut config, &groups)?;
        let theirs = &first.shared.subsystem;
        let namespaces = theirs
            .namespaces
            .join_as(config.cntlid, copy_attachment)
            .ok_or(ConfigError::DuplicateCntlid(config.cntlid))?;
        // The namespaces' readiness is the subsystem's: the same CRWMT.
        config.ready_timeout = config.ready_timeout.max(first.shared.config.ready_timeout);
        let subsystem = Subsystem {
            namespaces,
            nn: theirs.nn,
            tnvmcap: theirs.tnvmcap,
            changed: Mutex::new(ChangedNamespaces::default()),
            ready_timer: Arc::default(),
            vwc: theirs.vwc,
            firmware: Mutex::new(Firmware::new(&config.firmware)),
        };
        Ok(Self::assemble(config, subsystem, page, groups))
    }

    /// Refuses what `config` cannot be; with `groups`, the workers are
    /// one per group.
    fn check(
        config: &mut ControllerConfig,
        groups: &Option<PollGroups>,
    ) -> Result<(), ConfigError> {
        if let Some(g) = &groups {
            config.workers = g.len();
        }
        if config.workers == 0 {
            return Err(ConfigError::NoWorkers);
        }
        // Doorbells for qids 0..=max_io_queues must fit below the MSI-X table.
        if config.max_io_queues == 0 || config.max_io_queues > Bar0Layout::MAX_QID {
            return Err(ConfigError::MaxIoQueues {
                got: config.max_io_queues,
                max: Bar0Layout::MAX_QID,
            });
        }
        if config.msix_vectors == 0 || config.msix_vectors > 2048 {
            return Err(ConfigError::MsixVectors(config.msix_vectors));
        }
        if config.mqes_z == 0 {
            return Err(ConfigError::Mqes);
        }
        if config.mdts == 0 || config.mdts > 12 {
            return Err(ConfigError::Mdts(config.mdts));
        }
        if config.max_namespaces > MAX_NAMESPACES {
            return Err(ConfigError::MaxNamespaces {
                got: config.max_namespaces,
                max: MAX_NAMESPACES,
            });
        }
        if config.ready_timeout.is_zero() || config.ready_timeout > MAX_READY_TIMEOUT {
            return Err(ConfigError::ReadyTimeout(config.ready_timeout));
        }
        Ok(())
    }

    /// The controller with `subsystem`, its state made and registered
    /// with the subsystem's other controllers.
    fn assemble(
        config: ControllerConfig,
        subsystem: Subsystem,
        page: Option<Arc<dyn DoorbellPage>>,
        groups: Option<PollGroups>,
    ) -> Self {
        let qids = usize::from(config.max_io_queues) + 1;
        let page = config
            .doorbells
            .offers_page()
            .then(|| page.unwrap_or_else(|| Arc::new(HeapDoorbellPage::default())));
        let stats = Arc::new(Stats::new(qids));
        let created = Instant::now();
        let lifecycle = Lifecycle::new(created);
        let shared = Arc::new_cyclic(|me| Shared {
            me: me.clone(),
            subsystem,
            doorbells: Doorbells::new(qids, page, Arc::clone(&stats)),
            queues: match &groups {
                Some(g) => QueueTable::in_groups(qids, g.assign()),
                None => QueueTable::new(qids, config.workers),
            },
            features: Features::new(&config),
            reporting: Reporting::new(PersistentEventLog::new(&config, created, lifecycle.clock())),
            stats,
            interrupts: Interrupts::new(&config),
            self_test: SelfTest::default(),
            faults: Faults::default(),
            qos: Default::default(),
            crash: Default::default(),
            inflight_parked: Default::default(),
            lifecycle,
            config,
        });
        shared
            .reporting
            .persistent_events
            .power_on_or_reset(created, 0);
        let weak: Weak<Shared> = Arc::downgrade(&shared);
        let member: Weak<dyn Member> = weak;
        shared.subsystem.namespaces.register(member);
        let regs = Regs::new(&shared.config);
        Self {
            shared,
            control: Mutex::new(Control {
                regs,
                attachment: None,
                threads: Vec::new(),
                members: None,
                clean_shutdown: true,
                session: None,
                paused: false,
            }),
            groups,
        }
    }

    /// A new client: its guest memory and interrupts. Namespaces (and their
    /// data) persist across clients. Replaces any previous client.
    pub fn attach(&self, mem: Arc<dyn GuestMemory>, irq: Arc<dyn InterruptSink>) {
        let mut ctl = self.control.lock();
        self.detach_locked(&mut ctl);
        ctl.attachment = Some(Attachment { mem, irq });
        self.shared
            .stats
            .power_cycles
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The client is gone: stop the workers, reset the controller, drop its
    /// memory and interrupts.
    pub fn detach(&self) {
        let mut ctl = self.control.lock();
        self.detach_locked(&mut ctl);
    }

    fn detach_locked(&self, ctl: &mut Control) {
        if ctl.attachment.is_none() {
            return;
        }
        if ctl.regs.cc.en() && !ctl.clean_shutdown {
            self.shared
                .stats
                .unsafe_shutdowns
                .fetch_add(1, Ordering::Relaxed);
        }
        self.controller_reset(ctl);
        ctl.regs = Regs::new(&self.shared.config);
        ctl.attachment = None;
    }

    /// Controller-level reset (vfio-user DEVICE_RESET, FLR): as CC.EN = 0,
    /// and every register back to its reset value.
    pub fn reset(&self) {
        let mut ctl = self.control.lock();
        self.controller_reset(&mut ctl);
        ctl.regs = Regs::new(&self.shared.config);
    }

    /// Tests only: queue worker `index`'s rounds, for a test that runs
    /// them one at a time.
    #[cfg(test)]
    pub(crate) fn worker_steps(&self, index: usize) -> &crate::queue::mailbox::Steps {
        &self.shared.queues.mailboxes[index].steps
    }

    /// Tests only: times any queue's slot in the queue table was locked.
    #[cfg(test)]
    pub(crate) fn queue_slot_locks(&self) -> u64 {
        self.shared.queues.slot_locks()
    }

    /// Commands counted running on namespace `nsid` for the Preempt and
    /// Abort fence.
    #[cfg(test)]
    pub(crate) fn fence_pending(&self, nsid: u32) -> u64 {
        let ns = self.shared.subsystem.namespace(nsid).expect("namespace");
        ns.reservations.pending_total()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> ControllerStats {
        let mut s = self.shared.stats.snapshot();
        let namespaces = &self.shared.subsystem.namespaces;
        s.cntlid = namespaces.cntlid();
        s.namespaces = (namespaces.ids_after(0, false, usize::MAX).into_iter())
            .filter_map(|nsid| namespaces.get(nsid))
            .map(|ns| ns.counters.snapshot(ns.nsid))
            .collect();
        s
    }

    /// The pin-based interrupt's level (NVMe Base 2.0 §3.5.1.1, pin-based
    /// interrupts): some CQ with interrupts enabled, whose vector INTMS does
    /// not mask, holds completions the host has not consumed (tail != head,
    /// the head re-read from its doorbell source, shadow included).
    ///
    /// vfio-user carries INTx as an eventfd, an edge: the client (QEMU)
    /// asserts the line on it, masks, deasserts at the next BAR access and
    /// sends UNMASK. A completion signalled while the line was still asserted
    /// adds no new edge; the glue asks this at UNMASK and signals again while
    /// it holds, which makes the edge a level.
    pub fn intx_asserted(&self) -> bool {
        let mem = match &self.control.lock().attachment {
            Some(a) => Arc::clone(&a.mem),
            None => return false,
        };
        let shared = &*self.shared;
        // The rings are their workers': the directory has each CQ's head
        // and tail as its worker last saw them, and the head is read
        // afresh from its doorbell (a bad one is the worker's to report).
        let dir = shared.queues.directory.lock();
        for (qid, e) in dir.cqs.iter().enumerate() {
            let Some(e) = e else { continue };
            if !e.ien || shared.interrupts.masked(e.iv) {
                continue;
            }
            let qid = qid as u16;
            let db = Doorbell::CqHead(qid);
            let source = shared.doorbells.source_for(db);
            let (mut head, tail) = e.view.get();
            if let Some(v) = source.current(&shared.doorbells, db, qid, &*mem) {
                if e.view.accepts(e.size, v) {
                    head = v;
                }
            }
            if head != tail {
                return true;
            }
        }
        false
    }

    /// Reads BAR0. 4- and 8-byte aligned accesses (1 and 2 bytes within a
    /// dword too); unknown registers and doorbells read as 0. Never panics.
    pub fn mmio_read(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset >= offset::DOORBELLS {
            self.doorbell_read(offset, data);
            return;
        }
        let len = data.len() as u64;
        let aligned = matches!(len, 1 | 2 | 4 | 8) && offset.is_multiple_of(len);
        if !aligned {
            self.shared
                .stats
                .invalid_register_accesses
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut ctl = self.control.lock();
        ctl.regs.settle(Instant::now());
        let read32 = |off: u64| {
            let mut v = ctl.regs.read32(off);
            if off == offset::CSTS && self.shared.lifecycle.fatal() {
                v |= 1 << 1;
            }
            v
        };
        let dword = offset & !3;
        let value = if len == 8 {
            u64::from(read32(offset)) | (u64::from(read32(offset + 4)) << 32)
        } else {
            u64::from(read32(dword) >> ((offset - dword) * 8))
        };
        let bytes = value.to_le_bytes();
        data.copy_from_slice(bytes.get(..data.len()).unwrap_or_default());
    }

    /// Doorbells read as 0, except where the page is offered: it is the
    /// doorbells' memory and reads return what the client wrote there.
    fn doorbell_read(&self, offset: u64, data: &mut [u8]) {
        let Some(page) = self.shared.doorbells.page() else {
            return;
        };
        if offset >= Bar0Layout::DOORBELLS.end || data.len() != 4 || !offset.is_multiple_of(4) {
            return;
        }
        let index = ((offset - Bar0Layout::DOORBELLS.start) / 4) as u32;
        data.copy_from_slice(&page.load(index).to_le_bytes());
    }

    /// Writes BAR0: registers (4 or 8 bytes, aligned) and doorbells (4
    /// bytes). Bad accesses are ignored and counted. Never panics.
    pub fn mmio_write(&self, offset: u64, data: &[u8]) {
        let value = match *data {
            [a, b, c, d] if offset.is_multiple_of(4) => {
                Some(u64::from(u32::from_le_bytes([a, b, c, d])))
            }
            [a, b, c, d, e, f, g, h] if offset.is_multiple_of(8) && offset < offset::DOORBELLS => {
                Some(u64::from_le_bytes([a, b, c, d, e, f, g, h]))
            }
            _ => None,
        };
        let Some(value) = value else {
            self.shared
                .stats
                .invalid_register_accesses
                .fetch_add(1, Ordering::Relaxed);
            return;
        };
        if Bar0Layout::DOORBELLS.contains(&offset) {
            match Doorbell::decode(offset, 0) {
                Some(db) => self.doorbell_write(db, value as u32),
                None => {
                    self.shared
                        .stats
                        .invalid_register_accesses
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
            return;
        }
        if offset >= offset::DOORBELLS {
            return;
        }
        let mut ctl = self.control.lock();
        if data.len() == 8 {
            self.register_write(&mut ctl, offset, value as u32);
            self.register_write(&mut ctl, offset + 4, (value >> 32) as u32);
        } else {
            self.register_write(&mut ctl, offset, value as u32);
        }
    }

    /// The doorbell trap: count, validate, store, kick. Lock-free except for
    /// the worker's pending list.
    fn doorbell_write(&self, db: Doorbell, value: u32) {
        let shared = &*self.shared;
        let qid = match db {
            Doorbell::SqTail(q) | Doorbell::CqHead(q) => q,
        };
        let counters = shared.stats.queue(qid);
        if let Some(c) = counters {
            match db {
                Doorbell::SqTail(_) => c.sq_doorbell_traps.fetch_add(1, Ordering::Relaxed),
                Doorbell::CqHead(_) => c.cq_doorbell_traps.fetch_add(1, Ordering::Relaxed),
            };
        }
        // The page before the register: the admin worker takes a page value
        // that differs from the register as a client's write through the
        // page (`sync_admin_page`); stored the other way round, a value it
        // read in between would roll the register back.
        if let Some(page) = shared.doorbells.page() {
            if shared.doorbells.accepts(db, value) {
                page.store(db.index(), value);
            }
        }
        let outcome = shared.doorbells.trap(db, value);
        if !matches!(outcome, TrapOutcome::Ignored(_)) {
            shared.doorbells.shadow_trap(db, value);
            // Before the reply: a crash before a worker takes the value
            // must not lose the host's write.
            if let Some(rec) = shared.crash.get() {
                rec.doorbell(db, value);
            }
        }
        match outcome {
            TrapOutcome::Kick { worker, doorbell } => {
                if let Some(w) = shared.queues.mailboxes.get(worker) {
                    w.push(doorbell);
                }
            }
            TrapOutcome::Stored => {}
            TrapOutcome::Ignored(why) => {
                match counters {
                    Some(c) => c.invalid_doorbell_writes.fetch_add(1, Ordering::Relaxed),
                    None => shared
                        .stats
                        .invalid_doorbell_writes_no_queue
                        .fetch_add(1, Ordering::Relaxed),
                };
                tracing::debug!(?db, value, ?why, "invalid doorbell write ignored");
                let info = match why {
                    Invalid::NoSuchQueue => 0x00,
                    Invalid::BadValue => 0x01,
                };
                shared.async_event(async_event::TYPE_ERROR, info, 0x01);
            }
        }
    }

    fn register_write(&self, ctl: &mut Control, off: u64, value: u32) {
        let action = ctl.regs.write32(off, value);
        self.shared.interrupts.set_mask(ctl.regs.intm);
        self.shared.lifecycle.set_cc(ctl.regs.cc);
        match action {
            None => {}
            Some(Action::Enable) => self.enable(ctl),
            Some(Action::Disable) => {
                self.controller_reset(ctl);
            }
            Some(Action::Shutdown) => {
                // Commands need a controller reset after a shutdown (CSTS.SHST):
                // the workers stop first, so that nothing reads or writes the
                // host's queues once SHST says complete (a host may free them
                // then; a worker fetching from a freed SQ set CSTS.CFS).
                self.stop_workers(ctl);
                (ctl.session, ctl.paused) = (None, false);
                self.shared.faults.reset();
                self.shared.drop_parked_inflight();
                for ns in self.shared.subsystem.namespaces.active_list() {
                    if let Err(e) = ns.backend.flush() {
                        tracing::warn!(nsid = ns.nsid, "flush at shutdown failed: {e}");
                    }
                }
                ctl.clean_shutdown = true;
                ctl.regs.csts.set_shst(shutdown::COMPLETE);
            }
            Some(Action::SubsystemReset) => {
                self.controller_reset(ctl);
                ctl.regs = Regs::new(&self.shared.config);
                ctl.regs.csts.set_nssro(true);
            }
            Some(Action::Unmasked) => {
                let held = self.shared.interrupts.take_held();
                if let (true, Some(a)) = (held, &ctl.attachment) {
                    a.irq.signal(0);
                }
            }
        }
        if off == offset::CC {
            // §3.9.2 (2.1): no keep alive timeout while disabled or shut down.
            let (cc, csts) = (ctl.regs.cc, ctl.regs.csts);
            let active = cc.en() && csts.rdy() && cc.shn() == 0 && csts.shst() == 0;
            self.shared.features.keep_alive.set_active(active);
        }
        self.shared.interrupts.set_mask(ctl.regs.intm);
        self.shared.lifecycle.set_cc(ctl.regs.cc);
    }
}

// The glue shares the controller across threads with `Arc`.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Controller>();
};

impl Drop for Controller {
    fn drop(&mut self) {
        let ctl = self.control.get_mut();
        // Their threads hold the shared state: stopped here, not with it.
        // A sanitize is the subsystem's and holds the subsystem: it goes on
        // while another controller of it is left.
        if self.shared.subsystem.namespaces.leave() {
            self.shared.sanitize().task.stop();
        }
        self.shared.self_test.task.stop();
        self.shared.subsystem.ready_timer.stop();
        self.shared.features.keep_alive.stop();
        for w in &self.shared.queues.mailboxes {
            w.stop();
        }
        for t in ctl.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(members) = ctl.members.take() {
            members.wait(MEMBERS_LEAVE);
        }
    }
}
