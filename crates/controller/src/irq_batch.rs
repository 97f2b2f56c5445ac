//! Interrupt batching while the host fills its queue: the completions of a
//! host that is still submitting wait for its last submission, then come
//! with one interrupt.
//!
//! An interrupt costs a TCG guest about 40 µs of the host's cores (docs/guest-benchmark.md,
//! "What an interrupt costs"); at QD 32 vnvme raised 0.6-0.8 per I/O where
//! QEMU's nvme, whose completions wait for its main loop, raised 0.5-0.6.
//! The device cannot see a host block, but it sees how many entries the
//! host has outstanding: posted and not yet reaped, or still in flight on
//! the backend. A host at its own queue depth can submit nothing more until
//! it reaps, so its interrupt is raised at once; below that depth it is
//! still submitting, and its completions wait. So a host that reaps all
//! and submits them again gets one interrupt per round of its queue depth,
//! and a host at QD 1 gets each completion at once.
//!
//! Only a slow host is held: one whose commands come more than
//! [`SLOW_HOST`] apart on average (a TCG guest's come 20-300 µs apart). A
//! fast one, like vnvme's own driver (1-4 µs), reaps by polling its CQ
//! before it blocks, and then waits for its interrupt with fewer entries
//! outstanding than its depth: holding cost it up to three of its gaps at
//! every block, 50-80% of its IOPS at QD 2 and 4. A gap that ends a hold
//! by running out is not counted: the host may have been waiting for the
//! held interrupt, and counting that wait would make any host look slow
//! once held.
//!
//! The depth is learned: the most entries the host has had outstanding. A
//! host that goes quiet below it (no new command for three times its usual
//! gap between commands) is waiting: the interrupt is raised, and the depth
//! falls to what it has outstanding (a quiet gap is at most [`MAX_QUIET`]).
//! No completion waits longer than
//! [`LONGEST_HOLD`]. A host that asked for Interrupt Coalescing gets what
//! it asked for instead, and a vector with coalescing disabled is never
//! held.

use std::time::{Duration, Instant};

/// The most a completion waits for its interrupt (a TCG guest fills a
/// queue of 32 in about 1.5 ms).
pub(crate) const LONGEST_HOLD: Duration = Duration::from_millis(2);
/// The longest quiet gap that ends a hold.
const MAX_QUIET: Duration = Duration::from_micros(300);
/// Gaps between commands longer than this are the host's idle time, not
/// its pace.
const IDLE_GAP: Duration = Duration::from_micros(500);
/// The shortest quiet gap that ends a hold: below this, the worker's own
/// round time decides.
const MIN_QUIET: Duration = Duration::from_micros(4);
/// Quiet after this many of the host's usual gaps between commands.
const QUIET_GAPS: u32 = 3;
/// The usual gap between commands above which a host is slow enough for
/// its interrupts to wait.
const SLOW_HOST: Duration = Duration::from_micros(25);

/// One CQ's view of its host's submissions.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Batch {
    /// The host's queue depth as seen: the most entries it had outstanding
    /// since it last went quiet below it.
    depth: u32,
    /// When a pass last fetched commands that complete here.
    fetched_at: Option<Instant>,
    /// The same, unless a hold ran out since.
    gap_from: Option<Instant>,
    /// The usual gap between such passes, but for those across a hold that
    /// ran out (a moving mean of those shorter than [`IDLE_GAP`]).
    gap: Duration,
}

impl Batch {
    /// A pass fetched commands that complete on this CQ.
    pub fn fetched(&mut self, now: Instant) {
        if let Some(at) = self.gap_from {
            let gap = now.saturating_duration_since(at);
            if gap < IDLE_GAP {
                self.gap = (self.gap * 7 + gap) / 8;
            }
        }
        self.fetched_at = Some(now);
        self.gap_from = Some(now);
    }

    /// Whether the host is slow enough for its interrupts to wait.
    pub fn slow(&self) -> bool {
        self.gap >= SLOW_HOST
    }

    /// How long without a new command counts as quiet.
    fn quiet(&self) -> Duration {
        (self.gap * QUIET_GAPS).clamp(MIN_QUIET, MAX_QUIET)
    }

    /// Whether the interrupt for completions pending since `since` waits,
    /// with `outstanding` entries the host has not reaped (posted, or in
    /// flight on the backend).
    pub fn hold(&mut self, outstanding: u32, since: Instant, now: Instant) -> bool {
        if !self.slow() || outstanding == self.depth {
            return false;
        }
        if outstanding > self.depth {
            // Deeper than ever: the host may be filling a deeper queue.
            self.depth = outstanding;
        }
        let busy = self
            .fetched_at
            .is_some_and(|at| now.saturating_duration_since(at) < self.quiet());
        if !busy {
            // Quiet below its depth: the host waits for this interrupt.
            self.depth = outstanding;
            self.gap_from = None;
            return false;
        }
        if now.saturating_duration_since(since) >= LONGEST_HOLD {
            self.gap_from = None;
            return false;
        }
        true
    }

