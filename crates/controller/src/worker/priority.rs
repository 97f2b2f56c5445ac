//! An I/O worker's scheduling class: the usual one while the worker has a
//! core to itself, `SCHED_IDLE` (a core only when no other thread wants
//! it) while it has to fight for one, and never starved.
//!
//! A polling worker on a host with no core to spare (a TCG guest's vCPUs
//! on 2 cores) takes the core from the threads that produce its requests:
//! beside it the vCPUs waited for a core 0.10-0.22 of one, against
//! 0.04-0.05 beside QEMU's own nvme, which polls nothing (docs/guest-benchmark.md,
//! "Where the host's cores go"). In the idle class the vCPUs come first and the
//! worker takes what they leave (their wait fell to 0.06-0.11). Where the
//! worker has a core (the embedded bench: it waits 0-3% of the time) the
//! idle class would only cost it a preemption at every wake-up of any other
//! thread (35-45% of the embedded bench's IOPS, in two rounds with the
//! worker always idle), so it stays in the usual class.
//!
//! The worker reads its own wait for a core (`/proc/thread-self/
//! schedstat`) every [`CHECK`]:
//! * in the usual class, [`CONTENDED_CHECKS`] checks in a row waiting more
//!   than [`CONTENDED`] of the time move it to the idle class (a wait that
//!   lasts: the embedded bench sees single checks of 10-50% when other
//!   work starts);
//! * in the idle class, after [`RETRY`] it goes back to the usual class
//!   (which the next checks judge again: the host may have cores free now);
//!   each time it comes back to the idle class that wait doubles, up to
//!   [`LONGEST_RETRY`], until [`CALM_CHECKS`] busy checks in a row (the
//!   worker ran at least [`BUSY`] of the time) find the usual class
//!   uncontended. Beside a TCG guest every return to the usual class was
//!   contended again within 0.2 s (four checks), and a worker that spent
//!   half its time there (back after every second, the checks while it
//!   slept between bursts calm) had the vCPUs queued for a core 0.3-4 ms
//!   25-50% more often, and itself twice as often, as one that stayed in
//!   the idle class (perf sched; docs/guest-benchmark.md, "Why QD 1 stays close");
//! * in the idle class, waiting more than [`STARVED`] of a check's time
//!   (every core stays busy with other threads) sends it back to the usual
//!   class for a cool-down, 1 s doubling to [`LONGEST_COOLDOWN`] while the
//!   starving recurs.
//!
//! A starved worker cannot see that it starves until it runs, which in the
//! idle class among threads that never sleep took up to a second (and the
//! kernel adds to a thread's wait only when it gets a core). So a watchdog
//! thread of the usual class, awake only while some worker is in the idle
//! class, looks at those workers every [`CHECK`] too: one that is runnable
//! but has not been through its loop since the last look starves, and the
//! watchdog moves it back to the usual class itself.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use scheduler::Policy;

/// How often the worker looks at its wait for a core.
const CHECK: Duration = Duration::from_millis(50);
/// The share of a check's time spent waiting for a core that counts as
/// contended: beside a TCG guest on 2 cores the worker waited 10-20% of the
/// time, in the embedded bench 0-3%.
const CONTENDED: f64 = 0.08;
const CONTENDED_CHECKS: u8 = 4;
/// The share that counts as starving: beside a TCG guest the idle class
/// waits 40-60% of the time and gets its work done; starved by threads that
/// never sleep, it waits over 99%.
const STARVED: f64 = 0.9;
/// How long the idle class lasts before the usual class is tried again,
/// at first and at most.
const RETRY: Duration = Duration::from_secs(1);
const LONGEST_RETRY: Duration = Duration::from_secs(32);
/// A check in which the worker ran at least this share of the time is
/// busy: asleep between bursts (woken every 1-5 ms to look at the doorbell
/// page) it runs about 2%, polling 40% and more.
const BUSY: f64 = 0.1;
/// Busy checks in a row without contention in the usual class that bring
/// the idle class's wait back to [`RETRY`].
const CALM_CHECKS: u8 = 20;
const FIRST_COOLDOWN: Duration = Duration::from_secs(1);
const LONGEST_COOLDOWN: Duration = Duration::from_secs(64);

