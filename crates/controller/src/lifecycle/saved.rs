//! The lifecycle's saved form (docs/state-format.md, `lifecycle`). Times
//! are saved as distances from the moment of the save, so a restore in a
//! new process (another monotonic clock) keeps them counting: power-on
//! hours, namespace readiness since enable, the Timestamp feature.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vnvme_spec::regs::Cc;

use super::timestamp::TimestampClock;
use super::Lifecycle;
use crate::saved_check::{at_most, InvalidState};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedLifecycle {
    /// CC as last written.
    pub cc: u32,
    /// CSTS.RDY as the workers see it.
    pub ready: bool,
    /// CSTS.CFS.
    pub fatal: bool,
    /// Milliseconds since CC.EN last went to 1 (`None`: disabled).
    pub enabled_ms_ago: Option<u64>,
    /// Milliseconds since the controller was created (power-on time).
    pub uptime_ms: u64,
    /// The Timestamp feature's TSTMP at the save (milliseconds, 48 bits).
    pub timestamp_ms: u64,
    /// Its Timestamp Origin (000b reset, 001b Set Features).
    pub timestamp_origin: u8,
}

pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Lifecycle {
    pub fn save(&self, now: Instant) -> SavedLifecycle {
        let ts = self.timestamp().read(now);
        SavedLifecycle {
            cc: u32::from(self.cc()),
            ready: self.ready(),
            fatal: self.fatal(),
            enabled_ms_ago: self
                .enabled_at()
                .map(|t| ms(now.saturating_duration_since(t))),
            uptime_ms: ms(now.saturating_duration_since(*self.created.lock())),
            timestamp_ms: ts.tstmp(),
            timestamp_origin: ts.origin(),
        }
    }

    /// Applies `saved` to a new controller's lifecycle. A distance further
    /// back than this process's clock reaches starts at the clock's origin.
    pub fn restore(&self, saved: &SavedLifecycle, now: Instant) -> Result<(), InvalidState> {
        at_most("the Timestamp", saved.timestamp_ms, (1 << 48) - 1)?;
        at_most("the Timestamp Origin", u64::from(saved.timestamp_origin), 7)?;
        self.set_cc(Cc::from(saved.cc));
        self.ready.store(saved.ready, Ordering::Release);
        self.fatal.store(saved.fatal, Ordering::Release);
        *self.enabled_at.lock() = saved.enabled_ms_ago.map(|ms| before(now, ms));
        *self.created.lock() = before(now, saved.uptime_ms);
        self.set_timestamp(TimestampClock::restored(
            saved.timestamp_ms,
            saved.timestamp_origin,
            now,
        ));
        Ok(())
    }
}

/// `ms` milliseconds before `now`, or the earliest instant this process
/// can represent (an `Instant` cannot go before its clock's origin: the
/// distance is then shortened, found by halving).
pub(crate) fn before(now: Instant, ms: u64) -> Instant {
    let mut back = Duration::from_millis(ms);
    loop {
        if let Some(t) = now.checked_sub(back) {
            return t;
        }
        if back.is_zero() {
            return now;
        }
        back /= 2;
    }
}
