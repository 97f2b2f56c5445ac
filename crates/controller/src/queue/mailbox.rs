//! A queue worker's mailbox: the kicks the trap path (and backends, and
//! the control thread) leave for it, and where it sleeps waiting for them.
//!
//! The pending list (SQs whose tail moved, CQs whose head moved while the
//! worker waited on them) sits behind a mutex and condvar. A trap pushes and
//! notifies — the doorbell slot's `queued` flag makes repeated traps for an
//! already queued SQ free — and the worker takes the whole list at once.
//!
//! A worker that is a member of a poll group (`worker::group`) does not
//! sleep here: its group's thread sleeps on the group's [`Bell`], which
//! every mailbox of the group rings along with its own condvar, so one
//! thread sleeps for many controllers' workers and any kick wakes it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use vnvme_spec::regs::Doorbell;

use super::bell::Bell;

/// Work on a ring that only its owner may do, sent by the admin worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RingOp {
    /// Queue `qid` was created: take its ring from its slot.
    AdoptSq(u16),
    AdoptCq(u16),
    /// Delete I/O Submission Queue `cid`: fetch no more; once its commands
    /// in flight are done, drop it and answer.
    DeleteSq {
        qid: u16,
        cid: u16,
    },
    /// Delete I/O Completion Queue `cid`: drop it and answer.
    DeleteCq {
        qid: u16,
        cid: u16,
    },
    /// Abort `cid` of SQ `sqid` if still queued; answer Abort `admin_cid`.
    Abort {
        sqid: u16,
        cid: u16,
        admin_cid: u16,
    },
    /// Doorbell Buffer Config changed the doorbells' sources.
    Sources,
}

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
    /// Work on the worker's rings, in the order sent; kept across a stop
    /// (a pause), dropped when the queues are cleared.
    ops: Vec<RingOp>,
    /// An asynchronous backend may have completions to reap.
    completions: bool,
    stop: bool,
}

impl Pending {
    fn any(&self) -> bool {
        !self.sqs.is_empty() || !self.cqs.is_empty() || !self.ops.is_empty() || self.completions
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
    /// Tests only: the rounds the worker may run.
    #[cfg(test)]
    pub steps: Steps,
    /// The poll group this worker is a member of (its index and bell), for
    /// the controller's whole life; `None`: a thread of its own.
    group: Option<(usize, Arc<Bell>)>,
}

impl Mailbox {
    /// The mailbox of a member of poll group `index`.
    pub fn in_group(index: usize, bell: Arc<Bell>) -> Self {
        Self {
            group: Some((index, bell)),
            ..Self::default()
        }
    }

    /// The poll group this worker runs in, if any.
    pub fn group(&self) -> Option<usize> {
        self.group.as_ref().map(|(i, _)| *i)
    }

    /// Whether kicks (or a stop) wait to be taken.
    pub fn kicked(&self) -> bool {
        self.kicked.load(Ordering::Acquire)
    }

    fn notify(&self) {
        self.cv.notify_one();
        if let Some((_, bell)) = &self.group {
            bell.ring();
        }
    }

    pub fn push(&self, db: Doorbell) {
        let mut p = self.pending.lock();
        match db {
            Doorbell::SqTail(q) => p.sqs.push(q),
            Doorbell::CqHead(q) => p.cqs.push(q),
        }
        self.kicked.store(true, Ordering::Release);
        drop(p);
        self.notify();
    }

    /// Work on a ring this worker owns (from the admin worker).
    pub fn send(&self, op: RingOp) {
        let mut p = self.pending.lock();
        p.ops.push(op);
        self.kicked.store(true, Ordering::Release);
        drop(p);
        self.notify();
    }

    /// The queues were cleared: their operations go too.
    pub fn drop_ops(&self) {
        self.pending.lock().ops.clear();
    }

    /// A backend's waker: commands in flight may have finished.
    pub fn wake_for_completions(&self) {
        let mut p = self.pending.lock();
        p.completions = true;
        self.kicked.store(true, Ordering::Release);
        drop(p);
        self.notify();
    }

    pub fn stop(&self) {
        #[cfg(test)]
        self.steps.stop();
        self.pending.lock().stop = true;
        self.kicked.store(true, Ordering::Release);
        self.notify();
    }

    /// Clears the stop flag and any leftover kicks (before threads start).
    /// Ring operations stay: a pause stopped the worker before it took
    /// them.
    pub fn rearm(&self) {
        let mut p = self.pending.lock();
        let ops = std::mem::take(&mut p.ops);
        *p = Pending::default();
        self.kicked.store(!ops.is_empty(), Ordering::Release);
        p.ops = ops;
        #[cfg(test)]
        self.steps.rearm();
    }

