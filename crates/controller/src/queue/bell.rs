//! A poll group's bell: where the group's thread sleeps, rung by every
//! mailbox of the group (and by the group itself when a member joins or
//! the groups stop).
//!
//! One futex word and one sleeper (the group's thread). An idle group
//! wakes 200 times a second, and after 5 ms asleep everything a wake-up
//! touches is a cache miss on a virtual machine: a general mutex and
//! condvar (parking_lot's) touched its lock, the condvar, a global table
//! of parked threads (locked twice: to park, and to leave its queue on a
//! timeout), the thread's own record, `errno`, and read the clock to turn
//! the deadline into a timeout. Measured on the development machine, that
//! was about 8 µs of the 11 µs an idle wake-up of eight controllers spent
//! outside the kernel. Here a sleep is one compare-and-swap, one
//! `FUTEX_WAIT_BITSET` whose timeout is the deadline itself (absolute, on
//! the monotonic clock `Instant` reads, so no clock read), and one swap.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::thread::futex;
use rustix::time::{clock_gettime, ClockId, Timespec};

/// Nothing rang since the last wait or take.
const QUIET: u32 = 0;
/// Rung since the last wait or take.
const RUNG: u32 = 1;
/// The group's thread is asleep (or about to be) in the futex: a ring
/// must wake it.
const ASLEEP: u32 = 2;

/// Every bit of a `FUTEX_WAIT_BITSET`'s mask: woken by any wake.
const ANY: std::num::NonZeroU32 = std::num::NonZeroU32::MAX;

/// See the module's comment.
#[derive(Debug)]
pub(crate) struct Bell {
    word: AtomicU32,
    /// An `Instant` and the monotonic clock read together (the clock
    /// second), so a deadline becomes an absolute timeout by arithmetic.
    /// Read in that order, the mapping errs late by the nanoseconds between
    /// the two reads: a wait never ends before its deadline, so the pass
    /// after it never finds the deadline still ahead and sleeps again.
    origin: (Instant, Duration),
}

impl Default for Bell {
    fn default() -> Self {
        let instant = Instant::now();
        let ts = clock_gettime(ClockId::Monotonic);
        // The monotonic clock counts from boot: never negative.
        let mono = Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0),
        );
        Self {
            word: AtomicU32::new(QUIET),
            origin: (instant, mono),
        }
    }
}

/// How a [`Bell::wait`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Woke {
    /// Rung since the last wait or take: if not, no mailbox of the group
    /// was kicked meanwhile (a kick marks its mailbox before it rings), and
    /// the group need not read them.
    pub rung: bool,
    /// System calls the wait made (one per sleep, unless a signal or a
    /// ring that came as it went to sleep cut one short).
    pub calls: u32,
}

impl Bell {
    pub fn ring(&self) {
        // Release: the kick's mark on its mailbox is seen by the wait or
        // take that finds the bell rung.
        if self.word.swap(RUNG, Ordering::AcqRel) == ASLEEP {
            // Fails only for an address or operation the kernel refuses,
            // which a live atomic and FUTEX_WAKE are not.
            let _ = futex::wake(&self.word, futex::Flags::PRIVATE, 1);
        }
    }

    /// Sleeps until rung or `deadline` (`None`: until rung); a ring since
    /// the last wait or take returns at once. Only the group's thread
    /// waits.
    pub fn wait(&self, deadline: Option<Instant>) -> Woke {
        let timeout = deadline.map(|d| self.absolute(d));
        let mut calls = 0;
        loop {
            // Say it sleeps; a ring since the last wait ends it now.
            if let Err(RUNG) =
                self.word
                    .compare_exchange(QUIET, ASLEEP, Ordering::AcqRel, Ordering::Acquire)
            {
                break;
            }
            calls += 1;
            match futex::wait_bitset(
                &self.word,
                futex::Flags::PRIVATE,
                ASLEEP,
                timeout.as_ref(),
                ANY,
            ) {
                Err(Errno::TIMEDOUT) => break,
                // Woken, rung before it slept, or a signal: look again.
                Ok(()) | Err(Errno::AGAIN) | Err(Errno::INTR) => {}
                Err(e) => {
                    // No futex (a seccomp filter?): sleep a little
                    // without one rather than spin, and let the group's
                    // pass look.
                    tracing::debug!("a poll group's futex wait failed: {e}");
                    let nap = deadline.map_or(Duration::from_millis(1), |d| {
                        d.saturating_duration_since(Instant::now())
                    });
                    std::thread::sleep(nap.min(Duration::from_millis(1)));
                    break;
                }
            }
        }
        Woke {
            rung: self.take(),
            calls,
        }
    }

