//! State shared by the control thread and the queue workers: one field per
//! owner. The parts (each in the module that owns its concept):
//! [`Lifecycle`] (CC, RDY, CFS, timestamps), [`Interrupts`] (whether a CQE
//! gets an interrupt), [`Reporting`] (asynchronous events, error log,
//! telemetry, Persistent Event Log), [`QueueTable`] (the queues, who works
//! which, the workers' mailboxes), the doorbells, the subsystem
//! (namespaces, firmware), the background operations, features, QoS
//! limits, faults and counters.
//!
//! What is what, for a save and restore of the controller (each part's
//! module says it of its own fields):
//! * configuration, fixed at start: `config`, and `qos` (the operator's
//!   limits, which the guest does not see: an upgrade hands them over in
//!   its manifest, apart from the saved state);
//! * guest-visible state, saved and restored: `lifecycle`, `interrupts`,
//!   `reporting`, `queues`, `doorbells`, `features` ([`Features`]),
//!   `subsystem` (with the subsystem's sanitize state), and the
//!   background operation `self_test`;
//! * transient, which a new process starts afresh: `stats` (counters),
//!   `faults` (the operator's injected faults) and `me` (a handle to this
//!   value, not state).
//!
//! Functions take the part they use; those that orchestrate several
//! owners take the whole `Shared` and say why in their doc comment.
//!
//! Lock order (never take an earlier lock while holding a later one): the
//! queue table's epoch -> its directory -> a queue's slot. A running worker
//! owns the rings it serves and takes none of these per pass (the slots
//! hold rings only while no worker runs them: `queue::rings`). `admin`,
//! the reporting locks (`events`, `error_log`, `telemetry`,
//! `persistent_events`), `streams`, the doorbells' shadow buffer lock and
//! the sanitize and self-test states are leaves (nothing is locked while
//! holding them).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use vnvme_spec::feature::aec;
use vnvme_spec::log::persistent_event::EventType;
use vnvme_spec::log::self_test::result::ABORTED_SANITIZE;
use vnvme_spec::log::{async_event, LogPageId};
use vnvme_spec::{Command, Status};

use crate::background::sanitize::Sanitize;
use crate::background::self_test::SelfTest;
use crate::config::ControllerConfig;
use crate::doorbell::Doorbells;
use crate::faults::Faults;
use crate::features::Features;
use crate::interrupts::Interrupts;
use crate::lifecycle::Lifecycle;
use crate::memory::{GuestMemory, InterruptSink};
use crate::namespace::Namespace;
use crate::qos::Qos;
use crate::queue::table::QueueTable;
use crate::reporting::Reporting;
use crate::stats::Stats;
use crate::subsystem::{Member, Subsystem};

pub(crate) use crate::queue::table::ADMIN_WORKER;
/// Abort Command Limit, 0's based: Aborts pending per submission queue.
pub(crate) const ACL: u8 = 3;

/// What enable gives the workers: the client's memory and interrupts, and
/// the page size chosen in CC.MPS.
pub(crate) struct Session {
    pub mem: Arc<dyn GuestMemory>,
    pub irq: Arc<dyn InterruptSink>,
    pub page_size: u64,
}

pub(crate) struct Shared {
    /// This very value: a background operation's thread holds it.
    pub me: Weak<Shared>,
    pub config: ControllerConfig,
    /// CC, RDY, CFS, when enabled and created, the Timestamp clock.
    pub lifecycle: Lifecycle,
    pub subsystem: Subsystem,
    pub doorbells: Doorbells,
    /// The SQs and CQs, and which worker serves which.
    pub queues: QueueTable,
    /// The features' values (Set Features), Streams, the Keep Alive Timer.
    pub features: Features,
    /// Asynchronous events, the error log, telemetry, the Persistent
    /// Event Log.
    pub reporting: Reporting,
    /// Shared with `doorbells`, which counts shadow reads and errors.
    pub stats: Arc<Stats>,
    /// Interrupt mask, coalescing and batching: whether a CQE gets an
    /// interrupt.
    pub interrupts: Interrupts,
    pub self_test: SelfTest,
    /// Faults injected on purpose (control socket, configuration).
    pub faults: Faults,
    /// IOPS and bandwidth limits ([`crate::qos`]): configuration, not
    /// guest-visible.
    pub qos: Qos,
    /// Where queue positions go for a crash's successor (`--supervise`
    /// only; [`crate::crash_record`]).
    pub crash: std::sync::OnceLock<std::sync::Arc<dyn crate::crash_record::CrashRecord>>,
    /// The commands in flight on a backend that workers a pause stopped
    /// left for the next ones, by worker index (see [`crate::inflight`]).
    /// Each an `InFlight`, erased: that type is a row above this module.
    pub inflight_parked: parking_lot::Mutex<Vec<(usize, Box<dyn std::any::Any + Send>)>>,
}

