//! What the controller reports to the host beyond completions:
//! Asynchronous Events (§5.2) waiting for an Asynchronous Event Request,
//! the Error Information log (01h), the telemetry captures (07h, 08h), the
//! Persistent Event Log (0Dh) and the Reservation Notifications (80h).
//!
//! What is what, for a save and restore of the controller:
//! * configuration: the Persistent Event Log's size (from the controller's
//!   configuration);
//! * guest-visible state: the events queued and masked, the outstanding
//!   AER command ids, the error log and its count, the telemetry captures,
//!   the Persistent Event Log with its reporting context, and the
//!   Reservation Notifications with their masks;
//! * transient: nothing (every value here is something a host can read).

pub(crate) mod persistent_event_log;
pub(crate) mod reservation_notices;
mod saved;
pub(crate) mod telemetry;

use std::collections::VecDeque;
use std::time::Duration;

use parking_lot::Mutex;
use vnvme_spec::log::{async_event, ErrorLogEntry};
use vnvme_spec::Status;
use zerocopy::little_endian::{U16, U32, U64};

use crate::stats::Stats;
use persistent_event_log::PersistentEventLog;
use reservation_notices::ReservationNotices;
pub(crate) use saved::SavedReporting;
use telemetry::{Capture, Telemetry};

/// Asynchronous Event Request Limit, 0's based (Identify Controller AERL).
pub(crate) const AERL: u8 = 3;
/// Error Log Page Entries, 0's based (ELPE).
pub(crate) const ELPE: u8 = 63;
const MAX_QUEUED_EVENTS: usize = 16;

/// Outstanding Asynchronous Event Requests and events not yet reported (§5.2).
#[derive(Debug, Default)]
pub(crate) struct Events {
    /// CIDs of outstanding AER commands.
    pub outstanding: Vec<u16>,
    /// Completion dword 0 of events waiting for an AER.
    pub queue: VecDeque<u32>,
    /// Event types (bit per type) reported and not yet cleared by reading
    /// their log page: further events of that type are dropped (§5.2).
    pub masked: u8,
}

#[derive(Debug, Default)]
pub(crate) struct ErrorLog {
    pub count: u64,
    /// Newest first.
    pub entries: VecDeque<ErrorLogEntry>,
}

/// The reports, each behind its own leaf lock.
pub(crate) struct Reporting {
    pub events: Mutex<Events>,
    pub error_log: Mutex<ErrorLog>,
    /// Telemetry captures (log pages 07h, 08h).
    pub telemetry: Telemetry,
    /// Persistent Event Log (0Dh).
    pub persistent_events: PersistentEventLog,
    /// Reservation Notification log (80h) and masks (82h).
    pub reservation_notices: Mutex<ReservationNotices>,
}

impl Reporting {
    pub fn new(persistent_events: PersistentEventLog) -> Self {
        Self {
            events: Mutex::new(Events::default()),
            error_log: Mutex::new(ErrorLog::default()),
            telemetry: Telemetry::default(),
            persistent_events,
            reservation_notices: Mutex::default(),
        }
    }

    /// Queues an event of `kind` unless its type is masked (reported and
    /// its log page not read yet) or the queue is full; `true` if queued.
    pub fn queue_event(&self, kind: u8, info: u8, lid: u8) -> bool {
        let bit = 1u8 << (kind & 0x7);
        let mut e = self.events.lock();
        if e.masked & bit != 0 || e.queue.len() >= MAX_QUEUED_EVENTS {
            return false;
        }
        e.masked |= bit;
        e.queue.push_back(async_event::dword0(kind, info, lid));
        true
    }

    /// Adds an entry to the Error Information log.
    pub fn record_error(&self, sqid: u16, cid: u16, nsid: u32, status: Status) {
        let mut log = self.error_log.lock();
        log.count = log.count.wrapping_add(1).max(1);
        let mut e = ErrorLogEntry::default();
        e.error_count = U64::new(log.count);
        e.sqid = U16::new(sqid);
        e.cid = U16::new(cid);
        e.status = U16::new(status.raw() << 1);
        e.param_error_location = U16::new(0xFFFF);
        e.nsid = U32::new(nsid);
        log.entries.push_front(e);
        log.entries.truncate(usize::from(ELPE) + 1);
    }

    /// The controller's state now, for a telemetry log: `uptime` since
    /// power on.
    pub fn telemetry_capture(&self, stats: &Stats, uptime: Duration, reason: &str) -> Capture {
        let errors = self.error_log.lock();
        Capture::new(stats, &errors.entries, uptime, reason)
    }

    /// CSTS.CFS is being set: the Telemetry Controller-Initiated data
    /// records why and the state then (unless the host has not released
    /// the previous capture).
    pub fn controller_telemetry(&self, stats: &Stats, uptime: Duration, reason: &str) {
        let kept = self
            .telemetry
            .controller_initiated(self.telemetry_capture(stats, uptime, reason));
        tracing::debug!(kept, "controller-initiated telemetry: {reason}");
    }
}
