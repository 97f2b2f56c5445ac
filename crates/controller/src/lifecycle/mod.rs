//! The controller's lifecycle as the workers and command handlers see it:
//! CC as last written, CSTS.RDY and CSTS.CFS, when it was last enabled,
//! when it was created (power-on hours), and the Timestamp feature's clock.
//! The register file itself (`regs`) belongs to the control thread; this is
//! the part of it the other threads read, each value published by the
//! control thread after a register write.
//!
//! What is what, for a save and restore of the controller:
//! * guest-visible state: CC, RDY, CFS and the Timestamp clock (its base
//!   and origin; restored relative to the new process's clock);
//! * transient: when the controller was created and last enabled (a
//!   restore keeps their distance to now, so power-on hours and namespace
//!   readiness go on counting).

pub(crate) mod saved;
pub(crate) mod timestamp;

pub(crate) use saved::SavedLifecycle;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use vnvme_spec::regs::Cc;

use timestamp::TimestampClock;

#[derive(Debug)]
pub(crate) struct Lifecycle {
    /// CC as last written (workers read IOSQES/IOCQES at queue creation).
    cc: AtomicU32,
    /// CSTS.RDY as workers and doorbell traps see it.
    ready: AtomicBool,
    /// A fatal error (CSTS.CFS): queue memory unreachable. Workers stop.
    fatal: AtomicBool,
    /// When CC.EN last went to 1 (namespace readiness counts from it).
    enabled_at: Mutex<Option<Instant>>,
    /// A restore moves it back by the saved uptime.
    created: Mutex<Instant>,
    /// The Timestamp feature's clock, which the Persistent Event Log's
    /// timestamps read too.
    timestamp: Arc<Mutex<TimestampClock>>,
}

impl Lifecycle {
    /// A controller created at `created`, disabled, its Timestamp counting
    /// from then.
    pub fn new(created: Instant) -> Self {
        Self {
            cc: AtomicU32::new(0),
            ready: AtomicBool::new(false),
            fatal: AtomicBool::new(false),
            enabled_at: Mutex::new(None),
            created: Mutex::new(created),
            timestamp: Arc::new(Mutex::new(TimestampClock::reset(created))),
        }
    }

    /// CC as last written.
    pub fn cc(&self) -> Cc {
        Cc::from(self.cc.load(Ordering::Acquire))
    }

    pub fn set_cc(&self, cc: Cc) {
        self.cc.store(u32::from(cc), Ordering::Release);
    }

    /// CSTS.RDY.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// CC.EN went to 1 at `now`: namespace readiness counts from then.
    pub fn enabled(&self, now: Instant) {
        *self.enabled_at.lock() = Some(now);
    }

    /// Enable done (CSTS.RDY, CFS clear): the workers run.
    pub fn set_ready(&self) {
        self.fatal.store(false, Ordering::Release);
        self.ready.store(true, Ordering::Release);
    }

    /// Controller reset begins: not ready, not enabled.
    pub fn reset(&self) {
        self.ready.store(false, Ordering::Release);
        *self.enabled_at.lock() = None;
    }

    /// CSTS.CFS.
    pub fn fatal(&self) -> bool {
        self.fatal.load(Ordering::Acquire)
    }

    /// Sets CSTS.CFS; `true` if it was clear.
    pub fn set_fatal(&self) -> bool {
        !self.fatal.swap(true, Ordering::AcqRel)
    }

    /// Clears CSTS.CFS (controller reset).
    pub fn clear_fatal(&self) {
        self.fatal.store(false, Ordering::Release);
    }

    /// When CC.EN last went to 1 (`None` while disabled).
    pub fn enabled_at(&self) -> Option<Instant> {
        *self.enabled_at.lock()
    }

    /// Time since the controller was last enabled (zero while disabled).
    pub fn since_enable(&self, now: Instant) -> Duration {
        self.enabled_at()
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t))
    }

    /// Time since power on.
    pub fn uptime(&self) -> Duration {
        self.created.lock().elapsed()
    }

    /// Power-on hours (SMART, device self-test results): since the
    /// controller was created.
    pub fn power_on_hours(&self) -> u64 {
        self.uptime().as_secs() / 3600
    }

    /// The Timestamp feature's clock now.
    pub fn timestamp(&self) -> TimestampClock {
        *self.timestamp.lock()
    }

    /// Set Features Timestamp, or a Controller Level Reset.
    pub fn set_timestamp(&self, clock: TimestampClock) {
        *self.timestamp.lock() = clock;
    }

    /// The clock itself, for the Persistent Event Log's timestamps.
    pub fn clock(&self) -> Arc<Mutex<TimestampClock>> {
        Arc::clone(&self.timestamp)
    }
}
