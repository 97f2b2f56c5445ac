//! Queue workers: threads that fetch commands, execute them and post
//! completions, woken by doorbell traps — or polling, per doorbell mode.
//!
//! Each worker has a pending list (SQs whose tail moved, CQs whose head moved
//! while the worker waited on them) behind a mutex and condvar. A trap pushes
//! and notifies — the doorbell slot's flag makes repeated traps for a queued
//! SQ free — and the worker drains the list, processing each SQ for at most
//! its size in commands before requeueing it behind the others.
//!
//! Per [`DoorbellMode`]:
//! * `trap`: sleep on the condvar; run what traps kick.
//! * `shadow` (QEMU): as trap; each pass ends by publishing SQ EventIdx =
//!   tail seen, a full fence and a re-read of the shadow tail (and CQ
//!   EventIdx = head, fence, re-read head after posting).
//! * `adaptive`: once Doorbell Buffer Config is on, after a wake-up keep
//!   polling every owned SQ's shadow tail, EventIdx kept one behind what was
//!   seen so the host never needs to trap; after the worker's poll window
//!   (at most `idle_poll`: see [`crate::poll_window`]) without work, doze:
//!   poll every 25 µs, sleeping in between, for `doze`; then arm EventIdx =
//!   tail seen, fence, re-read every shadow tail, and sleep only if none
//!   moved. A host that moves a tail after our re-read
//!   sees the armed EventIdx and traps, and the trap's kick is in the pending
//!   list before the worker can wait: no lost wake-up. While the guest uses
//!   the INTx pin, CQ EventIdx is armed instead of kept behind, so the host's
//!   head update traps: that BAR access is where QEMU deasserts the line.
//! * `mmap-poll`: poll the shared doorbell page; when idle, spin for
//!   `idle_poll`, then sleep on the condvar for 10 µs doubling to 200 µs
//!   (the latency a request arriving then pays), woken early by kicks.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vnvme_blockdev::BlockCompletion;
use vnvme_spec::regs::Doorbell;

mod cq;
mod reap;

use cq::{
    arm_cq, deliver_events, finish_deletions, fire_timers, next_deadline, post, publish_cq_behind,
    refresh_cq_head, settle_interrupt,
};
use reap::{complete_in_flight, waker};

use crate::admin;
use crate::config::DoorbellMode;
use crate::doorbell::{barrier, behind};
use crate::inflight::{InFlight, Request};
use crate::io;
use crate::mailbox::Wait;
use crate::poll_window::PollWindow;
use crate::queue::{Cq, Sq};
use crate::state::{Ctx, Outcome, Scratch, Session, Shared};

/// Longest mmap-poll back-off sleep.
const MAX_BACKOFF: Duration = Duration::from_micros(200);
const MIN_BACKOFF: Duration = Duration::from_micros(10);
/// Idle polls between `yield_now` calls, so a core shared with the guest's
/// vCPUs is not monopolised while polling.
const POLLS_PER_YIELD: u32 = 16;
/// A gap between two idle polls longer than this means the worker lost its
/// core meanwhile (see [`PollWindow::preempted`]).
const PREEMPTED: Duration = Duration::from_micros(50);
/// Adaptive mode's sleep between polls once the poll window has passed
/// ([`ControllerConfig::doze`](crate::ControllerConfig::doze)): the most a
/// request arriving then waits, and few enough wake-ups (at most 40,000 a
/// second) to leave the core to the threads that produce the requests.
const DOZE_INTERVAL: Duration = Duration::from_micros(25);
/// Timer slack of polling workers: the kernel's default (50 µs) would
/// stretch every short sleep well past [`DOZE_INTERVAL`].
const TIMER_SLACK_NS: u64 = 1_000;

/// Result of one pass over an SQ.
enum Pass {
    /// Nothing left.
    Idle,
    /// The budget ran out with commands left: requeue.
    More,
    /// The CQ is full; resume when its head moves.
    Stalled(u16),
}

