//! The Keep Alive Timer (NVMe Base 2.0 §3.9, §5.27.1.12): a watchdog the
//! host arms with the Keep Alive Timer feature (KATO, in milliseconds) and
//! restarts with Keep Alive commands. Command based only (CTRATT.TBKAS is
//! clear): other commands do not restart it.
//!
//! One thread serves every controller's timer in the process ([`Timers`]):
//! a server with 64 controllers has one keep alive thread, not 64. What
//! expiry does (§3.9.5 of 2.1: error log entry, stop processing, CSTS.CFS)
//! is the caller's, run on that thread; it must not block (it only records
//! and sets flags), or it would delay the other controllers' expiries.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

/// Identify Controller KAS: the granularity of KATO, in 100 ms units.
pub(crate) const KAS: u16 = 1;
const GRANULARITY_MS: u32 = 100 * KAS as u32;

#[derive(Debug, Default)]
pub(crate) struct KeepAlive {
    state: Mutex<State>,
    /// Signalled when an expiry callback has returned (see `stop`).
    cv: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// KATO as rounded up to the granularity; 0: the timer is disabled.
    kato_ms: u32,
    /// §3.9.2 (2.1): the timer runs only while CC.EN and CSTS.RDY are 1 and
    /// no shutdown is notified (CC.SHN) or reported (CSTS.SHST).
    active: bool,
    /// When the timer expires; `None` while disabled or inactive.
    deadline: Option<Instant>,
    /// The timers' thread is running this timer's expiry callback.
    firing: bool,
}

impl State {
    /// Starts (or restarts) the timer if it is enabled and active; whether
    /// the new deadline comes before the one the timers' thread may be
    /// sleeping towards (it must then be woken; a later one it finds when
    /// it wakes for the old).
    fn restart(&mut self, now: Instant) -> bool {
        let old = self.deadline;
        self.deadline = (self.active && self.kato_ms != 0)
            .then(|| now + Duration::from_millis(u64::from(self.kato_ms)));
        match (old, self.deadline) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(o), Some(n)) => n < o,
        }
    }
}

/// KATO rounded up to the KAS granularity (§5.27.1.12), or `None` if that
/// no longer fits the 32-bit field.
pub(crate) fn round_kato(kato_ms: u32) -> Option<u32> {
    kato_ms.div_ceil(GRANULARITY_MS).checked_mul(GRANULARITY_MS)
}

impl KeepAlive {
    /// The current KATO in milliseconds (0: disabled).
    pub fn kato(&self) -> u32 {
        self.state.lock().kato_ms
    }

    /// Set Features KATO (already rounded): a non-zero value starts or
    /// restarts the timer, 0 disables it.
    pub fn set_kato(&self, kato_ms: u32) {
        let mut s = self.state.lock();
        s.kato_ms = kato_ms;
        let sooner = s.restart(Instant::now());
        drop(s);
        Timers::wake_if(sooner);
    }

    /// A Keep Alive command completed: restart the timer if it runs. The
    /// deadline only moves later, so the timers' thread is not woken.
    pub fn keep_alive(&self) {
        let mut s = self.state.lock();
        if s.deadline.is_some() {
            s.restart(Instant::now());
        }
    }

    /// The controller became able (or unable) to time out (§3.9.2).
    /// Becoming active starts the timer afresh.
    pub fn set_active(&self, active: bool) {
        let mut s = self.state.lock();
        if s.active != active {
            s.active = active;
            let sooner = s.restart(Instant::now());
            drop(s);
            Timers::wake_if(sooner);
        }
    }

    /// Controller Level Reset: KATO back to its default for PCIe, 0h
    /// (disabled), and the timer inactive until the next enable.
    pub fn reset(&self) {
        let mut s = self.state.lock();
        s.kato_ms = 0;
        s.active = false;
        s.deadline = None;
    }

    /// Arms the timer for one enable: `expired` is called once, on the
    /// timers' thread, at the first deadline that passes, unless
    /// [`stop`](Self::stop) comes first. Without the timers' thread (it
    /// could not start: logged once) no keep alive timeout fires.
    pub fn start(timer: &Arc<KeepAlive>, expired: impl FnOnce() + Send + 'static) {
        if let Some(t) = Timers::get() {
            t.arm(Arc::clone(timer), Box::new(expired));
        }
    }

    /// Disarms the timer: once this returns, its expiry callback is not
    /// running and will not run (as joining its own thread did).
    pub fn stop(&self) {
        if let Some(t) = TIMERS.get().and_then(|t| t.as_ref()) {
            t.disarm(self);
        }
        let mut s = self.state.lock();
        while s.firing {
            self.cv.wait(&mut s);
        }
    }
}

/// A timer's expiry callback.
type Expired = Box<dyn FnOnce() + Send>;

/// The process's one keep alive thread and the timers it watches.
struct Timers {
    armed: Mutex<Vec<(Arc<KeepAlive>, Expired)>>,
    /// Wakes the thread: a timer armed, or a deadline moved sooner.
    cv: Condvar,
}

