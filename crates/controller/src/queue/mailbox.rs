//! A queue worker's mailbox: the kicks the trap path (and backends, and
//! the control thread) leave for it, and where it sleeps waiting for them.
//!
//! The pending list (SQs whose tail moved, CQs whose head moved while the
//! worker waited on them) sits behind a mutex and condvar. A trap pushes and
//! notifies — the doorbell slot's `queued` flag makes repeated traps for an
//! already queued SQ free — and the worker takes the whole list at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use vnvme_spec::regs::Doorbell;

/// How long [`Mailbox::take`] may block.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wait {
    No,
    For(Duration),
    Until(Option<Instant>),
}

#[derive(Debug, Default)]
struct Pending {
    sqs: Vec<u16>,
    cqs: Vec<u16>,
    /// An asynchronous backend may have completions to reap.
    completions: bool,
    stop: bool,
}

impl Pending {
    fn any(&self) -> bool {
        !self.sqs.is_empty() || !self.cqs.is_empty() || self.completions
    }
}

/// The kick side of a worker, shared with the trap path. Lives as long as the
/// controller; threads come and go with enable and reset.
#[derive(Debug, Default)]
pub(crate) struct Mailbox {
    pending: Mutex<Pending>,
    cv: Condvar,
    /// Something is in `pending` (set and cleared with its lock held), for
    /// polling workers to check without the lock.
    kicked: AtomicBool,
}

impl Mailbox {
    pub fn push(&self, db: Doorbell) {
        let mut p = self.pending.lock();
        match db {
            Doorbell::SqTail(q) => p.sqs.push(q),
            Doorbell::CqHead(q) => p.cqs.push(q),
        }
        self.kicked.store(true, Ordering::Release);
        drop(p);
        self.cv.notify_one();
    }

    /// A backend's waker: commands in flight may have finished.
    pub fn wake_for_completions(&self) {
        let mut p = self.pending.lock();
        p.completions = true;
        self.kicked.store(true, Ordering::Release);
        drop(p);
        self.cv.notify_one();
    }

    pub fn stop(&self) {
        self.pending.lock().stop = true;
        self.kicked.store(true, Ordering::Release);
        self.cv.notify_one();
    }

    /// Clears the stop flag and any leftover kicks (before threads start).
    pub fn rearm(&self) {
        let mut p = self.pending.lock();
        *p = Pending::default();
        self.kicked.store(false, Ordering::Release);
    }

    /// Takes the pending kicks into `sqs` and `cqs` (which must be empty),
    /// blocking as `wait` allows. Returns `None` when stopped, else whether
    /// it blocked and whether there were kicks.
    pub fn take(&self, wait: Wait, sqs: &mut Vec<u16>, cqs: &mut Vec<u16>) -> Option<(bool, bool)> {
        if matches!(wait, Wait::No) && !self.kicked.load(Ordering::Acquire) {
            return Some((false, false));
        }
        let mut p = self.pending.lock();
        let mut slept = false;
        loop {
            if p.stop {
                return None;
            }
            if p.any() {
                break;
            }
            match wait {
                Wait::No => break,
                Wait::For(d) => {
                    if slept {
                        break;
                    }
                    slept = true;
                    self.cv.wait_for(&mut p, d);
                }
                Wait::Until(Some(at)) => {
                    slept = true;
                    if self.cv.wait_until(&mut p, at).timed_out() {
                        break;
                    }
                }
                Wait::Until(None) => {
                    slept = true;
                    self.cv.wait(&mut p);
                }
            }
        }
        let kicked = p.any();
        p.completions = false;
        std::mem::swap(&mut p.sqs, sqs);
        std::mem::swap(&mut p.cqs, cqs);
        self.kicked.store(false, Ordering::Release);
        Some((slept, kicked))
    }
}