pub(super) struct Priority {
    schedstat: File,
    guard: Guard,
    tid: i32,
    /// Shared with the watchdog.
    flags: Arc<Flags>,
}

#[derive(Debug, Default)]
struct Flags {
    /// The worker is in the idle class: the watchdog watches it.
    idle: AtomicBool,
    /// The watchdog found it starving and moved it to the usual class.
    starved: AtomicBool,
    /// Rounds of the worker loop, for the watchdog to see it run.
    rounds: AtomicU64,
}

impl Priority {
    /// The calling worker's class, starting in the usual one. `None` where
    /// it stays there: a thread that could not come back from `SCHED_IDLE`
    /// (it needs `CAP_SYS_NICE` or an `RLIMIT_NICE` allowing nice 0), or a
    /// kernel without per-thread schedstat.
    pub fn new(now: Instant) -> Option<Self> {
        static CAN_RETURN: OnceLock<bool> = OnceLock::new();
        let can = *CAN_RETURN.get_or_init(|| {
            let round_trip = || set_class(true).and_then(|()| set_class(false));
            match std::thread::spawn(round_trip).join() {
                Ok(Ok(())) => true,
                // EPERM: an unprivileged process (docs/deployment.md, "Running
                // as an unprivileged user"); said plainly, not as an error.
                Ok(Err(e)) if e.kind() == io::ErrorKind::PermissionDenied => {
                    tracing::info!(
                        "I/O workers keep the usual scheduling class: this process may not bring \
                         a thread back from SCHED_IDLE (that takes CAP_SYS_NICE, or RLIMIT_NICE \
                         20: ulimit -e 20, LimitNICE=+0 in a systemd unit)"
                    );
                    false
                }
                Ok(Err(e)) => {
                    tracing::info!("I/O workers keep the usual scheduling class: {e}");
                    false
                }
                Err(_) => false,
            }
        });
        if !can {
            return None;
        }
        let schedstat = File::open("/proc/thread-self/schedstat")
            .inspect_err(|e| {
                tracing::info!("I/O workers keep the usual scheduling class: schedstat: {e}");
            })
            .ok()?;
        let times = read_times(&schedstat)?;
        let tid = rustix::thread::gettid().as_raw_nonzero().get();
        let flags = Arc::<Flags>::default();
        let stat = File::open("/proc/thread-self/stat").ok()?;
        watchdog::add(tid, stat, flags.clone());
        Some(Self {
            schedstat,
            guard: Guard::new(now, times),
            tid,
            flags,
        })
    }

    /// After a round: every [`CHECK`], the class for what the worker
    /// waited.
    pub fn check(&mut self, now: Instant) {
        self.flags.rounds.fetch_add(1, Ordering::Relaxed);
        if !self.guard.due(now) {
            return;
        }
        let Some(times) = read_times(&self.schedstat) else {
            return;
        };
        if self.flags.starved.swap(false, Ordering::AcqRel) {
            self.guard.starved(now, times);
            return;
        }
        if let Some(idle) = self.guard.observe(now, times) {
            // Watched before it may starve.
            self.flags.idle.store(idle, Ordering::Release);
            match set_class(idle) {
                Ok(()) => tracing::debug!(idle, "an I/O worker changes its scheduling class"),
                Err(e) => {
                    self.flags.idle.store(false, Ordering::Release);
                    tracing::debug!("setting an I/O worker's scheduling class: {e}");
                }
            }
            if idle {
                watchdog::wake();
            }
        }
    }
}

impl Drop for Priority {
    fn drop(&mut self) {
        watchdog::remove(self.tid);
    }
}

/// The watchdog of the workers in the idle class: one thread for the
/// process, asleep while none is.
mod watchdog {
    use super::*;

