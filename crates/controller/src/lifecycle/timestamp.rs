//! The controller's Timestamp (the Timestamp feature, 0Eh): what Get
//! Features reports and what the Persistent Event Log stamps its events
//! with.

use std::time::Instant;

use vnvme_spec::feature::{timestamp_origin, Timestamp};

/// The Timestamp feature's clock (§5.27.1.11): milliseconds from a base
/// (the host's value, or 0 at the last Controller Level Reset) counted on
/// a monotonic clock, so it advances continuously (Synch stays 0).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TimestampClock {
    base_ms: u64,
    since: Instant,
    origin: u8,
}

impl TimestampClock {
    /// Timestamp Origin 000b: counting from a Controller Level Reset at `at`.
    pub fn reset(at: Instant) -> Self {
        Self {
            base_ms: 0,
            since: at,
            origin: timestamp_origin::RESET,
        }
    }

    /// Timestamp Origin 001b: the host's `tstmp` at `at`.
    pub fn set(tstmp: u64, at: Instant) -> Self {
        Self {
            base_ms: tstmp,
            since: at,
            origin: timestamp_origin::SET_FEATURES,
        }
    }

    /// A restored clock: `value` (milliseconds, as [`read`](Self::read)
    /// gave it when saved) at `at`, of `origin`.
    pub fn restored(value: u64, origin: u8, at: Instant) -> Self {
        Self {
            base_ms: value,
            since: at,
            origin,
        }
    }

    /// The value at `now`: TSTMP wraps modulo 2^48 (the field's width).
    pub fn read(&self, now: Instant) -> Timestamp {
        let elapsed = now.saturating_duration_since(self.since).as_millis();
        let ms = u64::try_from(elapsed).unwrap_or(u64::MAX);
        Timestamp::new()
            .with_tstmp(self.base_ms.wrapping_add(ms) & ((1 << 48) - 1))
            .with_origin(self.origin)
    }
}
