//! The adaptive doorbell mode's poll window (DESIGN.md, "Doorbells"): how
//! long a worker keeps polling the shadow doorbells after its last work
//! before it arms EventIdx and sleeps until a trap.
//!
//! Polling instead of sleeping saves the host a doorbell trap and the worker
//! a wake-up; it costs a core for as long as it polls, and on a small host
//! that core is one the guest's vCPUs need to produce the next request. So
//! the window follows what polling has been buying, per worker:
//!
//! * a period that found `n` commands after idling `g` was worth it if
//!   `g <= n * budget` (cheap): the window doubles (from [`GROW_START`]), up
//!   to the cap;
//! * a period that found them only later (dear), or that expired empty,
//!   halves the window; below [`GROW_START`] it is 0: arm EventIdx and sleep
//!   as soon as the work is done;
//! * after a sleep, a trap that brought `n` commands within `n * budget` of
//!   the last work grows it (polling would have been cheap).
//!
//! The cap is [`ControllerConfig::idle_poll`](crate::ControllerConfig::idle_poll)
//! (default 100 µs) and the budget per command an eighth of it (12.5 µs by
//! default: about a doorbell trap plus a worker wake-up). Request/response
//! traffic — QD 1, where the next command comes only after the host has
//! handled the completion — closes the window: the worker sleeps, the host
//! traps once per I/O (the SQ tail; CQ EventIdx stays behind). Streaming
//! traffic — several commands per period, or periods back to back — keeps it
//! open and the host does not trap.
//!
//! Only the time spent polling changes: arming, the fence and the re-read
//! before every sleep are the same whatever the window.

use std::time::Duration;

/// The smallest non-zero window.
pub(crate) const GROW_START: Duration = Duration::from_micros(4);
/// The budget per command found is the cap divided by this.
const BUDGET_DIVISOR: u32 = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PollWindow {
    current: Duration,
    cap: Duration,
}

impl PollWindow {
    /// Starts open: a new queue is about to be used.
    pub fn new(cap: Duration) -> Self {
        Self { current: cap, cap }
    }

    /// How long to keep polling without work before arming.
    pub fn current(&self) -> Duration {
        self.current
    }

    fn budget(&self, commands: u32) -> Duration {
        (self.cap / BUDGET_DIVISOR).saturating_mul(commands)
    }

    /// A poll found `commands` after `idle` without work.
    pub fn found(&mut self, idle: Duration, commands: u32) {
        if idle <= self.budget(commands) {
            self.grow();
        } else {
            self.shrink();
        }
    }

    /// The window passed without work: the worker arms and (unless the
    /// re-read finds work) sleeps.
    pub fn expired(&mut self) {
        self.shrink();
    }

    /// A trap woke the sleeping worker with `commands`, `idle` after its
    /// last work.
    pub fn woke(&mut self, idle: Duration, commands: u32) {
        if idle <= self.budget(commands) {
            self.grow();
        }
    }

    fn grow(&mut self) {
        self.current = self.current.saturating_mul(2).max(GROW_START).min(self.cap);
    }

    fn shrink(&mut self) {
        let half = self.current / 2;
        self.current = if half < GROW_START {
            Duration::ZERO
        } else {
            half
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Duration = Duration::from_micros(100);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn one_command_per_long_gap_closes_the_window() {
        // QD 1 under a slow guest: every period finds 1 command after 60 µs.
        let mut w = PollWindow::new(CAP);
        for _ in 0..6 {
            w.found(us(60), 1);
        }
        assert_eq!(w.current(), Duration::ZERO);
        // Sleeping, each trap brings 1 command 80 µs after the last: stays shut.
        w.woke(us(80), 1);
        assert_eq!(w.current(), Duration::ZERO);
    }

    #[test]
    fn batches_and_back_to_back_work_keep_it_open() {
        let mut w = PollWindow::new(CAP);
        w.expired();
        w.expired();
        assert_eq!(w.current(), us(25));
        // 8 commands after 40 µs: 5 µs each, within the 12.5 µs budget.
        w.found(us(40), 8);
        w.found(Duration::ZERO, 1);
        assert_eq!(w.current(), CAP);
        w.found(Duration::ZERO, 1);
        assert_eq!(w.current(), CAP, "capped");
    }

    #[test]
    fn a_cheap_wakeup_reopens_a_closed_window() {
        let mut w = PollWindow::new(CAP);
        for _ in 0..8 {
            w.expired();
        }
        assert_eq!(w.current(), Duration::ZERO);
        w.woke(us(20), 4);
        assert_eq!(w.current(), GROW_START);
        w.found(us(1), 1);
        assert_eq!(w.current(), GROW_START * 2);
    }

    #[test]
    fn a_tiny_cap_is_respected() {
        let mut w = PollWindow::new(us(2));
        w.found(Duration::ZERO, 1);
        assert_eq!(w.current(), us(2));
        w.expired();
        assert_eq!(w.current(), Duration::ZERO);
        let mut z = PollWindow::new(Duration::ZERO);
        z.found(Duration::ZERO, 10);
        assert_eq!(z.current(), Duration::ZERO);
    }
}