/// Started on the first arm; `None` if the thread could not start.
static TIMERS: OnceLock<Option<Timers>> = OnceLock::new();

impl Timers {
    fn get() -> Option<&'static Timers> {
        TIMERS
            .get_or_init(|| {
                let spawned = std::thread::Builder::new()
                    .name("vnvme-keepalive".into())
                    .spawn(|| {
                        // The static is set before any arm reaches it;
                        // this thread waits for it like every caller.
                        if let Some(t) = Timers::get() {
                            t.run();
                        }
                    });
                match spawned {
                    Ok(_) => Some(Timers {
                        armed: Mutex::new(Vec::new()),
                        cv: Condvar::new(),
                    }),
                    Err(e) => {
                        tracing::warn!(
                            "no keep alive timer thread ({e}): a keep alive timeout cannot fire"
                        );
                        None
                    }
                }
            })
            .as_ref()
    }

    /// Wakes the thread when a deadline came sooner. Taking its lock first
    /// means the thread is either before its look at the deadlines (and
    /// will see the new one) or asleep (and is woken): no lost wake-up.
    fn wake_if(sooner: bool) {
        if let (true, Some(Some(t))) = (sooner, TIMERS.get()) {
            let _guard = t.armed.lock();
            t.cv.notify_one();
        }
    }

    fn arm(&self, timer: Arc<KeepAlive>, expired: Expired) {
        let mut armed = self.armed.lock();
        // One callback per timer: a second start replaces the first.
        let old = take_timer(&mut armed, &timer);
        armed.push((timer, expired));
        self.cv.notify_one();
        drop(armed);
        // Dropped outside the lock: a callback holds a controller's state.
        drop(old);
    }

    fn disarm(&self, timer: &KeepAlive) {
        let old = take_timer(&mut self.armed.lock(), timer);
        drop(old);
    }

    /// Fires each timer whose deadline has passed, and sleeps until the
    /// soonest of the others (without end when none runs).
    fn run(&self) {
        let mut armed = self.armed.lock();
        loop {
            let now = Instant::now();
            let mut soonest: Option<Instant> = None;
            let mut due = None;
            for (i, (timer, _)) in armed.iter().enumerate() {
                let mut s = timer.state.lock();
                match s.deadline {
                    Some(d) if d <= now => {
                        s.deadline = None;
                        // Set under the armed list's lock, which `stop`
                        // takes first: it then waits for the callback.
                        s.firing = true;
                        due = Some(i);
                        break;
                    }
                    Some(d) => soonest = Some(soonest.map_or(d, |t| t.min(d))),
                    None => {}
                }
            }
            if let Some(i) = due {
                let (timer, expired) = armed.swap_remove(i);
                MutexGuard::unlocked(&mut armed, || {
                    expired();
                    timer.state.lock().firing = false;
                    timer.cv.notify_all();
                });
                continue;
            }
            match soonest {
                Some(d) => {
                    self.cv.wait_until(&mut armed, d);
                }
                None => self.cv.wait(&mut armed),
            }
        }
    }
}

/// Takes `timer`'s entry out of `armed`, if it has one.
fn take_timer(armed: &mut Vec<(Arc<KeepAlive>, Expired)>, timer: &KeepAlive) -> Option<Expired> {
    let i = armed
        .iter()
        .position(|(t, _)| std::ptr::eq(Arc::as_ptr(t), timer))?;
    Some(armed.swap_remove(i).1)
}

/// Threads named as the keep alive thread is, in this process (for the
/// tests that check there is one whatever the number of controllers), once
/// there is one: a new thread names itself after its spawn returned. Gives
/// up (0) after 30 s, a bound on a hang only.
#[cfg(test)]
pub(crate) fn threads_named_keepalive() -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = count_keepalive_threads();
        if n > 0 || Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
fn count_keepalive_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim_end() == "vnvme-keepalive")
                })
                .count()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kato_rounds_up_to_the_kas_granularity() {
        assert_eq!(round_kato(0), Some(0));
        assert_eq!(round_kato(1), Some(100));
        assert_eq!(round_kato(100), Some(100));
        assert_eq!(round_kato(250), Some(300));
        assert_eq!(round_kato(4_294_967_200), Some(4_294_967_200));
        assert_eq!(round_kato(4_294_967_201), None);
        assert_eq!(round_kato(u32::MAX), None);
    }

    #[test]
    fn the_timer_runs_only_while_active_and_enabled() {
        let k = KeepAlive::default();
        k.set_kato(100);
        assert_eq!(k.state.lock().deadline, None, "inactive: not running");
        k.set_active(true);
        assert!(k.state.lock().deadline.is_some());
        k.set_kato(0);
        assert_eq!(k.state.lock().deadline, None, "KATO 0 disables it");
        k.keep_alive();
        assert_eq!(
            k.state.lock().deadline,
            None,
            "keep alive does not start it"
        );
        k.set_kato(200);
        k.set_active(false);
        assert_eq!(k.state.lock().deadline, None, "shutdown stops it");
        k.reset();
        assert_eq!(k.kato(), 0);
    }
}