/// What a pass does with EventIdx (shadow sources only; a no-op otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventIdxPolicy {
    /// QEMU: EventIdx = value seen, fence, re-read.
    Publish,
    /// Adaptive while polling: EventIdx = value seen - 1 (mod 2^16), where
    /// neither the Linux nor the SPDK need-event test fires for any move the
    /// host can make (short of filling the ring completely).
    Behind,
}

struct Local {
    sqs: Vec<u16>,
    cqs: Vec<u16>,
    /// (sqid, cqid) waiting for CQ space.
    stalled: Vec<(u16, u16)>,
    /// CQs holding a coalesced interrupt.
    timers: Vec<u16>,
    scratch: Scratch,
    /// SQs this worker owns (polling modes), and the doorbell generation
    /// the list was built at.
    owned: Vec<u16>,
    generation: Option<u64>,
    inflight: InFlight,
    reaped: Vec<(Request, BlockCompletion)>,
    /// CQs posted to by the last reap, for one interrupt each.
    touched: Vec<u16>,
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Asleep,
    Polling {
        idle_since: Instant,
        idle_polls: u32,
        /// When the previous idle poll ran.
        last_poll: Instant,
    },
    /// Adaptive, after the poll window: short sleeps between polls, EventIdx
    /// still behind (the host does not trap), until `until`.
    Dozing {
        idle_since: Instant,
        until: Instant,
    },
}