    struct Watched {
        tid: i32,
        /// The worker's `/proc/thread-self/stat`: its state.
        stat: File,
        flags: Arc<Flags>,
        /// At the last look: when, and the worker's rounds.
        last: Option<(Instant, u64)>,
    }

    struct Watch {
        workers: Mutex<Vec<Watched>>,
        idle: Condvar,
    }

    fn watch() -> &'static Watch {
        static WATCH: OnceLock<Watch> = OnceLock::new();
        WATCH.get_or_init(|| {
            let spawned = std::thread::Builder::new()
                .name("vnvme-class-watch".into())
                .spawn(run);
            if let Err(e) = spawned {
                tracing::warn!("no watchdog for idle-class workers: {e}");
            }
            Watch {
                workers: Mutex::new(Vec::new()),
                idle: Condvar::new(),
            }
        })
    }

    pub(super) fn add(tid: i32, stat: File, flags: Arc<Flags>) {
        let mut workers = watch().workers.lock().unwrap_or_else(|e| e.into_inner());
        workers.push(Watched {
            tid,
            stat,
            flags,
            last: None,
        });
    }

    pub(super) fn remove(tid: i32) {
        let mut workers = watch().workers.lock().unwrap_or_else(|e| e.into_inner());
        workers.retain(|w| w.tid != tid);
    }

    pub(super) fn wake() {
        // Under the lock: the watchdog checks for idle workers and waits
        // without releasing it in between, so the call is never lost.
        let _workers = watch().workers.lock().unwrap_or_else(|e| e.into_inner());
        watch().idle.notify_one();
    }

    fn run() {
        let watch = watch();
        let mut workers = watch.workers.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let any_idle = workers.iter().any(|w| w.flags.idle.load(Ordering::Acquire));
            if !any_idle {
                for w in workers.iter_mut() {
                    w.last = None;
                }
                workers = watch.idle.wait(workers).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let now = Instant::now();
            for w in workers.iter_mut() {
                look(w, now);
            }
            drop(workers);
            std::thread::sleep(CHECK);
            workers = watch.workers.lock().unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A look at one worker: runnable in the idle class, without a round
    /// since a look at least [`CHECK`] ago, it starves and goes to the
    /// usual class (the worker's guard then cools down).
    fn look(w: &mut Watched, now: Instant) {
        if !w.flags.idle.load(Ordering::Acquire) {
            w.last = None;
            return;
        }
        let rounds = w.flags.rounds.load(Ordering::Relaxed);
        let last = w.last.replace((now, rounds));
        let Some((at, before)) = last else {
            return;
        };
        if rounds != before || now.saturating_duration_since(at) < CHECK || !runnable(&w.stat) {
            return;
        }
        match scheduler::set_policy(w.tid, Policy::Other, 0) {
            Ok(()) => {
                w.flags.idle.store(false, Ordering::Release);
                w.flags.starved.store(true, Ordering::Release);
                tracing::debug!(
                    tid = w.tid,
                    "a starving I/O worker goes back to the usual class"
                );
            }
            Err(()) => tracing::debug!(
                "moving a starving I/O worker back to the usual class: {}",
                io::Error::last_os_error()
            ),
        }
    }
}

const USUAL: Class = Class::Usual {
    contended: 0,
    calm: 0,
};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Class {
    /// `contended`: the checks in a row that waited more than
    /// [`CONTENDED`]; `calm`: the busy checks in a row that did not.
    Usual {
        contended: u8,
        calm: u8,
    },
    Idle {
        until: Instant,
    },
    /// Starved in the idle class: the usual class until then.
    Cooling {
        until: Instant,
    },
}

/// The class decisions, apart from the system calls.
#[derive(Debug, Clone, PartialEq)]
struct Guard {
    class: Class,
    /// At the last check: when, and the thread's total run and wait.
    at: Instant,
    times: Times,
    /// How long the next stay in the idle class lasts.
    retry: Duration,
    cooldown: Duration,
    last_starved: Option<Instant>,
}

impl Guard {
    fn new(now: Instant, times: Times) -> Self {
        Self {
            class: USUAL,
            at: now,
            times,
            retry: RETRY,
            cooldown: FIRST_COOLDOWN,
            last_starved: None,
        }
    }

    fn due(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.at) >= CHECK
    }

    /// Starved in the idle class: the usual class for the cool-down.
    fn cool(&mut self, now: Instant) -> Class {
        let until = now + self.cooldown;
        self.cooldown = (self.cooldown * 2).min(LONGEST_COOLDOWN);
        self.last_starved = Some(now);
        Class::Cooling { until }
    }

    /// The watchdog found the worker starving and moved it to the usual
    /// class.
    fn starved(&mut self, now: Instant, times: Times) {
        self.at = now;
        self.times = times;
        if self.idle() {
            self.class = self.cool(now);
        }
    }

    fn idle(&self) -> bool {
        matches!(self.class, Class::Idle { .. })
    }

    /// The idle class for the current retry, which doubles for the next
    /// time.
    fn idle_class(&mut self, now: Instant) -> Class {
        let until = now + self.retry;
        self.retry = (self.retry * 2).min(LONGEST_RETRY);
        Class::Idle { until }
    }

    /// A check at `now` with the thread's totals `times`: the class to move
    /// to (`true`: idle), if it changes.
    fn observe(&mut self, now: Instant, times: Times) -> Option<bool> {
        let span = now
            .saturating_duration_since(self.at)
            .as_secs_f64()
            .max(1e-9);
        let share =
            |total: Duration, before: Duration| total.saturating_sub(before).as_secs_f64() / span;
        let waited = share(times.waited, self.times.waited);
        let busy = share(times.ran, self.times.ran) >= BUSY;
        self.at = now;
        self.times = times;
        if self
            .last_starved
            .is_some_and(|t| now.saturating_duration_since(t) >= LONGEST_COOLDOWN)
        {
            // A longest cool-down without starving: start again from the
            // shortest.
            self.cooldown = FIRST_COOLDOWN;
            self.last_starved = None;
        }
        let was_idle = self.idle();
        self.class = match self.class {
            Class::Usual { contended, .. } if waited > CONTENDED => {
                if contended + 1 >= CONTENDED_CHECKS {
                    self.idle_class(now)
                } else {
                    Class::Usual {
                        contended: contended + 1,
                        calm: 0,
                    }
                }
            }
            Class::Usual { calm, .. } if busy => {
                let calm = calm.saturating_add(1);
                if calm >= CALM_CHECKS {
                    self.retry = RETRY;
                }
                Class::Usual { contended: 0, calm }
            }
            Class::Usual { calm, .. } => Class::Usual { contended: 0, calm },
            Class::Idle { .. } if waited > STARVED => self.cool(now),
            Class::Idle { until } | Class::Cooling { until } if now >= until => USUAL,
            class => class,
        };
        (self.idle() != was_idle).then_some(self.idle())
    }
}