    /// Takes the pending kicks into `sqs` and `cqs` and the ring operations
    /// into `ops` (all of which must be empty), blocking as `wait` allows.
    /// Returns `None` when stopped, else whether it blocked and whether
    /// there were kicks.
    pub fn take(
        &self,
        wait: Wait,
        sqs: &mut Vec<u16>,
        cqs: &mut Vec<u16>,
        ops: &mut Vec<RingOp>,
    ) -> Option<(bool, bool)> {
        // The worker calls this once a round, first thing.
        #[cfg(test)]
        if !self.steps.gate() {
            return None;
        }
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
            // With the lock held until the wait below: a kick after the
            // test saw this finds the worker waiting.
            // Once per take, however often the wait loops.
            #[cfg(test)]
            if !matches!(wait, Wait::No) && !slept {
                self.steps.asleep();
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
        std::mem::swap(&mut p.ops, ops);
        self.kicked.store(false, Ordering::Release);
        Some((slept, kicked))
    }
}

/// Tests only: a worker that runs one round of its loop at a time, when the
/// test says so, so a test can interleave the host's steps and the worker's
/// rounds exactly instead of racing them (counts that do not depend on how
/// fast the host is). A round is everything from one [`Mailbox::take`] to
/// the next: the take (which still blocks as the wake policy asks: a
/// sleeping worker needs a kick), the passes, and what the policy does
/// after (arming EventIdx).
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct Steps {
    state: Mutex<StepState>,
    cv: Condvar,
}

#[cfg(test)]
#[derive(Debug, Default)]
struct StepState {
    on: bool,
    stopped: bool,
    /// Rounds the test has allowed.
    granted: u64,
    /// Times the worker reached the start of a round.
    arrived: u64,
    /// Times it blocked in its mailbox.
    asleep: u64,
}

#[cfg(test)]
impl Steps {
    /// From now on the worker waits for [`Steps::round`] before each round.
    /// Before the controller is enabled, so that every round is counted.
    pub fn start(&self) {
        let mut s = self.state.lock();
        *s = StepState {
            on: true,
            ..StepState::default()
        };
    }

    /// Lets the worker run one round and waits (10 s at most: a sleeping
    /// worker without a kick never finishes one) until it has.
    pub fn round(&self) {
        self.grant();
        self.finish();
    }

    /// Lets the worker start a round and waits until it blocks in its
    /// mailbox (an armed worker with nothing to do); a kick then lets it
    /// go on, and [`Steps::finish`] waits for the end of the round.
    pub fn round_asleep(&self) {
        let before = self.state.lock().asleep;
        self.grant();
        self.until(|s| s.asleep > before, "asleep in its mailbox");
    }

    /// Rounds in which the worker blocked in its mailbox since
    /// [`Steps::start`].
    pub fn sleeps(&self) -> u64 {
        self.state.lock().asleep
    }

    /// Waits until the round granted last has ended.
    pub fn finish(&self) {
        self.until(|s| s.arrived > s.granted, "finished its round");
    }

    fn grant(&self) {
        self.state.lock().granted += 1;
        self.cv.notify_all();
    }

    fn until(&self, done: impl Fn(&StepState) -> bool, what: &str) {
        let mut s = self.state.lock();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !done(&s) {
            let timed_out = self.cv.wait_until(&mut s, deadline).timed_out();
            assert!(
                !timed_out || done(&s),
                "the worker has not {what} within 10 s (round {})",
                s.granted
            );
        }
    }

    /// The worker, in its round, is about to wait for a kick.
    fn asleep(&self) {
        let mut s = self.state.lock();
        if s.on {
            s.asleep += 1;
            self.cv.notify_all();
        }
    }

    /// The worker, at a round's start: `false` once stopped.
    fn gate(&self) -> bool {
        let mut s = self.state.lock();
        if !s.on {
            return true;
        }
        s.arrived += 1;
        self.cv.notify_all();
        while s.granted < s.arrived && !s.stopped {
            self.cv.wait(&mut s);
        }
        !s.stopped
    }

    fn stop(&self) {
        self.state.lock().stopped = true;
        self.cv.notify_all();
    }

    /// A new worker thread starts counting afresh.
    fn rearm(&self) {
        let mut s = self.state.lock();
        s.stopped = false;
        s.granted = 0;
        s.arrived = 0;
        s.asleep = 0;
    }
}
