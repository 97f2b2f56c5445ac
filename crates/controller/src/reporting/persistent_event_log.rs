//! The Persistent Event Log (log page 0Dh, §5.16.1.14): events recorded as
//! they happen, kept for the controller's life (across controller resets
//! and client reconnects; "persistent" ends with the process), oldest
//! dropped beyond [`PELS`] x 64 KiB.
//!
//! Recorded: Power-on or Reset (the controller's creation, and every
//! Controller Level Reset of an enabled controller), Change Namespace
//! (Namespace Management create and delete), Format NVM Start and
//! Completion, Telemetry Log Create (a host-initiated capture), Firmware
//! Commit (every command, failed ones too, with its status), Sanitize
//! Start and Completion.
//!
//! Events and the header carry the controller's Timestamp (the Timestamp
//! feature's value and origin, [`TimestampClock`]) as it was when they
//! happened: the host's clock once it set one (Linux does at every
//! controller start), else milliseconds since the last reset.
//!
//! A host reads the log through a reporting context: a snapshot taken by
//! the Establish Context action, read in pieces, then released.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use vnvme_spec::identify::fill_ascii;
use vnvme_spec::log::persistent_event::{
    ChangeNamespaceEvent, EventType, FirmwareCommitEvent, FormatCompletionEvent, FormatStartEvent,
    PersistentEventHeader, PersistentEventLogHeader, ReportingContext, ResetInformation,
    SanitizeCompletionEvent, SanitizeStartEvent, EVENT_HEADER_LENGTH, LOG_HEADER_LENGTH,
    LOG_REVISION,
};
use vnvme_spec::log::LogPageId;
use vnvme_spec::Status;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::IntoBytes;

use crate::config::ControllerConfig;
use crate::lifecycle::timestamp::TimestampClock;

/// Persistent Event Log Size (Identify Controller PELS), 64 KiB units: the
/// whole log, header included, never exceeds it.
pub(crate) const PELS: u32 = 1;
const MAX_LOG_BYTES: usize = PELS as usize * 64 * 1024;
const HEADER_BYTES: usize = 512;
const EVENT_HEADER_BYTES: usize = 24;
/// Revision of every event type recorded here.
const EVENT_TYPE_REVISION: u8 = 1;

/// Event types this controller records.
pub(crate) const SUPPORTED: &[EventType] = &[
    EventType::POWER_ON_OR_RESET,
    EventType::CHANGE_NAMESPACE,
    EventType::FORMAT_NVM_START,
    EventType::FORMAT_NVM_COMPLETION,
    EventType::TELEMETRY_LOG_CREATE,
    EventType::FIRMWARE_COMMIT,
    EventType::SANITIZE_START,
    EventType::SANITIZE_COMPLETION,
];

mod saved;
pub(crate) use saved::SavedPersistentEventLog;

fn power_on_ms(created: Instant, at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(created).as_millis()).unwrap_or(u64::MAX)
}

struct Event {
    etype: EventType,
    at: Instant,
    /// The Timestamp at `at` (Timestamp feature format).
    ts: u64,
    data: Vec<u8>,
}

impl Event {
    fn len(&self) -> usize {
        EVENT_HEADER_BYTES + self.data.len()
    }
}

#[derive(Default)]
struct Store {
    /// Ordered by time; an event timed in the future (a format that
    /// completes later) stays out of the log until then.
    events: VecDeque<Event>,
    /// Sum of the events' lengths.
    bytes: usize,
    /// Generation Number: incremented whenever old events are dropped.
    generation: u16,
    /// The reporting context: the log as it was when established.
    context: Option<Arc<Vec<u8>>>,
}

/// The log (a leaf lock).
pub(crate) struct PersistentEventLog {
    store: Mutex<Store>,
    /// Power on (a restore moves it back by the saved power-on time).
    created: Mutex<Instant>,
    /// The controller's Timestamp, shared with the Timestamp feature.
    clock: Arc<Mutex<TimestampClock>>,
    cntlid: u16,
    firmware: [u8; 8],
    /// The header's fields that never change.
    template: Box<PersistentEventLogHeader>,
}

impl std::fmt::Debug for PersistentEventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PersistentEventLog")
            .field("events", &self.store.lock().events.len())
            .finish_non_exhaustive()
    }
}

