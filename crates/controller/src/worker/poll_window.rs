//! The adaptive doorbell mode's poll window (DESIGN.md, "Doorbells"): how
//! long a worker keeps polling the shadow doorbells after its last work
//! before it arms EventIdx and sleeps until a trap.
//!
//! Polling instead of sleeping saves the host a doorbell trap and the worker
//! a wake-up; it costs a core for as long as it polls. That is a good trade
//! while the core is otherwise idle, and a bad one on a small host where the
//! guest's vCPUs and QEMU need it to produce the next request. So the window
//! follows, per worker, what polling has been buying and what it costs
//! (a rule in the spirit of KVM's halt-polling, plus a contention signal):
//!
//! * a poll that found work within the window doubles it (from
//!   [`GROW_START`]), up to the cap;
//! * a window that expired empty halves it; below [`GROW_START`] it is 0:
//!   arm EventIdx and sleep as soon as the work is done;
//! * a poll that lost its core (a gap between two idle polls longer than the
//!   worker's own poll loop can explain: another runnable thread got the
//!   core) halves it too — the host is oversubscribed and polling competes
//!   with the threads that produce the work;
//! * after a sleep, a trap that brought work within the cap of the last work
//!   grows a closed window (polling that long would have caught it).
//!
//! The cap is [`ControllerConfig::idle_poll`](crate::ControllerConfig::idle_poll)
//! (default 300 µs).
//!
//! Only the time spent polling changes: arming, the fence and the re-read
//! before every sleep are the same whatever the window.

use std::time::Duration;

/// The smallest non-zero window.
pub(crate) const GROW_START: Duration = Duration::from_micros(4);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PollWindow {
    current: Duration,
    cap: Duration,
    /// The window never shrinks below this: the cap for a fixed window.
    floor: Duration,
}

impl PollWindow {
    /// Starts open: a new queue is about to be used.
    pub fn new(cap: Duration) -> Self {
        Self {
            current: cap,
            cap,
            floor: Duration::ZERO,
        }
    }

    /// A window that stays at `cap` whatever happens.
    pub fn fixed(cap: Duration) -> Self {
        Self {
            current: cap,
            cap,
            floor: cap,
        }
    }

    /// How long to keep polling without work before arming.
    pub fn current(&self) -> Duration {
        self.current
    }

    /// A poll found work after `idle` without any.
    pub fn found(&mut self, idle: Duration) {
        if idle <= self.current {
            self.grow();
        }
    }

    /// The worker lost its core while polling: polling competes with other
    /// runnable threads.
    pub fn preempted(&mut self) {
        self.shrink();
    }

    /// The window passed without work: the worker arms and (unless the
    /// re-read finds work) sleeps.
    pub fn expired(&mut self) {
        self.shrink();
    }

    /// A trap woke the sleeping worker `idle` after its last work.
    pub fn woke(&mut self, idle: Duration) {
        if idle <= self.cap {
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
        }
        .max(self.floor);
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
    fn losing_the_core_while_polling_closes_the_window() {
        // A slow guest on an oversubscribed host: polls find work, but the
        // worker keeps being descheduled while it waits.
        let mut w = PollWindow::new(CAP);
        for _ in 0..6 {
            w.preempted();
            w.found(us(500));
        }
        assert_eq!(w.current(), Duration::ZERO);
        // Sleeping, traps long after the last work leave it shut.
        w.woke(us(300));
        assert_eq!(w.current(), Duration::ZERO);
    }

    #[test]
    fn work_found_within_the_window_keeps_it_open() {
        let mut w = PollWindow::new(CAP);
        w.expired();
        w.expired();
        assert_eq!(w.current(), us(25));
        w.found(us(20));
        w.found(Duration::ZERO);
        assert_eq!(w.current(), CAP);
        w.found(Duration::ZERO);
        assert_eq!(w.current(), CAP, "capped");
    }

    #[test]
    fn a_prompt_trap_reopens_a_closed_window() {
        let mut w = PollWindow::new(CAP);
        for _ in 0..8 {
            w.expired();
        }
        assert_eq!(w.current(), Duration::ZERO);
        w.woke(us(60));
        assert_eq!(w.current(), GROW_START);
        w.found(us(1));
        assert_eq!(w.current(), GROW_START * 2);
    }

    #[test]
    fn a_fixed_window_never_shrinks() {
        let mut w = PollWindow::fixed(CAP);
        for _ in 0..8 {
            w.expired();
            w.preempted();
        }
        assert_eq!(w.current(), CAP);
    }

    #[test]
    fn a_tiny_cap_is_respected() {
        let mut w = PollWindow::new(us(2));
        w.found(Duration::ZERO);
        assert_eq!(w.current(), us(2));
        w.expired();
        assert_eq!(w.current(), Duration::ZERO);
        let mut z = PollWindow::new(Duration::ZERO);
        z.found(Duration::ZERO);
        assert_eq!(z.current(), Duration::ZERO);
    }
}
