//! The reports' saved form (docs/state-format.md, `reporting`): the
//! asynchronous events queued and masked, the outstanding Asynchronous
//! Event Requests (their CIDs: a restored controller completes them when
//! an event comes, as the saved one would have), the Error Information
//! log, the telemetry captures, the Persistent Event Log and the
//! Reservation Notifications.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use vnvme_spec::log::ErrorLogEntry;
use zerocopy::IntoBytes;

use super::persistent_event_log::SavedPersistentEventLog;
use super::reservation_notices::{ReservationNotices, SavedReservationNotices};
use super::telemetry::SavedTelemetry;
use super::{ErrorLog, Events, Reporting, AERL, ELPE, MAX_QUEUED_EVENTS};
use crate::saved_check::{at_most, hex, record, InvalidState};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedReporting {
    /// CIDs of the outstanding AER commands, oldest first.
    pub aer_cids: Vec<u16>,
    /// Completion dword 0 of each event waiting for an AER, oldest first.
    pub events: Vec<u32>,
    /// Event types (a bit per type) reported and not yet cleared.
    pub masked: u8,
    /// Error Count of the newest error log entry.
    pub error_count: u64,
    /// The error log's 64-byte entries, newest first.
    pub error_log: Vec<SavedErrorEntry>,
    pub telemetry: SavedTelemetry,
    pub persistent_events: SavedPersistentEventLog,
    /// Reservation Notification log (80h) and masks (82h); absent in
    /// states saved before they were.
    #[serde(default)]
    pub reservation_notices: SavedReservationNotices,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedErrorEntry(#[serde(with = "hex")] pub Vec<u8>);

impl Reporting {
    pub fn save(&self, now: Instant) -> SavedReporting {
        let (aer_cids, events, masked) = {
            let e = self.events.lock();
            (
                e.outstanding.clone(),
                e.queue.iter().copied().collect(),
                e.masked,
            )
        };
        let (error_count, error_log) = {
            let log = self.error_log.lock();
            let entries = log.entries.iter();
            let entries = entries.map(|e| SavedErrorEntry(e.as_bytes().to_vec()));
            (log.count, entries.collect())
        };
        SavedReporting {
            aer_cids,
            events,
            masked,
            error_count,
            error_log,
            telemetry: self.telemetry.save(),
            persistent_events: self.persistent_events.save(now),
            reservation_notices: self.reservation_notices.lock().save(),
        }
    }

    pub fn restore(&self, saved: &SavedReporting, now: Instant) -> Result<(), InvalidState> {
        at_most(
            "the outstanding Asynchronous Event Requests",
            saved.aer_cids.len() as u64,
            u64::from(AERL) + 1,
        )?;
        at_most(
            "the queued asynchronous events",
            saved.events.len() as u64,
            MAX_QUEUED_EVENTS as u64,
        )?;
        at_most(
            "the error log's entries",
            saved.error_log.len() as u64,
            u64::from(ELPE) + 1,
        )?;
        let entries = (saved.error_log.iter())
            .map(|e| record::<ErrorLogEntry>("an error log entry", &e.0))
            .collect::<Result<_, _>>()?;
        let notices = ReservationNotices::restore(&saved.reservation_notices)?;
        self.telemetry.restore(&saved.telemetry)?;
        self.persistent_events
            .restore(&saved.persistent_events, now)?;
        *self.events.lock() = Events {
            outstanding: saved.aer_cids.clone(),
            queue: saved.events.iter().copied().collect(),
            masked: saved.masked,
        };
        *self.error_log.lock() = ErrorLog {
            count: saved.error_count,
            entries,
        };
        *self.reservation_notices.lock() = notices;
        Ok(())
    }
}
