//! The Keep Alive Timer (NVMe Base 2.0 §3.9, §5.27.1.12): a watchdog the
//! host arms with the Keep Alive Timer feature (KATO, in milliseconds) and
//! restarts with Keep Alive commands. Command based only (CTRATT.TBKAS is
//! clear): other commands do not restart it.
//!
//! One thread per enable waits for the deadline; what expiry does (§3.9.5
//! of 2.1: error log entry, stop processing, CSTS.CFS) is the caller's.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// Identify Controller KAS: the granularity of KATO, in 100 ms units.
pub(crate) const KAS: u16 = 1;
const GRANULARITY_MS: u32 = 100 * KAS as u32;

#[derive(Debug, Default)]
pub(crate) struct KeepAlive {
    state: Mutex<State>,
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
    stop: bool,
}

impl State {
    /// Starts (or restarts) the timer if it is enabled and active.
    fn restart(&mut self, now: Instant) {
        self.deadline = (self.active && self.kato_ms != 0)
            .then(|| now + Duration::from_millis(u64::from(self.kato_ms)));
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
        s.restart(Instant::now());
        self.cv.notify_all();
    }

    /// A Keep Alive command completed: restart the timer if it runs.
    pub fn keep_alive(&self) {
        let mut s = self.state.lock();
        if s.deadline.is_some() {
            s.restart(Instant::now());
            self.cv.notify_all();
        }
    }

    /// The controller became able (or unable) to time out (§3.9.2).
    /// Becoming active starts the timer afresh.
    pub fn set_active(&self, active: bool) {
        let mut s = self.state.lock();
        if s.active != active {
            s.active = active;
            s.restart(Instant::now());
            self.cv.notify_all();
        }
    }

    /// Controller Level Reset: KATO back to its default for PCIe, 0h
    /// (disabled), and the timer inactive until the next enable.
    pub fn reset(&self) {
        let mut s = self.state.lock();
        s.kato_ms = 0;
        s.active = false;
        s.deadline = None;
        self.cv.notify_all();
    }

    /// Starts the timer thread for one enable: it calls `expired` once, at
    /// the first deadline that passes, unless stopped first.
    pub fn start(
        timer: &Arc<KeepAlive>,
        expired: impl FnOnce() + Send + 'static,
    ) -> Option<JoinHandle<()>> {
        timer.state.lock().stop = false;
        let t = Arc::clone(timer);
        let spawned = std::thread::Builder::new()
            .name("vnvme-keepalive".into())
            .spawn(move || {
                if t.wait_expiry() {
                    expired();
                }
            });
        match spawned {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(
                    "no keep alive timer thread ({e}): a keep alive timeout cannot fire"
                );
                None
            }
        }
    }

    /// Waits until the deadline passes (true) or the thread is stopped.
    fn wait_expiry(&self) -> bool {
        let mut s = self.state.lock();
        loop {
            if s.stop {
                return false;
            }
            match s.deadline {
                None => self.cv.wait(&mut s),
                Some(deadline) if Instant::now() < deadline => {
                    self.cv.wait_until(&mut s, deadline);
                }
                Some(_) => {
                    s.deadline = None;
                    return true;
                }
            }
        }
    }

    pub fn stop(&self) {
        self.state.lock().stop = true;
        self.cv.notify_all();
    }
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