impl Shared {
    /// A reset (or a shutdown) drops the commands paused workers left, as
    /// it drops a running worker's: each backend queue waits for the
    /// kernel to finish with its requests' data, and nothing is posted.
    pub fn drop_parked_inflight(&self) {
        let parked = std::mem::take(&mut *self.inflight_parked.lock());
        // Outside the lock: the drops wait for the kernel.
        drop(parked);
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("nn", &self.subsystem.nn)
            .field("ready", &self.lifecycle.ready())
            .finish_non_exhaustive()
    }
}

impl Member for Shared {
    fn namespace_changed(&self, nsid: u32) {
        Shared::namespace_changed(self, nsid);
    }

    fn sanitize_started(&self, event: &[u8]) {
        let now = std::time::Instant::now();
        let events = &self.reporting.persistent_events;
        events.record(EventType::SANITIZE_START, now, event.to_vec());
        self.self_test
            .abort(ABORTED_SANITIZE, self.lifecycle.power_on_hours());
        // §5.24: a start clears a Sanitize Operation Completed event the
        // host has not had or not acknowledged.
        let kind = async_event::TYPE_IO_COMMAND_SET;
        let completed = async_event::dword0(
            kind,
            async_event::IO_SANITIZE_COMPLETED,
            LogPageId::SANITIZE_STATUS.0,
        );
        let mut e = self.reporting.events.lock();
        e.queue.retain(|&dw| dw != completed);
        e.masked &= !(1 << kind);
    }

    fn sanitize_ended(&self, event: &[u8]) {
        let now = std::time::Instant::now();
        let events = &self.reporting.persistent_events;
        events.record(EventType::SANITIZE_COMPLETION, now, event.to_vec());
        self.async_event(
            async_event::TYPE_IO_COMMAND_SET,
            async_event::IO_SANITIZE_COMPLETED,
            LogPageId::SANITIZE_STATUS.0,
        );
    }

    fn io_commands(&self, ops: &[vnvme_spec::NvmOpcode]) -> u64 {
        let each = ops.iter().map(|&op| self.stats.io_commands(op));
        each.fold(0, u64::wrapping_add)
    }

    fn ana_changed(&self) {
        self.async_event(
            async_event::TYPE_NOTICE,
            async_event::NOTICE_ANA_CHANGE,
            vnvme_spec::log::LogPageId::ANA.0,
        );
    }

    fn stats(&self) -> crate::stats::ControllerStats {
        let mut s = self.stats.snapshot();
        s.cntlid = self.subsystem.namespaces.cntlid();
        s
    }

    fn host_id(&self) -> [u8; 16] {
        self.features.admin.lock().host_id
    }

    fn reservation_notice(&self, nsid: u32, kind: u8) {
        if self.reporting.reservation_notices.lock().add(nsid, kind) {
            self.async_event(
                async_event::TYPE_IO_COMMAND_SET,
                async_event::IO_RESERVATION_LOG_AVAILABLE,
                vnvme_spec::log::LogPageId::RESERVATION_NOTIFICATION.0,
            );
        }
    }
}

impl Shared {
    /// The NVM subsystem's sanitize state, shared by its controllers; it
    /// outlives controller resets.
    pub fn sanitize(&self) -> &Sanitize {
        &self.subsystem.namespaces.table().sanitize
    }

