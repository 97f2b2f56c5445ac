//! Telemetry (NVMe Base 2.0 §8.24): snapshots of the controller's state
//! that a host saves (`nvme telemetry-log`) for whoever reads them later.
//!
//! A host-initiated capture is taken when the host asks (Get Log Page 07h
//! with LSP.CTHID set). A controller-initiated one is taken when the
//! controller sets CSTS.CFS, and is latched: no later failure replaces it
//! until the host releases it by reading log 08h with RAE cleared, so the
//! host sees the first failure, not the last.
//!
//! # Data layout (ours; little endian)
//!
//! The header's IEEE OUI is 000000h, as in Identify Controller; the data
//! areas carry their own signature. Block 0 is the header; each data area
//! is whole 512-byte blocks, zero padded, and an empty area takes none.
//!
//! * Data Area 1, controller counters: bytes 0..8 the signature
//!   `VNVMETEL`, 8..12 the layout version (1), 12..16 the number N of
//!   counters, 16..24 milliseconds since power-on at the capture, then N
//!   64-bit counters in the order [`counters`] names them.
//! * Data Area 2, recent errors: the Error Information log's entries
//!   (64 bytes each, §5.16.1.2), newest first.
//! * Data Area 3, queue counters: for each queue id with a non-zero
//!   counter, 72 bytes: the qid (16 bits), 6 reserved bytes, then eight
//!   64-bit counters: SQ tail doorbell traps, CQ head doorbell traps,
//!   shadow doorbell reads, EventIdx writes, commands, error completions,
//!   interrupts, invalid doorbell writes.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use parking_lot::Mutex;
use vnvme_spec::log::telemetry::{TelemetryHeader, BLOCK};
use vnvme_spec::log::{ErrorLogEntry, LogPageId};
use zerocopy::little_endian::U16;
use zerocopy::IntoBytes;

use crate::stats::{ControllerStats, QueueStats, Stats};

/// Signature at the start of Data Area 1.
pub(crate) const SIGNATURE: &[u8; 8] = b"VNVMETEL";
const LAYOUT_VERSION: u32 = 1;
/// Bytes of a Data Area 3 record.
pub(crate) const QUEUE_RECORD: usize = 72;

/// The controller-wide counters of Data Area 1, named, in their order:
/// the `snapshot` of `stats`, and the SMART / health counters.
pub(crate) fn counters(stats: &Stats, s: &ControllerStats) -> Vec<(&'static str, u64)> {
    vec![
        ("commands", s.commands),
        ("errors", s.errors),
        ("sq_doorbell_traps", s.sq_doorbell_traps),
        ("cq_doorbell_traps", s.cq_doorbell_traps),
        ("shadow_reads", s.shadow_reads),
        ("eventidx_writes", s.eventidx_writes),
        ("interrupts", s.interrupts),
        ("invalid_doorbell_writes", s.invalid_doorbell_writes),
        ("invalid_register_accesses", s.invalid_register_accesses),
        ("controller_resets", s.controller_resets),
        ("enables", s.enables),
        ("fatal_errors", s.fatal_errors),
        ("shadow_errors", s.shadow_errors),
        ("worker_wakeups", s.worker_wakeups),
        ("eventidx_arms", s.eventidx_arms),
        ("dbbuf_configs", s.dbbuf_configs),
        ("backend_errors", s.backend_errors),
        ("sectors_read", stats.data_units_read_512()),
        ("sectors_written", stats.data_units_written_512()),
        ("host_read_commands", stats.host_read_commands()),
        ("host_write_commands", stats.host_write_commands()),
        ("power_cycles", stats.power_cycles.load(Relaxed)),
        ("unsafe_shutdowns", stats.unsafe_shutdowns.load(Relaxed)),
        ("media_errors", stats.media_errors.load(Relaxed)),
    ]
}

mod saved;
pub(crate) use saved::SavedTelemetry;

/// The data areas of one capture.
#[derive(Debug, Clone)]
pub(crate) struct Capture {
    /// Data areas 1 to 3, whole blocks (block 1 of the log onwards).
    data: Vec<u8>,
    /// Last block of data areas 1, 2 and 3.
    last_block: [u16; 3],
    reason: [u8; 128],
}

