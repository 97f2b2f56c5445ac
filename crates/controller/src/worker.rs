//! Queue workers: threads that fetch commands, execute them and post
//! completions, woken by doorbell traps.
//!
//! Each worker has a pending list (SQs whose tail moved, CQs whose head moved
//! while the worker waited on them) behind a mutex and condvar. A trap pushes
//! and notifies — the doorbell slot's flag makes repeated traps for a queued
//! SQ free — and the worker drains the list, processing each SQ for at most
//! its size in commands before requeueing it behind the others.
//!
//! Adaptive polling (next issue) fits in `run`: after a pass that found work,
//! keep polling the owned queues' doorbell sources for a while instead of
//! waiting on the condvar.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use vnvme_spec::log::async_event;
use vnvme_spec::regs::Doorbell;
use vnvme_spec::{Completion, Status};

use crate::admin;
use crate::io;
use crate::queue::Cq;
use crate::state::{Ctx, Outcome, Scratch, Session, Shared};

#[derive(Debug, Default)]
struct Pending {
    sqs: Vec<u16>,
    cqs: Vec<u16>,
    stop: bool,
}

/// The kick side of a worker, shared with the trap path. Lives as long as the
/// controller; threads come and go with enable and reset.
#[derive(Debug, Default)]
pub(crate) struct WorkerShared {
    pending: Mutex<Pending>,
    cv: Condvar,
}

impl WorkerShared {
    pub fn push(&self, db: Doorbell) {
        let mut p = self.pending.lock();
        match db {
            Doorbell::SqTail(q) => p.sqs.push(q),
            Doorbell::CqHead(q) => p.cqs.push(q),
        }
        drop(p);
        self.cv.notify_one();
    }

    pub fn stop(&self) {
        self.pending.lock().stop = true;
        self.cv.notify_one();
    }

    /// Clears the stop flag and any leftover kicks (before threads start).
    pub fn rearm(&self) {
        let mut p = self.pending.lock();
        *p = Pending::default();
    }
}

/// Result of one pass over an SQ.
enum Pass {
    /// Nothing left.
    Idle,
    /// The budget ran out with commands left: requeue.
    More,
    /// The CQ is full; resume when its head moves.
    Stalled(u16),
}

struct Local {
    sqs: Vec<u16>,
    cqs: Vec<u16>,
    /// (sqid, cqid) waiting for CQ space.
    stalled: Vec<(u16, u16)>,
    /// CQs holding a coalesced interrupt.
    timers: Vec<u16>,
    scratch: Scratch,
}

/// The worker thread's body. Returns when stopped.
pub(crate) fn run(shared: Arc<Shared>, session: Arc<Session>, index: usize) {
    let Some(me) = shared.workers.get(index) else {
        return;
    };
    let mut local = Local {
        sqs: Vec::new(),
        cqs: Vec::new(),
        stalled: Vec::new(),
        timers: Vec::new(),
        scratch: Scratch::default(),
    };
    loop {
        {
            let mut p = me.pending.lock();
            loop {
                if p.stop {
                    return;
                }
                if !p.sqs.is_empty() || !p.cqs.is_empty() {
                    break;
                }
                match next_deadline(&shared, &local.timers) {
                    Some(at) => {
                        if me.cv.wait_until(&mut p, at).timed_out() {
                            break;
                        }
                    }
                    None => me.cv.wait(&mut p),
                }
            }
            std::mem::swap(&mut p.sqs, &mut local.sqs);
            std::mem::swap(&mut p.cqs, &mut local.cqs);
        }
        for cqid in std::mem::take(&mut local.cqs) {
            local.stalled.retain(|&(sq, cq)| {
                if cq == cqid {
                    local.sqs.push(sq);
                    false
                } else {
                    true
                }
            });
        }
        let sqs = std::mem::take(&mut local.sqs);
        for &qid in &sqs {
            shared.doorbells.take_pending(Doorbell::SqTail(qid));
            let mut ctx = Ctx {
                shared: &shared,
                session: &session,
                scratch: &mut local.scratch,
            };
            match process_sq(&mut ctx, qid, &mut local.timers) {
                Pass::Idle => {}
                Pass::More => shared.kick_sq(qid),
                Pass::Stalled(cqid) => {
                    if !local.stalled.contains(&(qid, cqid)) {
                        local.stalled.push((qid, cqid));
                    }
                }
            }
        }
        local.sqs = sqs;
        local.sqs.clear();
        fire_timers(&shared, &session, &mut local.timers);
    }
}

/// Aggregation Time of the Interrupt Coalescing feature.
fn aggregation_time(shared: &Shared) -> Duration {
    let c = shared.coalescing.load(Ordering::Relaxed);
    Duration::from_micros(u64::from((c >> 8) & 0xFF) * 100)
}

fn next_deadline(shared: &Shared, timers: &[u16]) -> Option<Instant> {
    if timers.is_empty() {
        return None;
    }
    // Coarse: wake after one aggregation time and re-check every CQ.
    Some(Instant::now() + aggregation_time(shared).max(Duration::from_micros(50)))
}

fn fire_timers(shared: &Shared, session: &Session, timers: &mut Vec<u16>) {
    timers.retain(|&cqid| {
        let Some(slot) = shared.cqs.get(usize::from(cqid)) else {
            return false;
        };
        let mut g = slot.lock();
        match g.as_mut() {
            Some(cq) => !settle_interrupt(shared, session, cq, Instant::now()),
            None => false,
        }
    });
}