    /// Active (allocated and attached) namespace `nsid`, or Invalid
    /// Namespace or Format.
    pub fn namespace(&self, nsid: u32) -> Result<Arc<Namespace>, Status> {
        self.subsystem.namespace(nsid)
    }

    /// Queues SQ `qid` for a pass by its worker (outside a doorbell trap):
    /// [`QueueTable::kick_sq`].
    #[inline]
    pub fn kick_sq(&self, qid: u16) {
        self.queues.kick_sq(&self.doorbells, qid);
    }

    /// Records an asynchronous event (§5.2) and wakes the admin queue to
    /// report it. Events of a masked type, or arriving while not ready, are
    /// dropped.
    pub fn async_event(&self, kind: u8, info: u8, lid: u8) {
        if !self.lifecycle.ready() {
            return;
        }
        if kind == async_event::TYPE_NOTICE {
            let enabled_by = match info {
                async_event::NOTICE_FIRMWARE_ACTIVATION_STARTING => aec::FIRMWARE_ACTIVATION,
                vnvme_spec::zns::NOTICE_ZONE_DESCRIPTOR_CHANGED => aec::ZONE_DESCRIPTOR_CHANGED,
                async_event::NOTICE_ANA_CHANGE => aec::ANA_CHANGE,
                _ => aec::NAMESPACE_ATTRIBUTE,
            };
            if self.features.admin.lock().async_event_config & enabled_by == 0 {
                return;
            }
        }
        if !self.reporting.queue_event(kind, info, lid) {
            return;
        }
        self.kick_sq(0);
    }

    /// A namespace's attributes or attachment changed: list it in the
    /// Changed Namespace List and raise a Namespace Attribute Changed
    /// notice (if enabled in Asynchronous Event Configuration bit 8).
    pub fn namespace_changed(&self, nsid: u32) {
        self.subsystem.changed.lock().add(nsid);
        self.async_event(
            async_event::TYPE_NOTICE,
            async_event::NOTICE_NS_ATTRIBUTE_CHANGED,
            0x04,
        );
    }

    /// Namespace `ns` changed (format, size, deletion): every controller
    /// it is attached to hears of it, this one included.
    pub fn shared_namespace_changed(&self, ns: &Namespace) {
        self.subsystem
            .namespaces
            .notify_changed(ns.nsid, ns.attached.iter());
    }

    /// The subsystem offers Asymmetric Namespace Access reporting (CMIC
    /// bit 3): when it has several controllers, so that a host can fail
    /// over between them.
    pub fn ana_reporting(&self) -> bool {
        self.subsystem.ana_reporting()
    }

    /// Sets CSTS.CFS: the controller cannot reach its queues.
    pub fn set_fatal(&self, why: &str) {
        if self.lifecycle.set_fatal() {
            self.stats.fatal_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("controller fatal status: {why}");
            self.controller_telemetry(why);
        }
    }

    /// CSTS.CFS is being set (or an enable refused): the Telemetry
    /// Controller-Initiated data records why and the state then.
    pub fn controller_telemetry(&self, reason: &str) {
        self.reporting
            .controller_telemetry(&self.stats, self.lifecycle.uptime(), reason);
    }

    /// Adds a failed command to the Error Information log.
    pub fn log_error(&self, sqid: u16, cmd: &Command, status: Status) {
        self.reporting
            .record_error(sqid, cmd.cid(), cmd.nsid.get(), status);
    }

    /// The Keep Alive Timer expired (§3.9, Keep Alive Timeout Cleanup in
    /// 2.1 §3.9.5): record an Error Information log entry with Keep Alive
    /// Timeout Expired, stop processing commands and set CSTS.CFS. The
    /// host recovers with a controller reset.
    pub fn keep_alive_expired(&self) {
        // Not a command's error: SQID and CID FFFFh.
        self.reporting
            .record_error(0xFFFF, 0xFFFF, 0, Status::KEEP_ALIVE_TIMEOUT_EXPIRED);
        self.set_fatal("keep alive timeout expired");
    }
}