impl Capture {
    /// The controller's state now: its counters, the Error Information
    /// log's `errors` (newest first) and why the capture was taken.
    pub fn new<'a>(
        stats: &Stats,
        errors: impl IntoIterator<Item = &'a ErrorLogEntry>,
        since_power_on: Duration,
        reason: &str,
    ) -> Self {
        let snapshot = stats.snapshot();
        let counters = counters(stats, &snapshot);
        let mut area1 = Vec::with_capacity(24 + counters.len() * 8);
        area1.extend_from_slice(SIGNATURE);
        area1.extend_from_slice(&LAYOUT_VERSION.to_le_bytes());
        area1.extend_from_slice(&(counters.len() as u32).to_le_bytes());
        let ms = u64::try_from(since_power_on.as_millis()).unwrap_or(u64::MAX);
        area1.extend_from_slice(&ms.to_le_bytes());
        for (_, v) in &counters {
            area1.extend_from_slice(&v.to_le_bytes());
        }
        let area2: Vec<u8> = errors
            .into_iter()
            .flat_map(|e| e.as_bytes().iter().copied())
            .collect();
        let area3: Vec<u8> = snapshot.queues.iter().flat_map(queue_record).collect();
        let mut data = Vec::new();
        let mut last_block = [0u16; 3];
        let mut last = 0u16;
        for (slot, area) in last_block.iter_mut().zip([area1, area2, area3]) {
            let blocks = area.len().div_ceil(BLOCK);
            // DAnLB is 16 bits: an area that would not fit is left out.
            if let Some(end) = u16::try_from(blocks).ok().and_then(|b| last.checked_add(b)) {
                data.extend_from_slice(&area);
                data.resize(usize::from(end) * BLOCK, 0);
                last = end;
            }
            *slot = last;
        }
        let mut r = [0u8; 128];
        let n = reason.len().min(r.len());
        r[..n].copy_from_slice(&reason.as_bytes()[..n]);
        Self {
            data,
            last_block,
            reason: r,
        }
    }

    /// Keeps data areas 1 to `mcda` (Maximum Created Data Area; 0 lets the
    /// controller decide: all of them; 4 asks for area 4, which we do not
    /// have, so all of ours).
    pub fn limit(mut self, mcda: u8) -> Self {
        if let Some(keep) = usize::from(mcda).checked_sub(1).filter(|&k| k < 2) {
            let last = self.last_block[keep];
            for lb in &mut self.last_block[keep + 1..] {
                *lb = last;
            }
            self.data.truncate(usize::from(last) * BLOCK);
        }
        self
    }
}

fn queue_record(q: &QueueStats) -> Vec<u8> {
    let mut r = Vec::with_capacity(QUEUE_RECORD);
    r.extend_from_slice(&q.qid.to_le_bytes());
    r.extend_from_slice(&[0; 6]);
    for v in [
        q.sq_doorbell_traps,
        q.cq_doorbell_traps,
        q.shadow_reads,
        q.eventidx_writes,
        q.commands,
        q.errors,
        q.interrupts,
        q.invalid_doorbell_writes,
    ] {
        r.extend_from_slice(&v.to_le_bytes());
    }
    r
}

#[derive(Debug, Default)]
struct State {
    host: Option<Capture>,
    host_generation: u8,
    /// Some while the host has not released it (Data Available = 1).
    controller: Option<Capture>,
    controller_generation: u8,
}

/// The two telemetry logs' captures (a leaf lock).
#[derive(Debug, Default)]
pub(crate) struct Telemetry {
    state: Mutex<State>,
}

impl Telemetry {
    /// Replaces the host-initiated data with `capture`.
    pub fn host_initiated(&self, capture: Capture) {
        let mut s = self.state.lock();
        s.host = Some(capture);
        s.host_generation = s.host_generation.wrapping_add(1);
    }