/// Raises the CQ's interrupt now or leaves it for coalescing (§5.27.1.6).
/// Returns `true` when nothing is left pending.
fn settle_interrupt(shared: &Shared, session: &Session, cq: &mut Cq, now: Instant) -> bool {
    if cq.irq_pending == 0 {
        return true;
    }
    let c = shared.coalescing.load(Ordering::Relaxed);
    let thr_z = c & 0xFF;
    let time = aggregation_time(shared);
    let exempt = cq.qid == 0
        || time.is_zero()
        || shared
            .coalescing_disabled
            .get(usize::from(cq.iv))
            .is_some_and(|d| d.load(Ordering::Relaxed));
    let due = exempt
        || cq.irq_pending > thr_z
        || cq
            .irq_since
            .is_none_or(|t| now.saturating_duration_since(t) >= time);
    if due {
        raise(shared, session, cq);
    }
    due
}

fn raise(shared: &Shared, session: &Session, cq: &mut Cq) {
    cq.irq_pending = 0;
    cq.irq_since = None;
    if !cq.ien {
        return;
    }
    if !session.irq.msix_enabled()
        && shared.intm.load(Ordering::Acquire) & (1u32 << (cq.iv & 31)) != 0
    {
        shared.intx_held.store(true, Ordering::Release);
        return;
    }
    session.irq.signal(cq.iv);
    if let Some(q) = shared.stats.queue(cq.qid) {
        q.interrupts.fetch_add(1, Ordering::Relaxed);
    }
}

/// Reads the CQ head; a bad value is ignored, counted and reported.
fn refresh_cq_head(shared: &Shared, session: &Session, cq: &mut Cq) {
    if cq.refresh_head(&shared.doorbells, &*session.mem).is_err() {
        if let Some(q) = shared.stats.queue(cq.qid) {
            q.invalid_doorbell_writes.fetch_add(1, Ordering::Relaxed);
        }
        shared.async_event(async_event::TYPE_ERROR, 0x01, 0x01);
    }
}

/// One bounded pass over SQ `qid`: at most its size in commands.
fn process_sq(ctx: &mut Ctx<'_>, qid: u16, timers: &mut Vec<u16>) -> Pass {
    let shared = ctx.shared;
    let session = ctx.session;
    let Some(sq_slot) = shared.sqs.get(usize::from(qid)) else {
        return Pass::Idle;
    };
    let mut sq_guard = sq_slot.lock();
    let Some(sq) = sq_guard.as_mut() else {
        return Pass::Idle;
    };
    let Some(cq_slot) = shared.cqs.get(usize::from(sq.cqid)) else {
        return Pass::Idle;
    };
    let mut cq_guard = cq_slot.lock();
    let Some(cq) = cq_guard.as_mut() else {
        return Pass::Idle;
    };
    if shared.fatal.load(Ordering::Acquire) {
        return Pass::Idle;
    }
    let mem = &*session.mem;
    sq.refresh_tail(&shared.doorbells, mem);
    let mut budget = sq.size;
    let mut pass = Pass::Idle;
    while !sq.is_empty() {
        if budget == 0 {
            pass = Pass::More;
            break;
        }
        refresh_cq_head(shared, session, cq);
        if cq.is_full() {
            // Ask the next head write to kick us, then look once more so a
            // write that raced with the flag is not lost.
            shared.doorbells.wait_for_head(Doorbell::CqHead(cq.qid));
            refresh_cq_head(shared, session, cq);
            if cq.is_full() {
                pass = Pass::Stalled(cq.qid);
                break;
            }
        }
        let cmd = match sq.pop(mem) {
            Ok(cmd) => cmd,
            Err(_) => {
                shared.set_fatal("submission queue entry unreadable");
                return Pass::Idle;
            }
        };
        budget -= 1;
        shared.stats.command(qid, cmd.opcode());
        let outcome = if qid == 0 {
            admin::execute(ctx, &cmd)
        } else {
            io::execute(ctx, &cmd)
        };
        if let Outcome::Done { dw0, status } = outcome {
            shared.stats.completion(qid, status);
            if !status.is_success() {
                shared.log_error(qid, &cmd, status);
            }
            let cqe = Completion::new(dw0, sq.head as u16, qid, cmd.cid(), false, status);
            if cq.post(mem, cqe).is_err() {
                shared.set_fatal("completion queue unwritable");
                return Pass::Idle;
            }
        }
    }
    if qid == 0 {
        deliver_events(shared, session, cq, sq.head as u16);
    }
    if !settle_interrupt(shared, session, cq, Instant::now()) && !timers.contains(&cq.qid) {
        timers.push(cq.qid);
    }
    pass
}

/// Completes outstanding Asynchronous Event Requests with queued events.
fn deliver_events(shared: &Shared, session: &Session, cq: &mut Cq, sq_head: u16) {
    loop {
        refresh_cq_head(shared, session, cq);
        if cq.is_full() {
            return;
        }
        let (cid, dw0) = {
            let mut e = shared.events.lock();
            if e.outstanding.is_empty() || e.queue.is_empty() {
                return;
            }
            let cid = e.outstanding.remove(0);
            let Some(dw0) = e.queue.pop_front() else {
                return;
            };
            (cid, dw0)
        };
        shared.stats.completion(0, Status::SUCCESS);
        let cqe = Completion::new(dw0, sq_head, 0, cid, false, Status::SUCCESS);
        if cq.post(&*session.mem, cqe).is_err() {
            shared.set_fatal("completion queue unwritable");
            return;
        }
    }
}