impl PersistentEventLog {
    /// An empty log for the controller of `config`, powered on at `created`,
    /// its timestamps read from `clock`.
    pub fn new(
        config: &ControllerConfig,
        created: Instant,
        clock: Arc<Mutex<TimestampClock>>,
    ) -> Self {
        let mut t = PersistentEventLogHeader::new_boxed();
        t.lid = LogPageId::PERSISTENT_EVENT.0;
        t.rv = LOG_REVISION;
        t.lhl = U16::new(LOG_HEADER_LENGTH);
        t.vid = U16::new(config.vid);
        t.ssvid = U16::new(config.ssvid);
        fill_ascii(&mut t.sn, &config.serial);
        fill_ascii(&mut t.mn, &config.model);
        // SUBNQN is null padded, as in Identify Controller.
        let nqn = config.nqn();
        let n = nqn.len().min(t.subnqn.len() - 1);
        t.subnqn[..n].copy_from_slice(&nqn.as_bytes()[..n]);
        for e in SUPPORTED {
            if let Some(byte) = t.seb.get_mut(usize::from(e.0 / 8)) {
                *byte |= 1 << (e.0 % 8);
            }
        }
        let mut firmware = [b' '; 8];
        fill_ascii(&mut firmware, &config.firmware);
        Self {
            store: Mutex::default(),
            created: Mutex::new(created),
            clock,
            cntlid: config.cntlid,
            firmware,
            template: t,
        }
    }

    /// Adds an event of `etype` that happened (or will, for a completion
    /// known in advance) at `at`, dropping the oldest to stay in bounds.
    pub fn record(&self, etype: EventType, at: Instant, data: Vec<u8>) {
        let ts = self.timestamp(at);
        let event = Event {
            etype,
            at,
            ts,
            data,
        };
        let mut s = self.store.lock();
        while !s.events.is_empty() && HEADER_BYTES + s.bytes + event.len() > MAX_LOG_BYTES {
            if let Some(old) = s.events.pop_front() {
                s.bytes -= old.len();
            }
            s.generation = s.generation.wrapping_add(1);
        }
        s.bytes += event.len();
        let i = s.events.partition_point(|e| e.at <= at);
        s.events.insert(i, event);
    }

    /// Records a Power-on or Reset event at `at`, the Power Cycle Count
    /// being `power_cycles`.
    pub fn power_on_or_reset(&self, at: Instant, power_cycles: u64) {
        let mut info = ResetInformation::default();
        info.cntlid = U16::new(self.cntlid);
        info.cpc = U32::new(u32::try_from(power_cycles).unwrap_or(u32::MAX));
        info.pwrontime = U64::new(power_on_ms(*self.created.lock(), at));
        info.ctime = U64::new(self.timestamp(at));
        let mut data = self.firmware.to_vec();
        data.extend_from_slice(info.as_bytes());
        self.record(EventType::POWER_ON_OR_RESET, at, data);
    }

    /// Establish Context: snapshots the log as of `now` and returns it, or
    /// `None` if a context already exists (it must be released first).
    pub fn establish(&self, now: Instant, power_cycles: u64) -> Option<Arc<Vec<u8>>> {
        let mut s = self.store.lock();
        if s.context.is_some() {
            return None;
        }
        let page = Arc::new(self.page(&s, now, power_cycles));
        s.context = Some(Arc::clone(&page));
        Some(page)
    }

    /// The established reporting context's log.
    pub fn context(&self) -> Option<Arc<Vec<u8>>> {
        self.store.lock().context.clone()
    }

    /// Release Context (also at a Controller Level Reset: the host that
    /// took it is gone).
    pub fn release(&self) {
        self.store.lock().context = None;
    }

    /// The Timestamp at `at`.
    fn timestamp(&self, at: Instant) -> u64 {
        self.clock.lock().read(at).into()
    }

    fn page(&self, s: &Store, now: Instant, power_cycles: u64) -> Vec<u8> {
        let mut h = self.template.clone();
        let mut page = vec![0u8; HEADER_BYTES];
        let mut count = 0u32;
        for e in s.events.iter().take_while(|e| e.at <= now) {
            let mut eh = PersistentEventHeader::default();
            eh.etype = e.etype.0;
            eh.etype_rev = EVENT_TYPE_REVISION;
            eh.ehl = EVENT_HEADER_LENGTH;
            eh.cntlid = U16::new(self.cntlid);
            eh.ets = U64::new(e.ts);
            // Our events' data are at most a telemetry header long.
            eh.el = U16::new(e.data.len() as u16);
            page.extend_from_slice(eh.as_bytes());
            page.extend_from_slice(&e.data);
            count += 1;
        }
        h.tnev = U32::new(count);
        h.tll = U64::new(page.len() as u64);
        h.ts = U64::new(self.timestamp(now));
        let hours = now
            .saturating_duration_since(*self.created.lock())
            .as_secs()
            / 3600;
        h.poh = u128::from(hours).to_le_bytes();
        h.pcc = U64::new(power_cycles);
        h.gn = U16::new(s.generation);
        // The context was established through our one port (an NVM
        // subsystem port, identifier 0).
        h.rci = U32::new(ReportingContext::new().with_rce(true).with_rcpit(1).into());
        page[..HEADER_BYTES].copy_from_slice(h.as_bytes());
        page
    }
}

/// Format NVM Start event data for a Format NVM of `nsid` with `cdw10`.
pub(crate) fn format_start(nsid: u32, fna: u8, cdw10: u32) -> Vec<u8> {
    let mut e = FormatStartEvent::default();
    e.nsid = U32::new(nsid);
    e.fna = fna;
    e.format_cdw10 = U32::new(cdw10);
    e.as_bytes().to_vec()
}