    /// Keeps `capture` as the controller-initiated data, unless the host
    /// has not yet released the previous one. Whether it was kept.
    pub fn controller_initiated(&self, capture: Capture) -> bool {
        let mut s = self.state.lock();
        if s.controller.is_some() {
            return false;
        }
        s.controller = Some(capture);
        s.controller_generation = s.controller_generation.wrapping_add(1);
        true
    }

    /// The host read log 08h with RAE cleared: forget the capture of
    /// generation `generation` it saw (not one taken since).
    pub fn release_controller(&self, generation: u8) {
        let mut s = self.state.lock();
        if s.controller.is_some() && s.controller_generation == generation {
            s.controller = None;
        }
    }

    /// Log 07h or 08h: the header, then the capture's data areas (none if
    /// there is no capture).
    pub fn page(&self, lid: LogPageId) -> Vec<u8> {
        let s = self.state.lock();
        let host = lid == LogPageId::TELEMETRY_HOST_INITIATED;
        let capture = if host { &s.host } else { &s.controller };
        let mut h = TelemetryHeader::new_boxed();
        h.lid = lid.0;
        if host {
            h.hostdgn = s.host_generation;
        }
        h.ctrlavail = u8::from(s.controller.is_some());
        h.ctrldgn = s.controller_generation;
        let mut page = Vec::with_capacity(BLOCK);
        if let Some(c) = capture {
            h.dalb1 = U16::new(c.last_block[0]);
            h.dalb2 = U16::new(c.last_block[1]);
            h.dalb3 = U16::new(c.last_block[2]);
            h.rsnident = c.reason;
            page.extend_from_slice(h.as_bytes());
            page.extend_from_slice(&c.data);
        } else {
            page.extend_from_slice(h.as_bytes());
        }
        page
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture(errors: usize) -> Capture {
        let stats = Stats::new(4);
        stats.controller_resets.fetch_add(3, Relaxed);
        let e = ErrorLogEntry::default();
        Capture::new(
            &stats,
            std::iter::repeat_n(&e, errors),
            Duration::from_millis(1500),
            "test",
        )
    }

    #[test]
    fn areas_are_whole_blocks_and_last_blocks_follow_them() {
        let c = capture(9);
        // Area 1: 24 + 24 counters * 8 = 216 bytes, one block; area 2: 9
        // entries of 64 bytes, two blocks; area 3: no queue counted.
        assert_eq!(c.last_block, [1, 3, 3]);
        assert_eq!(c.data.len(), 3 * BLOCK);
        assert_eq!(&c.data[..8], SIGNATURE);
        let ms = u64::from_le_bytes(c.data[16..24].try_into().unwrap());
        assert_eq!(ms, 1500);
        let stats = Stats::new(1);
        let names = counters(&stats, &stats.snapshot());
        let i = names.iter().position(|(n, _)| *n == "controller_resets");
        let at = 24 + i.unwrap() * 8;
        assert_eq!(
            u64::from_le_bytes(c.data[at..at + 8].try_into().unwrap()),
            3
        );
    }

    #[test]
    fn mcda_limits_the_areas_created() {
        let c = capture(9).limit(1);
        assert_eq!(c.last_block, [1, 1, 1]);
        assert_eq!(c.data.len(), BLOCK);
        assert_eq!(capture(9).limit(0).last_block, [1, 3, 3]);
        assert_eq!(capture(9).limit(4).last_block, [1, 3, 3]);
    }

    #[test]
    fn controller_capture_is_latched_until_released() {
        let t = Telemetry::default();
        assert!(t.controller_initiated(capture(0)));
        assert!(!t.controller_initiated(capture(1)), "latched");
        let page = t.page(LogPageId::TELEMETRY_CONTROLLER_INITIATED);
        assert_eq!((page[382], page[383]), (1, 1));
        t.release_controller(0);
        assert_eq!(t.page(LogPageId::TELEMETRY_CONTROLLER_INITIATED)[382], 1);
        t.release_controller(1);
        let page = t.page(LogPageId::TELEMETRY_CONTROLLER_INITIATED);
        assert_eq!(page.len(), BLOCK, "header only once released");
        assert_eq!((page[382], page[383]), (0, 1));
    }
}