/// The worker thread's body. Returns when stopped.
pub(crate) fn run(shared: Arc<Shared>, session: Arc<Session>, index: usize) {
    let Some(me) = shared.mailboxes.get(index) else {
        return;
    };
    let mode = shared.config.doorbells;
    let policy = if mode == DoorbellMode::Adaptive {
        EventIdxPolicy::Behind
    } else {
        EventIdxPolicy::Publish
    };
    let mut local = Local {
        sqs: Vec::new(),
        cqs: Vec::new(),
        stalled: Vec::new(),
        timers: Vec::new(),
        scratch: Scratch::default(),
        owned: Vec::new(),
        generation: None,
        inflight: InFlight::new(waker(&shared, index)),
        reaped: Vec::new(),
        touched: Vec::new(),
    };
    if matches!(mode, DoorbellMode::Adaptive | DoorbellMode::MmapPoll) {
        let slack = std::num::NonZeroU64::new(TIMER_SLACK_NS);
        if let Err(e) = rustix::thread::set_current_timer_slack(slack) {
            tracing::debug!("setting the worker's timer slack: {e}");
        }
    }
    let mut phase = Phase::Asleep;
    let mut backoff = MIN_BACKOFF;
    let mut window = if shared.config.adaptive_window {
        PollWindow::new(shared.config.idle_poll)
    } else {
        PollWindow::fixed(shared.config.idle_poll)
    };
    // Adaptive: when the worker last had work before it went to sleep.
    let mut slept_after: Option<Instant> = None;
    loop {
        let mut wait = match (phase, mode) {
            (Phase::Polling { .. }, _) => Wait::No,
            (Phase::Dozing { .. }, _) => Wait::For(DOZE_INTERVAL),
            (Phase::Asleep, DoorbellMode::MmapPoll) => Wait::For(backoff),
            (Phase::Asleep, _) => Wait::Until(next_deadline(&shared, &local.timers)),
        };
        // Backend completions wake the worker only while it sleeps: turn
        // their wakers on, then reap what came before.
        let mut work = 0;
        if !matches!(wait, Wait::No) && !local.inflight.is_empty() {
            local.inflight.set_waking(true);
            work = complete_in_flight(&shared, &session, &mut local, policy);
            if work > 0 {
                wait = Wait::No;
            }
        }
        let Some((slept, kicked)) = me.take(wait, &mut local.sqs, &mut local.cqs) else {
            return;
        };
        local.inflight.set_waking(false);
        work += run_kicked(&shared, &session, &mut local, policy);
        work += complete_in_flight(&shared, &session, &mut local, policy);
        let polls = match mode {
            DoorbellMode::MmapPoll => true,
            DoorbellMode::Adaptive => shared.doorbells.dbbuf_on(),
            DoorbellMode::Trap | DoorbellMode::Shadow => false,
        };
        if polls {
            work += poll_owned(&shared, &session, &mut local, index, policy);
            work += complete_in_flight(&shared, &session, &mut local, policy);
        }
        if slept && (kicked || work > 0) {
            shared.stats.worker_wakeups.fetch_add(1, Ordering::Relaxed);
        }
        fire_timers(&shared, &session, &mut local.timers);
        if !polls {
            phase = Phase::Asleep;
            continue;
        }
        let now = Instant::now();
        if mode == DoorbellMode::Adaptive && work > 0 {
            match phase {
                Phase::Polling { idle_since, .. } | Phase::Dozing { idle_since, .. } => {
                    window.found(now.saturating_duration_since(idle_since));
                }
                Phase::Asleep => {
                    if let Some(t) = slept_after.take() {
                        window.woke(now.saturating_duration_since(t));
                    }
                }
            }
        }
        phase = match phase {
            _ if work > 0 => {
                backoff = MIN_BACKOFF;
                Phase::Polling {
                    idle_since: now,
                    idle_polls: 0,
                    last_poll: now,
                }
            }
            // A kick with nothing to do still starts a polling period: the
            // host is active.
            Phase::Asleep if mode == DoorbellMode::Adaptive && kicked => Phase::Polling {
                idle_since: now,
                idle_polls: 0,
                last_poll: now,
            },
            Phase::Asleep => {
                if slept {
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Phase::Asleep
            }
            Phase::Polling {
                idle_since,
                idle_polls,
                last_poll,
            } => {
                // Idle polls take well under a microsecond: a longer gap
                // means another thread had this core. Polling on is taking
                // it from someone (the guest's vCPUs, QEMU): stop and sleep.
                if mode == DoorbellMode::Adaptive
                    && idle_polls > 0
                    && now.saturating_duration_since(last_poll) > PREEMPTED
                {
                    window.preempted();
                }
                let limit = match mode {
                    DoorbellMode::Adaptive => window.current(),
                    _ => shared.config.idle_poll,
                };
                if now.saturating_duration_since(idle_since) < limit {
                    if idle_polls % POLLS_PER_YIELD == POLLS_PER_YIELD - 1 {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                    Phase::Polling {
                        idle_since,
                        idle_polls: idle_polls.wrapping_add(1),
                        last_poll: Instant::now(),
                    }
                } else if mode == DoorbellMode::Adaptive {
                    window.expired();
                    if shared.config.doze.is_zero() {
                        arm_or_sleep(&shared, &session, &local, idle_since, now, &mut slept_after)
                    } else {
                        Phase::Dozing {
                            idle_since,
                            until: now + shared.config.doze,
                        }
                    }
                } else {
                    backoff = MIN_BACKOFF;
                    Phase::Asleep
                }
            }
            Phase::Dozing { idle_since, until } if now < until => {
                Phase::Dozing { idle_since, until }
            }
            Phase::Dozing { idle_since, .. } => {
                arm_or_sleep(&shared, &session, &local, idle_since, now, &mut slept_after)
            }
        };
    }
}

/// Adaptive, idle for the whole window: arm EventIdx, then sleep unless a
/// tail moved meanwhile.
fn arm_or_sleep(
    shared: &Shared,
    session: &Session,
    local: &Local,
    idle_since: Instant,
    now: Instant,
    slept_after: &mut Option<Instant>,
) -> Phase {
    if arm(shared, session, local) {
        Phase::Polling {
            idle_since: now,
            idle_polls: 0,
            last_poll: now,
        }
    } else {
        *slept_after = Some(idle_since);
        Phase::Asleep
    }
}

/// Runs the kicked queues: CQ kicks release the SQs stalled on them; each
/// kicked SQ gets one pass. Returns the commands run.
fn run_kicked(
    shared: &Shared,
    session: &Session,
    local: &mut Local,
    policy: EventIdxPolicy,
) -> u32 {
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
    let mut work = 0;
    for &qid in &sqs {
        shared.doorbells.take_pending(Doorbell::SqTail(qid));
        work += run_pass(shared, session, local, qid, policy);
    }
    local.sqs = sqs;
    local.sqs.clear();
    work
}

/// One pass over SQ `qid`, with its outcome recorded.
fn run_pass(
    shared: &Shared,
    session: &Session,
    local: &mut Local,
    qid: u16,
    policy: EventIdxPolicy,
) -> u32 {
    let mut ctx = Ctx {
        shared,
        session,
        scratch: &mut local.scratch,
        inflight: &mut local.inflight,
    };
    let (pass, done) = process_sq(&mut ctx, qid, &mut local.timers, policy);
    match pass {
        Pass::Idle => {}
        Pass::More => shared.kick_sq(qid),
        Pass::Stalled(cqid) => {
            if !local.stalled.contains(&(qid, cqid)) {
                local.stalled.push((qid, cqid));
            }
        }
    }
    done
}

/// Polling modes: one pass over every SQ this worker owns.
fn poll_owned(
    shared: &Shared,
    session: &Session,
    local: &mut Local,
    index: usize,
    policy: EventIdxPolicy,
) -> u32 {
    let generation = shared.doorbells.generation();
    if local.generation != Some(generation) {
        local.owned.clear();
        for qid in 0..shared.doorbells.queue_ids() {
            let qid = qid as u16;
            if shared.doorbells.owned_by(Doorbell::SqTail(qid), index) {
                local.owned.push(qid);
            }
        }
        local.generation = Some(generation);
    }
    let owned = std::mem::take(&mut local.owned);
    let mut work = 0;
    for &qid in &owned {
        work += run_pass(shared, session, local, qid, policy);
    }
    local.owned = owned;
    work
}

/// Adaptive mode, before sleeping: EventIdx = tail seen for every owned SQ,
/// a full fence, then re-read every shadow tail. Returns `true` if one moved
/// (keep polling). Either that re-read sees a host's new tail, or the host's
/// EventIdx read (after its own fence) sees ours and it traps.
fn arm(shared: &Shared, session: &Session, local: &Local) -> bool {
    shared.stats.eventidx_arms.fetch_add(1, Ordering::Relaxed);
    let mem = &*session.mem;
    let with_sq = |qid: u16, f: &mut dyn FnMut(&mut Sq)| {
        if let Some(slot) = shared.sqs.get(usize::from(qid)) {
            if let Some(sq) = slot.lock().as_mut() {
                f(sq);
            }
        }
    };
    let mut seen = Vec::with_capacity(local.owned.len());
    for &qid in &local.owned {
        with_sq(qid, &mut |sq| {
            let tail = sq.tail;
            sq.event_idx
                .publish(&shared.doorbells, qid, sq.source, tail as u16, true, mem);
            seen.push((qid, tail));
        });
    }
    barrier();
    let mut moved = false;
    for &(qid, tail) in &seen {
        with_sq(qid, &mut |sq| {
            sq.refresh_tail(&shared.doorbells, mem);
            moved |= sq.tail != tail;
        });
    }
    moved
}

/// The admin queue's sources follow Doorbell Buffer Config, which runs on
/// this worker while it holds the admin queue's locks.
fn refresh_admin_sources(shared: &Shared, sq: &mut Sq, cq: &mut Cq) {
    let s = shared.doorbells.source_for(Doorbell::SqTail(0));
    if s != sq.source {
        sq.set_source(s);
    }
    let c = shared.doorbells.source_for(Doorbell::CqHead(0));
    if c != cq.source {
        cq.set_source(c);
    }
}

/// One bounded pass over SQ `qid`: at most its size in commands. Returns
/// how the pass ended and the commands it ran.
fn process_sq(
    ctx: &mut Ctx<'_>,
    qid: u16,
    timers: &mut Vec<u16>,
    policy: EventIdxPolicy,
) -> (Pass, u32) {
    let shared = ctx.shared;
    let session = ctx.session;
    let Some(sq_slot) = shared.sqs.get(usize::from(qid)) else {
        return (Pass::Idle, 0);
    };
    let mut sq_guard = sq_slot.lock();
    let Some(sq) = sq_guard.as_mut().filter(|sq| sq.deleting.is_none()) else {
        return (Pass::Idle, 0);
    };
    let Some(cq_slot) = shared.cqs.get(usize::from(sq.cqid)) else {
        return (Pass::Idle, 0);
    };
    let mut cq_guard = cq_slot.lock();
    let Some(cq) = cq_guard.as_mut() else {
        return (Pass::Idle, 0);
    };
    if shared.fatal.load(Ordering::Acquire) {
        return (Pass::Idle, 0);
    }
    let mem = &*session.mem;
    sq.refresh_tail(&shared.doorbells, mem);
    if policy == EventIdxPolicy::Behind && !sq.is_empty() {
        // Before posting: a host that reaps what this pass posts must
        // already see EventIdx behind its head, or it would trap. (Not over
        // an EventIdx armed because the CQ is full.)
        refresh_cq_head(shared, session, cq);
        if !cq.is_full() {
            publish_cq_behind(shared, session, cq);
        }
    }
    let mut budget = sq.size;
    let mut done = 0u32;
    let pass = 'pass: loop {
        while !sq.is_empty() {
            if budget == 0 {
                break 'pass Pass::More;
            }
            refresh_cq_head(shared, session, cq);
            if cq.is_full() {
                // Ask the next head write to kick us (and, with shadow
                // doorbells, to trap), then look once more so a write that
                // raced with the flag is not lost.
                shared.doorbells.wait_for_head(Doorbell::CqHead(cq.qid));
                arm_cq(shared, session, cq, false);
                refresh_cq_head(shared, session, cq);
                if cq.is_full() {
                    break 'pass Pass::Stalled(cq.qid);
                }
            }
            let cmd = match sq.pop(mem) {
                Ok(cmd) => cmd,
                Err(_) => {
                    shared.set_fatal("submission queue entry unreadable");
                    return (Pass::Idle, done);
                }
            };
            budget -= 1;
            done += 1;
            shared.stats.command(qid, cmd.opcode());
            let outcome = if qid == 0 {
                admin::execute(ctx, &cmd)
            } else {
                io::execute(ctx, &cmd)
            };
            match outcome {
                Outcome::Done { dw0, status } => {
                    if !post(shared, session, sq.head as u16, qid, cq, &cmd, dw0, status) {
                        return (Pass::Idle, done);
                    }
                }
                Outcome::Submitted(token) => ctx.inflight.bind(token, sq, cq),
                Outcome::Deferred => {}
            }
        }
        let tail = sq.tail as u16;
        match policy {
            EventIdxPolicy::Publish => {
                if sq
                    .event_idx
                    .publish(&shared.doorbells, qid, sq.source, tail, true, mem)
                {
                    barrier();
                    sq.refresh_tail(&shared.doorbells, mem);
                    if !sq.is_empty() {
                        continue 'pass;
                    }
                }
            }
            EventIdxPolicy::Behind => {
                sq.event_idx
                    .publish(&shared.doorbells, qid, sq.source, behind(tail), false, mem);
            }
        }
        break Pass::Idle;
    };
    if qid == 0 {
        refresh_admin_sources(shared, sq, cq);
        deliver_events(shared, session, cq, sq.head as u16);
        finish_deletions(shared, session, cq, sq.head as u16);
    }
    if !matches!(pass, Pass::Stalled(_)) {
        match policy {
            EventIdxPolicy::Publish if done > 0 => arm_cq(shared, session, cq, true),
            EventIdxPolicy::Publish => {}
            EventIdxPolicy::Behind => publish_cq_behind(shared, session, cq),
        }
    }
    if !settle_interrupt(shared, session, cq, Instant::now()) && !timers.contains(&cq.qid) {
        timers.push(cq.qid);
    }
    (pass, done)
}