/// A thread's total time on a core and runnable but waiting for one.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Times {
    ran: Duration,
    waited: Duration,
}

/// The calling thread's [`Times`] (the first two fields of schedstat, in
/// nanoseconds).
fn read_times(schedstat: &File) -> Option<Times> {
    let mut buf = [0u8; 96];
    let n = schedstat.read_at(&mut buf, 0).ok()?;
    let text = std::str::from_utf8(buf.get(..n)?).ok()?;
    let mut fields = text.split_ascii_whitespace();
    let mut next = || Some(Duration::from_nanos(fields.next()?.parse().ok()?));
    Some(Times {
        ran: next()?,
        waited: next()?,
    })
}

/// Whether the thread of `stat` (a `/proc/.../stat` file) is runnable: its
/// state, after the name in parentheses, is `R`.
fn runnable(stat: &File) -> bool {
    let mut buf = [0u8; 512];
    let Ok(n) = stat.read_at(&mut buf, 0) else {
        return false;
    };
    let text = buf.get(..n).unwrap_or_default();
    text.iter()
        .rposition(|&b| b == b')')
        .and_then(|i| text.get(i + 2))
        .is_some_and(|&state| state == b'R')
}

/// `SCHED_IDLE`, or `SCHED_OTHER`, for the calling thread.
fn set_class(idle: bool) -> io::Result<()> {
    let policy = if idle { Policy::Idle } else { Policy::Other };
    scheduler::set_self_policy(policy, 0).map_err(|()| io::Error::last_os_error())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_goes_to_the_idle_class_and_back() {
        std::thread::spawn(|| {
            set_class(true).unwrap();
            assert!(matches!(scheduler::get_self_policy(), Ok(Policy::Idle)));
            set_class(false).unwrap();
            assert!(matches!(scheduler::get_self_policy(), Ok(Policy::Other)));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_worker_reads_its_own_wait_for_a_core() {
        std::thread::spawn(|| {
            let p = Priority::new(Instant::now()).expect("root can leave SCHED_IDLE");
            assert!(matches!(scheduler::get_self_policy(), Ok(Policy::Other)));
            assert!(read_times(&p.schedstat).is_some());
        })
        .join()
        .unwrap();
    }

    /// The watchdog's rule, end to end with real threads and classes: a
    /// worker in the idle class that stays runnable without finishing a
    /// round is starving, and the watchdog moves it to the usual class
    /// (whatever the host's load: no timing is asserted, only that it
    /// happens).
    #[test]
    fn a_runnable_idle_class_worker_without_rounds_is_moved_back_by_the_watchdog() {
        std::thread::spawn(|| {
            let p = Priority::new(Instant::now()).expect("root can leave SCHED_IDLE");
            set_class(true).unwrap();
            p.flags.idle.store(true, Ordering::Release);
            watchdog::wake();
            // Runnable, and no round: spin until the watchdog moves us.
            let deadline = Instant::now() + Duration::from_secs(60);
            while !p.flags.starved.load(Ordering::Acquire) {
                assert!(Instant::now() < deadline, "the watchdog never came");
                std::hint::spin_loop();
            }
            assert!(!p.flags.idle.load(Ordering::Acquire));
            assert!(matches!(scheduler::get_self_policy(), Ok(Policy::Other)));
        })
        .join()
        .unwrap();
    }

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The totals of a thread that ran half the time since `t0` (busy)
    /// and waited `w` ms in all.
    fn times(t: u64, w: u64) -> Times {
        Times {
            ran: ms(t / 2),
            waited: ms(w),
        }
    }

    /// Busy checks every 50 ms from `t` (ms after `t0`), each waiting
    /// `wait` ms more; returns the class changes.
    fn checks(
        g: &mut Guard,
        t0: Instant,
        t: &mut u64,
        w: &mut u64,
        waits: &[u64],
    ) -> Vec<Option<bool>> {
        waits
            .iter()
            .map(|&wait| {
                *t += 50;
                *w += wait;
                g.observe(t0 + ms(*t), times(*t, *w))
            })
            .collect()
    }

    /// Four contended checks in a row and the idle class.
    const TO_IDLE: [Option<bool>; 4] = [None, None, None, Some(true)];

    #[test]
    fn contended_checks_in_a_row_move_to_the_idle_class_and_a_while_later_back() {
        let t0 = Instant::now();
        let (mut t, mut w) = (0, 0);
        let mut g = Guard::new(t0, times(0, 0));
        // 1-2 ms of 50 waiting: the usual class, and three contended checks
        // in a row are not enough.
        let waits = [1, 2, 10, 10, 10, 1];
        assert_eq!(checks(&mut g, t0, &mut t, &mut w, &waits), [None; 6]);
        assert_eq!(checks(&mut g, t0, &mut t, &mut w, &[10, 8, 9, 10]), TO_IDLE);
        // Idle, waiting 50%, for a second: then the usual class again.
        let changes = checks(&mut g, t0, &mut t, &mut w, &[25; 20]);
        assert_eq!(changes[..19], [None; 19]);
        assert_eq!(changes[19], Some(false));
        // Still contended: idle again, for 2 s this time.
        assert_eq!(checks(&mut g, t0, &mut t, &mut w, &[10; 4]), TO_IDLE);
        let changes = checks(&mut g, t0, &mut t, &mut w, &[25; 40]);
        assert_eq!(changes[..39], [None; 39]);
        assert_eq!(changes[39], Some(false));
    }

    #[test]
    fn the_idle_class_lasts_longer_each_time_until_the_usual_class_is_calm_when_busy() {
        let t0 = Instant::now();
        let (mut t, mut w) = (0, 0);
        let mut g = Guard::new(t0, times(0, 0));
        // Contended again at every return: 1, 2, 4, ... s, at most 32 s.
        for retry in [1, 2, 4, 8, 16, 32, 32] {
            assert_eq!(checks(&mut g, t0, &mut t, &mut w, &[10; 4]), TO_IDLE);
            assert_eq!(
                g.class,
                Class::Idle {
                    until: t0 + ms(t + retry * 1000)
                }
            );
            t += retry * 1000;
            assert_eq!(checks(&mut g, t0, &mut t, &mut w, &[25]), [Some(false)]);
        }
        // Asleep (no check ran 10% of its time): however long, not calm.
        for _ in 0..100 {
            t += 50;
            let ran = g.times.ran + ms(1);
            assert_eq!(g.observe(t0 + ms(t), Times { ran, waited: ms(w) }), None);
        }
        assert_eq!(g.retry, LONGEST_RETRY);
        // A busy second without contention: the next stay is 1 s again.
        checks(&mut g, t0, &mut t, &mut w, &[1; 20]);
        assert_eq!(g.retry, RETRY);
        assert_eq!(checks(&mut g, t0, &mut t, &mut w, &[10; 4]), TO_IDLE);
        assert_eq!(
            g.class,
            Class::Idle {
                until: t0 + ms(t) + RETRY
            }
        );
    }

    #[test]
    fn starving_means_the_usual_class_for_a_doubling_cool_down() {
        let t0 = Instant::now();
        let (mut t, mut w) = (0, 0);
        let mut g = Guard::new(t0, times(0, 0));
        checks(&mut g, t0, &mut t, &mut w, &[10; 4]);
        assert!(g.idle());
        // 50 ms of 50 waiting: starved, 1 s in the usual class, contended
        // or not.
        assert_eq!(checks(&mut g, t0, &mut t, &mut w, &[50]), [Some(false)]);
        let changes = checks(&mut g, t0, &mut t, &mut w, &[10; 20]);
        assert_eq!(changes, [None; 20]);
        // The cool-down over, contention moves it to the idle class again.
        assert_eq!(checks(&mut g, t0, &mut t, &mut w, &[10; 4]), TO_IDLE);
        // Starving again: 2 s this time.
        assert_eq!(checks(&mut g, t0, &mut t, &mut w, &[50]), [Some(false)]);
        assert_eq!(g.cooldown, FIRST_COOLDOWN * 4);
        let changes = checks(&mut g, t0, &mut t, &mut w, &[10; 40]);
        assert_eq!(changes, [None; 40]);
        assert_eq!(checks(&mut g, t0, &mut t, &mut w, &[10; 4]), TO_IDLE);
        // The watchdog's word counts as starving too: 4 s.
        g.starved(t0 + ms(t), times(t, w));
        assert!(!g.idle());
        assert_eq!(g.cooldown, FIRST_COOLDOWN * 8);
        // A longest cool-down without starving resets it.
        t += LONGEST_COOLDOWN.as_millis() as u64;
        g.observe(t0 + ms(t), times(t, w));
        assert_eq!(g.cooldown, FIRST_COOLDOWN);
    }

    #[test]
    fn checks_come_every_check_interval() {
        let t0 = Instant::now();
        let g = Guard::new(t0, times(0, 0));
        assert!(!g.due(t0 + CHECK / 2));
        assert!(g.due(t0 + CHECK));
    }
}