    /// When a held interrupt is next worth a look: the host turns quiet, or
    /// the longest hold ends.
    pub fn deadline(&self, since: Instant) -> Instant {
        let quiet = self.fetched_at.map(|at| at + self.quiet());
        let longest = since + LONGEST_HOLD;
        quiet.map_or(longest, |q| q.min(longest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// A host submitting `n` commands `gap` apart from `t`; returns the
    /// time of the last.
    fn submit(b: &mut Batch, t: Instant, n: u32, gap: Duration) -> Instant {
        let mut at = t;
        for i in 0..n {
            if i > 0 {
                at += gap;
            }
            b.fetched(at);
        }
        at
    }

    #[test]
    fn a_host_at_qd_1_gets_every_completion_at_once_after_the_first() {
        let t0 = Instant::now();
        let mut b = Batch {
            gap: us(200),
            ..Batch::default()
        };
        let mut t = t0;
        for _ in 0..20 {
            t = submit(&mut b, t + us(200), 1, us(0));
            // The first one learns the depth: held until the host is quiet.
            while b.hold(1, t, t) {
                t += us(1);
            }
        }
        assert_eq!(b.depth, 1);
        t += us(200);
        b.fetched(t);
        assert!(!b.hold(1, t, t));
    }

    #[test]
    fn a_host_filling_its_queue_gets_one_interrupt_when_full() {
        let t0 = Instant::now();
        let mut b = Batch {
            depth: 32,
            gap: us(40),
            ..Batch::default()
        };
        // It reaped 32 and submits them again, 40 µs apart; each completes
        // at once and waits.
        let mut t = t0;
        for outstanding in 1..32 {
            t = submit(&mut b, t + us(40), 1, us(0));
            assert!(b.hold(outstanding, t0, t), "{outstanding}");
        }
        t = submit(&mut b, t + us(40), 1, us(0));
        assert!(!b.hold(32, t0, t));
    }

    #[test]
    fn a_host_quiet_below_its_depth_gets_its_interrupt_and_a_lower_depth() {
        let t0 = Instant::now();
        let mut b = Batch {
            depth: 32,
            gap: us(40),
            ..Batch::default()
        };
        let last = submit(&mut b, t0, 8, us(40));
        assert!(b.hold(8, t0, last + us(119)));
        assert_eq!(b.deadline(t0), last + us(120));
        // Three gaps of 40 µs without a command: quiet.
        assert!(!b.hold(8, t0, last + us(121)));
        assert_eq!(b.depth, 8);
        // The next round of 8 is raised when full.
        let t = submit(&mut b, last + us(400), 8, us(40));
        assert!(!b.hold(8, last + us(400), t));
    }

    #[test]
    fn no_completion_waits_longer_than_the_longest_hold() {
        let t0 = Instant::now();
        let mut b = Batch {
            depth: 1024,
            gap: us(100),
            ..Batch::default()
        };
        let mut t = t0;
        let mut held = 0;
        // A host that keeps submitting, slowly, never reaching its depth.
        for outstanding in 1..1000 {
            t = submit(&mut b, t + us(100), 1, us(0));
            if !b.hold(outstanding, t0, t) {
                break;
            }
            held += 1;
        }
        assert!(t.saturating_duration_since(t0) <= LONGEST_HOLD, "{held}");
        assert!(held >= 18, "{held}");
        // The depth stays: the host was busy, not waiting.
        assert_eq!(b.depth, 1024);
    }

    #[test]
    fn a_fast_host_is_never_held() {
        let t0 = Instant::now();
        let mut b = Batch {
            depth: 32,
            ..Batch::default()
        };
        let t = submit(&mut b, t0, 64, us(2));
        assert!(!b.slow());
        assert!(!b.hold(3, t, t));
        // Slow for a while (its thread lost the core), it is held, but its
        // waits for a held interrupt that runs out do not count.
        let mut t = submit(&mut b, t + us(400), 1, us(0));
        assert!(b.slow(), "{:?}", b.gap);
        for _ in 0..64 {
            let resume = if b.slow() {
                // It blocks below its depth on the held interrupt until the
                // hold runs out.
                b.depth = 32;
                assert!(!b.hold(1, t, t + us(400)));
                t + us(420)
            } else {
                t + us(4)
            };
            t = submit(&mut b, resume, 4, us(2));
        }
        assert!(!b.slow(), "{:?}", b.gap);
    }

    #[test]
    fn a_deeper_queue_is_learned_while_it_fills() {
        let t0 = Instant::now();
        let mut b = Batch {
            depth: 4,
            gap: us(40),
            ..Batch::default()
        };
        let mut t = t0;
        for outstanding in 1..=16 {
            t = submit(&mut b, t + us(40), 1, us(0));
            assert!(b.hold(outstanding, t0, t) || outstanding == 4);
        }
        assert_eq!(b.depth, 16);
        // Quiet at 16: raised; the next round of 16 is raised when full.
        assert!(!b.hold(16, t0, t + us(200)));
        let t = submit(&mut b, t + us(400), 16, us(40));
        assert!(!b.hold(16, t0, t));
    }
}
