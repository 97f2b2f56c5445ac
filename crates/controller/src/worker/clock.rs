//! One reading of the clock, shared by whoever needs "now" in a round or
//! a poll group's wake-up.
//!
//! On a virtual machine `clock_gettime` is no free vDSO load: after a
//! poll group's thread slept 5 ms its first touches miss the caches, and
//! an idle wake-up used to read the clock twice per member (the back-off's
//! bookkeeping and the next deadline). A wake-up now reads it once and
//! hands that reading to every member's look; a worker's round reads it
//! only if its wake policy asks (the busy path reads it as often as
//! before).

use std::time::Instant;

/// "Now", read at most once, on first use.
#[derive(Debug, Default)]
pub(crate) struct Clock {
    now: Option<Instant>,
    /// Times this clock read the system's (0 or 1).
    reads: u32,
}

impl Clock {
    /// A clock read now.
    pub fn read() -> Self {
        Self {
            now: Some(Instant::now()),
            reads: 1,
        }
    }

    /// The reading, taken now if none was.
    pub fn now(&mut self) -> Instant {
        match self.now {
            Some(t) => t,
            None => {
                let t = Instant::now();
                self.now = Some(t);
                self.reads += 1;
                t
            }
        }
    }

    /// How often it read the system's clock (a poll group counts them).
    pub fn reads(&self) -> u32 {
        self.reads
    }
}