    /// Whether it was rung since the last wait or take, without sleeping
    /// (a pass that follows a pass: as [`wait`](Self::wait), false means
    /// no mailbox of the group was kicked meanwhile).
    pub fn take(&self) -> bool {
        self.word.swap(QUIET, Ordering::AcqRel) == RUNG
    }

    /// Now, from one read of the monotonic clock through the vDSO
    /// (rustix's, which keeps the vDSO's function in one word: glibc's
    /// `clock_gettime`, behind `Instant::now`, first loads its loader's
    /// table and the function's address from it, more cold lines in
    /// another page after 5 ms asleep). Errs early by the nanoseconds
    /// between `origin`'s two reads, never late: a deadline set from it
    /// comes a little early.
    pub fn now(&self) -> Instant {
        let ts = clock_gettime(ClockId::Monotonic);
        // The monotonic clock counts from boot: never negative.
        let mono = Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0),
        );
        let (instant, origin) = self.origin;
        instant + mono.saturating_sub(origin)
    }

    /// `deadline` on the monotonic clock, as the futex takes it.
    fn absolute(&self, deadline: Instant) -> Timespec {
        let (instant, mono) = self.origin;
        let at = mono + deadline.saturating_duration_since(instant);
        Timespec {
            tv_sec: i64::try_from(at.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(at.subsec_nanos()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_ring_before_the_wait_ends_it_at_once_without_a_sleep() {
        let bell = Bell::default();
        bell.ring();
        let far = Instant::now() + Duration::from_secs(3600);
        assert_eq!(
            bell.wait(Some(far)),
            Woke {
                rung: true,
                calls: 0
            }
        );
        assert!(!bell.take(), "the wait took the ring");
    }

    #[test]
    fn a_wait_sleeps_once_until_its_deadline_and_not_less() {
        let bell = Bell::default();
        let deadline = Instant::now() + Duration::from_millis(20);
        let woke = bell.wait(Some(deadline));
        assert!(Instant::now() >= deadline, "woke before its deadline");
        assert_eq!(
            woke,
            Woke {
                rung: false,
                calls: 1
            }
        );
        // A deadline already passed: the kernel answers at once.
        assert!(!bell.wait(Some(Instant::now())).rung);
    }

    #[test]
    fn a_ring_wakes_a_sleeping_wait() {
        let bell = Arc::new(Bell::default());
        let ringer = {
            let bell = Arc::clone(&bell);
            std::thread::spawn(move || {
                // Until the waiter sleeps in the futex (a bound on a hang
                // is the test's).
                while bell.word.load(Ordering::Acquire) != ASLEEP {
                    std::thread::yield_now();
                }
                bell.ring();
            })
        };
        let woke = bell.wait(None);
        ringer.join().unwrap();
        assert!(woke.rung);
        assert!(woke.calls >= 1);
        assert!(!bell.take());
    }

    #[test]
    fn now_agrees_with_instant_now() {
        let bell = Bell::default();
        for _ in 0..1000 {
            let before = Instant::now();
            let now = bell.now();
            let after = Instant::now();
            // Early by the nanoseconds between the origin's two reads at
            // most, never late.
            assert!(now <= after, "{now:?} after {after:?}");
            assert!(now + Duration::from_millis(1) >= before);
        }
    }

    #[test]
    fn take_says_whether_it_was_rung() {
        let bell = Bell::default();
        assert!(!bell.take());
        bell.ring();
        bell.ring();
        assert!(bell.take());
        assert!(!bell.take());
    }
}