/// Format NVM Completion event data: completed, or failed with `status`.
pub(crate) fn format_completion(nsid: u32, result: Result<(), Status>) -> Vec<u8> {
    let status = result.err();
    FormatCompletionEvent {
        nsid: U32::new(nsid),
        status: u8::from(status.is_some()),
        sf: U32::new(status.map_or(0, |s| u32::from(s.raw()))),
        ..Default::default()
    }
    .as_bytes()
    .to_vec()
}

/// Firmware Commit event data: the revision running before, the one in
/// the slot committed, the command's CA and FS, and its status.
pub(crate) fn firmware_commit(
    old_fr: [u8; 8],
    new_fr: [u8; 8],
    ca: u8,
    fs: u8,
    status: Option<Status>,
) -> Vec<u8> {
    FirmwareCommitEvent {
        old_fr,
        new_fr,
        ca,
        fs,
        sct: status.map_or(0, Status::sct),
        sc: status.map_or(0, Status::sc),
        ..Default::default()
    }
    .as_bytes()
    .to_vec()
}

/// Sanitize Start event data.
pub(crate) fn sanitize_start(sanicap: u32, cdw10: u32, cdw11: u32) -> Vec<u8> {
    SanitizeStartEvent {
        sanicap: U32::new(sanicap),
        sanitize_cdw10: U32::new(cdw10),
        sanitize_cdw11: U32::new(cdw11),
    }
    .as_bytes()
    .to_vec()
}

/// Sanitize Completion event data: SPROG and SSTAT as the Sanitize Status
/// log shows them when the operation ended.
pub(crate) fn sanitize_completion(sprog: u16, sstat: u16) -> Vec<u8> {
    let mut e = SanitizeCompletionEvent::default();
    e.sprog = U16::new(sprog);
    e.sstat = U16::new(sstat);
    e.as_bytes().to_vec()
}

/// Change Namespace event data: Namespace Management (`cdw10`) created or
/// deleted namespace `nsid` of `nsze` blocks in format `flbas`.
pub(crate) fn change_namespace(cdw10: u32, nsid: u32, nsze: u64, flbas: u8) -> Vec<u8> {
    let mut e = ChangeNamespaceEvent::default();
    e.nsmgt_cdw10 = U32::new(cdw10);
    e.nsze = U64::new(nsze);
    // No thin provisioning: capacity is the size.
    e.nscap = U64::new(nsze);
    e.flbas = flbas;
    e.nsid = U32::new(nsid);
    e.as_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn log() -> (PersistentEventLog, Instant) {
        let t0 = Instant::now();
        (
            PersistentEventLog::new(
                &ControllerConfig::default(),
                t0,
                Arc::new(Mutex::new(TimestampClock::reset(t0))),
            ),
            t0,
        )
    }

    fn types(page: &[u8]) -> Vec<u8> {
        let mut at = HEADER_BYTES;
        let mut out = Vec::new();
        while at + EVENT_HEADER_BYTES <= page.len() {
            out.push(page[at]);
            let el = u16::from_le_bytes([page[at + 22], page[at + 23]]);
            at += EVENT_HEADER_BYTES + usize::from(el);
        }
        out
    }

    #[test]
    fn events_in_time_order_and_future_ones_held_back() {
        let (pel, t0) = log();
        pel.power_on_or_reset(t0, 0);
        let later = t0 + Duration::from_secs(60);
        pel.record(
            EventType::FORMAT_NVM_COMPLETION,
            later,
            format_completion(1, Ok(())),
        );
        pel.record(EventType::FORMAT_NVM_START, t0, format_start(1, 0, 0));
        let page = pel.establish(t0, 0).unwrap();
        assert_eq!(types(&page), [0x04, 0x07]);
        pel.release();
        let page = pel.establish(later, 0).unwrap();
        assert_eq!(types(&page), [0x04, 0x07, 0x08]);
        let tll = u64::from_le_bytes(page[8..16].try_into().unwrap());
        assert_eq!(tll, page.len() as u64);
    }

    #[test]
    fn the_log_stays_within_pels_dropping_the_oldest() {
        let (pel, t0) = log();
        for i in 0..5000u64 {
            pel.power_on_or_reset(t0 + Duration::from_millis(i), i);
        }
        let now = t0 + Duration::from_secs(10);
        let page = pel.establish(now, 0).unwrap();
        assert!(page.len() <= MAX_LOG_BYTES);
        assert!(page.len() + 68 > MAX_LOG_BYTES, "full, not emptied");
        let first_cpc =
            u32::from_le_bytes(page[HEADER_BYTES + 24 + 8 + 16..][..4].try_into().unwrap());
        assert!(first_cpc > 0, "the oldest were dropped");
        assert_ne!(u16::from_le_bytes([page[372], page[373]]), 0, "GN moved");
    }
}
